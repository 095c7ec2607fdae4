"""Issue 10: ordinary inputs that gave a wrong answer without an error.

Each test builds a small frame of the shape a user has (a vector ``features`` column and
a numeric ``label``, often nothing else) and asserts the clear error or the right result.
"""
import numpy as np
import pytest
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import DenseMatrix, Vectors
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import tasks
from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator, DistributedKerasModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier, mlp_classifier, mlp_regressor
from sparkdeep.transformers.pca import CenteredPCA
from sparkdeep.transformers.sampling import ClassBalanceSampler, StratifiedSampler, UniformSampler
from sparkdeep.transformers.selection import (CorrelationSelector, MissingRateSelector, ModelImportanceSelector,
                                              UnivariateSelector, VarianceSelector)
from ._plain import PLAIN


@pytest.fixture(scope="module")
def cancer(spark):
    """Breast cancer (569 x 30, 212 malignant) as only ``features`` and ``label``: no id."""
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    x = (d.data - d.data.mean(axis=0)) / d.data.std(axis=0)
    rows = [(Vectors.dense(r.tolist()), float(t)) for r, t in zip(x, d.target)]
    return spark.createDataFrame(rows, ["features", "label"]).cache()


def vec_frame(spark, rows, label=True):
    """Rows of (list or None, label) -> features vector (null for None) and label."""
    schema = "features array<double>, label double" if label else "features array<double>"
    df = spark.createDataFrame(rows, schema)
    from pyspark.ml.functions import array_to_vector
    return df.withColumn("features", F.when(F.col("features").isNotNull(), array_to_vector("features")))


def counts(df, col="label"):
    return {r[col]: r["count"] for r in df.groupBy(col).count().collect()}


# -- 1. samplers on a (features, label) frame ----------------------------------------------

@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_stratified_sampler_hashes_vectors_and_keeps_exact_counts(cancer):
    model = StratifiedSampler(stratumCol="label", fractions={"0.0": 0.5, "1.0": 0.5}, seed=4).fit(cancer)
    sample = model.sample(cancer)
    assert sample.count() == model.summary["rows_out"] == round(0.5 * 212) + round(0.5 * 357) == 284


def test_class_balance_on_vectors_is_exact_and_weights_restore_the_prior(cancer):
    model = ClassBalanceSampler(labelCol="label", majorityRatio=1.0, seed=2).fit(cancer)
    sample = model.sample(cancer)
    assert counts(sample) == {0.0: 212, 1.0: 212}
    assert model.summary["rows_out"] == sample.count() == 424
    assert sample.agg(F.avg("sample_weight")).first()[0] == pytest.approx(1.0, rel=1e-9)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_exact_duplicate_rows_keep_counts_exact(spark):
    # 40 copies of each of 5 rows per class: every boundary hash is shared by many rows.
    rows = [([float(i), 1.0], float(c)) for c in (0, 1) for i in range(5) for _ in range(40)]
    df = vec_frame(spark, rows).repartition(3)
    uni = UniformSampler(targetCount=77, seed=1).fit(df)
    assert uni.sample(df).count() == 77
    strat = StratifiedSampler(stratumCol="label", targetCounts={"0.0": 33, "1.0": 101}, seed=5).fit(df)
    assert counts(strat.sample(df)) == {0.0: 33, 1.0: 101}
    unbalanced = df.union(vec_frame(spark, [([9.0, 9.0], 1.0)] * 60))
    bal = ClassBalanceSampler(labelCol="label", majorityRatio=1.2, seed=3).fit(unbalanced)
    got = bal.sample(unbalanced)
    assert counts(got) == {0.0: 200, 1.0: 240}
    assert got.agg(F.avg("sample_weight")).first()[0] == pytest.approx(1.0, rel=1e-9)
    # The same sample whatever the partitioning (content, since copies are equal).
    again = sorted(map(tuple, strat.sample(df.repartition(1)).select(vector_to_array("features"), "label").collect()))
    first = sorted(map(tuple, strat.sample(df).select(vector_to_array("features"), "label").collect()))
    assert again == first


