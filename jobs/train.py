"""Train: Keras on Horovod ranks + the logistic baseline; save both whole pipelines."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

from pyspark.ml import PipelineModel

from sparkdeep import lineage, tracking
from sparkdeep.pipelines import train as tr
from sparkdeep.runs import StepRun

from sparkdeep.jobs._common import main_for, read_report


def fit_models(spark, cfg, paths, run: StepRun | None = None) -> tuple[PipelineModel, PipelineModel, dict]:
    """Fit Keras (Horovod) and the baseline; return both whole pipelines, unsaved."""
    run = run or StepRun.adhoc(paths, "train")
    train = run.read(spark, "train_prepared")
    version = run.inputs["train_prepared"]["version"]
    prepare_model = PipelineModel.load(paths.model("prepare"))

    t = cfg.train
    # A run is keyed by the exact training input and settings: a rerun after a kill resumes
    # its checkpoint; new data or new settings start a new run.
    settings = hashlib.sha256(json.dumps([dataclasses.asdict(t), cfg.seed], sort_keys=True).encode()).hexdigest()
    checkpoint_run = f"train_prepared-v{version}-{settings[:10]}"
    estimator = tr.keras_estimator(t, seed=cfg.seed, run_id=checkpoint_run, checkpoint_dir=paths.checkpoints)
    keras_model = estimator.fit(train)
    keras_model.trainingSummary["training_inputs"] = training_inputs(spark, paths, run, train)
    baseline = tr.logistic_baseline(train)
    summary = keras_model.trainingSummary
    timings = summary.get("timings_s") or {}
    if timings:
        print(f"[train] {t.num_proc} Horovod ranks, {len(summary['history'])} epochs: launch to first step "
              f"{timings['launch_to_first_step']:.1f}s, training {timings['training']:.1f}s, "
              f"fit total {timings['fit_total']:.1f}s", flush=True)
    report = {"rows_in": summary["training_inputs"]["fingerprint"]["rows"], "train_prepared_version": version,
              "checkpoint_run": checkpoint_run, "keras": summary, "training_inputs": summary["training_inputs"],
              "models": {"pipeline": paths.model("pipeline"), "baseline": paths.model("baseline")}}
    return (tr.scoring_pipeline(prepare_model, keras_model),
            tr.scoring_pipeline(prepare_model, baseline), report)


def training_inputs(spark, paths, run: StepRun, train) -> dict:
    """The Delta versions behind the training table (from this run's prepare step when it
    wrote that version) and the training table's fingerprint; saved in the model."""
    tables = {"train_prepared": run.inputs["train_prepared"]}
    prep = read_report(paths, "prepare", run.run_id) or {}
    if (prep.get("tables", {}).get("train_prepared", {}).get("version") == tables["train_prepared"]["version"]):
        tables.update({k: prep["tables"][k] for k in ("flights", "train", "holdout") if k in prep["tables"]})
    return {"trained_on": "train_prepared", "tables": tables, "fingerprint": lineage.fingerprint(train),
            "run_id": run.run_id}


def step(spark, cfg, paths, run) -> dict:
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths, run)
    keras_pipeline.write().overwrite().save(paths.model("pipeline"))
    baseline_pipeline.write().overwrite().save(paths.model("baseline"))
    report["tracking"] = tracking.log_train(cfg, paths, run.run_id, report, paths.model("pipeline"))
    if report["tracking"]:
        print(f"[train] MLflow run {report['tracking']['mlflow_run_id']} at {report['tracking']['uri']}", flush=True)
    return report


main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
