"""Wide tables: the five steps at 20, 200, 2,000 and 10,000 columns, a fixed number of cells (issue 22).

**The data.** :func:`frame` generates a CSV export of ``cells / columns`` rows: a key
``row id``, a binary label ``y (target)`` that depends on a few columns, then 70% numeric
and 30% categorical columns (2 to 50 values), 5% nulls in each, named the way exports
name them (``x.GENE12``, ``weight kg 3``, ``Price (USD) 7``, ``größe_9``, ``cat.4 (code)``):
every name with a dot, a space or parentheses goes through ingest's name mapping.

**The run.** For each width one run of the pipeline, one step per process
(``sparkdeep.jobs.pipeline --steps <step>``, ``local[2]``), 1 epoch, the logistic baseline
only. Per step: wall time (the manifest's ``wall_s``) and peak resident memory of the
driver's Python process and of the JVM (``scale_bench.Sampler``).

**Planning.** After the run, in this process, the width's main queries are planned again
and their planning time read from Spark's ``QueryPlanningTracker`` (analysis,
optimisation, physical planning; code generation happens at execution and is in the step
times): ingest's row classification, the prepare model's transform of the training
table, and the saved scoring pipeline's transform of the holdout table.

**The network.** The tabular network for the width's embedding layout (from the prepare
report) is built and saved to ``.keras`` bytes and loaded back in safe mode, timed.
The report's size is that of ``reports/evaluate.html``.

    .venv/bin/python bench/wide_bench.py [--widths 20,200,2000,10000] [--cells 20000000]

Writes bench/results/wide.json and bench/results/wide.png. Ratios are against the
first width, measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _results  # bench/_results.py
from scale_bench import Sampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("ingest", "prepare", "train", "score", "evaluate")
STYLES = ("x.GENE{}", "weight kg {}", "Price (USD) {}", "größe_{}", "plain_{}")


def frame(rows: int, columns: int, seed: int = 22):
    """(pandas frame, DDL) of ``rows`` x ``columns`` features plus key and label."""
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(seed)
    n_num = max(1, round(columns * 0.7))
    n_cat = columns - n_num
    data = {"row id": np.arange(rows, dtype="int64")}
    x = rng.normal(size=(rows, n_num)).astype("float64")
    x[rng.random(x.shape) < 0.05] = np.nan
    for j in range(n_num):
        data[STYLES[j % len(STYLES)].format(j)] = x[:, j]
    cards = rng.integers(2, 51, size=n_cat)
    for j in range(n_cat):
        v = rng.integers(0, cards[j], size=rows).astype(object)
        v = np.array([f"v{i}" for i in v], dtype=object)
        v[rng.random(rows) < 0.05] = None
        data[f"cat.{j} (code)"] = v
    signal = np.nan_to_num(x[:, 0]) - np.nan_to_num(x[:, min(1, n_num - 1)])
    if n_cat:
        signal = signal + (data["cat.0 (code)"] == "v0")
    data["y (target)"] = (signal + rng.normal(scale=0.5, size=rows) > 0).astype("int64")
    pdf = pd.DataFrame(data)

    def kind(c):
        return {"i": "BIGINT", "f": "DOUBLE"}.get(pdf[c].dtype.kind, "STRING")
    return pdf, ", ".join("`" + c.replace("`", "``") + f"` {kind(c)}" for c in pdf.columns)


def write_spec(work: str, width: int, csv: str, ddl: str) -> str:
    import yaml
    path = os.path.join(work, f"wide{width}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump({"name": f"wide{width}", "source": {"format": "csv", "path": csv}, "schema": ddl,
                        "key": "row id", "label": {"column": "y (target)", "task": "binary"}}, fh)
    return path


def run_width(width: int, rows: int, work: str, driver_memory: str) -> dict:
    pdf, ddl = frame(rows, width)
    csv = os.path.join(work, f"wide{width}.csv")
    pdf.to_csv(csv, index=False)
    spec = write_spec(work, width, csv, ddl)
    out = os.path.join(work, f"out{width}")
    run_id = f"wide-{width}"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    sets = ["--set", "train.epochs=1", "--set", "baselines.models=[logistic_regression]",
            "--set", "tracking.enabled=false", "--set", f"spark.settings.spark.driver.memory={driver_memory}"]
    steps = {}
    for step in STEPS:
        cmd = [sys.executable, "-m", "sparkdeep.jobs.pipeline", "--env", "local", "--output-dir", out,
               "--run-id", run_id, "--dataset", spec, "--steps", step, *sets]
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = Sampler(proc.pid)
        log = proc.communicate()[0]
        memory = sampler.stop()
        if proc.returncode != 0:
            raise RuntimeError(f"{width} columns, {step} failed:\n{log[-3000:]}")
        with open(os.path.join(out, "runs", run_id, "manifest.json")) as fh:
            info = json.load(fh)["steps"][step]
        steps[step] = {"wall_s": info["wall_s"], "process_s": round(time.time() - t0, 1),
                       "peak_mib": {k: memory[k] for k in ("driver_python", "jvm")}}
        print(f"{width} columns: {step} {steps[step]}", flush=True)
    report = os.path.join(out, "reports", "evaluate.html")
    return {"rows": rows, "columns": width, "steps": steps, "spec": spec, "out": out,
            "report_bytes": os.path.getsize(report) if os.path.exists(report) else None}


def _planning_s(df) -> dict:
    """Spark's own planning phases for ``df``'s query, in seconds (forces the physical plan)."""
    qe = df._jdf.queryExecution()
    qe.executedPlan()
    phases = qe.tracker().phases()
    out = {}
    it = phases.iterator()
    while it.hasNext():
        kv = it.next()
        out[kv._1()] = round(kv._2().durationMs() / 1000.0, 3)
    return out


def planning(spark, entry: dict) -> dict:
    """Planning time of ingest's classification, prepare's transform and scoring, at this width."""
    from sparkdeep import delta_io, model_store
    from sparkdeep.config import load_config
    from sparkdeep.paths import Paths
    from sparkdeep.pipelines import ingest as ing
    cfg = load_config(os.path.join(ROOT, "conf"), env="local",
                      overrides=[f"data.dataset={entry['spec']}", f"output_dir={entry['out']}"])
    spec = cfg.dataset
    paths = Paths.under(cfg.output_dir)
    out = {}
    t0 = time.time()
    source = ing.read_source(spark, spec, None)
    cat, num, _ = ing.resolve_features(spec, source)
    plan = ing.label_plan(spec, source, ing.F.col(ing.CORRUPT).isNull())
    classified = ing.classify_rows(spec, source, cat, num, plan, renamed=ing.internal_names(spec, cat, num))
    out["ingest_classify"] = _planning_s(classified)
    out["ingest_classify"]["build_s"] = round(time.time() - t0, 3)
    runs = os.path.join(entry["out"], "models", "runs")
    run = sorted(os.listdir(runs))[-1]
    gen = sorted(os.listdir(os.path.join(runs, run)))[-1]
    folder = os.path.join(runs, run, gen)
    train = delta_io.read(spark, paths.table("train"))
    holdout = delta_io.read(spark, paths.table("holdout"))
    prep_model = model_store.load_pipeline(spark, os.path.join(folder, "prepare"))
    out["prepare_transform"] = _planning_s(prep_model.transform(train))
    scoring = model_store.load_pipeline(spark, os.path.join(folder, "pipeline"))
    out["score_transform"] = _planning_s(scoring.transform(holdout))
    return out


def network(entry: dict) -> dict:
    """Build, save and reload (safe mode) the tabular network of this width's layout."""
    from sparkdeep.transformers.keras import network
    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    with open(os.path.join(entry["out"], "reports", "prepare.json")) as fh:
        layout = json.load(fh).get("embedding_layout") or {}
    cards = layout.get("cardinalities") or []
    with open(os.path.join(entry["out"], "reports", "train.json")) as fh:
        numeric_dim = (json.load(fh).get("network", {}).get("layout") or {}).get("numeric_dim", 0)
    t0 = time.time()
    net = tabular_binary_classifier(numeric_dim + len(cards), numeric_dim, cards)
    t1 = time.time()
    data = network.keras_to_bytes(net)
    t2 = time.time()
    network.keras_from_bytes(data)
    t3 = time.time()
    return {"index_columns": len(cards), "numeric_dim": numeric_dim, "layers": len(net.layers),
            "build_s": round(t1 - t0, 2), "save_s": round(t2 - t1, 2), "load_s": round(t3 - t2, 2),
            "keras_bytes": len(data)}


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    widths = sorted(int(k) for k in results["widths"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for step in STEPS:
        a.plot(widths, [results["widths"][str(w)]["steps"][step]["wall_s"] for w in widths], "o-", label=step)
    a.set(xlabel="columns (fixed cells)", ylabel="wall s", title="step time against width", xscale="log")
    a.legend(fontsize=8)
    for q in ("ingest_classify", "prepare_transform", "score_transform"):
        b.plot(widths, [sum(v for k, v in results["widths"][str(w)]["planning_s"][q].items() if k != "build_s")
                        for w in widths], "o-", label=q)
    b.set(xlabel="columns (fixed cells)", ylabel="planning s", title="Spark planning per query", xscale="log")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="20,200,2000,10000")
    p.add_argument("--cells", type=int, default=20_000_000)
    p.add_argument("--work", default="/tmp/sparkdeep-wide")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "wide.json"))
    p.add_argument("--resume", action="store_true",
                   help="keep the widths --out already holds (their runs' outputs must still be under --work)")
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    os.makedirs(args.work, exist_ok=True)
    results: dict = {"config": vars(args), "widths": {}}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as fh:
            results["widths"] = json.load(fh).get("widths", {})
    for w in widths:
        if str(w) in results["widths"]:
            continue
        entry = run_width(w, max(100, args.cells // w), args.work, args.driver_memory)
        results["widths"][str(w)] = entry
        _results.write(args.out, results)

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false"}), app_name="wide-planning").getOrCreate()
    for w in widths:
        entry = results["widths"][str(w)]
        entry["planning_s"] = planning(spark, entry)
        entry["network"] = network(entry)
        print(f"{w} columns: planning {entry['planning_s']}; network {entry['network']}", flush=True)
        _results.write(args.out, results)
    spark.stop()
    base = results["widths"][str(widths[0])]
    for w in widths[1:]:
        entry = results["widths"][str(w)]
        entry["vs_first"] = {s: round(entry["steps"][s]["wall_s"] / base["steps"][s]["wall_s"], 2) for s in STEPS}
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _results.write(args.out, results)
    if len(widths) > 1:
        plot(results, os.path.splitext(args.out)[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
