"""The evaluation report: one self-contained HTML file, every plot a PNG embedded as base64.

Curves are computed on Spark from score histograms (``bins`` buckets of the predicted
probability per label), so the report costs one aggregation per model whatever the size
of the held-out table; nothing row-level is collected to the driver.

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
from matplotlib.figure import Figure
from pyspark.sql import DataFrame, functions as F

from .flights import LABEL

SCORE = "p_delayed"
PREDICTION = "prediction"


# -- data: small aggregates computed on Spark -------------------------------------------
def score_histogram(predictions: DataFrame, bins: int = 1000) -> dict:
    """Counts of rows per (score bucket, label) and the confusion matrix at the model's threshold."""
    bucket = F.least(F.floor(F.col(SCORE) * bins), F.lit(bins - 1)).cast("int")
    # One aggregation gives both: the prediction is constant within a (bucket, label) group
    # for any threshold on the score, so grouping by it too adds at most one group per bucket.
    rows = (predictions.groupBy(bucket.alias("b"), F.col(LABEL).cast("int").alias("y"),
                                F.col(PREDICTION).cast("int").alias("p"))
            .agg(F.count(F.lit(1)).alias("n"), F.sum(SCORE).alias("s")).collect())
    pos, neg, ssum = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    confusion = [[0, 0], [0, 0]]
    for r in rows:
        (pos if r["y"] == 1 else neg)[r["b"]] += r["n"]
        ssum[r["b"]] += r["s"]
        confusion[r["y"]][r["p"]] += r["n"]
    return {"bins": bins, "pos": pos.tolist(), "neg": neg.tolist(), "score_sum": ssum.tolist(),
            "confusion": confusion}


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


def confusion_figure(name: str, matrix: list[list[int]]):
    fig, ax = _fig(4.2, 3.6)
    ax.grid(False)
    m = np.asarray(matrix)
    ax.imshow(m, cmap="Blues")
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, f"{v:,}\n{v / max(m.sum(), 1):.1%}", ha="center", va="center",
                color="white" if v > m.max() / 2 else "black", fontsize=9)
    ax.set(xticks=[0, 1], yticks=[0, 1], xticklabels=["on time", "delayed"], yticklabels=["on time", "delayed"],
           xlabel="predicted", ylabel="actual", title=f"Confusion matrix: {name}")
    return fig


def calibration_figure(models: dict[str, dict]):
    fig, ax = _fig()
    for name, c in models.items():
        ax.plot(c["predicted"], c["observed"], "o-", label=name)
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="perfectly calibrated")
    ax.set(xlabel="mean predicted probability", ylabel="observed delayed rate", title="Calibration (10 bins)",
           xlim=(0, 1), ylim=(0, 1))
    ax.legend(fontsize=8)
    return fig


def learning_curves_figure(history: list[dict]):
    fig = Figure(figsize=(9, 3.6), dpi=100)
    axes = fig.subplots(1, 2)
    epochs = [h["epoch"] for h in history]
    for ax, metric in zip(axes, ("loss", "auc")):
        ax.grid(alpha=0.3)
        for key, style in ((metric, "o-"), (f"val_{metric}", "s--")):
            if all(key in h for h in history):
                ax.plot(epochs, [h[key] for h in history], style, label="train" if key == metric else "validation")
        ax.set(xlabel="epoch", ylabel=metric, title=f"{metric} per epoch (mean over ranks)")
        ax.legend(fontsize=8)
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


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def png(fig) -> str:
    return base64.b64encode(png_bytes(fig)).decode()


# -- the HTML -----------------------------------------------------------------------------
def figures(result: dict, hists: dict[str, dict], reports: dict[str, dict]) -> list[tuple[str, str, object]]:
    """(section, caption, figure) for every plot the data allows, in report order."""
    cur = {name: curves(h) for name, h in hists.items()}
    cal = {name: calibration(h) for name, h in hists.items()}
    out = [("Held-out performance", "ROC curves", roc_figure(cur)),
           ("Held-out performance", "Precision-recall curves", pr_figure(cur))]
    for name, h in hists.items():
        out.append(("Held-out performance", f"Confusion matrix ({name})", confusion_figure(name, h["confusion"])))
    out.append(("Held-out performance", "Calibration", calibration_figure(cal)))
    history = (reports.get("train") or {}).get("keras", {}).get("history") or []
    if history:
        out.append(("Training", "Learning curves", learning_curves_figure(history)))
    prep = reports.get("prepare") or {}
    if prep.get("sampler"):
        out.append(("Data reduction", "Class balance before and after downsampling",
                    class_balance_figure(prep["sampler"])))
    for sel in prep.get("selection", []):
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
figcaption{font-size:.85em;color:#555} img{max-width:100%}"""


def render_html(result: dict, hists: dict[str, dict], reports: dict[str, dict], run_id: str | None,
                title: str = "sparkdeep evaluation report") -> str:
    figs = figures(result, hists, reports)
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{m['auc']:.4f}</td><td>{m['accuracy']:.4f}</td>"
        f"<td>{curves(hists[name])['average_precision']:.4f}</td><td>{m['rows']:,}</td></tr>"
        for name, m in result["metrics"].items() if name in hists)
    counts = "".join(f"<tr><th>{html.escape(step)}</th><td style='text-align:left'>"
                     f"{html.escape(json.dumps(c))}</td></tr>" for step, c in result.get("row_counts", {}).items())
    sections: dict[str, list[str]] = {}
    for section, caption, fig in figs:
        sections.setdefault(section, []).append(
            f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{png(fig)}'>"
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    body = "".join(f"<h2>{html.escape(s)}</h2><div class='grid'>{''.join(items)}</div>" for s, items in sections.items())
    made = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class='meta'>run {html.escape(str(run_id))} &middot; written {made}</p>"
            f"<h2>Metrics</h2><table><tr><th>model</th><th>AUC</th><th>accuracy</th><th>average precision</th>"
            f"<th>rows</th></tr>{rows}</table>"
            f"<h2>Rows per step</h2><table>{counts}</table>{body}</body></html>")
