"""Export a fitted scoring pipeline as one Keras model that needs no Spark.

The promoted model is an MLlib ``PipelineModel``: scoring a row means a Spark session, a
JVM and the stages' Python. A service that scores one row at a time wants none of that.
:func:`export_pipeline` rebuilds what each fitted stage does as Keras layers and ops with
the fitted values copied (never refitted), ends it in the trained network, and writes

- ``model.keras``: one Keras 3 functional model, loadable in safe mode;
- ``saved_model/``: the same as a TensorFlow SavedModel with a ``serving_default``
  signature (TF Serving, TFLite converters, other languages);
- ``schema.json``: each raw input (its source name, the Keras input's name, its type,
  whether it may be null and what stands for null), the outputs, the classes, the task
  and the pipeline it came from.

Inputs are the raw columns under their source names, one ``keras.Input`` of shape (1,)
each: categorical columns as strings, numbers as float64. Numbers stay in float64 up to
the network, as Spark computes them: a raw value far from the training range (1e6) loses
its last digits in float32 before it is standardised, and a value on a quantile edge must
land in the same bin as in Spark. The network itself runs in float32, as the Spark stage
feeds it.

What each stage becomes (stages are told apart by their class's qualified name, so an
export imports no stage code; per-column constants such as medians, means and
splits are held in the graph's config, the PCA matrix in a ``Dense`` layer's weights):

- ``ColumnRenamer``: the inputs take the source names; a categorical column Spark would
  cast to a string (a boolean reads ``true``/``false``) is converted the same way by
  :meth:`ExportedModel.predict`.
- a sampler model (``ClassBalanceSamplerModel``...): nothing; it passes every row through
  when it scores.
- ``StringIndexerModel`` (``handleInvalid='keep'``): ``StringLookup`` over the labels in the
  indexer's order, so the same indices; an unseen value and a null both get the index =
  number of labels, as Spark's ``'keep'``. The empty string is a value like any other: it
  has its index where training saw it, else it is unseen. Null reaches the model as the
  input's ``null_value`` in ``schema.json`` (``""``, or a token that is no label where
  ``""`` is one).
- ``HashIndexer``: Keras' ``Hashing`` (FarmHash ``Fingerprint64`` modulo the buckets, as
  Spark's side computes it); a null (the input's ``null_value``, a token, since ``""`` is a
  value) gets index ``numBuckets``.
- ``OneHotEncoderModel``: the same slots (``dropLast`` drops the last category, the
  unseen/null one).
- ``ImputerModel`` (``MedianImputer``): null, NaN and ``missingValue`` -> the fitted value
  (truncated for an integer column: MLlib casts the column back to its type).
- ``WideAssembler``/``VectorAssembler``: the columns concatenated in the same order.
- the selectors (``selection.py``'s models): the kept slots, in order.
- ``StandardScalerModel``: ``(x - mean) * (1 / std)`` (0 where ``std`` is 0), with
  ``withMean``/``withStd`` as fitted, as MLlib computes it.
- ``CenteredPCAModel``: its centring (and scaling) then its projection, per solver as its
  ``_transform`` does; MLlib's ``PCAModel``: the projection.
- ``Bucketizer`` (``handleInvalid='keep'``, outer splits -inf and +inf, as
  ``QuantileBinner`` fits it): the number of inner splits <= x, so [a, b) with +inf in
  the last bucket; NaN gets the bucket after the last; -0.0 sorts below +0.0 as in Java's
  ``Arrays.binarySearch``.
- ``DistributedKerasModel``: its network, fed float32 as Spark feeds it.
- ``IndexToString``: the most likely class's name.

A stage with no equivalent here is refused by :class:`UnsupportedStageError` naming its
class, before anything is written.

The network may use sparkdeep's registered Keras layers
(``sparkdeep.transformers._keras_layers``, listed under ``keras_layers`` in
``schema.json``): :func:`load_export` registers them before it loads (safe mode still
imports nothing an archive names); the SavedModel needs none of them.

Example
-------
>>> info = export_pipeline(model, "out/export/r1", raw_schema=raw_rows.schema)  # doctest: +SKIP
>>> load_export("out/export/r1").predict([{"colour": None, "x.a": 0.3, "price (USD)": 1e6}])  # doctest: +SKIP
array([0.73])
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from sparkdeep import tasks

KERAS_FILE = "model.keras"
SAVED_MODEL_DIR = "saved_model"
SCHEMA_FILE = "schema.json"
#: schema.json's layout version; a reader refuses one it does not know.
SCHEMA_VERSION = 1

STRING, DOUBLE = "string", "double"
#: The outputs by task: binary P(class 1), k class probabilities (and the class's name
#: when the pipeline names the classes), a regression's prediction in the target's units.
PROBABILITY, PROBABILITIES, PREDICTED_CLASS, PREDICTION = "probability", "probabilities", "predicted_class", "prediction"
OUTPUTS = {"binary": (PROBABILITY,), "multiclass": (PROBABILITIES, PREDICTED_CLASS), "regression": (PREDICTION,)}
#: Spark type names a number input may have in ``raw_schema``.
_INTEGRAL_TYPES = ("int", "integer", "bigint", "long", "smallint", "short", "tinyint", "byte")
_NUMERIC_TYPES = ("double", "float", *_INTEGRAL_TYPES)
_SAFE = re.compile(r"[^A-Za-z0-9_]+")


class UnsupportedStageError(ValueError):
    """A stage (or a setting of one) that the export has no exact Keras equivalent for."""


@dataclass(frozen=True)
class RawColumn:
    """A column of the raw rows: its source name, Spark type name and nullability."""
    name: str
    type: str
    nullable: bool = True


def raw_columns(raw_schema) -> list[RawColumn]:
    """``raw_schema`` as :class:`RawColumn` s: a Spark ``StructType`` (a DataFrame's
    ``schema``), a mapping ``{name: Spark type name}``, or an iterable of
    ``RawColumn``/``(name, type[, nullable])``."""
    if hasattr(raw_schema, "fields"):
        return [RawColumn(f.name, f.dataType.simpleString(), bool(f.nullable)) for f in raw_schema.fields]
    if isinstance(raw_schema, Mapping):
        return [RawColumn(str(k), str(v)) for k, v in raw_schema.items()]
    out = []
    for c in raw_schema:
        out.append(c if isinstance(c, RawColumn) else RawColumn(str(c[0]), str(c[1]), *map(bool, c[2:3])))
    return out


# -- the graph under construction ------------------------------------------------------------

class _Graph:
    """The Keras tensors of the columns the stages have made so far (by internal name), and
    the raw inputs created as stages first read them."""

    def __init__(self, raw: list[RawColumn]):
        import keras
        self.keras = keras
        self.raw = {c.name: c for c in raw}
        if len(self.raw) != len(raw):
            raise ValueError("raw_schema names a column twice")
        self.source: dict[str, str] = {}  # internal name -> source name (ColumnRenamer)
        self.columns: dict[str, Any] = {}
        self.inputs: dict[str, dict] = {}  # source name -> its schema entry, plus "tensor"
        self.labels: dict[str, set[str]] = {}  # source name -> the labels an indexer knows it by
        self.layers = 0

    def name(self, *parts: str) -> str:
        """A unique, safe layer name."""
        self.layers += 1
        return f"s{self.layers}_" + "_".join(_SAFE.sub("_", p).strip("_")[:40] for p in parts if p)

    def read(self, col: str, kind: str, stage) -> Any:
        """The tensor of column ``col`` (internal name) as the stage reads it: one made by
        an earlier stage, else the raw column's input (made on first read)."""
        if col in self.columns:
            return self.columns[col]
        source = self.source.get(col, col)
        raw = self.raw.get(source) or (self.raw.get(col) if col != source else None)
        if raw is None:
            raise ValueError(f"{_stage_name(stage)} reads column {col!r}"
                             + (f" (source name {source!r})" if source != col else "")
                             + " that raw_schema does not have; give the schema of the rows as the source has them")
        entry = self.inputs.get(raw.name)
        if entry is None:
            if kind == DOUBLE and raw.type.split("(")[0] not in _NUMERIC_TYPES + ("decimal",):
                raise ValueError(f"{_stage_name(stage)} reads {raw.name!r} as a number, but raw_schema gives it "
                                 f"type {raw.type!r}")
            keras_name = self._input_name(raw.name)
            tensor = self.keras.Input(shape=(1,), dtype="string" if kind == STRING else "float64", name=keras_name)
            entry = {"name": raw.name, "keras_name": keras_name, "type": kind, "raw_type": raw.type,
                     "nullable": raw.nullable, "tensor": tensor}
            self.inputs[raw.name] = entry
        elif entry["type"] != kind:
            raise UnsupportedStageError(f"{_stage_name(stage)} reads {raw.name!r} as {kind}, an earlier stage as "
                                        f"{entry['type']}: one input cannot be both")
        return entry["tensor"]

    def raw_type(self, tensor) -> str | None:
        """The Spark type of the raw column ``tensor`` is the input of (None: made by a stage)."""
        return next((e["raw_type"] for e in self.inputs.values() if e["tensor"] is tensor), None)

    def _input_name(self, source: str) -> str:
        """A Keras (and SavedModel signature) input name: letters, digits and ``_``,
        starting with a letter, distinct from the other inputs'."""
        base = "in_" + (_SAFE.sub("_", source).strip("_") or "column")
        taken = {e["keras_name"] for e in self.inputs.values()}
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name