def test_hash_covers_arrays_maps_structs_and_refuses_other_udts(spark):
    rows = [([float(i % 7)], {"k": i}, (i, [float(i)]), float(i % 2)) for i in range(200)]
    df = spark.createDataFrame(rows, "a array<double>, m map<string,int>, s struct<x:int, y:array<double>>, "
                                     "label double")
    only_nested = df.select("m", "s", "label")
    model = UniformSampler(targetCount=50, seed=3).fit(only_nested)
    assert model.sample(only_nested).count() == 50
    mat = spark.createDataFrame([(DenseMatrix(1, 1, [float(i)]), float(i)) for i in range(5)], ["m", "label"])
    with pytest.raises(TypeError, match="column 'm' of type matrix cannot be hashed.*keyCols"):
        UniformSampler(targetCount=2).fit(mat)
    assert UniformSampler(targetCount=2, keyCols=["label"]).fit(mat).sample(mat).count() == 2
    with pytest.raises(ValueError, match=r"keyCols \['nope'\] are not columns"):
        UniformSampler(targetCount=2, keyCols=["nope"]).fit(mat)


# -- 2, 3, 6. tasks, metrics, labels: checked on the driver before any rank starts ---------

def test_metric_names_resolve_by_task():
    assert tasks.metric_class("accuracy", "binary") == "BinaryAccuracy"
    assert tasks.metric_class("accuracy", "multiclass") == "SparseCategoricalAccuracy"
    assert tasks.metric_class("rmse", "regression") == "RootMeanSquaredError"
    with pytest.raises(ValueError, match="metric 'auc' does not fit a multiclass network.*binary"):
        tasks.metric_class("auc", "multiclass")
    with pytest.raises(ValueError, match="metric 'accuracy' does not fit a regression network"):
        tasks.metric_class("accuracy", "regression")
    with pytest.raises(ValueError, match="loss 'categorical_hinge' is not supported"):
        tasks.task_for_loss("categorical_hinge")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_estimator_refuses_on_the_driver(cancer, spark):
    multi = cancer.withColumn("label", (F.col("label") + F.lit(1.0)))  # classes 1, 2
    with pytest.raises(ValueError, match="metric 'auc' does not fit a multiclass"):
        DistributedKerasEstimator(loss="sparse_categorical_crossentropy", metrics=["auc"]).fit(cancer)
    with pytest.raises(ValueError, match=r"labelCol 'label' must hold 0 or 1.*from 1 to 2"):
        DistributedKerasEstimator().fit(multi)
    three = spark.createDataFrame([(Vectors.dense([float(i)]), float(1 + i % 3)) for i in range(30)],
                                  ["features", "label"])
    with pytest.raises(ValueError, match=r"class indices 0..2 .* from 1 to 3"):
        DistributedKerasEstimator(model=mlp_classifier(1, 3), loss="sparse_categorical_crossentropy").fit(three)
    with pytest.raises(ValueError, match="holds only the class 1"):
        DistributedKerasEstimator().fit(cancer.withColumn("label", F.lit(1.0)))
    # Regression with a bounded output is refused; the default builder follows the loss.
    with pytest.raises(ValueError, match="regression network.*activation 'sigmoid'"):
        DistributedKerasEstimator(loss="mse", modelBuilder="sparkdeep.transformers.keras_models:"
                                                    "mlp_binary_classifier").fit(cancer)
    with pytest.raises(ValueError, match="binary network.*1 output unit"):
        DistributedKerasEstimator(model=mlp_regressor(30)).fit(cancer)
    with pytest.raises(ValueError, match="learningRate must be a finite number"):
        DistributedKerasEstimator(learningRate=float("inf")).fit(cancer)
    with pytest.raises(ValueError, match="stallTimeout must be a finite number of seconds > 0"):
        DistributedKerasEstimator(stallTimeout=0.0).fit(cancer)


