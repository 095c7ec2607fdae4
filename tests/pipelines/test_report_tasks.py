"""The evaluation report per task: its data are small Spark aggregates that agree with numpy and
scikit-learn, its pictures follow the task, and it does without the sections a run lacks."""
import re

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from sparkdeep.pipelines import report as rp
from sparkdeep.pipelines.evaluate import task_metrics
from tests import _browser


def _frame(spark, schema, **columns):
    n = len(next(iter(columns.values())))
    return spark.createDataFrame(pd.DataFrame({"id": np.arange(n), **columns}), schema)


@pytest.fixture(scope="module")
def binary(spark):
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 4000).astype(float)
    p = np.clip(rng.normal(0.35 + 0.3 * y, 0.18), 0, 1)
    df = _frame(spark, "id long, label double, prediction double, probability double",
                label=y, prediction=(p >= 0.5) * 1.0, probability=p)
    return df, y, p


@pytest.fixture(scope="module")
def multiclass(spark):
    rng = np.random.default_rng(8)
    y = rng.integers(0, 3, 900)
    z = rng.normal(0, 1, (900, 3)) + 2 * np.eye(3)[y]
    proba = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return _frame(spark, "id long, label double, prediction double, probability array<double>",
                  label=y * 1.0, prediction=proba.argmax(axis=1) * 1.0, probability=list(proba))


@pytest.fixture(scope="module")
def regression(spark):
    rng = np.random.default_rng(9)
    y = rng.gamma(2.0, 10.0, 3000)
    yhat = 0.8 * y + rng.normal(3, 4, y.size)
    yhat[:3] = [1e6, -1e6, 5e5]  # outliers: counted in the edge buckets, not stretching the range
    return _frame(spark, "id long, label double, prediction double", label=y, prediction=yhat), y, yhat


