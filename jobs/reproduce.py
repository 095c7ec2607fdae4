"""Reproduce: re-create a saved model's exact training input by Delta time travel.

Reads the Delta versions recorded in the model's metadata (``training_inputs``), loads the
training table as of that version, checks it against the recorded row count and content
hash, and optionally writes it out (``--to``) for retraining or inspection. Works after
later runs have overwritten the tables, as long as the old versions were not vacuumed.

  python -m sparkdeep.jobs.reproduce --model output/models/latest.json --to /tmp/train_input
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from sparkdeep import logs
from sparkdeep.config import ConfigError, load_config
from sparkdeep.jobs._common import add_config_args, add_traceback, add_verbosity, failed, prog, start_session
from sparkdeep.registry import Models

# Named, not __name__: under `python -m` this module is "__main__", outside the
# sparkdeep logger and its handler.
log = logging.getLogger("sparkdeep.jobs.reproduce")


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.reproduce --model M [--to DIR] [options]``: re-create a
    model's recorded training table by time travel and check it; returns the exit status
    (0 re-created, 1 failed, 2 bad config or arguments)."""
    p = argparse.ArgumentParser(prog=prog("reproduce"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="saved pipeline (or Keras stage) folder, e.g. output/models/runs/<run id>/0/pipeline, "
                        "or output/models/latest.json for the promoted pipeline")
    p.add_argument("--table", default=None,
                   help="which recorded table to re-create (default: the one it was trained on; "
                        "the ingested table (named by the dataset spec), train and holdout are recorded too)")
    p.add_argument("--to", default=None, help="write the re-created table here as Delta (overwrite)")
    add_config_args(p, "Spark settings")
    add_traceback(p)
    add_verbosity(p)
    args = p.parse_args(argv)
    logs.quiet_native(args.verbose)
    with logs.verbosity(args.quiet, args.verbose) as spark_level:
        return _reproduce(args, spark_level)


def _reproduce(args: argparse.Namespace, spark_level: str) -> int:
    try:
        cfg = load_config(args.conf_dir, env=args.env, overrides=args.overrides)
        from sparkdeep import delta_io, lineage
        spark = start_session(cfg, "sparkdeep-reproduce", spark_level, args.traceback)
        model = args.model
        from sparkdeep.storage import Storage
        st = Storage(spark)
        if st.exists(model) and not st.is_dir(model):  # a models/latest.json pointer
            model = st.read_json(model)["models"][Models.PIPELINE]["path"]
        inputs = lineage.training_inputs(spark, model)
        table = args.table or inputs["trained_on"]
        if table not in inputs["tables"]:
            raise ConfigError(f"--table {table!r}: the model records {sorted(inputs['tables'])}")
        df, info = lineage.reproduce(spark, inputs, table)
        if args.to:
            info["written_to"] = delta_io.write(df, args.to).as_dict()
        print(json.dumps(info, sort_keys=True))  # the answer itself, not a log line
    except ConfigError as exc:
        log.error("reproduce: config error: %s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001
        return failed("reproduce", exc, args.traceback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
