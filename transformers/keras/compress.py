"""Smaller variants of a fitted network: each takes a fitted
:class:`~.model.DistributedKerasModel` and gives another one, saved and loaded like any
(``model/model.keras`` with its SHA-256, safe mode, no pickle), scoring in the same
pipelines and exporting through ``pipelines/export.py``.

- :func:`quantize`: post-training quantization with Keras 3's ``Model.quantize`` (``int8``,
  ``int4``, ``float8``), or ``bfloat16`` weights (every weighted layer but the output
  layer stored and computed in bfloat16: half the bytes; the output layer stays float32,
  so the scores come out as float32 as before). No training.
- :func:`prune`: magnitude pruning. The smallest-|w| fraction ``sparsity`` of every
  ``Dense`` kernel is zeroed, then the network is fine-tuned on the ranks through the
  ordinary :class:`~.estimator.DistributedKerasEstimator` as
  :class:`~sparkdeep.transformers._keras_layers.MaskedDense` layers (the mask a
  non-trainable weight: a pruned weight gets no gradient, so no update revives it), and
  turned back into plain ``Dense`` layers holding ``kernel * mask``.
  ``tensorflow-model-optimization`` refuses Keras 3 models, hence the mask.
- :func:`distill`: a smaller student MLP trained on the ranks on a blend of the labels
  and the teacher's outputs (``alpha * y + (1 - alpha) * teacher``; a probability for a
  binary network, trained with ``softLabels``; the prediction for regression). Multiclass
  would need a vector target the estimator does not take: refused.

Each result's ``trainingSummary['compressed']`` names the method, its settings and the
original network's digest (``from_digest``).

Example
-------
>>> small = quantize(fitted, "int8")                                # doctest: +SKIP
>>> PipelineModel(stages[:-1] + [small]).write().save(path)         # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from sparkdeep import tasks

from .model import DistributedKerasModel
from .network import keras_from_bytes, keras_to_bytes


class UnsupportedVariant(ValueError):
    """This variant cannot be made of this network here (a quantization mode this machine
    or Keras cannot run on it; a multiclass student). The compress step skips it, saying why."""


#: Post-training quantization modes (``bfloat16``: weights cast; the others: Keras' ``quantize``).
QUANTIZE_MODES = ("int8", "int4", "float8", "bfloat16")

#: Layers whose weights ``bfloat16`` casts (the output layer excepted).
_BF16_LAYERS = ("Dense", "EinsumDense", "Embedding", "MaskedDense")


def _digest(model: DistributedKerasModel) -> str:
    return hashlib.sha256(model.kerasBytes).hexdigest()


def _variant(original: DistributedKerasModel, net, compressed: dict) -> DistributedKerasModel:
    """A new stage holding ``net``: the original's params (columns, task), a summary
    naming what was done to which network."""
    summary = {"compressed": {**compressed, "from_digest": _digest(original)},
               "task": original.trainingSummary.get("task"), "input_dim": original.trainingSummary.get("input_dim")}
    out = DistributedKerasModel(kerasBytes=keras_to_bytes(net), trainingSummary=summary)
    original._copyValues(out)
    if not out.getOrDefault(out.task):
        out._set(task=original._task(keras_from_bytes(original.kerasBytes)))
    return out


#: Quantization's side weights (scales, zero points, amax histories): not parameters.
_SIDE_WEIGHTS = ("_scale", "_zero", "_history", "g_idx")


def parameter_count(net) -> int:
    """The network's parameters as it was built: every weight, trainable or not, but
    quantization's scales and histories; an int4 kernel (two values a byte) counts its
    values, not its bytes."""
    total = 0
    for layer in net.layers:
        packed = getattr(layer, "quantization_mode", None) == "int4"
        for w in layer.weights:
            name = w.path.rsplit("/", 1)[-1]
            if name.endswith(_SIDE_WEIGHTS):
                continue
            n = int(np.prod(w.shape))
            if packed and name == "kernel":
                # packed two values a byte along the output axis
                n = n // int(w.shape[-1]) * int(layer.units) if hasattr(layer, "units") else 2 * n
            total += n
    return total


def _output_layer(net):
    hist = getattr(net.outputs[0], "_keras_history", None)
    return getattr(hist, "operation", None) or net.layers[-1]


def _dense_layers(net) -> list:
    return [layer for layer in net.layers if type(layer).__name__ in ("Dense", "MaskedDense")]


def kernel_sparsity(net) -> dict[str, float]:
    """Each ``Dense`` kernel's fraction of exact zeros, by layer name."""
    return {layer.name: float(np.mean(np.asarray(layer.kernel) == 0)) for layer in _dense_layers(net)}


