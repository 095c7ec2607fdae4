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
    from tests._session import ci_spark_settings
    return ci_spark_settings()


def ci_java_options() -> str:
    """conf/ci's JVM options (the first JIT tier only), for the short-lived JVMs the tests
    start: the pipelines' (they read conf/ci themselves), MiniDFS's and the standalone
    cluster's; not the session's (see :func:`spark`)."""
    return _ci_spark_settings().get("spark.driver.extraJavaOptions", "")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from sparkdeep.session import builder
    from tests._session import session_config

    conf = session_config(str(tmp_path_factory.mktemp("spark")))
    session = builder(conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_AIRFLOW: dict = {}

#: The heaviest modules' seconds in a full run (junit times, 2026-12-07): they start first,
#: longest first, so that the two workers end together instead of one finishing a long
#: module alone (the standalone cluster's module ran last, 190 s, on one worker). Only the
#: order matters; a module not listed starts after these, in collection order.
_MODULE_SECONDS = {
    "tests.jobs.test_runs_end_to_end": 665, "tests.jobs.test_tasks_end_to_end": 477,
    "tests.transformers.test_strategies": 439, "tests.jobs.test_wide_tables": 435, "tests.test_storage": 373,
    "tests.jobs.test_shapes": 308, "tests.jobs.test_datasets": 306, "tests.pipelines.test_baselines": 268,
    "tests.transformers.test_invalid_inputs": 246, "tests.pipelines.test_tune": 220, "tests.test_notebooks": 211,
    "tests.jobs.test_standalone_cluster": 192, "tests.transformers.test_keras_estimator": 190,
    "tests.transformers.test_pca": 184, "tests.transformers.test_selection": 180, "tests.jobs.test_cli": 163,
}


def pytest_collection_modifyitems(session, config, items):
    """Modules with slow tests first, each module's tests kept together (module fixtures are
    built once): with parallel workers (``make test``), the long modules start early instead
    of one of them ending the run alone.

    Start installing the Airflow venv in the background as soon as a test that needs it
    is selected: the install waits on the network while the Spark tests use the CPUs
    (measured: ~100 s on a clean clone, otherwise spent inside the test run)."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")
                    and getattr(item, "module", None) is not None}

    def order(item):
        name = getattr(getattr(item, "module", None), "__name__", "")
        return name not in slow_modules, -_MODULE_SECONDS.get(name, 0)
    items.sort(key=order)
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
