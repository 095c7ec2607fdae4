"""Held-out metrics from a predictions table: AUC and accuracy."""
from __future__ import annotations

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
