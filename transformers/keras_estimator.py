"""Horovod-on-Spark Keras training as an MLlib Estimator, and its batch-scoring Model.

``KerasHorovodEstimator.fit(df)`` stages ``df`` as ``numProc`` Parquet shards, starts
``numProc`` Horovod ranks as Spark tasks (Gloo ring all-reduce), each reading only its
own shard, and returns a :class:`KerasHorovodModel` holding the trained network as
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
import os
import shutil
import tempfile
import time
import uuid
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.functions import array_to_vector, vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (HasFeaturesCol, HasLabelCol, HasPredictionCol,
                                     HasProbabilityCol, HasSeed, HasWeightCol)
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import fs
from sparkdeep.distributed import run_on_ranks

from . import _rank_training
from ._vectors import require_new
from .sampling import hash_uniform

KERAS_FILE = "model/model.keras"


# -- params, split by concern ------------------------------------------------------------

class _KerasScoringParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """Columns the fitted model reads and writes."""

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
                         "importable 'module:function' returning a keras.Model for input_dim",
                         typeConverter=TypeConverters.toString)
    modelArgs = Param(Params._dummy(), "modelArgs", "JSON object of keyword args for modelBuilder",
                      typeConverter=TypeConverters.toString)
    loss = Param(Params._dummy(), "loss", "Keras loss name", typeConverter=TypeConverters.toString)
    optimizer = Param(Params._dummy(), "optimizer", "Keras optimizer name",
                      typeConverter=TypeConverters.toString)
    learningRate = Param(Params._dummy(), "learningRate", "learning rate for one rank (> 0)",
                         typeConverter=TypeConverters.toFloat)
    metrics = Param(Params._dummy(), "metrics", "Keras metric names reported per epoch (e.g. auc, accuracy)",
                    typeConverter=TypeConverters.toListString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(modelBuilder="sparkdeep.transformers.keras_models:mlp_binary_classifier",
                         modelArgs="{}", loss="binary_crossentropy", optimizer="adam",
                         learningRate=0.001, metrics=[])

    def getModelBuilder(self) -> str:
        return self.getOrDefault(self.modelBuilder)

    def getModelArgs(self) -> dict:
        return json.loads(self.getOrDefault(self.modelArgs))

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)


class _HorovodRunParams(Params):
    """How to train: ranks, epochs, batches and where shards are staged."""

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
    stagingDir = Param(Params._dummy(), "stagingDir",
                       "folder for the per-rank Parquet shards, visible to every executor "
                       "('' = a temp folder on the driver, fine for local and one-host clusters)",
                       typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(numProc=2, epochs=5, batchSize=256, stagingDir="", accumulationSteps=1,
                         compression="none", scaleLearningRate=True, warmupEpochs=1.0)

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
                          "folder for run checkpoints, visible to the driver and rank 0",
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
        return os.path.join(root, run)


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
                 warmupEpochs: float | None = None, validationFraction: float | None = None,
                 validationCol: str | None = None, earlyStoppingPatience: int | None = None,
                 runId: str | None = None, checkpointDir: str | None = None,
                 stagingDir: str | None = None, seed: int | None = None):
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
                                 ("batchSize", self.getBatchSize(), 1)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.getLearningRate() <= 0:
            raise ValueError(f"learningRate must be > 0, got {self.getLearningRate()}")
        if self.getOrDefault(self.accumulationSteps) < 1:
            raise ValueError(f"accumulationSteps must be >= 1, got {self.getOrDefault(self.accumulationSteps)}")
        if self.getOrDefault(self.compression) not in ("none", "fp16"):
            raise ValueError(f"compression must be 'none' or 'fp16', got {self.getOrDefault(self.compression)!r}")
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
        conf = dataset.sparkSession.sparkContext.getConf()
        master = conf.get("spark.master", "")
        retries = int(conf.get("spark.task.maxFailures", "4"))
        if not master.startswith("local") and retries > 1:
            raise ValueError(f"spark.task.maxFailures={retries}: a retried task would start a second copy of a "
                             "Horovod rank; set spark.task.maxFailures=1 for training jobs")
        slots = dataset.sparkSession.sparkContext.defaultParallelism
        if self.getNumProc() > slots:
            raise ValueError(f"numProc={self.getNumProc()} exceeds the {slots} task slots Spark has; "
                             "every rank needs a concurrent task, or the launch would wait forever")
        if self._model_bytes is None:
            _resolve_builder(self.getModelBuilder())
        try:
            self.getModelArgs()
        except json.JSONDecodeError as exc:
            raise ValueError(f"modelArgs is not a JSON object: {exc}") from None

    def _fit(self, dataset: DataFrame) -> "KerasHorovodModel":
        self._validate(dataset)
        t_launch = time.time()
        num_proc = self.getNumProc()
        fcol, lcol = self.getFeaturesCol(), self.getLabelCol()
        wcol = self.getWeightCol() if self.isDefined(self.weightCol) and self.getWeightCol() else None

        feats = (vector_to_array(F.col(fcol), "float32")
                 if isinstance(dataset.schema[fcol].dataType, VectorUDT)
                 else F.col(fcol).cast("array<float>"))
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

        folder = self.checkpoint_folder()
        resume = _read_checkpoint(folder) if folder else None
        if resume and resume["completed_epochs"] >= self.getEpochs():
            print(f"[train] run {self.getOrDefault(self.runId)!r} already completed "
                  f"{resume['completed_epochs']} epochs: loading its checkpoint", flush=True)
            model = KerasHorovodModel(kerasBytes=resume["model_bytes"],
                                      trainingSummary={"history": resume["history"], "resumed_from_epoch":
                                                       resume["completed_epochs"], "ranks": [], "timings_s": {}})
            self._copyValues(model)
            return model

        own_tmp = not self.getOrDefault(self.stagingDir)
        root = tempfile.mkdtemp(prefix="sparkdeep-stage-") if own_tmp else self.getOrDefault(self.stagingDir)
        stage_dir = os.path.join(root, f"shards-{uuid.uuid4().hex[:12]}")
        try:
            shards = _stage_shards(staged, stage_dir, num_proc)
            input_dim = _input_dim(shards[0])
            if self._model_bytes is not None:
                model_bytes = self._model_bytes
            else:
                network = _resolve_builder(self.getModelBuilder())(input_dim, **self.getModelArgs())
                model_bytes = _rank_training.keras_to_bytes(network)
            spec = {
                "model_bytes": model_bytes,
                "shards": shards,
                "weight_col": "weight" if wcol else None,
                "has_validation": bool(vcol or frac),
                "epochs": self.getEpochs(), "batch_size": self.getBatchSize(),
                "learning_rate": self.getLearningRate(),
                "scale_lr": self.getOrDefault(self.scaleLearningRate),
                "warmup_epochs": self.getOrDefault(self.warmupEpochs),
                "optimizer": self.getOrDefault(self.optimizer), "loss": self.getOrDefault(self.loss),
                "metrics": list(self.getOrDefault(self.metrics)),
                "accumulation_steps": self.getOrDefault(self.accumulationSteps),
                "compression": self.getOrDefault(self.compression),
                "early_stopping_patience": self.getOrDefault(self.earlyStoppingPatience),
                "checkpoint_dir": folder, "resume": resume,
                "seed": self.getOrDefault(self.seed),
                "threads": max(1, (os.cpu_count() or 1) // num_proc),
            }
            if resume:
                print(f"[train] resuming run {self.getOrDefault(self.runId)!r} after epoch "
                      f"{resume['completed_epochs']}", flush=True)
            t_staged = time.time()
            results = run_on_ranks(_rank_training.train_rank, (spec,), num_proc=num_proc)
        finally:
            shutil.rmtree(root if own_tmp else stage_dir, ignore_errors=True)
        t_done = time.time()

        chief = results[0]
        first_step = min(r["timings"]["first_step"] for r in results)
        train_start = min(r["timings"]["train_start"] for r in results)
        summary = {
            "history": chief["history"],
            "ranks": [{"rank": r["rank"], "rows": r["rows"], "validation_rows": r["validation_rows"],
                       "weights_digest": r["weights_digest"], "allreduce_calls": r["allreduce_calls"],
                       "allreduce_bytes": r["allreduce_bytes"], "devices": r["devices"],
                       "code_path": r["code_path"]} for r in results],
            "steps_per_epoch": chief["steps_per_epoch"],
            "updates_per_epoch": chief["updates_per_epoch"],
            "stopped_early": chief["stopped_early"],
            "resumed_from_epoch": resume["completed_epochs"] if resume else 0,
            "input_dim": input_dim,
            "timings_s": {
                "staging": round(t_staged - t_launch, 3),
                "launch_to_first_step": round(first_step - t_launch, 3),
                "training": round(max(r["timings"]["end"] for r in results) - train_start, 3),
                "fit_total": round(t_done - t_launch, 3),
            },
        }
        model = KerasHorovodModel(kerasBytes=chief["model_bytes"], trainingSummary=summary)
        self._copyValues(model)
        return model


def _read_checkpoint(folder: str) -> dict | None:
    """The last completed epoch's checkpoint of a run, or None."""
    state_path = os.path.join(folder, "state.json")
    if not os.path.isfile(state_path):
        return None
    with open(state_path) as fh:
        state = json.load(fh)
    with open(os.path.join(folder, "model.keras"), "rb") as fh:
        model_bytes = fh.read()
    return {"completed_epochs": int(state["completed_epochs"]), "history": state["history"],
            "model_bytes": model_bytes, "optimizer_path": os.path.join(folder, "optimizer.npz")}


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


