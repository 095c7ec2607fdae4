"""Held-out metrics of a predictions table for each task, and the quality gate.

The score step writes one predictions table per model with :func:`predictions_frame`.
The table tells its own task (:func:`task_of`: a ``probability`` double is binary, an
array multiclass, none regression) and its class names (:func:`classes_of`, from the
``label`` column's metadata), so nothing else is needed to evaluate it.

:func:`task_metrics` uses Spark aggregations whose results are small (one row, k x k
counts, one row per score bucket). No row reaches the driver. Binary AUC and average
precision are exact and count ties as scikit-learn does: the rows are grouped by
distinct score, and the counts above each score come from per-bucket totals plus a
running sum within the bucket. A metric that is undefined on the data is NaN, not a
guess: AUC when the labels have one class, average precision when none is positive, r2
when the label is constant. The quality gate refuses any non-finite metric.

The gate decides whether a trained model may become "latest" (``models/latest.json``,
what runs without their own model load). It has two halves: :func:`check_finite`
runs in the train step before anything is saved (finite weights and final metrics), and
:func:`check_gate` in the evaluate step on held-out metrics (finite, no worse than
``gate.min_value``, and optionally no worse than the latest promoted model by more than
``gate.max_regression``). A model that fails either is not promoted.
"""
from __future__ import annotations

import json
import logging
import math

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, NumericType

from sparkdeep import runs, tasks, tracking
from sparkdeep.pipelines import report as rp
from sparkdeep.registry import Columns, Tables

log = logging.getLogger(__name__)

LABEL, PREDICTION, PROBABILITY, MODEL = Columns.LABEL, Columns.PREDICTION, Columns.PROBABILITY, Columns.MODEL
LABEL_CLASS, PREDICTED_CLASS = Columns.LABEL_CLASS, Columns.PREDICTED_CLASS
# Log loss clips probabilities to [EPS, 1 - EPS], as scikit-learn's log_loss did by default.
EPS = 1e-15
# Score buckets of the exact AUC: only their totals reach the driver.
SCORE_BUCKETS = 1000


# -- the predictions table ----------------------------------------------------------------
def classes_of(df: DataFrame, col: str = LABEL) -> list[str] | None:
    """The class names in ``col``'s nominal ML attribute metadata (as StringIndexer writes it), or None."""
    if col not in df.columns:
        return None
    attr = df.schema[col].metadata.get("ml_attr") or {}
    vals = attr.get("vals") if attr.get("type") == "nominal" else None
    return [str(v) for v in vals] if vals else None


def task_of(predictions: DataFrame) -> str:
    """The task of a predictions table, from its ``probability`` column's type."""
    if PROBABILITY not in predictions.columns:
        return "regression"
    kind = predictions.schema[PROBABILITY].dataType
    if isinstance(kind, DoubleType):
        return "binary"
    if isinstance(kind, ArrayType):
        return "multiclass"
    raise ValueError(f"column {PROBABILITY!r} has type {kind.simpleString()}; a predictions table has a "
                     "double (binary), an array<double> (multiclass) or none (regression): write it with "
                     "predictions_frame")


def _nominal(classes: list[str]) -> dict:
    return {"ml_attr": {"type": "nominal", "name": LABEL, "vals": list(classes)}}


def _class_name(index: Column, classes: list[str]) -> Column:
    # Guarded: an index out of range is null here (task_metrics names it), not an ANSI error.
    valid = (index >= 0) & (index < len(classes)) & (index == F.floor(index))
    return F.when(valid, F.array(*[F.lit(c) for c in classes])[index.cast("int")])


def _probabilities(scored: DataFrame, size: int, model_name: str) -> Column:
    kind = scored.schema[PROBABILITY].dataType
    if isinstance(kind, VectorUDT):
        arr = vector_to_array(PROBABILITY)
    elif isinstance(kind, ArrayType) and isinstance(kind.elementType, NumericType):
        arr = F.col(PROBABILITY).cast("array<double>")
    else:
        raise ValueError(f"column {PROBABILITY!r} has type {kind.simpleString()}; expected an ML Vector "
                         "(as MLlib classifiers and DistributedKerasModel write it) or an array of numbers")
    message = F.concat(F.lit(f"model {model_name!r}: a {PROBABILITY} vector has length "),
                       F.size(arr).cast("string"), F.lit(f", expected {size} (one per class)"))
    return F.when(arr.isNull() | (F.size(arr) == size), arr).otherwise(F.raise_error(message))


