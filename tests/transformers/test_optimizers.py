"""``lazy_adam``: Adam whose sparse updates touch the looked-up rows only; a name the driver
refuses before any rank starts."""
from __future__ import annotations

import numpy as np
import pytest

from sparkdeep.transformers.keras.optimizers import check_optimizer, make_optimizer


def _trained(name: str, batches: list) -> list:
    """An embedding of 50 rows and a dense head, a few steps of ``name`` on ``batches`` of row ids."""
    import keras
    import tensorflow as tf

    from sparkdeep.transformers.keras.strategies import merged
    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int32")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(50, 4)(ids)))
    model = keras.Model(ids, out)
    opt = make_optimizer(name, 0.05)
    opt.build(model.trainable_variables)

    @tf.function
    def step(xb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - 1.0) ** 2)
        opt.apply_gradients(zip(merged(tape.gradient(loss, model.trainable_variables)), model.trainable_variables))
    for b in batches:
        step(tf.constant(b, tf.int32))
    return model.get_weights()


def test_lazy_adam_is_adam_on_the_rows_looked_up_and_leaves_the_others_alone():
    every_step = [np.array([[1, 2, 3], [3, 2, 1]])] * 5
    adam, lazy = _trained("adam", every_step), _trained("lazy_adam", every_step)
    np.testing.assert_allclose(lazy[0][1:4], adam[0][1:4], atol=1e-5)  # looked up every step: Adam's update
    assert not np.array_equal(lazy[0][1:4], _trained("lazy_adam", [])[0][1:4])
    np.testing.assert_array_equal(lazy[0][10:], adam[0][10:])  # never looked up: untouched by both
    for a, b in zip(adam[1:], lazy[1:]):  # the dense head: exactly Adam
        np.testing.assert_allclose(b, a, atol=1e-5)
    # A row that leaves the batches: Adam keeps moving it on its moments, the lazy one stops.
    left = [np.array([[1, 2, 3]]), np.array([[4, 5, 6]]), np.array([[4, 5, 6]])]
    once = _trained("lazy_adam", left[:1])
    np.testing.assert_array_equal(_trained("lazy_adam", left)[0][1], once[0][1])
    assert np.abs(_trained("adam", left)[0][1] - once[0][1]).max() > 1e-3


def test_an_optimizer_keras_does_not_know_is_refused_naming_it():
    for name in ("adam", "Adam", "lazy_adam", "sgd", "adamw", "rmsprop"):
        check_optimizer(name)
    for name, why in (("adamx", "'adamx' is neither 'lazy_adam' nor an optimizer Keras knows"),
                      ("", "optimizer must be"), ("os.system", "'os.system' is neither")):
        with pytest.raises(ValueError, match=why):
            check_optimizer(name)
