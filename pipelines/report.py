"""The evaluation report: one self-contained HTML file, every plot a PNG embedded as base64.

The pictures follow the task. Binary: ROC, precision-recall, confusion and calibration,
from score histograms (``bins`` buckets of P(label = 1) per label). Multiclass: the k x k
confusion matrix and per-class recall, from the held-out metrics. Regression: predicted
vs actual as a 2-D histogram and a residual histogram. Every task also gets learning
curves, data reduction and timings, as far as the steps' reports have them. The data are
small aggregates computed on Spark, one or two per model whatever the size of the
held-out table; nothing row-level is collected to the driver.

The plotting functions take plain report data (dicts from the steps' JSON reports) and
return matplotlib figures, so notebooks draw the same pictures from the same data. They
build ``matplotlib.figure.Figure`` objects directly, never through pyplot: no GUI backend
is touched (jobs run headless), no global figure state leaks between plots.
"""
from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from pyspark.sql import Column, DataFrame, functions as F

from sparkdeep import tasks
from sparkdeep.registry import STRATEGY_RULES, Columns

LABEL, PREDICTION, PROBABILITY = Columns.LABEL, Columns.PREDICTION, Columns.PROBABILITY


# -- data: small aggregates computed on Spark -------------------------------------------
def report_data(predictions: DataFrame, task: str) -> dict:
    """What the report draws for one model beyond its metrics: binary score histograms,
    regression 2-D and residual histograms; nothing for multiclass."""
    tasks.check_task(task)
    if task == "binary":
        return score_histogram(predictions)
    if task == "regression":
        return regression_histograms(predictions)
    return {}


def score_histogram(predictions: DataFrame, bins: int = 1000) -> dict:
    """Counts of rows per (score bucket, label) and the confusion matrix at the model's threshold."""
    bucket = F.least(F.floor(F.col(PROBABILITY) * bins), F.lit(bins - 1)).cast("int")
    # One aggregation gives both: the prediction is constant within a (bucket, label) group
    # for any threshold on the score, so grouping by it too adds at most one group per bucket.
    rows = (predictions.groupBy(bucket.alias("b"), F.col(LABEL).cast("int").alias("y"),
                                F.col(PREDICTION).cast("int").alias("p"))
            .agg(F.count(F.lit(1)).alias("n"), F.sum(PROBABILITY).alias("s")).collect())
    pos, neg, ssum = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    confusion = [[0, 0], [0, 0]]
    for r in rows:
        (pos if r["y"] == 1 else neg)[r["b"]] += r["n"]
        ssum[r["b"]] += r["s"]
        confusion[r["y"]][r["p"]] += r["n"]
    return {"bins": bins, "pos": pos.tolist(), "neg": neg.tolist(), "score_sum": ssum.tolist(),
            "confusion": confusion}


def _bucket(c: Column, lo: float, hi: float, bins: int) -> Column:
    return F.least(F.greatest(F.floor((c - lo) / (hi - lo) * bins), F.lit(0)), F.lit(bins - 1)).cast("int")


def _span(lo: float | None, hi: float | None) -> tuple[float, float]:
    lo, hi = (0.0 if lo is None else float(lo)), (1.0 if hi is None else float(hi))
    return (lo - 0.5, hi + 0.5) if hi <= lo else (lo, hi)


def regression_histograms(predictions: DataFrame, bins: int = 40, tail: float = 0.001) -> dict:
    """Counts of rows per (actual, predicted) cell and per residual (predicted - actual) bucket.

    Ranges run between the ``tail`` and 1 - ``tail`` approximate quantiles, so a few
    outliers do not squash the picture; rows beyond them count in the edge buckets.
    """
    y, yhat = F.col(LABEL), F.col(PREDICTION)
    q = predictions.agg(*[F.percentile_approx(c, [tail, 1 - tail]).alias(n)
                          for n, c in (("y", y), ("p", yhat), ("r", yhat - y))]).first()
    ends = [q[n] or [None, None] for n in ("y", "p", "r")]
    lo, hi = _span(min((e[0] for e in ends[:2] if e[0] is not None), default=None),
                   max((e[1] for e in ends[:2] if e[1] is not None), default=None))
    rlo, rhi = _span(*ends[2])
    grid = np.zeros((bins, bins), dtype=np.int64)
    for r in (predictions.groupBy(_bucket(y, lo, hi, bins).alias("a"), _bucket(yhat, lo, hi, bins).alias("b"))
              .count().collect()):
        grid[r["a"], r["b"]] = r["count"]
    residuals = np.zeros(bins, dtype=np.int64)
    for r in predictions.groupBy(_bucket(yhat - y, rlo, rhi, bins).alias("b")).count().collect():
        residuals[r["b"]] = r["count"]
    return {"bins": bins, "range": [lo, hi], "counts": grid.tolist(), "residual_range": [rlo, rhi],
            "residual_counts": residuals.tolist()}