def _stage_name(stage) -> str:
    return f"{type(stage).__name__} ({getattr(stage, 'uid', '?')})"


def _qualified(stage) -> str:
    return f"{type(stage).__module__}.{type(stage).__name__}"


def _param(stage, name: str, default=None):
    return stage.getOrDefault(name) if stage.hasParam(name) and stage.isDefined(name) else default


def _in_out(stage) -> list[tuple[str, str]]:
    """The (input, output) column pairs of a single- or multi-column stage."""
    if stage.hasParam("inputCols") and stage.isDefined("inputCols"):
        return list(zip(stage.getOrDefault("inputCols"), stage.getOrDefault("outputCols")))
    return [(stage.getOrDefault("inputCol"), stage.getOrDefault("outputCol"))]


def _f64(x):
    from keras import ops
    return ops.cast(x, "float64")


# -- one function per stage kind ------------------------------------------------------------

def _renamer(g: _Graph, stage) -> None:
    for original, internal in zip(stage.getOrDefault("originals"), stage.getOrDefault("internals")):
        g.source[internal] = original


def _pass_through(g: _Graph, stage) -> None:
    """A sampler model samples only when the pipeline is fitted; scoring passes every row."""


def _string_indexer(g: _Graph, stage) -> None:
    from keras import ops
    mode = _param(stage, "handleInvalid", "error")
    if mode != "keep":
        raise UnsupportedStageError(f"{_stage_name(stage)}: handleInvalid={mode!r} fails or drops a row with an "
                                    "unseen or null value; a model cannot do either per row. Export pipelines "
                                    "fitted with handleInvalid='keep' (prepare's)")
    for (col, out), labels in zip(_in_out(stage), stage.labelsArray):
        labels = list(labels)
        x = g.read(col, STRING, stage)
        for source, entry in g.inputs.items():
            if entry["tensor"] is x:
                g.labels.setdefault(source, set()).update(labels)
        oov = _token_not_in(labels, "[sparkdeep:oov]")
        # One OOV index, which StringLookup puts first (0): labels come out as 1..n.
        lookup = g.keras.layers.StringLookup(vocabulary=labels, num_oov_indices=1, oov_token=oov, mask_token=None,
                                             output_mode="int", name=g.name("index", col))
        found = lookup(x)
        n = len(labels)
        g.columns[out] = _f64(ops.where(ops.equal(found, 0), n, ops.subtract(found, 1)))


