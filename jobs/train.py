"""Train: Keras on Horovod ranks + MLlib's usual models (on every feature); save both pipelines.

The network trains on the prepared (rebalanced, selected, projected) table; the baselines
on every row of the ingested training table through the prepare pipeline's encoding
front, every assembled feature: what a user would fit instead (``pipelines/baselines``).
"""
from __future__ import annotations

import logging
import sys

from sparkdeep import tracking
from sparkdeep.pipelines.train import fit_models
from sparkdeep.registry import Models

from sparkdeep.jobs._common import main_for

log = logging.getLogger(__name__)


def step(spark, cfg, paths, run) -> dict:
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths, run)
    path = run.save_model(keras_pipeline, Models.PIPELINE)
    run.save_model(baseline_pipeline, Models.BASELINE)
    report["tracking"] = tracking.log_train(cfg, paths, run.run_id, report, path)
    if report["tracking"]:
        log.info(f"[train] MLflow run {report['tracking']['mlflow_run_id']} at {report['tracking']['uri']}")
    return report


main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
