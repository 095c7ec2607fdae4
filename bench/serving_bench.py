"""Serving (issue 27): the HTTP scorer under load, beside the floor of its model alone.

One export, built here: a binary pipeline as prepare fits it with the default settings
(embedding encoding, no PCA, every feature kept) on ``spark.range`` rows of ``--numeric``
numeric and ``--categorical`` categorical columns, ending in the default tabular network
(``hidden_units (256, 128)``) with seeded random weights (the cost does not depend on the
weights). Then, with Spark stopped:

- floor, in this process: the network's ``model.predict`` on numpy features (already
  assembled and standardised, float32), its eager call ``model(x)``,
  ``ExportedModel.predict`` on a pandas DataFrame of raw rows (the whole export, eager),
  and the server's ``Scorer.score`` on the same rows as dicts (the export as one traced
  graph, no HTTP), for 1 and 64 rows, median of ``--repeat`` calls;
- the server (``python -m sparkdeep.jobs.serve``, a subprocess, default batching) on
  127.0.0.1: latency (p50/p99) of 1-row and 64-row requests from one client, one after
  another; then rows/s at saturation with 1, 8 and 32 clients (threads, one keep-alive
  ``http.client`` connection each) sending 1-row and 64-row requests for ``--seconds``
  each, with the mean rows per forward pass the server reports (``/health``);
- the server's peak RSS (``VmHWM``) at the end.

Clients and server share the machine's cores: the figures at 8 and 32 clients include
the clients' own Python. Run:

    .venv/bin/python bench/serving_bench.py [--seconds 5] [--numeric 20] [--categorical 3]

Writes bench/results/serving.json and prints a table.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import _results  # bench/_results.py (the script folder is on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARDINALITIES = (12, 6, 40, 25, 9)


def build_export(out_dir: str, numeric: int, categorical: int, rows: int) -> tuple[dict, list[dict]]:
    """Fit the prepare pipeline on Spark, end it in a random default network, export it;
    returns the export's schema and some raw rows (source names) to send."""
    import keras
    from pyspark.sql import functions as F

    from sparkdeep.config import SparkConfig
    from sparkdeep.pipelines import export, prepare
    from sparkdeep.pipelines.train import scoring_pipeline
    from sparkdeep.session import builder
    from sparkdeep.transformers.keras import network
    from sparkdeep.transformers.keras.model import DistributedKerasModel
    from sparkdeep.transformers.keras_models import tabular_binary_classifier

    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": "2g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4"}), app_name="bench-serving").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        nums = [F.randn(10 + j).alias(f"x{j}") for j in range(numeric)]
        cats = [F.concat(F.lit(f"v{k}_"), F.pmod(F.xxhash64("id", F.lit(k)), F.lit(CARDINALITIES[k % 5])).cast("string"))
                .alias(f"c{k}") for k in range(categorical)]
        raw = spark.range(rows, numPartitions=2).select("id", *cats, *nums)
        raw = raw.withColumn("label", (F.col("x0") + F.randn(99) > 0).cast("double")).cache()
        front = prepare.build_prepare_pipeline(
            task="binary", categorical=[f"c{k}" for k in range(categorical)], numeric=[f"x{j}" for j in range(numeric)],
            key="id", majority_ratio=0.0, selector_top_fraction=1.0, pca_k=0, seed=1, encoding="embedding",
            pca=False).fit(raw)
        layout = prepare.network_layout(front, front.transform(raw))
        width = layout["numeric_dim"] + len(layout["cardinalities"])
        keras.utils.set_random_seed(3)
        net = tabular_binary_classifier(width, numeric_dim=layout["numeric_dim"], cardinalities=layout["cardinalities"],
                                        hidden_units=(256, 128))
        stage = DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))
        stage._set(task="binary")
        info = export.export_pipeline(scoring_pipeline(front, stage), out_dir, raw_schema=raw.schema)
        sample = [r.asDict() for r in raw.limit(512).collect()]
        prepared = np.array([r[0] for r in front.transform(raw.limit(512)).select(prepare.FEATURES).collect()],
                            dtype="float32")
        np.save(os.path.join(out_dir, "..", "features.npy"), prepared)
    finally:
        spark.stop()
    return info, sample


def floor(export_dir: str, sample: list[dict], repeat: int) -> dict:
    """Seconds per call of the model alone, in this process (median of ``repeat``)."""
    import pandas as pd

    from sparkdeep.pipelines.export import load_export
    from sparkdeep.pipelines.scoring import Scorer
    exported = load_export(export_dir)
    feats = np.load(os.path.join(export_dir, "..", "features.npy"))
    net = _network(exported.model)
    scorer = Scorer(exported)
    out = {}
    for n in (1, 64):
        x = feats[:n]
        frame = pd.DataFrame(sample[:n])
        rows = sample[:n]
        for name, fn in (("keras_predict_numpy", lambda: net.predict(x, verbose=0)),
                         ("keras_call_numpy", lambda: net(x, training=False)),
                         ("exported_predict_dataframe", lambda: exported.predict(frame)),
                         ("server_scorer_no_http", lambda: scorer.score(rows))):
            fn()
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            med = float(np.median(times))
            out.setdefault(name, {})[f"{n}_rows"] = {"p50_ms": round(med * 1000, 3), "rows_s": round(n / med, 1)}
    return out