def _hash_indexer(g: _Graph, stage) -> None:
    from keras import ops
    buckets = int(stage.getNumBuckets())
    for col, out in zip(stage.getInputCols(), stage.getOutputCols()):
        x = g.read(col, STRING, stage)
        source = next(s for s, e in g.inputs.items() if e["tensor"] is x)
        # "" hashes to a bucket as any value does: a null reaches the model as a token of its
        # own (schema.json's null_value), which gets the null's index. A raw value equal to
        # that token would score as a null.
        labels = g.labels.setdefault(source, set())
        labels.add("")
        null = _token_not_in(labels, "[sparkdeep:null]")
        # Keras' Hashing: FarmHash Fingerprint64 mod num_bins, what HashIndexer computes on Spark.
        hashed = g.keras.layers.Hashing(num_bins=buckets, name=g.name("hash", col))(x)
        g.columns[out] = _f64(ops.where(ops.equal(x, null), buckets, hashed))


def _token_not_in(labels: Iterable[str], base: str) -> str:
    taken = set(labels)
    token, k = base, 0
    while token in taken:
        k += 1
        token = f"{base}{k}"
    return token


def _one_hot(g: _Graph, stage) -> None:
    from keras import ops
    keep = _param(stage, "handleInvalid", "error") == "keep"
    drop_last = bool(_param(stage, "dropLast", True))
    for (col, out), size in zip(_in_out(stage), stage.categorySizes):
        idx = g.read(col, DOUBLE, stage)
        full = int(size) + (1 if keep else 0)
        width = full - (1 if drop_last else 0)
        # An index past the categories is MLlib's invalid category (kept: the extra slot).
        pos = ops.where(ops.greater_equal(idx, float(size)), float(size), idx)
        slots = np.arange(width, dtype="float64")[None, :]
        g.columns[out] = _f64(ops.equal(pos, slots))


