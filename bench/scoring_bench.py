"""Scoring (issue 25): DistributedKerasModel.transform against the floor of Spark's path to Python.

Every figure comes from this one run, on one cached DataFrame (Spark local[2], rows from
``spark.range`` + ``randn``: one categorical and ``features - 1`` numeric columns, indexed,
assembled and standardised into a ``features`` vector):

- floor: an iterator Arrow UDF over the same input column as the transform (the features
  as ``array<float>``, ``float_arrays``), with the same Arrow batch settings, returning one
  double per row (its first element) and no model: what moving the rows into Python and
  one number back costs;
- before: the transform as it was before issue 25 (``before_transform``: its UDF copied
  from the commit before), after: ``DistributedKerasModel.transform`` now;
- predict: keras ``model.predict(x, batch_size=10000)`` on the same rows as numpy, here;
- pipeline: StringIndexer + VectorAssembler + StandardScaler + the network, saved, loaded
  and applied to the raw rows, beside the same stages + MLlib's GBTClassifier (20 trees
  of depth 5) fitted on the assembled rows;
- what the profile blamed, measured: the transform with its worker's heap thawed after
  every batch (PySpark's ``gc.collect()`` after each task then walks TensorFlow's objects
  again), the classifier's outputs built on the JVM from one score per row against the
  struct built in Python (both on the floor, no model), and one 10,000-row batch through
  each part of the UDF body (an eager ``model(x)`` beside the traced forward pass).

Each Spark figure is a ``noop`` write of the whole output, the best of ``--repeat`` rounds
(every round and the medians are kept too) after a warm-up round, every variant once per
round in turn. Each variant runs in Python
workers of its own (``worker_pool``), so no variant's worker state (TensorFlow imported, a
frozen heap) carries into another's. Run:

    .venv/bin/python bench/scoring_bench.py [--rows 400000] [--features 39]

Writes bench/results/scoring.json and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import sys
import tempfile
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

import _results  # bench/_results.py (the script folder is on sys.path)

BEFORE_COMMIT = "de7c74e"  # the last commit to change transformers/keras/model.py before issue 25
BATCH = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch (Spark's default), and predict's


def generate(spark, rows, features, partitions):
    """Raw rows as a pipeline meets them: a categorical ``cat``, numeric ``x0..``, a label."""
    from pyspark.sql import functions as F
    nums = [F.randn(10 + j).alias(f"x{j}") for j in range(features - 1)]
    df = spark.range(rows, numPartitions=partitions).select(
        "id", F.concat(F.lit("c"), F.pmod(F.xxhash64("id"), F.lit(13)).cast("string")).alias("cat"), *nums)
    return df.withColumn("label", (F.col("x0") + F.randn(99) * 0.5 > 0).cast("double")).cache()


@contextlib.contextmanager
def worker_pool(spark, name):
    """UDFs made inside run in Python workers of their own: Spark keys its worker daemons
    by the UDF's environment variables, taken when the UDF is made."""
    env = spark.sparkContext.environment
    env["SCORING_BENCH_POOL"] = name
    try:
        yield
    finally:
        env.pop("SCORING_BENCH_POOL")


