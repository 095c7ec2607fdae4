"""Delta Lake's jars: fetched once from Maven Central into a local cache, then used offline.

``delta-spark`` on PyPI holds only Python code; its jars come from Maven Central. The
set-up runs ``python -m sparkdeep.jars fetch``, which lets Spark's own Ivy resolve
``io.delta:delta-spark_2.13:<version>`` and its dependencies into the cache and records
the jar files in a manifest. :func:`delta_jars` then hands those files to
``spark.jars``, so starting a session never resolves anything over the network and the
jars ship to executors with the job.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

SCALA_BINARY = "2.13"


def delta_version() -> str:
    return importlib.metadata.version("delta-spark")


def delta_coordinate() -> str:
    return f"io.delta:delta-spark_{SCALA_BINARY}:{delta_version()}"


def cache_dir() -> Path:
    """``$SPARKDEEP_CACHE`` or ``~/.cache/sparkdeep``: shared by clones on one machine."""
    root = os.environ.get("SPARKDEEP_CACHE") or Path.home() / ".cache" / "sparkdeep"
    return Path(root)


def _manifest() -> Path:
    return cache_dir() / f"delta-{delta_version()}.jars"


def delta_jars() -> list[str] | None:
    """The cached jar paths for the installed delta-spark, or None when not fetched."""
    manifest = _manifest()
    if not manifest.is_file():
        return None
    jars = [line.strip() for line in manifest.read_text().splitlines() if line.strip()]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return jars


def fetch() -> list[str]:
    """Resolve Delta's jars with Spark's Ivy into the cache; idempotent."""
    existing = delta_jars()
    if existing:
        return existing
    from pyspark.sql import SparkSession

    ivy = cache_dir() / "ivy"
    ivy.mkdir(parents=True, exist_ok=True)
    spark = (SparkSession.builder.master("local[1]").appName("sparkdeep-fetch-jars")
             .config("spark.jars.packages", delta_coordinate())
             .config("spark.jars.ivy", str(ivy))
             .config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.stop()
    jars = sorted(str(p) for p in (ivy / "jars").glob("*.jar"))
    wanted = f"delta-spark_{SCALA_BINARY}-{delta_version()}.jar"
    if not any(Path(j).name.endswith(wanted) for j in jars):
        raise RuntimeError(f"Ivy did not fetch {wanted} into {ivy / 'jars'}")
    _manifest().write_text("\n".join(jars) + "\n")
    return jars


if __name__ == "__main__":
    if sys.argv[1:] == ["fetch"]:
        for jar in fetch():
            print(jar)
    elif sys.argv[1:] == ["classpath"]:  # for spark-submit --jars
        print(",".join(fetch()))
    elif sys.argv[1:] == ["check"]:  # set-up: exit 1 when this cache folder lacks them
        sys.exit(0 if delta_jars() else 1)
    else:
        sys.exit("usage: python -m sparkdeep.jars fetch|classpath|check")