def predictions_frame(scored: DataFrame, model_name: str, *, key: str, task: str,
                      classes: list[str] | None = None) -> DataFrame:
    """The predictions table of one model, from a fitted pipeline's ``transform`` output.

    Columns: ``key``, ``label`` and ``prediction`` (doubles), ``model`` (``model_name``);
    binary adds ``probability`` = P(label = 1); multiclass adds ``probability`` (an array,
    one per class), ``label_class`` and ``predicted_class`` (the class names). The class
    names (``classes``, else the ``label`` metadata of ``scored``) go into the ``label``
    column's nominal metadata, where :func:`classes_of` finds them again.
    """
    tasks.check_task(task)
    needed = [key, LABEL, PREDICTION] + ([PROBABILITY] if task != "regression" else [])
    missing = [c for c in needed if c not in scored.columns]
    if missing:
        raise ValueError(f"predictions_frame: the scored frame has no column {', '.join(map(repr, missing))}, "
                         f"needed for a {task} predictions table (it has {scored.columns})")
    if task == "regression" and classes:
        raise ValueError(f"predictions_frame: classes={classes!r} given for a regression model, which has none")
    classes = list(classes) if classes else classes_of(scored)
    if task == "multiclass" and not classes:
        raise ValueError("predictions_frame: a multiclass table needs the class names: pass classes=[...] "
                         "(index order) or give the label column nominal ML metadata (StringIndexer does)")
    if task == "binary" and classes and len(classes) != 2:
        raise ValueError(f"predictions_frame: a binary model has 2 classes, got classes={classes!r}")
    label = F.col(LABEL).cast("double")
    cols = [F.col(key), label.alias(LABEL, metadata=_nominal(classes)) if classes else label.alias(LABEL),
            F.col(PREDICTION).cast("double").alias(PREDICTION), F.lit(model_name).alias(MODEL)]
    if task == "binary":
        cols.append(_probabilities(scored, 2, model_name)[1].alias(PROBABILITY))
    elif task == "multiclass":
        cols += [_probabilities(scored, len(classes), model_name).alias(PROBABILITY),
                 _class_name(F.col(LABEL), classes).alias(LABEL_CLASS),
                 _class_name(F.col(PREDICTION), classes).alias(PREDICTED_CLASS)]
    return scored.select(*cols)


# -- metrics ------------------------------------------------------------------------------
def task_metrics(predictions: DataFrame, task: str, classes: list[str] | None = None) -> dict:
    """Held-out metrics of a predictions table (unrounded floats).

    - binary: rows, auc, average_precision, accuracy, log_loss
    - multiclass: rows, accuracy, macro_f1, log_loss, confusion_matrix (rows: true class,
      in class order), per_class_recall ({class name: recall})
    - regression: rows, rmse, mae, r2

    Raises ValueError for an empty table, a missing column, or null/NaN/out-of-range values
    (naming the column and the count). ``classes`` defaults to :func:`classes_of`, then to
    "0".."k-1". Macro F1 averages over the classes that occur as label or prediction, with
    0 for a class never predicted (scikit-learn's default labels and zero_division=0);
    recall of a class absent from the labels is 0 too.
    """
    tasks.check_task(task)
    if PROBABILITY in predictions.columns and task_of(predictions) != task:
        raise ValueError(f"a {task_of(predictions)} predictions table ({PROBABILITY} is "
                         f"{predictions.schema[PROBABILITY].dataType.simpleString()}) cannot be evaluated as {task}")
    if task == "binary":
        return _binary(predictions)
    if task == "multiclass":
        return _multiclass(predictions, classes)
    return _regression(predictions)


def _not_finite(c: Column) -> Column:
    return c.isNull() | F.isnan(c) | (F.abs(c) == float("inf"))