def _imputer(g: _Graph, stage) -> None:
    from keras import ops
    row = stage.surrogateDF.first()
    missing = _param(stage, "missingValue", float("nan"))
    for col, out in _in_out(stage):
        x = g.read(col, DOUBLE, stage)
        value = float(row[col])
        if g.raw_type(x) in _INTEGRAL_TYPES:
            value = float(math.trunc(value))  # MLlib casts the imputed column back to the input's type
        gap = ops.isnan(x)
        if not math.isnan(missing):
            gap = ops.logical_or(gap, ops.equal(x, float(missing)))
        g.columns[out] = ops.where(gap, value, x)


def _assembler(g: _Graph, stage) -> None:
    parts = [g.read(c, DOUBLE, stage) for c in stage.getOrDefault("inputCols")]
    out = stage.getOrDefault("outputCol")
    g.columns[out] = parts[0] if len(parts) == 1 else g.keras.layers.Concatenate(
        axis=1, dtype="float64", name=g.name("assemble", out))(parts)


def _selector(g: _Graph, stage) -> None:
    from keras import ops
    x = g.read(stage.getOrDefault("featuresCol"), DOUBLE, stage)
    kept = np.asarray(stage.getOrDefault("selectedFeatures"), dtype="int32")
    if not len(kept):
        raise UnsupportedStageError(f"{_stage_name(stage)} selected no features (Spark refuses to score with it)")
    g.columns[stage.getOrDefault("outputCol")] = ops.take(x, kept, axis=1)


def _affine(x, shift: np.ndarray | None, scale: np.ndarray | None):
    """``(x - shift) * scale``, either part left out when None."""
    from keras import ops
    if shift is not None:
        x = ops.subtract(x, np.asarray(shift, dtype="float64")[None, :])
    if scale is not None:
        x = ops.multiply(x, np.asarray(scale, dtype="float64")[None, :])
    return x


def _linear(g: _Graph, x, kernel: np.ndarray, bias: np.ndarray | None, name: str):
    """``x @ kernel (+ bias)`` in float64, the fitted matrix held as the layer's weights."""
    kernel = np.asarray(kernel, dtype="float64")
    layer = g.keras.layers.Dense(kernel.shape[1], use_bias=bias is not None, dtype="float64", trainable=False,
                                 name=name)
    layer.build((None, kernel.shape[0]))
    layer.set_weights([kernel] if bias is None else [kernel, np.asarray(bias, dtype="float64")])
    return layer(x)


def _standard_scaler(g: _Graph, stage) -> None:
    x = g.read(stage.getInputCol(), DOUBLE, stage)
    std = stage.std.toArray()
    shift = stage.mean.toArray() if stage.getWithMean() else None
    # MLlib's StandardScalerModel: multiply by 1/std, and by 0 where std is 0.
    scale = np.where(std != 0, 1.0 / np.where(std != 0, std, 1.0), 0.0) if stage.getWithStd() else None
    g.columns[stage.getOutputCol()] = _affine(x, shift, scale)


def _centered_pca(g: _Graph, stage) -> None:
    col, out = stage.getInputCol(), stage.getOutputCol()
    x = g.read(col, DOUBLE, stage)
    mean, std, w = stage.mean, stage.std, stage.components
    name = g.name("pca", out)
    if stage.getOrDefault("solver") == "randomized":
        folded = w / std[:, None] if std is not None else w
        g.columns[out] = _linear(g, x, folded, -(mean @ folded), name)
    else:
        # The exact solver's transform: MLlib's StandardScalerModel (std 0 read as 1), then PCAModel.
        scale = 1.0 / np.where(std > 0, std, 1.0) if std is not None else None
        g.columns[out] = _linear(g, _affine(x, mean, scale), w, None, name)


def _pca(g: _Graph, stage) -> None:
    x = g.read(stage.getInputCol(), DOUBLE, stage)
    g.columns[stage.getOutputCol()] = _linear(g, x, stage.pc.toArray(), None, g.name("pca", stage.getOutputCol()))


