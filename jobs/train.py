"""Train: Keras on Horovod ranks + the logistic baseline; save both whole pipelines."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

from pyspark.ml import PipelineModel

from sparkdeep import delta_io
from sparkdeep.pipelines import train as tr

from sparkdeep.jobs._common import main_for


def fit_models(spark, cfg, paths) -> tuple[PipelineModel, PipelineModel, dict]:
    """Fit Keras (Horovod) and the baseline; return both whole pipelines, unsaved."""
    table = paths.table("train_prepared")
    version = delta_io.version_of(spark, table)
    train = delta_io.read(spark, table, version=version)
    prepare_model = PipelineModel.load(paths.model("prepare"))

    t = cfg.train
    # A run is keyed by the exact training input and settings: a rerun after a kill resumes
    # its checkpoint; new data or new settings start a new run.
    settings = hashlib.sha256(json.dumps([dataclasses.asdict(t), cfg.seed], sort_keys=True).encode()).hexdigest()
    run_id = f"train_prepared-v{version}-{settings[:10]}"
    estimator = tr.keras_estimator(t, seed=cfg.seed, run_id=run_id, checkpoint_dir=paths.checkpoints)
    keras_model = estimator.fit(train)
    baseline = tr.logistic_baseline(train)
    summary = keras_model.trainingSummary
    timings = summary.get("timings_s") or {}
    if timings:
        print(f"[train] {t.num_proc} Horovod ranks, {len(summary['history'])} epochs: launch to first step "
              f"{timings['launch_to_first_step']:.1f}s, training {timings['training']:.1f}s, "
              f"fit total {timings['fit_total']:.1f}s", flush=True)
    report = {"rows_in": train.count(), "train_prepared_version": version, "run_id": run_id, "keras": summary,
              "models": {"pipeline": paths.model("pipeline"), "baseline": paths.model("baseline")}}
    return (tr.scoring_pipeline(prepare_model, keras_model),
            tr.scoring_pipeline(prepare_model, baseline), report)


def step(spark, cfg, paths) -> dict:
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths)
    keras_pipeline.write().overwrite().save(paths.model("pipeline"))
    baseline_pipeline.write().overwrite().save(paths.model("baseline"))
    return report


main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
