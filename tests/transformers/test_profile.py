"""Issue 25: each rank profiles itself per epoch (time split, CPU, FLOP/s, memory), the
synchronous step is one graph call with its parts stamped inside it, one rank exchanges
nothing, and the optional deep traces land where they were asked for."""
from __future__ import annotations

import json
import math
import os

import pytest

from sparkdeep.transformers.keras.feed import Prefetch, plan_steps
from sparkdeep.transformers.keras.profile import (HOROVOD_TIMELINE, LAUNCH_PARTS, SPLIT, SPLIT_TOLERANCE,
                                                  forward_flops_per_sample, training_flops_per_sample)
from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator

from .test_keras_estimator import cancer  # noqa: F401 - the shared module fixture
from .test_rank_feed import logistic_steps_and_feed
from ._plain import PLAIN


def test_the_flops_estimate_counts_matrices_twice_vectors_once_and_lookups_not_at_all():
    import keras
    idx = keras.Input((1,), dtype="int32")
    num = keras.Input((4,))
    emb = keras.layers.Flatten()(keras.layers.Embedding(1000, 8)(idx))  # 8,000 weights, no multiply-adds
    h = keras.layers.Dense(3)(keras.layers.Concatenate()([emb, num]))    # 12 x 3 kernel + 3 bias
    h = keras.layers.LayerNormalization()(h)                             # 3 + 3
    out = keras.layers.Dense(1)(h)                                       # 3 x 1 + 1
    model = keras.Model([idx, num], out)
    assert forward_flops_per_sample(model) == 2 * 36 + 3 + 6 + 2 * 3 + 1
    assert training_flops_per_sample(model) == 3 * forward_flops_per_sample(model)


def test_an_ensembles_shared_layers_count_once_per_member_and_its_own_weights_once():
    from sparkdeep.transformers.keras_models import tabular_regressor
    kw = dict(input_dim=6, numeric_dim=4, cardinalities=(10, 7), hidden_units=(16, 8), dropout=0.0)
    # embeddings 5 + 6 wide (free) beside 4 numbers: 15 values into the hidden layers
    hidden = 2 * 15 * 16 + 2 * 16 + 2 * 16 * 8 + 2 * 8  # dense_0, norm_0, dense_1, norm_1 (no bias before a norm)
    assert forward_flops_per_sample(tabular_regressor(**kw)) == hidden + 2 * 8 + 1
    # 4 members: the adapter's 4 x 15 scales (a multiply each) and the heads' 4 x (8 x 1 + 1) once,
    # the shared layers 4 times
    assert forward_flops_per_sample(tabular_regressor(**kw, ensemble=4)) == 60 + 4 * hidden + (2 * 32 + 4)


def test_the_fused_step_trains_and_stamps_its_parts(tmp_path):
    """One graph call per update (gradients, reduction, update), its parts timed by
    tf.timestamp inside the graph; the five parts add up to the loop's wall time."""
    from sparkdeep.transformers.keras.network import make_metric
    from sparkdeep.transformers.keras.rank_loop import _identity, run_epoch
    n = 2000
    auc = make_metric("auc", "binary")
    steps, feed = logistic_steps_and_feed(str(tmp_path), n, metrics=[auc], reduce=_identity)
    plan = plan_steps([feed.rows], 50)
    losses = []
    for epoch in range(3):
        done = run_epoch(steps, Prefetch(feed.epoch(epoch, plan.steps)), updates=plan.updates, accumulation=1,
                         allreduce=lambda g: g, set_lr=lambda: 0.05)
        assert done["fused"] and done["rows"] == n and done["batches"] == 40
        assert done["compute_s"] > 0 and done["allreduce_s"] >= 0 and done["idle_s"] >= 0
        parts = sum(done[k] for k in SPLIT)
        assert parts == pytest.approx(done["loop_s"], rel=1e-6, abs=1e-6)
        losses.append(done["loss"])
    assert losses[-1] < losses[0] * 0.7
    assert float(auc.result()) > 0.9  # the metrics are updated inside the graph
    # accumulation needs the split step (the reduction every K batches)
    done = run_epoch(steps, Prefetch(feed.epoch(3, plan.steps)), updates=plan.updates // 2, accumulation=2,
                     allreduce=lambda g: g, set_lr=lambda: 0.05)
    assert not done["fused"] and done["batches"] == 40


def _check_profile(summary, ranks: int, epochs: int) -> None:
    profile = summary["profile"]
    assert profile["flops_per_sample"] > 0 and profile["split"] == list(SPLIT)
    assert [r["rank"] for r in profile["ranks"]] == list(range(ranks))
    for r in profile["ranks"]:
        assert [e["epoch"] for e in r["epochs"]] == list(range(1, epochs + 1))
        for e in r["epochs"]:
            values = [v for k, v in e.items() if k != "fused_step"]
            assert all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values), e
            parts = sum(e[k] for k in SPLIT)
            assert abs(parts - e["seconds"]) <= max(SPLIT_TOLERANCE * e["seconds"], 0.05), e
            assert 0 < e["cpu_percent"] <= 100 * os.cpu_count() * 1.05, e
            assert e["gflop_s"] > 0 and e["gflop_s_computing"] >= e["gflop_s"] and e["peak_rss_mb"] > 50, e
    last = summary["history"][-1]
    assert {"cpu_percent", "gflop_s", "idle_s"} <= set(last)


