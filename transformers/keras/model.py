"""The fitted network as an MLlib Model: scores Arrow batches, saves as JSON metadata plus
``model/model.keras`` (no pickle), and loads only what it wrote (checksum, safe mode).

Scoring is one iterator Arrow UDF over the features as ``array<float>``; what it costs
beyond Spark's own transfer of that column to Python was measured (
``bench/scoring_bench.py``, ``bench/RESULTS.md``) and is kept small here on purpose:

- PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker.
  Once TensorFlow and Keras are imported that walks over 400,000 objects, 0.2-0.4 s of
  CPU per task whatever its rows (about what scoring a 50,000-row partition costs).
  The worker's scorer freezes the heap it finds once its network is loaded (``gc.freeze``):
  later collections walk only what later tasks allocate.
- The forward pass is one ``tf.function`` traced once per worker for ``(None, width)``
  float32 inputs (half the time of an eager ``model(x)`` per 10,000-row batch).
- The UDF returns the final columns (for a classifier, one struct of the probability
  vector and the prediction), so every task's outputs and their nulls are made in one
  place; that costs what building them on the JVM from one score per row did.
"""
from __future__ import annotations

import gc
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
from pyspark.ml import Model
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReader, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from sparkdeep import tasks
from sparkdeep.storage import Storage

from .._persist import save_metadata
from .._vectors import list_matrix, require_new
from .network import keras_from_bytes, network_output
from .params import ScoringParams
from .staging import float_arrays

KERAS_FILE = "model/model.keras"

log = logging.getLogger(__name__)

#: The classifier's UDF output: the two columns it adds, built in Python.
CLASSIFIER_SCORES = T.StructType([T.StructField("probability", VectorUDT()),
                                  T.StructField("prediction", T.DoubleType())])

_LOADED: dict[str, Any] = {}
_SCORERS: dict[str, "_Scorer"] = {}


def _cached_keras(digest: str, data: bytes):
    """One Keras model per process and model (the driver reads its shape and task)."""
    model = _LOADED.get(digest)
    if model is None:
        model = keras_from_bytes(data)
        _LOADED[digest] = model
    return model


@dataclass(frozen=True)
class _ScoreSpec:
    """What a Python worker needs besides the network's bytes (plain values, pickled small)."""
    digest: str
    width: int
    units: int
    task: str
    mode: str
    fcol: str
    arrow_type: Any  # the UDF's pa.DataType, exactly as Spark expects it (nullability included)


class _Scorer:
    """One network in one Python worker: loaded once, its forward pass traced once.

    Only ever built inside a Spark Python worker (the UDF), never on the driver: it
    freezes the worker's heap (see the module docstring), a process-wide change a
    user's driver process must not get.
    """

    def __init__(self, data: bytes, width: int):
        import tensorflow as tf

        net = keras_from_bytes(data)
        self._forward = tf.function(lambda x: net(x, training=False),
                                    input_signature=[tf.TensorSpec((None, width), tf.float32)])
        self._forward(np.zeros((1, width), dtype="float32"))  # trace now, before the freeze
        gc.collect()  # what loading left behind is freed, not frozen
        gc.freeze()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self._forward(x).numpy()


def _scorer(spec: _ScoreSpec, shipped) -> _Scorer:
    scorer = _SCORERS.get(spec.digest)
    if scorer is None:
        scorer = _SCORERS[spec.digest] = _Scorer(shipped.value, spec.width)
    return scorer


