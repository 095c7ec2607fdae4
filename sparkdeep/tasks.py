"""The three supervised tasks, and what each means for losses, outputs, labels and metrics.

One table, read by the driver (to check a fit before any rank starts) and by the ranks
(to build the metrics), so the two cannot disagree:

- ``binary``: one sigmoid unit giving P(label = 1); labels 0 or 1.
- ``multiclass``: k >= 2 softmax units; labels the class indices 0..k-1.
- ``regression``: one unbounded unit; labels any finite number.

A metric name resolves by task: ``accuracy`` is Keras' ``BinaryAccuracy`` for a binary
network and ``SparseCategoricalAccuracy`` for k classes; ``auc`` exists for binary only.
The held-out metrics the evaluate step computes (:data:`HOLDOUT_METRICS`) are a second
table: which tasks have each, and whether higher is better (the quality gate needs it).
"""
from __future__ import annotations

from typing import NamedTuple

TASKS = ("binary", "multiclass", "regression")

# Keras loss names (as ``keras.losses.get`` takes them) -> the task they train.
LOSS_TASK = {
    "binary_crossentropy": "binary",
    "binary_focal_crossentropy": "binary",
    "sparse_categorical_crossentropy": "multiclass",
    "mse": "regression", "mean_squared_error": "regression",
    "mae": "regression", "mean_absolute_error": "regression",
    "huber": "regression", "log_cosh": "regression",
}

# Metric name -> Keras metric class, per task.
METRICS = {
    "binary": {"accuracy": "BinaryAccuracy", "binary_accuracy": "BinaryAccuracy", "auc": "AUC",
               "precision": "Precision", "recall": "Recall", "binary_crossentropy": "BinaryCrossentropy"},
    "multiclass": {"accuracy": "SparseCategoricalAccuracy",
                   "sparse_categorical_accuracy": "SparseCategoricalAccuracy",
                   "sparse_top_k_categorical_accuracy": "SparseTopKCategoricalAccuracy",
                   "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy"},
    "regression": {"mse": "MeanSquaredError", "mae": "MeanAbsoluteError", "rmse": "RootMeanSquaredError",
                   "mean_squared_error": "MeanSquaredError", "mean_absolute_error": "MeanAbsoluteError",
                   "root_mean_squared_error": "RootMeanSquaredError"},
}

# Every metric name some task accepts (what config validation can check without a task).
METRIC_NAMES = frozenset(name for table in METRICS.values() for name in table)


def task_for_loss(loss: str) -> str:
    """The task a Keras loss name trains; a clear error for losses this project does not run."""
    task = LOSS_TASK.get(str(loss).lower())
    if task is None:
        raise ValueError(f"loss {loss!r} is not supported; use one of {sorted(LOSS_TASK)} "
                         "(binary: binary_crossentropy; k classes: sparse_categorical_crossentropy with labels "
                         "0..k-1; regression: mse, mae, huber, log_cosh)")
    return task


def metric_class(name: str, task: str) -> str:
    """The Keras metric class for ``name`` on a ``task`` network, or a clear error."""
    table = METRICS[task]
    cls = table.get(str(name).lower())
    if cls is None:
        fits = sorted(t for t, names in METRICS.items() if str(name).lower() in names)
        why = f"it is for {' and '.join(fits)} networks" if fits else "it is unknown"
        raise ValueError(f"metric {name!r} does not fit a {task} network ({why}); "
                         f"metrics for {task}: {sorted(table)}")
    return cls


def check_task(task: str) -> str:
    """``task`` itself if it is one of :data:`TASKS`, else a clear error."""
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {list(TASKS)}")
    return task


class HoldoutMetric(NamedTuple):
    """A held-out metric of the evaluate step: which way is better, and which tasks have it."""
    higher_is_better: bool
    tasks: tuple[str, ...]


# Held-out metric name -> HoldoutMetric, in report order. The evaluate step computes
# these per task (pipelines/evaluate.py); the quality gate flips its comparisons for the
# errors and losses, where lower is better.
HOLDOUT_METRICS = {
    "auc": HoldoutMetric(True, ("binary",)),
    "average_precision": HoldoutMetric(True, ("binary",)),
    "accuracy": HoldoutMetric(True, ("binary", "multiclass")),
    "macro_f1": HoldoutMetric(True, ("multiclass",)),
    "log_loss": HoldoutMetric(False, ("binary", "multiclass")),
    "rmse": HoldoutMetric(False, ("regression",)),
    "mae": HoldoutMetric(False, ("regression",)),
    "r2": HoldoutMetric(True, ("regression",)),
}

