"""Evaluate: held-out AUC and accuracy of Keras vs logistic regression, counts and timings."""
from __future__ import annotations

import json
import sys

from sparkdeep import runs, tracking
from sparkdeep.pipelines import report as rp
from sparkdeep.pipelines.evaluate import binary_metrics, check_gate

from sparkdeep.jobs._common import main_for

# The steps before this one, whose reports it summarises.
STEPS = runs.STEPS[:runs.STEPS.index("evaluate")]


def step(spark, cfg, paths, run) -> dict:
    keras_pred = run.read(spark, "predictions")
    logreg_pred = run.read(spark, "baseline_predictions")
    keras = binary_metrics(keras_pred)
    logreg = binary_metrics(logreg_pred)
    reports = {s: run.report_of(s) or {} for s in STEPS}
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
    hists = {"keras_horovod": rp.score_histogram(keras_pred), "logistic_regression": rp.score_histogram(logreg_pred)}
    for name, h in hists.items():
        c = rp.curves(h)
        result["metrics"][name]["average_precision"] = round(c["average_precision"], 4)
    result["report_html"] = write_html(paths, run.run_id, rp.render_html(result, hists, reports, run.run_id))
    print("[evaluate] held-out metrics:")
    for name, m in result["metrics"].items():
        print(f"  {name:22s} AUC={m['auc']:.4f} accuracy={m['accuracy']:.4f} rows={m['rows']}")
    print("[evaluate] rows per step: " + json.dumps(counts))
    print("[evaluate] wall time per step (s): " + ", ".join(f"{s}={v}" for s, v in wall.items()))
    print(f"[evaluate] report: {result['report_html']}", flush=True)
    result["tracking"] = tracking.log_evaluate(cfg, paths, run.run_id, result, [result["report_html"]])
    if result["tracking"]:
        print(f"[evaluate] MLflow run {result['tracking']['mlflow_run_id']} at {result['tracking']['uri']}", flush=True)
    # Last, so that a model failing the gate still leaves its report and MLflow metrics.
    result["gate"] = check_gate(keras, cfg.gate, runs.read_latest(paths))
    pointer = run.promote(keras, evaluated="predictions")
    result["promoted"] = pointer is not None
    print(f"[evaluate] quality gate passed ({cfg.gate.metric}={keras[cfg.gate.metric]}); " +
          (f"run {pointer['run_id']}'s models are now the latest: {paths.latest}" if pointer else
           "the models evaluated are not this run's own: nothing promoted"), flush=True)
    return result


def write_html(paths, run_id: str | None, text: str) -> str:
    """``<output>/reports/evaluate.html`` (latest) and the run's own copy."""
    import os
    targets = [paths.report("evaluate", "html")] + ([paths.run_report(run_id, "evaluate", "html")] if run_id else [])
    for path in targets:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    return targets[0]


main = main_for("evaluate", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