def _usable_rows(col: pa.Array, spec: _ScoreSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """A batch's rows the network can score, as one float32 matrix (no per-row Python
    objects), and their positions in the batch (``None``: every row, the common case).

    A row of another length raises (:func:`list_matrix`); a null row or one holding NaN
    or an infinity raises with ``handleInvalid='error'`` and is left out otherwise.
    """
    n = len(col)
    rows = col.drop_null() if col.null_count else col
    x = list_matrix(rows, spec.width, spec.fcol).astype("float32", copy=False)
    if not col.null_count and np.isfinite(x).all():
        return x, None
    finite = np.isfinite(x).all(axis=1)
    bad = n - int(finite.sum())
    if bad and spec.mode == "error":
        raise ValueError(f"DistributedKerasModel: featuresCol {spec.fcol!r} has {bad} rows in a batch that are "
                         "null or hold NaN/infinite values (as float32); fix or drop them, or set "
                         "handleInvalid='keep' to give them null outputs")
    valid = np.flatnonzero(np.asarray(col.is_valid())) if col.null_count else np.arange(n)
    return x[finite], valid[finite]


def _scores(x: np.ndarray, scorer: _Scorer, units: int) -> np.ndarray:
    """The network's outputs for ``x`` as float64 ``(rows, units)``; never a NaN."""
    if not len(x):
        return np.zeros((0, units))
    out = np.asarray(scorer(x), dtype="float64").reshape(len(x), units)
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        raise ValueError(f"DistributedKerasModel: the network produced {int(bad.sum())} non-finite outputs from "
                         "finite inputs (are its weights finite?)")
    return out


def _dense_vectors(values: np.ndarray, missing: np.ndarray | None, vtype: pa.StructType) -> pa.Array:
    """Rows of ``values`` (n, k) as Spark ``VectorUDT`` dense vectors, in Arrow: the
    struct ``(type=1, size, indices, values)`` Spark stores a vector as; ``missing`` rows null."""
    n, k = values.shape
    lists = pa.ListArray.from_arrays(pa.array(np.arange(0, n * k + 1, k, dtype="int32")),
                                     pa.array(values.ravel()), type=vtype.field("values").type)
    return pa.StructArray.from_arrays(
        [pa.array(np.ones(n, dtype="int8")), pa.nulls(n, vtype.field("size").type),
         pa.nulls(n, vtype.field("indices").type), lists], fields=list(vtype),
        mask=None if missing is None else pa.array(missing))


def _output(p: np.ndarray, missing: np.ndarray | None, spec: _ScoreSpec) -> pa.Array:
    """One Arrow array of ``spec.arrow_type``: the prediction (regression), or the
    probability vector and the most likely class (``[P(0), P(1)]`` and ``P(1) >= 0.5`` for
    one sigmoid unit; the outputs and their first argmax otherwise)."""
    if spec.task == "regression":
        return pa.array(p[:, 0], mask=missing)
    if spec.units == 1:
        prob = np.concatenate([1.0 - p, p], axis=1)
        pred = (p[:, 0] >= 0.5).astype("float64")
    else:
        prob, pred = p, np.argmax(p, axis=1).astype("float64")
    vtype, ptype = spec.arrow_type.field(0), spec.arrow_type.field(1)
    return pa.StructArray.from_arrays([_dense_vectors(prob, missing, vtype.type),
                                       pa.array(pred, mask=missing)], fields=[vtype, ptype])


def _score_batches(arrays: Iterator[pa.Array], spec: _ScoreSpec, shipped) -> Iterator[pa.Array]:
    """The Arrow UDF's body: one output array per batch of features (``array<float>``)."""
    scorer = _scorer(spec, shipped)
    for col in arrays:
        x, kept = _usable_rows(col, spec)
        out = _scores(x, scorer, spec.units)
        if kept is not None:  # some rows are null or not finite: their outputs stay null
            n = len(col)
            full = np.zeros((n, spec.units))
            full[kept] = out
            missing = np.ones(n, dtype=bool)
            missing[kept] = False
            out = full
        else:
            missing = None
        yield _output(out, missing, spec)


class DistributedKerasModel(Model, ScoringParams, MLWritable, MLReadable):
    """A trained Keras network that scores a DataFrame in Arrow batches.

    By ``task`` (set at fit; inferred from the output layer when empty):
    ``binary`` and ``multiclass`` add ``probabilityCol`` (a vector of class probabilities:
    ``[P(0), P(1)]`` for a one-unit sigmoid network, the softmax outputs otherwise) and
    ``predictionCol`` (the most likely class; threshold 0.5 for binary), like MLlib's
    classifiers; ``regression`` adds ``predictionCol`` only, in the target's units. An
    output column set to ``''`` is left out.
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
            raise ValueError("this DistributedKerasModel holds no network (was it loaded?)")
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
        units = int(net.outputs[0].shape[-1])
        if task == "regression":
            if units != 1:
                raise ValueError(f"task 'regression' predicts one number per row: this network has {units} output "
                                 "units; set task='multiclass' (softmax units) or use a one-unit network")
            require_new(dataset.schema, self.getPredictionCol(), "predictionCol")
            fields = {"prediction": self.getPredictionCol()}
        else:
            self._check_outputs(dataset.schema)
            fields = {"probability": self.getProbabilityCol(), "prediction": self.getPredictionCol()}
        fields = {field: col for field, col in fields.items() if col}  # '' = not wanted, as in MLlib
        if not fields:
            log.warning("%s: transform adds no column: its output column params are all ''", self.uid)
            return dataset
        mode = self.getHandleInvalid()
        if mode not in ("error", "skip", "keep"):
            raise ValueError(f"handleInvalid must be 'error', 'skip' or 'keep', got {mode!r}")
        fcol = self.getFeaturesCol()
        out_type = T.DoubleType() if task == "regression" else CLASSIFIER_SCORES
        spec = _ScoreSpec(digest=digest, width=int(net.inputs[0].shape[-1]), units=units,
                          task=task, mode=mode, fcol=fcol, arrow_type=to_arrow_type(out_type))
        shipped = dataset.sparkSession.sparkContext.broadcast(data)

        def score(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
            yield from _score_batches(arrays, spec, shipped)

        scores = f"__{self.uid}"  # this stage's own: a fixed name could replace an input column
        out = dataset.withColumn(scores, F.arrow_udf(score, out_type)(float_arrays(dataset.schema, fcol)))
        made = {col: F.col(scores) if task == "regression" else F.col(scores).getField(field)
                for field, col in fields.items()}
        return out.withColumns(made).drop(scores)

    # -- persistence: JSON metadata + model/model.keras (no pickle) --
    def write(self) -> MLWriter:
        return _KerasModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _KerasModelReader(cls)

class _KerasModelWriter(MLWriter):
    def __init__(self, instance: DistributedKerasModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        extra = {"kerasFile": KERAS_FILE, "trainingSummary": self.instance.trainingSummary,
                 "kerasSha256": hashlib.sha256(self.instance.kerasBytes).hexdigest()}
        save_metadata(self.instance, path, self.sparkSession, extra=extra)
        Storage(self.sparkSession).write_checked(f"{path.rstrip('/')}/{KERAS_FILE}", self.instance.kerasBytes)

class _KerasModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> DistributedKerasModel:
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
                                   f"DistributedKerasModel keeps its network only at {KERAS_FILE!r}")
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
        model = DistributedKerasModel(kerasBytes=data, trainingSummary=metadata.get("trainingSummary"))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model


#: The model's name before it was named for every strategy: models saved then name
#: ``sparkdeep.transformers.keras.model.KerasHorovodModel``, which MLlib imports to load them.
KerasHorovodModel = DistributedKerasModel