@pytest.mark.slow
def test_two_horovod_ranks_profile_every_epoch_and_write_the_deep_traces(cancer, tmp_path):  # noqa: F811
    trace = tmp_path / "trace"
    model = DistributedKerasEstimator(numProc=2, epochs=3, batchSize=32, learningRate=0.005, warmupEpochs=0.0,
                                  seed=3, metrics=["auc"], traceDir=str(trace), traceEpoch=2, **PLAIN).fit(cancer)
    s = model.trainingSummary
    _check_profile(s, ranks=2, epochs=3)
    assert all(e["fused_step"] for r in s["profile"]["ranks"] for e in r["epochs"])
    assert all(e["allreduce_s"] > 0 for r in s["profile"]["ranks"] for e in r["epochs"])
    assert len({r["weights_digest"] for r in s["ranks"]}) == 1  # the fused step keeps the replicas identical
    updates, epochs = s["updates_per_epoch"], 3
    assert all(r["allreduce_calls"] == updates * epochs and r["allreduce_bytes"] > 0 for r in s["ranks"])
    assert s["history"][-1]["auc"] > 0.9
    # the launch, part by part, up to the slowest rank's first step
    launch, t = s["launch_s"], s["timings_s"]
    assert all(isinstance(v, (int, float)) for v in t.values())  # timings_s stays flat: seconds by name
    assert list(launch) == [name for name, _, _ in LAUNCH_PARTS], launch
    assert all(v >= 0 for v in launch.values()) and launch["imports"] > 0 and launch["first_step"] > 0
    assert t["launch_to_first_step"] - 0.01 <= sum(launch.values()) <= t["fit_total"]
    assert 0 <= t["teardown"] < t["fit_total"]
    # the deep traces: TensorFlow's profiler per rank, Horovod's timeline (rank 0 writes it)
    for rank in (0, 1):
        files = [f for _, _, fs in os.walk(trace / f"rank-{rank}") for f in fs]
        assert any(f.endswith(".xplane.pb") for f in files), files
    timeline = (trace / HOROVOD_TIMELINE).read_text()
    assert "ALLREDUCE" in timeline.upper() and timeline.lstrip().startswith("[")


@pytest.mark.slow
def test_one_rank_exchanges_nothing_and_still_profiles(cancer):  # noqa: F811
    model = DistributedKerasEstimator(numProc=1, epochs=2, batchSize=64, learningRate=0.005, warmupEpochs=0.0,
                                  seed=3, metrics=["auc"], **PLAIN).fit(cancer)
    s = model.trainingSummary
    _check_profile(s, ranks=1, epochs=2)
    assert s["ranks"][0]["allreduce_calls"] == 0 and s["ranks"][0]["allreduce_bytes"] == 0
    assert all(e["allreduce_s"] == 0 for e in s["profile"]["ranks"][0]["epochs"])


def test_a_trace_epoch_outside_the_run_is_refused_on_the_driver(cancer, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="traceEpoch must be between 1 and epochs=2"):
        DistributedKerasEstimator(numProc=1, epochs=2, traceDir=str(tmp_path), traceEpoch=3, **PLAIN).fit(cancer)


def test_the_report_plots_each_rank_s_split_and_tables_utilisation():
    from sparkdeep.pipelines import report
    epochs = [{"epoch": e, "seconds": 1.0, "input_s": 0.1, "compute_s": 0.5, "allreduce_s": 0.2, "wait_s": 0.0,
               "idle_s": 0.2, "cpu_percent": 93.0, "gflop_s": 1.5, "peak_rss_mb": 700.0} for e in (1, 2)]
    profile = {"flops_per_sample": 1234, "split": list(SPLIT), "ranks": [{"rank": 0, "epochs": epochs},
                                                                          {"rank": 1, "epochs": epochs}]}
    history = [{"epoch": e["epoch"], "samples_per_s": 10.0, **e} for e in epochs]
    reports = {"train": {"keras": {"history": history, "profile": profile, "ranks": [{}, {}]}}}
    captions = [c for _, c, _ in report.figures({"task": "binary", "metrics": {}}, {}, reports)]
    assert "Time split per rank and epoch" in captions
    assert report.png_bytes(report.time_split_figure(profile))[:4] == b"\x89PNG"
    html = report.training_html(reports)
    assert "CPU of rank 0" in html and "93.0%" in html and "700 MB" in html and "1,234" in html
    json.dumps(profile)  # JSON-clean
