"""Bytes to and from any Hadoop-supported path (local, HDFS, S3, DBFS) via the JVM.

Model stages keep non-JSON state (a ``.keras`` file) inside their MLlib save folder;
this lets them write it wherever ``Pipeline.save`` was pointed.
"""
from __future__ import annotations

from pyspark.sql import SparkSession


def _fs_and_path(spark: SparkSession, path: str):
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs, hpath


def write_bytes(spark: SparkSession, path: str, data: bytes) -> None:
    fs, hpath = _fs_and_path(spark, path)
    out = fs.create(hpath, True)
    try:
        out.write(bytearray(data))
    finally:
        out.close()


def read_bytes(spark: SparkSession, path: str) -> bytes:
    fs, hpath = _fs_and_path(spark, path)
    if not fs.exists(hpath):
        raise FileNotFoundError(f"no file at {path!r}")
    row = spark.read.format("binaryFile").load(path).select("content").first()
    return bytes(row["content"])