def _checked(predictions: DataFrame, task: str, checks: list[tuple[str, Column, str]],
             values: dict[str, Column]):
    """One aggregation: the row count, ``values``, and the rows failing each check (an error if any)."""
    needed = sorted({col for col, _, _ in checks})
    missing = [c for c in needed if c not in predictions.columns]
    if missing:
        raise ValueError(f"{task} predictions: no column {', '.join(map(repr, missing))} "
                         f"(the table has {predictions.columns})")
    row = predictions.agg(F.count(F.lit(1)).alias("_rows"),
                          *[F.count_if(bad).alias(f"_bad{i}") for i, (_, bad, _) in enumerate(checks)],
                          *[value.alias(name) for name, value in values.items()]).first()
    rows = int(row["_rows"])
    if rows == 0:
        raise ValueError(f"{task} predictions: the table has no rows; nothing to evaluate "
                         "(is the holdout empty, or did scoring drop every row?)")
    problems = [f"column {col!r} has {row[f'_bad{i}']} {what} in {rows} rows"
                for i, (col, _, what) in enumerate(checks) if row[f"_bad{i}"]]
    if problems:
        raise ValueError(f"{task} predictions: {'; '.join(problems)}; fix the scoring step (or drop those "
                         "rows) before evaluating")
    return row


def _clipped(p: Column) -> Column:
    return F.least(F.greatest(p, F.lit(EPS)), F.lit(1 - EPS))


def _binary(predictions: DataFrame) -> dict:
    y, p, yhat = F.col(LABEL), F.col(PROBABILITY), F.col(PREDICTION)
    q = _clipped(p)
    row = _checked(predictions, "binary", [
        (LABEL, _not_finite(y), "null, NaN or infinite values"),
        (LABEL, ~_not_finite(y) & ~y.isin(0.0, 1.0), "values other than 0 and 1"),
        (PREDICTION, _not_finite(yhat), "null, NaN or infinite values"),
        (PROBABILITY, _not_finite(p), "null, NaN or infinite values"),
        (PROBABILITY, ~_not_finite(p) & ((p < 0) | (p > 1)), "values outside [0, 1]"),
    ], {"accuracy": F.avg((yhat == y).cast("double")),
        "log_loss": F.avg(-(y * F.log(q) + (1 - y) * F.log(1 - q))),
        "positives": F.sum(y)})
    rows, positives = int(row["_rows"]), float(row["positives"])
    auc, ap = _ranking(predictions, positives, rows - positives)
    return {"rows": rows, "auc": auc, "average_precision": ap, "accuracy": float(row["accuracy"]),
            "log_loss": float(row["log_loss"])}


def _ranking(predictions: DataFrame, positives: float, negatives: float) -> tuple[float, float]:
    """Exact (AUC, average precision) from the counts at and above each distinct score."""
    if positives == 0:
        return math.nan, math.nan
    s = F.col("s")
    by_score = (predictions.groupBy(F.col(PROBABILITY).alias("s"))
                .agg(F.sum(LABEL).alias("pos"), F.sum(1 - F.col(LABEL)).alias("neg"))
                .withColumn("b", F.least(F.greatest(F.floor(s * SCORE_BUCKETS), F.lit(0)),
                                         F.lit(SCORE_BUCKETS - 1)).cast("int")))
    totals = by_score.groupBy("b").agg(F.sum("pos").alias("pos"), F.sum("neg").alias("neg")).collect()
    pos_above, neg_above = [0.0] * SCORE_BUCKETS, [0.0] * SCORE_BUCKETS
    pos_sum = neg_sum = 0.0
    for r in sorted(totals, key=lambda r: -r["b"]):
        pos_above[r["b"]], neg_above[r["b"]] = pos_sum, neg_sum
        pos_sum, neg_sum = pos_sum + r["pos"], neg_sum + r["neg"]
    # Scores fall in a bucket in order, so "above a score" is the buckets above plus a
    # running sum within its bucket: a window per bucket, never one over all the rows.
    # The buckets' offsets are literal arrays, not a join: a join makes the optimizer walk
    # the whole lineage of the scores (dynamic partition pruning), which exhausted a 6g
    # driver on a live pipeline-transform frame. Each array is one JSON literal that the
    # optimizer folds into an array constant: ``F.array`` of 1,000 ``F.lit`` is 1,000 calls
    # into the JVM (2,000 per model, 0.7 s of each model's metrics on a warm session).
    offset = {name: F.from_json(F.lit(json.dumps(values)), "array<double>")[F.col("b")]
              for name, values in (("pos_above", pos_above), ("neg_above", neg_above))}
    upto = Window.partitionBy("b").orderBy(s.desc()).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    ranked = (by_score
              .withColumn("tp", offset["pos_above"] + F.sum("pos").over(upto))
              .withColumn("fp", offset["neg_above"] + F.sum("neg").over(upto)))
    # AUC: P(score of a positive > score of a negative), ties counting half.
    # AP: sum over thresholds of (recall step) x precision, as scikit-learn's average_precision_score.
    row = ranked.agg(F.sum(F.col("neg") * (F.col("tp") - F.col("pos") / 2)).alias("auc"),
                     F.sum(F.col("pos") * F.col("tp") / (F.col("tp") + F.col("fp"))).alias("ap")).first()
    auc = float(row["auc"]) / (positives * negatives) if negatives else math.nan
    return auc, float(row["ap"]) / positives


