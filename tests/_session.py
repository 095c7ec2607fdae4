"""The tests' Spark settings, shared by the session fixture (``tests/conftest.py``) and the
other test process (``tests/_other_process.py``), so that both read and score the same rows
in the same partitions and Arrow batches."""
from __future__ import annotations

import os


def ci_spark_settings() -> dict:
    """``conf/ci/spark.yaml``'s settings."""
    import yaml
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "ci", "spark.yaml")
    with open(path) as fh:
        return dict(yaml.safe_load(fh)["spark"]["settings"])


def session_config(base: str, app_name: str = "sparkdeep-tests"):
    """A test session's :class:`~sparkdeep.config.SparkConfig`, its folders under ``base``."""
    from sparkdeep.config import SparkConfig
    return SparkConfig(master="local[2]", app_name=app_name, settings={
        # One JVM serves the whole run; 1g (the default) ran out of heap late in a full run.
        "spark.driver.memory": "4g",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.task.maxFailures": "1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.warehouse.dir": os.path.join(base, "warehouse"),
        "spark.local.dir": os.path.join(base, "local"),
        # conf/ci's own settings for small tables (no code compiled per query stage or
        # expression), from their one home; but not its JIT option: this JVM lives the whole
        # run, and C2's code pays for itself here (with C1 only the modules fitting pipelines
        # in this session took 30-45% longer in a full run; bench/RESULTS.md).
        **{k: v for k, v in ci_spark_settings().items() if not k.endswith("extraJavaOptions")},
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={os.path.join(base, 'derby')}",
    })
