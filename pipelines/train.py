"""Training: the Horovod Keras estimator for the task.

The task (binary, multiclass, regression) comes from the dataset spec and sets the loss,
the metrics and the default network (``sparkdeep.tasks``, ``transformers/keras_models``);
``train.loss`` and ``train.metrics`` in the config override them. The baselines (what a
user would fit instead, on every feature) are in ``pipelines/baselines``. With
``tune.trials`` > 0 a search (``pipelines/tune``) picks the network's settings and
XGBoost's first; the network saved is then the best trial's own model.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging

from pyspark.ml import PipelineModel
from pyspark.ml.feature import IndexToString

from sparkdeep import lineage, model_store
from sparkdeep.registry import Columns, Models, Tables, strategy_takes
from sparkdeep.runs import AdhocStep, StepRun
from sparkdeep.tasks import DEFAULT_LOSS, DEFAULT_METRICS
from sparkdeep.transformers.keras.estimator import DistributedKerasEstimator
from sparkdeep.transformers.keras_models import TABULAR_BUILDERS

from . import baselines as bl
from .evaluate import check_finite as _check_finite
from .evaluate import classes_of
from .prepare import FEATURES, LABEL, WEIGHT, network_layout

log = logging.getLogger(__name__)

#: The scoring pipeline's column with the original class value (multiclass).
PREDICTED_CLASS = Columns.PREDICTED_CLASS


#: ``train.batch_size: 0``: the largest power of two giving each rank at least this many
#: updates per epoch, within [AUTO_BATCH_MIN, AUTO_BATCH_MAX].
AUTO_BATCH_STEPS, AUTO_BATCH_MIN, AUTO_BATCH_MAX = 64, 32, 1024


def auto_batch_size(rows: int, num_proc: int, validation_fraction: float) -> int:
    """The per-rank batch for ``rows`` training rows: a fixed batch of 1024 gives a 43k-row
    table about 20 updates an epoch, too few to converge in 8 epochs (bench/RESULTS.md);
    a small batch on a large table only costs speed."""
    per_rank = rows * (1.0 - validation_fraction) / max(int(num_proc), 1)
    batch = AUTO_BATCH_MIN
    while batch * 2 <= min(per_rank / AUTO_BATCH_STEPS, AUTO_BATCH_MAX):
        batch *= 2
    return batch


def keras_estimator(train_cfg, *, task: str, seed: int, classes: list[str] | None = None, run_id: str = "",
                    checkpoint_dir: str = "", trace_dir: str = "",
                    layout: dict | None = None, rows: int | None = None, row_id: str = "") -> DistributedKerasEstimator:
    """The estimator the train step uses, from the ``train`` section of the config.

    ``layout`` (``prepare.embedding_layout`` of an embedding-encoded prepare model, with
    ``numeric_dim``) picks the tabular network: one embedding per categorical column, the
    numbers beside them; without it, the MLP on the prepared vector. ``train.batch_size: 0``
    takes the batch from ``rows`` (:func:`auto_batch_size`). With ``train.trace``, the deep
    traces go to ``trace_dir``. ``row_id`` (the training table's key) draws each row's side
    of the validation split, identical rows apart."""
    t = train_cfg
    batch = t.batch_size
    if not batch:
        if rows is None:
            raise ValueError("train.batch_size 0 (from the row count) needs the training row count")
        batch = auto_batch_size(rows, t.num_proc, t.validation_fraction)
    args = {"hidden_units": list(t.hidden_units), "dropout": t.dropout}
    builder = ""
    if layout is not None:
        builder = TABULAR_BUILDERS[task]
        args.update(numeric_dim=int(layout["numeric_dim"]), cardinalities=list(layout["cardinalities"]),
                    normalization=t.normalization, numeric_embedding=t.numeric_embedding,
                    ensemble=t.ensemble)
    if task == "multiclass":
        if not classes:
            raise ValueError("a multiclass fit needs the class list (the label column's metadata)")
        args["num_classes"] = len(classes)
    return DistributedKerasEstimator(
        featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
        loss=t.loss or DEFAULT_LOSS[task], modelArgs=args, modelBuilder=builder,
        numProc=t.num_proc, epochs=t.epochs, batchSize=batch, learningRate=t.learning_rate, optimizer=t.optimizer,
        metrics=list(t.metrics or DEFAULT_METRICS[task]), validationFraction=t.validation_fraction, rowIdCol=row_id,
        earlyStoppingPatience=t.early_stopping_patience, accumulationSteps=t.accumulation_steps,
        compression=t.compression, warmupEpochs=t.warmup_epochs,
        lrSchedule=t.lr_schedule, strategy=t.strategy, stallTimeout=t.stall_timeout,
        shardEmbeddingsAbove=t.shard_embeddings_above,
        # Defaults a strategy does not take stay unset (its declaration says which: registry.STRATEGY_RULES).
        localSteps=t.local_steps if strategy_takes(t.strategy, "local_steps") else None,
        scaleLearningRate=t.scale_learning_rate if strategy_takes(t.strategy, "scale_learning_rate") else None,
        shuffleBufferRows=t.shuffle_buffer_rows, runId=run_id, checkpointDir=checkpoint_dir, seed=seed,
        traceDir=trace_dir if t.trace else None, traceEpoch=min(2, t.epochs) if t.trace else None)


def scoring_pipeline(prepare_model: PipelineModel, final_stage, classes: list[str] | None = None) -> PipelineModel:
    """The whole fitted pipeline: reduction stages, the trained model and, for k classes,
    an ``IndexToString`` giving ``predicted_class`` as the original class value."""
    stages = list(prepare_model.stages) + [final_stage]
    if classes:
        stages.append(IndexToString(inputCol=Columns.PREDICTION, outputCol=PREDICTED_CLASS, labels=list(classes)))
    return PipelineModel(stages)


def check_finite(model) -> None:
    """The train half of the quality gate for a fitted ``DistributedKerasModel``: every weight
    of its network and every metric of its final epoch finite, else ``QualityGateError``."""
    import numpy as np
    weights = {w.path: np.asarray(w.numpy()) for w in model.keras_model().weights}
    history = model.trainingSummary.get("history") or []
    _check_finite(weights, history[-1] if history else {})


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


def fit_models(spark, cfg, paths, run: StepRun | None = None,
               mlflow_run: str | None = None) -> tuple[PipelineModel, PipelineModel, dict]:
    """Fit Keras (Horovod) and the baselines; return both whole pipelines, unsaved.

    With ``tune.trials`` > 0, search the network's and XGBoost's settings first
    (``pipelines/tune``; each trial a child run of MLflow run ``mlflow_run``): the network
    is the best trial's model, XGBoost is fitted with the best settings found.

    Raises :class:`~sparkdeep.pipelines.evaluate.QualityGateError` when the network's
    weights or final metrics are not finite, so such a model is never saved.
    """
    run = run or AdhocStep(paths, "train")
    train = run.read(spark, Tables.TRAIN_PREPARED)
    version = run.inputs[Tables.TRAIN_PREPARED]["version"]
    prepare_model = model_store.load_pipeline(spark, run.model_input(Models.PREPARE))

    t = cfg.train
    task = cfg.dataset.task
    classes = classes_of(train) if task == "multiclass" else None
    fingerprint = lineage.fingerprint(train)
    forced = (run.run_id, run.generation) if run.forced else None
    layout = network_layout(prepare_model, train)
    key = cfg.dataset.key_column

    def estimator_for(train_cfg, checkpoint_run: str) -> DistributedKerasEstimator:
        return keras_estimator(train_cfg, task=task, classes=classes, seed=cfg.seed, run_id=checkpoint_run,
                               checkpoint_dir=paths.checkpoints, layout=layout, rows=fingerprint["rows"],
                               row_id=key if key in train.columns else "",
                               trace_dir=paths.trace_dir(run.run_id))

    def checkpoint_for(train_cfg) -> str:
        return checkpoint_key(dataclasses.replace(cfg, train=train_cfg), fingerprint, forced)

    from sparkdeep import tracking
    if cfg.tune.trials:  # Optuna (and its SQL store) only for a search
        from . import tune
    log_trials = functools.partial(tracking.log_trials, cfg, paths, mlflow_run) if mlflow_run else None
    searches: dict[str, dict] = {}
    network = None
    if cfg.tune.trials:
        network = tune.search_network(train, tune_cfg=cfg.tune, train_cfg=t, task=task, gate_metric=cfg.gate.metric,
                                      ref=tune.study_ref(cfg.tune, paths, run, tune.NETWORK),
                                      make_estimator=estimator_for, checkpoint_run=checkpoint_for,
                                      log_trials=log_trials)
        searches[tune.NETWORK] = network.report
        t = network.best_train
    checkpoint_run = network.checkpoint_run if network else checkpoint_for(t)
    estimator = estimator_for(t, checkpoint_run)
    if not t.batch_size:
        log.info("[train] batch size %s per rank, from %s training rows (train.batch_size 0)",
                 estimator.getBatchSize(), fingerprint['rows'])
    keras_model = estimator.fit(train)
    if network:
        keras_model.trainingSummary = tune.tuned_summary(keras_model.trainingSummary, network)
        log.info("[train] the network is tune trial %s's model (from its checkpoint %s, %s epochs)",
                 network.best.number, checkpoint_run, len(keras_model.trainingSummary['history']))
    check_finite(keras_model)
    keras_model.trainingSummary["scored_train_loss"] = scored_train_loss(
        keras_model, train, task, loss=estimator.getOrDefault(estimator.loss), seed=cfg.seed, rows=fingerprint["rows"])
    keras_model.trainingSummary["training_inputs"] = training_inputs(run, fingerprint, cfg.dataset.table)
    b = cfg.baselines
    names = bl.names_for(task, tuple(b.models) or None)
    xgboost_params = None
    with bl.assembled_rows(run.read(spark, Tables.TRAIN), prepare_model) as (front, rows):
        if cfg.tune.trials and cfg.tune.xgboost.enabled:
            xgb = tune.search_xgboost(rows, tune_cfg=cfg.tune, task=task, gate_metric=cfg.gate.metric, seed=cfg.seed,
                                      workers=t.num_proc, ref=tune.study_ref(cfg.tune, paths, run, tune.XGBOOST),
                                      log_trials=log_trials)
            searches[tune.XGBOOST], xgboost_params = xgb.report, xgb.best_params
        baseline, fit_s = bl.fit_assembled(front, rows, task, seed=cfg.seed, names=names, trees=b.trees,
                                           depth=b.depth, max_iter=b.max_iter, workers=t.num_proc,
                                           xgboost_params=xgboost_params)
    summary = keras_model.trainingSummary
    _log_fit(summary, t, fit_s)
    report = {"rows_in": fingerprint["rows"], "train_prepared_version": version, "task": task,
              "network": {"builder": estimator.getModelBuilder() or "mlp", "layout": layout,
                          "batch_size": estimator.getBatchSize(),
                          "batch_size_from": ("the training rows (train.batch_size 0)" if not t.batch_size
                                              else "train.batch_size")},
              "classes": classes, "checkpoint_run": checkpoint_run, "keras": summary,
              "baselines": {"fit_s": fit_s, "trees": b.trees, "depth": b.depth, "max_iter": b.max_iter,
                            "xgboost_params": xgboost_params or "the library's defaults"},
              "training_inputs": summary["training_inputs"]}
    if searches:
        report["tune"] = searches
    return (scoring_pipeline(prepare_model, keras_model, classes),
            baseline, report)


#: The most training rows :func:`scored_train_loss` scores (a seeded sample of rows above it).
SCORED_ROWS = 50_000


def scored_train_loss(model, train, task: str, *, loss: str, seed: int, rows: int) -> dict | None:
    """The fitted network's loss on its training rows as the saved model scores them (its
    ``transform``, weighted as the ranks weight: the mean of weight x loss), beside the
    ranks' last-epoch figure, so a model that scores otherwise than it trained shows in the
    step's report and on the console. At most :data:`SCORED_ROWS` rows (a seeded sample,
    each row drawn on its own; ``rows``: the table's row count, known from its fingerprint:
    no count here). None for a loss other than the task's usual ones."""
    losses = {"binary_crossentropy", "sparse_categorical_crossentropy", "mse", "mae"}
    if loss.lower() not in losses:
        return None
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    sample = train if rows <= SCORED_ROWS else train.sample(fraction=SCORED_ROWS / rows, seed=seed)
    scored = model.transform(sample.select(FEATURES, LABEL, WEIGHT))
    y, w = F.col(LABEL), F.col(WEIGHT)
    eps = 1e-7  # Keras' clip of a probability before its log
    if task == "binary":
        p = F.least(F.greatest(vector_to_array(Columns.PROBABILITY)[1], F.lit(eps)), F.lit(1 - eps))
        each = -(y * F.log(p) + (1 - y) * F.log(1 - p))
    elif task == "multiclass":
        p = F.element_at(vector_to_array(Columns.PROBABILITY), y.cast("int") + 1)
        each = -F.log(F.least(F.greatest(p, F.lit(eps)), F.lit(1 - eps)))
    else:
        d = F.col(Columns.PREDICTION) - y
        each = d * d if loss.lower() == "mse" else F.abs(d)
    row = scored.agg(F.avg(each * w).alias("loss"), F.count("*").alias("rows")).first()
    history = model.trainingSummary.get("history") or []
    # The epoch whose weights the model holds: the best one when training stopped early.
    kept = (min(history, key=lambda h: h.get("val_loss", h["loss"])) if model.trainingSummary.get("stopped_early")
            else history[-1]) if history else None
    out = {"loss": float(row["loss"]), "rows": int(row["rows"]),
           "ranks_kept_epoch": kept["loss"] if kept else None, "kept_epoch": kept["epoch"] if kept else None}
    log.info("[train] train loss as scored: %.4f on %d training rows (the ranks' figure for epoch %s, whose weights "
             "were kept: %s, measured while training: dropout on, weights moving)", out["loss"], out["rows"],
             out["kept_epoch"], "n/a" if kept is None else f"{kept['loss']:.4f}")
    return out


