"""The predictions table per task, and the quality gate: finite weights and metrics, a bound
on the held-out metric (flipped where lower is better), no regression against the latest."""
import dataclasses

import numpy as np
import pytest
from pyspark.ml.linalg import Vectors

from sparkdeep import delta_io, tasks
from sparkdeep.pipelines.evaluate import (QualityGateError, check_finite, check_gate, classes_of,
                                          predictions_frame, task_of)


@dataclasses.dataclass
class Gate:
    metric: str = "auc"
    min_value: float = 0.0
    against_latest: bool = False
    max_regression: float = 0.01
    beat_baselines: bool = False


LATEST = {"run_id": "good", "metrics": {"auc": 0.70, "accuracy": 0.77}}


# -- the predictions table ----------------------------------------------------------------
def _scored(spark, probabilities, labels, predictions, metadata=None):
    rows = [(10 + i, float(y), Vectors.dense(p), float(q), "x")
            for i, (p, y, q) in enumerate(zip(probabilities, labels, predictions))]
    df = spark.createDataFrame(rows, ["row_id", "label", "probability", "prediction", "features"])
    if metadata:
        from pyspark.sql import functions as F
        df = df.withColumn("label", F.col("label").alias("label", metadata=metadata))
    return df


def test_a_binary_table_keeps_p_of_class_1_and_names_no_data_set(spark):
    scored = _scored(spark, [[0.8, 0.2], [0.3, 0.7]], [0, 1], [0, 1])
    table = predictions_frame(scored, "logreg", key="row_id", task="binary")
    assert table.columns == ["row_id", "label", "prediction", "model", "probability"]
    assert dict(table.dtypes)["probability"] == "double" and task_of(table) == "binary"
    assert [tuple(r) for r in table.collect()] == [(10, 0.0, 0.0, "logreg", 0.2), (11, 1.0, 1.0, "logreg", 0.7)]
    assert classes_of(table) is None
    named = predictions_frame(scored, "logreg", key="row_id", task="binary", classes=["no", "yes"])
    assert classes_of(named) == ["no", "yes"] and named.columns == table.columns


def test_a_multiclass_table_carries_class_names_through_delta(spark, tmp_path):
    meta = {"ml_attr": {"type": "nominal", "name": "label", "vals": ["setosa", "versicolor", "virginica"]}}
    scored = _scored(spark, [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]], [0, 2, 2], [0, 2, 1], meta)
    table = predictions_frame(scored, "keras", key="row_id", task="multiclass")
    assert table.columns == ["row_id", "label", "prediction", "model", "probability", "label_class",
                             "predicted_class"]
    ref = delta_io.write(table, str(tmp_path / "predictions"))
    back = delta_io.read(spark, ref.path)
    assert task_of(back) == "multiclass" and classes_of(back) == ["setosa", "versicolor", "virginica"]
    rows = sorted(back.collect())
    assert [(r.label_class, r.predicted_class) for r in rows] == [
        ("setosa", "setosa"), ("virginica", "virginica"), ("virginica", "versicolor")]
    assert rows[1].probability == [0.1, 0.3, 0.6]
    # Names passed in win over the metadata.
    other = predictions_frame(scored, "keras", key="row_id", task="multiclass", classes=["a", "b", "c"])
    assert classes_of(other) == ["a", "b", "c"]


def test_a_regression_table_has_no_probability(spark):
    scored = spark.createDataFrame([(1, 2.5, 2.0), (2, -1.0, 0.5)], "id long, label double, prediction double")
    table = predictions_frame(scored, "linreg", key="id", task="regression")
    assert table.columns == ["id", "label", "prediction", "model"] and task_of(table) == "regression"
    with pytest.raises(ValueError, match="classes=.* given for a regression model"):
        predictions_frame(scored, "linreg", key="id", task="regression", classes=["a"])


def test_bad_scored_frames_fail_with_the_column_and_the_fix(spark):
    scored = _scored(spark, [[0.2, 0.3, 0.5]], [1], [2])
    with pytest.raises(ValueError, match=r"no column 'order_id', needed for a binary predictions table"):
        predictions_frame(scored, "m", key="order_id", task="binary")
    with pytest.raises(ValueError, match="a multiclass table needs the class names"):
        predictions_frame(scored, "m", key="row_id", task="multiclass")
    with pytest.raises(ValueError, match="task 'ordinal' is not one of"):
        predictions_frame(scored, "m", key="row_id", task="ordinal")
    # A 3-class model scored as binary would silently give P(class 1): it fails when read.
    with pytest.raises(Exception, match=r"model 'm': a probability vector has length 3, expected 2"):
        predictions_frame(scored, "m", key="row_id", task="binary").collect()
    with pytest.raises(Exception, match=r"has length 3, expected 4"):
        predictions_frame(scored, "m", key="row_id", task="multiclass", classes=list("abcd")).collect()


