"""Training: the Horovod Keras estimator and the MLlib logistic-regression baseline."""
from __future__ import annotations

from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.sql import DataFrame

from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator

from .evaluate import check_finite as _check_finite
from .flights import LABEL
from .prepare import FEATURES, WEIGHT


def keras_estimator(train_cfg, *, seed: int, run_id: str = "", checkpoint_dir: str = "",
                    staging_dir: str = "") -> KerasHorovodEstimator:
    """The estimator the train step uses, from the ``train`` section of the config."""
    t = train_cfg
    return KerasHorovodEstimator(
        featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
        modelBuilder="sparkdeep.transformers.keras_models:mlp_binary_classifier",
        modelArgs={"hidden_units": list(t.hidden_units), "dropout": t.dropout},
        numProc=t.num_proc, epochs=t.epochs, batchSize=t.batch_size, learningRate=t.learning_rate,
        metrics=list(t.metrics), validationFraction=t.validation_fraction,
        earlyStoppingPatience=t.early_stopping_patience, accumulationSteps=t.accumulation_steps,
        compression=t.compression, scaleLearningRate=t.scale_learning_rate, warmupEpochs=t.warmup_epochs,
        runId=run_id, checkpointDir=checkpoint_dir, seed=seed, stagingDir=staging_dir)


def logistic_baseline(train: DataFrame):
    """MLlib LogisticRegression on the same prepared, weighted features."""
    return LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
                              maxIter=100, regParam=0.0).fit(train)


def scoring_pipeline(prepare_model: PipelineModel, final_stage) -> PipelineModel:
    """The whole fitted pipeline: reduction stages then the trained model."""
    return PipelineModel(list(prepare_model.stages) + [final_stage])


def check_finite(model) -> None:
    """The train half of the quality gate for a fitted ``KerasHorovodModel``: every weight
    of its network and every metric of its final epoch finite, else ``QualityGateError``."""
    import numpy as np
    weights = {w.path: np.asarray(w.numpy()) for w in model.keras_model().weights}
    history = model.trainingSummary.get("history") or []
    _check_finite(weights, history[-1] if history else {})
