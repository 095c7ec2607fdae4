"""One Spark session per test run: local[2], UI off, few shuffle partitions, Delta on."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")

# The test run is an application of sparkdeep: it shows the lines as a job does.
from sparkdeep.logs import install_default  # noqa: E402

install_default()


def _ci_spark_settings() -> dict:
    import yaml
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "ci", "spark.yaml")
    with open(path) as fh:
        return dict(yaml.safe_load(fh)["spark"]["settings"])


def ci_java_options() -> str:
    """conf/ci's JVM options (the first JIT tier only), for every JVM the tests start: the
    session's, the pipelines' (they read conf/ci themselves), MiniDFS's and the standalone
    cluster's."""
    return _ci_spark_settings().get("spark.driver.extraJavaOptions", "")


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
        # conf/ci's own settings for small tables (no code compiled per query stage, the JIT's
        # first tier), from their one home.
        **_ci_spark_settings(),
        "spark.driver.extraJavaOptions": f"{ci_java_options()} -Dderby.system.home={base / 'derby'}".strip(),
    })
    session = builder(conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_AIRFLOW: dict = {}


def pytest_collection_modifyitems(session, config, items):
    """Modules with slow tests first, each module's tests kept together (module fixtures are
    built once): with parallel workers (``make test``), the long modules start early instead
    of one of them ending the run alone.

    Start installing the Airflow venv in the background as soon as a test that needs it
    is selected: the install waits on the network while the Spark tests use the CPUs
    (measured: ~100 s on a clean clone, otherwise spent inside the test run)."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")
                    and getattr(item, "module", None) is not None}
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "__name__", "") not in slow_modules)
    if session is None or any(item.nodeid.startswith("tests/test_scheduling.py")
                              and "airflow_python" in getattr(item, "fixturenames", ()) for item in items):
        import subprocess
        import sys
        import tempfile
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        log = tempfile.TemporaryFile(mode="w+")
        _AIRFLOW["log"] = log
        _AIRFLOW["proc"] = subprocess.Popen(
            ["bash", os.path.join(root, "scripts", "airflow_env.sh")], stdout=log, stderr=subprocess.STDOUT,
            text=True, env={**os.environ, "PYTHON": sys._base_executable})


def airflow_env() -> tuple[int, str]:
    """(exit code, output) of the background Airflow venv install (started at collection,
    or here when the test was not collected the usual way)."""
    if "proc" not in _AIRFLOW:
        pytest_collection_modifyitems(None, None, [])
    proc, log = _AIRFLOW["proc"], _AIRFLOW["log"]
    rc = proc.wait(timeout=1200)
    log.seek(0)
    return rc, log.read()
