"""Importable Keras model builders for :class:`DistributedKerasEstimator`.

A builder is a plain function ``f(input_dim, **args) -> keras.Model``; the estimator
names it as ``"module:function"`` so the choice is a JSON param that survives
persistence and needs nothing pickled.
"""
from __future__ import annotations

from sparkdeep.registry import Choices


def _mlp(input_dim: int, hidden_units, dropout: float, outputs: int, activation: str, name: str):
    import keras

    inputs = keras.Input(shape=(int(input_dim),), name="features")
    x = inputs
    for i, units in enumerate(hidden_units):
        x = keras.layers.Dense(int(units), activation="relu", name=f"dense_{i}")(x)
        if dropout:
            x = keras.layers.Dropout(float(dropout), name=f"dropout_{i}")(x)
    out = keras.layers.Dense(int(outputs), activation=activation, name="probabilities")(x)
    return keras.Model(inputs, out, name=name)


def mlp_binary_classifier(input_dim: int, hidden_units=(64, 32), dropout: float = 0.1):
    """A ReLU MLP ending in one sigmoid unit: P(label = 1)."""
    return _mlp(input_dim, hidden_units, dropout, 1, "sigmoid", "mlp_binary_classifier")


def mlp_classifier(input_dim: int, num_classes: int, hidden_units=(64, 32), dropout: float = 0.1):
    """A ReLU MLP ending in ``num_classes`` softmax units (train with
    ``loss='sparse_categorical_crossentropy'`` and integer labels 0..num_classes-1)."""
    return _mlp(input_dim, hidden_units, dropout, num_classes, "softmax", "mlp_classifier")


def mlp_regressor(input_dim: int, hidden_units=(64, 32), dropout: float = 0.1, target_mean: float = 0.0,
                  target_scale: float = 1.0):
    """A ReLU MLP ending in one linear unit: the predicted target, in its own units
    (train with ``loss='mse'``, ``'mae'`` or ``'huber'``).

    ``target_mean``/``target_scale`` (the estimator passes the training labels' mean and
    standard deviation) end the network in ``y = z * scale + mean``: the layers learn a
    standardised target, which a target in the thousands needs to train at the usual
    learning rates, and the prediction comes out in the target's units.
    """
    import keras
    net = _mlp(input_dim, hidden_units, dropout, 1, "linear", "mlp_regressor")
    if target_mean == 0.0 and target_scale == 1.0:
        return net
    if not target_scale > 0:
        raise ValueError(f"target_scale must be > 0, got {target_scale}")
    out = keras.layers.Rescaling(scale=float(target_scale), offset=float(target_mean), name="target_units")(
        net.outputs[0])
    return keras.Model(net.inputs, out, name="mlp_regressor")


#: The layer averaging an ensemble's members (its input: each member's prediction).
ENSEMBLE_MEAN = "ensemble_mean"

# The builder the estimator uses for each task when none is named.
DEFAULT_BUILDERS = {
    "binary": "sparkdeep.transformers.keras_models:mlp_binary_classifier",
    "multiclass": "sparkdeep.transformers.keras_models:mlp_classifier",
    "regression": "sparkdeep.transformers.keras_models:mlp_regressor",
}


# -- tabular networks: a numeric block and one learned embedding per categorical column ----

def embedding_dim(cardinality: int, cap: int = 24) -> int:
    """Width of a categorical column's embedding: grows like cardinality^0.56 (a rule of
    thumb from fast.ai's tabular models), at least 2, at most ``cap``."""
    return int(max(2, min(cap, round(1.6 * max(int(cardinality), 1) ** 0.56))))