def _stage_shards(df: DataFrame, folder: str, num_proc: int) -> list[str]:
    """Write ``df`` as exactly ``num_proc`` Parquet files, one per rank, and list them."""
    df.repartition(num_proc).write.mode("overwrite").parquet(folder)
    local = folder[len("file:"):] if folder.startswith("file:") else folder
    files = sorted(os.path.join(folder, f) for f in os.listdir(local)
                   if f.startswith("part-") and f.endswith(".parquet"))
    if len(files) != num_proc:
        raise ValueError(f"training data has too few rows for numProc={num_proc}: "
                         f"staging produced {len(files)} non-empty shards")
    return files


def _input_dim(shard: str) -> int:
    """The feature count from the first row of a shard (not the whole shard)."""
    import pyarrow.parquet as pq
    for batch in pq.ParquetFile(shard).iter_batches(batch_size=1, columns=["features"]):
        if batch.num_rows:
            return len(batch.column(0)[0].as_py())
    raise ValueError(f"shard {shard!r} is empty")


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

    Adds ``probabilityCol`` (a vector of class probabilities: ``[P(0), P(1)]`` for a
    one-unit sigmoid network, the softmax outputs otherwise) and ``predictionCol`` (the
    most likely class; threshold 0.5 for binary), like MLlib's classifiers.
    """

    def __init__(self, kerasBytes: bytes | None = None, trainingSummary: dict | None = None):
        super().__init__()
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

    def _transform(self, dataset: DataFrame) -> DataFrame:
        self._check_features(dataset.schema)
        self._check_outputs(dataset.schema)
        data = self.kerasBytes
        digest = hashlib.sha256(data).hexdigest()
        spark = dataset.sparkSession
        shipped = spark.sparkContext.broadcast(data)
        fcol = self.getFeaturesCol()
        feats = (vector_to_array(F.col(fcol), "float32")
                 if isinstance(dataset.schema[fcol].dataType, VectorUDT) else F.col(fcol).cast("array<float>"))

        units = int(_cached_keras(digest, data).outputs[0].shape[-1])
        binary = units == 1
        out_type = T.DoubleType() if binary else T.ArrayType(T.DoubleType())

        def score(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
            """Iterator Arrow UDF: each batch's features arrive as one Arrow list array and
            become one float matrix without per-row Python objects."""
            net = _cached_keras(digest, shipped.value)
            for col in arrays:
                n = len(col)
                if col.null_count:
                    raise ValueError(f"featuresCol {fcol!r} has {col.null_count} null rows in a batch; "
                                     "drop or fill them before scoring")
                if n:
                    x = col.flatten().to_numpy(zero_copy_only=False).astype("float32", copy=False).reshape(n, -1)
                    p = np.asarray(net(x, training=False), dtype="float64").reshape(n, -1)
                else:
                    p = np.zeros((0, units))
                if binary:
                    yield pa.array(p[:, 0])
                else:
                    yield pa.FixedSizeListArray.from_arrays(pa.array(p.ravel()), units).cast(pa.list_(pa.float64()))

        udf = F.arrow_udf(score, out_type)
        out = dataset.withColumn("__p", udf(feats))
        if binary:
            # One sigmoid unit gives P(1); the JVM builds the probability vector.
            out = out.withColumn(self.getProbabilityCol(), array_to_vector(F.array(1.0 - F.col("__p"), F.col("__p"))))
            pred = (F.col("__p") >= 0.5).cast("double")
        else:
            out = out.withColumn(self.getProbabilityCol(), array_to_vector(F.col("__p")))
            pred = (F.array_position(F.col("__p"), F.array_max(F.col("__p"))) - 1).cast("double")
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
        fs.write_bytes(self.sparkSession, f"{path.rstrip('/')}/{KERAS_FILE}", self.instance.kerasBytes)


class _KerasModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> KerasHorovodModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        data = fs.read_bytes(self.sparkSession, f"{path.rstrip('/')}/{metadata['kerasFile']}")
        if hashlib.sha256(data).hexdigest() != metadata.get("kerasSha256"):
            raise ValueError(f"{path}/{metadata['kerasFile']} does not match the checksum in its metadata")
        model = KerasHorovodModel(kerasBytes=data, trainingSummary=metadata.get("trainingSummary"))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        # Refuse unsafe archives at load time, not at first transform.
        _rank_training.keras_from_bytes(data)
        return model
