"""Where sparkdeep's messages go: the ``sparkdeep`` logger, one line a message.

Every module logs to ``logging.getLogger(__name__)``, under ``sparkdeep``. Importing the
package installs no handler (a library leaves that to its application); a job, a rank and
:func:`sparkdeep.notebook.start` install the console one (:func:`install_default`), which
prints INFO and above as the bare message: INFO to standard output (a step's start,
progress and result lines, as a scheduler's log shows them) and WARNING and above to
standard error. It does not pass records on to the root logger, so an application that
configured its own logging sees each line once.

Turning it down or routing it is ordinary ``logging``::

    logging.getLogger("sparkdeep").setLevel(logging.WARNING)   # quiet
    sparkdeep.logs.configure(handler=my_handler)                # route (Airflow, a service)
    sparkdeep.logs.configure(propagate=True)                    # to the root logger's handlers

The jobs' ``--quiet`` (warnings and errors only) and ``--verbose`` (debug lines, and Spark's
own INFO log) call :func:`configure`; ``SPARKDEEP_LOG_LEVEL`` sets the level before that.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

NAME = "sparkdeep"


class ConsoleHandler(logging.Handler):
    """INFO and below to ``sys.stdout``, WARNING and above to ``sys.stderr``, looked up at
    each record (so a notebook's or a test's replacement streams receive them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must not raise (a closed stream)
            self.handleError(record)


def configure(level: int | str | None = None, *, handler: logging.Handler | None = None,
              propagate: bool | None = None) -> logging.Logger:
    """Set the ``sparkdeep`` logger's level (a name such as ``"WARNING"`` or a number),
    replace its handler, or let its records reach the root logger's handlers."""
    logger = logging.getLogger(NAME)
    if level is not None:
        logger.setLevel(_level(level))
    if handler is not None:
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
    if propagate is not None:
        logger.propagate = propagate
    return logger


def _level(level: int | str) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(str(level).strip().upper())
    if not isinstance(value, int):
        raise ValueError(f"log level {level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return value


def install_default() -> None:
    """The console set-up of a job, a rank and a notebook (once per process): the console
    handler, INFO, no propagation; ``SPARKDEEP_LOG_LEVEL`` overrides the level. Importing
    sparkdeep installs nothing (a library's logger leaves the handlers to its application);
    an application that gave the logger a handler of its own keeps it."""
    logger = logging.getLogger(NAME)
    if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):  # set up already
        return
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.setLevel(_level(os.environ.get("SPARKDEEP_LOG_LEVEL", "INFO")))
    except ValueError:
        logger.setLevel(logging.INFO)
        logger.warning("SPARKDEEP_LOG_LEVEL=%r is not a log level: using INFO", os.environ["SPARKDEEP_LOG_LEVEL"])


# PySpark's loggers that print a Spark error raised to Python as a JSON record, the JVM's
# stack in it (17 KB for a division by zero), before the caller has seen the error.
PYSPARK_ERROR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def quiet_native(verbose: bool = False) -> None:
    """The libraries' own lines a job's user cannot act on, off unless ``verbose``.

    TensorFlow's native log for this process, the Spark workers and the Horovod ranks it
    starts: its start-up INFO lines (oneDNN, CPU features) and warnings off, or with
    ``verbose`` everything on; left alone when ``TF_CPP_MIN_LOG_LEVEL`` is set already.
    Call before TensorFlow is imported and before the session starts. Only the lines
    change: ``TF_ENABLE_ONEDNN_OPTS`` (which changes numerics) is left alone.

    PySpark's record of a Spark error it raises (:data:`PYSPARK_ERROR_LOGGERS`): the error
    itself still reaches the caller, which a job reports as one line (``--traceback``: with
    the JVM's stack)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "2")
    if not verbose:
        # Here, not at the top: every import of sparkdeep (a rank, the server) imports this
        # module, and pyspark.logger costs 0.3-0.4 s (measured). PySpark's own class: a
        # plain Logger by that name would refuse the keywords PySpark logs with.
        from pyspark.logger import PySparkLogger
        for name in PYSPARK_ERROR_LOGGERS:
            PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


@contextlib.contextmanager
def verbosity(quiet: bool = False, verbose: bool = False):
    """For the length of a job: ``quiet`` shows warnings and errors only, ``verbose`` debug
    lines too; neither leaves the level as it is. Yields the level for Spark's own log
    (``ERROR``, ``INFO`` or ``WARN``) and puts the logger's level back afterwards. Every job
    runs under it, so it installs the console handler (:func:`install_default`) first."""
    install_default()
    logger = logging.getLogger(NAME)
    before = logger.level
    if quiet:
        logger.setLevel(logging.WARNING)
    elif verbose:
        logger.setLevel(logging.DEBUG)
    try:
        yield "ERROR" if quiet else "INFO" if verbose else "WARN"
    finally:
        logger.setLevel(before)