def _bucketizer(g: _Graph, stage) -> None:
    from keras import ops
    mode = _param(stage, "handleInvalid", "error")
    if mode != "keep":
        raise UnsupportedStageError(f"{_stage_name(stage)}: handleInvalid={mode!r} fails or drops a row with NaN; "
                                    "only 'keep' (NaN in a bucket of its own) has a per-row equivalent")
    if stage.isDefined("splitsArray") and stage.isSet("splitsArray"):
        all_splits = stage.getSplitsArray()
    else:
        all_splits = [stage.getSplits()]
    tiny = np.finfo("float64").tiny
    for (col, out), splits in zip(_in_out(stage), all_splits):
        splits = [float(s) for s in splits]
        if splits[0] != -math.inf or splits[-1] != math.inf:
            raise UnsupportedStageError(f"{_stage_name(stage)}: splits of {col!r} run from {splits[0]} to "
                                        f"{splits[-1]}; Spark fails on a value outside them, which a model cannot "
                                        "do per row. Only splits from -inf to +inf (QuantileBinner's) export")
        x = g.read(col, DOUBLE, stage)
        # Java's Arrays.binarySearch orders -0.0 below +0.0; IEEE comparison does not. Move
        # -0.0 (input and splits) to the smallest normal negative number, below +0.0 and
        # above every other negative number a float64 holds outside the subnormals.
        key = ops.where(ops.logical_and(ops.equal(x, 0.0), ops.less(ops.divide(1.0, x), 0.0)), -tiny, x)
        inner = np.array([-tiny if (s == 0 and math.copysign(1, s) < 0) else s for s in splits[1:-1]],
                         dtype="float64")
        if len(inner):
            bucket = ops.sum(_f64(ops.greater_equal(key, inner[None, :])), axis=1, keepdims=True)
        else:
            bucket = ops.zeros_like(x)
        g.columns[out] = ops.where(ops.isnan(x), float(len(splits) - 1), bucket)


_STAGES: dict[str, Callable[[_Graph, Any], None]] = {
    "sparkdeep.transformers.columns.ColumnRenamer": _renamer,
    "sparkdeep.transformers.columns.WideAssembler": _assembler,
    "pyspark.ml.feature.VectorAssembler": _assembler,
    **{f"sparkdeep.transformers.sampling.{c}": _pass_through
       for c in ("ClassBalanceSamplerModel", "UniformSamplerModel", "StratifiedSamplerModel")},
    "pyspark.ml.feature.StringIndexerModel": _string_indexer,
    "sparkdeep.transformers.hashing.HashIndexer": _hash_indexer,
    "pyspark.ml.feature.OneHotEncoderModel": _one_hot,
    "pyspark.ml.feature.ImputerModel": _imputer,
    **{f"sparkdeep.transformers.selection.{c}": _selector
       for c in ("SelectorModel", "VarianceSelectorModel", "MissingRateSelectorModel", "UnivariateSelectorModel",
                 "CorrelationSelectorModel", "ModelImportanceSelectorModel")},
    "pyspark.ml.feature.StandardScalerModel": _standard_scaler,
    "sparkdeep.transformers.pca.CenteredPCAModel": _centered_pca,
    "pyspark.ml.feature.PCAModel": _pca,
    "pyspark.ml.feature.Bucketizer": _bucketizer,
}
#: The trained network's stage, and the names older saved models give it (before it was named
#: for every strategy; before the ``keras`` package split).
_NETWORKS = ("sparkdeep.transformers.keras.model.DistributedKerasModel",
             "sparkdeep.transformers.keras.model.KerasHorovodModel",
             "sparkdeep.transformers.keras_estimator.KerasHorovodModel")
_CLASS_NAMES = "pyspark.ml.feature.IndexToString"


def _check_stages(stages: list) -> int:
    """The index of the network's stage; every stage is one the export knows, in the order
    a scoring pipeline has them (features, the network, then at most ``IndexToString``)."""
    at = [i for i, s in enumerate(stages) if _qualified(s) in _NETWORKS]
    for i, s in enumerate(stages):
        q = _qualified(s)
        known = q in _STAGES if not at or i < at[-1] else q == _CLASS_NAMES
        if not known and q not in _NETWORKS:
            where = "after the network" if at and i > at[-1] else "before the network"
            raise UnsupportedStageError(f"stage {i} {_stage_name(s)} ({q}) {where} has no exportable Keras "
                                        "equivalent; the export knows "
                                        + ", ".join(sorted({k.rsplit('.', 1)[1] for k in _STAGES})))
    if len(at) != 1:
        raise UnsupportedStageError(f"the pipeline holds {len(at)} DistributedKerasModel stages; the export needs "
                                    "exactly one trained network")
    return at[0]


# -- the export ------------------------------------------------------------------------------

