"""Communication and scaling of the synchronous default (issue 25, target 1), before and after.

On the default data (what ``make run`` wrote), the default strategy (horovod) with the
train step's network and batch, ``accumulationSteps=1``, no ``measureWait``: one fit on 1
rank and one on 2 ranks, each for the default network and for one with about ``--factor``
times its parameters (wider hidden layers, on a ``--big-fraction`` sample). Reported per fit,
over the epochs after the first (which carries the first trace):

- samples/s, and the scaling ratio: 2-rank samples/s / (2 x 1-rank samples/s) (target >= 0.9);
- the epoch's split, mean over ranks: input, compute, communication (all-reduce, including
  the wait for the other rank inside it), idle; communication's share of the epoch
  (target <= 10%);
- the launch, part by part (``trainingSummary['launch_s']``) and ``fit`` wall
  time / in-loop training time (target <= 1.3).

``--before REV`` first runs the same measurements with the code of git revision ``REV``
(a worktree in a temporary folder, put first on the path of the driver and of the ranks,
and the folder they start in),
so before and after are measured in one invocation on the same machine state.

    .venv/bin/python bench/communication_bench.py [--before 5191206] [--output-dir output]

Writes bench/results/communication.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import _results  # bench/_results.py (the script folder is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PACKAGE_DIRS = ("transformers", "pipelines", "jobs")  # pyproject maps them into sparkdeep.*


def code_of(rev: str, root: str) -> str:
    """A folder whose ``sparkdeep`` package is revision ``rev``'s (its core modules with the
    mapped folders linked in), to put first on PYTHONPATH."""
    tree = os.path.join(root, "tree")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", tree, rev], check=True,
                   stdout=subprocess.DEVNULL)
    shim = os.path.join(root, "shim")
    shutil.copytree(os.path.join(tree, "sparkdeep"), os.path.join(shim, "sparkdeep"))
    for d in PACKAGE_DIRS:
        os.symlink(os.path.join(tree, d), os.path.join(shim, "sparkdeep", d))
    return shim


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def one_fit(estimator, train, num_proc: int) -> dict:
    est = estimator.copy({estimator.numProc: num_proc, estimator.earlyStoppingPatience: 0})
    t0 = time.time()
    model = est.fit(train)
    wall = time.time() - t0
    s = model.trainingSummary
    later = s["history"][1:] or s["history"]
    if s.get("profile"):  # every rank's own split
        epochs = [e for r in s["profile"]["ranks"] for e in r["epochs"] if e["epoch"] > 1] or \
                 [e for r in s["profile"]["ranks"] for e in r["epochs"]]
    else:  # rank 0's (the code before the profile)
        epochs = later
    split = {k: round(mean(e.get(k, 0.0) for e in epochs), 3)
             for k in ("seconds", "input_s", "compute_s", "allreduce_s", "idle_s")}
    if "idle_s" not in epochs[0]:
        split["idle_s"] = round(split["seconds"] - split["input_s"] - split["compute_s"] - split["allreduce_s"], 3)
    t = s["timings_s"]
    return {"ranks": num_proc, "fit_s": round(wall, 1),
            "samples_per_s": round(mean(h["samples_per_s"] for h in later), 1),
            "split_s_per_epoch": split,
            "allreduce_share": round(split["allreduce_s"] / split["seconds"], 3) if split["seconds"] else None,
            "cpu_percent": round(mean(e.get("cpu_percent", 0.0) for e in epochs), 1) if s.get("profile") else None,
            "gflop_s": round(mean(e.get("gflop_s", 0.0) for e in epochs), 2) if s.get("profile") else None,
            "allreduce_calls": s["ranks"][0]["allreduce_calls"], "allreduce_bytes": s["ranks"][0]["allreduce_bytes"],
            "launch_to_first_step_s": t["launch_to_first_step"], "training_s": t["training"],
            "fit_over_training": round(t["fit_total"] / t["training"], 2), "launch_s": s.get("launch_s"),
            "teardown_s": t.get("teardown")}


def measure(a) -> dict:
    sys.path.insert(0, HERE)
    from strategy_bench import widen

    from sparkdeep import delta_io, paths as paths_mod
    from sparkdeep import model_store
    from sparkdeep.config import SparkConfig, load_config
    from sparkdeep.pipelines.prepare import network_layout
    from sparkdeep.pipelines.train import keras_estimator
    from sparkdeep.registry import Tables
    from sparkdeep.session import builder
    from sparkdeep.transformers.keras.network import resolve_builder
    from sparkdeep.transformers.keras_models import TABULAR_BUILDERS

    cfg = load_config(a.conf or os.path.join(REPO, "conf"), env="local")
    p = paths_mod.Paths.under(a.output_dir)
    with open(os.path.join(a.output_dir, "models", "latest.json")) as fh:
        latest = json.load(fh)
    spark = builder(SparkConfig(master="local[2]", settings={"spark.ui.enabled": "false",
                                                             "spark.task.maxFailures": "1"}),
                    app_name="communication-bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    prepare_model = model_store.load_pipeline(spark, latest["models"]["prepare"]["path"])
    train = delta_io.read(spark, p.table(Tables.TRAIN_PREPARED)).cache()
    rows = train.count()
    layout = network_layout(prepare_model, train)
    est = keras_estimator(cfg.train, task=cfg.dataset.task, seed=cfg.seed, layout=layout, rows=rows)
    est = est.copy({est.epochs: a.epochs})
    builder_fn = resolve_builder(TABULAR_BUILDERS[cfg.dataset.task])
    width = len(train.first()["features"])
    wide, base_params, wide_params = widen(builder_fn, width, est.getModelArgs(), a.factor)
    out = {"rows": rows, "batch_size": est.getBatchSize(), "epochs": a.epochs, "networks": {}}
    big = train.sample(fraction=a.big_fraction, seed=7).cache()
    for label, data, args, params in (("default", train, {}, base_params),
                                      (f"{a.factor:g}x", big, {"hidden_units": wide["hidden_units"]}, wide_params)):
        e = est.copy({est.modelArgs: json.dumps({**est.getModelArgs(), **args}, sort_keys=True)})
        fits = {}
        for n in (1, 2):
            fits[n] = one_fit(e, data, n)
            print(f"[{a.label}] {label} {n} rank(s): {json.dumps(fits[n])}", flush=True)
        out["networks"][label] = {"params": params, "one_rank": fits[1], "two_ranks": fits[2],
                                  "scaling_ratio": round(fits[2]["samples_per_s"] / (2 * fits[1]["samples_per_s"]), 3)}
    spark.stop()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="output", help="what `make run` wrote")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--factor", type=float, default=100.0)
    parser.add_argument("--big-fraction", type=float, default=0.1)
    parser.add_argument("--before", default="", help="a git revision measured first with the same settings")
    parser.add_argument("--label", default="after", help=argparse.SUPPRESS)
    parser.add_argument("--json", default="", help=argparse.SUPPRESS)
    parser.add_argument("--conf", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "communication.json"))
    a = parser.parse_args(argv)
    if a.json:  # a child run (the code on its path is the revision's): figures to a file
        with open(a.json, "w") as fh:
            json.dump(measure(a), fh)
        return 0
    results = {"machine": f"{os.cpu_count()} cores"}
    if a.before:
        with tempfile.TemporaryDirectory() as tmp:
            shim = code_of(a.before, tmp)
            try:
                env = {**os.environ, "PYTHONPATH": os.pathsep.join([shim, os.environ.get("PYTHONPATH", "")])}
                child = os.path.join(tmp, "before.json")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--json", child, "--label", "before",
                                "--conf", os.path.join(tmp, "tree", "conf"),
                                "--output-dir", os.path.abspath(a.output_dir), "--epochs", str(a.epochs),
                                "--factor", str(a.factor), "--big-fraction", str(a.big_fraction)],
                               # the ranks start with `python -m` in the task's folder: the shim's, so
                               # its sparkdeep comes first there too
                               env=env, check=True, cwd=shim)
                with open(child) as fh:
                    results["before"] = {"revision": a.before, **json.load(fh)}
            finally:
                subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", os.path.join(tmp, "tree")],
                               check=False)
    results["after"] = measure(a)
    return _results.finish(a.out, results, a)


if __name__ == "__main__":
    sys.exit(main())
