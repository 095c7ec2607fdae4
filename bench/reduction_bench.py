"""Reduction stages vs the plain MLlib stage each extends, and PCA vs numpy.

Ratios are measured side by side in one run on the same cached DataFrame (generated on
Spark), fit + transform + a count to force the work; each pair is timed best-of-N with
the two orders alternated so neither gets a warmer cache. Run:

    .venv/bin/python bench/reduction_bench.py [--rows 1000000] [--features 100] [--repeat 2]
    .venv/bin/python bench/reduction_bench.py --only samplers [--repeat 5]

Writes bench/results/reduction.json (``--only samplers``: reduction-samplers.json, the three
sampler pairs, the same with ``keyCols=["id"]``, and where their time goes) and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import _results  # bench/_results.py (the script folder is on sys.path)


def timed(fn, repeat):
    """Best wall seconds and best CPU seconds of the Spark JVM (driver and executors, in local
    mode) over ``repeat`` runs. The CPU time holds while another job shares the cores; the
    wall time of a long run does not (it is the likelier to be slowed)."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        c0, t0 = jvm_cpu_seconds(), time.perf_counter()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, jvm_cpu_seconds() - c0)
    return wall, cpu


def jvm_cpu_seconds() -> float:
    """User + system CPU seconds of the Spark JVM so far (Linux /proc; 0 elsewhere)."""
    from pyspark import SparkContext
    pid = SparkContext._active_spark_context._jvm.java.lang.ProcessHandle.current().pid()
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pair(name, ours, baseline, repeat, results):
    a, a_cpu = timed(ours, repeat)
    b, b_cpu = timed(baseline, repeat)
    # Second round in the other order, keep the best of each.
    b, b_cpu = (min(x, y) for x, y in zip((b, b_cpu), timed(baseline, 1)))
    a, a_cpu = (min(x, y) for x, y in zip((a, a_cpu), timed(ours, 1)))
    results.append({"stage": name, "ours_s": round(a, 3), "mllib_s": round(b, 3), "ratio": round(a / b, 3),
                    "ours_cpu_s": round(a_cpu, 3), "mllib_cpu_s": round(b_cpu, 3),
                    "cpu_ratio": round(a_cpu / b_cpu, 3) if b_cpu else None})
    print(f"{name:52s} ours {a:6.2f}s  mllib {b:6.2f}s  ratio {a / b:5.2f}  (JVM CPU {a_cpu:5.2f}s / "
          f"{b_cpu:5.2f}s)", flush=True)


