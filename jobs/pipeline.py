"""Pipeline: ingest, prepare, train, score and evaluate in order, in one Spark session.

``make run`` instead runs each step as its own process (so scoring really loads the
saved pipeline in a fresh interpreter); this job is the one-session form for notebooks
and schedulers.
"""
from __future__ import annotations

import sys

from sparkdeep.jobs import evaluate, ingest, prepare, score, train
from sparkdeep.jobs._common import parser, load, run_step

STEPS = {"ingest": ingest.step, "prepare": prepare.step, "train": train.step,
         "score": score.step, "evaluate": evaluate.step}


def main(argv: list[str] | None = None) -> int:
    p = parser("pipeline", __doc__)
    p.add_argument("--steps", default=",".join(STEPS),
                   help="comma-separated steps to run, in order (default: %(default)s)")
    args = p.parse_args(argv)
    from sparkdeep.config import ConfigError
    from sparkdeep.paths import Paths
    try:
        cfg = load(args)
        steps = [s.strip() for s in args.steps.split(",") if s.strip()]
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            raise ConfigError(f"--steps names unknown steps {unknown}; known: {list(STEPS)}")
        from sparkdeep.session import builder
        spark = builder(cfg.spark, app_name="sparkdeep-pipeline").getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        paths = Paths.under(cfg.output_dir)
        for name in steps:
            run_step(name, STEPS[name], spark, cfg, paths)
    except ConfigError as exc:
        print(f"pipeline: config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"pipeline: failed: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
