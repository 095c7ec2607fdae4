"""All Delta Lake reads and writes of the project go through this module.

Writes can carry an idempotency key (``txnAppId``/``txnVersion``): Delta skips a write
whose key it has already committed, so a retried step adds no duplicate rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class TableRef:
    """A Delta table by path and the version a step read or wrote."""
    path: str
    version: int

    def as_dict(self) -> dict:
        return {"path": self.path, "version": self.version}


def is_table(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable
    return DeltaTable.isDeltaTable(spark, path)


def version_of(spark: SparkSession, path: str) -> int:
    """The latest committed version of the Delta table at ``path``."""
    from delta.tables import DeltaTable
    if not is_table(spark, path):
        raise FileNotFoundError(f"no Delta table at {path!r}")
    try:
        # The log's own refresh: a listing of _delta_log, no Spark job (history() runs one,
        # 0.4 s a call, and a step asks several times). Internal API, hence the fallback.
        log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        none = spark._jvm.scala.Option.empty()
        return int(log.update(False, none, none).version())
    except Py4JError:
        row = DeltaTable.forPath(spark, path).history(1).select("version").first()
        return int(row["version"])


def write(df: DataFrame, path: str, *, mode: str = "overwrite",
          txn: tuple[str, int] | None = None, partition_by: tuple[str, ...] = (),
          column_mapping: bool = False) -> TableRef:
    """Write ``df`` to the Delta table at ``path`` and return the version now current.

    ``txn=(app_id, version)``: Delta commits at most once per pair, so a retry is a no-op.
    ``column_mapping``: Delta's column mapping by name, for column names Delta refuses
    otherwise (space, ``,;{}()=``); readers need Delta reader version 2.
    """
    writer = df.write.format("delta").mode(mode)
    if column_mapping:
        writer = writer.option("delta.columnMapping.mode", "name")
    if mode == "overwrite":
        writer = writer.option("overwriteSchema", "true")
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", str(txn[1]))
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(path)
    return TableRef(path, version_of(df.sparkSession, path))


def read(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    """Read the Delta table at ``path``; ``version`` time-travels to an earlier one."""
    if not is_table(spark, path):
        raise FileNotFoundError(f"no Delta table at {path!r}: run the step that writes it first")
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", int(version))
    return reader.load(path)
