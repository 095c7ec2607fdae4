"""The optimizer a rank trains with, by name: Keras' own, or ``lazy_adam``.

Keras' Adam updates both of its slots and the weights of every row of an embedding table
every step, whatever rows the batch looked up: the sparse gradient is made dense first. At
10^6-10^7 levels that dense update over the whole table (or a rank's share of a split one)
is most of a step. ``lazy_adam`` is Adam whose update of a sparse gradient (an embedding's
``tf.IndexedSlices``) touches the looked-up rows only: their moments and weights, as
TensorFlow Addons' ``LazyAdam`` and PyTorch's ``SparseAdam`` do. A row the batch did not look
up keeps its moments and weights (Adam would decay its moments and move it on them). Every
dense gradient is updated exactly as by Adam.
"""
from __future__ import annotations

#: The names :func:`make_optimizer` takes besides Keras' own.
OWN = ("lazy_adam",)


def make_optimizer(name: str, learning_rate: float):
    """The optimizer ``name`` (``lazy_adam``, or any name ``keras.optimizers.get`` knows)."""
    import keras
    if name.lower() in OWN:
        return _lazy_adam_class()(learning_rate=learning_rate)
    return keras.optimizers.get({"class_name": name, "config": {"learning_rate": learning_rate}})


def check_optimizer(name: str) -> None:
    """On the driver, before any rank starts.

    Raises
    ------
    ValueError
        ``name`` is neither ``lazy_adam`` nor an optimizer Keras knows.
    """
    import keras
    if not isinstance(name, str) or not name:
        raise ValueError(f"optimizer must be a Keras optimizer's name or 'lazy_adam', got {name!r}")
    if name.lower() in OWN:
        return
    try:
        keras.optimizers.get({"class_name": name, "config": {}})
    except (ValueError, TypeError) as exc:
        raise ValueError(f"optimizer {name!r} is neither 'lazy_adam' nor an optimizer Keras knows "
                         f"(adam, adamw, sgd, rmsprop, ...): {str(exc).splitlines()[0][:200]}") from None


def _lazy_adam_class():
    import keras
    import tensorflow as tf

    class LazyAdam(keras.optimizers.Adam):
        """Adam, its sparse updates touching the looked-up rows only (see the module)."""

        def update_step(self, gradient, variable, learning_rate):
            if not isinstance(gradient, tf.IndexedSlices):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            step = tf.cast(self.iterations + 1, dtype)
            beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
            alpha = tf.cast(learning_rate, dtype) * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
            index = self._get_variable_index(variable)
            m, v = _resource(self._momentums[index]), _resource(self._velocities[index])
            rows, g = gradient.indices, tf.cast(gradient.values, dtype)  # each row once (merged slices)
            m_rows = tf.gather(m, rows) * beta_1 + g * (1 - beta_1)
            v_rows = tf.gather(v, rows) * beta_2 + tf.square(g) * (1 - beta_2)
            m.scatter_update(tf.IndexedSlices(m_rows, rows))
            v.scatter_update(tf.IndexedSlices(v_rows, rows))
            _resource(variable).scatter_sub(tf.IndexedSlices(alpha * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows))

    def _resource(variable):
        # Keras' variable holds TensorFlow's (whose row-wise scatter ops these are); the
        # backend may hand either to update_step.
        return variable.value if isinstance(variable, keras.Variable) else variable

    return LazyAdam