def _network(model):
    """The trained network inside the export's graph (the one layer that is a Model)."""
    import keras
    nets = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if len(nets) != 1:
        raise RuntimeError(f"expected one network inside the export, found {len(nets)}")
    return nets[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One keep-alive connection."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, body: bytes) -> float:
        t0 = time.perf_counter()
        self.conn.request("POST", "/predict", body=body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}: {data[:300]!r}")
        return time.perf_counter() - t0

    def get(self, path: str) -> dict:
        self.conn.request("GET", path)
        return json.loads(self.conn.getresponse().read())


def latency(port: int, body: bytes, count: int) -> dict:
    c = Client(port)
    for _ in range(5):
        c.post(body)
    t = np.array([c.post(body) for _ in range(count)]) * 1000
    return {"requests": count, "p50_ms": round(float(np.percentile(t, 50)), 3),
            "p99_ms": round(float(np.percentile(t, 99)), 3), "mean_ms": round(float(t.mean()), 3)}


def saturation(port: int, body: bytes, rows: int, clients: int, seconds: float) -> dict:
    """Requests from ``clients`` threads for ``seconds``: rows/s, latency, rows per batch."""
    before = Client(port).get("/health")
    times: list[list[float]] = [[] for _ in range(clients)]
    errors: list[Exception] = []
    start = threading.Barrier(clients + 1)
    stop = time.perf_counter() + seconds + 1e9  # set for real once every client is ready

    def run(k):
        c = Client(port)
        try:
            c.post(body)
            start.wait()
            while time.perf_counter() < stop:
                times[k].append(c.post(body))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    stop = t0 + seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    after = Client(port).get("/health")  # a new connection: an idle one is closed after 5 s
    done = sum(len(t) for t in times)
    lat = np.array([x for t in times for x in t]) * 1000
    batches = after["batches"] - before["batches"]
    return {"clients": clients, "rows_per_request": rows, "requests": done, "wall_s": round(wall, 2),
            "rows_s": round(done * rows / wall, 1), "requests_s": round(done / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 3), "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "mean_rows_per_batch": round((after["rows"] - before["rows"]) / max(batches, 1), 1)}


def peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numeric", type=int, default=20)
    p.add_argument("--categorical", type=int, default=3)
    p.add_argument("--fit-rows", type=int, default=5_000)
    p.add_argument("--seconds", type=float, default=5.0, help="each saturation run")
    p.add_argument("--requests", type=int, default=300, help="sequential requests per latency figure")
    p.add_argument("--repeat", type=int, default=50, help="calls per floor figure")
    p.add_argument("--max-batch-rows", type=int, default=None, help="the server's (default: its own)")
    p.add_argument("--max-wait-ms", type=float, default=None, help="the server's (default: its own)")
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "serving.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    t_start = time.time()
    work = tempfile.mkdtemp(prefix="serving-bench-")
    export_dir = os.path.join(work, "export", "bench")
    info, sample = build_export(export_dir, args.numeric, args.categorical, args.fit_rows)
    print(f"export: {len(info['inputs'])} raw inputs, network {info['network']} ({time.time() - t_start:.0f}s)",
          flush=True)
    for r in sample:  # the key and the label are accepted and ignored; sent as a client would
        r.pop("label", None)
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "platform": platform.platform()},
               "export": {"inputs": len(info["inputs"]), "network": info["network"], "task": info["task"]},
               "floor": floor(export_dir, sample, args.repeat)}
    port = free_port()
    cmd = [sys.executable, "-m", "sparkdeep.jobs.serve", "--export", export_dir, "--port", str(port), "-q"]
    if args.max_batch_rows:
        cmd += ["--max-batch-rows", str(args.max_batch_rows)]
    if args.max_wait_ms is not None:
        cmd += ["--max-wait-ms", str(args.max_wait_ms)]
    server = subprocess.Popen(cmd, cwd=REPO)
    try:
        t0 = time.time()
        while True:
            try:
                if Client(port).get("/health").get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            if server.poll() is not None or time.time() - t0 > 120:
                raise RuntimeError("the server did not start")
            time.sleep(0.2)
        results["server_start_s"] = round(time.time() - t0, 1)
        bodies = {n: json.dumps({"rows": sample[:n]}).encode() for n in (1, 64)}
        results["latency"] = {f"{n}_rows": latency(port, bodies[n], args.requests if n == 1 else args.requests // 2)
                              for n in (1, 64)}
        results["saturation"] = [saturation(port, bodies[n], n, c, args.seconds) for n in (1, 64) for c in (1, 8, 32)]
        results["server_peak_rss_mb"] = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        results["server_exit"] = server.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    results["wall_s"] = round(time.time() - t_start, 1)
    print_table(results)
    return _results.finish(args.out, results, args)


def print_table(r: dict) -> None:
    print("\nfloor (this process), median ms per call / rows/s:")
    for name, by in r["floor"].items():
        print(f"  {name:28s} " + "  ".join(f"{k}: {v['p50_ms']:8.2f} ms {v['rows_s']:10.0f} rows/s"
                                           for k, v in by.items()))
    print("server latency, one client, one request at a time:")
    for k, v in r["latency"].items():
        print(f"  {k:8s} p50 {v['p50_ms']:7.2f} ms  p99 {v['p99_ms']:7.2f} ms")
    print("server at saturation:")
    print(f"  {'rows/req':>8s} {'clients':>7s} {'rows/s':>9s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} "
          f"{'rows/batch':>10s}")
    for s in r["saturation"]:
        print(f"  {s['rows_per_request']:8d} {s['clients']:7d} {s['rows_s']:9.0f} {s['requests_s']:8.0f} "
              f"{s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {s['mean_rows_per_batch']:10.1f}")
    print(f"server peak RSS: {r['server_peak_rss_mb']} MB; start {r['server_start_s']} s; exit {r['server_exit']}")


if __name__ == "__main__":
    sys.exit(main())
