"""StringIndexer's fit against a column's level count: seconds and the driver's memory.

MLlib's ``StringIndexer`` counts every level on the executors, then collects the labels to
the driver and keeps them in the fitted model (and in its saved folder). This measures
that fit on a generated column of 10^3 to 10^6 levels (Zipf-skewed, as IDs are): fit
seconds, the driver JVM's heap after the fit against before (after a GC), the Python
driver's peak RSS, the saved model's size, and a ``transform`` pass. Run:

    .venv/bin/python bench/indexer_levels_bench.py --rows 2000000 --levels 1000 100000 1000000

Writes bench/results/indexer_levels.json.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import finish  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "indexer_levels.json")


def _jvm_used_mb(spark) -> float:
    rt = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
    spark.sparkContext._jvm.java.lang.System.gc()
    return (rt.totalMemory() - rt.freeMemory()) / 2 ** 20


def measure(spark, rows: int, levels: int, seed: int = 0) -> dict:
    from pyspark.ml.feature import StringIndexer
    from pyspark.sql import functions as F

    from sparkdeep import synth
    shape = synth.Shape(rows=rows, numeric=0, levels=(levels,), skew=0.5, seed=seed)
    df = synth.generate(spark, shape).select("cat0").cache()
    distinct = df.select(F.countDistinct("cat0")).first()[0]
    before = _jvm_used_mb(spark)
    t0 = time.perf_counter()
    model = StringIndexer(inputCol="cat0", outputCol="i", handleInvalid="keep").fit(df)
    fit_s = time.perf_counter() - t0
    after = _jvm_used_mb(spark)
    t0 = time.perf_counter()
    model.transform(df).agg(F.max("i")).first()
    transform_s = time.perf_counter() - t0
    folder = tempfile.mkdtemp()
    try:
        model.write().overwrite().save(os.path.join(folder, "m"))
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
    finally:
        shutil.rmtree(folder)
    df.unpersist()
    return {"rows": rows, "levels_asked": levels, "levels": int(distinct), "labels": len(model.labels),
            "fit_s": round(fit_s, 2), "transform_s": round(transform_s, 2),
            "driver_jvm_heap_added_mb": round(after - before, 1),
            "python_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "saved_mb": round(size / 2 ** 20, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--levels", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    args = p.parse_args(argv)
    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    spark = builder(SparkConfig(master="local[2]", app_name="indexer-levels",
                                settings={"spark.ui.enabled": "false", "spark.driver.memory": "4g"})).getOrCreate()
    rows = []
    for levels in args.levels:
        rows.append(measure(spark, args.rows, levels))
        print(rows[-1], flush=True)
    spark.stop()
    return finish(OUT, {"rows": rows}, args)


if __name__ == "__main__":
    sys.exit(main())
