"""The estimator's and the model's params, split by concern."""
from __future__ import annotations

import json
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasHandleInvalid, HasPredictionCol, HasProbabilityCol
from pyspark.sql import types as T

from sparkdeep import tasks
from sparkdeep.conf import base_section

from .._vectors import require_new

#: The estimator's defaults that ``conf/base/pipeline.yaml``'s ``train`` section also sets:
#: they are read from there (one home for each default), param -> train key. ``batchSize``
#: is the estimator's own (256): conf's 0 asks the pipeline to choose from the row count.
FROM_CONF_BASE = {
    "numProc": "num_proc", "epochs": "epochs", "learningRate": "learning_rate",
    "validationFraction": "validation_fraction", "earlyStoppingPatience": "early_stopping_patience",
    "accumulationSteps": "accumulation_steps", "compression": "compression",
    "scaleLearningRate": "scale_learning_rate", "warmupEpochs": "warmup_epochs", "stallTimeout": "stall_timeout",
    "lrSchedule": "lr_schedule", "strategy": "strategy", "localSteps": "local_steps",
    "shuffleBufferRows": "shuffle_buffer_rows", "shardEmbeddingsAbove": "shard_embeddings_above",
}


def conf_defaults(*params: str) -> dict:
    """The shipped ``conf/base`` values of these estimator params (:data:`FROM_CONF_BASE`)."""
    train = base_section("train")
    return {p: train[FROM_CONF_BASE[p]] for p in params}


class ScoringParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol, HasHandleInvalid):
    """Columns the fitted model reads and writes, and what to do with unusable rows: at
    fit, rows with a null or non-finite feature, label or weight raise ('error') or are
    dropped and counted in ``trainingSummary['skipped_rows']`` ('skip'); at transform, rows
    with a null or non-finite feature raise ('error') or get null outputs ('skip' or
    'keep': the row is kept, a NaN never becomes a class)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(handleInvalid="error")

    def setHandleInvalid(self, value: str):
        return self._set(handleInvalid=value)

    def setFeaturesCol(self, value: str):
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str):
        return self._set(probabilityCol=value)

    def _check_features(self, schema: T.StructType) -> None:
        col = self.getFeaturesCol()
        if col not in schema.fieldNames():
            raise ValueError(f"featuresCol {col!r} is not a column of the input "
                             f"(columns: {', '.join(schema.fieldNames())})")
        dtype = schema[col].dataType
        ok = isinstance(dtype, VectorUDT) or (
            isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, (T.FloatType, T.DoubleType)))
        if not ok:
            raise TypeError(f"featuresCol {col!r} must be a vector or array<float|double>, "
                            f"got {dtype.simpleString()}")

    def _check_outputs(self, schema: T.StructType) -> None:
        for param in (self.predictionCol, self.probabilityCol):
            if self.getOrDefault(param):
                require_new(schema, self.getOrDefault(param), param.name)

class NetworkParams(Params):
    """What to train: the network builder and the optimisation objective."""

    modelBuilder = Param(Params._dummy(), "modelBuilder",
                         "importable 'module:function' returning a keras.Model for input_dim "
                         "('' = the default MLP for the task the loss trains)",
                         typeConverter=TypeConverters.toString)
    modelArgs = Param(Params._dummy(), "modelArgs", "JSON object of keyword args for modelBuilder",
                      typeConverter=TypeConverters.toString)
    loss = Param(Params._dummy(), "loss", "Keras loss name; it sets the task (see sparkdeep.tasks): "
                 "binary_crossentropy, sparse_categorical_crossentropy, or mse/mae/huber/log_cosh for regression",
                 typeConverter=TypeConverters.toString)
    optimizer = Param(Params._dummy(), "optimizer", "Keras optimizer name",
                      typeConverter=TypeConverters.toString)
    learningRate = Param(Params._dummy(), "learningRate", "learning rate for one rank (> 0)",
                         typeConverter=TypeConverters.toFloat)
    metrics = Param(Params._dummy(), "metrics", "Keras metric names reported per epoch (e.g. auc, accuracy)",
                    typeConverter=TypeConverters.toListString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(modelBuilder="", modelArgs="{}", loss="binary_crossentropy", optimizer="adam", metrics=[],
                         **conf_defaults("learningRate"))

    def getModelBuilder(self) -> str:
        return self.getOrDefault(self.modelBuilder)

    def getTask(self) -> str:
        """The task the loss trains: binary, multiclass or regression."""
        return tasks.task_for_loss(self.getOrDefault(self.loss))

    def getModelArgs(self) -> dict:
        return json.loads(self.getOrDefault(self.modelArgs))

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

class RunParams(Params):
    """How to train: ranks, epochs, batches and each rank's memory bound."""

    numProc = Param(Params._dummy(), "numProc", "number of Horovod ranks (Spark tasks), >= 1",
                    typeConverter=TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "passes over the data, >= 1",
                   typeConverter=TypeConverters.toInt)
    scheduleEpochs = Param(Params._dummy(), "scheduleEpochs",
                           "epochs the learning-rate schedule (warm-up, cosine decay) spans; 0 = epochs. A fit "
                           "may stop short of it (epochs < scheduleEpochs) and a later fit with the same runId and "
                           "more epochs resume on the one schedule: a search's trial trained in rungs follows the "
                           "schedule of a fit of scheduleEpochs epochs", typeConverter=TypeConverters.toInt)
    batchSize = Param(Params._dummy(), "batchSize", "rows per step on each rank, >= 1",
                      typeConverter=TypeConverters.toInt)
    accumulationSteps = Param(Params._dummy(), "accumulationSteps",
                              "all-reduce and update every K batches (K >= 1; 1 = every batch)",
                              typeConverter=TypeConverters.toInt)
    compression = Param(Params._dummy(), "compression", "gradient compression for the all-reduce: none or fp16",
                        typeConverter=TypeConverters.toString)
    scaleLearningRate = Param(Params._dummy(), "scaleLearningRate",
                              "multiply learningRate by numProc (the effective batch grows with the ranks)",
                              typeConverter=TypeConverters.toBoolean)
    warmupEpochs = Param(Params._dummy(), "warmupEpochs",
                         "epochs over which the learning rate ramps linearly up to its scaled value",
                         typeConverter=TypeConverters.toFloat)
    lrSchedule = Param(Params._dummy(), "lrSchedule",
                       "after warm-up: 'constant', or 'cosine' (decays to 5% of the scaled rate by the last "
                       "planned epoch)", typeConverter=TypeConverters.toString)
    stallTimeout = Param(Params._dummy(), "stallTimeout",
                         "seconds a rank may go without a heartbeat before fit fails naming it (> 0)",
                         typeConverter=TypeConverters.toFloat)
    strategy = Param(Params._dummy(), "strategy",
                     "how the ranks agree: 'horovod' (ring all-reduce of the gradients every update), "
                     "'collective' (TensorFlow's MultiWorkerMirroredStrategy all-reduce; needs no Horovod) or "
                     "'local_sgd' (localSteps updates alone, then the weights averaged)",
                     typeConverter=TypeConverters.toString)
    localSteps = Param(Params._dummy(), "localSteps",
                       "local_sgd only: updates each rank takes alone between weight averages (K >= 1)",
                       typeConverter=TypeConverters.toInt)
    measureWait = Param(Params._dummy(), "measureWait",
                        "time a barrier before each update's exchange, so the time waiting for the other ranks "
                        "is reported apart from sending (wait_s; costs one small collective per update)",
                        typeConverter=TypeConverters.toBoolean)
    shardEmbeddingsAbove = Param(Params._dummy(), "shardEmbeddingsAbove",
                                 "bytes (>= 0; 0 = never): an embedding table of the tabular network larger than "
                                 "this is split by rows across the ranks, each holding and updating 1/numProc of "
                                 "it and of its optimizer slots, its rows exchanged all-to-all (model "
                                 "parallelism; strategy 'horovod'); the saved model holds the whole table",
                                 typeConverter=TypeConverters.toInt)
    traceDir = Param(Params._dummy(), "traceDir",
                     "folder for optional deep traces ('' = none): TensorFlow's profiler over epoch traceEpoch "
                     "of each rank (rank-<n>/, TensorBoard's profile tab) and Horovod's timeline "
                     "(horovod-timeline.json, chrome://tracing); the per-epoch profile is always kept",
                     typeConverter=TypeConverters.toString)
    traceEpoch = Param(Params._dummy(), "traceEpoch",
                       "the epoch (1-based) TensorFlow's profiler traces when traceDir is set (>= 1; the first "
                       "epoch also traces the step's graph)", typeConverter=TypeConverters.toInt)
    shuffleBufferRows = Param(Params._dummy(), "shuffleBufferRows",
                              "rows in each rank's shuffle window (>= 1): a rank holds at most this many rows "
                              "plus one stored chunk and a few batches, whatever its shard's size",
                              typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(scheduleEpochs=0, batchSize=256, measureWait=False, traceDir="", traceEpoch=2,
                         **conf_defaults("numProc", "epochs", "shuffleBufferRows", "accumulationSteps", "compression",
                                         "scaleLearningRate", "warmupEpochs", "stallTimeout", "lrSchedule",
                                         "strategy", "localSteps", "shardEmbeddingsAbove"))

    def setNumProc(self, value: int):
        return self._set(numProc=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def setScheduleEpochs(self, value: int):
        return self._set(scheduleEpochs=value)

    def getNumProc(self) -> int:
        return self.getOrDefault(self.numProc)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getScheduleEpochs(self) -> int:
        """The epochs the learning-rate schedule spans (``scheduleEpochs``, or ``epochs`` when 0)."""
        return self.getOrDefault(self.scheduleEpochs) or self.getEpochs()

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

class ValidationParams(Params):
    """Held-out rows per rank, and early stopping on their loss."""

    validationFraction = Param(Params._dummy(), "validationFraction",
                               "share of rows held out for validation, each row drawn on its own by a "
                               "seeded hash (rowIdCol); 0 = none",
                               typeConverter=TypeConverters.toFloat)
    validationCol = Param(Params._dummy(), "validationCol",
                          "boolean column marking validation rows ('' = use validationFraction; set, the "
                          "default validationFraction does not apply)",
                          typeConverter=TypeConverters.toString)
    rowIdCol = Param(Params._dummy(), "rowIdCol",
                     "column that tells rows apart (a key), hashed to draw each row's side of the "
                     "validationFraction split; '' = the whole row and its place among identical rows",
                     typeConverter=TypeConverters.toString)
    earlyStoppingPatience = Param(Params._dummy(), "earlyStoppingPatience",
                                  "stop after this many epochs without improvement of val_loss "
                                  "(loss without validation) and keep the best weights; 0 = off",
                                  typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(validationCol="", rowIdCol="",
                         **conf_defaults("validationFraction", "earlyStoppingPatience"))

    def validation_share(self) -> float:
        """The ``validationFraction`` a fit draws: none when ``validationCol`` marks the rows
        (the default fraction then does not apply; a fraction set as well is an error)."""
        return 0.0 if self.getOrDefault(self.validationCol) else self.getOrDefault(self.validationFraction)

class CheckpointParams(Params):
    """Per-epoch checkpoints under checkpointDir/runId; fit with the same runId resumes."""

    runId = Param(Params._dummy(), "runId", "names the run's checkpoint folder ('' = no checkpoints)",
                  typeConverter=TypeConverters.toString)
    checkpointDir = Param(Params._dummy(), "checkpointDir",
                          "folder for run checkpoints: local or any Hadoop URI (hdfs://, s3a://...); "
                          "the driver writes them",
                          typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(runId="", checkpointDir="")

    def checkpoint_folder(self) -> str | None:
        run, root = self.getOrDefault(self.runId), self.getOrDefault(self.checkpointDir)
        if not run:
            return None
        if not root:
            raise ValueError(f"runId {run!r} needs checkpointDir: where should its checkpoints go?")
        from sparkdeep import storage
        return storage.join(storage.qualify(root), run)