# -- the quality gate ---------------------------------------------------------------------
def test_the_default_gate_passes_any_finite_model():
    checked = check_gate({"auc": 0.51, "accuracy": 0.5, "rows": 10}, Gate(), LATEST, "binary")
    assert checked["passed"] and checked["value"] == 0.51 and checked["latest_value"] is None


@pytest.mark.parametrize("metrics", [{"auc": float("nan"), "rows": 10}, {"auc": 0.7, "accuracy": float("inf")}])
def test_non_finite_held_out_metrics_fail(metrics):
    with pytest.raises(QualityGateError, match="not finite; not promoted"):
        check_gate(metrics, Gate(), None, "binary")


def test_a_minimum_held_out_metric_names_the_key():
    with pytest.raises(QualityGateError, match=r"held-out accuracy 0.6000 is below gate.min_value 0.65"):
        check_gate({"auc": 0.9, "accuracy": 0.6}, Gate(metric="accuracy", min_value=0.65), None, "binary")
    assert check_gate({"auc": 0.9, "accuracy": 0.66}, Gate(metric="accuracy", min_value=0.65), None, "binary")["passed"]


def test_no_regression_beyond_the_margin_against_the_latest_model():
    gate = Gate(against_latest=True, max_regression=0.02)
    assert check_gate({"auc": 0.685}, gate, LATEST, "binary")["latest_value"] == 0.70  # within the margin
    with pytest.raises(QualityGateError, match=r"auc 0.6700 is more than gate.max_regression 0.02 below "
                                               r"0.7000, the latest promoted model's \(run good\)"):
        check_gate({"auc": 0.67}, gate, LATEST, "binary")
    assert check_gate({"auc": 0.5}, gate, None, "binary")["passed"]  # nothing promoted yet: nothing to regress from
    assert check_gate({"auc": 0.5}, Gate(), LATEST, "binary")["passed"]  # off by default


@pytest.mark.parametrize("task, metrics, expected", [
    ("binary", {"auc": 0.8, "accuracy": 0.7}, "auc"),
    ("multiclass", {"accuracy": 0.6, "macro_f1": 0.5, "confusion_matrix": [[1, 0], [0, 1]],
                    "per_class_recall": {"a": 1.0}}, "accuracy"),
    ("regression", {"rmse": 3.0, "mae": 2.0, "r2": 0.4}, "r2"),
])
def test_an_empty_gate_metric_is_the_task_default(task, metrics, expected):
    checked = check_gate(metrics, Gate(metric=""), None, task)
    assert checked["metric"] == expected == tasks.DEFAULT_GATE_METRIC[task]
    assert checked["value"] == metrics[expected] and checked["higher_is_better"]


def test_lower_is_better_metrics_flip_the_bound_and_the_regression():
    m = {"rmse": 3.0, "mae": 2.0, "r2": 0.4}
    with pytest.raises(QualityGateError, match=r"held-out rmse 3.0000 is above gate.min_value 2.5 "
                                               r"\(a maximum: lower rmse is better\)"):
        check_gate(m, Gate(metric="rmse", min_value=2.5), None, "regression")
    assert check_gate(m, Gate(metric="rmse", min_value=3.5), None, "regression")["higher_is_better"] is False
    assert check_gate(m, Gate(metric="rmse"), None, "regression")["passed"]  # min_value 0: off
    latest = {"run_id": "good", "metrics": {"rmse": 2.9, "task": "regression"}}
    gate = Gate(metric="rmse", against_latest=True, max_regression=0.2)
    assert check_gate(m, gate, latest, "regression")["latest_value"] == 2.9  # 3.0 <= 2.9 + 0.2
    with pytest.raises(QualityGateError, match=r"rmse 3.0000 is more than gate.max_regression 0.05 above 2.9000"):
        check_gate(m, dataclasses.replace(gate, max_regression=0.05), latest, "regression")
    # A better (lower) log loss never counts as a regression.
    assert check_gate({"log_loss": 0.2}, Gate(metric="log_loss", against_latest=True),
                      {"run_id": "good", "metrics": {"log_loss": 0.5}}, "binary")["passed"]


def test_a_latest_model_of_another_task_is_not_compared():
    latest = {"run_id": "old", "metrics": {"accuracy": 0.95, "task": "binary"}}
    gate = Gate(metric="accuracy", against_latest=True)
    assert check_gate({"accuracy": 0.5}, gate, latest, "multiclass")["latest_value"] is None
    with pytest.raises(QualityGateError, match="more than gate.max_regression"):
        check_gate({"accuracy": 0.5}, gate, latest, "binary")


def test_a_metric_the_task_lacks_is_named_with_the_tasks_metrics():
    with pytest.raises(ValueError, match=r"gate.metric 'auc' does not exist for a regression model; use one of "
                                         r"\['rmse', 'mae', 'r2'\]"):
        check_gate({"rmse": 1.0}, Gate(metric="auc"), None, "regression")
    with pytest.raises(ValueError, match=r"'r2' does not exist for a multiclass model.*'macro_f1'"):
        check_gate({"accuracy": 1.0}, Gate(metric="r2"), None, "multiclass")


