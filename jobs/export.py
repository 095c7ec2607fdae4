"""Export: the promoted scoring pipeline as one Keras model that needs no Spark.

Reads ``models/latest.json`` under the output folder, checks the pipeline it points at,
and writes ``<output>/export/<run id>/``: ``model.keras`` (Keras 3, loads in safe mode:
``sparkdeep.pipelines.export.load_export``), ``saved_model/`` (TensorFlow
SavedModel, ``serving_default`` signature) and ``schema.json`` (the raw inputs under the
source's names, the outputs, the classes). See :mod:`sparkdeep.pipelines.export`.

With tracking on, the export is also logged as an MLflow model (pyfunc, signature on the
raw columns, :mod:`sparkdeep.pipelines.mlflow_model`) of the MLflow run the promoted model
was trained in, named ``export_model``; its ``models:/`` and ``runs:/`` URIs are printed.
By default only when that run exists (a model trained with tracking off is exported
without); ``--mlflow`` logs it always (into a new run tagged with the run id if need
be), ``--no-mlflow`` never.

  python -m sparkdeep.jobs.export --output-dir output
  mlflow.pyfunc.load_model("models:/<model id>").predict(pandas_df)   # tracking URI set
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from sparkdeep import logs
from sparkdeep.config import ConfigError
from sparkdeep.jobs._common import add_config_args, add_traceback, add_verbosity, failed, load, prog, start_session

# Named, not __name__: under `python -m` this module is "__main__", outside the
# sparkdeep logger and its handler.
log = logging.getLogger("sparkdeep.jobs.export")


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.export [options]``: export the promoted pipeline (and log
    it as an MLflow model); returns the exit status (0 exported, 1 failed, 2 bad config)."""
    p = argparse.ArgumentParser(prog=prog("export"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="exit status: 0 exported, 1 the export failed, 2 bad config or arguments.")
    p.add_argument("--output-dir", default=None,
                   help="the output folder whose promoted model is exported (default: config output_dir)")
    p.add_argument("--to", default=None, metavar="DIR",
                   help="write the export here instead of <output-dir>/export/<run id> (a local folder)")
    add_config_args(p, "Spark settings, tracking")
    p.add_argument("--mlflow", action=argparse.BooleanOptionalAction, default=None,
                   help="log the export as an MLflow model of the promoted model's MLflow run (default: when "
                        "tracking is on and that run exists; --mlflow: always, --no-mlflow: never)")
    add_traceback(p)
    add_verbosity(p)
    args = p.parse_args(argv)
    logs.quiet_native(args.verbose)
    with logs.verbosity(args.quiet, args.verbose) as spark_level:
        return _export(args, spark_level)


def _export(args: argparse.Namespace, spark_level: str) -> int:
    try:
        cfg = load(args)
        if args.mlflow and not cfg.tracking.enabled:
            raise ConfigError("--mlflow needs tracking on (tracking.enabled: true)")
        from sparkdeep.pipelines.export import export_promoted
        from sparkdeep.paths import Paths
        spark = start_session(cfg, "sparkdeep-export", spark_level, args.traceback)
        info = export_promoted(spark, Paths.under(cfg.output_dir), to=args.to)
        log.info("[export] the %s pipeline of run %s (%s) -> %s: %s, %s/, schema.json; %s raw inputs (%s%s)",
                 info['task'], info['run_id'], info['source'], info['out_dir'], info['files']['keras'],
                 info['files']['saved_model'], len(info['inputs']),
                 ', '.join((i['name'] for i in info['inputs'][:8])), ', ...' if len(info['inputs']) > 8 else '')
        result = {"out_dir": info["out_dir"], "run_id": info["run_id"], "task": info["task"]}
        logged = _log_mlflow(cfg, Paths.under(cfg.output_dir), info, args.mlflow)
        if logged:
            result["mlflow"] = {k: logged[k] for k in ("model_uri", "run_uri", "mlflow_run_id", "uri")}
        print(json.dumps(result))
    except ConfigError as exc:
        log.error("export: config error: %s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
        return failed("export", exc, args.traceback)
    return 0


def _log_mlflow(cfg, paths, info: dict, wanted: bool | None) -> dict | None:
    """The export logged as an MLflow model (:func:`log_mlflow_model`), or None: not wanted,
    or (by default) tracking off or no MLflow run of the promoted model's run."""
    from sparkdeep import tracking
    if wanted is False or not cfg.tracking.enabled:
        return None
    mlflow_run = tracking.existing_run(cfg, paths, info["run_id"])
    if mlflow_run is None and not wanted:
        log.info("[export] no MLflow run of run %s (trained with tracking off?): the MLflow model is not logged; "
                 "--mlflow logs it into a new run", info['run_id'])
        return None
    from sparkdeep.pipelines.mlflow_model import log_mlflow_model
    logged = log_mlflow_model(cfg, paths, info["run_id"], info["out_dir"], mlflow_run=mlflow_run)
    log.info("[export] MLflow model %s (%s) in %s", logged['model_uri'], logged['run_uri'], logged['uri'])
    return logged


if __name__ == "__main__":
    sys.exit(main())
