"""What every job shares: arguments, config, the session, timing, exit codes.

A job is a function ``step(spark, cfg, paths, run) -> dict``; :func:`main_for` turns it
into a ``main()`` that works under ``python -m`` and ``spark-submit``. The run's life cycle
(output lock, manifest, skipping finished or redoing stale steps, reports, the runs table)
belongs to :class:`sparkdeep.runs.Run`; this module adds the command line, the Spark
session and a one-line reason with an exit status on failure.

A failure is one line on standard error, the last: a training rank's as ``[train] rank 1
failed: AttributeError: ... (at transformers/keras/rank_loop.py:312 in fused)``, anything
else as ``train: failed in step train: <type>: <message's first line>`` (a Spark error's
root cause). ``--traceback`` prints the stacks before it: Python's, the JVM's, and a failed
rank's own traceback (which its process sent to the driver).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback
from typing import Callable

from sparkdeep import logs, progress, storage
from sparkdeep.config import Config, ConfigError, default_conf_dir, load_config
from sparkdeep.distributed import RankFailedError
from sparkdeep.errors import error_line
from sparkdeep.paths import Paths
from sparkdeep.runs import AdhocStep, StepRun

log = logging.getLogger(__name__)

Step = Callable[..., dict]


#: Job module -> the ``sparkdeep`` subcommand running it in this process (set by the console command).
_COMMANDS: dict[str, str] = {}


def invoked_as(module: str, command: str) -> None:
    """Record that the ``sparkdeep`` console command runs job ``module`` as ``command``."""
    _COMMANDS[module] = command


def prog(module: str) -> str:
    """The program a job's usage line names: what the user typed, ``sparkdeep <command>``
    or ``python -m sparkdeep.jobs.<module>`` (a ``spark-submit`` of the module)."""
    return f"sparkdeep {_COMMANDS[module]}" if module in _COMMANDS else f"python -m sparkdeep.jobs.{module}"


def parser(name: str, description: str) -> argparse.ArgumentParser:
    """The options every pipeline-step job takes (``--dataset``, ``--output-dir``,
    ``--run-id``, ``--force``, the lock, config, traceback and verbosity options), for the
    program :func:`prog` names; installs the console log handler."""
    logs.install_default()  # a job prints its lines; importing sparkdeep alone does not
    p = argparse.ArgumentParser(prog=prog(name), description=description,
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    p.add_argument("--dataset", default=None, metavar="NAME|PATH",
                   help="the dataset spec: a name under <conf-dir>/datasets/ (one per shipped example) or a "
                        "path to a spec .yaml (default: config data.dataset)")
    p.add_argument("--output-dir", default=None,
                   help="where tables, models, reports and run manifests go (default: config output_dir)")
    p.add_argument("--run-id", default=None,
                   help="name of the run; rerunning a run id skips its finished steps and resumes the "
                        "interrupted one (default: a new id, UTC time + random suffix)")
    p.add_argument("--force", action="store_true",
                   help="redo the requested steps even if this run id finished them; the later steps "
                        "that consume their outputs become stale and are redone, not skipped, next time")
    p.add_argument("--wait-lock", type=float, default=0.0, metavar="SECONDS",
                   help="if another run holds the output folder, wait this long for it instead of "
                        "failing at once (default: 0)")
    p.add_argument("--break-lock", action="store_true",
                   help="take over the output lock of a run that is known to be gone, on an hdfs:// or other "
                        "non-local output folder (a local folder's lock dies with its process; a lock left by "
                        "a run on this host is taken over without this)")
    add_traceback(p)
    add_verbosity(p)
    return p


def add_config_args(p: argparse.ArgumentParser, used_for: str = "") -> None:
    """``--conf-dir``, ``--env`` and ``--set``: which config the job loads (:func:`load`);
    ``used_for`` says what a job that runs no pipeline step reads from it."""
    why = f" ({used_for})" if used_for else ""
    p.add_argument("--conf-dir", default=str(default_conf_dir()),
                   help=f"config folder holding base/ and the overlays{why} (default: %(default)s)")
    p.add_argument("--env", default=None,
                   help="overlay folder under --conf-dir applied over base/ (e.g. local, ci, cluster)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.epochs=3 (repeatable)")


def add_traceback(p: argparse.ArgumentParser) -> None:
    """``--traceback``: the stacks behind a failure's one line (:func:`failed`)."""
    p.add_argument("--traceback", action="store_true",
                   help="on failure, print the full stacks before the one-line error: Python's, the JVM's "
                        "(Spark's) and a failed training rank's own traceback")