def test_non_finite_weights_or_final_metrics_fail_naming_them():
    good = {"dense/kernel": np.ones((3, 2)), "dense/bias": np.zeros(2)}
    check_finite(good, {"epoch": 2, "loss": 0.5, "val_auc": 0.7})
    bad = {**good, "dense/kernel": np.array([[1.0, np.nan], [np.inf, 2.0], [0.0, 0.0]])}
    with pytest.raises(QualityGateError, match=r"weights not finite: dense/kernel \(2 of 6 values\)"):
        check_finite(bad, {"loss": 0.5})
    with pytest.raises(QualityGateError, match=r"final loss, val_loss not finite"):
        check_finite(good, {"epoch": 3, "loss": float("nan"), "val_loss": float("inf"), "auc": 0.5})


# -- issue 26.5: the comparison tells the truth ---------------------------------------------

def test_the_gate_says_off_when_it_checked_nothing_and_what_it_checked_otherwise():
    from sparkdeep.pipelines.evaluate import gate_line
    off = gate_line(check_gate({"auc": 0.61}, Gate(metric="auc"), None, "binary"))
    assert off.startswith("quality gate off") and "auc=0.6100" in off and "passed" not in off
    on = gate_line(check_gate({"auc": 0.71}, Gate(min_value=0.7), None, "binary"))
    assert on == "quality gate passed (auc=0.7100: gate.min_value 0.7)"
    vs = gate_line(check_gate({"auc": 0.695}, Gate(against_latest=True), LATEST, "binary"))
    assert "within gate.max_regression 0.01 of the latest model's 0.7000" in vs


def test_baselines_that_beat_the_network_are_named_with_the_margin_best_first():
    from sparkdeep.pipelines.evaluate import KERAS, beaten_by, comparison_warnings
    metrics = {KERAS: {"auc": 0.79, "rows": 5000}, "gbt": {"auc": 0.85, "rows": 5000},
               "random_forest": {"auc": 0.80, "rows": 5000}, "logistic_regression": {"auc": 0.70, "rows": 5000}}
    beaten = beaten_by(metrics, "binary", "auc")
    assert list(beaten) == ["gbt", "random_forest"] and beaten["gbt"] == pytest.approx(0.06)
    (line,) = comparison_warnings(metrics, "binary", "auc", beaten)
    assert "beaten on held-out auc by gbt (by 0.0600), random_forest (by 0.0100)" in line
    # Lower is better: a baseline with a smaller rmse beats the network.
    reg = {KERAS: {"rmse": 3.0, "rows": 900}, "gbt": {"rmse": 2.5, "rows": 900}, "linear_regression": {"rmse": 4.0}}
    assert beaten_by(reg, "regression", "rmse") == {"gbt": pytest.approx(0.5)}
    assert beaten_by({KERAS: {"auc": 0.9}, "gbt": {"auc": 0.8}}, "binary", "auc") == {}


def test_a_holdout_of_a_few_dozen_rows_is_called_noise():
    from sparkdeep.pipelines.evaluate import KERAS, comparison_warnings
    (line,) = comparison_warnings({KERAS: {"auc": 0.8, "rows": 40}}, "binary", "auc", {})
    assert "only 40 rows" in line and "\u00b10.15" in line and "noise" in line
    assert comparison_warnings({KERAS: {"auc": 0.8, "rows": 5000}}, "binary", "auc", {}) == []


def test_the_console_and_the_report_list_the_models_in_one_order():
    from sparkdeep.pipelines import report as rp
    from sparkdeep.pipelines.evaluate import KERAS, metrics_table
    metrics = {KERAS: {"auc": 0.79, "average_precision": 0.5, "accuracy": 0.8, "log_loss": 0.4, "rows": 10},
               "logistic_regression": {"auc": 0.70, "average_precision": 0.4, "accuracy": 0.7, "log_loss": 0.5,
                                       "rows": 10},
               "gbt": {"auc": 0.85, "average_precision": 0.6, "accuracy": 0.82, "log_loss": 0.3, "rows": 10}}
    console = [line.split()[0] for line in metrics_table(metrics, {}, "binary").splitlines()[1:]]
    page = rp.render_html({"task": "binary", "metrics": metrics, "warnings": ["the network is beaten"]}, {}, {}, None)
    table = page.split("<h2>Metrics</h2>")[1].split("</table>")[0]
    import re
    assert console == ["gbt", KERAS, "logistic_regression"] == re.findall(r"<tr><th>([a-z_]+)</th><td>", table)
    assert "<p class='warn'>the network is beaten</p>" in page


def test_a_class_absent_from_the_holdout_reads_n_a_not_zero():
    from sparkdeep.pipelines.evaluate import KERAS, metrics_table
    m = {KERAS: {"accuracy": 0.5, "macro_f1": 0.4, "log_loss": 0.9, "rows": 4,
                 "per_class_recall": {"a": 0.5, "b": None}, "per_class_rows": {"a": 4, "b": 0}}}
    assert "a=0.500, b=n/a (0 held-out rows)" in metrics_table(m, {}, "multiclass")
