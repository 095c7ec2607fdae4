"""Progress lines for long work: which Spark stages are running and how far along they are.

:func:`stage_progress` polls Spark's status tracker from a daemon thread while a step runs
and prints one line per active stage when its task count changes, at most every
``interval_s`` seconds, e.g.::

    [prepare] stage 14 (count at prepare.py:31): 5/8 tasks done, 2 running, 12s

Plain lines, not a redrawn bar, so they read the same in a terminal, a notebook, a
scheduler's log file and spark-submit's output. Per-epoch Horovod progress (samples/s and
the time left) comes from the estimator itself.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterator

log = logging.getLogger(__name__)

INTERVAL_ENV = "SPARKDEEP_PROGRESS_INTERVAL_S"


def _describe(info) -> str:
    name = (info.name or "").split("\n")[0][:60]
    return f"stage {info.stageId} ({name})"


@contextlib.contextmanager
def stage_progress(spark, label: str, interval_s: float | None = None) -> Iterator[None]:
    if interval_s is None:
        interval_s = float(os.environ.get(INTERVAL_ENV, "10"))
    if spark is None or interval_s <= 0:
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    seen: dict[int, tuple[int, int]] = {}
    started: dict[int, float] = {}

    def poll() -> None:
        while not stop.wait(interval_s):
            try:
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is None:
                        continue
                    started.setdefault(sid, time.time())
                    state = (info.numCompletedTasks, info.numActiveTasks)
                    if seen.get(sid) == state:
                        continue
                    seen[sid] = state
                    log.info("[%s] %s: %s/%s tasks done, %s running, %.0fs",
                             label, _describe(info), info.numCompletedTasks, info.numTasks, info.numActiveTasks,
                             time.time() - started[sid])
            except Exception:  # noqa: BLE001 - progress must never break the step (e.g. session stopping)
                return

    thread = threading.Thread(target=poll, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=interval_s + 1)
