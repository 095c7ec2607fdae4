"""A run's life cycle over one output folder: the context manager a job enters."""
from __future__ import annotations

import logging

from sparkdeep.config import Config
from sparkdeep.errors import error_line
from sparkdeep.paths import Paths
from sparkdeep.runs.ids import check_run_id, new_run_id
from sparkdeep.runs.lock import OutputLock
from sparkdeep.runs.manifest import Manifest, Status
from sparkdeep.runs.steps import RunStep
from sparkdeep.runs.table import record_run

log = logging.getLogger("sparkdeep.runs")


class Run:
    """One run's life cycle over one output folder.

    Entering takes the output lock and opens (or resumes) the manifest. :meth:`pending`
    says whether a step is to run; :meth:`start` and :meth:`finish` bracket it. Leaving
    marks the step that raised as failed (naming the cause in one line), upserts the run's
    row into the runs table when the job attached a Spark session (:attr:`session`), and
    releases the lock. The job keeps its arguments, the session and the exit codes.

    >>> with Run(cfg, "nightly") as run:                       # doctest: +SKIP
    ...     for name in STEPS:
    ...         if run.pending(name):
    ...             step_run = run.start(name)
    ...             run.finish(step_run, step(spark, cfg, run.paths, step_run))
    """

    def __init__(self, cfg: Config, run_id: str | None = None, *, force: bool = False, wait_lock: float = 0.0,
                 break_lock: bool = False):
        self.cfg = cfg
        self.run_id = check_run_id(run_id) if run_id else new_run_id()
        self.paths = Paths.under(cfg.output_dir)
        self.force = force
        self.manifest: Manifest | None = None
        self.current: str | None = None
        self.session = None
        #: Why a failure could not be written to the manifest (disk full...), or None.
        self.unrecorded: str | None = None
        self._lock = OutputLock(self.paths.root, self.run_id, wait_s=wait_lock, break_stale=break_lock)

    def __enter__(self) -> "Run":
        self._lock.__enter__()
        try:
            self.manifest = Manifest.open(self.paths, self.run_id, self.cfg, force=self.force)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    @property
    def status(self) -> Status:
        return self.manifest.record.status

    def pending(self, step: str) -> bool:
        """Whether ``step`` is to run now: not finished in this run, made stale, or --force."""
        entry = self.manifest.entry(step)
        if entry.status == Status.STALE:
            log.info("[%s] done in run %s but stale (%s): redoing it", step, self.run_id, entry.stale_because)
            return True
        if self.force or not self.manifest.done(step):
            return True
        log.info("[%s] already done in run %s: skipped (--force redoes it)", step, self.run_id)
        return False

    def start(self, step: str) -> RunStep:
        self.current = step
        return RunStep.start(self.manifest, step)

    def finish(self, step_run: RunStep, report: dict) -> None:
        self.manifest.finish(step_run.step, report)
        self.current = None

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.current is not None:
                try:
                    self.manifest.fail(self.current, error_line(exc))
                except OSError as err:  # the disk that failed the step may fail this too
                    self.unrecorded = error_line(err)
            if self.session is not None:
                try:
                    record_run(self.session, self.manifest)
                except Exception:  # noqa: BLE001 - after a failure, the step's own error is the one to report
                    if exc is None:
                        raise
        finally:
            self._lock.__exit__(None, None, None)
