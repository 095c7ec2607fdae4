"""Evaluate: held-out metrics of Keras vs MLlib's usual models, fit times, counts and timings.

The task comes from the predictions table itself (its ``probability`` column), the class
names from its ``label`` metadata: this step needs no data-set knowledge.
"""
from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from sparkdeep import runs, tasks, tracking
from sparkdeep.registry import Tables
from sparkdeep.pipelines import evaluate as ev
from sparkdeep.pipelines import report as rp

from sparkdeep.jobs._common import main_for

# The steps before this one, whose reports it summarises.
STEPS = runs.STEPS[:runs.STEPS.index("evaluate")]

# Report name of our model; the baselines go by their names in pipelines/baselines.
KERAS = "keras_horovod"


def step(spark, cfg, paths, run) -> dict:
    keras_pred = run.read(spark, Tables.PREDICTIONS)
    baseline_pred = run.read(spark, Tables.BASELINE_PREDICTIONS)
    task = ev.task_of(keras_pred)
    if ev.task_of(baseline_pred) != task:
        raise ValueError(f"predictions is a {task} table but baseline_predictions a "
                         f"{ev.task_of(baseline_pred)} one: rerun the score step")
    tasks.gate_metric(cfg.gate.metric, task)  # a gate metric the task lacks fails now, not after the report
    ablation = rp.load_ablation(cfg.baselines.ablation) if cfg.baselines.ablation else None
    spec = cfg.dataset
    if ablation and ablation.get("dataset") not in (spec.name, spec.table):
        print(f"[evaluate] note: the ablation in {cfg.baselines.ablation} was measured on data set "
              f"{ablation.get('dataset')!r}, not this run's {spec.name!r}; the report says so", flush=True)
    classes = ev.classes_of(keras_pred)
    reports = {s: run.report_of(s) or {} for s in STEPS}
    baseline_pred = baseline_pred.cache()  # read once for every baseline's metrics and plots
    names = reports["score"].get("baselines") or sorted(
        r[0] for r in baseline_pred.select(ev.MODEL).distinct().collect())
    predictions = {KERAS: keras_pred, **{n: baseline_pred.where(F.col(ev.MODEL) == n) for n in names}}
    metrics = {name: ev.task_metrics(df, task, classes) for name, df in predictions.items()}
    counts = {
        "ingest": {"in": reports["ingest"].get("rows_in"), "usable": reports["ingest"].get("rows_usable"),
                   "rejected": reports["ingest"].get("rows_rejected")},
        "prepare": {Tables.TRAIN: reports["prepare"].get("rows_train"),
                    Tables.TRAIN_PREPARED: reports["prepare"].get("rows_train_prepared"),
                    Tables.HOLDOUT: reports["prepare"].get("rows_holdout")},
        "train": {"in": reports["train"].get("rows_in")},
        "score": {"in": reports["score"].get("rows_in"), "out": reports["score"].get("rows_out_predictions")},
    }
    wall = {s: reports[s].get("wall_s") for s in STEPS}
    result = {"task": task, "classes": classes, "metrics": metrics, "row_counts": counts, "step_wall_s": wall,
              "fit_s": fit_times(reports["train"], names)}
    data = {name: rp.report_data(df, task) for name, df in predictions.items()}
    result["report_html"] = write_html(paths, run.run_id, rp.render_html(result, data, reports, run.run_id,
                                                                           ablation=ablation))
    print("[evaluate] rows per step: " + json.dumps(counts))
    print("[evaluate] wall time per step (s): " + ", ".join(f"{s}={v}" for s, v in wall.items()))
    print(f"[evaluate] report: {result['report_html']}", flush=True)
    result["tracking"] = tracking.log_evaluate(cfg, paths, run.run_id, result, [result["report_html"]])
    if result["tracking"]:
        print(f"[evaluate] MLflow run {result['tracking']['mlflow_run_id']} at {result['tracking']['uri']}", flush=True)
    print(f"[evaluate] held-out metrics ({task}; baselines on every feature of every training row):")
    print(metrics_table(metrics, result["fit_s"], task), flush=True)
    # Last, so that a model failing the gate still leaves its report and MLflow metrics.
    keras = metrics[KERAS]
    gate = result["gate"] = ev.check_gate(keras, cfg.gate, runs.read_latest(paths), task)
    # The task goes with the metrics into latest.json: the next gate compares like with like.
    pointer = run.promote({**keras, "task": task}, evaluated=Tables.PREDICTIONS)
    result["promoted"] = pointer is not None
    print(f"[evaluate] quality gate passed ({gate['metric']}={gate['value']:.4f}); " +
          (f"run {pointer['run_id']}'s models are now the latest: {paths.latest}" if pointer else
           "the models evaluated are not this run's own: nothing promoted"), flush=True)
    baseline_pred.unpersist()
    return result


def fit_times(train_report: dict, names: list[str]) -> dict[str, float | None]:
    """{model: fit seconds} from the train step's report (None where it recorded none)."""
    keras = (train_report.get("keras") or {}).get("timings_s") or {}
    fit = (train_report.get("baselines") or {}).get("fit_s") or {}
    return {KERAS: keras.get("fit_total"), **{n: fit.get(n) for n in names}}


def metrics_table(metrics: dict[str, dict], fit_s: dict, task: str) -> str:
    """The console's closing table: one row per model, the task's metrics and fit time,
    best first by the task's gate metric."""
    keys = tasks.holdout_metrics(task)
    head = tasks.DEFAULT_GATE_METRIC[task]
    higher = tasks.HOLDOUT_METRICS[head].higher_is_better
    order = sorted(metrics, key=lambda n: -metrics[n][head] if higher else metrics[n][head])
    lines = [f"  {'model':22s} " + " ".join(f"{k:>17s}" for k in keys) + f" {'fit s':>8s} {'rows':>9s}"]
    for name in order:
        m = metrics[name]
        fit = fit_s.get(name)
        lines.append(f"  {name:22s} " + " ".join(f"{m[k]:17.4f}" for k in keys) +
                     (f" {fit:8.1f}" if fit is not None else f" {'-':>8s}") + f" {m['rows']:9d}")
        if task == "multiclass":
            lines.append(f"  {'':22s} recall per class: " +
                         ", ".join(f"{c}={r:.3f}" for c, r in m["per_class_recall"].items()))
    return "\n".join(lines)


def write_html(paths, run_id: str | None, text: str) -> str:
    """``<output>/reports/evaluate.html`` (latest) and the run's own copy."""
    from sparkdeep.storage import Storage
    targets = [paths.report("evaluate", "html")] + ([paths.run_report(run_id, "evaluate", "html")] if run_id else [])
    for path in targets:
        Storage().write_bytes(path, text.encode("utf-8"))
    return targets[0]


main = main_for("evaluate", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
