"""Issue 24: the strategy is a choice (horovod, collective, local_sgd, parameter_server) with one contract:
the same quality, identical replicas at the end, resume after a kill, a failing and a
frozen rank named without a hang, the same persisted model, and a collective path that
runs with Horovod made unimportable."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.functions import vector_to_array
from pyspark.sql import functions as F

from sparkdeep.distributed import RankFailedError
from sparkdeep.registry import Choices
from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV
from sparkdeep.transformers.keras import strategies
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator

from .test_keras_estimator import cancer  # noqa: F401 - the shared module fixture
from ._plain import PLAIN
from tests import _other_process

OTHERS = ("collective", "local_sgd", "parameter_server")


def _estimator(**kw):
    """The estimator's default network (no modelBuilder: the task's default MLP)."""
    base = dict(featuresCol="features", labelCol="label", numProc=2, epochs=4, batchSize=32,
                learningRate=0.005, warmupEpochs=0.0, seed=3, metrics=["auc"], **PLAIN)
    base.update(kw)
    return DistributedKerasEstimator(**base)


def _auc(model, df):
    scored = model.transform(df).withColumn("p", vector_to_array("probability")[1])
    return BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)


def test_the_strategies_are_the_registry_s_and_an_unknown_one_is_refused():
    assert tuple(strategies.IMPLEMENTATIONS) == Choices.STRATEGIES
    assert strategies.backend_for("horovod") == "horovod"
    assert {s: strategies.backend_for(s) for s in OTHERS} == {
        "collective": "tensorflow", "local_sgd": "tensorflow", "parameter_server": "tensorflow_ps"}
    with pytest.raises(ValueError, match="strategy must be one of 'horovod', 'collective', 'local_sgd', "
                                         "'parameter_server', got 'ps'"):
        strategies.backend_for("ps")


def test_a_param_the_strategy_does_not_use_is_an_error_on_the_driver(cancer):  # noqa: F811
    with pytest.raises(ValueError, match="strategy must be one of"):
        _estimator(strategy="async").fit(cancer)
    with pytest.raises(ValueError, match=r"compression='fp16' \(.*\) applies to strategy='horovod' only, not strategy='collective'"):
        _estimator(strategy="collective", compression="fp16").fit(cancer)
    with pytest.raises(ValueError, match=r"accumulationSteps=2 \(.*\) applies to strategies 'horovod', 'collective', "
                                         r"not strategy='local_sgd': it already exchanges every localSteps"):
        _estimator(strategy="local_sgd", accumulationSteps=2).fit(cancer)
    with pytest.raises(ValueError, match=r"localSteps=4 \(.*\) applies to strategy='local_sgd' only, not strategy='collective'"):
        _estimator(strategy="collective", localSteps=4).fit(cancer)
    with pytest.raises(ValueError, match="localSteps must be >= 1"):
        _estimator(strategy="local_sgd", localSteps=0).fit(cancer)
    with pytest.raises(ValueError, match="not strategy='parameter_server': each update is one worker's batch: raise batchSize"):
        _estimator(strategy="parameter_server", accumulationSteps=2).fit(cancer)
    with pytest.raises(ValueError, match=r"scaleLearningRate=True \(.*\) applies to strategies 'horovod', 'collective', 'local_sgd', not "):
        _estimator(strategy="parameter_server", scaleLearningRate=True).fit(cancer)
    with pytest.raises(ValueError, match=r"measureWait=True \(.*\) applies to .*, not strategy='parameter_server': its workers never wait"):
        _estimator(strategy="parameter_server", measureWait=True).fit(cancer)


def test_a_frozen_rank_is_named_even_when_its_peer_s_collective_failed_first():
    """Issue 24.6: the peer's collective timed out first and was blamed; the heartbeats say
    which rank went silent."""
    from sparkdeep.distributed import _explain

    class Channel:
        now = time.monotonic()
        beats = {0: (now, 100), 1: (now - 40.0, 101)}
        failures = [(0, "DeadlineExceededError: Collective ops timed out waiting for peers")]
        traces: dict = {}  # the ranks' tracebacks, none sent here

    with pytest.raises(RankFailedError, match=r"stalled: no heartbeat for 4\d s \(process 101\).*rank\(s\) 0 then "
                                              r"failed waiting for it") as err:
        _explain(RuntimeError("stage failed"), Channel(), silent_after=10.0)
    assert err.value.rank == 1
    # A rank that failed by itself, all beats fresh: that rank, as before.
    Channel.beats = {0: (time.monotonic(), 100), 1: (time.monotonic(), 101)}
    Channel.failures = [(1, "ValueError: shard 7 is corrupt"), (0, "Horovod has been shut down")]
    with pytest.raises(RankFailedError, match="Training rank 1 failed: ValueError: shard 7") as err:
        _explain(RuntimeError("stage failed"), Channel(), silent_after=10.0)


# -- with ranks -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def split(cancer):  # noqa: F811
    train = cancer.where(F.col("id") % 5 != 0).cache()
    holdout = cancer.where(F.col("id") % 5 == 0).cache()
    return train, holdout


@pytest.fixture(scope="module")
def fitted(split):
    """One fit per strategy on the same rows, the default network, validation on."""
    train, _ = split
    out = {}
    for name in Choices.STRATEGIES:
        extra = {"localSteps": 4} if name == "local_sgd" else {}
        out[name] = _estimator(strategy=name, validationFraction=0.2, measureWait=name != "parameter_server",
                               **extra).fit(train)
    return out


@pytest.mark.slow
def test_every_strategy_reaches_the_horovod_default_s_held_out_auc(fitted, split):
    _, holdout = split
    aucs = {name: _auc(model, holdout) for name, model in fitted.items()}
    assert aucs["horovod"] > 0.95, aucs
    for name in OTHERS:
        assert aucs[name] >= aucs["horovod"] - 0.02, aucs


@pytest.mark.slow
def test_replicas_end_identical_and_each_strategy_reports_what_it_sent(fitted):
    for name, model in fitted.items():
        s = model.trainingSummary
        assert s["strategy"] == name
        assert len({r["weights_digest"] for r in s["ranks"]}) == 1, f"{name}: replicas differ"
        last = s["history"][-1]
        assert last["wait_s"] >= 0 and last["allreduce_s"] >= 0 and "val_loss" in last
    updates = fitted["horovod"].trainingSummary["updates_per_epoch"]
    epochs = len(fitted["horovod"].trainingSummary["history"])
    grads = fitted["horovod"].trainingSummary["ranks"][0]["allreduce_bytes"] // (updates * epochs)
    for name in ("horovod", "collective"):  # one all-reduce of the float32 gradients per update
        r = fitted[name].trainingSummary["ranks"][0]
        assert r["allreduce_calls"] == updates * epochs and r["allreduce_bytes"] == grads * updates * epochs
    # local SGD: one average every 4 updates and one at each epoch's end (when updates are left)
    r = fitted["local_sgd"].trainingSummary["ranks"][0]
    per_epoch = -(-updates // 4)
    assert r["allreduce_calls"] == per_epoch * epochs
    assert fitted["local_sgd"].trainingSummary["local_steps"] == 4
    # Only the horovod strategy's ranks import Horovod.
    assert {name: {r["horovod_imported"] for r in m.trainingSummary["ranks"]} for name, m in fitted.items()} == {
        "horovod": {True}, "collective": {False}, "local_sgd": {False}, "parameter_server": {False}}


@pytest.mark.slow
def test_the_parameter_server_s_workers_update_without_waiting_and_staleness_is_reported(fitted):
    """Asynchronous: one copy of the weights (on the parameter server), updated by whichever
    worker is free; an epoch is the ranks' rows in whole batches, whoever takes them. Updates
    overlapping in time show as staleness (other updates between a worker's read and write)."""
    s = fitted["parameter_server"].trainingSummary
    rows = sum(r["rows"] for r in s["ranks"])
    assert s["updates_per_epoch"] == rows // 32 and s["local_steps"] is None
    epochs = len(s["history"])
    assert s["ranks"][0]["allreduce_calls"] == s["updates_per_epoch"] * epochs
    for h in s["history"]:
        assert h["staleness_max"] >= 0 and 0 <= h["staleness_mean"] <= h["staleness_max"]
        assert h["comm_bytes"] > 0 and h["wait_s"] == 0.0 and "val_auc" in h
    # Two workers on two cores overlap: some update saw another land between its read and write.
    assert s["staleness"]["max"] >= 1 and s["staleness"]["mean"] > 0, s["staleness"]
    assert {k: v["staleness"] is None for k, v in ((n, m.trainingSummary) for n, m in fitted.items())} == {
        "horovod": True, "collective": True, "local_sgd": True, "parameter_server": False}


@pytest.mark.slow
def test_a_model_of_each_strategy_reloads_in_a_new_process_and_scores_identically(fitted, split, tmp_path,
                                                                                   repo_root):
    _, holdout = split
    jobs = {}
    for name, model in fitted.items():
        path = str(tmp_path / name)
        model.write().overwrite().save(path)
        jobs[name] = {"path": path, "out": str(tmp_path / f"{name}.json")}
    data = str(tmp_path / "holdout.parquet")
    holdout.select("id", "features").write.parquet(data)
    code = (
        "import json, sys\n"
        "from sparkdeep.session import builder\n"
        "from sparkdeep.config import SparkConfig\n"
        "from pyspark.ml.functions import vector_to_array\n"
        "from sparkdeep.transformers.keras_estimator import DistributedKerasModel\n"
        "spark = builder(SparkConfig(master='local[1]'), app_name='reload').getOrCreate()\n"
        "jobs, data = json.loads(sys.argv[1]), sys.argv[2]\n"
        "df = spark.read.parquet(data)\n"
        "for name, j in jobs.items():\n"
        "    m = DistributedKerasModel.load(j['path'])\n"
        "    rows = m.transform(df).select('id', vector_to_array('probability')[1]).collect()\n"
        "    json.dump({str(r[0]): r[1] for r in rows}, open(j['out'], 'w'))\n")
    proc = _other_process.run(code, json.dumps(jobs), data, timeout=600, cwd=repo_root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, j in jobs.items():
        fresh = json.load(open(j["out"]))
        here = {str(r[0]): r[1] for r in fitted[name].transform(holdout)
                .select("id", vector_to_array("probability")[1]).collect()}
        assert fresh.keys() == here.keys()
        np.testing.assert_allclose([fresh[k] for k in here], list(here.values()), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", OTHERS)
def test_a_killed_fit_resumes_from_its_checkpoint(strategy, split, tmp_path, monkeypatch):
    train, _ = split
    est = _estimator(strategy=strategy, epochs=3, runId=f"kill-{strategy}", checkpointDir=str(tmp_path))
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "0:2:exit")  # rank 0 dies after writing epoch 2's checkpoint
    with pytest.raises(RankFailedError) as err:
        est.fit(train)
    assert err.value.rank == 0 and "without a Python exception" in str(err.value)
    monkeypatch.delenv(FAIL_AT_EPOCH_ENV)
    model = est.fit(train)
    s = model.trainingSummary
    assert s["resumed_from_epoch"] == 2 and [h["epoch"] for h in s["history"]] == [1, 2, 3]
    assert len({r["weights_digest"] for r in s["ranks"]}) == 1


@pytest.mark.slow
# collective and local_sgd share the tensorflow backend's launch, channel and failure path:
# one of them is enough here (both are killed and frozen above and below).
@pytest.mark.parametrize("strategy", ("local_sgd", "parameter_server"))
def test_a_failing_rank_ends_fit_naming_it(strategy, split, monkeypatch):
    train, _ = split
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:1")
    t0 = time.time()
    with pytest.raises(RankFailedError, match="rank 1 failed: RuntimeError: injected failure after epoch 1") as err:
        _estimator(strategy=strategy, epochs=3).fit(train)
    assert err.value.rank == 1 and time.time() - t0 < 240


@pytest.mark.slow
@pytest.mark.parametrize("strategy", Choices.STRATEGIES)
def test_a_frozen_rank_mid_collective_is_named_and_nothing_hangs(strategy, split, monkeypatch, spark):
    """Rank 1 freezes (SIGSTOP) after epoch 1; rank 0 waits for it in epoch 2's first
    collective. Before issue 24 Horovod's 30 s Gloo timeout fired first and rank 0 was named."""
    import psutil
    train, _ = split
    monkeypatch.setenv(FAIL_AT_EPOCH_ENV, "1:1:stop")
    t0 = time.time()
    with pytest.raises(RankFailedError, match=r"stalled: no heartbeat for \d+ s \(process (\d+)") as err:
        _estimator(strategy=strategy, epochs=3, stallTimeout=15).fit(train)
    assert err.value.rank == 1, str(err.value)
    assert time.time() - t0 < 180
    pid = int(str(err.value).split("(process ")[1].split(")")[0].split(";")[0])
    deadline = time.time() + 60
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.time() < deadline:
        time.sleep(1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert spark.range(3).count() == 3


BLOCK_HOROVOD = "raise ImportError('horovod is blocked in this test (issue 24: collective needs no Horovod)')\n"


@pytest.mark.slow
def test_the_collective_strategy_trains_with_horovod_unimportable(tmp_path, repo_root):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "horovod.py").write_text(BLOCK_HOROVOD)
    code = (
        "import sys\n"
        "try:\n"
        "    import horovod\n"
        "    raise SystemExit('horovod imported')\n"
        "except ImportError:\n"
        "    pass\n"
        "from sparkdeep.session import builder\n"
        "from sparkdeep.config import SparkConfig\n"
        "from pyspark.ml.linalg import Vectors\n"
        "from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator\n"
        "spark = builder(SparkConfig(master='local[2]', settings={'spark.task.maxFailures': '1'}),"
        " app_name='nohvd').getOrCreate()\n"
        "rows = [(float(i % 2), Vectors.dense([float(i % 2) + 0.1 * (i % 7), float(i % 3)])) for i in range(400)]\n"
        "df = spark.createDataFrame(rows, ['label', 'features'])\n"
        "from sparkdeep.distributed import run_on_ranks\n"
        "def blocked():\n"
        "    try:\n"
        "        import horovod  # noqa\n"
        "    except ImportError as e:\n"
        "        return str(e)\n"
        "    return 'imported'\n"
        "print('BLOCKED', run_on_ranks(blocked, num_proc=2, backend='tensorflow'))\n"
        "m = DistributedKerasEstimator(numProc=2, epochs=2, batchSize=32, strategy='collective').fit(df)\n"
        "s = m.trainingSummary\n"
        "print('RANKS', [r['horovod_imported'] for r in s['ranks']], 'DRIVER', 'horovod' in sys.modules"
        " and getattr(sys.modules['horovod'], '__file__', '') or '', len(s['history']))\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=repo_root, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "RANKS [False, False] DRIVER  2" in proc.stdout, proc.stdout[-2000:]
    assert proc.stdout.count("horovod is blocked in this test") == 2, proc.stdout[-2000:]  # in both ranks


@pytest.mark.slow
def test_the_collective_strategy_leaves_no_threads_behind_per_step(split):
    """TensorFlow 2.18 started a sleeping timer thread for every collective given a timeout:
    a rank of the flights job died of EAGAIN after piling up ~90k threads. 230 updates here
    would have left 460 more threads."""
    train, _ = split
    model = _estimator(strategy="collective", epochs=2, batchSize=2, metrics=[]).fit(train)
    s = model.trainingSummary
    assert s["updates_per_epoch"] * 2 > 200
    assert all(0 < r["os_threads"] < 300 for r in s["ranks"]), [r["os_threads"] for r in s["ranks"]]


@pytest.mark.slow
def test_a_finished_run_loaded_from_its_checkpoint_keeps_its_strategy_and_local_sgd_waits_only_to_average(
        split, tmp_path):
    """Review of issue 24: the summary of a run loaded from its checkpoint had no strategy
    (the report then said horovod); measureWait put a barrier before every local-SGD update."""
    train, _ = split
    est = lambda: _estimator(strategy="local_sgd", localSteps=4, epochs=2, measureWait=True,  # noqa: E731
                             runId="done", checkpointDir=str(tmp_path))
    first = est().fit(train)
    again = est().fit(train)
    assert again.trainingSummary["resumed_from_epoch"] == 2
    assert again.trainingSummary["strategy"] == "local_sgd" and again.trainingSummary["local_steps"] == 4
    assert first.trainingSummary["history"][-1]["wait_s"] >= 0


def test_metrics_updated_by_concurrent_workers_lose_nothing():
    """Review of the parameter server: every worker updated the same metrics with Keras's
    read-then-write assign_add, and a training accuracy of 1.0104 came out. Batches added
    from two threads at once now count exactly, and equal Keras's own update."""
    import threading

    import keras
    import tensorflow as tf

    from sparkdeep.transformers.keras.parameter_server import add_to_metrics
    rng = np.random.default_rng(0)
    y = (rng.random((64, 1)) > 0.5).astype("float32")
    p = rng.random((64, 1)).astype("float32")
    w = np.ones(64, "float32")
    mine, keras_own = keras.metrics.AUC(), keras.metrics.AUC()
    add_to_metrics([mine], y, p, w)
    add_to_metrics([mine], y[:10], p[:10], w[:10])
    keras_own.update_state(y, p, sample_weight=w)
    keras_own.update_state(y[:10], p[:10], sample_weight=w[:10])
    assert float(mine.result()) == pytest.approx(float(keras_own.result()), abs=1e-7)

    acc = keras.metrics.BinaryAccuracy()
    step = tf.function(lambda: add_to_metrics([acc], y, y, w))  # every prediction right
    step()

    def worker():
        for _ in range(200):
            step()
    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total, count = (float(v.numpy()) for v in acc.variables)
    assert (total, count) == (401 * 64, 401 * 64) and float(acc.result()) == 1.0


@pytest.mark.slow
def test_a_parameter_server_batch_never_repeats_a_row_of_a_small_shard(split):
    """Review: 20 rows with batchSize 32 made one update of 32 rows from 10-row shards (each
    row about three times). A batch is now at most the smallest shard, as the synchronous
    strategies' plan makes a partial batch."""
    train, _ = split
    tiny = train.orderBy("id").limit(20)
    s = _estimator(strategy="parameter_server", epochs=2, batchSize=32, metrics=[]).fit(tiny).trainingSummary
    rows = [r["rows"] for r in s["ranks"]]
    assert sum(rows) == 20 and s["updates_per_epoch"] == 20 // min(rows)
