"""Train: Keras on Horovod ranks + MLlib's usual models (on every feature); save both pipelines.

The network trains on the prepared (rebalanced, selected, projected) table; the baselines
on every row of the ingested training table through the prepare pipeline's encoding
front, every assembled feature: what a user would fit instead (``pipelines/baselines``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

from pyspark.ml import PipelineModel

from sparkdeep import lineage, model_store, tracking
from sparkdeep.registry import Models, Tables
from sparkdeep.pipelines import baselines as bl
from sparkdeep.pipelines import train as tr
from sparkdeep.pipelines.evaluate import classes_of
from sparkdeep.pipelines.prepare import network_layout
from sparkdeep.runs import StepRun

from sparkdeep.jobs._common import main_for


def checkpoint_key(cfg, fingerprint: dict, forced: tuple[str, int] | None = None) -> str:
    """The checkpoint folder's name for this training input, these settings and this
    ``--force`` generation of the run.

    Keyed by the input's content (its lineage fingerprint), not its Delta version: versions
    restart at 0 when a table is recreated, and new rows under an old version number must
    not resume, or load, another input's finished checkpoint. A rerun after a kill reads the
    same rows with the same settings, so it resumes. A run started or redone with ``--force``
    (``forced`` = its run id and generation) gets a folder of its own, so it trains afresh
    instead of loading a finished checkpoint, its own or another run's; a resume of that
    run and generation still finds it.
    """
    key = json.dumps([fingerprint, dataclasses.asdict(cfg.train), cfg.seed], sort_keys=True)
    base = "train-" + hashlib.sha256(key.encode()).hexdigest()[:20]
    if forced is None:
        return base
    return base + "-f" + hashlib.sha256(json.dumps(list(forced)).encode()).hexdigest()[:10]


def fit_models(spark, cfg, paths, run: StepRun | None = None) -> tuple[PipelineModel, PipelineModel, dict]:
    """Fit Keras (Horovod) and the baselines; return both whole pipelines, unsaved.

    Raises :class:`~sparkdeep.pipelines.evaluate.QualityGateError` when the network's
    weights or final metrics are not finite, so such a model is never saved.
    """
    run = run or StepRun.adhoc(paths, "train")
    train = run.read(spark, Tables.TRAIN_PREPARED)
    version = run.inputs[Tables.TRAIN_PREPARED]["version"]
    prepare_model = model_store.load_pipeline(spark, run.model_input(Models.PREPARE))

    t = cfg.train
    task = cfg.dataset.task
    classes = classes_of(train) if task == "multiclass" else None
    fingerprint = lineage.fingerprint(train)
    forced = run.manifest is not None and (run.generation > 0 or run.manifest.data.get("forced"))
    checkpoint_run = checkpoint_key(cfg, fingerprint, (run.run_id, run.generation) if forced else None)
    layout = network_layout(prepare_model, train)
    estimator = tr.keras_estimator(t, task=task, classes=classes, seed=cfg.seed, run_id=checkpoint_run,
                                   checkpoint_dir=paths.checkpoints, layout=layout, rows=fingerprint["rows"])
    if not t.batch_size:
        print(f"[train] batch size {estimator.getBatchSize()} per rank, from {fingerprint['rows']} training rows "
              f"(train.batch_size 0)", flush=True)
    keras_model = estimator.fit(train)
    tr.check_finite(keras_model)
    keras_model.trainingSummary["training_inputs"] = training_inputs(run, fingerprint, cfg.dataset.table)
    b = cfg.baselines
    baseline, fit_s = bl.fit_pipeline(run.read(spark, Tables.TRAIN), prepare_model, task, seed=cfg.seed,
                                      names=tuple(b.models) or None, trees=b.trees, depth=b.depth,
                                      max_iter=b.max_iter)
    summary = keras_model.trainingSummary
    timings = summary.get("timings_s") or {}
    if timings:
        print(f"[train] {t.num_proc} Horovod ranks, {len(summary['history'])} epochs: launch to first step "
              f"{timings['launch_to_first_step']:.1f}s, training {timings['training']:.1f}s, "
              f"fit total {timings['fit_total']:.1f}s", flush=True)
    print("[train] baselines on every assembled feature of every training row, fit time: " +
          ", ".join(f"{n} {s:.1f}s" for n, s in fit_s.items()), flush=True)
    report = {"rows_in": fingerprint["rows"], "train_prepared_version": version, "task": task,
              "network": {"builder": estimator.getModelBuilder() or "mlp", "layout": layout,
                          "batch_size": estimator.getBatchSize(),
                          "batch_size_from": ("the training rows (train.batch_size 0)" if not t.batch_size
                                              else "train.batch_size")},
              "classes": classes, "checkpoint_run": checkpoint_run, "keras": summary,
              "baselines": {"fit_s": fit_s, "trees": b.trees, "depth": b.depth, "max_iter": b.max_iter},
              "training_inputs": summary["training_inputs"]}
    return (tr.scoring_pipeline(prepare_model, keras_model, classes),
            baseline, report)


def training_inputs(run: StepRun, fingerprint: dict, source_table: str) -> dict:
    """The Delta versions behind the training table (from this run's prepare step when it
    wrote that version) and the training table's fingerprint; saved in the model."""
    tables = {Tables.TRAIN_PREPARED: run.inputs[Tables.TRAIN_PREPARED]}
    prep = run.report_of("prepare") or {}
    if (prep.get("tables", {}).get(Tables.TRAIN_PREPARED, {}).get("version") == tables[Tables.TRAIN_PREPARED]["version"]):
        tables.update({k: prep["tables"][k] for k in (source_table, Tables.TRAIN, Tables.HOLDOUT) if k in prep["tables"]})
    return {"trained_on": Tables.TRAIN_PREPARED, "tables": tables, "fingerprint": fingerprint, "run_id": run.run_id}


def step(spark, cfg, paths, run) -> dict:
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths, run)
    path = run.save_model(keras_pipeline, Models.PIPELINE)
    run.save_model(baseline_pipeline, Models.BASELINE)
    report["tracking"] = tracking.log_train(cfg, paths, run.run_id, report, path)
    if report["tracking"]:
        print(f"[train] MLflow run {report['tracking']['mlflow_run_id']} at {report['tracking']['uri']}", flush=True)
    return report


main = main_for("train", __doc__, step)

if __name__ == "__main__":
    sys.exit(main())