def test_estimator_refuses_nan_rows_mixed_lengths_and_empty_input(cancer, spark):
    nan_rows = cancer.withColumn("features", F.when(F.rand(1) < 0.03, vector_to_array("features")).otherwise(
        vector_to_array("features")))
    from pyspark.ml.functions import array_to_vector
    bad = cancer.limit(500).union(
        cancer.limit(12).withColumn("features", array_to_vector(F.array_repeat(F.lit(float("nan")), 30))))
    with pytest.raises(ValueError, match="12 rows with NaN or infinite values in featuresCol 'features'"):
        DistributedKerasEstimator().fit(bad)
    mixed = vec_frame(spark, [([1.0, 2.0, 3.0, 4.0], 0.0), ([1.0, 2.0], 1.0), ([1.0] * 6, 0.0), ([1.0, 2.0], 1.0)])
    with pytest.raises(ValueError, match="featuresCol 'features' holds vectors of different lengths"):
        DistributedKerasEstimator().fit(mixed)
    with pytest.raises(ValueError, match="the training input has no rows"):
        DistributedKerasEstimator().fit(cancer.limit(0))
    assert nan_rows.count() == 569


def test_estimator_counts_real_task_slots_not_configured_parallelism(spark):
    from sparkdeep.transformers.keras.staging import task_slots
    assert task_slots(spark.sparkContext, 2) == 2  # local[2]


# -- 4. a NaN score never becomes a class ----------------------------------------------------

def _model(net):
    return DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_transform_refuses_or_nulls_non_finite_rows(spark):
    import keras
    keras.utils.set_random_seed(0)
    rows = [([0.5, 1.0], 0.0), ([float("nan"), 1.0], 1.0), (None, 0.0), ([2.0, -1.0], 1.0)]
    df = vec_frame(spark, rows)
    for net in (mlp_binary_classifier(2, hidden_units=(4,)), mlp_classifier(2, 3, hidden_units=(4,))):
        with pytest.raises(Exception, match=r"featuresCol 'features' has \d+ rows in a batch that are null or hold"):
            _model(net).transform(df).collect()
        out = _model(net).setHandleInvalid("keep").transform(df).orderBy("label").collect()
        nulls = [r for r in out if r["prediction"] is None]
        assert len(nulls) == 2 and all(r["probability"] is None for r in nulls)
        assert all(r["prediction"] is not None for r in out if r not in nulls)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_regression_model_predicts_in_target_units_without_probabilities(spark):
    net = mlp_regressor(2, hidden_units=(), dropout=0.0)
    kernel, bias = net.get_layer("probabilities").get_weights()
    net.get_layer("probabilities").set_weights([np.array([[2.0], [-3.0]], dtype="float32"),
                                                np.array([100.0], dtype="float32")])
    df = vec_frame(spark, [([1.0, 1.0], 0.0), ([10.0, 0.0], 0.0)])
    out = _model(net).transform(df).collect()
    assert "probability" not in out[0].asDict()
    assert [r["prediction"] for r in out] == pytest.approx([99.0, 120.0])



@pytest.mark.parametrize("make, task", [
    (lambda: mlp_binary_classifier(3, hidden_units=(4,)), "binary"),
    (lambda: mlp_classifier(3, 2, hidden_units=(4,)), "multiclass"),  # binary as two softmax units
    (lambda: mlp_classifier(3, 4, hidden_units=(4,)), "multiclass"),
    (lambda: mlp_regressor(3, hidden_units=(4,)), "regression"),
], ids=["sigmoid", "softmax-2", "softmax-4", "regression"])
@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_transform_outputs_match_the_network_with_mllib_types(spark, make, task):
    """Issue 25 builds the outputs in Python (one Arrow struct): the columns and their types
    stay MLlib's (a probability vector, a double prediction), every value the network's,
    and a null or NaN row keeps null outputs with handleInvalid='keep'."""
    import keras
    from pyspark.ml.linalg import VectorUDT
    keras.utils.set_random_seed(0)
    net = make()
    good = [[0.5, 1.0, -2.0], [0.0, 3.0, 1.5], [2.0, -1.0, 0.25], [-0.5, 0.0, 0.0]]
    rows = [(x, float(i)) for i, x in enumerate(good)] + [(None, 10.0), ([float("nan"), 1.0, 0.0], 11.0)]
    out = _model(net).setHandleInvalid("keep").transform(vec_frame(spark, rows).repartition(2))
    types = {f.name: f.dataType for f in out.schema.fields}
    assert isinstance(types["prediction"], T.DoubleType)
    got = out.orderBy("label").collect()
    p = np.asarray(net(np.array(good, dtype="float32"), training=False), dtype="float64")
    if task == "regression":
        assert "probability" not in types
        np.testing.assert_allclose([r["prediction"] for r in got[:4]], p[:, 0], rtol=1e-5, atol=1e-6)
    else:
        assert isinstance(types["probability"], VectorUDT)
        prob = np.array([r["probability"].toArray() for r in got[:4]])
        expected = np.hstack([1 - p, p]) if p.shape[1] == 1 else p
        np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-6)
        assert [r["prediction"] for r in got[:4]] == np.argmax(expected, axis=1).astype(float).tolist()
        assert all(r["probability"] is None for r in got[4:])
    assert all(r["prediction"] is None for r in got[4:])