#: What a user would fit instead, per task (``pipelines/baselines.py``): MLlib's usual
#: strongest models and XGBoost (``xgboost.spark``, distributed on the same executors,
#: with the library's default settings) on every assembled feature. MLlib's GBT is binary
#: and regression only.
BASELINES = {
    "binary": ("logistic_regression", "gbt", "random_forest", "xgboost"),
    "multiclass": ("logistic_regression", "random_forest", "xgboost"),
    "regression": ("linear_regression", "gbt", "random_forest", "xgboost"),
}

#: The network's loss and training metrics per task (``train.loss``/``train.metrics`` override them).
DEFAULT_LOSS = {"binary": "binary_crossentropy", "multiclass": "sparse_categorical_crossentropy",
                "regression": "mse"}
DEFAULT_METRICS = {"binary": ("auc", "accuracy"), "multiclass": ("accuracy",), "regression": ("rmse", "mae")}
# The metric the quality gate checks when ``gate.metric`` is "".
DEFAULT_GATE_METRIC = {"binary": "auc", "multiclass": "accuracy", "regression": "r2"}


#: The network's per-epoch validation metric that stands for a held-out metric while tuning
#: (``pipelines/tune``): (task, held-out metric) -> (the Keras metric, reported per epoch as
#: ``val_<name>``; higher is better). r2 on fixed rows is 1 - MSE / their variance, so the
#: validation RMSE, minimised, orders trials exactly as r2 does. average_precision (binary)
#: and macro_f1 (multiclass) have no Keras metric here, so a search cannot aim at them.
VALIDATION_METRICS = {
    ("binary", "auc"): ("auc", True),
    ("binary", "accuracy"): ("accuracy", True),
    ("binary", "log_loss"): ("binary_crossentropy", False),
    ("multiclass", "accuracy"): ("accuracy", True),
    ("multiclass", "log_loss"): ("sparse_categorical_crossentropy", False),
    ("regression", "rmse"): ("rmse", False),
    ("regression", "mae"): ("mae", False),
    ("regression", "r2"): ("rmse", False),
}


def validation_metric(metric: str, task: str) -> tuple[str, bool]:
    """(Keras metric, higher_is_better) a search on a ``task`` network optimises for the
    held-out ``metric`` ("" = the task's gate default); a clear error where there is none."""
    resolved, _ = gate_metric(metric, task)
    found = VALIDATION_METRICS.get((task, resolved))
    if found is None:
        usable = [m for (t, m) in VALIDATION_METRICS if t == task]
        raise ValueError(f"gate.metric {resolved!r} has no per-epoch validation counterpart on a {task} network, so "
                         f"a search cannot aim at it; tune with gate.metric one of {usable}")
    return found


def holdout_metrics(task: str) -> tuple[str, ...]:
    """The scalar held-out metrics a ``task`` model is evaluated on, in report order."""
    check_task(task)
    return tuple(name for name, m in HOLDOUT_METRICS.items() if task in m.tasks)


def best_first(metrics: dict[str, dict], task: str, metric: str = "") -> list[str]:
    """The model names of ``metrics`` ({model: held-out metrics}) best first by ``metric``
    ("" = the task's gate default); a model without a finite value goes last. The console
    and the report list models in this one order."""
    name, higher = gate_metric(metric, task)

    def key(model):
        v = metrics[model].get(name)
        ok = isinstance(v, (int, float)) and v == v and abs(v) != float("inf")
        return (not ok, (-v if higher else v) if ok else 0.0)
    return sorted(metrics, key=key)


def gate_metric(name: str, task: str) -> tuple[str, bool]:
    """(metric, higher_is_better) the gate checks for ``gate.metric`` = ``name`` on a ``task`` model.

    "" means the task's default; a metric the task lacks is a clear error.
    """
    resolved = name or DEFAULT_GATE_METRIC[check_task(task)]
    metric = HOLDOUT_METRICS.get(resolved)
    if metric is None or task not in metric.tasks:
        raise ValueError(f"gate.metric {resolved!r} does not exist for a {task} model; use one of "
                         f"{list(holdout_metrics(task))}, or \"\" for its default "
                         f"({DEFAULT_GATE_METRIC[task]})")
    return resolved, metric.higher_is_better
