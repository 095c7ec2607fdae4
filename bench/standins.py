"""Generated stand-ins of tables the pipeline never met, against LightGBM on the same rows.

For each stand-in spec (``conf/datasets/generated_*.yaml``: ID-like categories with
thousands of levels; few distinct rows repeated), reads a finished ``make run
DATASET=<spec>`` run (its ``reports/evaluate.json``: the network's and the baselines'
held-out metrics; its ``train`` and ``holdout`` Delta tables: the same rows), fits
LightGBM with its defaults on the training rows (categories as pandas categoricals,
LightGBM's own categorical handling) and scores the holdout, and records what the
generator knows is reachable (:func:`sparkdeep.synth.reachable`). Run:

    make run DATASET=conf/datasets/generated_ratings.yaml
    make run DATASET=conf/datasets/generated_repeated.yaml
    .venv/bin/python bench/standins.py output/generated_ratings:<run id> output/generated_repeated:<run id>

Writes bench/results/standins.json and prints one row per stand-in.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import finish  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "standins.json")
NETWORK = "keras_horovod"


def _lightgbm(train, holdout, task: str, label: str, features: list[str], categorical: list[str]) -> dict:
    import lightgbm as lgb
    import numpy as np
    from sklearn.metrics import accuracy_score, r2_score, roc_auc_score
    for frame in (train, holdout):
        for c in categorical:
            frame[c] = frame[c].astype("category")
    for c in categorical:  # the holdout's codes in the training levels' order
        holdout[c] = holdout[c].cat.set_categories(train[c].cat.categories)
    t0 = time.perf_counter()
    if task == "regression":
        model = lgb.LGBMRegressor(verbose=-1).fit(train[features], train[label])
        out = {"r2": r2_score(holdout[label], model.predict(holdout[features]))}
    else:
        model = lgb.LGBMClassifier(verbose=-1).fit(train[features], train[label])
        p = model.predict_proba(holdout[features])
        out = ({"auc": roc_auc_score(holdout[label], p[:, 1])} if task == "binary" else
               {"accuracy": accuracy_score(holdout[label], np.asarray(model.classes_)[p.argmax(axis=1)])})
    out["fit_s"] = round(time.perf_counter() - t0, 2)
    return out


def row(spark, ref: str) -> dict:
    from sparkdeep import delta_io, synth
    from sparkdeep.dataset import load_spec
    folder, run_id = ref.rsplit(":", 1)
    base = os.path.join(folder, "runs", run_id, "reports")
    with open(os.path.join(base, "evaluate.json")) as fh:
        evaluate = json.load(fh)
    with open(os.path.join(base, "ingest.json")) as fh:
        ingest = json.load(fh)
    name = ingest["dataset"]
    spec = load_spec(ingest["spec_file"])
    features = ingest["features"]["categorical"] + ingest["features"]["numeric"]
    categorical = ingest["features"]["categorical"]
    label = "label"
    tables = os.path.join(folder, "tables")
    train = delta_io.read(spark, os.path.join(tables, "train")).select(*features, label).toPandas()
    holdout = delta_io.read(spark, os.path.join(tables, "holdout")).select(*features, label).toPandas()
    metric = evaluate["gate"]["metric"]
    held = evaluate["metrics"]
    lgbm = _lightgbm(train, holdout, evaluate["task"], label, features, categorical)
    shape = synth.Shape.from_options(dict(spec.source.options))
    return {"stand_in": name, "run": ref, "task": evaluate["task"], "metric": metric,
            "train_rows": len(train), "holdout_rows": len(holdout),
            "network": held[NETWORK][metric], "lightgbm": lgbm[metric],
            "network_minus_lightgbm": round(held[NETWORK][metric] - lgbm[metric], 4),
            "baselines": {k: v[metric] for k, v in held.items() if k != NETWORK and metric in v},
            "reachable_all_rows": synth.reachable(spark, shape)[metric],
            "fit_s": {**evaluate.get("fit_s", {}), "lightgbm": lgbm["fit_s"]}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="output/<stand-in>:<run id> of a finished make run")
    args = p.parse_args(argv)
    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", app_name="standins")).getOrCreate()
    rows = [row(spark, ref) for ref in args.runs]
    for r in rows:
        print(f"{r['stand_in']:24s} {r['metric']}: network {r['network']:.4f}  LightGBM {r['lightgbm']:.4f}  "
              f"({r['network_minus_lightgbm']:+.4f})  reachable {r['reachable_all_rows']:.4f}  "
              f"baselines {json.dumps({k: round(v, 4) for k, v in r['baselines'].items()})}")
    return finish(OUT, {"rows": rows}, args)


if __name__ == "__main__":
    sys.exit(main())