def build_model(pipeline_model, *, raw_schema) -> tuple[Any, dict]:
    """The Keras model of ``pipeline_model`` and its schema (without file names); nothing
    written. See :func:`export_pipeline`."""
    import keras
    from keras import ops

    stages = list(pipeline_model.stages)
    net_at = _check_stages(stages)
    g = _Graph(raw_columns(raw_schema))
    for stage in stages[:net_at]:
        _STAGES[_qualified(stage)](g, stage)
    stage = stages[net_at]
    net = stage.keras_model()
    # The stage's own rule (its task param, else the output layer), so both agree.
    task = tasks.check_task(stage._task(net))
    features = g.read(stage.getFeaturesCol(), DOUBLE, stage)
    width = int(net.inputs[0].shape[-1])
    if int(features.shape[-1]) != width:
        raise ValueError(f"the pipeline assembles {features.shape[-1]} features into "
                         f"{stage.getFeaturesCol()!r}, but the network takes {width}")
    scores = net(ops.cast(features, "float32"))
    classes = None
    outputs = {}
    units = int(scores.shape[-1])
    if (task == "binary" and units > 2) or (task != "binary" and (units == 1) != (task == "regression")):
        raise UnsupportedStageError(f"{_stage_name(stage)}: a {task} network with {units} output units, which "
                                    "Spark does not score as that task either")
    if task == "binary":
        # One sigmoid unit is P(1); of two softmax units the second is (the stage's probability vector).
        outputs[PROBABILITY] = scores if units == 1 else scores[:, 1:2]
    elif task == "multiclass":
        outputs[PROBABILITIES] = scores
        names = [s for s in stages[net_at + 1:] if _qualified(s) == _CLASS_NAMES]
        if names:
            classes = list(names[-1].getLabels())
            if len(classes) != int(scores.shape[-1]):
                raise ValueError(f"{_stage_name(names[-1])} names {len(classes)} classes for a network with "
                                 f"{scores.shape[-1]} outputs")
            # The first most likely class, as Spark's prediction (argmax) and IndexToString give it.
            best = ops.expand_dims(ops.argmax(scores, axis=-1), -1)
            outputs[PREDICTED_CLASS] = keras.layers.StringLookup(
                vocabulary=classes, invert=True, num_oov_indices=0, mask_token=None, name=g.name("class_name"))(best)
    else:
        outputs[PREDICTION] = scores
    for source, entry in g.inputs.items():
        if entry["type"] == STRING:
            # Any string that is no label scores as null does: "", unless "" is a label.
            labels = g.labels.get(source, set())
            entry["null_value"] = _token_not_in(labels, "[sparkdeep:null]") if "" in labels else ""
    model = keras.Model(inputs={e["keras_name"]: e["tensor"] for e in g.inputs.values()}, outputs=outputs,
                        name="sparkdeep_export")
    order = {name: i for i, name in enumerate(g.raw)}
    inputs = sorted((({k: v for k, v in e.items() if k != "tensor"}) for e in g.inputs.values()),
                    key=lambda e: order[e["name"]])
    schema = {
        "schema_version": SCHEMA_VERSION, "task": task,
        "inputs": inputs,
        "unused_columns": [c for c in g.raw if c not in g.inputs],
        "outputs": [{"name": k, "dtype": "string" if k == PREDICTED_CLASS else "float32",
                     "shape": [int(v.shape[-1])]} for k, v in outputs.items()],
        "classes": classes,
        "keras_layers": _registered_layers(net),
        "network": {"name": net.name, "inputs": width, "outputs": int(scores.shape[-1])},
        "stages": [type(s).__name__ for s in stages],
    }
    return model, schema


def _registered_layers(net) -> list[str]:
    """The registered (non-Keras) layer classes the network uses, e.g. ``sparkdeep>ColumnEmbeddings``."""
    import keras
    found = set()
    stack = list(net.layers)
    while stack:
        layer = stack.pop()
        name = keras.saving.get_registered_name(type(layer))
        if ">" in name:
            found.add(name)
        stack.extend(getattr(layer, "layers", []) or [])
    return sorted(found)


