"""Output goes through the ``sparkdeep`` logger: on by default, turned down by --quiet,
up by --verbose, routable by an application; Spark's start-up chatter off."""
import logging
import os
import subprocess
import sys

import pytest

from sparkdeep import logs
from sparkdeep.config import default_conf_dir, load_config
from sparkdeep.paths import Paths
from sparkdeep.runs import Manifest


def test_info_goes_to_stdout_warnings_to_stderr_debug_nowhere(capsys):
    log = logging.getLogger("sparkdeep.tests.logs")
    log.info("hello")
    log.warning("careful")
    log.debug("hidden")
    out = capsys.readouterr()
    assert out.out == "hello\n" and out.err == "careful\n"


def test_verbosity_is_set_for_the_job_and_put_back():
    logger = logging.getLogger("sparkdeep")
    before = logger.level
    with logs.verbosity(quiet=True) as spark_level:
        assert logger.getEffectiveLevel() == logging.WARNING and spark_level == "ERROR"
    with logs.verbosity(verbose=True) as spark_level:
        assert logger.getEffectiveLevel() == logging.DEBUG and spark_level == "INFO"
    assert logger.level == before


def test_an_application_routes_the_lines_to_its_own_handlers(caplog):
    logger = logs.configure(propagate=True)
    try:
        with caplog.at_level(logging.INFO, logger="sparkdeep"):
            logging.getLogger("sparkdeep.tests.logs").info("routed")
        assert [r.getMessage() for r in caplog.records] == ["routed"]
    finally:
        logger.propagate = False


def test_a_bad_level_is_refused_naming_it():
    with pytest.raises(ValueError, match="'loud'"):
        logs.configure("loud")


@pytest.fixture
def finished_ingest(tmp_path):
    """A run 'r1' whose ingest step is done: the job starts no Spark and says so."""
    out = tmp_path / "out"
    cfg = load_config(default_conf_dir(), overrides=[f"output_dir={out}"])
    m = Manifest.open(Paths.under(str(out)), "r1", cfg, force=False)
    m.start("ingest")
    m.finish("ingest", {"wall_s": 0.1})
    return out


def _ingest(out, *flags):
    return subprocess.run([sys.executable, "-m", "sparkdeep.jobs.ingest", "--run-id", "r1", "--output-dir", str(out),
                           *flags], capture_output=True, text=True, timeout=120)


def test_quiet_prints_nothing_for_a_run_that_is_done_and_the_default_says_why(finished_ingest):
    normal = _ingest(finished_ingest)
    assert normal.returncode == 0 and "[ingest] already done in run r1: skipped" in normal.stdout
    quiet = _ingest(finished_ingest, "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_quiet_still_names_the_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.ingest", "-q", "--set", "train.epochs=lots",
                          "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert "'train.epochs'" in out.stderr


def test_quiet_and_verbose_together_are_refused(tmp_path):
    out = _ingest(tmp_path, "--quiet", "--verbose")
    assert out.returncode == 2 and "not allowed with" in out.stderr


def test_the_driver_starts_with_the_shipped_log4j_setting_unless_one_is_chosen():
    from sparkdeep.session import _quiet_start
    option = _quiet_start({})["spark.driver.extraJavaOptions"]
    assert option.startswith("-Dlog4j2.configurationFile=file:") and option.endswith("log4j2.properties")
    assert _quiet_start({"spark.driver.extraJavaOptions": "-Xss8m"})["spark.driver.extraJavaOptions"] == \
        "-Xss8m " + option
    mine = "-Dlog4j2.configurationFile=file:///etc/mine.properties"
    assert _quiet_start({"spark.driver.extraJavaOptions": mine}) == {}


def test_every_spark_logger_the_shipped_log4j_setting_names_is_a_class_of_spark():
    """A misspelt logger name silences nothing (the plan-truncation warning stayed on the
    console while the setting named a class Spark 4 no longer has)."""
    import glob
    import os
    import zipfile

    import pyspark
    props = (default_conf_dir() / "log4j2.properties").read_text()
    wanted = {line.split("=", 1)[1].strip() for line in props.splitlines()
              if line.startswith("logger.") and ".name" in line.split("=", 1)[0]}
    spark_names = {n for n in wanted if n.startswith("org.apache.spark.")}
    assert spark_names, "the setting names no Spark logger"
    classes = set()
    for jar in glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "spark-*.jar")):
        with zipfile.ZipFile(jar) as z:
            classes.update(n[:-len(".class")].replace("/", ".") for n in z.namelist() if n.endswith(".class"))
    assert sorted(n for n in spark_names if n not in classes) == []


@pytest.mark.parametrize("verbose", [False, True])
def test_tensorflows_start_up_lines_only_with_verbose(verbose):
    code = ("import os; from sparkdeep import logs\n"
            f"logs.quiet_native({verbose})\n"
            "import tensorflow as tf; tf.constant(1.0) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    # Which start-up lines TensorFlow prints depends on the CPU: oneDNN's notice on some,
    # the CPU-feature notice on others; with verbose at least one, without it none.
    startup = ("oneDNN custom operations", "cpu_feature_guard", "This TensorFlow binary is optimized")
    assert any(line in out.stderr for line in startup) is verbose, out.stderr


def test_importing_the_package_installs_no_handler_and_a_job_installs_the_console_one():
    code = ("import logging, sparkdeep, sparkdeep.transformers, sparkdeep.pipelines.train\n"
            "from sparkdeep import logs\n"
            "logger = logging.getLogger('sparkdeep')\n"
            "print([type(h).__name__ for h in logger.handlers])\n"
            "logging.getLogger('sparkdeep.x').info('not shown: no handler yet')\n"
            "with logs.verbosity():\n"
            "    logging.getLogger('sparkdeep.x').info('shown')\n"
            "print([type(h).__name__ for h in logger.handlers])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['NullHandler']", "shown", "['NullHandler', 'ConsoleHandler']"]