def add_verbosity(p: argparse.ArgumentParser) -> None:
    """``--quiet`` and ``--verbose`` (:func:`sparkdeep.logs.verbosity`)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true",
                   help="print only warnings and errors (sparkdeep's and Spark's own)")
    g.add_argument("-v", "--verbose", action="store_true", help="print debug lines too, and Spark's INFO log")


EPILOG = """exit status: 0 done (or every step already done for this run id), 1 a step failed,
2 bad config or arguments, 3 another run holds the output folder.
Outputs: <output>/tables (Delta), models/runs/<run_id>/ (each run's models), models/latest.json
(the models that last passed the quality gate), reports/, runs/<run_id>/manifest.json and the
Delta table of runs at <output>/tables/runs."""


HINT = "rerun with --traceback for the full stacks"
# Spark's setting that puts the JVM's stack into a Python-side Spark error's text.
JVM_STACKS = {"spark.sql.pyspark.jvmStacktrace.enabled": "true"}


def start_session(cfg: Config, app_name: str, spark_level: str, show_traceback: bool = False):
    """A job's Spark session: Spark's log at ``spark_level`` (:func:`sparkdeep.logs.verbosity`),
    started quiet unless that is INFO; ``show_traceback`` (``--traceback``) puts the JVM's stack
    into the text of the Spark errors raised to Python, for :func:`failed` to print."""
    # Here, not at the top: importing PySpark costs 0.3 s (measured), which --help, a bad
    # config and a run with nothing left to do skip.
    from sparkdeep.session import builder
    spark = builder(cfg.spark, app_name=app_name, quiet=spark_level != "INFO",
                    extra=JVM_STACKS if show_traceback else None).getOrCreate()
    spark.sparkContext.setLogLevel(spark_level)
    return spark


def failed(label: str, exc: BaseException, show_traceback: bool, step: str | None = None, note: str = "") -> int:
    """One line naming what failed and why, with ``note`` after it; exit status 1.

    A training rank's failure reads ``[step] rank 1 failed: <its line>`` (type, message and
    the frame in the user's code: :func:`sparkdeep.errors.error_line`), anything else
    ``label: failed in step <step>: <type>: <message's first line>``. ``show_traceback``
    prints the stacks first (Python's, the JVM's in a Spark error, the rank's own); without
    it the line ends in a hint to ask for them."""
    if show_traceback:
        traceback.print_exception(exc)
        details = getattr(exc, "details", "")
        if details:
            print(f"\nRank {exc.rank}'s own traceback, in its process:\n{details}", file=sys.stderr, end="")
    if isinstance(exc, RankFailedError):
        who = f"rank {exc.rank}" if exc.rank is not None else "a training rank"
        line = f"[{step or label}] {who} failed: {exc.message}"
    else:
        line = f"{label}: failed" + (f" in step {step}" if step else "") + f": {error_line(exc)}"
    log.error("%s%s%s", line, note, "" if show_traceback else f"; {HINT}")
    return 1


def load(args: argparse.Namespace) -> Config:
    """The config the parsed options ask for: ``--conf-dir``, ``--env`` and ``--set``, with
    ``--dataset`` and ``--output-dir`` as the overrides ``data.dataset`` and ``output_dir``."""
    overrides = list(args.overrides)
    if getattr(args, "dataset", None):
        overrides.insert(0, f"data.dataset={args.dataset}")
    if args.output_dir is not None:  # "" too: config refuses an empty output folder
        overrides.append(f"output_dir={args.output_dir}")
    return load_config(args.conf_dir, env=args.env, overrides=overrides)


def run_step(name: str, step: Step, spark, cfg: Config, paths: Paths, run: StepRun | None = None,
             process_started: float | None = None) -> dict:
    """Run one step in an existing session; time it and write its report.

    Without ``run`` (tests, notebooks) the step reads the latest table versions and writes
    without idempotency keys; :func:`execute` passes the run's :class:`~sparkdeep.runs.RunStep`.
    ``process_started`` (a job alone in its process) adds ``process_wall_s``, Spark's
    start-up included.
    """
    run = run or AdhocStep(paths, name)
    log.info("[%s] start%s", name, f" (run {run.run_id})" if run.run_id else "")
    t0 = time.time()
    with progress.stage_progress(spark, name):
        report = step(spark, cfg, paths, run)
    report = {"step": name, "wall_s": round(time.time() - t0, 2), "run_id": run.run_id,
              "inputs": dict(run.inputs), "outputs": dict(run.outputs), **report}
    if run.model_inputs or run.model_outputs:
        report.update(model_inputs=dict(run.model_inputs), model_outputs=dict(run.model_outputs))
    if process_started is not None:
        report["process_wall_s"] = round(time.time() - process_started, 2)
    run.save_report(report)
    log.info("[%s] done in %.1fs", name, report['wall_s'])
    return report


def execute(names: list[str], steps: dict[str, Step], args: argparse.Namespace, app_name: str,
            require: Callable[[Config], None] | None = None) -> int:
    """Run ``names`` in order as one run (:class:`sparkdeep.runs.Run`); return the exit status.
    ``require(cfg)`` raises :class:`ConfigError` for a config this job cannot run with
    (exit 2 before the run is opened)."""
    verbose = getattr(args, "verbose", False)
    logs.quiet_native(verbose)
    with logs.verbosity(getattr(args, "quiet", False), verbose) as spark_level:
        return _execute(names, steps, args, app_name, spark_level, require)


def _execute(names: list[str], steps: dict[str, Step], args: argparse.Namespace, app_name: str,
             spark_level: str, require: Callable[[Config], None] | None = None) -> int:
    from sparkdeep.runs import OutputLocked, Run
    label = app_name.removeprefix("sparkdeep-")
    t0 = time.time()
    run = None
    try:
        cfg = load(args)
        if require is not None:
            require(cfg)

        def session():
            return start_session(cfg, app_name, spark_level, getattr(args, "traceback", False))
        # A local output folder is locked and its manifest read without a JVM (a run whose
        # steps are all done starts no Spark); an hdfs:// or s3a:// one needs Spark's
        # Hadoop FileSystem from the start.
        early = None if storage.is_local(cfg.output_dir) else session()
        with Run(cfg, args.run_id, force=args.force, wait_lock=args.wait_lock,
                 break_lock=getattr(args, "break_lock", False)) as run:
            run.session = early
            log.info("[%s] run %s: manifest %s", label, run.run_id, run.manifest.path)
            for i, n in enumerate(names, 1):
                # Asked step by step: redoing one step can make a later one stale.
                if not run.pending(n):
                    continue
                if run.session is None:
                    run.session = session()
                log.info("[%s] step %s/%s: %s", label, i, len(names), n)
                step_run = run.start(n)
                report = run_step(n, steps[n], run.session, cfg, run.paths, step_run,
                                  process_started=t0 if len(names) == 1 else None)
                run.finish(step_run, report)
            log.info("[%s] run %s %s: %s/%s requested steps done",
                     label, run.run_id, run.status, sum((run.manifest.done(n) for n in names)), len(names))
    except ConfigError as exc:
        log.error("%s: config error: %s", label, exc)
        return 2
    except OutputLocked as exc:
        log.error("%s: %s", label, exc)
        return 3
    except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
        lost = f" (and the manifest could not record it: {run.unrecorded})" if run and run.unrecorded else ""
        return failed(label, exc, getattr(args, "traceback", False), run.current if run is not None else None, lost)
    return 0


def main_for(name: str, description: str, step: Step) -> Callable[[list[str] | None], int]:
    """A job module's ``main``: the step ``name`` (``step``) run as one step of a run.

    Parameters
    ----------
    name
        The step's name, in ``sparkdeep.runs.STEPS``; the program is
        ``python -m sparkdeep.jobs.<name>``.
    description
        The ``--help`` text (the job module's docstring).
    step
        ``step(spark, cfg, paths, run) -> dict``, the work (in ``sparkdeep.pipelines``).

    Returns
    -------
    Callable
        ``main(argv=None) -> int``: parses ``argv`` (:func:`parser`), runs the step
        (:func:`execute`) and returns the exit status.
    """
    def main(argv: list[str] | None = None) -> int:
        """Parse ``argv`` (default: the command line), run the step; the exit status."""
        args = parser(name, description).parse_args(argv)
        return execute([name], {name: step}, args, app_name=f"sparkdeep-{name}")
    return main