def _index_valid(c: Column, k: int) -> Column:
    return (c >= 0) & (c < k) & (c == F.floor(c))


def _multiclass(predictions: DataFrame, classes: list[str] | None) -> dict:
    y, yhat, p = F.col(LABEL), F.col(PREDICTION), F.col(PROBABILITY)
    classes = list(classes) if classes else classes_of(predictions)
    if not classes and PROBABILITY in predictions.columns:
        k = predictions.agg(F.max(F.size(p))).first()[0] or 0
        classes = [str(i) for i in range(k)]
    k = len(classes or [])
    p_true = F.when(_index_valid(y, k), p[y.cast("int")])
    row = _checked(predictions, "multiclass", [
        (LABEL, _not_finite(y), "null, NaN or infinite values"),
        (LABEL, ~_not_finite(y) & ~_index_valid(y, k), f"values that are not a class index 0..{k - 1}"),
        (PREDICTION, _not_finite(yhat), "null, NaN or infinite values"),
        (PREDICTION, ~_not_finite(yhat) & ~_index_valid(yhat, k), f"values that are not a class index 0..{k - 1}"),
        (PROBABILITY, p.isNull() | F.exists(p, _not_finite), "null arrays or arrays with a null, NaN or "
                                                             "infinite value"),
        (PROBABILITY, p.isNotNull() & (F.size(p) != k), f"arrays whose length is not {k} (the classes)"),
    ], {"accuracy": F.avg((yhat == y).cast("double")), "log_loss": F.avg(-F.log(_clipped(p_true)))})
    counts = np.zeros((k, k), dtype=np.int64)
    for r in predictions.groupBy(y.cast("int").alias("t"), yhat.cast("int").alias("p")).count().collect():
        counts[r["t"], r["p"]] = r["count"]
    true, predicted, hits = counts.sum(axis=1), counts.sum(axis=0), np.diag(counts)
    # F1 = 2 tp / (true + predicted): 0 for a class with neither hits nor predictions.
    f1 = np.divide(2 * hits, true + predicted, out=np.zeros(k), where=(true + predicted) > 0)
    recall = np.divide(hits, true, out=np.zeros(k), where=true > 0)
    # A class with no held-out rows has no recall (not 0.000): None, and its row count says why.
    return {"rows": int(row["_rows"]), "accuracy": float(row["accuracy"]),
            "macro_f1": float(f1[(true + predicted) > 0].mean()), "log_loss": float(row["log_loss"]),
            "confusion_matrix": counts.tolist(),
            "per_class_recall": {name: (float(r) if n else None) for name, r, n in zip(classes, recall, true)},
            "per_class_rows": {name: int(n) for name, n in zip(classes, true)}}


