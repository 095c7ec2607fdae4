"""Horovod-on-Spark Keras training as an MLlib Estimator, and its batch-scoring Model.

``KerasHorovodEstimator.fit(df)`` runs one Spark barrier stage of ``numProc`` tasks over
``df`` repartitioned ``numProc`` ways; each task spills its own partition to its local
disk and starts one Horovod rank (Gloo ring all-reduce) that streams it through a
bounded shuffle window every epoch (``sparkdeep.distributed``, ``._rank_feed``), and
``fit`` returns a :class:`KerasHorovodModel` holding the trained network as
``.keras`` bytes. The model scores whole Arrow batches with an iterator Arrow UDF and
saves through MLlib persistence: JSON metadata plus ``model/model.keras``.

Example
-------
>>> est = KerasHorovodEstimator(featuresCol="features", labelCol="label",
...                             numProc=2, epochs=3)           # doctest: +SKIP
>>> model = est.fit(train_df)                                   # doctest: +SKIP
>>> model.transform(test_df).select("probability", "prediction")  # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import os
import re
import time
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasHandleInvalid, HasLabelCol, HasPredictionCol,
                                     HasProbabilityCol, HasSeed, HasWeightCol)
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import tasks
from sparkdeep.distributed import run_on_ranks
from sparkdeep.registry import Choices
from sparkdeep.storage import Storage

from . import _rank_training
from .keras import strategies
from ._rank_feed import ShardSpill, chunk_rows_for
from ._vectors import list_matrix, require_new
from .keras_models import DEFAULT_BUILDERS
from .sampling import hash_uniform

log = logging.getLogger(__name__)

KERAS_FILE = "model/model.keras"


# -- params, split by concern ------------------------------------------------------------

class _KerasScoringParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol, HasHandleInvalid):
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


class _KerasNetworkParams(Params):
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
        self._setDefault(modelBuilder="", modelArgs="{}", loss="binary_crossentropy", optimizer="adam",
                         learningRate=0.001, metrics=[])

    def getModelBuilder(self) -> str:
        return self.getOrDefault(self.modelBuilder)

    def getTask(self) -> str:
        """The task the loss trains: binary, multiclass or regression."""
        return tasks.task_for_loss(self.getOrDefault(self.loss))

    def getModelArgs(self) -> dict:
        return json.loads(self.getOrDefault(self.modelArgs))

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)


class _HorovodRunParams(Params):
    """How to train: ranks, epochs, batches and each rank's memory bound."""

    numProc = Param(Params._dummy(), "numProc", "number of Horovod ranks (Spark tasks), >= 1",
                    typeConverter=TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "passes over the data, >= 1",
                   typeConverter=TypeConverters.toInt)
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
    shuffleBufferRows = Param(Params._dummy(), "shuffleBufferRows",
                              "rows in each rank's shuffle window (>= 1): a rank holds at most this many rows "
                              "plus one stored chunk and a few batches, whatever its shard's size",
                              typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(numProc=2, epochs=5, batchSize=256, shuffleBufferRows=65536, accumulationSteps=1,
                         compression="none", scaleLearningRate=True, warmupEpochs=1.0, stallTimeout=120.0,
                         lrSchedule="constant", strategy="horovod", localSteps=8, measureWait=False)

    def setNumProc(self, value: int):
        return self._set(numProc=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def getNumProc(self) -> int:
        return self.getOrDefault(self.numProc)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)


class _ValidationParams(Params):
    """Held-out rows per rank, and early stopping on their loss."""

    validationFraction = Param(Params._dummy(), "validationFraction",
                               "share of rows held out for validation, by row hash (0 = none)",
                               typeConverter=TypeConverters.toFloat)
    validationCol = Param(Params._dummy(), "validationCol",
                          "boolean column marking validation rows ('' = use validationFraction)",
                          typeConverter=TypeConverters.toString)
    earlyStoppingPatience = Param(Params._dummy(), "earlyStoppingPatience",
                                  "stop after this many epochs without improvement of val_loss "
                                  "(loss without validation) and keep the best weights; 0 = off",
                                  typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(validationFraction=0.0, validationCol="", earlyStoppingPatience=0)


class _CheckpointParams(Params):
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


# -- estimator ---------------------------------------------------------------------------

class KerasHorovodEstimator(Estimator, _KerasScoringParams, _KerasNetworkParams, _HorovodRunParams,
                            _ValidationParams, _CheckpointParams, HasLabelCol, HasWeightCol, HasSeed):
    """Train a Keras 3 model on ``numProc`` Horovod ranks launched by Spark.

    The network comes from ``model`` (a ``keras.Model``, shipped as ``.keras`` bytes:
    what a notebook user writes) or from ``modelBuilder`` (``"module:function"`` called
    with ``input_dim`` and ``modelArgs``: what a job or a saved estimator uses).
    """

    @keyword_only
    def __init__(self, *, model: Any = None, featuresCol: str = "features", labelCol: str = "label",
                 weightCol: str | None = None, predictionCol: str = "prediction",
                 probabilityCol: str = "probability", modelBuilder: str | None = None,
                 modelArgs: str | dict | None = None, loss: str | None = None,
                 optimizer: str | None = None, learningRate: float | None = None,
                 metrics: list[str] | None = None, numProc: int | None = None, epochs: int | None = None,
                 batchSize: int | None = None, accumulationSteps: int | None = None,
                 compression: str | None = None, scaleLearningRate: bool | None = None,
                 warmupEpochs: float | None = None, lrSchedule: str | None = None,
                 validationFraction: float | None = None,
                 validationCol: str | None = None, earlyStoppingPatience: int | None = None,
                 runId: str | None = None, checkpointDir: str | None = None,
                 shuffleBufferRows: int | None = None, seed: int | None = None, handleInvalid: str | None = None,
                 stallTimeout: float | None = None, strategy: str | None = None, localSteps: int | None = None,
                 measureWait: bool | None = None):
        super().__init__()
        self._setDefault(seed=42)
        self._model_bytes: bytes | None = None
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "KerasHorovodEstimator":
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if "model" in kwargs:
            self.setModel(kwargs.pop("model"))
        if isinstance(kwargs.get("modelArgs"), dict):
            kwargs["modelArgs"] = json.dumps(kwargs["modelArgs"], sort_keys=True)
        return self._set(**kwargs)

    def setModel(self, model) -> "KerasHorovodEstimator":
        """Train this ``keras.Model`` (its architecture and initial weights)."""
        self._model_bytes = _rank_training.keras_to_bytes(model)
        return self

    def _validate(self, dataset: DataFrame) -> None:
        schema = dataset.schema
        self._check_features(schema)
        label = self.getLabelCol()
        if label not in schema.fieldNames():
            raise ValueError(f"labelCol {label!r} is not a column of the input")
        if not isinstance(schema[label].dataType, T.NumericType):
            raise TypeError(f"labelCol {label!r} must be numeric, got "
                            f"{schema[label].dataType.simpleString()}")
        if self.isDefined(self.weightCol) and self.getWeightCol():
            wcol = self.getWeightCol()
            if wcol not in schema.fieldNames() or not isinstance(schema[wcol].dataType, T.NumericType):
                raise ValueError(f"weightCol {wcol!r} must be a numeric column of the input")
        for name, value, low in (("numProc", self.getNumProc(), 1), ("epochs", self.getEpochs(), 1),
                                 ("batchSize", self.getBatchSize(), 1),
                                 ("shuffleBufferRows", self.getOrDefault(self.shuffleBufferRows), 1)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if not (math.isfinite(self.getLearningRate()) and self.getLearningRate() > 0):
            raise ValueError(f"learningRate must be a finite number > 0, got {self.getLearningRate()}")
        stall = self.getOrDefault(self.stallTimeout)
        if not (math.isfinite(stall) and stall > 0):
            raise ValueError(f"stallTimeout must be a finite number of seconds > 0, got {stall}")
        if self.getHandleInvalid() not in ("error", "skip"):
            raise ValueError(f"handleInvalid must be 'error' or 'skip' at fit, got {self.getHandleInvalid()!r}")
        task = self.getTask()
        for name in self.getOrDefault(self.metrics):
            tasks.metric_class(name, task)
        if self.getOrDefault(self.accumulationSteps) < 1:
            raise ValueError(f"accumulationSteps must be >= 1, got {self.getOrDefault(self.accumulationSteps)}")
        for param, allowed in ((self.lrSchedule, Choices.LR_SCHEDULES), (self.compression, Choices.COMPRESSIONS),
                               (self.strategy, Choices.STRATEGIES)):
            if self.getOrDefault(param) not in allowed:
                raise ValueError(f"{param.name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {self.getOrDefault(param)!r}")
        self._check_strategy_params()
        frac, vcol = self.getOrDefault(self.validationFraction), self.getOrDefault(self.validationCol)
        if not 0 <= frac < 1:
            raise ValueError(f"validationFraction must be in [0, 1), got {frac}")
        if vcol and frac:
            raise ValueError("set validationCol or validationFraction, not both")
        if vcol and (vcol not in schema.fieldNames() or not isinstance(schema[vcol].dataType, T.BooleanType)):
            raise ValueError(f"validationCol {vcol!r} must be a boolean column of the input")
        if self.getOrDefault(self.earlyStoppingPatience) < 0:
            raise ValueError("earlyStoppingPatience must be >= 0")
        self.checkpoint_folder()
        master = dataset.sparkSession.sparkContext.getConf().get("spark.master", "")
        slots = task_slots(dataset.sparkSession.sparkContext, self.getNumProc())
        if self.getNumProc() > slots:
            raise ValueError(f"numProc={self.getNumProc()} exceeds the {slots} tasks Spark can run at once "
                             f"(master {master!r}); every rank needs a concurrent task, or the launch would "
                             "wait forever: lower numProc or add executor cores")
        if self._model_bytes is None:
            _resolve_builder(self._builder_name())
        try:
            self.getModelArgs()
        except json.JSONDecodeError as exc:
            raise ValueError(f"modelArgs is not a JSON object: {exc}") from None

    def _check_strategy_params(self) -> None:
        """A param the chosen strategy does not use is an error, not silently ignored."""
        strategy = self.getOrDefault(self.strategy)
        if self.getOrDefault(self.localSteps) < 1:
            raise ValueError(f"localSteps must be >= 1, got {self.getOrDefault(self.localSteps)}")
        if strategy != "horovod" and self.getOrDefault(self.compression) != "none":
            raise ValueError(f"compression={self.getOrDefault(self.compression)!r} applies to strategy='horovod' "
                             f"only (Horovod's fp16 wire format); strategy={strategy!r} sends float32")
        if strategy == "local_sgd" and self.getOrDefault(self.accumulationSteps) != 1:
            raise ValueError("accumulationSteps applies to the all-reduce strategies; strategy='local_sgd' already "
                             "communicates every localSteps updates: set localSteps instead")
        if strategy != "local_sgd" and self.isSet(self.localSteps):
            raise ValueError(f"localSteps applies to strategy='local_sgd' only, not strategy={strategy!r}")

    def _builder_name(self) -> str:
        return self.getModelBuilder() or DEFAULT_BUILDERS[self.getTask()]

    def _network(self, input_dim: int, labels: dict) -> tuple[bytes, list]:
        """The network to train as ``.keras`` bytes, checked against the task and labels, and
        its structure (each layer's class and weight shapes, for checkpoint signatures)."""
        task = self.getTask()
        if self._model_bytes is not None:
            data = self._model_bytes
            net = _rank_training.keras_from_bytes(data)
        else:
            args = self.getModelArgs()
            builder = _resolve_builder(self._builder_name())
            takes = _parameters(builder)
            if task == "multiclass" and "num_classes" in takes and "num_classes" not in args:
                args["num_classes"] = max(2, int(labels["max"]) + 1)
            if task == "regression" and "target_mean" in takes and "target_mean" not in args:
                # Learn a standardised target; the network's last layer maps it back to units.
                args["target_mean"] = float(labels.get("mean") or 0.0)
                args["target_scale"] = float(labels.get("std") or 0.0) or 1.0
            net = builder(input_dim, **args)
            data = None
        units, activation = network_output(net)
        width = int(net.inputs[0].shape[-1]) if net.inputs and net.inputs[0].shape[-1] is not None else input_dim
        if width != input_dim:
            raise ValueError(f"the network takes {width} inputs but featuresCol {self.getFeaturesCol()!r} holds "
                             f"vectors of length {input_dim}")
        check_network(task, self.getOrDefault(self.loss), units, activation)
        check_labels(task, units, labels, self.getLabelCol())
        layers = [[type(layer).__name__, [list(w.shape) for w in layer.weights]] for layer in net.layers]
        return (data if data is not None else _rank_training.keras_to_bytes(net)), layers

    def _fit(self, dataset: DataFrame) -> "KerasHorovodModel":
        self._validate(dataset)
        t_launch = time.time()
        num_proc = self.getNumProc()
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        wcol = self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else None

        feats = float_arrays(dataset.schema, fcol)
        cols = [feats.alias("features"), F.col(lcol).cast("float").alias("label")]
        if wcol:
            cols.append(F.col(wcol).cast("float").alias("weight"))
        frac, vcol = self.getOrDefault(self.validationFraction), self.getOrDefault(self.validationCol)
        if vcol:
            cols.append(F.coalesce(F.col(vcol), F.lit(False)).alias("is_validation"))
        elif frac:
            h = F.xxhash64(F.lit(self.getOrDefault(self.seed)), feats, F.col(lcol))
            cols.append((hash_uniform(h) < frac).alias("is_validation"))
        staged = dataset.select(*cols)
        # One pass on the driver's orders, before any shard is written or rank started:
        # vector lengths, unusable rows, and the label range the task needs.
        checked = check_training_rows(staged, fcol, wcol)
        staged, skipped = apply_handle_invalid(staged, checked, self.getHandleInvalid(), fcol, lcol, wcol)
        usable = checked["rows"] - skipped
        if usable < num_proc:
            raise ValueError(f"KerasHorovodEstimator: {usable} usable training row(s) for numProc={num_proc}: every "
                             "rank needs rows of its own; lower numProc")
        accum = self.getOrDefault(self.accumulationSteps)
        per_rank_batches = math.ceil(usable * (1.0 - frac) / num_proc / self.getBatchSize())
        if per_rank_batches < accum:
            raise ValueError(f"accumulationSteps={accum} needs {accum} batches per epoch on every rank, but "
                             f"{usable} rows over numProc={num_proc} ranks make about {per_rank_batches} batch(es) "
                             f"of {self.getBatchSize()} each: lower accumulationSteps or batchSize")
        model_bytes, layers = self._network(checked["width"], checked)
        task = self.getTask()

        folder = self.checkpoint_folder()
        signature = checkpoint_signature(
            input_dim=checked["width"], rows=usable, task=task, loss=self.getOrDefault(self.loss).lower(),
            optimizer=self.getOrDefault(self.optimizer), weighted=bool(wcol), network=layers,
            validation=vcol or frac) if folder else None
        resume = _read_checkpoint(folder) if folder else None
        if resume:
            _check_signature(folder, self.getOrDefault(self.runId), resume["signature"], signature)
        stopped = bool((resume.get("stopping") or {}).get("stopped")) if resume else False
        # A run that stopped early is finished; one that ran its epochs resumes if asked for more.
        if resume and (stopped or resume["completed_epochs"] >= self.getEpochs()):
            ended = (f"stopped early after {resume['completed_epochs']} epochs" if stopped else
                     f"completed {resume['completed_epochs']} epochs")
            log.info(f"[train] run {self.getOrDefault(self.runId)!r} already {ended}: loading its checkpoint")
            model = KerasHorovodModel(kerasBytes=resume["model_bytes"],
                                      trainingSummary={"history": resume["history"],
                                                       "stopped_early": bool((resume.get("stopping") or {})
                                                                             .get("stopped")),
                                                       "resumed_from_epoch":
                                                       resume["completed_epochs"], "ranks": [], "timings_s": {},
                                                       "skipped_rows": skipped})
            self._copyValues(model)
            model._set(task=task)
            return model

        input_dim = checked["width"]
        has_validation = bool(vcol or frac)
        spec = _rank_training.RankSpec(
            model_bytes=model_bytes, task=task, loss=self.getOrDefault(self.loss).lower(),
            optimizer=self.getOrDefault(self.optimizer), learning_rate=self.getLearningRate(),
            scale_lr=self.getOrDefault(self.scaleLearningRate), warmup_epochs=self.getOrDefault(self.warmupEpochs),
            lr_schedule=self.getOrDefault(self.lrSchedule), epochs=self.getEpochs(), batch_size=self.getBatchSize(),
            accumulation_steps=self.getOrDefault(self.accumulationSteps),
            compression=self.getOrDefault(self.compression), metrics=tuple(self.getOrDefault(self.metrics)),
            early_stopping_patience=self.getOrDefault(self.earlyStoppingPatience), seed=self.getOrDefault(self.seed),
            threads=max(1, (os.cpu_count() or 1) // num_proc), has_weight=bool(wcol), has_validation=has_validation,
            shuffle_buffer_rows=self.getOrDefault(self.shuffleBufferRows), strategy=self.getOrDefault(self.strategy),
            local_steps=self.getOrDefault(self.localSteps), measure_wait=self.getOrDefault(self.measureWait),
            checkpoint_dir=folder, resume=resume)
        if resume:
            log.info(f"[train] resuming run {self.getOrDefault(self.runId)!r} after epoch "
                     f"{resume['completed_epochs']}")
        t_staged = time.time()
        spill = ShardSpill(split_col="is_validation" if has_validation else None,
                           chunk_rows=chunk_rows_for(spec.shuffle_buffer_rows))
        results = run_on_ranks(_rank_training.train_rank, (spec,), num_proc=num_proc, data=staged, spill=spill,
                               stall_timeout=self.getOrDefault(self.stallTimeout),
                               on_put=CheckpointStore(folder, signature) if folder else None,
                               backend=strategies.backend_for(spec.strategy))
        t_done = time.time()

        chief = results[0]
        first_step = min(r["timings"]["first_step"] for r in results)
        train_start = min(r["timings"]["train_start"] for r in results)
        summary = {
            "history": chief["history"],
            "ranks": [{"rank": r["rank"], "rows": r["rows"], "validation_rows": r["validation_rows"],
                       "rows_per_epoch": r["rows_per_epoch"], "trimmed_per_epoch": r["trimmed_per_epoch"],
                       "rows_seen": r["rows_seen"], "max_window_rows": r["max_window_rows"],
                       "weights_digest": r["weights_digest"], "allreduce_calls": r["allreduce_calls"],
                       "allreduce_bytes": r["allreduce_bytes"], "devices": r["devices"],
                       "code_path": r["code_path"], "horovod_imported": r["horovod_imported"]} for r in results],
            "strategy": spec.strategy,
            "local_steps": spec.local_steps if spec.strategy == "local_sgd" else None,
            "steps_per_epoch": chief["steps_per_epoch"],
            "updates_per_epoch": chief["updates_per_epoch"],
            "stopped_early": chief["stopped_early"],
            # Rows no rank used in an epoch (larger shards beyond the smallest's step count).
            "trimmed_rows_per_epoch": sum(r["trimmed_per_epoch"] for r in results),
            "shuffle_buffer_rows": spec.shuffle_buffer_rows,
            "resumed_from_epoch": resume["completed_epochs"] if resume else 0,
            "input_dim": input_dim,
            "task": task,
            "skipped_rows": skipped,
            "timings_s": {
                "checks": round(t_staged - t_launch, 3),
                "launch_to_first_step": round(first_step - t_launch, 3),
                "training": round(max(r["timings"]["end"] for r in results) - train_start, 3),
                # Rank 0's time handing each epoch's checkpoint to the driver (inside "training").
                "checkpoints": chief["timings"]["checkpoints"],
                "fit_total": round(t_done - t_launch, 3),
            },
        }
        model = KerasHorovodModel(kerasBytes=chief["model_bytes"], trainingSummary=summary)
        self._copyValues(model)
        model._set(task=task)
        return model


class CheckpointStore:
    """The driver's side of rank 0's per-epoch checkpoints (``on_put`` of the launch).

    Layout under the run's folder (local or any Hadoop URI, through :mod:`sparkdeep.storage`):
    ``epoch-NNNN/model.keras`` and ``epoch-NNNN/optimizer.npz``, then ``state.json``
    (completed epochs, history, and which ``epoch-NNNN`` holds the files), written
    atomically last. A run killed mid-checkpoint leaves ``state.json`` naming the previous
    complete epoch; older epoch folders are removed once a newer ``state.json`` is written.
    """

    _NAME = re.compile(r"^(state\.json|epoch-\d{4,}/(model\.keras|optimizer\.npz|best\.npz))$")

    def __init__(self, folder: str, signature: dict | None = None):
        self.folder = folder
        self.signature = signature

    def __call__(self, rank: int, name: str, data: bytes) -> None:
        from sparkdeep import storage
        if rank != 0 or not self._NAME.match(name):
            raise ValueError(f"checkpoint file {name!r} from rank {rank}: not part of a checkpoint")
        st = storage.Storage()
        if name == "state.json" and self.signature is not None:
            # What the checkpoint was made for, so a later fit with other data or another
            # network under the same runId is refused rather than resumed.
            data = json.dumps({**json.loads(data), "signature": self.signature}).encode()
        st.write_bytes(storage.join(self.folder, name), data)
        if name == "state.json":
            keep = json.loads(data)["files"]
            for entry in st.listdir(self.folder):
                if entry.startswith("epoch-") and entry != keep:
                    st.delete(storage.join(self.folder, entry))


def _read_checkpoint(folder: str) -> dict | None:
    """The last completed epoch's checkpoint of a run, or None."""
    from sparkdeep import storage
    from sparkdeep.paths import read_json
    state = read_json(storage.join(folder, "state.json"))
    if state is None:
        return None
    # Checkpoints written before the epoch folders kept their files beside state.json.
    files = storage.join(folder, state["files"]) if state.get("files") else folder
    st = storage.Storage()
    best = storage.join(files, "best.npz")
    return {"completed_epochs": int(state["completed_epochs"]), "history": state["history"],
            "finished": bool(state.get("finished", False)), "stopping": state.get("stopping"),
            "signature": state.get("signature"),
            "model_bytes": st.read_bytes(storage.join(files, "model.keras")),
            "optimizer_bytes": st.read_bytes(storage.join(files, "optimizer.npz")),
            "best_bytes": st.read_bytes(best) if st.exists(best) else None}


def checkpoint_signature(**parts) -> dict:
    """What a checkpoint is valid for; JSON-clean (tuples become lists, as after a round trip)."""
    return json.loads(json.dumps(parts, sort_keys=True, default=str))


def _check_signature(folder: str, run_id: str, saved: dict | None, now: dict) -> None:
    if saved is None:  # written before signatures were recorded
        return
    changed = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    if changed:
        what = "; ".join(f"{k}: {_short(saved.get(k))} then, {_short(now.get(k))} now" for k in changed)
        raise ValueError(f"runId {run_id!r}: the checkpoint at {folder} was made for other training ({what}); "
                         "use a new runId for this data and network, or delete that folder to start over")


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _parameters(fn) -> set[str]:
    """The keyword parameters a builder takes (all of them if it takes ``**kwargs``)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"num_classes", "target_mean", "target_scale"}
    return set(params)


def _resolve_builder(spec: str):
    if ":" not in spec:
        raise ValueError(f"modelBuilder {spec!r} must look like 'package.module:function'")
    module, name = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"modelBuilder {spec!r} cannot be imported: {exc}") from None
    if not callable(fn):
        raise ValueError(f"modelBuilder {spec!r} is not callable")
    return fn


def float_arrays(schema: T.StructType, fcol: str):
    """The features as ``array<float>`` (what the network sees); a null vector stays null
    (``vector_to_array`` itself fails on null)."""
    if isinstance(schema[fcol].dataType, VectorUDT):
        return F.when(F.col(fcol).isNotNull(), vector_to_array(F.col(fcol), "float32"))
    return F.col(fcol).cast("array<float>")


def task_slots(sc, wanted: int, wait_s: float = 60.0) -> int:
    """Tasks Spark can run at once now: the executors' free cores over ``spark.task.cpus``
    (what barrier mode checks), not ``spark.default.parallelism`` from the config. On a
    cluster, executors may still be registering: wait up to ``wait_s`` for ``wanted``."""
    jsc = sc._jsc.sc()
    deadline = time.time() + (0 if sc.master.startswith("local") else wait_s)
    while True:
        try:
            slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        except Exception:  # noqa: BLE001 - a Spark without the method: the best we know
            return sc.defaultParallelism
        if slots >= wanted or time.time() >= deadline:
            return slots
        time.sleep(1.0)


def check_training_rows(staged: DataFrame, fcol: str, wcol: str | None) -> dict:
    """One aggregation over the rows to train on (features as float32 arrays, as the ranks
    will see them): vector lengths, unusable rows by reason, and the range of the labels."""
    inf = float("inf")
    f, y = F.col("features"), F.col("label").cast("double")

    def finite(c):
        return c.isNotNull() & ~F.isnan(c) & (F.abs(c) != inf)

    count = lambda cond: F.sum(cond.cast("long"))  # noqa: E731
    aggs = [F.count(F.lit(1)).alias("rows"),
            F.min(F.size(f)).alias("width_min"), F.max(F.size(f)).alias("width_max"),
            count(f.isNull()).alias("null_features"),
            count(f.isNotNull() & F.exists(f, lambda x: F.isnan(x) | (F.abs(x) == inf))).alias("nonfinite_features"),
            count(~finite(F.col("label"))).alias("bad_label"),
            F.min(F.when(finite(y), y)).alias("min"), F.max(F.when(finite(y), y)).alias("max"),
            F.avg(F.when(finite(y), y)).alias("mean"), F.stddev_pop(F.when(finite(y), y)).alias("std"),
            count(finite(y) & (y != F.floor(y))).alias("fractional")]
    if wcol:
        w = F.col("weight")
        aggs.append(count(~finite(w) | (w < 0)).alias("bad_weight"))
    row = staged.agg(*aggs).first().asDict()
    row = {k: (v or 0) if k not in ("min", "max", "mean", "std") else v for k, v in row.items()}
    row.setdefault("bad_weight", 0)
    if row["rows"] == 0:
        raise ValueError("KerasHorovodEstimator: the training input has no rows")
    if row["width_min"] != row["width_max"]:
        raise ValueError(f"featuresCol {fcol!r} holds vectors of different lengths (from {row['width_min']} "
                         f"to {row['width_max']}); every row must have the same length")
    row["width"] = int(row["width_max"] or 0)
    if row["width"] == 0 and row["null_features"] < row["rows"]:
        raise ValueError(f"featuresCol {fcol!r} holds empty vectors")
    return row


def apply_handle_invalid(staged: DataFrame, checked: dict, mode: str, fcol: str, lcol: str,
                         wcol: str | None) -> tuple[DataFrame, int]:
    """'error': name every kind of unusable row and its count; 'skip': drop them, counted."""
    reasons = [(checked["null_features"], f"a null featuresCol {fcol!r}"),
               (checked["nonfinite_features"], f"NaN or infinite values in featuresCol {fcol!r} (as float32)"),
               (checked["bad_label"], f"a null, NaN or infinite labelCol {lcol!r} (as float32)"),
               (checked["bad_weight"], f"a null, negative, NaN or infinite weightCol {wcol!r}")]
    found = [f"{n} rows with {why}" for n, why in reasons if n]
    if not found:
        return staged, 0
    if mode == "error":
        raise ValueError(f"KerasHorovodEstimator: the training input has {'; '.join(found)}. Fix or drop those "
                         "rows, or set handleInvalid='skip' to drop and count them")
    inf = float("inf")
    ok = (F.col("features").isNotNull() & ~F.exists("features", lambda x: F.isnan(x) | (F.abs(x) == inf))
          & F.col("label").isNotNull() & ~F.isnan("label") & (F.abs(F.col("label")) != inf))
    if "weight" in staged.columns:
        ok = ok & F.col("weight").isNotNull() & ~F.isnan("weight") & (F.abs(F.col("weight")) != inf) & (
            F.col("weight") >= 0)
    kept = staged.where(ok)
    skipped = checked["rows"] - kept.count()
    if skipped == checked["rows"]:
        raise ValueError(f"KerasHorovodEstimator: every one of the {skipped} training rows is unusable "
                         f"({'; '.join(found)})")
    log.info(f"[train] handleInvalid='skip': {skipped} of {checked['rows']} rows dropped ({'; '.join(found)})")
    return kept, skipped


def network_output(net) -> tuple[int, str | None]:
    """The network's output units and its output layer's activation name (None if unknown)."""
    units = int(net.outputs[0].shape[-1])
    layer = getattr(getattr(net.outputs[0], "_keras_history", None), "operation", None) or net.layers[-1]
    try:
        activation = layer.get_config().get("activation")
    except Exception:  # noqa: BLE001 - a custom layer without a config
        activation = None
    return units, activation if isinstance(activation, str) else None


def check_network(task: str, loss: str, units: int, activation: str | None) -> None:
    """The output layer fits the task the loss trains, or a clear error."""
    if task == "binary" and (units != 1 or activation not in (None, "sigmoid")):
        raise ValueError(f"loss {loss!r} trains a binary network: one sigmoid output unit giving P(label=1); "
                         f"this network has {units} output unit(s) with activation {activation!r}. For k classes "
                         "use loss='sparse_categorical_crossentropy'; for a number use loss='mse'")
    if task == "multiclass" and (units < 2 or activation not in (None, "softmax")):
        raise ValueError(f"loss {loss!r} needs k >= 2 softmax output units (one per class); this network has "
                         f"{units} with activation {activation!r}")
    if task == "regression" and (units != 1 or activation in ("sigmoid", "softmax", "tanh")):
        raise ValueError(f"loss {loss!r} trains a regression network: one unbounded output unit; this network "
                         f"has {units} output unit(s) with activation {activation!r}, which cannot reach the "
                         "target's range. Use modelBuilder='sparkdeep.transformers.keras_models:mlp_regressor' "
                         "or a linear output layer")


def check_labels(task: str, units: int, labels: dict, lcol: str) -> None:
    """Labels fit the output: 0/1 for binary, 0..k-1 for k classes (regression: any finite)."""
    lo, hi, fractional = labels["min"], labels["max"], labels["fractional"]
    if lo is None:
        return  # no usable label at all: apply_handle_invalid has said so
    if task == "binary":
        if fractional or lo < 0 or hi > 1:
            raise ValueError(f"labelCol {lcol!r} must hold 0 or 1 for a binary network; it holds values from "
                             f"{lo:g} to {hi:g}{' (some not whole numbers)' if fractional else ''}. Map the "
                             "classes to 0/1 first (e.g. StringIndexer), or for k classes use "
                             "loss='sparse_categorical_crossentropy'")
        if lo == hi:
            raise ValueError(f"labelCol {lcol!r} holds only the class {lo:g}: a binary network needs both")
    if task == "multiclass" and (fractional or lo < 0 or hi > units - 1):
        raise ValueError(f"labelCol {lcol!r} must hold class indices 0..{units - 1} for a network with {units} "
                         f"softmax units; it holds values from {lo:g} to {hi:g}"
                         f"{' (some not whole numbers)' if fractional else ''}. Index the classes from 0 "
                         "(StringIndexer) or give the network one unit per class")


# -- fitted model -------------------------------------------------------------------------

_LOADED: dict[str, Any] = {}


def _cached_keras(digest: str, data: bytes):
    """One Keras model per Python worker and model, not per Arrow batch."""
    model = _LOADED.get(digest)
    if model is None:
        model = _rank_training.keras_from_bytes(data)
        _LOADED[digest] = model
    return model


class KerasHorovodModel(Model, _KerasScoringParams, MLWritable, MLReadable):
    """A trained Keras network that scores a DataFrame in Arrow batches.

    By ``task`` (set at fit; inferred from the output layer when empty):
    ``binary`` and ``multiclass`` add ``probabilityCol`` (a vector of class probabilities:
    ``[P(0), P(1)]`` for a one-unit sigmoid network, the softmax outputs otherwise) and
    ``predictionCol`` (the most likely class; threshold 0.5 for binary), like MLlib's
    classifiers; ``regression`` adds ``predictionCol`` only, in the target's units.
    A row with a null or non-finite feature raises (``handleInvalid='error'``) or gets
    null outputs; a non-finite network output is always an error, never a class.
    """

    task = Param(Params._dummy(), "task", "binary, multiclass or regression ('' = infer from the network)",
                 typeConverter=TypeConverters.toString)

    def __init__(self, kerasBytes: bytes | None = None, trainingSummary: dict | None = None):
        super().__init__()
        self._setDefault(task="")
        self._keras_bytes = kerasBytes
        self.trainingSummary = trainingSummary or {}

    @property
    def kerasBytes(self) -> bytes:
        if self._keras_bytes is None:
            raise ValueError("this KerasHorovodModel holds no network (was it loaded?)")
        return self._keras_bytes

    def keras_model(self):
        """The network as a ``keras.Model`` (loaded in safe mode)."""
        return _rank_training.keras_from_bytes(self.kerasBytes)

    def _task(self, net) -> str:
        task = self.getOrDefault(self.task)
        if task:
            if task not in tasks.TASKS:
                raise ValueError(f"task must be one of {tasks.TASKS}, got {task!r}")
            return task
        units, activation = network_output(net)
        if units == 1:
            return "binary" if activation == "sigmoid" else "regression"
        return "multiclass"

    def _transform(self, dataset: DataFrame) -> DataFrame:
        self._check_features(dataset.schema)
        data = self.kerasBytes
        digest = hashlib.sha256(data).hexdigest()
        net = _cached_keras(digest, data)
        task = self._task(net)
        if task == "regression":
            require_new(dataset.schema, self.getPredictionCol(), "predictionCol")
        else:
            self._check_outputs(dataset.schema)
        mode = self.getHandleInvalid()
        if mode not in ("error", "skip", "keep"):
            raise ValueError(f"handleInvalid must be 'error', 'skip' or 'keep', got {mode!r}")
        shipped = dataset.sparkSession.sparkContext.broadcast(data)
        fcol = self.getFeaturesCol()
        feats = float_arrays(dataset.schema, fcol)
        units = int(net.outputs[0].shape[-1])
        width = int(net.inputs[0].shape[-1])
        single = units == 1
        out_type = T.DoubleType() if single else T.ArrayType(T.DoubleType())

        def score(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
            """Iterator Arrow UDF: each batch's features arrive as one Arrow list array and
            become one float matrix without per-row Python objects."""
            import pyarrow.compute as pc
            model = _cached_keras(digest, shipped.value)
            for col in arrays:
                n = len(col)
                valid = np.ones(n, dtype=bool) if not col.null_count else np.asarray(col.is_valid())
                rows = col if valid.all() else col.filter(pa.array(valid))
                x = list_matrix(rows, width, fcol).astype("float32", copy=False) if len(rows) else \
                    np.zeros((0, width), dtype="float32")
                finite = np.isfinite(x).all(axis=1)
                bad = n - int(finite.sum())
                if bad and mode == "error":
                    raise ValueError(f"KerasHorovodModel: featuresCol {fcol!r} has {bad} rows in a batch that are "
                                     "null or hold NaN/infinite values (as float32); fix or drop them, or set "
                                     "handleInvalid='keep' to give them null outputs")
                p = np.full((n, units), np.nan)
                idx = np.flatnonzero(valid)[finite]
                if len(idx):
                    out = np.asarray(model(x[finite], training=False), dtype="float64").reshape(len(idx), units)
                    if not np.isfinite(out).all():
                        raise ValueError(f"KerasHorovodModel: the network produced "
                                         f"{int((~np.isfinite(out).all(axis=1)).sum())} non-finite outputs from "
                                         "finite inputs (are its weights finite?)")
                    p[idx] = out
                missing = ~np.isfinite(p[:, 0])
                if single:
                    yield pa.array(p[:, 0], mask=missing)
                else:
                    lists = pa.FixedSizeListArray.from_arrays(pa.array(p.ravel()), units).cast(pa.list_(pa.float64()))
                    yield pc.if_else(pa.array(missing), pa.nulls(n, lists.type), lists)

        udf = F.arrow_udf(score, out_type)
        out = dataset.withColumn("__p", udf(feats))
        if task == "regression":
            return out.withColumn(self.getPredictionCol(), F.col("__p")).drop("__p")
        if single:
            # One sigmoid unit gives P(1); the JVM builds the probability vector. A null
            # score stays null: it never becomes a class.
            prob = F.when(F.col("__p").isNotNull(), array_to_vector(F.array(1.0 - F.col("__p"), F.col("__p"))))
            pred = F.when(F.col("__p").isNotNull(), (F.col("__p") >= 0.5).cast("double"))
        else:
            prob = F.when(F.col("__p").isNotNull(), array_to_vector(F.col("__p")))
            pred = (F.array_position(F.col("__p"), F.array_max(F.col("__p"))) - 1).cast("double")
        out = out.withColumn(self.getProbabilityCol(), prob)
        return out.withColumn(self.getPredictionCol(), pred).drop("__p")

    # -- persistence: JSON metadata + model/model.keras (no pickle) --
    def write(self) -> MLWriter:
        return _KerasModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _KerasModelReader(cls)


class _KerasModelWriter(MLWriter):
    def __init__(self, instance: KerasHorovodModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        extra = {"kerasFile": KERAS_FILE, "trainingSummary": self.instance.trainingSummary,
                 "kerasSha256": hashlib.sha256(self.instance.kerasBytes).hexdigest()}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata=extra)
        Storage(self.sparkSession).write_checked(f"{path.rstrip('/')}/{KERAS_FILE}", self.instance.kerasBytes)


class _KerasModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> KerasHorovodModel:
        """Read ``model/model.keras`` after checking the metadata that points at it.

        Raises ``UnsafeModelError`` naming the file when the metadata points anywhere but
        ``model/model.keras`` or records no SHA-256, when the bytes do not match it, when
        Keras safe mode refuses the archive (embedded Python, a ``Lambda`` layer) or the
        archive is not valid; ``storage.ChecksumError`` when Hadoop's ``.crc`` does not match.
        """
        # Imported here: the module's shared import block is not this reader's to edit.
        import io
        import zipfile

        from sparkdeep.model_store import UnsafeModelError

        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        keras_path = f"{path.rstrip('/')}/{KERAS_FILE}"
        # The writer only ever writes KERAS_FILE; any other value (absolute, "../..") is
        # an edit trying to make us read a file outside the stage folder.
        if metadata.get("kerasFile") != KERAS_FILE:
            raise UnsafeModelError(f"{path}/metadata: kerasFile is {metadata.get('kerasFile')!r}; a saved "
                                   f"KerasHorovodModel keeps its network only at {KERAS_FILE!r}")
        digest = metadata.get("kerasSha256")
        if not isinstance(digest, str):
            raise UnsafeModelError(f"{path}/metadata: no kerasSha256 for {keras_path}; refusing a network "
                                   "that cannot be checked")
        data = Storage(self.sparkSession).read_checked(keras_path)
        if hashlib.sha256(data).hexdigest() != digest:
            raise UnsafeModelError(f"{keras_path} does not match the checksum in its metadata")
        # Keras reports a file that is not a zip as "File not found" on its temp copy.
        if not zipfile.is_zipfile(io.BytesIO(data)):
            raise UnsafeModelError(f"{keras_path}: not a valid Keras archive (not a zip file)")
        # Refuse unsafe or broken archives at load time, not at first transform.
        try:
            _rank_training.keras_from_bytes(data)
        except Exception as e:  # Keras reports a bad archive with many types (OSError, ValueError, ...)
            kind = "refused by Keras safe mode" if "safe_mode" in str(e) else "not a valid Keras archive"
            raise UnsafeModelError(f"{keras_path}: {kind} ({type(e).__name__}: {e})") from e
        model = KerasHorovodModel(kerasBytes=data, trainingSummary=metadata.get("trainingSummary"))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
