"""What every job shares: arguments, config, the session, timing, the report, exit codes.

A job is a function ``step(spark, cfg, paths) -> dict``; :func:`main_for` turns it into
a ``main()`` that works under ``python -m`` and ``spark-submit``, writes
``<output>/reports/<step>.json`` and exits non-zero with a one-line reason on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Callable

from sparkdeep.config import Config, ConfigError, default_conf_dir, load_config
from sparkdeep.paths import Paths

Step = Callable[..., dict]


def parser(name: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m sparkdeep.jobs.{name}", description=description)
    p.add_argument("--conf-dir", default=str(default_conf_dir()),
                   help="config folder holding base/ and the overlays (default: %(default)s)")
    p.add_argument("--env", default=None,
                   help="overlay folder under --conf-dir applied over base/ (e.g. local, ci)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, e.g. --set train.epochs=3 (repeatable)")
    p.add_argument("--output-dir", default=None,
                   help="where tables, models and reports go (default: config output_dir)")
    p.add_argument("--traceback", action="store_true", help="print the full traceback on failure")
    return p


def load(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    return load_config(args.conf_dir, env=args.env, overrides=overrides)


def write_report(paths: Paths, name: str, report: dict) -> str:
    path = paths.report(name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, sort_keys=True, default=str)
    return path


def read_report(paths: Paths, name: str) -> dict | None:
    try:
        with open(paths.report(name)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def run_step(name: str, step: Step, spark, cfg: Config, paths: Paths) -> dict:
    """Run one step in an existing session; time it and write its report."""
    print(f"[{name}] start", flush=True)
    t0 = time.time()
    report = step(spark, cfg, paths)
    report = {"step": name, "wall_s": round(time.time() - t0, 2), **report}
    write_report(paths, name, report)
    print(f"[{name}] done in {report['wall_s']:.1f}s", flush=True)
    return report


def main_for(name: str, description: str, step: Step) -> Callable[[list[str] | None], int]:
    def main(argv: list[str] | None = None) -> int:
        args = parser(name, description).parse_args(argv)
        t0 = time.time()
        try:
            cfg = load(args)
            from sparkdeep.session import builder
            spark = builder(cfg.spark, app_name=f"sparkdeep-{name}").getOrCreate()
            spark.sparkContext.setLogLevel("WARN")
            paths = Paths.under(cfg.output_dir)
            report = run_step(name, step, spark, cfg, paths)
            report["process_wall_s"] = round(time.time() - t0, 2)
            write_report(paths, name, report)
        except ConfigError as exc:
            print(f"{name}: config error: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
            if args.traceback:
                traceback.print_exc()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"{name}: failed: {type(exc).__name__}: {first}", file=sys.stderr)
            return 1
        return 0
    return main