def _tabular(input_dim: int, numeric_dim: int, cardinalities, hidden_units, dropout: float,
             normalization: str, embedding_cap: int, numeric_embedding: str = "none",
             periodic: dict | None = None, ensemble: int = 0):
    """The shared body: the input vector is ``[numeric_dim standardised numbers, one category
    index per categorical column]`` (the prepare pipeline's embedding layout). Each index
    column gets its own ``embedding_dim(cardinality, embedding_cap)``-wide embedding (index
    ``cardinality - 1`` is the unseen/null bucket StringIndexer's ``handleInvalid='keep'``
    gives; its vector starts at zero), all held by one
    :class:`~sparkdeep.transformers._keras_layers.ColumnEmbeddings` layer, concatenated
    with the numbers, then Dense -> normalisation -> ReLU -> dropout per hidden layer.
    Built-in layers, ops and that registered layer only: the saved ``.keras`` file loads in
    Keras safe mode (:func:`~sparkdeep.transformers.network.keras_from_bytes`).

    ``numeric_embedding="periodic"`` also passes the numbers through
    :class:`~sparkdeep.transformers._keras_layers.PeriodicEmbeddings` (``periodic`` holds
    its ``frequencies``, ``dim``, ``scale`` and ``clip``), beside the numbers themselves.
    ``ensemble`` > 1 turns the hidden layers into that many members sharing their weights
    (:class:`~sparkdeep.transformers._keras_layers.EnsembleAdapter`: TabM-mini), ``x`` then
    ``(batch, members, units)``.

    Layer normalisation by default: batch normalisation keeps running statistics that
    each Horovod rank would update from its own shard only (no all-reduce), so the
    replicas would end different; layer normalisation has no such state."""
    import keras

    numeric_dim, cards = int(numeric_dim), [int(c) for c in cardinalities or ()]
    if numeric_dim < 0 or numeric_dim + len(cards) != int(input_dim):
        raise ValueError(f"the embedding layout needs input_dim = numeric_dim + number of categorical columns: "
                         f"{numeric_dim} + {len(cards)} != {input_dim}")
    if any(c < 2 for c in cards):
        raise ValueError(f"every categorical column needs a cardinality >= 2 (its values + the unseen/null "
                         f"bucket), got {cards}")
    if normalization not in Choices.NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {', '.join(Choices.NORMALIZATIONS)}, got {normalization!r}")
    if numeric_embedding not in Choices.NUMERIC_EMBEDDINGS:
        raise ValueError(f"numeric_embedding must be one of {', '.join(Choices.NUMERIC_EMBEDDINGS)}, "
                         f"got {numeric_embedding!r}")
    from ._keras_layers import ColumnEmbeddings, EnsembleAdapter, PeriodicEmbeddings

    inputs = keras.Input(shape=(int(input_dim),), name="features")
    parts = []
    if numeric_dim:
        numbers = inputs[:, :numeric_dim]
        parts.append(numbers)
        if numeric_embedding == "periodic":
            parts.append(PeriodicEmbeddings(numeric_dim, **(periodic or {}), name="periodic")(numbers))
    if cards:
        # One layer for all the index columns, one shared table per embedding width (not one
        # Embedding per column: thousands of layers build, save and load slowly). Indices
        # arrive as floats; each is clipped to its column's range, which guards a bad index
        # the way the bucket does an unseen value. Each column's unseen/null bucket starts at
        # zero, the centre of the other rows' initial values. It is trained only where
        # training rows are null; otherwise it gets no gradient and an unseen value scores
        # as a neutral category instead of a random one.
        dims = [embedding_dim(card, embedding_cap) for card in cards]
        parts.append(ColumnEmbeddings(cards, dims, name="embeddings")(inputs[:, numeric_dim:]))
    x = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="numeric_and_embeddings")(parts)
    if _members(ensemble):
        x = EnsembleAdapter(_members(ensemble), name="ensemble_adapter")(x)
    for i, units in enumerate(hidden_units):
        x = keras.layers.Dense(int(units), use_bias=normalization == "none", name=f"dense_{i}")(x)
        if normalization == "batch":
            x = keras.layers.BatchNormalization(name=f"norm_{i}")(x)
        elif normalization == "layer":
            x = keras.layers.LayerNormalization(name=f"norm_{i}")(x)
        x = keras.layers.Activation("relu", name=f"relu_{i}")(x)
        if dropout:
            x = keras.layers.Dropout(float(dropout), name=f"dropout_{i}")(x)
    return inputs, x


