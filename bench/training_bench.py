"""Horovod Keras estimator benchmarks: feed, scaling, launch overhead, scoring.

All ratios are measured side by side in this one run:

- feed: steps/s of the rank's input path (Parquet shard -> numpy via Arrow -> tf.data
  with shuffle and prefetch) / steps/s of the same loop fed from numpy already in memory;
  same model, batch size and threads, one process, no Horovod.
- scaling: samples/s with 2 ranks / (2 x samples/s with 1 rank), one intra-op thread per
  rank so both runs get one core per rank; epochs after the first.
- launch overhead: fit wall time minus in-loop training time, as a share of a 2-minute job.
- scoring: rows/s of KerasHorovodModel.transform / rows/s of keras model.predict on the
  same numpy array.

    .venv/bin/python bench/training_bench.py [--rows 400000] [--features 32]

Writes bench/results/training.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import _results  # bench/_results.py (the script folder is on sys.path)


def feed_ratio(rows, features, batch, epochs=2):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    from sparkdeep.transformers._rank_training import read_shard
    from sparkdeep.transformers.keras_models import mlp_binary_classifier

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x[:, 0] + 0.5 * rng.normal(size=rows) > 0).astype("float32")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "shard.parquet")
        flat = pa.array(x.ravel())
        lists = pa.FixedSizeListArray.from_arrays(flat, features).cast(pa.list_(pa.float32()))
        pq.write_table(pa.table({"features": lists, "label": pa.array(y)}), path)

        def run(source):
            import keras
            model = mlp_binary_classifier(features, hidden_units=(64, 32), dropout=0.0)
            opt = keras.optimizers.Adam(0.001)
            loss_fn = keras.losses.get("binary_crossentropy")

            @tf.function
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(loss_fn(yb[:, None], model(xb, training=True)))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            t0 = time.perf_counter()
            xs, ys = source()
            ds = (tf.data.Dataset.from_tensor_slices((xs, ys)).shuffle(len(ys), seed=1)
                  .repeat().batch(batch).prefetch(tf.data.AUTOTUNE))
            it = iter(ds)
            steps = epochs * (len(ys) // batch)
            step(*next(it))  # trace outside the timing of both variants alike
            t1 = time.perf_counter()
            for _ in range(steps):
                step(*next(it))
            t2 = time.perf_counter()
            return steps / (t2 - t1), steps / (t2 - t0)

        # Alternate the two and keep each one's best, so neither pays the warm-up alone.
        mem_sps, _ = run(lambda: (x, y))
        shard_sps, shard_sps_incl_read = run(lambda: read_shard(path, "features", "label", None)[:2])
        mem_sps = max(mem_sps, run(lambda: (x, y))[0])
        again = run(lambda: read_shard(path, "features", "label", None)[:2])
        shard_sps, shard_sps_incl_read = max(shard_sps, again[0]), max(shard_sps_incl_read, again[1])
    return {"shard_steps_per_s": round(shard_sps, 1), "memory_steps_per_s": round(mem_sps, 1),
            "ratio": round(shard_sps / mem_sps, 3),
            "shard_steps_per_s_including_read": round(shard_sps_incl_read, 1)}


def run_training_benches(df, args, results, KerasHorovodEstimator):
    def fit(num_proc, accumulation=1):
        est = KerasHorovodEstimator(numProc=num_proc, epochs=args.epochs, batchSize=args.batch,
                                    accumulationSteps=accumulation,
                                    learningRate=0.001, scaleLearningRate=False, warmupEpochs=0.0,
                                    modelArgs={"hidden_units": [64, 32], "dropout": 0.0})
        t0 = time.time()
        model = est.fit(df)
        return model, time.time() - t0

    one, wall_one = fit(1)
    two, wall_two = fit(2)

    def sps(model):
        hist = model.trainingSummary["history"][1:]
        return float(np.mean([h["samples_per_s"] for h in hist]))

    s1, s2 = sps(one), sps(two)
    accumulated, _ = fit(2, accumulation=8)
    s2k = sps(accumulated)
    breakdown = {k: round(float(np.sum([h[k] for h in two.trainingSummary["history"]])), 3)
                 for k in ("input_s", "compute_s", "allreduce_s")}
    results["scaling"] = {"samples_per_s_1_rank": round(s1, 1), "samples_per_s_2_ranks": round(s2, 1),
                          "ratio": round(s2 / (2 * s1), 3), "two_rank_time_breakdown_s": breakdown,
                          "samples_per_s_2_ranks_accumulation_8": round(s2k, 1),
                          "ratio_with_accumulation_8": round(s2k / (2 * s1), 3)}
    print("scaling", results["scaling"], flush=True)

    t = two.trainingSummary["timings_s"]
    overhead = t["fit_total"] - t["training"]
    results["launch_overhead"] = {"fit_total_s": t["fit_total"], "training_s": t["training"],
                                  "staging_s": t["staging"], "launch_to_first_step_s": t["launch_to_first_step"],
                                  "overhead_s": round(overhead, 2),
                                  "share_of_2_minute_job": round(overhead / 120.0, 3)}
    print("launch", results["launch_overhead"], flush=True)

    return two


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--only", choices=["all", "scoring"], default="all",
                   help="scoring: only the scoring ratio, with an untrained network of the same shape")
    p.add_argument("--out", default=None, help="default: bench/results/training.json (training-scoring.json with --only scoring)")
    args = p.parse_args(argv)
    name = "training.json" if args.only == "all" else "training-scoring.json"
    args.out = args.out or os.path.join(os.path.dirname(__file__), "results", name)
    results: dict = {}

    if args.only == "all":
        results["feed"] = feed_ratio(min(args.rows, 200_000), args.features, args.batch)
        print("feed", results["feed"], flush=True)

    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    from sparkdeep.transformers._rank_training import keras_from_bytes
    from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator

    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": "8g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.task.maxFailures": "1", "spark.sql.shuffle.partitions": "4"}), app_name="bench-training").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cols = [F.randn(10 + j) for j in range(args.features)]
    df = spark.range(args.rows, numPartitions=4).select(F.array(*cols).alias("x"))
    df = df.select(array_to_vector("x").alias("features"),
                   (F.col("x")[0] + F.randn(99) * 0.5 > 0).cast("double").alias("label")).cache()
    df.count()

    if args.only == "all":
        two = run_training_benches(df, args, results, KerasHorovodEstimator)
    else:
        from sparkdeep.transformers._rank_training import keras_to_bytes
        from sparkdeep.transformers.keras_estimator import KerasHorovodModel
        from sparkdeep.transformers.keras_models import mlp_binary_classifier
        two = KerasHorovodModel(kerasBytes=keras_to_bytes(mlp_binary_classifier(args.features, (64, 32), 0.0)))

    # Scoring: the same rows as numpy through keras predict vs the Spark transform.
    net = keras_from_bytes(two.kerasBytes)
    from pyspark.ml.functions import vector_to_array
    x = np.stack(df.select(vector_to_array("features", "float32").alias("x")).toPandas()["x"].to_numpy())
    net.predict(x[:1000], verbose=0, batch_size=10000)
    t0 = time.perf_counter()
    net.predict(x, verbose=0, batch_size=10000)
    predict_rps = len(x) / (time.perf_counter() - t0)
    # Warm every Python worker (TensorFlow import + model load happen once per worker).
    two.transform(df).write.format("noop").mode("overwrite").save()
    t0 = time.perf_counter()
    two.transform(df).write.format("noop").mode("overwrite").save()
    transform_rps = args.rows / (time.perf_counter() - t0)
    results["scoring"] = {"transform_rows_per_s": round(transform_rps), "predict_rows_per_s": round(predict_rps),
                          "ratio": round(transform_rps / predict_rps, 3)}
    print("scoring", results["scoring"], flush=True)

    results["config"] = vars(args)
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _results.write(args.out, results)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
