"""The suite's scoreboard: every table's held-out metric per model (mean over its seeds,
with their spread), normalised per table (0 = the worst model there, 1 = the best), ranks,
fit seconds, and the network against the best tree.

    .venv/bin/python bench/suite/scoreboard.py        # after bench/suite/run.py

Reads ``bench/results/suite/*.json``; writes ``bench/results/suite.md`` (the tables) and
``bench/results/suite.png`` (normalised scores per table), and prints the summary.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(os.path.dirname(HERE), "results")
NETWORK = "keras_horovod"
TREES = ("lightgbm", "xgboost", "gbt", "random_forest")
MLLIB = ("logistic_regression", "linear_regression", "gbt", "random_forest")
#: The columns of the scoreboard: the network, the two boosting libraries, MLlib's best.
SHOWN = (NETWORK, "lightgbm", "xgboost", "mllib_best")


def load(folder: str) -> dict[str, list[dict]]:
    """Every finished result, by table."""
    out: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as fh:
            r = json.load(fh)
        out.setdefault(r["table"], []).append(r)
    return out


def table_row(runs: list[dict]) -> dict:
    """One table's figures over its seeds: each model's mean and spread, fit seconds."""
    models: dict[str, list[float]] = {}
    fits: dict[str, list[float]] = {}
    for r in runs:
        scores = dict(r["models"])
        mllib = {k: v for k, v in scores.items() if k in MLLIB}
        if mllib:
            best = max(mllib, key=mllib.get)
            scores["mllib_best"] = mllib[best]
            r.setdefault("fit_s", {})["mllib_best"] = r["fit_s"].get(best)
        for k, v in scores.items():
            models.setdefault(k, []).append(float(v))
        for k, v in (r.get("fit_s") or {}).items():
            if v is not None:
                fits.setdefault(k, []).append(float(v))
    mean = {k: statistics.fmean(v) for k, v in models.items()}
    spread = {k: (statistics.stdev(v) if len(v) > 1 else None) for k, v in models.items()}
    shown = {k: mean[k] for k in SHOWN if k in mean}
    lo, hi = min(shown.values()), max(shown.values())
    normalised = {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in shown.items()}
    order = sorted(shown, key=shown.get, reverse=True)
    trees = {k: mean[k] for k in TREES if k in mean}
    best_tree = max(trees, key=trees.get) if trees else None
    first = runs[0]
    return {"task": first["task"], "metric": first["metric"], "rows": first["train_rows"] + first["holdout_rows"],
            "seeds": len(runs), "mean": mean, "spread": spread, "normalised": normalised,
            "rank": {k: order.index(k) + 1 for k in order},
            "fit_s": {k: statistics.fmean(v) for k, v in fits.items()},
            "best_tree": best_tree,
            "network_minus_best_tree": (mean[NETWORK] - trees[best_tree]) if best_tree and NETWORK in mean else None}


def summary(rows: dict[str, dict]) -> dict:
    """Median normalised score and rank per model; the network against the best tree."""
    out = {"tables": len(rows), "median_normalised": {}, "median_rank": {}}
    for k in SHOWN:
        got = [r["normalised"][k] for r in rows.values() if k in r["normalised"]]
        if got:
            out["median_normalised"][k] = statistics.median(got)
            out["median_rank"][k] = statistics.median(r["rank"][k] for r in rows.values() if k in r["rank"])
    gaps = {t: r["network_minus_best_tree"] for t, r in rows.items() if r["network_minus_best_tree"] is not None}
    if gaps:
        worst = min(gaps, key=gaps.get)
        out.update(median_gap=statistics.median(gaps.values()), worst_gap=gaps[worst], worst_table=worst,
                   network_wins=sum(1 for g in gaps.values() if g > 0), gaps=gaps)
    return out


def _fmt(v, spread=None) -> str:
    if v is None:
        return ""
    return f"{v:.4f}" + (f" ±{spread:.4f}" if spread else "")


def markdown(rows: dict[str, dict], s: dict) -> str:
    head = ["table", "task (metric)", "rows", "seeds", "network", "LightGBM", "XGBoost", "MLlib's best",
            "network - best tree", "fit s: network / LightGBM / XGBoost"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for t, r in sorted(rows.items()):
        cells = [_fmt(r["mean"].get(k), r["spread"].get(k)) for k in SHOWN]
        gap = r["network_minus_best_tree"]
        fit = " / ".join(f"{r['fit_s'][k]:.1f}" if k in r["fit_s"] else "-" for k in (NETWORK, "lightgbm", "xgboost"))
        lines.append("| " + " | ".join([t, f"{r['task']} ({r['metric']})", f"{r['rows']:,}", str(r["seeds"]), *cells,
                                        f"{gap:+.4f} ({r['best_tree']})" if gap is not None else "", fit]) + " |")
    lines += ["", "| model | median normalised score | median rank |", "| --- | --- | --- |"]
    for k in SHOWN:
        if k in s["median_normalised"]:
            lines.append(f"| {k} | {s['median_normalised'][k]:.3f} | {s['median_rank'][k]:g} |")
    if "median_gap" in s:
        lines += ["", f"Network minus the best tree over {len(s['gaps'])} tables: median {s['median_gap']:+.4f}, "
                      f"worst {s['worst_gap']:+.4f} ({s['worst_table']}); the network ahead on {s['network_wins']}."]
    return "\n".join(lines) + "\n"


def plot(rows: dict[str, dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(names)), 4.0))
    width = 0.8 / len(SHOWN)
    for i, k in enumerate(SHOWN):
        ax.bar([j + i * width for j in range(len(names))], [rows[t]["normalised"].get(k, 0.0) for t in names],
               width, label=k)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=60, ha="right")
    ax.set_ylabel("normalised held-out score (per table)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=os.path.join(RESULTS, "suite"))
    p.add_argument("--out", default=os.path.join(RESULTS, "suite"))
    args = p.parse_args(argv)
    runs = load(args.results)
    if not runs:
        print(f"no results under {args.results}: run bench/suite/run.py first", file=sys.stderr)
        return 1
    rows = {t: table_row(r) for t, r in runs.items()}
    s = summary(rows)
    text = markdown(rows, s)
    with open(args.out + ".md", "w") as fh:
        fh.write(text)
    with open(args.out + ".json", "w") as fh:
        json.dump({"tables": rows, "summary": s}, fh, indent=1)
    plot(rows, args.out + ".png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
