"""The fitted network as an MLlib Model: scores Arrow batches, saves as JSON metadata plus
``model/model.keras`` (no pickle), and loads only what it wrote (checksum, safe mode)."""
from __future__ import annotations

import hashlib
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml import Model
from pyspark.ml.functions import array_to_vector
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import tasks
from sparkdeep.storage import Storage

from .._vectors import list_matrix, require_new
from .network import keras_from_bytes, network_output
from .params import ScoringParams
from .staging import float_arrays

KERAS_FILE = "model/model.keras"

_LOADED: dict[str, Any] = {}


def _cached_keras(digest: str, data: bytes):
    """One Keras model per Python worker and model, not per Arrow batch."""
    model = _LOADED.get(digest)
    if model is None:
        model = keras_from_bytes(data)
        _LOADED[digest] = model
    return model

class KerasHorovodModel(Model, ScoringParams, MLWritable, MLReadable):
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
        return keras_from_bytes(self.kerasBytes)

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
            keras_from_bytes(data)
        except Exception as e:  # Keras reports a bad archive with many types (OSError, ValueError, ...)
            kind = "refused by Keras safe mode" if "safe_mode" in str(e) else "not a valid Keras archive"
            raise UnsafeModelError(f"{keras_path}: {kind} ({type(e).__name__}: {e})") from e
        model = KerasHorovodModel(kerasBytes=data, trainingSummary=metadata.get("trainingSummary"))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