def _regression(predictions: DataFrame) -> dict:
    y, yhat = F.col(LABEL), F.col(PREDICTION)
    err = yhat - y
    row = _checked(predictions, "regression", [
        (LABEL, _not_finite(y), "null, NaN or infinite values"),
        (PREDICTION, _not_finite(yhat), "null, NaN or infinite values"),
    ], {"mse": F.avg(err * err), "mae": F.avg(F.abs(err)), "variance": F.var_pop(y)})
    mse, variance = float(row["mse"]), float(row["variance"])
    # r2 of a constant label is 0/0 or x/0: NaN, which the quality gate refuses.
    return {"rows": int(row["_rows"]), "rmse": math.sqrt(mse), "mae": float(row["mae"]),
            "r2": 1 - mse / variance if variance > 0 else math.nan}


# -- the quality gate ---------------------------------------------------------------------
class QualityGateError(RuntimeError):
    """A trained model failed the quality gate, so it is not promoted to "latest"."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_finite(weights: dict, metrics: dict) -> None:
    """Refuse a network with a non-finite weight or final metric (NaN loss, inf learning rate).

    ``weights`` maps a variable's name to its numpy array; ``metrics`` is the last epoch's record.
    """
    bad = [f"{name} ({int(np.size(w) - np.isfinite(w).sum())} of {np.size(w)} values)"
           for name, w in weights.items() if not np.isfinite(w).all()]
    bad_metrics = sorted(k for k, v in metrics.items() if _number(v) and not math.isfinite(v))
    if bad or bad_metrics:
        what = [f"weights not finite: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}"] if bad else []
        what += [f"final {', '.join(bad_metrics)} not finite"] if bad_metrics else []
        raise QualityGateError(f"quality gate: {'; '.join(what)}; the model is not saved or promoted "
                               "(lower train.learning_rate, or check the training data)")


def check_gate(metrics: dict, gate, latest: dict | None, task: str) -> dict:
    """Check one ``task`` model's held-out ``metrics`` against the ``gate`` config and the ``latest`` pointer.

    ``gate.metric`` "" is the task's default (:data:`sparkdeep.tasks.DEFAULT_GATE_METRIC`).
    For a metric where lower is better (rmse, mae, log_loss) ``gate.min_value`` is a
    maximum and ``gate.max_regression`` a margin above the latest's value.
    ``gate.min_value`` 0 is off for every metric. The latest model is compared only if its
    metrics have the same task (pointers without a task are taken as the same).
    Returns what was checked; raises :class:`QualityGateError` naming the metric, the
    value and the config key it failed, or ValueError for a metric the task lacks.
    """
    name, higher = tasks.gate_metric(gate.metric, task)
    bad = sorted(k for k, v in metrics.items() if _number(v) and not math.isfinite(v))
    if bad:
        raise QualityGateError(f"quality gate: held-out {', '.join(bad)} not finite; not promoted (AUC is "
                               "undefined when the labels have one class, r2 when the label is constant)")
    if name not in metrics:
        raise ValueError(f"quality gate: no held-out {name!r} among the metrics {sorted(metrics)}")
    value = metrics[name]
    worse = "below" if higher else "above"
    if gate.min_value and (value < gate.min_value if higher else value > gate.min_value):
        bound = "" if higher else f" (a maximum: lower {name} is better)"
        raise QualityGateError(f"quality gate: held-out {name} {value:.4f} is {worse} gate.min_value "
                               f"{gate.min_value}{bound}; not promoted")
    last = (latest or {}).get("metrics") or {}
    same_task = last.get("task", task) == task
    previous = last.get(name) if gate.against_latest and same_task else None
    if previous is not None and (value < previous - gate.max_regression if higher
                                 else value > previous + gate.max_regression):
        raise QualityGateError(
            f"quality gate: held-out {name} {value:.4f} is more than gate.max_regression "
            f"{gate.max_regression} {worse} {previous:.4f}, the latest promoted model's (run "
            f"{latest['run_id']}); not promoted")
    return {"metric": name, "higher_is_better": higher, "value": value, "min_value": gate.min_value,
            "latest_value": previous, "max_regression": gate.max_regression if gate.against_latest else None,
            "passed": True}


# -- the step (jobs/evaluate.py runs it) ----------------------------------------

# The steps before this one, whose reports it summarises.
STEPS = runs.STEPS[:runs.STEPS.index("evaluate")]

# Report name of our model; the baselines go by their names in pipelines/baselines.
KERAS = "keras_horovod"


def evaluate_step(spark, cfg, paths, run) -> dict:
    keras_pred = run.read(spark, Tables.PREDICTIONS)
    baseline_pred = run.read(spark, Tables.BASELINE_PREDICTIONS)
    task = task_of(keras_pred)
    if task_of(baseline_pred) != task:
        raise ValueError(f"predictions is a {task} table but baseline_predictions a "
                         f"{task_of(baseline_pred)} one: rerun the score step")
    tasks.gate_metric(cfg.gate.metric, task)  # a gate metric the task lacks fails now, not after the report
    ablation = rp.load_ablation(cfg.baselines.ablation) if cfg.baselines.ablation else None
    spec = cfg.dataset
    if ablation and ablation.get("dataset") not in (spec.name, spec.table):
        log.info("[evaluate] note: the ablation in %s was measured on data set %r, not this run's %r; the report "
                 "says so", cfg.baselines.ablation, ablation.get('dataset'), spec.name)
    classes = classes_of(keras_pred)
    reports = {s: run.report_of(s) or {} for s in STEPS}
    baseline_pred = baseline_pred.cache()  # read once for every baseline's metrics and plots
    names = reports["score"].get("baselines") or sorted(
        r[0] for r in baseline_pred.select(MODEL).distinct().collect())
    predictions = {KERAS: keras_pred, **{n: baseline_pred.where(F.col(MODEL) == n) for n in names}}
    metrics = {name: task_metrics(df, task, classes) for name, df in predictions.items()}
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
    gate_name, _ = tasks.gate_metric(cfg.gate.metric, task)
    result["beaten_by"] = beaten_by(metrics, task, gate_name)
    result["warnings"] = comparison_warnings(metrics, task, gate_name, result["beaten_by"])
    data = {name: rp.report_data(df, task) for name, df in predictions.items()}
    result["report_html"] = write_html(paths, run.run_id, rp.render_html(result, data, reports, run.run_id,
                                                                           ablation=ablation))
    log.info("[evaluate] rows per step: %s", json.dumps(counts))
    log.info("[evaluate] wall time per step (s): %s", ", ".join(f"{s}={v}" for s, v in wall.items()))
    log.info("[evaluate] report: %s", result['report_html'])
    result["tracking"] = tracking.log_evaluate(cfg, paths, run.run_id, result, [result["report_html"]])
    if result["tracking"]:
        log.info("[evaluate] MLflow run %s at %s", result['tracking']['mlflow_run_id'], result['tracking']['uri'])
    log.info("[evaluate] held-out metrics (%s; baselines on every feature of every training row):", task)
    log.info(metrics_table(metrics, result["fit_s"], task))
    # Last, so that a model failing the gate still leaves its report and MLflow metrics.
    keras = metrics[KERAS]
    for line in result["warnings"]:
        log.warning("[evaluate] %s", line)
    gate = result["gate"] = check_gate(keras, cfg.gate, runs.read_latest(paths), task)
    if cfg.gate.beat_baselines and result["beaten_by"]:
        raise QualityGateError(f"quality gate: {beaten_line(result['beaten_by'], gate['metric'])} "
                               "(gate.beat_baselines is on); not promoted")
    # The task goes with the metrics into latest.json: the next gate compares like with like.
    pointer = run.promote({**keras, "task": task}, evaluated=Tables.PREDICTIONS)
    result["promoted"] = pointer is not None
    log.info("[evaluate] %s; %s", gate_line(gate),
             f"run {pointer['run_id']}'s models are now the latest: {paths.latest}" if pointer else
             "the models evaluated are not this run's own: nothing promoted")
    baseline_pred.unpersist()
    return result


#: Below this many held-out rows, a metric's difference between models is mostly noise.
SMALL_HOLDOUT = 200


def beaten_by(metrics: dict[str, dict], task: str, metric: str) -> dict[str, float]:
    """{baseline: by how much it beats the network on ``metric``} (positive: better), for
    every baseline better than the network."""
    _, higher = tasks.gate_metric(metric, task)
    mine = metrics[KERAS].get(metric)
    out = {}
    for name, m in metrics.items():
        v = m.get(metric)
        if name == KERAS or not _number(v) or not _number(mine) or not (math.isfinite(v) and math.isfinite(mine)):
            continue
        gain = (v - mine) if higher else (mine - v)
        if gain > 0:
            out[name] = float(gain)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def beaten_line(beaten: dict[str, float], metric: str) -> str:
    return "the network is beaten on held-out " + metric + " by " + ", ".join(
        f"{name} (by {gain:.4f})" for name, gain in beaten.items())


def comparison_warnings(metrics: dict[str, dict], task: str, metric: str, beaten: dict[str, float]) -> list[str]:
    """What a reader of the metrics must know: baselines that beat the network, and a
    holdout too small for its differences to mean much."""
    out = []
    if beaten:
        out.append(beaten_line(beaten, metric) + ": what a user would fit instead does better here")
    rows = metrics[KERAS].get("rows")
    if isinstance(rows, int) and rows < SMALL_HOLDOUT:
        spread = 1.96 * math.sqrt(0.25 / max(rows, 1))
        out.append(f"the holdout has only {rows} rows: a share such as accuracy moves by up to about "
                   f"\u00b1{spread:.2f} by chance alone, so differences between models here are mostly noise")
    return out


def gate_line(gate: dict) -> str:
    """What the gate checked, in words: "off" when it checked nothing."""
    checks = []
    if gate.get("min_value"):
        checks.append(f"gate.min_value {gate['min_value']}")
    if gate.get("latest_value") is not None:
        checks.append(f"within gate.max_regression {gate['max_regression']} of the latest model's "
                      f"{gate['latest_value']:.4f}")
    if not checks:
        return (f"quality gate off (gate.min_value 0.0, no latest model compared; held-out "
                f"{gate['metric']}={gate['value']:.4f})")
    return f"quality gate passed ({gate['metric']}={gate['value']:.4f}: {'; '.join(checks)})"


def fit_times(train_report: dict, names: list[str]) -> dict[str, float | None]:
    """{model: fit seconds} from the train step's report (None where it recorded none)."""
    keras = (train_report.get("keras") or {}).get("timings_s") or {}
    fit = (train_report.get("baselines") or {}).get("fit_s") or {}
    return {KERAS: keras.get("fit_total"), **{n: fit.get(n) for n in names}}


