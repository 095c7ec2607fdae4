"""One Spark session per test run: local[2], UI off, few shuffle partitions, Delta on."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from sparkdeep.config import SparkConfig
    from sparkdeep.session import builder

    base = tmp_path_factory.mktemp("spark")
    conf = SparkConfig(master="local[2]", app_name="sparkdeep-tests", settings={
        # One JVM serves the whole run; 1g (the default) ran out of heap late in a full run.
        "spark.driver.memory": "4g",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.task.maxFailures": "1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.warehouse.dir": str(base / "warehouse"),
        "spark.local.dir": str(base / "local"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={base / 'derby'}",
    })
    session = builder(conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
