"""Training: the Horovod Keras estimator and the MLlib baseline for the task.

The task (binary, multiclass, regression) comes from the dataset spec and sets the loss,
the metrics and the default network (``sparkdeep.tasks``, ``transformers/keras_models``);
``train.loss`` and ``train.metrics`` in the config override them. The baseline is what a
user would try first on the same prepared, weighted features: MLlib's
``LogisticRegression`` (binomial or multinomial, chosen by the number of classes) or
``LinearRegression``.
"""
from __future__ import annotations

from pyspark.ml import PipelineModel
from pyspark.ml.feature import IndexToString
from pyspark.sql import DataFrame

from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator

from .evaluate import check_finite as _check_finite
from .prepare import FEATURES, LABEL, WEIGHT

DEFAULT_LOSS = {"binary": "binary_crossentropy", "multiclass": "sparse_categorical_crossentropy",
                "regression": "mse"}
DEFAULT_METRICS = {"binary": ("auc", "accuracy"), "multiclass": ("accuracy",), "regression": ("rmse", "mae")}
#: The scoring pipeline's column with the original class value (multiclass).
PREDICTED_CLASS = "predicted_class"


def keras_estimator(train_cfg, *, task: str, seed: int, classes: list[str] | None = None, run_id: str = "",
                    checkpoint_dir: str = "", staging_dir: str = "") -> KerasHorovodEstimator:
    """The estimator the train step uses, from the ``train`` section of the config."""
    t = train_cfg
    args = {"hidden_units": list(t.hidden_units), "dropout": t.dropout}
    if task == "multiclass":
        if not classes:
            raise ValueError("a multiclass fit needs the class list (the label column's metadata)")
        args["num_classes"] = len(classes)
    return KerasHorovodEstimator(
        featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
        loss=t.loss or DEFAULT_LOSS[task], modelArgs=args,
        numProc=t.num_proc, epochs=t.epochs, batchSize=t.batch_size, learningRate=t.learning_rate,
        metrics=list(t.metrics or DEFAULT_METRICS[task]), validationFraction=t.validation_fraction,
        earlyStoppingPatience=t.early_stopping_patience, accumulationSteps=t.accumulation_steps,
        compression=t.compression, scaleLearningRate=t.scale_learning_rate, warmupEpochs=t.warmup_epochs,
        runId=run_id, checkpointDir=checkpoint_dir, seed=seed, stagingDir=staging_dir)


def baseline(train: DataFrame, task: str):
    """MLlib's usual first model on the same prepared, weighted features."""
    if task == "regression":
        from pyspark.ml.regression import LinearRegression
        return LinearRegression(featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT, maxIter=100,
                                regParam=0.0).fit(train)
    from pyspark.ml.classification import LogisticRegression
    return LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
                              maxIter=100, regParam=0.0, family="auto").fit(train)


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
