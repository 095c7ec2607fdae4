"""Training: the Horovod Keras estimator and the MLlib logistic-regression baseline."""
from __future__ import annotations

from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegression
from pyspark.sql import DataFrame

from sparkdeep.transformers.keras_estimator import KerasHorovodEstimator

from .flights import LABEL
from .prepare import FEATURES, WEIGHT


def keras_estimator(*, num_proc: int, epochs: int, batch_size: int, learning_rate: float,
                    hidden_units, dropout: float, seed: int, staging_dir: str = "") -> KerasHorovodEstimator:
    return KerasHorovodEstimator(
        featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
        modelBuilder="sparkdeep.transformers.keras_models:mlp_binary_classifier",
        modelArgs={"hidden_units": list(hidden_units), "dropout": dropout},
        numProc=num_proc, epochs=epochs, batchSize=batch_size, learningRate=learning_rate,
        seed=seed, stagingDir=staging_dir)


def logistic_baseline(train: DataFrame):
    """MLlib LogisticRegression on the same prepared, weighted features."""
    return LogisticRegression(featuresCol=FEATURES, labelCol=LABEL, weightCol=WEIGHT,
                              maxIter=100, regParam=0.0).fit(train)


def scoring_pipeline(prepare_model: PipelineModel, final_stage) -> PipelineModel:
    """The whole fitted pipeline: reduction stages then the trained model."""
    return PipelineModel(list(prepare_model.stages) + [final_stage])
