"""Tuned against tuned (issue 26): the network and XGBoost each searched with the same trial budget.

Reads finished ``make run DATASET=<example> ARGS="--set tune.trials=N"`` runs (a run's
``reports/train.json`` holds both studies, ``reports/evaluate.json`` the held-out metrics)
and, for the same example, a run with the default settings and no search, and writes one
row per example: each side's held-out gate metric with defaults and after its search, the
search's wall time, trial states and best settings. Run:

    .venv/bin/python bench/tuned_comparison.py \\
        --tuned output/<example>:<run id> ... --default output/<example>:<run id> ...

Writes bench/results/tuned_comparison.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import finish  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tuned_comparison.json")
NETWORK = "keras_horovod"


def _reports(ref: str) -> tuple[str, dict, dict]:
    folder, run_id = ref.rsplit(":", 1)
    base = os.path.join(folder, "runs", run_id, "reports")
    with open(os.path.join(base, "train.json")) as fh:
        train = json.load(fh)
    with open(os.path.join(base, "evaluate.json")) as fh:
        evaluate = json.load(fh)
    return os.path.basename(os.path.normpath(folder)), train, evaluate


def _gate_metric(evaluate: dict) -> str:
    return evaluate["gate"]["metric"]


def _study(study: dict) -> dict:
    return {"budget": study["budget"], "states": study["states"], "wall_s": study["wall_s"],
            "best_trial": study["best"]["number"], "best_validation": study["best"]["value"],
            "best_params": study["best"]["params"]}


def row(tuned_ref: str, default_ref: str | None) -> dict:
    name, train, evaluate = _reports(tuned_ref)
    metric = _gate_metric(evaluate)
    held = evaluate["metrics"]
    out = {"example": name, "task": evaluate["task"], "metric": metric, "tuned_run": tuned_ref,
           "network_tuned": held[NETWORK][metric], "xgboost_tuned": held["xgboost"][metric],
           "network_search": _study(train["tune"]["network"]), "xgboost_search": _study(train["tune"]["xgboost"]),
           "fit_s": {k: evaluate["fit_s"].get(k) for k in (NETWORK, "xgboost")}}
    if default_ref:
        _, _, default_eval = _reports(default_ref)
        out.update({"default_run": default_ref, "network_default": default_eval["metrics"][NETWORK][metric],
                    "xgboost_default": default_eval["metrics"]["xgboost"][metric]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tuned", nargs="+", required=True, metavar="FOLDER:RUN_ID")
    p.add_argument("--default", nargs="*", default=[], metavar="FOLDER:RUN_ID",
                   help="the same examples' runs with the default settings, matched by folder name")
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    defaults = {os.path.basename(os.path.normpath(r.rsplit(":", 1)[0])): r for r in args.default}
    rows = [row(t, defaults.get(os.path.basename(os.path.normpath(t.rsplit(":", 1)[0])))) for t in args.tuned]
    print(f"{'example':16} {'metric':9} {'net default':>11} {'xgb default':>11} {'net tuned':>10} "
          f"{'xgb tuned':>10} {'net search s':>12} {'xgb search s':>12}")
    for r in rows:
        print(f"{r['example']:16} {r['metric']:9} {r.get('network_default', float('nan')):11.4f} "
              f"{r.get('xgboost_default', float('nan')):11.4f} {r['network_tuned']:10.4f} {r['xgboost_tuned']:10.4f} "
              f"{r['network_search']['wall_s']:12.0f} {r['xgboost_search']['wall_s']:12.0f}")
    return finish(args.out, {"examples": rows}, args)


if __name__ == "__main__":
    sys.exit(main())
