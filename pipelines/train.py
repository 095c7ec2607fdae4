"""Training: the Horovod Keras estimator for the task.

The task (binary, multiclass, regression) comes from the dataset spec and sets the loss,
the metrics and the default network (``sparkdeep.tasks``, ``transformers/keras_models``);
``train.loss`` and ``train.metrics`` in the config override them. The baselines (what a
user would fit instead, on every feature) are in ``pipelines/baselines``.
"""
from __future__ import annotations

from pyspark.ml import PipelineModel
from pyspark.ml.feature import IndexToString
from pyspark.sql import DataFrame

from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator
from sparkdeep.transformers.keras_models import TABULAR_BUILDERS

from .evaluate import check_finite as _check_finite
from .prepare import FEATURES, LABEL, WEIGHT

DEFAULT_LOSS = {"binary": "binary_crossentropy", "multiclass": "sparse_categorical_crossentropy",
                "regression": "mse"}
DEFAULT_METRICS = {"binary": ("auc", "accuracy"), "multiclass": ("accuracy",), "regression": ("rmse", "mae")}
#: The scoring pipeline's column with the original class value (multiclass).
PREDICTED_CLASS = "predicted_class"


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
                    checkpoint_dir: str = "",
                    layout: dict | None = None, rows: int | None = None) -> KerasHorovodEstimator:
    """The estimator the train step uses, from the ``train`` section of the config.

    ``layout`` (``prepare.embedding_layout`` of an embedding-encoded prepare model, with
    ``numeric_dim``) picks the tabular network: one embedding per categorical column, the
    numbers beside them; without it, the MLP on the prepared vector. ``train.batch_size: 0``
    takes the batch from ``rows`` (:func:`auto_batch_size`)."""
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
                    normalization=t.normalization)
    if task == "multiclass":
        if not classes:
            raise ValueError("a multiclass fit needs the class list (the label column's metadata)")
        args["num_classes"] = len(classes)
    return KerasHorovodEstimator(
        featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
        loss=t.loss or DEFAULT_LOSS[task], modelArgs=args, modelBuilder=builder,
        numProc=t.num_proc, epochs=t.epochs, batchSize=batch, learningRate=t.learning_rate,
        metrics=list(t.metrics or DEFAULT_METRICS[task]), validationFraction=t.validation_fraction,
        earlyStoppingPatience=t.early_stopping_patience, accumulationSteps=t.accumulation_steps,
        compression=t.compression, scaleLearningRate=t.scale_learning_rate, warmupEpochs=t.warmup_epochs,
        lrSchedule=t.lr_schedule,
        shuffleBufferRows=t.shuffle_buffer_rows, runId=run_id, checkpointDir=checkpoint_dir, seed=seed)


def scoring_pipeline(prepare_model: PipelineModel, final_stage, classes: list[str] | None = None) -> PipelineModel:
    """The whole fitted pipeline: reduction stages, the trained model and, for k classes,
    an ``IndexToString`` giving ``predicted_class`` as the original class value."""
    stages = list(prepare_model.stages) + [final_stage]
    if classes:
        stages.append(IndexToString(inputCol="prediction", outputCol=PREDICTED_CLASS, labels=list(classes)))
    return PipelineModel(stages)


def check_finite(model) -> None:
    """The train half of the quality gate for a fitted ``KerasHorovodModel``: every weight
    of its network and every metric of its final epoch finite, else ``QualityGateError``."""
    import numpy as np
    weights = {w.path: np.asarray(w.numpy()) for w in model.keras_model().weights}
    history = model.trainingSummary.get("history") or []
    _check_finite(weights, history[-1] if history else {})