def test_transform_leaves_out_empty_output_columns_and_refuses_a_multi_unit_regression(spark):
    net = mlp_classifier(2, 3, hidden_units=(4,))
    df = vec_frame(spark, [([0.5, 1.0], 0.0)])
    assert _model(net).setProbabilityCol("").transform(df).columns == ["features", "label", "prediction"]
    assert _model(net).setProbabilityCol("").setPredictionCol("").transform(df).columns == ["features", "label"]
    with pytest.raises(ValueError, match="task 'regression' predicts one number per row: this network has 3"):
        _model(net)._set(task="regression").transform(df)

# -- 5. vectors of mixed lengths -------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed(spark):
    # Lengths 4, 2, 6, 2, ...: totals divisible by 4, the trap a plain reshape falls into.
    lengths = [4, 2, 6, 2] * 10
    rng = np.random.default_rng(0)
    return vec_frame(spark, [(rng.normal(size=n).tolist(), float(i % 2)) for i, n in enumerate(lengths)])


@pytest.mark.parametrize("stage", [
    CenteredPCA(inputCol="features", outputCol="pca", k=2),
    VarianceSelector(), MissingRateSelector(), CorrelationSelector(),
    UnivariateSelector(selectionMode="numTopFeatures", selectionThreshold=1),
], ids=lambda s: type(s).__name__)
def test_fit_refuses_mixed_lengths(mixed, stage):
    with pytest.raises(ValueError, match="'features'.* vectors of different lengths"):
        stage.fit(mixed.coalesce(1))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_transform_refuses_mixed_lengths_and_names_null_vectors(spark, mixed):
    rng = np.random.default_rng(1)
    clean = vec_frame(spark, [(rng.normal(size=4).tolist(), float(i % 2)) for i in range(40)])
    pca = CenteredPCA(inputCol="features", outputCol="pca", k=2).fit(clean)
    var = VarianceSelector().fit(clean)
    net = mlp_binary_classifier(4, hidden_units=(3,))
    for transform in (pca.transform, var.transform, _model(net).transform):
        with pytest.raises(Exception, match="'features'.*(length 2 instead of 4|different lengths)"):
            transform(mixed).collect()
    with_null = clean.union(vec_frame(spark, [(None, 1.0)])).coalesce(1)
    for transform in (pca.transform, var.transform):
        with pytest.raises(Exception, match="'features' has a row with a null vector"):
            transform(with_null).collect()
    assert var.setHandleInvalid("skip").transform(with_null).where(F.col("selected").isNull()).count() == 1


# -- 8. smaller ones -----------------------------------------------------------------------

def test_pca_transform_follows_handle_invalid(spark):
    rng = np.random.default_rng(2)
    clean = vec_frame(spark, [(rng.normal(size=3).tolist(), 0.0) for _ in range(30)])
    nan = vec_frame(spark, [([float("nan"), 1.0, 2.0], 0.0)])
    model = CenteredPCA(inputCol="features", outputCol="pca", k=2).fit(clean)
    with pytest.raises(Exception, match="inputCol 'features' has a row with a NaN or infinite value"):
        model.transform(clean.union(nan).coalesce(1)).collect()
    out = model.setHandleInvalid("skip").transform(clean.union(nan))
    assert out.count() == 31 and out.where(F.col("pca").isNull()).count() == 1


