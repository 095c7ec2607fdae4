"""Importable Keras model builders for :class:`KerasHorovodEstimator`.

A builder is a plain function ``f(input_dim, **args) -> keras.Model``; the estimator
names it as ``"module:function"`` so the choice is a JSON param that survives
persistence and needs nothing pickled.
"""
from __future__ import annotations


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


# The builder the estimator uses for each task when none is named.
DEFAULT_BUILDERS = {
    "binary": "sparkdeep.transformers.keras_models:mlp_binary_classifier",
    "multiclass": "sparkdeep.transformers.keras_models:mlp_classifier",
    "regression": "sparkdeep.transformers.keras_models:mlp_regressor",
}
