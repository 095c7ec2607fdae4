"""Evaluate: held-out AUC and accuracy of Keras vs logistic regression, counts and timings."""
from __future__ import annotations

import json
import sys

from sparkdeep.pipelines.evaluate import binary_metrics

from sparkdeep.jobs._common import main_for, read_report

STEPS = ("ingest", "prepare", "train", "score")


def step(spark, cfg, paths, run) -> dict:
    keras = binary_metrics(run.read(spark, "predictions"))
    logreg = binary_metrics(run.read(spark, "baseline_predictions"))
    reports = {s: read_report(paths, s, run.run_id) or {} for s in STEPS}
    counts = {
        "ingest": {"in": reports["ingest"].get("rows_in"), "usable": reports["ingest"].get("rows_usable"),
                   "rejected": reports["ingest"].get("rows_rejected")},
        "prepare": {"train": reports["prepare"].get("rows_train"),
                    "train_prepared": reports["prepare"].get("rows_train_prepared"),
                    "holdout": reports["prepare"].get("rows_holdout")},
        "train": {"in": reports["train"].get("rows_in")},
        "score": {"in": reports["score"].get("rows_in"), "out": reports["score"].get("rows_out_predictions")},
    }
    wall = {s: reports[s].get("wall_s") for s in STEPS}
    result = {"metrics": {"keras_horovod": keras, "logistic_regression": logreg},
              "row_counts": counts, "step_wall_s": wall}
    print("[evaluate] held-out metrics:")
    for name, m in result["metrics"].items():
        print(f"  {name:22s} AUC={m['auc']:.4f} accuracy={m['accuracy']:.4f} rows={m['rows']}")
    print("[evaluate] rows per step: " + json.dumps(counts))
    print("[evaluate] wall time per step (s): " + ", ".join(f"{s}={v}" for s, v in wall.items()), flush=True)
    return result


main = main_for("evaluate", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
