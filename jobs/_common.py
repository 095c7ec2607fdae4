"""What every job shares: arguments, config, the session, timing, the report, exit codes.

A job is a function ``step(spark, cfg, paths, run) -> dict``; :func:`main_for` turns it
into a ``main()`` that works under ``python -m`` and ``spark-submit``: it takes the output
folder's lock, opens the run's manifest (``sparkdeep.runs``), skips steps the run already
finished, writes ``<output>/reports/<step>.json`` (and the run's copy) and exits non-zero
with a one-line reason on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Callable

from sparkdeep import progress
from sparkdeep.config import Config, ConfigError, default_conf_dir, load_config
from sparkdeep.paths import Paths, write_json
from sparkdeep.runs import StepRun

Step = Callable[..., dict]


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m sparkdeep.jobs.{name}", description=description,
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf-dir", default=str(default_conf_dir()),
                   help="config folder holding base/ and the overlays (default: %(default)s)")
    p.add_argument("--env", default=None,
                   help="overlay folder under --conf-dir applied over base/ (e.g. local, ci, cluster)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.epochs=3 (repeatable)")
    p.add_argument("--output-dir", default=None,
                   help="where tables, models, reports and run manifests go (default: config output_dir)")
    p.add_argument("--run-id", default=None,
                   help="name of the run; rerunning a run id skips its finished steps and resumes the "
                        "interrupted one (default: a new id, UTC time + random suffix)")
    p.add_argument("--force", action="store_true",
                   help="redo the requested steps even if this run id finished them")
    p.add_argument("--wait-lock", type=float, default=0.0, metavar="SECONDS",
                   help="if another run holds the output folder, wait this long for it instead of "
                        "failing at once (default: 0)")
    p.add_argument("--traceback", action="store_true", help="print the full traceback on failure")
    return p


EPILOG = """exit status: 0 done (or every step already done for this run id), 1 a step failed,
2 bad config or arguments, 3 another run holds the output folder.
Outputs: <output>/tables (Delta), models/, reports/, runs/<run_id>/manifest.json and the
Delta table of runs at <output>/tables/runs."""


def load(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    return load_config(args.conf_dir, env=args.env, overrides=overrides)


def write_report(paths: Paths, name: str, report: dict) -> str:
    return write_json(paths.report(name), report)


def read_report(paths: Paths, name: str, run_id: str | None = None) -> dict | None:
    """A step's report: the run's own copy when ``run_id`` has one, else the latest."""
    path = paths.run_report(run_id, name) if run_id else None
    if not path or not os.path.exists(path):
        path = paths.report(name)
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def run_step(name: str, step: Step, spark, cfg: Config, paths: Paths, run: StepRun | None = None,
             process_started: float | None = None) -> dict:
    """Run one step in an existing session; time it and write its report.

    Without ``run`` (tests, notebooks) the step reads the latest table versions and writes
    without idempotency keys; :func:`execute` passes the run's :class:`StepRun`.
    ``process_started`` (a job alone in its process) adds ``process_wall_s``, Spark's
    start-up included.
    """
    run = run or StepRun.adhoc(paths, name)
    print(f"[{name}] start" + (f" (run {run.run_id})" if run.run_id else ""), flush=True)
    t0 = time.time()
    with progress.stage_progress(spark, name):
        report = step(spark, cfg, paths, run)
    report = {"step": name, "wall_s": round(time.time() - t0, 2), "run_id": run.run_id,
              "inputs": dict(run.inputs), "outputs": dict(run.outputs), **report}
    if process_started is not None:
        report["process_wall_s"] = round(time.time() - process_started, 2)
    write_report(paths, name, report)
    if run.run_id:
        write_json(paths.run_report(run.run_id, name), report)
    print(f"[{name}] done in {report['wall_s']:.1f}s", flush=True)
    return report


def execute(names: list[str], steps: dict[str, Step], args: argparse.Namespace, app_name: str) -> int:
    """Run ``names`` in order as one run: lock the output, skip finished steps, keep the manifest."""
    from sparkdeep.runs import Manifest, OutputLock, OutputLocked, check_run_id, new_run_id, record_run
    label = app_name.removeprefix("sparkdeep-")
    t0 = time.time()
    spark = manifest = None
    current = None
    try:
        cfg = load(args)
        run_id = check_run_id(args.run_id) if args.run_id else new_run_id()
        paths = Paths.under(cfg.output_dir)
        with OutputLock(paths.root, run_id, wait_s=args.wait_lock):
            manifest = Manifest.open(paths, run_id, cfg, force=args.force)
            print(f"[{label}] run {run_id}: manifest {manifest.path}", flush=True)
            todo = [n for n in names if args.force or not manifest.done(n)]
            for n in names:
                if n not in todo:
                    print(f"[{n}] already done in run {run_id}: skipped (--force redoes it)", flush=True)
            if todo:
                from sparkdeep.session import builder
                spark = builder(cfg.spark, app_name=app_name).getOrCreate()
                spark.sparkContext.setLogLevel("WARN")
            for i, n in enumerate(todo, 1):
                current = n
                print(f"[{label}] step {i}/{len(todo)}: {n}", flush=True)
                report = run_step(n, steps[n], spark, cfg, paths, manifest.start(n),
                                  process_started=t0 if len(names) == 1 else None)
                manifest.finish(n, report)
                current = None
            if spark is not None:
                record_run(spark, manifest)
            print(f"[{label}] run {run_id} {manifest.data['status']}: "
                  f"{sum(manifest.done(n) for n in names)}/{len(names)} requested steps done", flush=True)
    except ConfigError as exc:
        print(f"{label}: config error: {exc}", file=sys.stderr)
        return 2
    except OutputLocked as exc:
        print(f"{label}: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
        if args.traceback:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        line = f"{type(exc).__name__}: {first}"
        if manifest is not None and current is not None:
            manifest.fail(current, line)
            if spark is not None:
                try:
                    record_run(spark, manifest)
                except Exception:  # noqa: BLE001 - the step's own error is the one to report
                    pass
        print(f"{label}: failed" + (f" in step {current}" if current else "") + f": {line}", file=sys.stderr)
        return 1
    return 0


def main_for(name: str, description: str, step: Step) -> Callable[[list[str] | None], int]:
    def main(argv: list[str] | None = None) -> int:
        args = parser(name, description).parse_args(argv)
        return execute([name], {name: step}, args, app_name=f"sparkdeep-{name}")
    return main
