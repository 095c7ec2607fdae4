"""Pipeline: ingest, prepare, train, score and evaluate in order, as one run in one Spark session.

A rerun with the same --run-id skips the steps that run finished and resumes the one that
was interrupted (Horovod training resumes from its last epoch checkpoint). ``make run``
runs each step as its own process instead (same run id), as a scheduler would.
"""
from __future__ import annotations

import importlib
import logging
import sys

from sparkdeep import runs
from sparkdeep.jobs._common import execute, parser

# Named, not __name__: under `python -m` this module is "__main__", outside the
# sparkdeep logger and its handler.
log = logging.getLogger("sparkdeep.jobs.pipeline")

# Step name -> its function, for every step of the one registry (sparkdeep.runs.STEPS).
STEPS = {name: importlib.import_module(f"sparkdeep.jobs.{name}").step for name in runs.STEPS}


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.pipeline [--steps a,b,...] [options]``: the steps in one
    process and session; returns the exit status (2: an unknown step)."""
    p = parser("pipeline", __doc__)
    p.add_argument("--steps", default=",".join(STEPS),
                   help="comma-separated steps to run, in order (default: %(default)s)")
    args = p.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        log.error("pipeline: config error: --steps names unknown steps %s; known: %s", unknown, list(STEPS))
        return 2
    return execute(steps, STEPS, args, app_name="sparkdeep-pipeline")


if __name__ == "__main__":
    sys.exit(main())