def _log_fit(summary: dict, t, fit_s: dict[str, float]) -> None:
    """The console lines of a fit: the network's launch and training (when it trained now,
    not a finished checkpoint loaded) and each baseline's fit time."""
    timings = summary.get("timings_s") or {}
    if "launch_to_first_step" in timings:
        log.info("[train] %s ranks (%s), %s epochs: launch to first step %.1fs, training %.1fs, fit total %.1fs",
                 t.num_proc, t.strategy, len(summary['history']), timings['launch_to_first_step'],
                 timings['training'], timings['fit_total'])
        if summary.get("launch_s"):
            log.info("[train] launch to first step, part by part: %s; after the last step %.1fs",
                     ", ".join(f"{k} {v:.1f}s" for k, v in summary["launch_s"].items()), timings.get("teardown", 0))
    log.info("[train] baselines on every assembled feature of every training row, fit time: %s",
             ", ".join(f"{n} {s:.1f}s" for n, s in fit_s.items()))


def training_inputs(run: StepRun, fingerprint: dict, source_table: str) -> dict:
    """The Delta versions behind the training table (from this run's prepare step when it
    wrote that version) and the training table's fingerprint; saved in the model."""
    tables = {Tables.TRAIN_PREPARED: run.inputs[Tables.TRAIN_PREPARED]}
    prep = run.report_of("prepare") or {}
    if (prep.get("tables", {}).get(Tables.TRAIN_PREPARED, {}).get("version") == tables[Tables.TRAIN_PREPARED]["version"]):
        tables.update({k: prep["tables"][k] for k in (source_table, Tables.TRAIN, Tables.HOLDOUT) if k in prep["tables"]})
    return {"trained_on": Tables.TRAIN_PREPARED, "tables": tables, "fingerprint": fingerprint, "run_id": run.run_id}


# -- the step (jobs/train.py runs it) ------------------------------------------

def train_step(spark, cfg, paths, run) -> dict:
    """Fit both pipelines (:func:`fit_models`, after a search with ``tune.trials`` > 0),
    save them as this run's models and log the fit (and each trial) to MLflow."""
    from sparkdeep import tracking
    # Made first, so a search's trials are its child runs.
    mlflow_run = tracking.step_run(cfg, paths, run.run_id) if cfg.tune.trials else None
    keras_pipeline, baseline_pipeline, report = fit_models(spark, cfg, paths, run, mlflow_run=mlflow_run)
    path = run.save_model(keras_pipeline, Models.PIPELINE)
    run.save_model(baseline_pipeline, Models.BASELINE)
    report["tracking"] = tracking.log_train(cfg, paths, run.run_id, report, path, mlflow_run=mlflow_run)
    if report["tracking"]:
        log.info("[train] MLflow run %s at %s", report['tracking']['mlflow_run_id'], report['tracking']['uri'])
    return report