def generate(spark, rows, features, seed=1, partitions=4):
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    cols = [F.randn(seed + j) for j in range(features)]
    df = spark.range(rows, numPartitions=partitions).select(
        "id", F.array(*cols).alias("x"))
    score = sum(F.col("x")[j] * (1.0 / (j + 1)) for j in range(min(10, features)))
    df = df.select("id", array_to_vector("x").alias("features"),
                   (score + F.randn(seed + 999) > 1.0).cast("double").alias("label"),
                   (F.col("id") % 7).cast("int").alias("stratum"))
    return df.cache()


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--importance-rows", type=int, default=200_000,
                   help="random forests are slow on 2 cores: their pair runs on a sample")
    p.add_argument("--pca-wide-rows", type=int, default=200_000)
    p.add_argument("--pca-wide-features", type=int, default=1000)
    p.add_argument("--only", choices=["all", "samplers"], default="all")
    p.add_argument("--out", default=None,
                   help="default: bench/results/reduction.json (reduction-samplers.json with --only samplers)")
    args = p.parse_args(argv)
    name = {"all": "reduction.json", "samplers": "reduction-samplers.json"}[args.only]
    out_path = args.out or os.path.join(os.path.dirname(__file__), "results", name)

    from pyspark.ml.feature import PCA, UnivariateFeatureSelector, VarianceThresholdSelector, VectorSlicer
    from pyspark.ml.classification import RandomForestClassifier
    from pyspark.ml.stat import Correlation

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    from sparkdeep.transformers.pca import CenteredPCA
    from sparkdeep.transformers.selection import (CorrelationSelector, ModelImportanceSelector,
                                                  UnivariateSelector, VarianceSelector)

    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": "14g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.driver.maxResultSize": "0", "spark.sql.shuffle.partitions": "4",
        "spark.sql.execution.arrow.pyspark.enabled": "true"}), app_name="bench-reduction").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = generate(spark, args.rows, args.features)
    n = df.count()
    print(f"data: {n} rows x {args.features} features, cached", flush=True)
    r = args.repeat
    results: list = []

    samplers = sampler_pairs(df, r, results, key_cols=[])
    if args.only == "samplers":
        sampler_pairs(df, r, results, key_cols=["id"])
        out = {"machine": {"cores": os.cpu_count(), "python": platform.python_version(), "master": "local[2]"},
               "rows": n, "features": args.features, "stages": results, "profile": sampler_profile(df, samplers, r),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _results.write(out_path, out)
        spark.stop()
        return 0
    pair("VarianceSelector vs VarianceThresholdSelector",
         lambda: VarianceSelector(varianceThreshold=0.5).fit(df).transform(df).count(),
         lambda: VarianceThresholdSelector(featuresCol="features", outputCol="selected", varianceThreshold=0.5)
         .fit(df).transform(df).count(), r, results)
    pair("UnivariateSelector vs UnivariateFeatureSelector",
         lambda: UnivariateSelector(selectionThreshold=20).fit(df).transform(df).count(),
         lambda: UnivariateFeatureSelector(featuresCol="features", outputCol="selected", labelCol="label",
                                           selectionMode="numTopFeatures").setFeatureType("continuous")
         .setLabelType("categorical").setSelectionThreshold(20).fit(df).transform(df).count(), r, results)
    pair("CorrelationSelector vs Correlation.corr + VectorSlicer",
         lambda: CorrelationSelector(maxCorrelation=0.9).fit(df).transform(df).count(),
         lambda: (Correlation.corr(df, "features").first(),
                  VectorSlicer(inputCol="features", outputCol="selected", indices=list(range(args.features)))
                  .transform(df).count()), r, results)
    small = df.limit(args.importance_rows).cache()
    small.count()
    pair(f"ModelImportanceSelector vs RandomForest ({args.importance_rows} rows)",
         lambda: ModelImportanceSelector(numTopFeatures=20, numTrees=10, seed=1).fit(small).transform(small).count(),
         lambda: RandomForestClassifier(numTrees=10, seed=1).fit(small).transform(small).count(), 1, results)
    small.unpersist()
    pair("CenteredPCA(k=10) vs PCA(k=10)",
         lambda: CenteredPCA(inputCol="features", outputCol="pcs", k=10).fit(df).transform(df).count(),
         lambda: PCA(k=10, inputCol="features", outputCol="pcs").fit(df).transform(df).count(), r, results)

    pca_vs_numpy = [pca_against_numpy(spark, df, "1M x 100" if n == 1_000_000 else f"{n} x {args.features}")]
    df.unpersist()
    wide = generate(spark, args.pca_wide_rows, args.pca_wide_features, seed=5)
    wide.count()
    pca_vs_numpy.append(pca_against_numpy(spark, wide, f"{args.pca_wide_rows} x {args.pca_wide_features}"))
    wide.unpersist()

    out = {"machine": {"cores": os.cpu_count(), "python": platform.python_version(), "master": "local[2]"},
           "rows": n, "features": args.features, "stages": results, "pca_vs_numpy": pca_vs_numpy,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _results.write(out_path, out)
    spark.stop()
    return 0


def sampler_pairs(df, repeat, results, key_cols):
    """The three samplers against ``df.sample``/``sampleBy``; returns the exact two, unfitted."""
    from sparkdeep.transformers.sampling import ClassBalanceSampler, StratifiedSampler, UniformSampler
    keyed = f", keyCols={key_cols}" if key_cols else ""
    pair(f"UniformSampler(fraction{keyed}) vs df.sample",
         lambda: UniformSampler(fraction=0.3, keyCols=key_cols).fit(df).sample(df).count(),
         lambda: df.sample(fraction=0.3, seed=1).count(), repeat, results)
    stratified = StratifiedSampler(stratumCol="stratum", fractions={str(s): 0.3 for s in range(7)}, keyCols=key_cols)
    pair(f"StratifiedSampler(exact{keyed}) vs sampleBy",
         lambda: stratified.fit(df).sample(df).count(),
         lambda: df.sampleBy("stratum", {s: 0.3 for s in range(7)}, seed=1).count(), repeat, results)
    counts = {row[0]: row[1] for row in df.groupBy("label").count().collect()}
    minority = min(counts.values())
    frac = {k: min(1.0, minority / v) for k, v in counts.items()}
    balanced = ClassBalanceSampler(labelCol="label", keyCols=key_cols)
    pair(f"ClassBalanceSampler(exact{keyed}) vs sampleBy",
         lambda: balanced.fit(df).sample(df).count(),
         lambda: df.sampleBy("label", frac, seed=1).count(), repeat, results)
    return {"StratifiedSampler": stratified, "ClassBalanceSampler": balanced}


def sampler_profile(df, samplers, repeat):
    """Where an exact sampler's time goes: its fit and its sample apart, against the floors
    (a count of the cached table; one filter on a hash of every column, which is what
    sampling costs; the same hash on the id alone), each as :func:`timed` gives it."""
    from pyspark.sql import functions as F

    from sparkdeep.transformers.sampling import hash_uniform, row_hash
    every = row_hash(df.columns, 42, df.schema)
    steps = {"count": lambda: df.count(),
             "filter on xxhash64(every column)": lambda: df.where(hash_uniform(every) < 0.3).count(),
             "filter on xxhash64(id)": lambda: df.where(hash_uniform(F.xxhash64("id")) < 0.3).count()}
    for name, sampler in samplers.items():
        model = sampler.fit(df)
        steps[f"{name} fit"] = lambda sampler=sampler: sampler.fit(df)
        steps[f"{name} sample + count"] = lambda model=model: model.sample(df).count()
    profile = {}
    for name, fn in steps.items():
        wall, cpu = timed(fn, repeat)
        profile[name] = {"wall_s": round(wall, 3), "jvm_cpu_s": round(cpu, 3)}
        print(f"{name:52s} wall {wall:6.2f}s  JVM CPU {cpu:6.2f}s", flush=True)
    return profile


def pca_against_numpy(spark, df, label):
    """CenteredPCA fit on Spark vs numpy cov + eigh on the same matrix collected to the driver."""
    from pyspark.ml.functions import vector_to_array

    from sparkdeep.transformers.pca import CenteredPCA
    t_spark, _ = timed(lambda: CenteredPCA(inputCol="features", outputCol="pcs", k=10).fit(df), 1)
    t0 = time.perf_counter()
    pdf = df.select(vector_to_array("features").alias("x")).toPandas()
    x = np.stack(pdf["x"].to_numpy())
    t_collect = time.perf_counter() - t0
    del pdf
    t0 = time.perf_counter()
    w, v = np.linalg.eigh(np.cov(x, rowvar=False))
    t_numpy = time.perf_counter() - t0
    del x
    row = {"data": label, "spark_fit_s": round(t_spark, 3), "numpy_cov_eigh_s": round(t_numpy, 3),
           "collect_s": round(t_collect, 3), "ratio_spark_over_numpy": round(t_spark / t_numpy, 3),
           "ratio_spark_over_collect_plus_numpy": round(t_spark / (t_collect + t_numpy), 3)}
    print(f"PCA {label}: spark {t_spark:.2f}s, numpy {t_numpy:.2f}s (+collect {t_collect:.2f}s)", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
