"""The benchmark suite: each public table of ``bench/suite/tables/`` through the whole pipeline
with its defaults, beside LightGBM's defaults on the same training and holdout rows.

For each table and seed: ``python -m sparkdeep.jobs.pipeline --dataset <spec>`` (ingest,
prepare, train, score, evaluate; evaluate fits MLlib's baselines and XGBoost on the same
training rows and scores every model on the same holdout), then LightGBM with its defaults
on that run's ``train`` and ``holdout`` tables (categories as LightGBM's own categoricals).
One JSON per table and seed under ``bench/results/suite/``; a finished one is kept, so a
rerun carries on where a stopped one ended. ``bench/suite/scoreboard.py`` reads them.

    .venv/bin/python bench/suite/run.py                      # every table, seed 1
    .venv/bin/python bench/suite/run.py --tables hi storms --seeds 1 2 3
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TABLES = os.path.join(HERE, "tables")
OUT = os.path.join(REPO, "bench", "results", "suite")
NETWORK = "keras_horovod"  # the network's name among the evaluate report's models


def tables() -> dict[str, str]:
    """Every table of the suite: its name -> its spec file."""
    return {os.path.basename(f)[:-5]: f for f in sorted(glob.glob(os.path.join(TABLES, "*.yaml")))}


def run_pipeline(spec: str, out: str, run_id: str, seed: int, extra: list[str], log_path: str) -> float:
    """The five steps in one process, as ``make pipeline`` runs them; its seconds."""
    cmd = [sys.executable, "-m", "sparkdeep.jobs.pipeline", "--dataset", spec, "--output-dir", out,
           "--run-id", run_id, "--set", f"seed={seed}", "--set", "tracking.enabled=false", *extra]
    t0 = time.time()
    with open(log_path, "w") as log:
        done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}); its output: {log_path}")
    return time.time() - t0


def measure(spark, out: str, run_id: str) -> dict:
    """A finished run's held-out figures: every model's, LightGBM's on the same rows."""
    sys.path.insert(0, os.path.dirname(HERE))
    from standins import _lightgbm

    from sparkdeep import delta_io
    reports = os.path.join(out, "runs", run_id, "reports")
    with open(os.path.join(reports, "evaluate.json")) as fh:
        evaluate = json.load(fh)
    with open(os.path.join(reports, "ingest.json")) as fh:
        ingest = json.load(fh)
    categorical = list(ingest["features"]["categorical"])
    features = categorical + list(ingest["features"]["numeric"])
    read = {t: delta_io.read(spark, os.path.join(out, "tables", t)).select(*features, "label").toPandas()
            for t in ("train", "holdout")}
    metric = evaluate["gate"]["metric"]
    lgbm = _lightgbm(read["train"], read["holdout"], evaluate["task"], "label", features, categorical)
    models = {name: m[metric] for name, m in evaluate["metrics"].items() if metric in m}
    models["lightgbm"] = lgbm[metric]
    return {"task": evaluate["task"], "metric": metric, "train_rows": len(read["train"]),
            "holdout_rows": len(read["holdout"]), "features": {"categorical": len(categorical),
                                                              "numeric": len(features) - len(categorical)},
            "models": {k: round(float(v), 5) for k, v in models.items()},
            "fit_s": {**(evaluate.get("fit_s") or {}), "lightgbm": lgbm["fit_s"]},
            "step_wall_s": evaluate.get("step_wall_s")}


def main(argv=None) -> int:
    known = tables()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", nargs="+", choices=sorted(known), default=sorted(known))
    p.add_argument("--seeds", nargs="+", type=int, default=[1])
    p.add_argument("--work", default=os.path.join(REPO, "output", "suite"), help="the runs' output folders")
    p.add_argument("--out", default=OUT, help="one JSON per table and seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every run (as the jobs' --set)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    extra = [x for kv in args.set for x in ("--set", kv)]
    spark = None
    for name in args.tables:
        for seed in args.seeds:
            path = os.path.join(args.out, f"{name}-s{seed}.json")
            if os.path.exists(path):
                print(f"[suite] {name} seed {seed}: done before ({path})", flush=True)
                continue
            out, run_id = os.path.join(args.work, name, f"s{seed}"), f"suite-s{seed}"
            os.makedirs(out, exist_ok=True)
            try:
                seconds = run_pipeline(known[name], out, run_id, seed, extra, os.path.join(out, "pipeline.log"))
            except RuntimeError as exc:
                print(f"[suite] {name} seed {seed}: {exc}", flush=True)
                continue
            if spark is None:
                from sparkdeep.config import SparkConfig
                from sparkdeep.session import builder
                spark = builder(SparkConfig(master="local[2]", app_name="suite", settings={
                    "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})).getOrCreate()
            result = {"table": name, "seed": seed, "spec": os.path.relpath(known[name], REPO),
                      "pipeline_s": round(seconds, 1), "overrides": args.set, **measure(spark, out, run_id)}
            with open(path + ".tmp", "w") as fh:
                json.dump(result, fh, indent=1)
            os.replace(path + ".tmp", path)
            m = result["models"]
            print(f"[suite] {name} seed {seed}: {result['metric']} network {m.get(NETWORK)} "
                  f"lightgbm {m['lightgbm']} xgboost {m.get('xgboost')} ({seconds:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
