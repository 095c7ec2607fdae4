"""The deep pipeline against MLlib's usual strongest models, on the same rows.

Reads a finished run's output folder (``make run`` writes ``output/``): the ``train`` and
``holdout`` tables, the promoted prepare model and the evaluate report. Fits each baseline
of ``pipelines/baselines.py`` on every assembled feature of the whole training table (no
rebalancing, selection or PCA), scores the holdout and prints one table: held-out metrics
and fit seconds per model, the deep model's from the run's own evaluate report.

    .venv/bin/python bench/baselines_bench.py [--output output] [--models gbt,logistic_regression]

Writes bench/results/baselines_<data set>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import _results  # bench/_results.py (the script folder is on sys.path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", default="output", help="a finished run's output folder")
    ap.add_argument("--models", default="", help="comma-separated baselines (default: every one for the task)")
    ap.add_argument("--trees", type=int, default=50)
    ap.add_argument("--depth", type=int, default=6)
    args = ap.parse_args(argv)

    from sparkdeep import delta_io, model_store
    from sparkdeep.config import load_config
    from sparkdeep.pipelines import baselines as bl
    from sparkdeep.pipelines import evaluate as ev
    from sparkdeep.session import builder

    out = os.path.abspath(args.output)
    with open(os.path.join(out, "models", "latest.json")) as fh:
        latest = json.load(fh)
    with open(os.path.join(out, "reports", "evaluate.json")) as fh:
        report = json.load(fh)
    with open(os.path.join(out, "dataset.json")) as fh:
        dataset = json.load(fh)
    cfg = load_config(overrides=[f"output_dir={out}", f"data.dataset={dataset['spec_file']}"])
    spark = builder(cfg.spark, app_name="baselines-bench").getOrCreate()
    task, classes = report["task"], report.get("classes")
    key = cfg.dataset.key_column
    train = delta_io.read(spark, os.path.join(out, "tables", "train")).cache()
    holdout = delta_io.read(spark, os.path.join(out, "tables", "holdout")).cache()
    prepare_model = model_store.load_pipeline(spark, latest["models"]["prepare"]["path"])
    names = tuple(n for n in args.models.split(",") if n) or None
    model, fit_s = bl.fit_pipeline(train, prepare_model, task, seed=cfg.seed, names=names, trees=args.trees,
                                   depth=args.depth)
    rows = {"keras_horovod (run)": {**report["metrics"]["keras_horovod"],
                                    "fit_s": report.get("fit_s", {}).get("keras_horovod")}}
    all_scored = model.transform(holdout).cache()
    for name in bl.names_in(model):
        scored = ev.predictions_frame(bl.model_frame(all_scored, name, task), name, key=key, task=task,
                                      classes=classes)
        rows[f"{name} (full features)"] = {**ev.task_metrics(scored.cache(), task, classes), "fit_s": fit_s[name]}
    metric = {"binary": "auc", "multiclass": "accuracy", "regression": "r2"}[task]
    print(f"\n{dataset.get('name')} ({task}): {train.count()} training rows, {holdout.count()} held out")
    print(f"| model | {metric} | fit s |\n| --- | --- | --- |")
    for name, r in rows.items():
        fit = "" if r.get("fit_s") is None else f"{r['fit_s']:.1f}"
        print(f"| {name} | {r[metric]:.4f} | {fit} |")
    _results.write(os.path.join(os.path.dirname(__file__), "results", f"baselines_{dataset.get('name')}.json"),
                   {"task": task, "metric": metric, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