def metrics_table(metrics: dict[str, dict], fit_s: dict, task: str) -> str:
    """The console's closing table: one row per model, the task's metrics and fit time,
    best first by the task's gate metric."""
    keys = tasks.holdout_metrics(task)
    order = tasks.best_first(metrics, task)
    lines = [f"  {'model':22s} " + " ".join(f"{k:>17s}" for k in keys) + f" {'fit s':>8s} {'rows':>9s}"]
    for name in order:
        m = metrics[name]
        fit = fit_s.get(name)
        lines.append(f"  {name:22s} " + " ".join(f"{m[k]:17.4f}" for k in keys) +
                     (f" {fit:8.1f}" if fit is not None else f" {'-':>8s}") + f" {m['rows']:9d}")
        if task == "multiclass":
            lines.append(f"  {'':22s} recall per class: " +
                         ", ".join(f"{c}={r:.3f}" if r is not None else f"{c}=n/a (0 held-out rows)"
                                   for c, r in m["per_class_recall"].items()))
    return "\n".join(lines)


def write_html(paths, run_id: str | None, text: str) -> str:
    """``<output>/reports/evaluate.html`` (latest) and the run's own copy."""
    from sparkdeep.storage import Storage
    targets = [paths.report("evaluate", "html")] + ([paths.run_report(run_id, "evaluate", "html")] if run_id else [])
    for path in targets:
        Storage().write_bytes(path, text.encode("utf-8"))
    return targets[0]
