"""Smaller variants of a fitted network (issue 27), each against the original.

One binary example: ``--rows`` training rows (and a quarter as many held out) of
``--width`` Gaussian features with a nonlinear label, a ReLU MLP (``--hidden``, default
256, 128) fitted here with ``model.fit`` for a few epochs, in a scoring pipeline
(``VectorAssembler`` + the network). Its variants, through ``pipelines/compress.py``:
int8, int4, float8, bfloat16 (post-training quantization), prune (50% of each Dense kernel,
fine-tuned ``--fine-tune-epochs`` on ``--num-proc`` ranks), distill (a student of half the
widths, trained on the ranks on 0.5 * label + 0.5 * the teacher's probability). For each:
the ``.keras`` size (and gzip'd), parameters, rows/s through the pipeline's ``transform``
(Spark ``local[2]``) and through ``model.predict`` (numpy, batch 1024), the peak RSS that
loading and predicting added, held-out AUC and its difference.

    .venv/bin/python bench/compress_bench.py [--rows 40000] [--width 32] [--num-proc 1]

Writes bench/results/compress.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _rows(n: int, width: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, width))
    score = x[:, 0] - 0.8 * x[:, 1] + 0.6 * x[:, 2] * x[:, 3] + 0.4 * np.sin(2 * x[:, 4]) + 0.5 * rng.normal(size=n)
    return x, (score > 0).astype("float64")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    p.add_argument("--epochs", type=int, default=6, help="the original's epochs (model.fit)")
    p.add_argument("--variants", nargs="+", default=["int8", "int4", "float8", "bfloat16", "prune", "distill"])
    p.add_argument("--fine-tune-epochs", type=int, default=2)
    p.add_argument("--distill-epochs", type=int, default=6)
    p.add_argument("--num-proc", type=int, default=1)
    p.add_argument("--out", default=os.path.join(HERE, "results", "compress.json"))
    args = p.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdeep.config import SparkConfig
    from sparkdeep.pipelines import compress as cp
    from sparkdeep.session import builder
    from sparkdeep.transformers.keras.model import DistributedKerasModel
    from sparkdeep.transformers.keras.network import keras_to_bytes
    from sparkdeep.transformers.keras_models import mlp_binary_classifier

    tmp = tempfile.mkdtemp(prefix="compress-bench-")
    spark = builder(SparkConfig(master="local[2]", app_name="compress-bench", settings={
        "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4", "spark.driver.memory": "4g",
        "spark.local.dir": os.path.join(tmp, "local")})).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cols = [f"x{i}" for i in range(args.width)]
    frames = {}
    for name, (n, seed) in {"train": (args.rows, 1), "holdout": (args.rows // 4, 2)}.items():
        x, y = _rows(n, args.width, seed)
        pdf = {"row_id": np.arange(n), **{c: x[:, i] for i, c in enumerate(cols)}, "label": y}
        import pandas as pd
        frames[name] = spark.createDataFrame(pd.DataFrame(pdf)).cache()
    keras.utils.set_random_seed(1)
    net = mlp_binary_classifier(args.width, hidden_units=args.hidden, dropout=0.1)
    net.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    x, y = _rows(args.rows, args.width, 1)
    t0 = time.perf_counter()
    net.fit(x.astype("float32"), y.astype("float32"), epochs=args.epochs, batch_size=256, verbose=0)
    fit_s = time.perf_counter() - t0
    # Saved as the ranks save it: the network alone (a compiled model's file also holds Adam's state).
    from sparkdeep.transformers.keras.network import keras_from_bytes
    stage = DistributedKerasModel(kerasBytes=keras_to_bytes(keras_from_bytes(keras_to_bytes(net))),
                              trainingSummary={"task": "binary"})
    stage._set(task="binary")
    original = PipelineModel([VectorAssembler(inputCols=cols, outputCol="features"), stage])

    class _Cfg:  # the compress config's fields the variants read
        sparsity, fine_tune_epochs, alpha = 0.5, args.fine_tune_epochs, 0.5
        student_units, distill_epochs = (), args.distill_epochs

    holdout = frames["holdout"]
    xh = np.asarray(_rows(args.rows // 4, args.width, 2)[0], dtype="float32")
    train_rows = cp.features_of(original, frames["train"]).select("features", "label")
    rows = []
    path = os.path.join(tmp, "original")
    original.write().save(path)
    rows.append(cp.measure("original", original, path, holdout, xh, key="row_id", task="binary", classes=None))
    for name in args.variants:
        t0 = time.perf_counter()
        lr = 1e-4 if name == "prune" else 1e-3
        variant = cp.build_variant(name, stage, train_rows, _Cfg,
                                   {"numProc": args.num_proc, "batchSize": 256, "seed": 1, "learningRate": lr})
        build_s = time.perf_counter() - t0
        pipeline = cp.with_network(original, variant)
        path = os.path.join(tmp, name)
        pipeline.write().save(path)
        row = cp.measure(name, PipelineModel.load(path), path, holdout, xh, key="row_id", task="binary",
                         classes=None)
        rows.append({**row, "build_s": round(build_s, 2)})
        print(name, row["keras_bytes"], row["metrics"].get("auc"), flush=True)
    base = rows[0]["metrics"]["auc"]
    for r in rows:
        r["metric"], r["metric_difference"] = "auc", r["metrics"]["auc"] - base
        for k in ("keras_bytes", "parameters", "transform_rows_per_s", "predict_rows_per_s"):
            r[f"{k}_ratio"] = round(r[k] / rows[0][k], 3)
        r.pop("path", None)
    report = {"task": "binary", "metric": "auc", "variants": rows, "original_fit_s": round(fit_s, 1),
              "holdout_rows": args.rows // 4, "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    print(cp.table(report))
    spark.stop()
    return _results.finish(args.out, report, args)


if __name__ == "__main__":
    sys.exit(main())