def first_element(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """The floor's UDF: each batch of rows into Python, the first element of each back."""
    import pyarrow.compute as pc
    for col in arrays:
        yield pc.list_element(col, 0).cast(pa.float64())


def floor_frame(df, outputs):
    """The floor over ``df.features``: one double per row (``outputs=None``), with the
    classifier's columns built from it on the JVM as before issue 25 (``'jvm'``), or
    returned by the UDF as the struct the transform now builds (``'python'``)."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from sparkdeep.transformers.keras.model import CLASSIFIER_SCORES
    from sparkdeep.transformers.keras.staging import float_arrays
    feats = float_arrays(df.schema, "features")
    if outputs == "python":
        s = F.arrow_udf(first_as_scores, CLASSIFIER_SCORES)(feats)
        return df.withColumns({"probability": s.getField("probability"), "prediction": s.getField("prediction")})
    p = F.arrow_udf(first_element, "double")(feats)
    if outputs is None:
        return df.withColumn("p", p)
    out = df.withColumn("__p", p)
    p = F.col("__p")
    return out.withColumns({
        "probability": F.when(p.isNotNull(), array_to_vector(F.array(1.0 - p, p))),
        "prediction": F.when(p.isNotNull(), (p >= 0.5).cast("double"))}).drop("__p")


def binary_spec(width):
    """What the transform hands its UDF for a one-sigmoid classifier over ``features``."""
    from pyspark.sql.pandas.types import to_arrow_type

    from sparkdeep.transformers.keras import model as scoring
    return scoring._ScoreSpec(digest="", width=width, units=1, task="binary", mode="error", fcol="features",
                              arrow_type=to_arrow_type(scoring.CLASSIFIER_SCORES))


def first_as_scores(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """The floor returning what the transform returns for a one-sigmoid classifier: the
    struct of ``[1 - p, p]`` and ``p >= 0.5`` built in Python, p the row's first element."""
    import pyarrow.compute as pc

    from sparkdeep.transformers.keras import model as scoring
    spec = binary_spec(0)
    for col in arrays:
        p = pc.list_element(col, 0).cast(pa.float64()).to_numpy(zero_copy_only=False).reshape(-1, 1)
        yield scoring._output(p, None, spec)


def before_transform(model, dataset):
    """``DistributedKerasModel.transform`` as it was at ``BEFORE_COMMIT`` (its driver checks left
    out): an eager ``model(x)`` per batch, the worker's heap never frozen, one score per row
    back to the JVM, which builds the probability vector and the prediction."""
    import hashlib

    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparkdeep.transformers._vectors import list_matrix
    from sparkdeep.transformers.keras import model as scoring
    from sparkdeep.transformers.keras.staging import float_arrays

    data = model.kerasBytes
    digest = hashlib.sha256(data).hexdigest()
    net = scoring._cached_keras(digest, data)
    mode = model.getHandleInvalid()
    shipped = dataset.sparkSession.sparkContext.broadcast(data)
    fcol = model.getFeaturesCol()
    feats = float_arrays(dataset.schema, fcol)
    units = int(net.outputs[0].shape[-1])
    width = int(net.inputs[0].shape[-1])
    single = units == 1
    out_type = T.DoubleType() if single else T.ArrayType(T.DoubleType())

    def score(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
        import pyarrow.compute as pc
        model = scoring._cached_keras(digest, shipped.value)
        for col in arrays:
            n = len(col)
            valid = np.ones(n, dtype=bool) if not col.null_count else np.asarray(col.is_valid())
            rows = col if valid.all() else col.filter(pa.array(valid))
            x = list_matrix(rows, width, fcol).astype("float32", copy=False) if len(rows) else \
                np.zeros((0, width), dtype="float32")
            finite = np.isfinite(x).all(axis=1)
            bad = n - int(finite.sum())
            if bad and mode == "error":
                raise ValueError(f"DistributedKerasModel: featuresCol {fcol!r} has {bad} rows in a batch that are "
                                 "null or hold NaN/infinite values (as float32); fix or drop them, or set "
                                 "handleInvalid='keep' to give them null outputs")
            p = np.full((n, units), np.nan)
            idx = np.flatnonzero(valid)[finite]
            if len(idx):
                out = np.asarray(model(x[finite], training=False), dtype="float64").reshape(len(idx), units)
                if not np.isfinite(out).all():
                    raise ValueError(f"DistributedKerasModel: the network produced "
                                     f"{int((~np.isfinite(out).all(axis=1)).sum())} non-finite outputs from "
                                     "finite inputs (are its weights finite?)")
                p[idx] = out
            missing = ~np.isfinite(p[:, 0])
            if single:
                yield pa.array(p[:, 0], mask=missing)
            else:
                lists = pa.FixedSizeListArray.from_arrays(pa.array(p.ravel()), units).cast(pa.list_(pa.float64()))
                yield pc.if_else(pa.array(missing), pa.nulls(n, lists.type), lists)

    out = dataset.withColumn("__p", F.arrow_udf(score, out_type)(feats))
    if single:
        prob = F.when(F.col("__p").isNotNull(), array_to_vector(F.array(1.0 - F.col("__p"), F.col("__p"))))
        pred = F.when(F.col("__p").isNotNull(), (F.col("__p") >= 0.5).cast("double"))
    else:
        prob = F.when(F.col("__p").isNotNull(), array_to_vector(F.col("__p")))
        pred = (F.array_position(F.col("__p"), F.array_max(F.col("__p"))) - 1).cast("double")
    out = out.withColumn(model.getProbabilityCol(), prob)
    return out.withColumn(model.getPredictionCol(), pred).drop("__p")


def thawed_batches(arrays, spec, shipped):
    """The transform's own UDF body with the worker's heap thawed after every batch: the
    ``gc.collect()`` PySpark runs after each task walks TensorFlow's objects again."""
    import gc

    from sparkdeep.transformers.keras import model as scoring
    for out in scoring._score_batches(arrays, spec, shipped):
        gc.unfreeze()
        yield out


def transform_thawed(model, df):
    """``model.transform(df)`` whose UDF runs :func:`thawed_batches`: the UDF is pickled
    when the transform makes it, with the module's ``_score_batches`` as it is then."""
    from sparkdeep.transformers.keras import model as scoring
    original = scoring._score_batches
    scoring._score_batches = thawed_batches
    try:
        return model.transform(df)
    finally:
        scoring._score_batches = original


def measure(spark, variants, repeat):
    """Seconds of each variant's noop write in each of ``repeat`` rounds after a warm-up
    round, every variant once per round in turn, so none alone gets the warmer cache or
    the quieter minute."""
    seconds = {name: [] for name in variants}
    for round_ in range(repeat + 1):
        for name, (pool, make) in variants.items():
            with worker_pool(spark, pool):
                df = make()
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            took = time.perf_counter() - t0
            if round_:
                seconds[name].append(took)
            print(f"round {round_} {name:28s} {took:7.2f}s", flush=True)
    return seconds


def in_process_profile(net, x, repeat):
    """Here, TensorFlow and the network loaded: a full ``gc.collect()`` with the heap as it
    is and frozen; and one 10,000-row batch through each part of the transform's UDF body:
    the Arrow rows to a checked matrix, an eager ``model(x)`` or the traced forward pass,
    the outputs' Arrow struct."""
    import tensorflow as tf

    from sparkdeep.transformers.keras import model as scoring

    gc.collect()
    objects = len(gc.get_objects())
    unfrozen = _results.best_seconds(gc.collect, repeat)
    gc.freeze()
    frozen = _results.best_seconds(gc.collect, repeat)
    gc.unfreeze()
    batch, width = x[:BATCH], x.shape[1]
    col = pa.ListArray.from_arrays(pa.array(np.arange(0, BATCH * width + 1, width, dtype="int32")),
                                   pa.array(batch.ravel()))
    spec = binary_spec(width)
    forward = tf.function(lambda b: net(b, training=False),
                          input_signature=[tf.TensorSpec((None, width), tf.float32)])
    p = np.asarray(forward(batch), dtype="float64")
    ms = {"rows_to_matrix": lambda: scoring._usable_rows(col, spec),
          "eager_forward": lambda: np.asarray(net(batch, training=False)),
          "traced_forward": lambda: forward(batch).numpy(),
          "outputs_struct": lambda: scoring._output(p, None, spec)}
    return {"gc_objects": objects, "gc_collect_s": round(unfrozen, 4), "gc_collect_frozen_s": round(frozen, 4),
            "batch_ms": {k: round(_results.best_seconds(fn, repeat * 3) * 1e3, 2) for k, fn in ms.items()}}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--features", type=int, default=39)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "scoring.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before the JVM starts: its Python workers inherit it

    import keras
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.classification import GBTClassifier
    from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler

    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder
    from sparkdeep.transformers.keras.network import keras_to_bytes
    from sparkdeep.transformers.keras.staging import float_arrays
    from sparkdeep.transformers.keras_estimator import DistributedKerasModel
    from sparkdeep.transformers.keras_models import mlp_binary_classifier

    spark = builder(SparkConfig(master="local[2]", settings={
        "spark.driver.memory": "4g", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.task.maxFailures": "1", "spark.sql.shuffle.partitions": "4",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(BATCH)}), app_name="bench-scoring").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    raw = generate(spark, args.rows, args.features, args.partitions)
    numeric = [f"x{j}" for j in range(args.features - 1)]
    prep = Pipeline(stages=[StringIndexer(inputCol="cat", outputCol="cat_idx"),
                            VectorAssembler(inputCols=["cat_idx", *numeric], outputCol="assembled"),
                            StandardScaler(inputCol="assembled", outputCol="features", withMean=True)]).fit(raw)
    df = prep.transform(raw).select("features", "label").cache()
    n = df.count()
    print(f"data: {n} rows x {args.features} features in {args.partitions} partitions, cached", flush=True)

    keras.utils.set_random_seed(0)
    net = mlp_binary_classifier(args.features, hidden_units=(256, 128))  # untrained, as the default network
    model = DistributedKerasModel(kerasBytes=keras_to_bytes(net))
    gbt = GBTClassifier(maxIter=20, maxDepth=5, seed=1).fit(df)
    with tempfile.TemporaryDirectory() as tmp:
        PipelineModel(stages=[*prep.stages, model]).write().overwrite().save(f"{tmp}/keras")
        PipelineModel(stages=[*prep.stages, gbt]).write().overwrite().save(f"{tmp}/gbt")
        keras_pipeline, gbt_pipeline = PipelineModel.load(f"{tmp}/keras"), PipelineModel.load(f"{tmp}/gbt")

    variants = {
        "floor": ("floor", lambda: floor_frame(df, None)),
        "before": ("before", lambda: before_transform(model, df)),
        "after": ("after", lambda: model.transform(df)),
        "after, heap thawed": ("thawed", lambda: transform_thawed(model, df)),
        "floor + JVM outputs": ("floor", lambda: floor_frame(df, "jvm")),
        "floor + Python outputs": ("outputs", lambda: floor_frame(df, "python")),
        "keras pipeline (raw rows)": ("after", lambda: keras_pipeline.transform(raw)),
        "GBT pipeline (raw rows)": ("gbt", lambda: gbt_pipeline.transform(raw)),
    }
    rounds = measure(spark, variants, args.repeat)
    seconds = {k: min(v) for k, v in rounds.items()}

    table = df.select(float_arrays(df.schema, "features").alias("x")).toArrow()
    x = table.column("x").combine_chunks().flatten().to_numpy().reshape(-1, args.features)
    net.predict(x[:BATCH], batch_size=BATCH, verbose=0)
    seconds["predict"] = _results.best_seconds(lambda: net.predict(x, batch_size=BATCH, verbose=0), args.repeat)
    profile = in_process_profile(net, x, args.repeat)
    rate = {k: n / s for k, s in seconds.items()}
    median = {k: n / float(np.median(v)) for k, v in rounds.items()}
    ratios = {"after/floor": rate["after"] / rate["floor"], "before/floor": rate["before"] / rate["floor"],
              "after/predict": rate["after"] / rate["predict"], "before/predict": rate["before"] / rate["predict"],
              "after/before": rate["after"] / rate["before"],
              "keras pipeline/GBT pipeline": rate["keras pipeline (raw rows)"] / rate["GBT pipeline (raw rows)"],
              "after heap thawed/after": rate["after, heap thawed"] / rate["after"],
              "floor + JVM outputs/floor": rate["floor + JVM outputs"] / rate["floor"],
              "floor + Python outputs/floor": rate["floor + Python outputs"] / rate["floor"]}
    for k, s in seconds.items():
        print(f"{k:28s} {s:7.2f}s {rate[k]:12,.0f} rows/s", flush=True)
    for k, r in ratios.items():
        print(f"{k:32s} {r:6.3f}", flush=True)
    print(f"after/floor of the median rounds: {median['after'] / median['floor']:.3f}", flush=True)
    print("profile", profile, flush=True)
    results = {"machine": {"cores": os.cpu_count(), "python": platform.python_version(), "master": "local[2]"},
               "rows": n, "features": args.features, "partitions": args.partitions, "arrow_batch_rows": BATCH,
               "seconds": {k: round(s, 3) for k, s in seconds.items()},
               "rounds_s": {k: [round(s, 3) for s in v] for k, v in rounds.items()},
               "rows_per_s": {k: round(r) for k, r in rate.items()},
               "ratios": {k: round(r, 3) for k, r in ratios.items()}, "target_after_over_floor": 0.9,
               "median_rounds_rows_per_s": {k: round(r) for k, r in median.items()},
               "median_rounds_after_over_floor": round(median["after"] / median["floor"], 3),
               "profile": profile}
    spark.stop()
    return _results.finish(args.out, results, args)


if __name__ == "__main__":
    sys.exit(main())