def test_selection_thresholds_are_checked(cancer):
    with pytest.raises(ValueError, match=r"selectionMode='percentile' is a fraction of the features, in \(0, 1\]"):
        UnivariateSelector(selectionMode="percentile", selectionThreshold=1.5).fit(cancer)
    with pytest.raises(ValueError, match="selected none of the 30 features"):
        UnivariateSelector(selectionMode="percentile", selectionThreshold=0.01).fit(cancer)
    with pytest.raises(ValueError, match="whole number >= 1"):
        UnivariateSelector(selectionMode="numTopFeatures", selectionThreshold=2.5).fit(cancer)
    assert len(UnivariateSelector(selectionMode="percentile", selectionThreshold=0.1).fit(cancer).selected) == 3


def test_labels_checked_for_univariate_tests(cancer):
    continuous = cancer.withColumn("label", F.col("label") + F.rand(3))
    with pytest.raises(ValueError, match="non-integer values .*labelType='continuous'"):
        UnivariateSelector(selectionThreshold=3).fit(continuous)
    fvalue = UnivariateSelector(labelType="continuous", selectionThreshold=3).fit(continuous)
    assert len(fvalue.selected) == 3
    with pytest.raises(ValueError, match="labelCol 'label' is constant"):
        UnivariateSelector(selectionThreshold=3).fit(cancer.withColumn("label", F.lit(1.0)))


def test_class_labels_must_be_class_indices_and_infinite_labels_are_invalid(cancer):
    with pytest.raises(ValueError, match=r"holds values from -1.0 to 1.0: class labels must be class indices"):
        UnivariateSelector(selectionThreshold=3).fit(cancer.withColumn("label", F.col("label") * 2 - 1))
    with pytest.raises(ValueError, match="labelCol 'label' is constant"):
        UnivariateSelector(selectionThreshold=3, featureType="categorical").fit(
            cancer.withColumn("label", F.lit(0.0)))
    inf = cancer.withColumn("label", F.when(F.rand(9) < 0.05, F.lit(float("inf"))).otherwise(F.col("label")))
    n_inf = inf.where(F.col("label") == float("inf")).count()
    with pytest.raises(ValueError, match=f"has {n_inf} rows with null"):
        UnivariateSelector(selectionThreshold=3).fit(inf)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_null_labels_are_counted_not_silently_dropped(cancer):
    with_null = cancer.withColumn("label", F.when(F.rand(5) < 0.05, F.lit(None)).otherwise(F.col("label")))
    n_null = with_null.where(F.col("label").isNull()).count()
    assert n_null > 0
    for stage in (CorrelationSelector(), UnivariateSelector(selectionThreshold=3)):
        with pytest.raises(ValueError, match=f"labelCol 'label' has {n_null} rows with null"):
            stage.fit(with_null)
        assert stage.copy({stage.handleInvalid: "skip"}).fit(with_null).getOrDefault("skippedRows") == n_null


@pytest.mark.parametrize("stage", [
    VarianceSelector(), MissingRateSelector(), CorrelationSelector(), UnivariateSelector(selectionThreshold=1),
    ModelImportanceSelector(numTopFeatures=1), CenteredPCA(inputCol="features", outputCol="pca", k=1),
], ids=lambda s: type(s).__name__)
def test_empty_input_is_a_clear_error(cancer, stage):
    with pytest.raises(ValueError, match="no rows|no non-null rows"):
        stage.fit(cancer.limit(0))


def test_conf_ships_in_the_package():
    import importlib.resources
    base = importlib.resources.files("sparkdeep.conf") / "base" / "pipeline.yaml"
    assert base.is_file()


# -- with Horovod ranks: skipped rows counted, divergence stopped, regression end to end ----

