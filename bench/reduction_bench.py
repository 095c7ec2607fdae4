"""Reduction stages vs the plain MLlib stage each extends, and PCA vs numpy.

Ratios are measured side by side in one run on the same cached DataFrame (generated on
Spark), fit + transform + a count to force the work; each pair is timed best-of-N with
the two orders alternated so neither gets a warmer cache. Run:

    .venv/bin/python bench/reduction_bench.py [--rows 1000000] [--features 100] [--repeat 2]

Writes bench/results/reduction.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

import _results  # bench/_results.py (the script folder is on sys.path)


timed = _results.best_seconds


def pair(name, ours, baseline, repeat, results):
    a = timed(ours, repeat)
    b = timed(baseline, repeat)
    # Second round in the other order, keep the best of each.
    b = min(b, timed(baseline, 1))
    a = min(a, timed(ours, 1))
    results.append({"stage": name, "ours_s": round(a, 3), "mllib_s": round(b, 3), "ratio": round(a / b, 3)})
    print(f"{name:38s} ours {a:8.2f}s  mllib {b:8.2f}s  ratio {a / b:5.2f}", flush=True)


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
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "reduction.json"))
    args = p.parse_args(argv)

    from pyspark.ml.feature import PCA, UnivariateFeatureSelector, VarianceThresholdSelector, VectorSlicer
    from pyspark.ml.classification import RandomForestClassifier
    from pyspark.ml.stat import Correlation

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    from sparkdeep.transformers.pca import CenteredPCA
    from sparkdeep.transformers.sampling import ClassBalanceSampler, StratifiedSampler, UniformSampler
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

    pair("UniformSampler(fraction) vs df.sample",
         lambda: UniformSampler(fraction=0.3).fit(df).sample(df).count(),
         lambda: df.sample(fraction=0.3, seed=1).count(), r, results)
    fr = {str(s): 0.3 for s in range(7)}
    pair("StratifiedSampler(exact) vs sampleBy",
         lambda: StratifiedSampler(stratumCol="stratum", fractions=fr).fit(df).sample(df).count(),
         lambda: df.sampleBy("stratum", {s: 0.3 for s in range(7)}, seed=1).count(), r, results)
    counts = {row[0]: row[1] for row in df.groupBy("label").count().collect()}
    minority = min(counts.values())
    frac = {k: min(1.0, minority / v) for k, v in counts.items()}
    pair("ClassBalanceSampler(exact) vs sampleBy",
         lambda: ClassBalanceSampler(labelCol="label").fit(df).sample(df).count(),
         lambda: df.sampleBy("label", frac, seed=1).count(), r, results)
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
    _results.write(args.out, out)
    spark.stop()
    return 0


def pca_against_numpy(spark, df, label):
    """CenteredPCA fit on Spark vs numpy cov + eigh on the same matrix collected to the driver."""
    from pyspark.ml.functions import vector_to_array

    from sparkdeep.transformers.pca import CenteredPCA
    t_spark = timed(lambda: CenteredPCA(inputCol="features", outputCol="pcs", k=10).fit(df), 1)
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