def curves(hist: dict) -> dict:
    """ROC and precision-recall points (thresholds at bucket edges, high to low) and their areas."""
    pos, neg = np.asarray(hist["pos"])[::-1], np.asarray(hist["neg"])[::-1]
    tp, fp = np.concatenate([[0], np.cumsum(pos)]), np.concatenate([[0], np.cumsum(neg)])
    P, N = max(tp[-1], 1), max(fp[-1], 1)
    tpr, fpr = tp / P, fp / N
    precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 1.0)
    recall = tpr
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "precision": precision.tolist(), "recall": recall.tolist(),
            "roc_auc": float(np.trapezoid(tpr, fpr)) if hasattr(np, "trapezoid") else float(np.trapz(tpr, fpr)),
            "average_precision": float(np.sum(np.diff(recall) * precision[1:])),
            "positive_rate": float(tp[-1] / max(tp[-1] + fp[-1], 1))}


def calibration(hist: dict, groups: int = 10) -> dict:
    """Mean predicted probability vs observed positive rate in ``groups`` equal-width bins."""
    pos, neg, ssum = (np.asarray(hist[k]) for k in ("pos", "neg", "score_sum"))
    edges = np.linspace(0, hist["bins"], groups + 1).astype(int)
    out = {"predicted": [], "observed": [], "rows": []}
    for lo, hi in zip(edges[:-1], edges[1:]):
        n = pos[lo:hi].sum() + neg[lo:hi].sum()
        if n:
            out["predicted"].append(float(ssum[lo:hi].sum() / n))
            out["observed"].append(float(pos[lo:hi].sum() / n))
            out["rows"].append(int(n))
    return out


# -- figures ------------------------------------------------------------------------------
def _fig(w: float = 5.2, h: float = 3.8):
    fig = Figure(figsize=(w, h), dpi=100)
    ax = fig.subplots()
    ax.grid(alpha=0.3)
    return fig, ax


def roc_figure(models: dict[str, dict]):
    fig, ax = _fig()
    for name, c in models.items():
        ax.plot(c["fpr"], c["tpr"], label=f"{name} (AUC {c['roc_auc']:.3f})")
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="chance")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC, held-out rows")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def pr_figure(models: dict[str, dict]):
    fig, ax = _fig()
    for name, c in models.items():
        ax.plot(c["recall"], c["precision"], label=f"{name} (AP {c['average_precision']:.3f})")
    rate = next(iter(models.values()))["positive_rate"] if models else 0
    ax.axhline(rate, color="k", ls="--", lw=0.8, label=f"positive rate {rate:.3f}")
    ax.set(xlabel="recall", ylabel="precision", title="Precision-recall, held-out rows", ylim=(0, 1.02))
    ax.legend(loc="upper right", fontsize=8)
    return fig


def confusion_figure(name: str, matrix: list[list[int]], classes: list[str] | None = None):
    """Counts (and shares, up to 12 classes) per (actual, predicted) class."""
    m = np.asarray(matrix)
    k = len(m)
    classes = classes or [str(i) for i in range(k)]
    size = min(4.2 + 0.35 * max(k - 2, 0), 12)
    fig, ax = _fig(size, size * 0.86)
    ax.grid(False)
    ax.imshow(m, cmap="Blues")
    if k <= 12:
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, f"{v:,}\n{v / max(m.sum(), 1):.1%}", ha="center", va="center",
                    color="white" if v > m.max() / 2 else "black", fontsize=9 if k <= 4 else 7)
    ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="actual", title=f"Confusion matrix: {name}")
    ax.set_xticklabels(classes, rotation=45 if k > 4 else 0, ha="right" if k > 4 else "center", fontsize=8)
    ax.set_yticklabels(classes, fontsize=8)
    return fig