def test_binary_curves_from_histograms_match_sklearn(binary):
    df, y, p = binary
    hist = rp.report_data(df, "binary")
    c = rp.curves(hist)
    assert c["roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=2e-3)
    assert c["average_precision"] == pytest.approx(average_precision_score(y, p), abs=5e-3)
    pred = (p >= 0.5).astype(int)
    assert hist["confusion"] == [[int(((y == t) & (pred == q)).sum()) for q in (0, 1)] for t in (0, 1)]
    cal = rp.calibration(hist)
    assert sum(cal["rows"]) == len(y) and all(0 <= v <= 1 for v in cal["observed"])


def test_regression_histograms_bucket_every_row_as_numpy_does(regression):
    df, y, yhat = regression
    h = rp.report_data(df, "regression")
    bins, (lo, hi), (rlo, rhi) = h["bins"], h["range"], h["residual_range"]
    assert hi - lo < 1000 and rhi - rlo < 1000  # the outliers did not set the range

    def bucket(x, a, b):
        return np.clip(np.floor((x - a) / (b - a) * bins), 0, bins - 1).astype(int)
    grid = np.zeros((bins, bins), dtype=int)
    np.add.at(grid, (bucket(y, lo, hi), bucket(yhat, lo, hi)), 1)
    assert h["counts"] == grid.tolist()
    assert h["residual_counts"] == np.bincount(bucket(yhat - y, rlo, rhi), minlength=bins).tolist()
    assert rp.report_data(df.limit(0), "multiclass") == {}


def test_learning_curves_take_loss_and_the_metrics_the_history_has():
    history = [{"epoch": 1, "loss": 3.0, "val_loss": 3.5, "rmse": 1.7, "val_rmse": 1.9, "learning_rate": 0.1,
                "seconds": 2.0},
               {"epoch": 2, "loss": 2.0, "val_loss": 2.5, "rmse": 1.4, "val_rmse": 1.6, "learning_rate": 0.1,
                "seconds": 2.0}]
    assert rp.curve_metrics(history) == ["loss", "rmse"]
    assert rp.curve_metrics([{"epoch": 1, "val_AUC": 0.6, "loss": 0.7}]) == ["loss", "AUC"]
    assert rp.curve_metrics([]) == []
    assert len(rp.learning_curves_figure(history).axes) == 2


REPORTS = {
    "prepare": {"sampler": {"stage": "ClassBalanceSampler", "classes": [
        {"label": 0, "rows_in": 6000, "rows_out": 1900}, {"label": 1, "rows_in": 1900, "rows_out": 1900}]},
        "selection": [{"stage": "UnivariateSelectorModel", "input_features": 4, "selected": 2,
                       "selected_names": ["f1", "f2"], "scores": {"f1": 77.1, "f2": 12.0, "f3": 0.4,
                                                                  "f4": float("nan")}}],
        "pca_explained_variance": [0.3, 0.2, 0.1]},
    "train": {"keras": {"history": [{"epoch": 1, "loss": 0.6, "val_loss": 0.58, "auc": 0.6, "val_auc": 0.62},
                                    {"epoch": 2, "loss": 0.55, "val_loss": 0.56, "auc": 0.66, "val_auc": 0.64}]}},
}
# Regression: prepare skips rebalancing, no PCA, and the history has no auc.
REGRESSION_REPORTS = {"prepare": {"selection": []},
                      "train": {"keras": {"history": [{"epoch": 1, "loss": 9.0, "val_loss": 9.5},
                                                      {"epoch": 2, "loss": 7.0, "val_loss": 8.0}]}}}
WALLS = {"ingest": 10.0, "prepare": 20.0, "train": 30.0, "score": None}


@pytest.fixture(scope="module")
def pages(binary, multiclass, regression):
    """(task, html, model names) per task, metrics computed as the evaluate step does."""
    pages = []
    classes = ["cat", "dog", "fox"]
    for task, df, reports, classes_ in (("binary", binary[0], REPORTS, None),
                                        ("multiclass", multiclass, REPORTS, classes),
                                        ("regression", regression[0], REGRESSION_REPORTS, None)):
        names = ("keras_horovod", "linear_regression" if task == "regression" else "logistic_regression")
        m = task_metrics(df, task, classes_)
        result = {"task": task, "classes": classes_, "metrics": {n: m for n in names},
                  "row_counts": {"score": {"in": m["rows"], "out": m["rows"]}}, "step_wall_s": WALLS,
                  "fit_s": {names[0]: 30.0, names[1]: 2.5}}
        data = {n: rp.report_data(df, task) for n in names}
        pages.append((task, rp.render_html(result, data, reports, "r1"), names))
    return pages


REDUCTION = ["Class balance before and after downsampling", "Feature selection scores: UnivariateSelectorModel",
             "PCA explained variance"]


def expected_images(task, names):
    if task == "binary":
        held_out = ["ROC curves", "Precision-recall curves", *[f"Confusion matrix ({n})" for n in names],
                    "Calibration"]
    elif task == "multiclass":
        held_out = [*[f"Confusion matrix ({n})" for n in names], "Recall per class"]
    else:
        held_out = [*[f"Predicted vs actual ({n})" for n in names], "Residuals"]
    metric = {"binary": "auc", "multiclass": "accuracy", "regression": "r2"}[task]
    held_out.append(f"Held-out {metric} against fit time")
    return held_out + ["Learning curves"] + (REDUCTION if task != "regression" else []) + ["Step timings"]


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_the_report_follows_the_task(pages):
    headers = {"binary": ["AUC", "average precision", "accuracy", "log loss", "rows"],
               "multiclass": ["accuracy", "macro F1", "log loss", "rows"],
               "regression": ["RMSE", "MAE", "R\u00b2", "rows"]}
    for task, text, names in pages:
        assert re.findall(r"<img alt='([^']*)'", text) == expected_images(task, names), task
        table = text.split("<h2>Metrics</h2>")[1].split("</tr>")[0]
        assert re.findall(r"<th>([^<]*)</th>", table) == ["model"] + headers[task] + ["fit s"]
        assert f"task {task}" in text and "http://" not in text and "https://" not in text and "<script" not in text
    assert "3 classes: cat, dog, fox" in pages[1][1]


def test_quality_against_fit_time_plots_each_timed_model_with_a_finite_metric():
    metrics = {"keras_horovod": {"auc": 0.79}, "xgboost": {"auc": 0.78}, "gbt": {"auc": float("nan")},
               "random_forest": {"auc": 0.73}}
    fig = rp.time_to_quality_figure(metrics, {"keras_horovod": 60.0, "xgboost": 5.0, "gbt": 50.0,
                                              "random_forest": None}, "auc", True)
    ax = fig.axes[0]
    # the network and xgboost: gbt's AUC is not finite, random_forest has no fit time
    assert sorted(t.get_text().strip() for t in ax.texts) == ["keras_horovod", "xgboost"]
    assert ax.get_xscale() == "log" and "higher is better" in ax.get_ylabel()
    assert rp.png_bytes(fig)[:4] == b"\x89PNG"
    # fewer than two timed models: no such plot
    result = {"task": "binary", "metrics": metrics, "fit_s": {"keras_horovod": 60.0}}
    assert "Held-out auc against fit time" not in [c for _, c, _ in rp.figures(result, {}, {})]


def test_a_report_without_earlier_step_reports_still_renders():
    result = {"task": "multiclass", "metrics": {"keras_horovod": {
        "rows": 4, "accuracy": 0.5, "macro_f1": 0.4, "log_loss": 0.9, "confusion_matrix": [[1, 1], [1, 1]],
        "per_class_recall": {"0": 0.5, "1": 0.5}}}}
    text = rp.render_html(result, {}, {}, None)
    assert re.findall(r"<img alt='([^']*)'", text) == ["Confusion matrix (keras_horovod)", "Recall per class"]
    with pytest.raises(ValueError, match="task 'ranking' is not one of"):
        rp.render_html({**result, "task": "ranking"}, {}, {}, None)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.skipif(not _browser.available(), reason="Debian chromium + chromium-driver not installed")
def test_every_plot_of_every_task_loads_in_headless_chromium(pages, tmp_path):
    for task, text, names in pages:
        page = tmp_path / f"{task}.html"
        page.write_text(text)
        imgs = _browser.images(str(page))
        assert [i["alt"] for i in imgs] == expected_images(task, names)
        for img in imgs:
            assert img["complete"] and img["width"] > 100 and img["height"] > 100, (task, img)
            assert img["src"].startswith("data:image/png;base64")


def test_the_ablation_section_appears_when_asked_for_and_a_bad_file_is_named(tmp_path):
    import json
    import os
    result = {"task": "binary", "metrics": {"keras_horovod": {"rows": 4, "auc": 0.8, "average_precision": 0.6,
                                                              "accuracy": 0.7, "log_loss": 0.5}}}
    assert "<h2>Ablation</h2>" not in rp.render_html(result, {}, {}, None)
    shipped = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "results", "ablation_flights.json")
    ablation = rp.load_ablation(shipped)
    text = rp.render_html(result, {}, {}, None, ablation=ablation)
    section = text.split("<h2>Ablation</h2>")[1]
    names = re.findall(r"<tr><th>([^<]*)</th><td>", section)
    assert set(names) == {v["variant"] for v in ablation["variants"]}
    best = max(ablation["variants"], key=lambda v: v["auc"])
    assert names[0] == best["variant"] and f"{best['auc']:.4f}" in section  # best first
    assert f"<td>{best['prepare_s']:,.1f}</td>" in section  # seconds with one decimal
    bad = tmp_path / "bad.json"
    for content, match in (("{", "is not JSON"), (json.dumps({"metric": "auc", "variants": []}),
                                                   "is not an ablation results file")):
        bad.write_text(content)
        with pytest.raises(ValueError, match=rf"baselines.ablation: '{re.escape(str(bad))}' {match}"):
            rp.load_ablation(str(bad))
    with pytest.raises(ValueError, match=r"baselines.ablation: cannot read '/nonexistent/a.json'"):
        rp.load_ablation("/nonexistent/a.json")


