import glob
import os

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator, DistributedKerasModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier
from ._plain import PLAIN


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
    return net, DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
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


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
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
    unsafe = DistributedKerasModel(kerasBytes=network.keras_to_bytes(keras.Model(inputs, outputs)))
    path = str(tmp_path / "unsafe")
    unsafe.write().overwrite().save(path)
    with pytest.raises(ValueError, match="(?i)unsafe|safe_mode|lambda"):
        DistributedKerasModel.load(path)


def test_estimator_validates_on_the_driver(cancer):
    with pytest.raises(ValueError, match="featuresCol 'nope'"):
        DistributedKerasEstimator(featuresCol="nope").fit(cancer)
    with pytest.raises(TypeError, match="featuresCol 'id' must be a vector"):
        DistributedKerasEstimator(featuresCol="id").fit(cancer)
    with pytest.raises(ValueError, match="numProc=8 exceeds the 2 tasks Spark can run at once"):
        DistributedKerasEstimator(numProc=8).fit(cancer)
    with pytest.raises(ValueError, match="modelBuilder 'no_such.module:f' cannot be imported"):
        DistributedKerasEstimator(modelBuilder="no_such.module:f").fit(cancer)
    with pytest.raises(ValueError, match="batchSize must be >= 1"):
        DistributedKerasEstimator(batchSize=0).fit(cancer)
    with pytest.raises(ValueError, match="scheduleEpochs must be 0 \\(= epochs\\) or >= epochs=3.*got 2"):
        DistributedKerasEstimator(epochs=3, scheduleEpochs=2).fit(cancer)
    _, model = untrained_model()
    with pytest.raises(ValueError, match="predictionCol 'label' already exists"):
        model.setPredictionCol("label").transform(cancer)


@pytest.fixture(scope="module")
def plain(cancer):
    """One plain two-rank fit, inside a Pipeline like any MLlib estimator, shared by the
    tests below (each Horovod launch costs ~25 s here)."""
    fitted = Pipeline(stages=[_estimator(epochs=5, warmupEpochs=0.0)]).fit(cancer)
    return fitted.stages[0]


@pytest.mark.slow
def test_two_ranks_train_identical_replicas_that_learn(cancer, plain):
    summary = plain.trainingSummary
    digests = {r["weights_digest"] for r in summary["ranks"]}
    assert len(summary["ranks"]) == 2 and len(digests) == 1, "replicas diverged"
    assert sum(r["rows"] for r in summary["ranks"]) == cancer.count()  # each rank its own shard
    losses = [h["loss"] for h in summary["history"]]
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert _auc(plain, cancer) > 0.95
    assert summary["timings_s"]["launch_to_first_step"] > 0 and summary["timings_s"]["training"] > 0
    assert plain.transform(cancer).where(F.col("prediction").isNull()).count() == 0


# -- issue 4: update strategies, validation, checkpoints, failure --------------------------

def _auc(model, df):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    scored = model.transform(df).withColumn("p", vector_to_array("probability")[1])
    return BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)


def _estimator(**kw):
    base = dict(featuresCol="features", labelCol="label", numProc=2, epochs=3, batchSize=32,
                learningRate=0.005, modelArgs={"hidden_units": [16], "dropout": 0.0}, seed=2, **PLAIN)
    base.update(kw)
    return DistributedKerasEstimator(**base)