def calibration_figure(models: dict[str, dict]):
    fig, ax = _fig()
    for name, c in models.items():
        ax.plot(c["predicted"], c["observed"], "o-", label=name)
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfectly calibrated")
    ax.set(xlabel="mean predicted probability", ylabel="observed positive rate", title="Calibration (10 bins)",
           xlim=(0, 1), ylim=(0, 1))
    ax.legend(fontsize=8)
    return fig


def per_class_recall_figure(models: dict[str, dict[str, float]]):
    """Grouped bars: each model's recall per class."""
    classes = list(next(iter(models.values()), {}))
    x = np.arange(len(classes))
    fig, ax = _fig(min(5.2 + 0.3 * max(len(classes) - 4, 0), 14), 3.8)
    width = 0.8 / max(len(models), 1)
    for i, (name, recall) in enumerate(models.items()):
        # A class with no held-out rows has no bar (its recall is None), not a bar at 0.
        ax.bar(x - 0.4 + width * (i + 0.5), [np.nan if recall.get(c) is None else recall[c] for c in classes],
               width, label=name)
    ax.set(xticks=x, ylim=(0, 1.05), ylabel="recall", title="Recall per class, held-out rows")
    ax.set_xticklabels(classes, rotation=45 if len(classes) > 4 else 0, ha="right" if len(classes) > 4 else "center",
                       fontsize=8)
    ax.legend(fontsize=8)
    return fig


def predicted_vs_actual_figure(name: str, hist: dict):
    """The 2-D histogram of (actual, predicted), log colour scale, with the diagonal."""
    fig, ax = _fig(5.2, 4.4)
    ax.grid(False)
    grid = np.asarray(hist["counts"]).T  # rows: predicted bucket (y axis), columns: actual (x axis)
    lo, hi = hist["range"]
    shown = np.ma.masked_equal(grid, 0)
    image = ax.imshow(shown, origin="lower", extent=(lo, hi, lo, hi), aspect="auto", cmap="viridis",
                      norm=LogNorm() if grid.max() > 1 else None)
    fig.colorbar(image, ax=ax, label="rows")
    ax.plot([lo, hi], [lo, hi], "r--", lw=0.8, label="predicted = actual")
    ax.set(xlabel="actual", ylabel="predicted", title=f"Predicted vs actual: {name}", xlim=(lo, hi), ylim=(lo, hi))
    ax.legend(fontsize=8, loc="upper left")
    return fig


def residuals_figure(models: dict[str, dict]):
    """Residual (predicted - actual) histograms, one outline per model."""
    fig, ax = _fig()
    for name, h in models.items():
        edges = np.linspace(*h["residual_range"], len(h["residual_counts"]) + 1)
        ax.stairs(h["residual_counts"], edges, label=name)
    ax.axvline(0, color="k", ls="--", lw=0.8)
    ax.set(xlabel="predicted - actual", ylabel="rows", title="Residuals, held-out rows")
    ax.legend(fontsize=8)
    return fig


def curve_metrics(history: list[dict]) -> list[str]:
    """The per-epoch metrics worth a learning curve: loss first, then the Keras metrics every epoch has."""
    keys = set.intersection(*(set(h) for h in history)) if history else set()
    names = []
    for key in (k for h in history[:1] for k in h):  # the first record's order
        if key not in keys:
            continue
        base = key[4:] if key.startswith("val_") else key
        if (base == "loss" or base.lower() in tasks.METRIC_NAMES) and base not in names:
            names.append(base)
    return sorted(names, key=lambda n: n != "loss")