@pytest.mark.slow
def test_skip_counts_rows_and_a_diverging_fit_stops_naming_the_epoch(cancer):
    from pyspark.ml.functions import array_to_vector
    bad = cancer.limit(500).union(
        cancer.limit(12).withColumn("features", array_to_vector(F.array_repeat(F.lit(float("nan")), 30))))
    est = dict(numProc=2, epochs=2, batchSize=32, modelArgs={"hidden_units": [8], "dropout": 0.0}, seed=3, **PLAIN)
    model = DistributedKerasEstimator(handleInvalid="skip", **est).fit(bad)
    assert model.trainingSummary["skipped_rows"] == 12
    assert sum(r["rows"] for r in model.trainingSummary["ranks"]) == 500
    scored = model.setHandleInvalid("keep").transform(bad)
    assert scored.where(F.col("prediction").isNull()).count() == 12
    # Huge steps overflow float32 weights: the loss turns non-finite and training stops
    # with an error naming the epoch, instead of returning a NaN model.
    from sparkdeep.distributed import RankFailedError
    with pytest.raises(RankFailedError, match=r"training diverged: loss=(nan|inf).* at epoch \d"):
        DistributedKerasEstimator(learningRate=1e30, scaleLearningRate=False, warmupEpochs=0.0,
                              **{**est, "epochs": 3}).fit(cancer)


@pytest.mark.slow
def test_regression_trains_and_predicts_in_the_targets_units(spark):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(600, 3))
    y = 50.0 + 8.0 * x[:, 0] - 5.0 * x[:, 1] + rng.normal(scale=0.5, size=600)
    df = spark.createDataFrame([(Vectors.dense(r.tolist()), float(t)) for r, t in zip(x, y)],
                               ["features", "target"]).cache()
    # UnivariateSelector on a continuous label needs labelType='continuous' (F-regression).
    with pytest.raises(ValueError, match="non-integer values"):
        UnivariateSelector(labelCol="target", selectionThreshold=2).fit(df)
    picked = UnivariateSelector(labelCol="target", labelType="continuous", selectionThreshold=2).fit(df)
    assert picked.selected == [0, 1]
    model = DistributedKerasEstimator(labelCol="target", loss="mse", metrics=["rmse"], numProc=2, epochs=30,
                                  batchSize=32, learningRate=0.02, validationFraction=0.2,
                                  modelArgs={"hidden_units": [16], "dropout": 0.0}, seed=1).fit(df)
    assert model.getOrDefault("task") == "regression"
    pred = np.array([r["prediction"] for r in model.transform(df).select("prediction").collect()])
    truth = np.array([r["target"] for r in df.select("target").collect()])
    r2 = 1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum()
    assert r2 > 0.95, r2
    assert "val_rmse" in model.trainingSummary["history"][-1]


# -- found by the review of this issue ------------------------------------------------------

def test_nan_labels_and_strata_are_one_value_not_one_per_row(spark):
    rows = [([float(i), 1.0], y) for i, y in enumerate([0.0] * 300 + [1.0] * 80 + [float("nan")] * 20)]
    df = vec_frame(spark, rows).repartition(4)
    with pytest.raises(ValueError, match="labelCol 'label' has 20 null or NaN values"):
        ClassBalanceSampler(labelCol="label").fit(df)
    bal = ClassBalanceSampler(labelCol="label", handleInvalid="skip").fit(df)
    out = bal.sample(df)
    assert counts(out) == {0.0: 80, 1.0: 80} and bal.summary["skipped_null_label"] == 20
    assert out.agg(F.avg("sample_weight")).first()[0] == pytest.approx(1.0)
    strat = StratifiedSampler(stratumCol="label", fractions={"0.0": 0.5, "1.0": 0.5, "nan": 0.5}).fit(df)
    got = strat.sample(df)
    assert got.where(F.isnan("label")).count() == 10 and got.count() == 150 + 40 + 10