# -- quantization ---------------------------------------------------------------------------

def _to_bfloat16(net):
    weighted = [layer for layer in net.layers if type(layer).__name__ in _BF16_LAYERS and layer.weights]
    # The last one computes the outputs: kept float32 so scores and exports stay float32.
    keep = _output_layer(net) if type(_output_layer(net)).__name__ in _BF16_LAYERS else weighted[-1]
    cast = {layer.name for layer in weighted if layer is not keep}
    if not cast:
        raise ValueError("quantize('bfloat16'): the network has no weighted layer besides its output layer")
    config = net.get_config()
    if "layers" not in config:
        raise ValueError(f"quantize('bfloat16') rewrites a functional or sequential network's config; "
                         f"{type(net).__name__} {net.name!r} has none")
    for entry in config["layers"]:
        if entry.get("config", {}).get("name") in cast:
            entry["config"]["dtype"] = "bfloat16"
    out = type(net).from_config(config)
    for old, new in zip(net.layers, out.layers):
        new.set_weights(old.get_weights())
    return out


def quantize(model: DistributedKerasModel, mode: str) -> DistributedKerasModel:
    """``model`` with its weights in ``mode``: ``int8``, ``int4``, ``float8`` (Keras 3's
    ``Model.quantize``: Dense and Embedding kernels; other layers as they were) or
    ``bfloat16`` (every weighted layer but the output layer).

    Raises ``ValueError`` naming the mode when it is not one of :data:`QUANTIZE_MODES`, when
    Keras cannot quantize this network in it, or when the quantized network does not load
    back in safe mode or gives non-finite scores here.
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize mode must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}")
    import warnings

    net = keras_from_bytes(model.kerasBytes)
    try:
        if mode == "bfloat16":
            net = _to_bfloat16(net)
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*does not have a `quantize` method")
                net.quantize(mode)
        variant = _variant(model, net, {"method": "quantize", "mode": mode})
        back = keras_from_bytes(variant.kerasBytes)  # loads in safe mode, as a pipeline load will
        width = int(back.inputs[0].shape[-1])
        probe = np.asarray(back(np.zeros((2, width), dtype="float32"), training=False), dtype="float64")
    except Exception as e:  # noqa: BLE001 - Keras and TensorFlow fail in many types; name the mode
        raise UnsupportedVariant(f"quantize mode {mode!r} does not work for this network on this machine "
                         f"({type(e).__name__}: {e})") from e
    if not np.isfinite(probe).all():
        raise UnsupportedVariant(f"quantize mode {mode!r}: the quantized network gives non-finite outputs on "
                                 "this machine")
    return variant


# -- pruning --------------------------------------------------------------------------------

def _clone(net, fn):
    """``net`` rebuilt layer by layer through ``fn`` (pruning's masks, distillation's narrower
    student): only a functional or sequential network can be."""
    import keras
    if "layers" not in net.get_config():
        raise ValueError(f"compress clones a functional or sequential network; {type(net).__name__} {net.name!r} "
                         "is neither")
    return keras.models.clone_model(net, clone_function=fn)


def magnitude_masks(net, sparsity: float) -> dict[str, np.ndarray]:
    """Per ``Dense`` kernel, a 0/1 mask zeroing its ``ceil(sparsity * size)`` smallest |w|
    (at least the target fraction, whatever the kernel's size)."""
    masks = {}
    for layer in _dense_layers(net):
        w = np.asarray(layer.kernel, dtype="float64")
        k = min(w.size, int(np.ceil(sparsity * w.size - 1e-9)))
        mask = np.ones(w.size, dtype="float32")
        if k:
            mask[np.argsort(np.abs(w).ravel(), kind="stable")[:k]] = 0.0
        masks[layer.name] = mask.reshape(w.shape)
    return masks


def masked_network(net, masks: dict[str, np.ndarray]):
    """``net`` with its ``Dense`` layers as ``MaskedDense`` holding ``masks`` (kernels already masked)."""
    from .._keras_layers import MaskedDense

    masked = _clone(net, lambda layer: MaskedDense.from_config(layer.get_config())
                    if type(layer).__name__ == "Dense" else layer.__class__.from_config(layer.get_config()))
    old = {layer.name: layer for layer in net.layers}
    for layer in masked.layers:
        if layer.name in masks:
            kernel, *rest = old[layer.name].get_weights()
            layer.set_weights([kernel * masks[layer.name], *rest, masks[layer.name]])
        elif layer.name in old and layer.weights:
            layer.set_weights(old[layer.name].get_weights())
    return masked


def unmasked_network(net):
    """``MaskedDense`` layers back to plain ``Dense`` ones holding ``kernel * mask``."""
    import keras

    plain = _clone(net, lambda layer: keras.layers.Dense.from_config(layer.get_config())
                   if type(layer).__name__ == "MaskedDense" else layer.__class__.from_config(layer.get_config()))
    old = {layer.name: layer for layer in net.layers}
    for layer in plain.layers:
        src = old.get(layer.name)
        if src is None or not layer.weights:
            continue
        if type(src).__name__ == "MaskedDense":
            kernel, *rest, mask = src.get_weights()
            layer.set_weights([kernel * mask, *rest])
        else:
            layer.set_weights(src.get_weights())
    return plain


def _estimator(model: DistributedKerasModel, net, label_col: str, *, loss: str, train: dict[str, Any]):
    from .estimator import DistributedKerasEstimator

    est = DistributedKerasEstimator(featuresCol=model.getFeaturesCol(), labelCol=label_col, loss=loss,
                                metrics=[], **train)
    if net is not None:
        est.setModel(net)
    return est


def prune(model: DistributedKerasModel, dataset, *, sparsity: float, labelCol: str = "label",
          epochs: int = 2, **train: Any) -> DistributedKerasModel:
    """``model`` with the smallest-|w| ``sparsity`` of every ``Dense`` kernel zeroed, then
    fine-tuned ``epochs`` epochs on ``dataset`` (its ``featuresCol`` and ``labelCol``) on the
    ranks, the zeros kept.

    ``train`` goes to :class:`~.estimator.DistributedKerasEstimator` (``numProc``,
    ``batchSize``, ``learningRate``, ``seed``, ...); the loss is the task's default. With
    ``epochs=0`` the network is pruned without fine-tuning (no ranks started).
    """
    if not 0 < sparsity < 1:
        raise ValueError(f"sparsity must be in (0, 1) (the fraction of each Dense kernel zeroed), got {sparsity}")
    if epochs < 0:
        raise ValueError(f"epochs (of fine-tuning) must be >= 0, got {epochs}")
    net = keras_from_bytes(model.kerasBytes)
    task = model._task(net)
    masks = magnitude_masks(net, sparsity)
    if not masks:
        raise ValueError(f"prune: network {net.name!r} has no Dense layer to prune")
    masked = masked_network(net, masks)
    summary: dict[str, Any] = {}
    if epochs:
        fitted = _estimator(model, masked, labelCol, loss=tasks.DEFAULT_LOSS[task],
                            train={"epochs": epochs, **train}).fit(dataset)
        masked = keras_from_bytes(fitted.kerasBytes)
        summary = {"history": fitted.trainingSummary.get("history"),
                   "fit_s": fitted.trainingSummary.get("timings_s", {}).get("fit_total")}
    plain = unmasked_network(masked)
    reached = kernel_sparsity(plain)
    short = {name: s for name, s in reached.items() if s < sparsity - 1e-9}
    if short:
        raise RuntimeError(f"prune: kernels below the target sparsity {sparsity} after fine-tuning: {short}")
    return _variant(model, plain, {"method": "prune", "sparsity": sparsity, "fine_tune_epochs": epochs,
                                   "kernel_sparsity": reached, **summary})


# -- distillation ---------------------------------------------------------------------------

def hidden_widths(net) -> list[int]:
    """The widths of the network's hidden ``Dense`` layers (its output layer left out)."""
    out = _output_layer(net)
    return [int(layer.units) for layer in _dense_layers(net) if layer is not out]


def student_network(net, units: list[int] | None = None):
    """The teacher's architecture with narrower hidden ``Dense`` layers (``units``, one per
    hidden layer; default: half of each) and fresh weights: the same inputs, embeddings,
    periodic features, normalisation and output (a tabular teacher's student still embeds
    its categories), only less wide."""
    out = _output_layer(net)
    hidden = [layer for layer in _dense_layers(net) if layer is not out]
    widths = list(units) if units else [max(1, int(layer.units) // 2) for layer in hidden]
    if len(widths) != len(hidden) or min(widths, default=1) < 1:
        raise ValueError(f"distill: the student's hidden widths {widths} must be one width >= 1 per hidden Dense "
                         f"layer of the teacher ({[int(layer.units) for layer in hidden]})")
    narrower = {layer.name: int(w) for layer, w in zip(hidden, widths)}

    def clone(layer):
        config = layer.get_config()
        if layer.name in narrower:
            config["units"] = narrower[layer.name]
        return type(layer).from_config(config)
    return _clone(net, clone)


def distill(model: DistributedKerasModel, dataset, *, labelCol: str = "label", alpha: float = 0.5,
            hiddenUnits: list[int] | None = None, epochs: int = 5, **train: Any) -> DistributedKerasModel:
    """A student (:func:`student_network`: the teacher's architecture, hidden widths
    ``hiddenUnits``, default half the teacher's) trained on the ranks on
    ``alpha * label + (1 - alpha) * teacher`` over ``dataset``'s rows.

    The teacher's output is its probability of class 1 (binary; the student is trained on
    these soft labels with binary cross-entropy) or its prediction (regression; mse).
    Multiclass is refused: the blend is a probability vector per row, which the
    estimator's integer class labels cannot carry.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha (the labels' weight in the student's target) must be in [0, 1], got {alpha}")
    net = keras_from_bytes(model.kerasBytes)
    task = model._task(net)
    if task == "multiclass":
        raise UnsupportedVariant("distill: a multiclass teacher's soft outputs are a probability vector per row; the "
                         "estimator trains on one integer class per row, so a multiclass student cannot be "
                         "distilled here (binary and regression networks can)")
    student = student_network(net, list(hiddenUnits) if hiddenUnits else None)
    units = hidden_widths(student)
    target = "__distill_target"
    label = F.col(labelCol).cast("double")
    scored = model.copy()  # the teacher, writing only the column the blend reads
    if task == "binary":
        scored.setPredictionCol("").setProbabilityCol("__teacher_probability")
    else:
        scored.setPredictionCol("__teacher_prediction")
    rows = scored.transform(dataset)
    teacher = (vector_to_array(F.col("__teacher_probability"))[1] if task == "binary"
               else F.col("__teacher_prediction"))
    rows = rows.withColumn(target, F.lit(float(alpha)) * label + F.lit(1.0 - float(alpha)) * teacher)
    rows = rows.select(model.getFeaturesCol(), target)
    est = _estimator(model, student, target, loss=tasks.DEFAULT_LOSS[task],
                     train={"epochs": epochs, **({"softLabels": True} if task == "binary" else {}), **train})
    fitted = est.fit(rows)
    return _variant(model, keras_from_bytes(fitted.kerasBytes),
                    {"method": "distill", "alpha": alpha, "hidden_units": units,
                     "teacher_hidden_units": hidden_widths(net), "epochs": epochs,
                     "history": fitted.trainingSummary.get("history"),
                     "fit_s": fitted.trainingSummary.get("timings_s", {}).get("fit_total")})


__all__ = ["QUANTIZE_MODES", "UnsupportedVariant", "distill", "hidden_widths", "kernel_sparsity", "magnitude_masks",
           "masked_network", "parameter_count", "prune", "quantize", "student_network", "unmasked_network"]
