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
    """Write through Hadoop's FileSystem even for local paths, so a ``.crc`` side file is
    written beside the bytes and :func:`read_bytes` can tell a changed file."""
    from sparkdeep.storage import Storage
    fs, hpath = _fs_and_path(spark, path)
    Storage._put(fs, hpath, data, overwrite=True)


class ChecksumError(OSError):
    """A file that does not match its Hadoop ``.crc`` side file: changed or corrupted."""


def read_bytes(spark: SparkSession, path: str) -> bytes:
    """The whole file at ``path``.

    Raises
    ------
    FileNotFoundError
        Nothing at ``path``.
    ChecksumError
        The bytes do not match the ``.crc`` side file Hadoop wrote beside them (the
        executor's opaque ``ChecksumException`` otherwise surfaces as a Py4J error).
    """
    fs, hpath = _fs_and_path(spark, path)
    if not fs.exists(hpath):
        raise FileNotFoundError(f"no file at {path!r}")
    try:
        row = spark.read.format("binaryFile").load(path).select("content").first()
    except Exception as e:  # Py4JJavaError or pyspark's wrapper, depending on the version
        if "ChecksumException" not in str(e):
            raise
        raise ChecksumError(f"{path}: checksum failure (the file does not match its Hadoop .crc side "
                            "file: it was changed or corrupted after it was written)") from e
    return bytes(row["content"])


def local_path(spark: SparkSession, path: str) -> str | None:
    """``path`` on the local filesystem (relative paths resolved as Hadoop does), or
    ``None`` when it lives elsewhere (HDFS, S3, ...)."""
    fs, hpath = _fs_and_path(spark, path)
    uri = fs.makeQualified(hpath).toUri()
    return uri.getPath() if uri.getScheme() == "file" else None