def test_the_report_names_the_strategy_and_what_it_communicated():
    """Issue 24: the training section says how the ranks agreed and what that cost."""
    history = [{"epoch": e, "loss": 0.5, "seconds": 4.0, "samples_per_s": 50_000.0, "compute_s": 2.5,
                "allreduce_s": 1.0 + e, "wait_s": 0.25} for e in (1, 2, 3)]
    keras = {"history": history, "strategy": "local_sgd", "local_steps": 8,
             "ranks": [{"rank": 0, "allreduce_calls": 30, "allreduce_bytes": 3_000_000}, {"rank": 1}],
             "timings_s": {"launch_to_first_step": 9.5, "fit_total": 30.25}}
    text = rp.training_html({"train": {"keras": keras}})
    assert "<h2>Distributed training</h2>" in text
    assert "local_sgd (each rank alone, weights averaged every 8 updates)" in text
    assert "<th>exchanges per epoch (rank 0)</th><td style='text-align:left'>10.0</td>" in text
    assert "1.00 MB" in text and "3.50 s" in text and "0.25 s" in text and "9.5 s" in text  # epochs 2-3 mean
    assert rp.training_html({}) == "" and rp.training_html({"train": {"keras": {}}}) == ""
    result = {"task": "binary", "metrics": {"keras_horovod": {"rows": 2, "auc": 0.5}}}
    assert "Distributed training" in rp.render_html(result, {}, {"train": {"keras": keras}}, None)
    ps = {**keras, "strategy": "parameter_server", "local_steps": None, "staleness": {"mean": 0.42, "max": 3}}
    text = rp.training_html({"train": {"keras": ps}})
    assert "parameter_server (asynchronous: workers wait for no one" in text
    assert "<td style='text-align:left'>mean 0.42, max 3</td>" in text