def learning_curves_figure(history: list[dict], metrics: list[str] | None = None):
    """Train and validation curves per epoch, one panel per metric (default :func:`curve_metrics`)."""
    metrics = metrics or curve_metrics(history) or ["loss"]
    fig = Figure(figsize=(4.5 * len(metrics), 3.6), dpi=100)
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    epochs = [h.get("epoch") for h in history]
    for ax, metric in zip(axes, metrics):
        ax.grid(alpha=0.3)
        for key, style in ((metric, "o-"), (f"val_{metric}", "s--")):
            if history and all(key in h for h in history):
                ax.plot(epochs, [h[key] for h in history], style, label="train" if key == metric else "validation")
        ax.set(xlabel="epoch", ylabel=metric, title=f"{metric} per epoch (mean over ranks)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


_SPLIT_LABELS = {"input_s": "input wait", "compute_s": "compute", "allreduce_s": "communication",
                 "wait_s": "waiting for the other ranks", "idle_s": "idle (Python, dispatch)"}


def time_split_figure(profile: dict):
    """Each rank's epochs as stacked bars: where each epoch's seconds went (the parts sum to
    the epoch within the profile's stated tolerance), CPU utilisation above each bar."""
    ranks = profile["ranks"]
    epochs = sorted({e["epoch"] for r in ranks for e in r["epochs"]})
    width = 0.8 / len(ranks)
    fig, ax = _fig(max(5.2, 0.5 * len(epochs) * len(ranks) + 2), 3.8)
    colours = dict(zip(_SPLIT_LABELS, ("tab:green", "tab:blue", "tab:red", "tab:orange", "tab:gray")))
    for i, r in enumerate(ranks):
        by_epoch = {e["epoch"]: e for e in r["epochs"]}
        x = np.array([epochs.index(k) for k in by_epoch]) + (i - (len(ranks) - 1) / 2) * width
        bottom = np.zeros(len(x))
        for key, label in _SPLIT_LABELS.items():
            values = np.array([by_epoch[k].get(key, 0.0) for k in by_epoch])
            ax.bar(x, values, width * 0.95, bottom=bottom, color=colours[key], label=label if i == 0 else None)
            bottom += values
        for xi, top, k in zip(x, bottom, by_epoch):
            ax.text(xi, top, f"r{r['rank']}\n{by_epoch[k].get('cpu_percent', 0):.0f}%", ha="center", va="bottom",
                    fontsize=6)
    ax.set(xticks=np.arange(len(epochs)), xticklabels=[str(e) for e in epochs], xlabel="epoch (bars: ranks)",
           ylabel="seconds", title="Where each rank's epoch went (label: rank, CPU %)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def class_balance_figure(sampler: dict):
    fig, ax = _fig()
    classes = sampler["classes"]
    x = np.arange(len(classes))
    before = [c["rows_in"] for c in classes]
    after = [c["rows_out"] for c in classes]
    ax.bar(x - 0.2, before, 0.4, label="before sampling")
    ax.bar(x + 0.2, after, 0.4, label="after sampling")
    for xi, (b, a) in enumerate(zip(before, after)):
        ax.text(xi - 0.2, b, f"{b:,}", ha="center", va="bottom", fontsize=8)
        ax.text(xi + 0.2, a, f"{a:,}", ha="center", va="bottom", fontsize=8)
    ax.set(xticks=x, xticklabels=[f"label {c['label']}" for c in classes], ylabel="rows",
           title=f"Class balance: {sampler.get('stage', 'sampler')}")
    ax.legend(fontsize=8)
    return fig


def selection_figure(selection: dict, top: int = 25):
    scores = selection["scores"]
    kept = set(selection["selected_names"])
    items = sorted(scores.items(), key=lambda kv: -abs(kv[1] if kv[1] == kv[1] else 0))[:top]
    fig, ax = _fig(6.4, max(3.0, 0.22 * len(items) + 1))
    names = [k for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(names, vals, color=["tab:blue" if n in kept else "tab:gray" for n in names])
    ax.tick_params(axis="y", labelsize=7)
    ax.set(xlabel="score", title=f"{selection['stage']}: {selection['selected']}/{selection['input_features']} kept "
                                 f"(blue), top {len(items)}")
    fig.tight_layout()
    return fig


def pca_figure(explained: list[float]):
    fig, ax = _fig()
    k = np.arange(1, len(explained) + 1)
    ax.bar(k, explained, label="per component")
    ax2 = ax.twinx()
    ax2.plot(k, np.cumsum(explained), "r.-", label="cumulative")
    ax2.set_ylim(0, 1)
    ax.set(xlabel="component", ylabel="explained variance ratio", title="PCA explained variance")
    ax2.set_ylabel("cumulative")
    return fig


def timings_figure(walls: dict[str, float]):
    fig, ax = _fig(5.2, 3.0)
    names = [k for k, v in walls.items() if v is not None]
    ax.barh(names[::-1], [walls[n] for n in names][::-1])
    for i, n in enumerate(names[::-1]):
        ax.text(walls[n], i, f" {walls[n]:.1f}s", va="center", fontsize=8)
    ax.set(xlabel="seconds", title="Wall time per step")
    fig.tight_layout()
    return fig


def time_to_quality_figure(metrics: dict[str, dict], fit_s: dict[str, float | None], metric: str,
                           higher: bool, network: str = "keras_horovod", ax=None, title: str = "Quality against fit time"):
    """Each model's held-out ``metric`` against its fit seconds (log scale): what the
    network costs for what it gains. Models without a fit time or a finite value are left
    out (the table above still lists them). ``ax``: draw there (one panel of a bench's
    figure) instead of on a figure of its own."""
    import math
    fig, ax = _fig(5.6, 3.8) if ax is None else (ax.figure, ax)
    points = [(n, float(fit_s[n]), float(m[metric])) for n, m in metrics.items()
              if isinstance(fit_s.get(n), (int, float)) and fit_s[n] > 0
              and isinstance(m.get(metric), (int, float)) and math.isfinite(m[metric])]
    for name, t, v in points:
        mine = name == network
        ax.scatter([t], [v], s=60 if mine else 36, marker="*" if mine else "o", zorder=3,
                   color="tab:red" if mine else "tab:blue")
        ax.annotate(f" {name}", (t, v), fontsize=8, va="center")
    ax.set_xscale("log")
    ax.set(xlabel="fit seconds (log scale)", ylabel=f"held-out {metric} ({'higher' if higher else 'lower'} is better)",
           title=title)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def png(fig) -> str:
    return base64.b64encode(png_bytes(fig)).decode()


# -- the HTML -----------------------------------------------------------------------------
def _performance(result: dict, data: dict[str, dict]) -> list[tuple[str, object]]:
    """(caption, figure) of the held-out performance section, for the result's task."""
    task, metrics = result["task"], result["metrics"]
    if task == "binary":
        hists = {name: h for name, h in data.items() if h}
        cur = {name: curves(h) for name, h in hists.items()}
        for name, c in cur.items():  # the legends quote the exact metrics of the table
            m = metrics.get(name) or {}
            c["roc_auc"] = m.get("auc", c["roc_auc"])
            c["average_precision"] = m.get("average_precision", c["average_precision"])
        out = [("ROC curves", roc_figure(cur)), ("Precision-recall curves", pr_figure(cur))] if cur else []
        out += [(f"Confusion matrix ({name})", confusion_figure(name, h["confusion"], result.get("classes")))
                for name, h in hists.items()]
        if hists:
            out.append(("Calibration", calibration_figure({name: calibration(h) for name, h in hists.items()})))
        return out
    if task == "multiclass":
        out = [(f"Confusion matrix ({name})", confusion_figure(name, m["confusion_matrix"], result.get("classes")))
               for name, m in metrics.items() if m.get("confusion_matrix")]
        recalls = {name: m["per_class_recall"] for name, m in metrics.items() if m.get("per_class_recall")}
        return out + ([("Recall per class", per_class_recall_figure(recalls))] if recalls else [])
    hists = {name: h for name, h in data.items() if h}
    out = [(f"Predicted vs actual ({name})", predicted_vs_actual_figure(name, h)) for name, h in hists.items()]
    return out + ([("Residuals", residuals_figure(hists))] if hists else [])


def figures(result: dict, data: dict[str, dict], reports: dict[str, dict]) -> list[tuple[str, str, object]]:
    """(section, caption, figure) for every plot the data allows, in report order."""
    out = [("Held-out performance", caption, fig) for caption, fig in _performance(result, data)]
    fit_s = result.get("fit_s") or {}
    if sum(isinstance(v, (int, float)) and v > 0 for v in fit_s.values()) >= 2:
        metric, higher = tasks.gate_metric((result.get("gate") or {}).get("metric", ""), result["task"])
        out.append(("Held-out performance", f"Held-out {metric} against fit time",
                    time_to_quality_figure(result["metrics"], fit_s, metric, higher)))
    history = ((reports.get("train") or {}).get("keras") or {}).get("history") or []
    if history:
        out.append(("Training", "Learning curves", learning_curves_figure(history)))
    profile = ((reports.get("train") or {}).get("keras") or {}).get("profile")
    if profile and profile.get("ranks"):
        out.append(("Training", "Time split per rank and epoch", time_split_figure(profile)))
    prep = reports.get("prepare") or {}
    if (prep.get("sampler") or {}).get("classes"):
        out.append(("Data reduction", "Class balance before and after downsampling",
                    class_balance_figure(prep["sampler"])))
    for sel in prep.get("selection") or []:
        out.append(("Data reduction", f"Feature selection scores: {sel['stage']}", selection_figure(sel)))
    if prep.get("pca_explained_variance"):
        out.append(("Data reduction", "PCA explained variance", pca_figure(prep["pca_explained_variance"])))
    walls = result.get("step_wall_s") or {}
    if any(v is not None for v in walls.values()):
        out.append(("Run", "Step timings", timings_figure(walls)))
    return out


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} .meta{color:#666;font-size:.9em} table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:.3em .7em;text-align:right} th{background:#f4f4f4}
.grid{display:flex;flex-wrap:wrap;gap:1em} figure{margin:0;border:1px solid #eee;padding:.5em}
figcaption{font-size:.85em;color:#555} img{max-width:100%} .warn{color:#8a4b00;font-weight:600}"""

_HEADINGS = {"auc": "AUC", "average_precision": "average precision", "macro_f1": "macro F1",
             "log_loss": "log loss", "rmse": "RMSE", "mae": "MAE", "r2": "R\u00b2"}


def _cell(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "&ndash;"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"


_BASELINE_NOTE = ("The network trains on the prepare step's output (by default embedded categories and "
                  "quantile bins beside the standardised numbers; rebalanced, selected or projected when the "
                  "config says so); every other model is an MLlib baseline fitted on every assembled feature of every training row: what a "
                  "user would fit instead. Fit time: the network's whole distributed fit (launch included), each "
                  "baseline's MLlib fit.")


def load_ablation(path: str) -> dict:
    """An ablation results file (``bench/ablation_bench.py``'s JSON) checked for what the
    report's section reads; errors name the file and what is wrong."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except OSError as e:
        raise ValueError(f"baselines.ablation: cannot read {path!r}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"baselines.ablation: {path!r} is not JSON ({e.msg}, line {e.lineno})") from None
    metric = data.get("metric") if isinstance(data, dict) else None
    variants = data.get("variants") if isinstance(data, dict) else None
    if not isinstance(metric, str) or not isinstance(variants, list) or not variants or not all(
            isinstance(v, dict) and isinstance(v.get("variant"), str) and
            isinstance(v.get(metric), (int, float)) for v in variants):
        raise ValueError(f"baselines.ablation: {path!r} is not an ablation results file (bench/ablation_bench.py "
                         "writes one): it needs 'metric' and a non-empty 'variants' list, each with 'variant' and "
                         "that metric")
    return data


def ablation_html(data: dict) -> str:
    """The "Ablation" section: each variant's held-out metric and fit seconds, best first."""
    metric = data["metric"]
    lower = not tasks.HOLDOUT_METRICS[metric].higher_is_better if metric in tasks.HOLDOUT_METRICS else False
    rows = sorted(data["variants"], key=lambda v: v[metric], reverse=not lower)
    cols = ("prepare_s", "train_s", "input_width", "rows_prepared")
    def cell(v, c):
        value = v.get(c)
        return f"{value:,.1f}" if c.endswith("_s") and isinstance(value, (int, float)) else _cell(value)
    body = "".join(f"<tr><th>{html.escape(v['variant'])}</th><td>{_cell(v[metric])}</td>"
                   + "".join(f"<td>{cell(v, c)}</td>" for c in cols) + "</tr>" for v in rows)
    meta = ", ".join(f"{k} {html.escape(str(data[k]))}" for k in ("dataset", "task", "fraction", "epochs",
                                                                   "rows_train", "rows_holdout") if k in data)
    return (f"<h2>Ablation</h2><p class='meta'>Each reduction variant refitted and its network trained on the same "
            f"rows, scored on the same holdout (bench/ablation_bench.py; {meta}).</p>"
            f"<table><tr><th>variant</th><th>{html.escape(metric)}</th>"
            + "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols) + f"</tr>{body}</table>")


#: How many names a list in the report shows (the step reports hold them all).
LISTED = 20


def _names(items, at_most: int = LISTED) -> str:
    items = list(items)
    shown = ", ".join(html.escape(str(n)) for n in items[:at_most])
    return shown + (f", &hellip; ({len(items) - at_most:,} more)" if len(items) > at_most else "")


def features_html(reports: dict[str, dict]) -> str:
    """The features section: counts and at most :data:`LISTED` names per list, by the
    source's names, so it reads the same at 20 columns and at 10,000."""
    ing = reports.get("ingest") or {}
    prep = reports.get("prepare") or {}
    feats = ing.get("features") or {}
    rows = []
    if feats:
        rows.append(("ingested", f"{len(feats.get('categorical', [])):,} categorical, "
                                 f"{len(feats.get('numeric', [])):,} numeric"))
        if feats.get("left_out"):
            rows.append((f"left out at ingest ({len(feats['left_out']):,})", _names(sorted(feats["left_out"]))))
    renamed = ing.get("renamed_columns") or {}
    if renamed:
        rows.append((f"stored under internal names ({len(renamed):,})",
                     _names(f"{k} \u2192 {v}" for k, v in renamed.items())))
    if prep.get("left_out"):
        rows.append((f"left out by prepare ({len(prep['left_out']):,})", _names(sorted(prep["left_out"]))))
    for sel in prep.get("selection") or []:
        scores = sel.get("scores") or {}
        best = sorted(scores, key=lambda n: -abs(scores[n]) if scores[n] == scores[n] else 0)
        rows.append((f"{sel['stage']}: {sel.get('selected', len(best)):,} of {sel.get('input_features', '?'):,} kept",
                     "best first: " + _names(best)))
    layout = prep.get("embedding_layout") or {}
    if layout.get("categorical"):
        rows.append((f"embedded columns ({len(layout['categorical']):,})", _names(layout["categorical"])))
    if not rows:
        return ""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<h2>Features</h2><table>{body}</table>"


def training_html(reports: dict[str, dict]) -> str:
    """The training section: how the ranks agreed (the strategy) and what it cost, per epoch
    and rank: seconds computing, communicating and waiting, bytes handed to the collective."""
    keras = (reports.get("train") or {}).get("keras") or {}
    history = keras.get("history") or []
    if not history:
        return ""
    strategy = keras.get("strategy") or "horovod"
    ranks = keras.get("ranks") or []
    if strategy in STRATEGY_RULES:
        summary = STRATEGY_RULES[strategy].summary.format(local_steps=keras.get("local_steps") or "local_steps")
        strategy += f" ({summary})"
    later = history[1:] or history

    def mean(key):
        values = [h[key] for h in later if isinstance(h.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    calls = ranks[0].get("allreduce_calls") if ranks else None
    sent = ranks[0].get("allreduce_bytes") if ranks else None
    timings = keras.get("timings_s") or {}
    rows = [("strategy", html.escape(strategy)), ("ranks", f"{len(ranks):,}" if ranks else "&ndash;"),
            ("epochs", f"{len(history):,}")]
    for label, key, unit in (("samples/s (epochs after the first)", "samples_per_s", ""),
                             ("seconds per epoch", "seconds", " s"), ("input wait per epoch", "input_s", " s"),
                             ("computing per epoch", "compute_s", " s"),
                             ("communicating per epoch", "allreduce_s", " s"),
                             ("waiting for the other ranks per epoch", "wait_s", " s"),
                             ("idle per epoch (Python between the parts, dispatch)", "idle_s", " s"),
                             ("CPU of rank 0's process (100% = one core busy)", "cpu_percent", "%"),
                             ("achieved GFLOP/s (rank 0, estimated FLOPs per sample)", "gflop_s", "")):
        value = mean(key)
        if value is not None:
            rows.append((label, f"{value:,.1f}{unit}" if key in ("samples_per_s", "cpu_percent")
                         else f"{value:.2f}{unit}"))
    profile = keras.get("profile") or {}
    peaks = [e.get("peak_rss_mb", 0) for r in profile.get("ranks") or [] for e in r["epochs"]]
    if peaks:
        rows.append(("peak memory of a rank process", f"{max(peaks):,.0f} MB"))
    if profile.get("flops_per_sample"):
        rows.append(("training FLOPs per sample (estimate: forward and backward)",
                     f"{profile['flops_per_sample']:,}"))
    if calls is not None and sent is not None:
        rows.append(("exchanges per epoch (rank 0)", f"{calls / len(history):,.1f}"))
        rows.append(("bytes sent per epoch (rank 0, payload)", f"{sent / len(history) / 1e6:,.2f} MB"))
    staleness = keras.get("staleness")
    if isinstance(staleness, dict):
        rows.append(("staleness: other updates between a worker's read and its write",
                     f"mean {staleness.get('mean', 0):.2f}, max {staleness.get('max', 0)}"))
    for label, key in (("launch to first step", "launch_to_first_step"), ("fit, launch included", "fit_total")):
        if isinstance(timings.get(key), (int, float)):
            rows.append((label, f"{timings[key]:.1f} s"))
    body = "".join(f"<tr><th>{k}</th><td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<h2>Distributed training</h2><table>{body}</table>"


def render_html(result: dict, data: dict[str, dict], reports: dict[str, dict], run_id: str | None,
                title: str = "sparkdeep evaluation report", ablation: dict | None = None) -> str:
    """The report page for ``result`` (the evaluate step's: ``task``, ``metrics`` per model, and
    optionally ``classes``, ``row_counts``, ``step_wall_s``), ``data`` (:func:`report_data` per
    model), the earlier steps' ``reports`` and, when asked for, an ``ablation``
    (:func:`load_ablation`)."""
    task = tasks.check_task(result["task"])
    names = list(tasks.holdout_metrics(task)) + ["rows"]
    fit_s = result.get("fit_s") or {}
    head = "".join(f"<th>{html.escape(_HEADINGS.get(n, n.replace('_', ' ')))}</th>" for n in names) + \
        ("<th>fit s</th>" if fit_s else "")
    # Best first by the gate metric, as the console lists them (tasks.best_first).
    order = tasks.best_first(result["metrics"], task, (result.get("gate") or {}).get("metric", ""))
    metrics = result["metrics"]
    rows = "".join(f"<tr><th>{html.escape(model)}</th>{''.join(f'<td>{_cell(metrics[model].get(n))}</td>' for n in names)}"
                   + (f"<td>{_cell(fit_s.get(model))}</td>" if fit_s else "") + "</tr>"
                   for model in order)
    warnings = "".join(f"<p class='warn'>{html.escape(w)}</p>" for w in result.get("warnings") or [])
    counts = "".join(f"<tr><th>{html.escape(step)}</th><td style='text-align:left'>"
                     f"{html.escape(json.dumps(c))}</td></tr>" for step, c in result.get("row_counts", {}).items())
    sections: dict[str, list[str]] = {}
    for section, caption, fig in figures(result, data, reports):
        sections.setdefault(section, []).append(
            f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{png(fig)}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    body = "".join(f"<h2>{html.escape(s)}</h2><div class='grid'>{''.join(items)}</div>" for s, items in sections.items())
    classes = result.get("classes")
    what = f"{task}" + (f" ({len(classes)} classes: {', '.join(classes)})" if classes and task == "multiclass" else "")
    made = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class='meta'>run {html.escape(str(run_id))} &middot; task {html.escape(what)} &middot; "
            f"written {made}</p>"
            f"<h2>Metrics</h2><p class='meta'>{html.escape(_BASELINE_NOTE)}</p>"
            f"{warnings}<table><tr><th>model</th>{head}</tr>{rows}</table>"
            f"<h2>Rows per step</h2><table>{counts}</table>{features_html(reports)}{training_html(reports)}{body}"
            f"{ablation_html(ablation) if ablation else ''}</body></html>")