def _head(inputs, x, units: int, activation: str, ensemble: int, name: str, target_mean: float = 0.0,
          target_scale: float = 1.0):
    """The output: one ``Dense(units, activation)``, or with ``ensemble`` members (``x`` then
    ``(batch, members, h)``) a linear head per member, the activation, and the members' mean
    (the layer :data:`ENSEMBLE_MEAN`, whose input the training loop reads to give each
    member its own loss). A regressor's ``target_mean``/``target_scale`` end it in the target's
    units, before the mean."""
    import keras
    from ._keras_layers import EnsembleHeads
    if ensemble:
        out = EnsembleHeads(ensemble, units, name="ensemble_heads")(x)
        if activation != "linear":
            out = keras.layers.Activation(activation, name="member_probabilities")(out)
    else:
        out = keras.layers.Dense(int(units), activation=activation, name="probabilities")(x)
    if not (target_mean == 0.0 and target_scale == 1.0):
        out = keras.layers.Rescaling(scale=float(target_scale), offset=float(target_mean), name="target_units")(out)
    if ensemble:
        out = keras.layers.GlobalAveragePooling1D(name=ENSEMBLE_MEAN)(out)
    return keras.Model(inputs, out, name=name)


def tabular_binary_classifier(input_dim: int, numeric_dim: int, cardinalities=(), hidden_units=(256, 128),
                              dropout: float = 0.1, normalization: str = "layer", embedding_cap: int = 24,
                              numeric_embedding: str = "none", periodic: dict | None = None, ensemble: int = 0):
    """Embeddings + numeric block + MLP ending in one sigmoid unit: P(label = 1)."""
    inputs, x = _tabular(input_dim, numeric_dim, cardinalities, hidden_units, dropout, normalization,
                         embedding_cap, numeric_embedding, periodic, ensemble)
    return _head(inputs, x, 1, "sigmoid", _members(ensemble), "tabular_binary_classifier")


def tabular_classifier(input_dim: int, num_classes: int, numeric_dim: int, cardinalities=(),
                       hidden_units=(256, 128), dropout: float = 0.1, normalization: str = "layer",
                       embedding_cap: int = 24, numeric_embedding: str = "none", periodic: dict | None = None,
                       ensemble: int = 0):
    """Embeddings + numeric block + MLP ending in ``num_classes`` softmax units."""
    inputs, x = _tabular(input_dim, numeric_dim, cardinalities, hidden_units, dropout, normalization,
                         embedding_cap, numeric_embedding, periodic, ensemble)
    return _head(inputs, x, int(num_classes), "softmax", _members(ensemble), "tabular_classifier")


def tabular_regressor(input_dim: int, numeric_dim: int, cardinalities=(), hidden_units=(256, 128),
                      dropout: float = 0.1, normalization: str = "layer", embedding_cap: int = 24,
                      numeric_embedding: str = "none", periodic: dict | None = None, ensemble: int = 0,
                      target_mean: float = 0.0, target_scale: float = 1.0):
    """Embeddings + numeric block + MLP ending in one linear unit, in the target's units
    (see :func:`mlp_regressor` for ``target_mean``/``target_scale``)."""
    if not target_scale > 0:
        raise ValueError(f"target_scale must be > 0, got {target_scale}")
    inputs, x = _tabular(input_dim, numeric_dim, cardinalities, hidden_units, dropout, normalization,
                         embedding_cap, numeric_embedding, periodic, ensemble)
    return _head(inputs, x, 1, "linear", _members(ensemble), "tabular_regressor", target_mean, target_scale)


def _members(ensemble) -> int:
    """0 for a single network (``ensemble`` 0 or 1), else the member count."""
    k = int(ensemble)
    if k < 0:
        raise ValueError(f"ensemble must be >= 0 (0 or 1: one network), got {k}")
    return k if k > 1 else 0


#: The tabular builder for each task (the prepare pipeline's embedding layout).
TABULAR_BUILDERS = {
    "binary": "sparkdeep.transformers.keras_models:tabular_binary_classifier",
    "multiclass": "sparkdeep.transformers.keras_models:tabular_classifier",
    "regression": "sparkdeep.transformers.keras_models:tabular_regressor",
}
