"""CenteredPCA on wide sparse vectors: the randomized solver against the exact one, by p.

The table is generated on Spark (``HashingTF`` over tokens: each row holds a few tokens of
latent groups that switch on together, plus random noise tokens, hashed into p columns),
so rows never pass through Python. For each p the randomized solver fits k components
(time, and the driver's peak Python heap while fitting: every p x l block lives there);
where the exact solver's p x p matrices fit (``--exact-max``), it fits too, and the two
are compared: explained variance ratios (largest relative difference) and components
(smallest |cosine| between matching components). Run:

    .venv/bin/python bench/wide_pca_bench.py [--rows 50000] [--features 1000,5000,20000,100000] [--k 20]

Writes bench/results/wide_pca.json and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import tracemalloc

import numpy as np

import _results  # bench/_results.py (the script folder is on sys.path)


def generate(spark, rows: int, p: int, seed: int = 3, groups: int = 8, noise_tokens: int = 20):
    """``rows`` sparse vectors of width ``p``: group g's 30 tokens appear together with
    probability 0.6 / (g + 1), and ``noise_tokens`` random tokens from a vocabulary of 10 p."""
    from pyspark.ml.feature import HashingTF
    from pyspark.sql import functions as F
    df = spark.range(rows, numPartitions=4)
    tokens = []
    for g in range(groups):
        on = F.rand(seed + g) < 0.6 / (g + 1)
        tokens.append(F.when(on, F.array(*[F.lit(f"g{g}_{j}") for j in range(30)]))
                      .otherwise(F.array().cast("array<string>")))
    noise = F.array(*[F.concat(F.lit("t"), (F.rand(seed + 100 + j) * 10 * p).cast("long").cast("string"))
                      for j in range(noise_tokens)])
    df = df.select("id", F.flatten(F.array(*tokens, noise)).alias("tokens"))
    return HashingTF(inputCol="tokens", outputCol="features", numFeatures=p).transform(df) \
        .select("id", "features").cache()


def fit(df, k: int, solver: str):
    from sparkdeep.transformers.pca import CenteredPCA
    tracemalloc.start()
    t0 = time.perf_counter()
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=k, solver=solver,
                        maxCovarianceBytes=16 << 30).fit(df)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return model, seconds, peak


def agreement(fast, exact, gap: float = 0.05) -> dict:
    """Randomized vs exact. A component is defined (up to sign) only where its eigenvalue
    stands apart from its neighbours', so components and variances are compared over the
    leading ones separated by more than ``gap`` (relative) from the next; beyond them (a
    flat tail of noise directions) only the variance captured by all k is comparable."""
    k = exact.numComponents
    full = exact.explainedVarianceRatio
    separated = 0
    while separated < k and full[separated] > (1 + gap) * full[separated + 1]:
        separated += 1
    rel = np.abs(fast.explainedVariance / exact.explainedVariance - 1)
    cos = np.abs((fast.components * exact.components).sum(axis=0))
    return {"separated": separated,
            "max_rel_diff_separated": float(rel[:separated].max()) if separated else None,
            "min_abs_cosine_separated": float(cos[:separated].min()) if separated else None,
            "captured_randomized": float(fast.explainedVariance.sum()),
            "captured_exact": float(exact.explainedVariance.sum())}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--features", default="1000,5000,20000,100000")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--exact-max", type=int, default=5000, help="largest p the exact solver also fits")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "wide_pca.json"))
    args = ap.parse_args(argv)

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": "12g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4"}), app_name="wide-pca-bench").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    print(f"{'p':>8} {'solver':>10} {'fit s':>8} {'driver MB':>10}  agreement with exact")
    for p in (int(v) for v in args.features.split(",")):
        df = generate(spark, args.rows, p)
        fast, fast_s, fast_peak = fit(df, args.k, "randomized")
        row = {"p": p, "rows": args.rows, "k": args.k, "randomized_s": round(fast_s, 2),
               "randomized_driver_mb": round(fast_peak / 2**20, 1)}
        line = f"{p:>8} {'randomized':>10} {fast_s:8.1f} {fast_peak / 2**20:10.1f}"
        print(line, flush=True)
        if p <= args.exact_max:
            exact, exact_s, exact_peak = fit(df, args.k, "exact")
            agree = agreement(fast, exact)
            row.update(exact_s=round(exact_s, 2), exact_driver_mb=round(exact_peak / 2**20, 1), **agree)
            lead = (f"the {agree['separated']} leading separated components: variance within "
                    f"{agree['max_rel_diff_separated']:.1e}, |cos| >= {agree['min_abs_cosine_separated']:.6f}; "
                    if agree["separated"] else "no separated leading component; ")
            print(f"{p:>8} {'exact':>10} {exact_s:8.1f} {exact_peak / 2**20:10.1f}  {lead}variance captured by "
                  f"all {args.k}: {agree['captured_randomized']:.4f} vs {agree['captured_exact']:.4f}", flush=True)
        row["explained_variance_total"] = round(float(fast.explainedVariance.sum()), 6)
        results.append(row)
        df.unpersist()
    _results.write(args.out, {"machine": platform.platform(), "cpus": os.cpu_count(), "results": results,
                              "note": "driver MB = peak Python heap while fitting (tracemalloc; numpy arrays "
                                      "included); the JVM driver holds the broadcast p x l block besides"})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
