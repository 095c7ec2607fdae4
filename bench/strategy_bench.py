"""The distribution strategies compared on the same work (issue 24).

For each strategy (horovod, collective, local_sgd, parameter_server) and two networks (the default tabular
network of the train step, and one with about ``--factor`` times its parameters: wider
hidden layers), one fit on the same prepared rows with the same seed, batch and epochs,
``measureWait`` on (a barrier before each exchange, timed apart). Reported per run:

- samples/s (epochs after the first, which carries the first trace),
- time to a fixed validation loss (the loosest best val_loss every strategy reached, so
  each run's time is the sum of its epochs' seconds until it got there),
- the held-out metric (AUC for binary, on the holdout rows through the prepare model),
- bytes handed to the collective per epoch by one rank, and the number of exchanges,
- seconds per epoch communicating and waiting for the other rank (parameter_server: its
  workers never wait for each other, and a worker's reads and writes of the weights happen
  inside its step, so its epoch is counted as compute; its staleness is reported instead).

It reads what ``make run`` wrote (``--output-dir output``: the prepared training table, the
holdout and the promoted prepare model) so the data is the default data; the large network
trains on a ``--big-fraction`` sample of those rows for ``--big-epochs`` epochs.

    .venv/bin/python bench/strategy_bench.py [--output-dir output] [--epochs 4]

Writes bench/results/strategies.json and bench/results/strategies.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _results  # bench/_results.py (the script folder is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))


def params_of(builder, input_dim: int, args: dict) -> int:
    import keras
    net = builder(input_dim, **args)
    n = int(sum(int(w.numpy().size) for w in net.weights if w.trainable))
    keras.backend.clear_session()
    return n


def widen(builder, input_dim: int, args: dict, factor: float) -> tuple[dict, int, int]:
    """Hidden layers widened (same depth) until the network has about ``factor`` times the
    parameters of ``args``'s: (new args, base params, new params)."""
    base = params_of(builder, input_dim, args)
    hidden = list(args["hidden_units"])
    lo, hi = 1.0, 64.0
    for _ in range(14):  # bisect the width multiplier
        mid = (lo + hi) / 2
        n = params_of(builder, input_dim, {**args, "hidden_units": [max(1, int(h * mid)) for h in hidden]})
        lo, hi = (mid, hi) if n < factor * base else (lo, mid)
    wide = {**args, "hidden_units": [max(1, int(h * hi)) for h in hidden]}
    return wide, base, params_of(builder, input_dim, wide)


def held_out_auc(spark, prepare_model, keras_model, holdout) -> float:
    from pyspark.ml import PipelineModel
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.functions import vector_to_array
    from sparkdeep.registry import Columns
    scored = PipelineModel(list(prepare_model.stages) + [keras_model]).transform(holdout)
    scored = scored.withColumn("_p", vector_to_array(Columns.PROBABILITY)[1])
    return BinaryClassificationEvaluator(rawPredictionCol="_p", labelCol=Columns.LABEL).evaluate(scored)


def run_one(estimator, train, strategy: str, local_steps: int) -> dict:
    params = {estimator.strategy: strategy, estimator.measureWait: strategy != "parameter_server",
              estimator.earlyStoppingPatience: 0}
    if strategy == "local_sgd":
        params[estimator.localSteps] = local_steps
    if strategy == "parameter_server":  # each update is one worker's batch: the rate as given
        params[estimator.scaleLearningRate] = False
    est = estimator.copy(params)
    t0 = time.time()
    model = est.fit(train)
    wall = time.time() - t0
    s = model.trainingSummary
    hist = s["history"]
    later = hist[1:] or hist
    rank0 = s["ranks"][0]
    return {"model": model, "strategy": strategy, "fit_s": round(wall, 1),
            "samples_per_s": round(sum(h["samples_per_s"] for h in later) / len(later), 1),
            "epoch_s": round(sum(h["seconds"] for h in later) / len(later), 2),
            "comm_s_per_epoch": round(sum(h["allreduce_s"] for h in later) / len(later), 3),
            "wait_s_per_epoch": round(sum(h["wait_s"] for h in later) / len(later), 3),
            "compute_s_per_epoch": round(sum(h["compute_s"] for h in later) / len(later), 3),
            "bytes_per_epoch": int(sum(h["comm_bytes"] for h in hist) / len(hist)),
            "exchanges_per_epoch": rank0["allreduce_calls"] / len(hist),
            "val_loss": [round(h["val_loss"], 5) for h in hist], "seconds": [h["seconds"] for h in hist],
            "launch_to_first_step_s": s["timings_s"]["launch_to_first_step"],
            "replicas_identical": len({r["weights_digest"] for r in s["ranks"]}) == 1,
            "staleness": s.get("staleness")}


def time_to(run: dict, target: float) -> float | None:
    elapsed = 0.0
    for loss, seconds in zip(run["val_loss"], run["seconds"]):
        elapsed += seconds
        if loss <= target:
            return round(elapsed, 2)
    return None


