"""Compress: smaller variants of the promoted network, each measured against it.

Reads ``models/latest.json`` under the output folder, builds the variants named by
``compress.variants`` (``int8``, ``int4``, ``float8``, ``bfloat16``: post-training
quantization; ``prune``: magnitude pruning to ``compress.sparsity`` fine-tuned on the
ranks; ``distill``: a smaller student trained on the ranks against the teacher's outputs
and the labels), saves each as a scoring pipeline under ``runs/<run id>/compress/<variant>/``
and writes ``runs/<run id>/reports/compress.json`` (size on disk, parameters, rows/s through
``transform`` and ``model.predict``, peak memory, held-out metric and its difference) and
``compress.png``. Off by default: ``compress.enabled: true`` (or ``--set compress.enabled=true``).
See :mod:`sparkdeep.pipelines.compress`.

  python -m sparkdeep.jobs.compress --output-dir output --set compress.enabled=true
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from sparkdeep import logs, tracking
from sparkdeep.config import Config, ConfigError
from sparkdeep.jobs._common import add_config_args, add_traceback, add_verbosity, failed, load, prog, start_session

log = logging.getLogger("sparkdeep.jobs.compress")


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkdeep.jobs.compress [options]``: build and measure the variants of the
    promoted network; returns the exit status (0 compressed, 1 failed, 2 bad config or off)."""
    p = argparse.ArgumentParser(prog=prog("compress"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="exit status: 0 compressed, 1 it failed, 2 bad config or arguments "
                                       "(compress.enabled false included).")
    p.add_argument("--output-dir", default=None,
                   help="the output folder whose promoted model is compressed (default: config output_dir)")
    add_config_args(p, "Spark settings, train's rank settings, compress, tracking")
    p.add_argument("--dataset", default=None,
                   help="data set spec (default: the one the output folder holds, its dataset.json)")
    add_traceback(p)
    add_verbosity(p)
    args = p.parse_args(argv)
    logs.quiet_native(args.verbose)
    with logs.verbosity(args.quiet, args.verbose) as spark_level:
        return _compress(args, spark_level)


def load_for_output(args: argparse.Namespace) -> Config:
    """The config, its data set the one the output folder holds (``dataset.json``, written
    by ingest) when ``--dataset`` is not given: the holdout's key and the task come from
    it. A ``--dataset`` naming another data set than the folder's is an error."""
    from sparkdeep import storage
    from sparkdeep.paths import read_json
    cfg = load(args)
    owner = read_json(storage.join(cfg.output_dir, "dataset.json")) or {}
    name = owner.get("name")
    if name is None or cfg.dataset is None or cfg.dataset.name == name:
        return cfg
    if args.dataset:
        raise ConfigError(f"--dataset {args.dataset!r} is data set {cfg.dataset.name!r}, but the output folder "
                          f"{cfg.output_dir!r} holds data set {name!r} (its dataset.json): leave --dataset out")
    spec = owner.get("spec_file")
    return load(argparse.Namespace(**{**vars(args), "dataset": spec if spec and os.path.isfile(spec) else name}))


def _compress(args: argparse.Namespace, spark_level: str) -> int:
    try:
        cfg = load_for_output(args)
        if not cfg.compress.enabled:
            raise ConfigError("compress.enabled is false: the compress step is off by default; set "
                              "compress.enabled: true (or --set compress.enabled=true)")
        if not cfg.compress.variants:
            raise ConfigError("compress.variants is empty: name at least one variant")
        from sparkdeep.paths import Paths
        from sparkdeep.pipelines.compress import compress_promoted, table
        spark = start_session(cfg, "sparkdeep-compress", spark_level, args.traceback)
        paths = Paths.under(cfg.output_dir)
        report = compress_promoted(spark, cfg, paths)
        log.info("[compress] run %s (%s, %s holdout rows):\n%s",
                 report["run_id"], report["task"], report["holdout_rows"], table(report))
        logged = tracking.log_compress(cfg, paths, report["run_id"], report,
                                       [f for f in (report["report_json"], report["plot"]) if f])
        if logged:
            log.info("[compress] MLflow run %s at %s (compress/)", logged['mlflow_run_id'], logged['uri'])
        print(json.dumps({"run_id": report["run_id"], "report": report["report_json"], "plot": report["plot"],
                          "variants": [r["variant"] for r in report["variants"][1:]]}))
    except ConfigError as exc:
        log.error("compress: config error: %s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for schedulers, details on request
        return failed("compress", exc, args.traceback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