def export_pipeline(pipeline_model, out_dir: str, *, raw_schema, source: str | None = None) -> dict:
    """Write ``pipeline_model`` as one Keras model that needs no Spark.

    Parameters
    ----------
    pipeline_model : pyspark.ml.PipelineModel
        A fitted scoring pipeline (the train step's ``pipeline`` model): feature stages,
        one ``DistributedKerasModel``, optionally ``IndexToString``.
    out_dir : str
        A local folder; it gets ``model.keras``, ``saved_model/`` and ``schema.json``
        (replacing what a previous export left there).
    raw_schema : StructType, mapping or iterable
        The raw rows' columns under their source names (see :func:`raw_columns`): their
        types and nullability go to ``schema.json``; a column no stage reads is listed
        as unused.
    source : str, optional
        Where the pipeline was loaded from, recorded in ``schema.json``.

    Returns
    -------
    dict
        ``schema.json``'s content, plus ``out_dir``.

    Raises
    ------
    UnsupportedStageError
        Naming the stage class that has no exportable equivalent (nothing is written).
    """
    import keras

    model, schema = build_model(pipeline_model, raw_schema=raw_schema)
    schema.update(source=source, files={"keras": KERAS_FILE, "saved_model": SAVED_MODEL_DIR})
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    # Written beside the destination, then moved into place: a reader never sees half an export.
    tmp = tempfile.mkdtemp(prefix=".export-", dir=parent)
    try:
        model.save(os.path.join(tmp, KERAS_FILE))
        keras.saving.load_model(os.path.join(tmp, KERAS_FILE), compile=False, safe_mode=True)  # loads as written
        model.export(os.path.join(tmp, SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
        with open(os.path.join(tmp, SCHEMA_FILE), "w") as fh:
            json.dump(schema, fh, indent=2)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**schema, "out_dir": out_dir}


# -- the promoted model (jobs/export.py) ----------------------------------------------------

#: Where exports go under the output folder: ``export/<export id>/``.
EXPORT_DIR = "export"


def raw_schema_of(table_schema):
    """A table's schema as its source has the columns: each renamed column (ingest records
    the source's name in its metadata, :data:`sparkdeep.names.ORIGINAL_NAME`) back under
    that name, type and nullability kept."""
    from pyspark.sql import types as T

    from sparkdeep.names import ORIGINAL_NAME
    return T.StructType([T.StructField((f.metadata or {}).get(ORIGINAL_NAME, f.name), f.dataType, f.nullable)
                         for f in table_schema.fields])


def promoted_export_id(latest: dict) -> str:
    """The export folder's name for the model ``models/latest.json`` (``latest``) promotes:
    its run id, or ``<run id>.g<n>`` for a ``--force`` generation n > 0 (saved under
    ``models/runs/<run id>/<n>/pipeline``), which is another model."""
    from sparkdeep.registry import Models
    run_id = latest["run_id"]
    parts = latest["models"][Models.PIPELINE]["path"].rstrip("/").split("/")
    generation = int(parts[-2]) if len(parts) > 3 and parts[-2].isdigit() and parts[-3] == run_id else 0
    return f"{run_id}.g{generation}" if generation else run_id


def export_promoted(spark, paths, to: str | None = None) -> dict:
    """Export the promoted scoring pipeline (``models/latest.json``) to ``to``, by default
    ``<output>/export/<run id>/`` (``<run id>.g<n>`` for a ``--force`` generation n > 0).

    The pipeline's folder must still have the digest the pointer recorded; the raw columns
    are the held-out table's (the version the promoted models were evaluated on), under
    the source's names."""
    from sparkdeep import delta_io, model_store, storage
    from sparkdeep.paths import read_json, tree_digest
    from sparkdeep.registry import Models, Tables

    latest = read_json(paths.latest)
    if not latest or Models.PIPELINE not in latest.get("models", {}):
        raise FileNotFoundError(f"no promoted model to export: {paths.latest} is missing or names no "
                                f"{Models.PIPELINE!r} model; run the train and evaluate steps first")
    ref, run_id = latest["models"][Models.PIPELINE], latest["run_id"]
    digest = tree_digest(ref["path"])
    if digest != ref["digest"]:
        raise ValueError(f"the promoted model at {ref['path']} is not the one run {run_id!r} recorded (digest "
                         f"{digest[:12]}, recorded {ref['digest'][:12]}): it was replaced since; refusing to export it")
    export_id = promoted_export_id(latest)
    if to is None:
        if not storage.is_local(paths.root):
            raise ValueError(f"the output folder {paths.root} is not local and an export is written with local "
                             "files: give a local destination (--to)")
        to = storage.join(paths.root, EXPORT_DIR, export_id)
    elif not storage.is_local(to):
        raise ValueError(f"--to {to!r}: an export is written with local files; give a local folder")
    holdout = delta_io.read(spark, paths.table(Tables.HOLDOUT), latest.get("tables", {}).get(Tables.HOLDOUT))
    model = model_store.load_pipeline(spark, ref["path"])
    info = export_pipeline(model, storage.local(to), raw_schema=raw_schema_of(holdout.schema), source=ref["path"])
    return {**info, "run_id": run_id, "export_id": export_id}


# -- loading and scoring --------------------------------------------------------------------

class ExportedModel:
    """An export loaded for scoring: :meth:`predict` takes rows under the source's column
    names (a pandas DataFrame or a list of dicts; None and NaN are nulls)."""

    def __init__(self, model, schema: dict):
        self.model, self.schema = model, schema
        self.task = schema["task"]
        self.classes = schema.get("classes")

    def inputs(self, rows) -> dict:
        """The model's input tensors for ``rows``."""
        import tensorflow as tf
        frame = _as_frame(rows)
        out = {}
        for e in self.schema["inputs"]:
            name = e["name"]
            if name not in frame.columns:
                raise ValueError(f"the rows have no column {name!r}; the model reads "
                               f"{[i['name'] for i in self.schema['inputs']]}")
            values = frame[name].to_numpy(dtype=object)
            if e["type"] == STRING:
                # An integer source's column turns float64 in pandas once it holds a null: 3.0 is 3.
                integral = str(e.get("raw_type", "")).split("(")[0] in _INTEGRAL_TYPES
                strings = np.array([_as_string(v, e["null_value"], integral) for v in values], dtype=object)
                # As objects: numpy's fixed-width strings would drop a value's trailing NULs.
                out[e["keras_name"]] = tf.constant(strings.reshape(-1, 1), dtype=tf.string) if len(strings) \
                    else tf.zeros((0, 1), dtype=tf.string)
            else:
                numbers = np.array([np.nan if _is_null(v) else float(v) for v in values], dtype="float64")
                out[e["keras_name"]] = tf.constant(numbers.reshape(-1, 1))
        return out

    def outputs(self, rows) -> dict[str, np.ndarray]:
        """Every output of the model for ``rows``, by name."""
        got = self.model(self.inputs(rows), training=False)
        out = {}
        for k, v in got.items():
            v = v.numpy()
            out[k] = np.array([b.decode() for b in v[:, 0]], dtype=object) if v.dtype == object else v
        return out

    def predict(self, rows) -> np.ndarray:
        """binary: P(class 1) per row; multiclass: the class probabilities (rows x classes);
        regression: the prediction, in the target's units."""
        out = self.outputs(rows)
        if self.task == "multiclass":
            return out[PROBABILITIES]
        return out[PROBABILITY if self.task == "binary" else PREDICTION][:, 0]

    def predict_class(self, rows) -> np.ndarray:
        """multiclass: the most likely class's name per row."""
        if self.task != "multiclass" or not self.classes:
            raise ValueError(f"predict_class needs a multiclass export with class names (this one: {self.task})")
        return self.outputs(rows)[PREDICTED_CLASS]


def _as_frame(rows):
    """Rows as a pandas DataFrame: a DataFrame, one row as a dict, or dicts."""
    import pandas as pd
    if isinstance(rows, pd.DataFrame):
        return rows
    if isinstance(rows, dict):
        return pd.DataFrame([rows])
    return pd.DataFrame.from_records(list(rows))


def _is_null(v) -> bool:
    import pandas as pd
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, (float, np.floating)) and bool(np.isnan(v)))


