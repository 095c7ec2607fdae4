"""Held-out metrics from a predictions table (AUC and accuracy), and the quality gate.

The gate decides whether a trained model may become "latest" (``models/latest.json``,
what runs without their own model load). It has two halves: :func:`check_finite`
runs in the train step before anything is saved (finite weights and final metrics), and
:func:`check_gate` in the evaluate step on held-out metrics (finite, at least
``gate.min_value``, and optionally no worse than the latest promoted model by more than
``gate.max_regression``). A model that fails either is not promoted.
"""
from __future__ import annotations

import math

from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .flights import KEY, LABEL


def predictions_frame(scored: DataFrame, model_name: str) -> DataFrame:
    """The columns kept in a predictions table: key, label, P(delayed), prediction."""
    return scored.select(KEY, F.col(LABEL).cast("double").alias(LABEL),
                         vector_to_array("probability")[1].alias("p_delayed"),
                         F.col("prediction").cast("double").alias("prediction"),
                         F.lit(model_name).alias("model"))


def binary_metrics(predictions: DataFrame) -> dict:
    auc = BinaryClassificationEvaluator(rawPredictionCol="p_delayed", labelCol=LABEL,
                                        metricName="areaUnderROC").evaluate(predictions)
    row = predictions.agg(F.count("*").alias("n"),
                          F.avg((F.col("prediction") == F.col(LABEL)).cast("double")).alias("acc")).first()
    return {"rows": int(row["n"]), "auc": round(float(auc), 4), "accuracy": round(float(row["acc"]), 4)}


class QualityGateError(RuntimeError):
    """A trained model failed the quality gate, so it is not promoted to "latest"."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_finite(weights: dict, metrics: dict) -> None:
    """Refuse a network with a non-finite weight or final metric (NaN loss, inf learning rate).

    ``weights`` maps a variable's name to its numpy array; ``metrics`` is the last epoch's record.
    """
    import numpy as np
    bad = [f"{name} ({int(np.size(w) - np.isfinite(w).sum())} of {np.size(w)} values)"
           for name, w in weights.items() if not np.isfinite(w).all()]
    bad_metrics = sorted(k for k, v in metrics.items() if _number(v) and not math.isfinite(v))
    if bad or bad_metrics:
        what = [f"weights not finite: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}"] if bad else []
        what += [f"final {', '.join(bad_metrics)} not finite"] if bad_metrics else []
        raise QualityGateError(f"quality gate: {'; '.join(what)}; the model is not saved or promoted "
                               "(lower train.learning_rate, or check the training data)")


def check_gate(metrics: dict, gate, latest: dict | None) -> dict:
    """Check one model's held-out ``metrics`` against the ``gate`` config and the ``latest`` pointer.

    Returns what was checked; raises :class:`QualityGateError` naming the metric, the
    value and the config key it failed.
    """
    bad = sorted(k for k, v in metrics.items() if _number(v) and not math.isfinite(v))
    if bad:
        raise QualityGateError(f"quality gate: held-out {', '.join(bad)} not finite; not promoted")
    value = metrics[gate.metric]
    if value < gate.min_value:
        raise QualityGateError(f"quality gate: held-out {gate.metric} {value:.4f} is below gate.min_value "
                               f"{gate.min_value}; not promoted")
    previous = ((latest or {}).get("metrics") or {}).get(gate.metric) if gate.against_latest else None
    if previous is not None and value < previous - gate.max_regression:
        raise QualityGateError(
            f"quality gate: held-out {gate.metric} {value:.4f} is more than gate.max_regression "
            f"{gate.max_regression} below {previous:.4f}, the latest promoted model's (run "
            f"{latest['run_id']}); not promoted")
    return {"metric": gate.metric, "value": value, "min_value": gate.min_value, "latest_value": previous,
            "max_regression": gate.max_regression if gate.against_latest else None, "passed": True}
