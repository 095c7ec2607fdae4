"""Another Python process, for the tests that check that what this one saved loads and
scores the same elsewhere: one per pytest worker, started on first use, kept for the run.

Each :func:`run` executes a piece of code there as ``python -c CODE ARGS...`` would (a new
``__main__`` namespace, ``sys.argv``, the working folder; ``SystemExit`` is the exit code)
and returns a :class:`subprocess.CompletedProcess` with what it printed. The process keeps
its interpreter, its imports and its Spark session's JVM between calls: a cold JVM and
TensorFlow's import cost 20-35 s of CPU per new process, paid here once per worker. It
has never fitted or saved what the tests hand it, which is what these tests need. Its
session has the test session's settings (``tests/_session.py``) whatever the code asks of
``builder``, and a test's changes to its runtime settings are undone after it. A test
that needs a new interpreter (its environment at start, what a fresh process imports, a
process exit) starts its own with :mod:`subprocess`.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import traceback

from sparkdeep._rank_process import die_with_parent

_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _log() -> str:
    import tempfile
    return os.path.join(tempfile.gettempdir(), f"sparkdeep-other-process-{os.getpid()}.log")


def _start() -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    with open(_log(), "w") as log:  # its JVM's and libraries' own output
        return subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=repo,
                                preexec_fn=die_with_parent)


def stop() -> None:
    global _server
    if _server is not None:
        _server.kill()
        _server.wait()
        _server = None


atexit.register(stop)


def run(code: str, *args: str, cwd: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` with ``args`` in the other process; its printed output and exit code."""
    global _server
    with _lock:
        if _server is None or _server.poll() is not None:
            _server = _start()
        server = _server
        server.stdin.write(json.dumps({"code": code, "argv": list(args), "cwd": cwd}) + "\n")
        server.stdin.flush()
        answer: list = []
        reader = threading.Thread(target=lambda: answer.append(server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive() or not answer or not answer[0]:
            stop()
            if reader.is_alive():
                raise subprocess.TimeoutExpired(["other process", "-c", code[:80]], timeout)
            with open(_log()) as fh:
                tail = fh.read()[-3000:]
            raise RuntimeError(f"the other test process died running: {code[:200]}\n{tail}")
        done = json.loads(answer[0])
    return subprocess.CompletedProcess(["other process", "-c", code, *args], done["returncode"], done["stdout"],
                                       done["stderr"])


def _session():
    """The other process's Spark session: the test session's settings (local[2], its
    partitions and Arrow batches), so that a row is scored in the same batch on both sides;
    a test's own ``builder(...).getOrCreate()`` gets this one."""
    import tempfile

    from pyspark.sql import SparkSession

    from sparkdeep.session import builder
    from tests._session import session_config
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = session_config(tempfile.mkdtemp(prefix="sparkdeep-other-process-"), app_name="other-process")
    conf.settings["spark.driver.memory"] = "2g"
    session = builder(conf).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _restore(spark, settings: dict) -> None:
    """The session's runtime settings as they were before a test's code changed them."""
    now = dict(spark.conf.getAll)
    for key, value in now.items():
        if settings.get(key) != value:
            try:
                if key in settings:
                    spark.conf.set(key, settings[key])
                else:
                    spark.conf.unset(key)
            except Exception:  # noqa: BLE001 - a static setting: the same for every test anyway
                pass


def _serve() -> None:
    """The other process: one JSON request per line in, one answer per line out."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed outside a request (the JVM's, a library's) stays off the answers
    home = os.getcwd()
    spark = _session()
    settings = dict(spark.conf.getAll)
    for line in sys.stdin:
        request = json.loads(line)
        out, err, code = io.StringIO(), io.StringIO(), 0
        sys.argv = ["-c", *request["argv"]]
        try:
            os.chdir(request["cwd"] or home)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                    if exc.code is not None and not isinstance(exc.code, int):
                        print(exc.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001 - the test reads it as python -c's stderr
                    traceback.print_exc()
                    code = 1
        finally:
            os.chdir(home)
            from pyspark import SparkContext
            if SparkContext._active_spark_context is None:  # the test's code stopped it
                spark = _session()
                settings = dict(spark.conf.getAll)
            else:
                _restore(spark, settings)
        answers.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve()