@pytest.mark.slow
def test_accumulation_and_fp16_change_what_is_communicated_and_converge(cancer, plain):
    plain = plain.trainingSummary
    accumulated = _estimator(epochs=5, warmupEpochs=0.0, accumulationSteps=4).fit(cancer)
    s = accumulated.trainingSummary
    # K=4: one all-reduce per 4 batches.
    assert s["ranks"][0]["allreduce_calls"] == 5 * s["updates_per_epoch"] == 5 * (s["steps_per_epoch"] // 4)
    assert s["ranks"][0]["allreduce_calls"] * 4 == 5 * s["steps_per_epoch"]
    assert plain["ranks"][0]["allreduce_calls"] == 5 * plain["steps_per_epoch"]  # one per batch
    assert _auc(accumulated, cancer) > 0.95
    fp16 = _estimator(epochs=5, warmupEpochs=0.0, compression="fp16").fit(cancer)
    f = fp16.trainingSummary
    assert f["ranks"][0]["allreduce_calls"] == plain["ranks"][0]["allreduce_calls"]
    assert f["ranks"][0]["allreduce_bytes"] * 2 == plain["ranks"][0]["allreduce_bytes"]  # half the bytes
    assert len({r["weights_digest"] for r in f["ranks"]}) == 1
    assert _auc(fp16, cancer) > 0.95


@pytest.mark.slow
def test_validation_metrics_early_stopping_and_timing_breakdown(cancer):
    model = _estimator(epochs=30, validationFraction=0.25, metrics=["auc", "accuracy"],
                       earlyStoppingPatience=2, learningRate=0.05).fit(cancer)
    s = model.trainingSummary
    last = s["history"][-1]
    for key in ("loss", "auc", "accuracy", "val_loss", "val_auc", "val_accuracy",
                "input_s", "compute_s", "allreduce_s", "samples_per_s"):
        assert key in last, key
    assert sum(r["validation_rows"] for r in s["ranks"]) > 100
    assert s["stopped_early"] and len(s["history"]) < 30
    # Warm-up: the first epoch ramps towards numProc x learningRate.
    assert s["history"][0]["learning_rate"] == pytest.approx(0.1)


@pytest.mark.slow
def test_interrupted_fit_resumes_after_last_completed_epoch(cancer, tmp_path, monkeypatch):
    from sparkdeep.distributed import RankFailedError
    from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV
    est = _estimator(epochs=4, runId="run-a", checkpointDir=str(tmp_path))
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "0:2")
    with pytest.raises(RankFailedError, match="rank 0 failed: RuntimeError: injected failure after epoch 2"):
        est.fit(cancer)
    monkeypatch.delenv(FAIL_AT_EPOCH_ENV)
    model = est.fit(cancer)
    s = model.trainingSummary
    assert s["resumed_from_epoch"] == 2
    assert [h["epoch"] for h in s["history"]] == [1, 2, 3, 4]
    # A finished run is not trained again.
    again = est.fit(cancer)
    # The same weights (the .keras bytes differ by their save time when the final model and
    # the last checkpoint were written in different seconds, as on a loaded machine).
    from sparkdeep.transformers.keras.network import weights_digest
    assert again.trainingSummary["resumed_from_epoch"] == 4
    assert weights_digest(again.keras_model()) == weights_digest(model.keras_model())
    # Asking the finished run for more epochs trains on from its last one.
    more = _estimator(epochs=6, runId="run-a", checkpointDir=str(tmp_path)).fit(cancer)
    assert more.trainingSummary["resumed_from_epoch"] == 4
    assert [h["epoch"] for h in more.trainingSummary["history"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_run_stopped_early_is_loaded_with_its_best_weights_not_trained_again(cancer, tmp_path):
    """Review of issue 14: the last checkpoint held the last epoch's weights and counted the
    run as unfinished, so a second fit trained on and returned another model."""
    est = _estimator(epochs=40, learningRate=0.05, validationFraction=0.3, earlyStoppingPatience=1,
                     runId="early", checkpointDir=str(tmp_path))
    first = est.fit(cancer)
    s = first.trainingSummary
    assert s["stopped_early"] and len(s["history"]) < 40
    again = est.fit(cancer)
    weights = [network.weights_digest(network.keras_from_bytes(m.kerasBytes)) for m in (first, again)]
    assert weights[0] == weights[1]  # loaded with the best epoch's weights, not trained on
    assert again.trainingSummary["resumed_from_epoch"] == len(s["history"])


def test_a_checkpoint_made_for_other_training_is_refused_naming_what_differs(cancer, tmp_path):
    import json
    from sparkdeep.transformers.keras.checkpoints import CheckpointStore
    folder = str(tmp_path / "other")
    store = CheckpointStore(folder, {"input_dim": 10, "rows": 569, "task": "binary"})
    store(0, "epoch-0003/model.keras", b"m")
    store(0, "epoch-0003/optimizer.npz", b"o")
    store(0, "state.json", json.dumps({"completed_epochs": 3, "history": [], "finished": True,
                                       "files": "epoch-0003"}).encode())
    est = _estimator(runId="other", checkpointDir=str(tmp_path))
    with pytest.raises(ValueError, match=r"runId 'other': the checkpoint at .*other was made for other training "
                                         r"\(input_dim: 10 then, 30 now;.*use a new runId"):
        est.fit(cancer)


@pytest.mark.slow
def test_skewed_input_partitions_stream_through_a_small_window_every_row_once_per_epoch(cancer):
    """Issue 14: all rows in one input partition, a shuffle window many times smaller than
    each rank's shard: the ranks get even shards, run equal steps, see every training row
    once per epoch apart from the counted trim, and never hold more than the window."""
    skewed = cancer.coalesce(1)
    assert skewed.rdd.getNumPartitions() == 1
    model = _estimator(epochs=3, batchSize=16, shuffleBufferRows=32, validationFraction=0.2).fit(skewed)
    s = model.trainingSummary
    ranks = s["ranks"]
    train_rows = sum(r["rows"] for r in ranks)
    assert train_rows + sum(r["validation_rows"] for r in ranks) == 569
    assert min(r["rows"] for r in ranks) >= 5 * 32  # each shard is many windows
    assert abs(ranks[0]["rows"] - ranks[1]["rows"]) < 60  # the launcher evened the partitions
    assert sum(r["rows_per_epoch"] for r in ranks) + s["trimmed_rows_per_epoch"] == train_rows
    steps = s["steps_per_epoch"]
    assert steps == -(-min(r["rows"] for r in ranks) // 16)  # the smaller shard's batch count
    assert s["trimmed_rows_per_epoch"] == sum(max(0, r["rows"] - steps * 16) for r in ranks)
    for r in ranks:
        assert r["rows_seen"] == [r["rows_per_epoch"]] * 3  # every epoch, all of them
        assert r["max_window_rows"] <= 32 + 16  # window + one stored chunk
    assert len(s["history"]) == 3 and s["history"][-1]["loss"] < s["history"][0]["loss"]
    assert _auc(model, cancer) > 0.95


def test_too_few_rows_for_the_ranks_or_the_accumulation_fail_on_the_driver(cancer):
    with pytest.raises(ValueError, match=r"1 usable training row\(s\) for numProc=2"):
        _estimator().fit(cancer.limit(1))
    with pytest.raises(ValueError, match=r"accumulationSteps=50 needs 50 batches.*about 9 batch"):
        _estimator(accumulationSteps=50).fit(cancer)


@pytest.mark.slow
def test_a_rank_whose_rows_are_all_validation_is_named_before_training(cancer):
    """The shards are checked once spilled, before any rank starts: the rank without
    training rows is the one named, with the advice that fits its case."""
    from sparkdeep.distributed import RankFailedError
    held = cancer.withColumn("held", F.col("id") > 0)  # one training row in all
    with pytest.raises(RankFailedError, match=r"got no training rows: all \d+ of its rows are validation") as err:
        _estimator(validationCol="held").fit(held)
    assert f"rank {err.value.rank} got no training rows" in str(err.value)


@pytest.mark.slow
def test_a_rank_that_dies_ends_fit_naming_it(cancer, monkeypatch):
    import time
    from sparkdeep.distributed import RankFailedError
    from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:1:exit")
    t0 = time.time()
    with pytest.raises(RankFailedError) as err:
        _estimator(epochs=3).fit(cancer)
    assert err.value.rank == 1
    assert "without a Python exception" in str(err.value)
    assert time.time() - t0 < 240


@pytest.mark.slow
def test_spark_training_matches_a_single_process_run(cancer, plain):
    """Two ranks with averaged gradients behave like one process with the same global
    batch and learning rate: same quality within tolerance."""
    import keras
    x = np.array([r[0] for r in cancer.orderBy("id").select(vector_to_array("features", "float32")).collect()])
    y = np.array([r[0] for r in cancer.orderBy("id").select("label").collect()], dtype="float32")
    keras.utils.set_random_seed(2)
    net = mlp_binary_classifier(30, hidden_units=(16,), dropout=0.0)
    net.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    hist = net.fit(x, y, batch_size=64, epochs=5, verbose=0, shuffle=True)
    from sklearn.metrics import roc_auc_score
    single_auc = roc_auc_score(y, net.predict(x, verbose=0).ravel())
    spark_model = plain  # 5 epochs, no warm-up
    spark_loss = spark_model.trainingSummary["history"][-1]["loss"]
    assert abs(_auc(spark_model, cancer) - single_auc) < 0.02
    assert spark_loss == pytest.approx(hist.history["loss"][-1], abs=0.05)


@pytest.mark.slow
def test_multiclass_softmax_model_scores_class_probabilities(spark):
    from sklearn.datasets import load_digits
    from pyspark.ml.feature import VectorAssembler
    d = load_digits()
    rows = [(i, float(t), *map(float, r / 16.0)) for i, (r, t) in enumerate(zip(d.data, d.target))]
    df = spark.createDataFrame(rows, ["id", "label"] + [f"p{j}" for j in range(64)])
    df = VectorAssembler(inputCols=[f"p{j}" for j in range(64)], outputCol="features").transform(df) \
        .select("id", "label", "features").cache()
    # No builder named: the loss picks the softmax MLP and the labels its 10 units; 'accuracy'
    # resolves to sparse categorical accuracy for k classes (issue 10: it was binary accuracy).
    model = DistributedKerasEstimator(modelArgs={"hidden_units": [32], "dropout": 0.0},
                                  loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                                  validationFraction=0.2, numProc=2, epochs=8, batchSize=32,
                                  learningRate=0.005).fit(df)
    assert model.trainingSummary["history"][-1]["val_accuracy"] > 0.8
    scored = model.transform(df)
    probs = np.array([r[0] for r in scored.select(vector_to_array("probability")).collect()])
    assert probs.shape == (len(d.target), 10) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    acc = scored.where("prediction = label").count() / scored.count()
    assert acc > 0.9


def test_learning_rate_ramps_then_stays_or_decays_by_cosine(cancer):
    from sparkdeep.transformers.keras.rank_loop import learning_rate_at
    ramp = [learning_rate_at(u, 0.001, 0.002, 10, 100) for u in (1, 5, 10)]
    assert ramp == pytest.approx([0.0011, 0.0015, 0.002])
    assert learning_rate_at(50, 0.001, 0.002, 10, 100) == 0.002  # constant after the ramp
    cos = [learning_rate_at(u, 0.001, 0.002, 10, 100, "cosine") for u in (10, 11, 55, 100, 150)]
    assert cos[0] == pytest.approx(0.002) and cos[1] < 0.002
    assert cos[2] == pytest.approx(0.002 * (0.05 + 0.95 * 0.5))  # half way
    assert cos[3] == pytest.approx(0.0001) and cos[4] == pytest.approx(0.0001)  # floor: 5%
    with pytest.raises(ValueError, match="lrSchedule must be one of 'constant', 'cosine'"):
        DistributedKerasEstimator(lrSchedule="linear").fit(cancer)


def test_tabular_network_starts_the_unseen_bucket_at_zero_and_clips_bad_indices():
    """Index cardinality-1 (unseen or null) is a zero vector until a null trains it, so an
    unseen category scores like a neutral one, not a random draw; an index past the table
    (a corrupt value) is clipped into that bucket instead of failing."""
    import keras

    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    keras.utils.set_random_seed(3)
    net = tabular_binary_classifier(input_dim=4, numeric_dim=2, cardinalities=[3, 40], hidden_units=(8,))
    tables = {w.path: keras.ops.convert_to_numpy(w) for w in net.weights if "embedding" in w.path}
    assert len(tables) == 2
    for table in tables.values():
        assert not table[-1].any() and np.abs(table[:-1]).sum() > 0
    x = np.array([[0.1, -0.2, 2.0, 39.0], [0.1, -0.2, 7.0, 1e6]], dtype="float32")
    out = net.predict(x, verbose=0)
    assert out[0] == pytest.approx(out[1])


def test_early_stopping_alone_keeps_the_best_weights_and_restores_only_when_it_stopped():
    from sparkdeep.transformers.keras.rank_loop import EarlyStopping

    class Model:
        weights = None

        def set_weights(self, w):
            self.weights = w

    es = EarlyStopping("val_loss", patience=2)
    seen = iter(["w1", "w2", "w3", "w4"])
    stops = [es.update({"val_loss": v}, lambda: next(seen)) for v in (0.9, 0.5, 0.5 - 1e-8, 0.7)]
    assert stops == [False, False, False, True]  # 1e-8 is no improvement; two epochs without one stop
    assert es.best == 0.5 and es.best_weights == "w2"
    model = Model()
    es.restore(model)
    assert model.weights == "w2"

    # A resumed run's history sets the best so far; patience 0 never stops nor restores.
    resumed = EarlyStopping("loss", patience=1, history=[{"loss": 0.4}, {"loss": 0.3}, {"epoch": 3}])
    assert resumed.best == 0.3 and resumed.update({"loss": 0.35}) is True
    # A resumed run also takes the count so far and the best epoch's weights from its checkpoint.
    cont = EarlyStopping("loss", patience=2, history=[{"loss": 0.3}, {"loss": 0.4}],
                         saved=es.state() | {"waited": 1, "stopped": False}, best_weights="w-best")
    assert cont.update({"loss": 0.5}, lambda: "w-late") is True and cont.best_weights == "w-best"
    back = Model()
    cont.restore(back)
    assert back.weights == "w-best"
    never = EarlyStopping("loss", patience=0)
    assert not any(never.update({"loss": v}, lambda: "w") for v in (1.0, 2.0, 3.0))
    untouched = Model()
    never.restore(untouched)
    assert untouched.weights is None and never.best_weights is None


FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures")


@pytest.mark.parametrize("fixture, saved_as", [
    # before the estimator became the transformers/keras package
    ("keras_model_2026_12", "sparkdeep.transformers.keras_estimator.KerasHorovodModel"),
    # before the estimator and model were named for every strategy (DistributedKeras*)
    ("keras_model_2026_12b", "sparkdeep.transformers.keras.model.KerasHorovodModel"),
])
@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_model_saved_under_an_earlier_name_loads_and_scores_the_same(spark, fixture, saved_as):
    """Saved by the code of then (tests/fixtures/<fixture>/make_fixture.py): it passes the
    model store's checks, loads as today's class, and gives the same probability for every
    row, nulls included."""
    import json

    from sparkdeep import model_store
    folder = os.path.join(FIXTURES, fixture)
    expected = json.load(open(os.path.join(folder, "expected.json")))
    classes = [c for _, c in model_store.check(spark, os.path.join(folder, "model"))]
    assert saved_as in classes
    model = model_store.load_pipeline(spark, os.path.join(folder, "model"))
    assert isinstance(model.stages[1], DistributedKerasModel)
    df = spark.createDataFrame([tuple(r) for r in expected["rows"]], "key string, x double, y double, c double")
    got = {r.key: [r.p, r.prediction] for r in model.transform(df).select(
        "key", F.when(F.col("probability").isNotNull(), vector_to_array("probability")[1]).alias("p"),
        "prediction").collect()}
    assert got.keys() == expected["scores"].keys()
    for key, (p, pred) in expected["scores"].items():
        if p is None:
            assert got[key] == [None, None], key
        else:
            # The network computes in float32: scoring through a traced tf.function (issue 25)
            # fuses ops the eager call did not, a few float32 ulps (1.5e-7 at 0.4) apart.
            assert got[key][1] == pred and abs(got[key][0] - p) < 1e-6, (key, got[key], p)


def test_a_validation_column_replaces_the_default_fraction_and_not_one_set(spark):
    """validationFraction's default (conf/base's 0.1) gives way to a validationCol; a
    fraction set as well is the error it always was."""
    df = spark.createDataFrame([(Vectors.dense([float(i)]), float(i % 2), i % 5 == 0) for i in range(20)],
                               ["features", "label", "held"])
    est = DistributedKerasEstimator(validationCol="held")
    assert est.getOrDefault("validationFraction") == 0.1 and est.validation_share() == 0.0
    est._validate(df)
    with pytest.raises(ValueError, match="set validationCol or validationFraction, not both"):
        DistributedKerasEstimator(validationCol="held", validationFraction=0.2)._validate(df)
    assert DistributedKerasEstimator().validation_share() == 0.1


@pytest.mark.slow
def test_columns_named_with_dots_and_backticks_train_and_score(cancer):
    """A column name is a name, never a path: dots and backticks in the features, label,
    weight and validation columns' names work in fit and transform."""
    named = cancer.select(F.col("features").alias("f.eat`s"), F.col("label").alias("la.bel"),
                          F.lit(1.0).alias("w.t"), (F.col("id") % 10 == 0).alias("is.val"))
    est = _estimator(featuresCol="f.eat`s", labelCol="la.bel", weightCol="w.t", validationCol="is.val",
                     numProc=1, epochs=1)
    model = est.fit(named)
    scored = model.transform(named)
    assert scored.where(F.col("prediction").isNull()).count() == 0
    assert scored.count() == cancer.count()
