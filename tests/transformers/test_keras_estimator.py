import glob
import os

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.sql import functions as F

from sparkdeep.transformers import _rank_training
from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator, KerasHorovodModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier


@pytest.fixture(scope="module")
def cancer(spark):
    """scikit-learn's breast cancer set (569 rows x 30 features), scaled, as vectors."""
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    rows = [(i, float(t), *map(float, x)) for i, (x, t) in enumerate(zip(d.data, d.target))]
    cols = ["id", "label"] + [f"f{j}" for j in range(d.data.shape[1])]
    df = spark.createDataFrame(rows, cols)
    assembled = VectorAssembler(inputCols=cols[2:], outputCol="raw").transform(df)
    scaled = StandardScaler(inputCol="raw", outputCol="features", withMean=True).fit(assembled).transform(assembled)
    return scaled.select("id", "label", "features").cache()


def untrained_model(input_dim=30):
    import keras
    keras.utils.set_random_seed(0)
    net = mlp_binary_classifier(input_dim, hidden_units=(8,), dropout=0.0)
    return net, KerasHorovodModel(kerasBytes=_rank_training.keras_to_bytes(net))


def test_transform_matches_keras_on_numpy(cancer):
    net, model = untrained_model()
    scored = model.transform(cancer).orderBy("id")
    got = np.array([r[0] for r in scored.select(vector_to_array("probability")[1]).collect()])
    x = np.array([r[0] for r in cancer.orderBy("id").select(vector_to_array("features", "float32")).collect()],
                 dtype="float32")
    expected = np.asarray(net(x, training=False)).reshape(-1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    preds = [r[0] for r in scored.select("prediction").collect()]
    assert preds == [float(p >= 0.5) for p in got]
    assert scored.count() == cancer.count()


def test_save_load_round_trip_has_no_pickle_and_same_output(cancer, tmp_path):
    _, model = untrained_model()
    path = str(tmp_path / "pm")
    PipelineModel([model]).write().overwrite().save(path)
    files = [f for f in glob.glob(f"{path}/**/*", recursive=True) if os.path.isfile(f)]
    assert any(f.endswith("model/model.keras") for f in files)
    assert not any(f.endswith((".pkl", ".pickle")) for f in files)
    loaded = PipelineModel.load(path)
    a = model.transform(cancer).select("id", "probability").orderBy("id").collect()
    b = loaded.transform(cancer).select("id", "probability").orderBy("id").collect()
    assert a == b


def test_loading_refuses_a_model_that_would_run_code(cancer, tmp_path):
    import keras
    inputs = keras.Input((30,))
    outputs = keras.layers.Lambda(lambda t: t[:, :1])(inputs)  # arbitrary Python in the file
    unsafe = KerasHorovodModel(kerasBytes=_rank_training.keras_to_bytes(keras.Model(inputs, outputs)))
    path = str(tmp_path / "unsafe")
    unsafe.write().overwrite().save(path)
    with pytest.raises(ValueError, match="(?i)unsafe|safe_mode|lambda"):
        KerasHorovodModel.load(path)


def test_estimator_validates_on_the_driver(cancer):
    with pytest.raises(ValueError, match="featuresCol 'nope'"):
        KerasHorovodEstimator(featuresCol="nope").fit(cancer)
    with pytest.raises(TypeError, match="featuresCol 'id' must be a vector"):
        KerasHorovodEstimator(featuresCol="id").fit(cancer)
    with pytest.raises(ValueError, match="numProc=8 exceeds the 2 task slots"):
        KerasHorovodEstimator(numProc=8).fit(cancer)
    with pytest.raises(ValueError, match="modelBuilder 'no_such.module:f' cannot be imported"):
        KerasHorovodEstimator(modelBuilder="no_such.module:f").fit(cancer)
    with pytest.raises(ValueError, match="batchSize must be >= 1"):
        KerasHorovodEstimator(batchSize=0).fit(cancer)
    _, model = untrained_model()
    with pytest.raises(ValueError, match="predictionCol 'label' already exists"):
        model.setPredictionCol("label").transform(cancer)


@pytest.mark.slow
def test_two_ranks_train_identical_replicas_that_learn(cancer, spark):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    est = KerasHorovodEstimator(featuresCol="features", labelCol="label", numProc=2, epochs=4,
                                batchSize=32, learningRate=0.01,
                                modelArgs={"hidden_units": [16], "dropout": 0.0}, seed=1)
    model = est.fit(cancer)
    summary = model.trainingSummary
    digests = {r["weights_digest"] for r in summary["ranks"]}
    assert len(summary["ranks"]) == 2 and len(digests) == 1, "replicas diverged"
    assert sum(r["rows"] for r in summary["ranks"]) == cancer.count()  # each rank its own shard
    losses = [h["loss"] for h in summary["history"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
    scored = model.transform(cancer).withColumn("p", vector_to_array("probability")[1])
    auc = BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)
    assert auc > 0.95
    assert summary["timings_s"]["launch_to_first_step"] > 0 and summary["timings_s"]["training"] > 0
    # Used inside a Pipeline like any MLlib estimator.
    fitted = Pipeline(stages=[KerasHorovodEstimator(numProc=2, epochs=1, batchSize=64)]).fit(cancer)
    assert fitted.transform(cancer).where(F.col("prediction").isNull()).count() == 0
