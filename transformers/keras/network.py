"""The network as bytes and as a contract: ``.keras`` archives loaded in safe mode, the
builder named by ``modelBuilder``, and the checks that its output fits the task and labels."""
from __future__ import annotations

import hashlib
import importlib
import os
import tempfile


def keras_from_bytes(data: bytes, *, renamed: dict | None = None, custom_objects: dict | None = None):
    """Load a ``.keras`` archive in safe mode (refuses embedded Python code).

    Safe mode imports no module an archive names outside Keras: a custom layer loads only
    if registered, so sparkdeep's own layers are imported first (here, which every load,
    a fresh Horovod rank's included, goes through).

    ``renamed`` (layer name -> registered name) and ``custom_objects`` (registered name ->
    class) load the named layers as another class, for this load only (a rank's split
    tables): Keras lets a registered class win over ``custom_objects``, so the layers are
    renamed in the archive's config first."""
    import keras

    from .. import _keras_layers  # noqa: F401 - registers sparkdeep>ColumnEmbeddings
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        if renamed:
            _write_renamed(data, path, renamed)
        else:
            with open(path, "wb") as fh:
                fh.write(data)
        return keras.saving.load_model(path, compile=False, safe_mode=True, custom_objects=custom_objects)


def _write_renamed(data: bytes, path: str, renamed: dict) -> None:
    """The archive ``data`` at ``path``, its config's top-level layers named in ``renamed``
    given the registered name it says (every other member copied as it is)."""
    import io
    import json
    import shutil
    import zipfile
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            if info.filename == "config.json":
                config = json.loads(src.read(info))
                for entry in (config.get("config") or {}).get("layers") or []:
                    if entry.get("config", {}).get("name") in renamed:
                        entry["registered_name"] = renamed[entry["config"]["name"]]
                dst.writestr(info, json.dumps(config))
                continue
            with src.open(info) as fin, dst.open(info, "w") as fout:
                shutil.copyfileobj(fin, fout, 2 ** 20)


def keras_to_bytes(model) -> bytes:
    """The model as the bytes of a ``.keras`` archive (Keras 3's own format, no pickle)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()

def weights_digest(model) -> str:
    """SHA-256 (hex) of the model's weights in order: equal on ranks holding identical replicas."""
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()

def make_metric(name: str, task: str):
    """The Keras metric ``name`` means for a ``task`` network (one table: sparkdeep.tasks)."""
    import keras

    from sparkdeep.tasks import metric_class
    return getattr(keras.metrics, metric_class(name, task))(name=name)


def builder_parameters(fn) -> set[str]:
    """The keyword parameters a builder takes (all of them if it takes ``**kwargs``)."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"num_classes", "target_mean", "target_scale"}
    return set(params)

def resolve_builder(spec: str):
    """The model builder a ``modelBuilder`` param names, ``"package.module:function"``.

    Raises
    ------
    ValueError
        ``spec`` is not of that form, cannot be imported, or is not callable.
    """
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