def test_ties_on_a_non_unique_key_do_not_depend_on_partitioning(spark):
    df = spark.createDataFrame([(i, i % 7, float(i)) for i in range(300)], "id long, grp long, x double")
    model = UniformSampler(targetCount=100, keyCols=["grp"], seed=2).fit(df)
    ids = [sorted(r["id"] for r in model.sample(df.repartition(n)).collect()) for n in (1, 3, 8)]
    assert len(ids[0]) == 100 and ids[0] == ids[1] == ids[2]


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_strata_of_other_types_match_by_text_or_number(spark):
    import datetime
    df = spark.createDataFrame([(datetime.date(2013, 1, 1 + i % 2), i % 3 == 0, float(i % 2)) for i in range(60)],
                               "d date, b boolean, y double")
    by_date = StratifiedSampler(stratumCol="d", targetCounts={"2013-01-01": 5, "2013-01-02": 7}).fit(df)
    assert by_date.sample(df).count() == 12
    by_bool = StratifiedSampler(stratumCol="b", fractions={True: 0.5, False: 0.5}).fit(df)
    assert by_bool.sample(df).count() == 10 + 20
    by_number = StratifiedSampler(stratumCol="y", targetCounts={"0": 3, "1": 4}).fit(df)
    assert counts(by_number.sample(df), "y") == {0.0: 3, 1.0: 4}


def test_whole_number_continuous_label_is_not_taken_for_classes(spark):
    from sklearn.datasets import load_diabetes
    d = load_diabetes()
    df = spark.createDataFrame([(Vectors.dense(r.tolist()), float(t)) for r, t in zip(d.data, d.target)],
                               ["features", "label"])
    with pytest.raises(ValueError, match=r"distinct values in 442 rows, more than maxClasses=100"):
        UnivariateSelector(selectionThreshold=3).fit(df)
    assert len(UnivariateSelector(selectionThreshold=3, labelType="continuous").fit(df).selected) == 3


def test_overflowing_or_unknown_statistics_are_errors(spark):
    huge = vec_frame(spark, [([1e200, 1.0], 0.0), ([-1e200, 2.0], 1.0), ([0.0, 3.0], 0.0)])
    with pytest.raises(ValueError, match="covariance overflows float64"):
        CenteredPCA(inputCol="features", outputCol="pca", k=1).fit(huge)
    rows = [([float(i), float("nan") if i % 5 == 0 else float(i % 3)], float(i % 2)) for i in range(40)]
    with pytest.raises(ValueError, match=r"features \['features\[1\]'\] .* variance is unknown"):
        VarianceSelector(handleInvalid="keep").fit(vec_frame(spark, rows))


def test_model_importance_counts_invalid_labels(cancer):
    with_nan = cancer.withColumn("label", F.when(F.rand(9) < 0.05, F.lit(float("nan"))).otherwise(F.col("label")))
    n_bad = with_nan.where(F.isnan("label")).count()
    with pytest.raises(ValueError, match=f"labelCol 'label' has {n_bad} rows"):
        ModelImportanceSelector(numTopFeatures=3, numTrees=3).fit(with_nan)
    model = ModelImportanceSelector(numTopFeatures=3, numTrees=3, handleInvalid="skip").fit(with_nan)
    assert model.getOrDefault("skippedRows") == n_bad and len(model.selected) == 3


def _jobs(spark, fn) -> int:
    """Spark jobs ``fn`` runs: the cost measure a check must not raise on clean data."""
    import uuid
    sc = spark.sparkContext
    group = f"count-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "counting jobs")
    try:
        fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_label_and_row_checks_add_no_spark_job_on_clean_data(spark, cancer):
    from pyspark.ml.classification import RandomForestClassifier
    from pyspark.ml.feature import UnivariateFeatureSelector
    ours = _jobs(spark, lambda: UnivariateSelector(selectionMode="percentile", selectionThreshold=0.5).fit(cancer))
    mllib = _jobs(spark, lambda: UnivariateFeatureSelector(selectionMode="percentile").setSelectionThreshold(0.5)
                  .setFeatureType("continuous").setLabelType("categorical").fit(cancer))
    assert ours <= mllib
    # The forest's own jobs plus one probe of the first row (the vector size), no second scan.
    ours = _jobs(spark, lambda: ModelImportanceSelector(numTopFeatures=3, numTrees=5, seed=1).fit(cancer))
    forest = _jobs(spark, lambda: RandomForestClassifier(numTrees=5, seed=1).fit(cancer))
    assert ours <= forest + 1