def _as_string(v, null: str, integral: bool = False) -> str:
    """A categorical value as Spark casts it to a string (a boolean as true/false; a whole
    float of an integer source as the integer)."""
    if _is_null(v):
        return null
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if integral and isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return v if isinstance(v, str) else str(v)


def load_export(out_dir: str) -> ExportedModel:
    """Load an export (:func:`export_pipeline`) for scoring, in Keras safe mode, with
    sparkdeep's own layers registered first; a layer the archive names that is still not
    registered (an export from a newer version) is a ``ValueError`` naming it."""
    import keras

    import sparkdeep.transformers._keras_layers  # noqa: F401  (registers the layers)
    with open(os.path.join(out_dir, SCHEMA_FILE)) as fh:
        schema = json.load(fh)
    if schema.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{out_dir}/{SCHEMA_FILE}: schema_version {schema.get('schema_version')!r}, this code "
                         f"reads {SCHEMA_VERSION}")
    missing = [n for n in schema.get("keras_layers", []) if keras.saving.get_registered_object(n) is None]
    if missing:
        raise ValueError(f"the export at {out_dir} uses the Keras layers {missing}, which this version of "
                         "sparkdeep does not have")
    model = keras.saving.load_model(os.path.join(out_dir, schema["files"]["keras"]), compile=False, safe_mode=True)
    return ExportedModel(model, schema)


__all__ = ["ExportedModel", "RawColumn", "UnsupportedStageError", "build_model", "export_pipeline", "export_promoted",
           "load_export", "promoted_export_id", "raw_columns", "raw_schema_of"]