def compare(spark, cfg, prepare_model, train, holdout, args_net: dict, epochs: int, strategies, local_steps,
            label: str) -> dict:
    from sparkdeep.pipelines.train import keras_estimator
    from sparkdeep.pipelines.prepare import network_layout
    t = cfg.train
    layout = network_layout(prepare_model, train)
    rows = train.count()
    est = keras_estimator(t, task=cfg.dataset.task, seed=cfg.seed, layout=layout, rows=rows)
    est = est.copy({est.epochs: epochs, est.modelArgs: json.dumps({**est.getModelArgs(), **args_net},
                                                                    sort_keys=True)})
    runs = []
    for name in strategies:
        print(f"[{label}] {name} ...", flush=True)
        r = run_one(est, train, name, local_steps)
        r["holdout_auc"] = round(held_out_auc(spark, prepare_model, r.pop("model"), holdout), 4)
        print(f"[{label}] {name}: {json.dumps({k: v for k, v in r.items() if k not in ('val_loss', 'seconds')})}",
              flush=True)
        runs.append(r)
    target = max(min(r["val_loss"]) for r in runs)
    for r in runs:
        r["time_to_target_s"] = time_to(r, target)
    return {"rows": rows, "epochs": epochs, "batch_size": est.getBatchSize(), "target_val_loss": target,
            "hidden_units": est.getModelArgs()["hidden_units"], "runs": runs}


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    nets = list(results["networks"])
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4))
    for ax, net in zip(axes if len(nets) > 1 else [axes], nets):
        block = results["networks"][net]
        names = [r["strategy"] for r in block["runs"]]
        compute = [r["compute_s_per_epoch"] for r in block["runs"]]
        comm = [r["comm_s_per_epoch"] for r in block["runs"]]
        wait = [r["wait_s_per_epoch"] for r in block["runs"]]
        other = [max(0.0, r["epoch_s"] - c - m - w) for r, c, m, w in zip(block["runs"], compute, comm, wait)]
        ax.bar(names, compute, label="compute")
        ax.bar(names, wait, bottom=compute, label="waiting for the other rank")
        ax.bar(names, comm, bottom=[c + w for c, w in zip(compute, wait)], label="communicating")
        ax.bar(names, other, bottom=[c + w + m for c, w, m in zip(compute, wait, comm)], label="input, metrics")
        for i, r in enumerate(block["runs"]):
            note = (f"\nasync, staleness {r['staleness']['mean']:.2f}" if r.get("staleness") else "")
            ax.text(i, r["epoch_s"], f"AUC {r['holdout_auc']:.4f}\n{r['bytes_per_epoch'] / 1e6:.1f} MB/epoch{note}",
                    ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{net}: {block['params']:,} parameters, {block['rows']:,} rows")
        ax.set_ylabel("seconds per epoch (rank 0)")
        ax.set_ylim(0, max(r["epoch_s"] for r in block["runs"]) * 1.3)
    axes_list = axes if len(nets) > 1 else [axes]
    axes_list[-1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="output", help="what `make run` wrote")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--factor", type=float, default=100.0, help="the large network's parameters / default's")
    parser.add_argument("--big-fraction", type=float, default=0.1)
    parser.add_argument("--big-epochs", type=int, default=2)
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--strategies", default="horovod,collective,local_sgd,parameter_server")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "strategies.json"))
    parser.add_argument("--replot", action="store_true", help="only redraw the plot from --out's JSON")
    a = parser.parse_args(argv)
    if a.replot:
        with open(a.out) as fh:
            plot(json.load(fh), os.path.splitext(a.out)[0] + ".png")
        return 0

    from sparkdeep import delta_io, model_store, paths as paths_mod
    from sparkdeep.config import SparkConfig, load_config
    from sparkdeep.registry import Tables
    from sparkdeep.session import builder
    from sparkdeep.transformers.keras_models import TABULAR_BUILDERS

    cfg = load_config(os.path.join(os.path.dirname(HERE), "conf"), env="local")
    p = paths_mod.Paths.under(a.output_dir)
    latest = json.load(open(os.path.join(a.output_dir, "models", "latest.json")))
    spark = builder(SparkConfig(master="local[2]", settings={"spark.ui.enabled": "false",
                                                             "spark.task.maxFailures": "1"}),
                    app_name="strategy-bench").getOrCreate()
    prepare_model = model_store.load_pipeline(spark, latest["models"]["prepare"]["path"])
    train = delta_io.read(spark, p.table(Tables.TRAIN_PREPARED)).cache()
    holdout = delta_io.read(spark, p.table(Tables.HOLDOUT)).cache()
    strategies = a.strategies.split(",")

    from sparkdeep.pipelines.prepare import network_layout
    layout = network_layout(prepare_model, train)
    from sparkdeep.transformers.keras.network import resolve_builder
    builder_fn = resolve_builder(TABULAR_BUILDERS[cfg.dataset.task])
    base_args = {"hidden_units": list(cfg.train.hidden_units), "dropout": cfg.train.dropout,
                 "numeric_dim": int(layout["numeric_dim"]), "cardinalities": list(layout["cardinalities"]),
                 "normalization": cfg.train.normalization}
    width = len(train.first()["features"])
    wide_args, base_params, wide_params = widen(builder_fn, width, base_args, a.factor)
    results = {"machine": f"{os.cpu_count()} cores", "local_steps": a.local_steps, "networks": {}}
    block = compare(spark, cfg, prepare_model, train, holdout, {}, a.epochs, strategies, a.local_steps, "default")
    results["networks"]["default"] = {**block, "params": base_params}
    big_train = train.sample(fraction=a.big_fraction, seed=7).cache()
    block = compare(spark, cfg, prepare_model, big_train, holdout, {"hidden_units": wide_args["hidden_units"]},
                    a.big_epochs, strategies, a.local_steps, f"{a.factor:g}x")
    results["networks"][f"{a.factor:g}x"] = {**block, "params": wide_params}
    _results.write(a.out, results)
    plot(results, os.path.splitext(a.out)[0] + ".png")
    print(f"wrote {os.path.splitext(a.out)[0] + '.png'}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
