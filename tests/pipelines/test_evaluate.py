"""The quality gate: finite weights and metrics, a minimum held-out metric, no regression."""
import dataclasses

import numpy as np
import pytest

from sparkdeep.pipelines.evaluate import QualityGateError, check_finite, check_gate


@dataclasses.dataclass
class Gate:
    metric: str = "auc"
    min_value: float = 0.0
    against_latest: bool = False
    max_regression: float = 0.01


LATEST = {"run_id": "good", "metrics": {"auc": 0.70, "accuracy": 0.77}}


def test_the_default_gate_passes_any_finite_model():
    checked = check_gate({"auc": 0.51, "accuracy": 0.5, "rows": 10}, Gate(), LATEST)
    assert checked["passed"] and checked["value"] == 0.51 and checked["latest_value"] is None


@pytest.mark.parametrize("metrics", [{"auc": float("nan"), "rows": 10}, {"auc": 0.7, "accuracy": float("inf")}])
def test_non_finite_held_out_metrics_fail(metrics):
    with pytest.raises(QualityGateError, match="not finite; not promoted"):
        check_gate(metrics, Gate(), None)


def test_a_minimum_held_out_metric_names_the_key():
    with pytest.raises(QualityGateError, match=r"held-out accuracy 0.6000 is below gate.min_value 0.65"):
        check_gate({"auc": 0.9, "accuracy": 0.6}, Gate(metric="accuracy", min_value=0.65), None)
    assert check_gate({"auc": 0.9, "accuracy": 0.66}, Gate(metric="accuracy", min_value=0.65), None)["passed"]


def test_no_regression_beyond_the_margin_against_the_latest_model():
    gate = Gate(against_latest=True, max_regression=0.02)
    assert check_gate({"auc": 0.685}, gate, LATEST)["latest_value"] == 0.70  # within the margin
    with pytest.raises(QualityGateError, match=r"auc 0.6700 is more than gate.max_regression 0.02 below "
                                               r"0.7000, the latest promoted model's \(run good\)"):
        check_gate({"auc": 0.67}, gate, LATEST)
    assert check_gate({"auc": 0.5}, gate, None)["passed"]  # nothing promoted yet: nothing to regress from
    assert check_gate({"auc": 0.5}, Gate(), LATEST)["passed"]  # off by default


def test_non_finite_weights_or_final_metrics_fail_naming_them():
    good = {"dense/kernel": np.ones((3, 2)), "dense/bias": np.zeros(2)}
    check_finite(good, {"epoch": 2, "loss": 0.5, "val_auc": 0.7})
    bad = {**good, "dense/kernel": np.array([[1.0, np.nan], [np.inf, 2.0], [0.0, 0.0]])}
    with pytest.raises(QualityGateError, match=r"weights not finite: dense/kernel \(2 of 6 values\)"):
        check_finite(bad, {"loss": 0.5})
    with pytest.raises(QualityGateError, match=r"final loss, val_loss not finite"):
        check_finite(good, {"epoch": 3, "loss": float("nan"), "val_loss": float("inf"), "auc": 0.5})
