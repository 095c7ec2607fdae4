"""The evaluation report: curves from Spark histograms match sklearn; the HTML is
self-contained and every embedded plot loads in headless Chromium."""
import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from sparkdeep.pipelines import report as rp
from tests import _browser


@pytest.fixture(scope="module")
def scored(spark):
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 4000)
    p = np.clip(rng.normal(0.35 + 0.3 * y, 0.18), 0, 1)
    rows = [(i, float(a), float(b), float(b >= 0.5)) for i, (a, b) in enumerate(zip(y, p))]
    return spark.createDataFrame(rows, "flight_id long, label double, p_delayed double, prediction double"), y, p


def test_curves_from_histograms_match_sklearn(scored):
    df, y, p = scored
    hist = rp.score_histogram(df, bins=1000)
    c = rp.curves(hist)
    assert c["roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
    assert c["average_precision"] == pytest.approx(average_precision_score(y, p), abs=5e-3)
    pred = (p >= 0.5).astype(int)
    assert hist["confusion"] == [[int(((y == t) & (pred == q)).sum()) for q in (0, 1)] for t in (0, 1)]
    cal = rp.calibration(hist)
    assert sum(cal["rows"]) == len(y)
    assert all(0 <= v <= 1 for v in cal["observed"])


REPORTS = {
    "prepare": {"sampler": {"stage": "ClassBalanceSampler", "classes": [
        {"label": 0, "rows_in": 6000, "rows_out": 1900}, {"label": 1, "rows_in": 1900, "rows_out": 1900}]},
        "selection": [{"stage": "UnivariateSelectorModel", "input_features": 4, "selected": 2,
                       "selected_names": ["dep_hour", "distance"],
                       "scores": {"dep_hour": 77.1, "distance": 12.0, "month": 0.4, "humid": float("nan")}}],
        "pca_explained_variance": [0.3, 0.2, 0.1]},
    "train": {"keras": {"history": [{"epoch": 1, "loss": 0.6, "val_loss": 0.58, "auc": 0.6, "val_auc": 0.62},
                                    {"epoch": 2, "loss": 0.55, "val_loss": 0.56, "auc": 0.66, "val_auc": 0.64}]}},
}


@pytest.mark.skipif(not _browser.available(), reason="Debian chromium + chromium-driver not installed")
def test_every_plot_in_the_html_report_loads_in_headless_chromium(scored, tmp_path):
    df, _, _ = scored
    hists = {"keras_horovod": rp.score_histogram(df), "logistic_regression": rp.score_histogram(df)}
    result = {"metrics": {"keras_horovod": {"auc": 0.8, "accuracy": 0.7, "rows": 4000},
                          "logistic_regression": {"auc": 0.8, "accuracy": 0.7, "rows": 4000}},
              "row_counts": {"score": {"in": 4000, "out": 4000}},
              "step_wall_s": {"ingest": 10.0, "prepare": 20.0, "train": 30.0, "score": None}}
    page = tmp_path / "report.html"
    page.write_text(rp.render_html(result, hists, REPORTS, "r1"))
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script" not in text  # self-contained

    imgs = _browser.images(str(page))
    # ROC, PR, 2 confusion matrices, calibration, learning curves, class balance,
    # one selector, PCA, step timings.
    assert [i["alt"] for i in imgs] == [
        "ROC curves", "Precision-recall curves", "Confusion matrix (keras_horovod)",
        "Confusion matrix (logistic_regression)", "Calibration", "Learning curves",
        "Class balance before and after downsampling", "Feature selection scores: UnivariateSelectorModel",
        "PCA explained variance", "Step timings"]
    for img in imgs:
        assert img["complete"] and img["width"] > 100 and img["height"] > 100, img
        assert img["src"].startswith("data:image/png;base64")
