"""The one place that configures a SparkSession builder.

Only a job's ``main()``, the test fixture and a notebook call :func:`builder` and then
``getOrCreate()``; library code receives ``spark`` or uses ``df.sparkSession``.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

from .config import SparkConfig
from .jars import delta_coordinate, delta_jars

DELTA_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def builder(conf: SparkConfig | None = None, *, app_name: str | None = None,
            extra: Mapping[str, str] | None = None, quiet: bool = True) -> SparkSession.Builder:
    """A SparkSession builder: master and settings from ``conf``, Delta Lake enabled.

    Parameters
    ----------
    conf : SparkConfig, optional
        ``master``, ``app_name`` and ``settings`` (from ``conf/*/spark.yaml``).
    app_name : str, optional
        Replaces ``conf.app_name`` (jobs name themselves).
    extra : mapping, optional
        Settings applied last (the test fixture points directories at a temp folder).
    quiet : bool, default True
        Start the driver with the config folder's ``log4j2.properties`` (warnings that say
        nothing a user can act on hidden); False keeps Spark's own default (``--verbose``).

    Examples
    --------
    >>> spark = builder(load_config().spark, app_name="demo").getOrCreate()  # doctest: +SKIP
    """
    conf = conf or SparkConfig()
    # Python workers must be this interpreter (the project venv), also on the executors
    # of a local cluster; a cluster sets PYSPARK_PYTHON itself.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name or conf.app_name)
    # Under spark-submit the master comes from its command line; do not override it.
    if not launched_by_spark_submit():
        b = b.master(conf.master)
    settings = dict(DELTA_SETTINGS)
    jars = delta_jars()
    if jars:
        settings["spark.jars"] = ",".join(jars)
    else:  # not fetched yet: let Spark's Ivy resolve (needs Maven Central)
        settings["spark.jars.packages"] = delta_coordinate()
    settings.update(conf.settings)
    settings.update(extra or {})
    if quiet and not launched_by_spark_submit():  # under spark-submit the driver's JVM is already running
        settings.update(_quiet_start(settings))
    for key, value in settings.items():
        b = b.config(key, value)
    return b


def _quiet_start(settings: Mapping[str, str]) -> dict:
    """The driver's ``-Dlog4j2.configurationFile``: the config folder's ``log4j2.properties``
    (WARN from the start, the start-up warnings that say nothing about the job at ERROR),
    unless the settings already choose a log4j configuration or the folder has none."""
    from .config import default_conf_dir
    key = "spark.driver.extraJavaOptions"
    options = settings.get(key, "")
    path = default_conf_dir() / "log4j2.properties"
    if "log4j" in options or not path.is_file():
        return {}
    return {key: f"{options} -Dlog4j2.configurationFile={path.resolve().as_uri()}".strip()}


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this driver (it hands over a running JVM gateway)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
