"""Each model's held-out metric against its fit time, per shipped example (issue 26).

Reads finished runs' output folders (``make run DATASET=<name>`` writes
``output/<name>``; the default example writes ``output``), their
``reports/evaluate.json``: the gate metric of every model and its fit seconds, as the
evaluate step measured them on the same rows. Writes one plot per table beside a JSON of
the figures:

    .venv/bin/python bench/time_to_quality.py output output/diamonds_cut output/hmda ...

-> bench/results/time_to_quality.json and time_to_quality.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import _results  # bench/_results.py (the script folder is on sys.path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outputs", nargs="+", help="finished runs' output folders")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "time_to_quality"))
    args = ap.parse_args(argv)

    from matplotlib.figure import Figure

    from sparkdeep import tasks
    from sparkdeep.pipelines import report as rp
    tables = []
    for folder in args.outputs:
        path = os.path.join(folder, "reports", "evaluate.json")
        try:
            with open(path) as fh:
                result = json.load(fh)
        except OSError as e:
            print(f"{path}: no evaluate report ({e.strerror}); run the pipeline into {folder} first", file=sys.stderr)
            return 2
        metric, higher = tasks.gate_metric((result.get("gate") or {}).get("metric", ""), result["task"])
        models = {m: {"fit_s": result["fit_s"].get(m), metric: values.get(metric)}
                  for m, values in result["metrics"].items()}
        try:  # the data set's name, as ingest recorded it
            with open(os.path.join(folder, "reports", "ingest.json")) as fh:
                name = json.load(fh).get("dataset")
        except (OSError, ValueError):
            name = None
        tables.append({"table": name or os.path.basename(os.path.normpath(folder)), "task": result["task"],
                       "metric": metric, "higher_is_better": higher, "run_id": result.get("run_id"),
                       "rows_holdout": next(iter(result["metrics"].values())).get("rows"), "models": models})

    fig = Figure(figsize=(5.6 * len(tables), 4.0))
    for i, t in enumerate(tables, 1):
        rp.time_to_quality_figure({n: {t["metric"]: m[t["metric"]]} for n, m in t["models"].items()},
                                  {n: m["fit_s"] for n, m in t["models"].items()}, t["metric"], t["higher_is_better"],
                                  ax=fig.add_subplot(1, len(tables), i), title=f"{t['table']} ({t['task']})")
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=90)
    _results.write(args.out + ".json", {"tables": tables})
    for t in tables:
        order = sorted(t["models"], key=lambda n: -(t["models"][n][t["metric"]] or 0) if t["higher_is_better"]
                       else (t["models"][n][t["metric"]] or float("inf")))
        print(f"{t['table']:16s} " + "  ".join(f"{n} {t['models'][n][t['metric']]:.4f} ({t['models'][n]['fit_s']:.0f}s)"
                                               for n in order))
    print(f"wrote {args.out}.png and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
