"""sparkdeep's own Keras layers, registered under the ``sparkdeep`` package.

Keras safe mode (what :func:`.network.keras_from_bytes` loads with) never imports
a module named in a ``.keras`` archive outside Keras itself: a custom class loads only if
it is already registered, i.e. this module has been imported. ``keras_from_bytes`` imports
it before every load, so drivers, executors and fresh Horovod ranks all know these layers,
and an archive still cannot name (and so import) anything else.

This module imports Keras at import time; the builders in :mod:`.keras_models` import it
only when they build a network, so the driver's imports stay free of Keras.
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops

# Keras' Embedding default ("uniform"): U(-0.05, 0.05).
_INIT_RANGE = 0.05


@keras.saving.register_keras_serializable(package="sparkdeep")
class ColumnEmbeddings(keras.layers.Layer):
    """One learned embedding per categorical column, stored in a few shared tables.

    The input is ``(batch, n_columns)`` category indices (floats or ints), column ``i``
    taking values in ``0..cardinalities[i] - 1``; the output is ``(batch, sum(dims))``,
    column ``i``'s ``dims[i]``-wide vector after column ``i - 1``'s: exactly what one
    ``Embedding(cardinalities[i], dims[i])`` per column, concatenated, gives, without
    thousands of layers. Columns of the same width share one table (``table_w<width>``):
    column ``i``'s rows start at its offset in that table, so the layer holds one weight
    per distinct width (a few dozen at most) whatever the column count.

    An index is clipped to ``[0, cardinality - 1]`` of its column (a corrupt value lands
    in the last row, the unseen/null bucket, instead of another column's rows). The
    unseen/null row of every column starts at zero, the others as Keras' ``Embedding``
    does, U(-0.05, 0.05).

    The config holds only the two lists of ints, so the layer saves to ``.keras`` and
    loads back in safe mode (once this module is imported).
    """

    def __init__(self, cardinalities, dims, **kwargs):
        super().__init__(**kwargs)
        self.cardinalities = [int(c) for c in cardinalities]
        self.dims = [int(d) for d in dims]
        if len(self.cardinalities) != len(self.dims) or not self.cardinalities:
            raise ValueError(f"ColumnEmbeddings needs one width per column and at least one column, got "
                             f"{len(self.cardinalities)} cardinalities and {len(self.dims)} widths")
        if any(c < 1 for c in self.cardinalities) or any(d < 1 for d in self.dims):
            raise ValueError("ColumnEmbeddings needs cardinalities and widths >= 1")
        # Indices are read before any cast (float32 index inputs stay float32 under mixed precision).
        self.autocast = False
        cards = np.asarray(self.cardinalities, dtype="int64")
        dims_ = np.asarray(self.dims, dtype="int64")
        self._top = (cards - 1).astype("float32")
        self._top_int = (cards - 1).astype("int32")
        offsets = np.zeros(len(cards), dtype="int64")
        #: (width, columns of that width in column order, rows of its table)
        self._groups = []
        for width in sorted(set(self.dims)):
            cols = np.flatnonzero(dims_ == width)
            offsets[cols] = np.concatenate([[0], np.cumsum(cards[cols])[:-1]])
            self._groups.append((int(width), cols.astype("int32"), int(cards[cols].sum())))
        if int(max(g[2] for g in self._groups)) >= 2 ** 31:
            raise ValueError("ColumnEmbeddings: a table would need more than 2^31 rows")
        self._offsets = offsets.astype("int32")
        # The tables' outputs come grouped by width; this puts them back in column order.
        grouped_start = np.zeros(len(cards), dtype="int64")
        at = 0
        for width, cols, _ in self._groups:
            grouped_start[cols] = at + np.arange(len(cols)) * width
            at += len(cols) * width
        self._order = np.concatenate(
            [grouped_start[i] + np.arange(d) for i, d in enumerate(self.dims)]).astype("int32")
        self._identity_order = bool(np.array_equal(self._order, np.arange(len(self._order))))
        self.tables = []

    def build(self, input_shape=None):
        if self.built:
            return
        for g in range(len(self._groups)):
            self.tables.append(self._new_table(g))
        self.built = True

    def _new_table(self, g: int):
        """Table ``g`` (of :attr:`_groups`), initialised: U(-0.05, 0.05), each column's last
        row (offset + cardinality - 1, its unseen/null bucket) zero."""
        width, cols, rows = self._groups[g]
        cards = np.asarray(self.cardinalities, dtype="int64")
        table = self.add_weight(shape=(rows, width), name=f"table_w{width}", trainable=True,
                                initializer=keras.initializers.RandomUniform(-_INIT_RANGE, _INIT_RANGE))
        keep = np.ones((rows, 1), dtype="float32")
        keep[self._offsets[cols] + cards[cols] - 1] = 0.0
        table.assign(ops.multiply(table, ops.convert_to_tensor(keep, dtype=table.dtype)))
        return table

    def _lookup(self, g: int, table, rows):
        """Rows ``rows`` (``(batch, columns)`` of table ``g``'s row numbers) of ``table``:
        ``(batch, columns, width)``. A rank holding 1/N of the table replaces this
        (:mod:`sparkdeep.transformers.keras.sharding`)."""
        return ops.take(table, rows, axis=0)

    def call(self, indices):
        x = ops.cast(indices, "float32")
        x = ops.minimum(ops.maximum(x, 0.0), ops.convert_to_tensor(self._top))
        idx = ops.cast(x, "int32")
        # Again in integers: a NaN index casts to an arbitrary integer.
        idx = ops.minimum(ops.maximum(idx, 0), ops.convert_to_tensor(self._top_int))
        idx = ops.add(idx, ops.convert_to_tensor(self._offsets))
        parts = []
        for g, ((width, cols, _), table) in enumerate(zip(self._groups, self.tables)):
            sub = idx if len(cols) == len(self.dims) else ops.take(idx, ops.convert_to_tensor(cols), axis=1)
            vectors = self._lookup(g, table, sub)  # (batch, columns of this width, width)
            parts.append(ops.reshape(vectors, (-1, len(cols) * width)))
        out = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=1)
        if not self._identity_order:
            out = ops.take(out, ops.convert_to_tensor(self._order), axis=1)
        return ops.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], int(sum(self.dims)))

    def get_config(self):
        return {**super().get_config(), "cardinalities": list(self.cardinalities), "dims": list(self.dims)}

    def column_table(self, i: int):
        """``(table index, first row)`` of column ``i``'s rows (for inspection and tests)."""
        width = self.dims[i]
        g = next(k for k, (w, _, _) in enumerate(self._groups) if w == width)
        return g, int(self._offsets[i])


@keras.saving.register_keras_serializable(package="sparkdeep")
class PeriodicEmbeddings(keras.layers.Layer):
    """Each number through its own learned periodic features (Gorishniy et al., "On
    Embeddings for Numerical Features in Tabular Deep Learning", NeurIPS 2022: PLR).

    The input is ``(batch, n)`` standardised numbers; the output ``(batch, n * dim)``:
    feature ``i``'s ``dim`` values are ``ReLU(W_i [cos(2 pi c_i x_i), sin(2 pi c_i x_i)] + b_i)``
    with ``frequencies`` trainable frequencies ``c_i`` (initialised N(0, ``scale``)) and a
    dense map ``W_i, b_i`` of its own. A number enters the network as a learned curve of
    itself instead of one coordinate, so a threshold or a narrow band of values (what a
    tree splits on) costs the MLP one unit instead of many. ``scale`` (the paper's sigma)
    matters: 1.0 on standardised numbers gave +0.028 accuracy on one shipped example where 0.1
    (periods of tens of standard deviations: nearly linear features) cost 0.021
    (bench/RESULTS.md, the numeric-embedding ablation).

    With ``clip`` > 0 each number first goes through ``x / sqrt(1 + (x / clip)^2)``
    (smooth, monotone, about ``x`` for ``|x| << clip`` and ``+-clip`` beyond: RealMLP's
    robust scaling), so an outlier of a standardised column cannot dominate its features.

    Its config holds four numbers, so the layer saves to ``.keras`` and loads in safe mode
    (once this module is imported)."""

    def __init__(self, features: int, frequencies: int = 16, dim: int = 16, scale: float = 1.0,
                 clip: float = 3.0, **kwargs):
        super().__init__(**kwargs)
        self.features, self.frequencies, self.dim = int(features), int(frequencies), int(dim)
        self.scale, self.clip = float(scale), float(clip)
        if self.features < 1 or self.frequencies < 1 or self.dim < 1:
            raise ValueError(f"PeriodicEmbeddings needs features, frequencies and dim >= 1, got "
                             f"{self.features}, {self.frequencies}, {self.dim}")
        if not self.scale > 0 or self.clip < 0:
            raise ValueError(f"PeriodicEmbeddings needs scale > 0 and clip >= 0, got {self.scale}, {self.clip}")

    def build(self, input_shape=None):
        if self.built:
            return
        n, k, d = self.features, self.frequencies, self.dim
        self.coefficients = self.add_weight(shape=(n, k), name="frequencies", trainable=True,
                                            initializer=keras.initializers.RandomNormal(0.0, self.scale))
        # Glorot-style for a (2k -> d) map per feature.
        self.kernel = self.add_weight(shape=(n, 2 * k, d), name="kernel", trainable=True,
                                      initializer=keras.initializers.RandomUniform(
                                          -(6.0 / (2 * k + d)) ** 0.5, (6.0 / (2 * k + d)) ** 0.5))
        self.bias = self.add_weight(shape=(n, d), name="bias", trainable=True, initializer="zeros")
        self.built = True

    def call(self, x):
        x = ops.cast(x, self.compute_dtype)
        if self.clip:
            x = ops.divide(x, ops.sqrt(ops.add(1.0, ops.square(ops.divide(x, self.clip)))))
        v = ops.multiply(ops.multiply(2.0 * np.pi, ops.expand_dims(x, -1)),
                         ops.cast(self.coefficients, self.compute_dtype))  # (batch, n, k)
        periodic = ops.concatenate([ops.cos(v), ops.sin(v)], axis=-1)  # (batch, n, 2k)
        out = ops.einsum("bnk,nkd->bnd", periodic, ops.cast(self.kernel, self.compute_dtype))
        out = ops.relu(ops.add(out, ops.cast(self.bias, self.compute_dtype)))
        return ops.reshape(out, (-1, self.features * self.dim))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.features * self.dim)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "frequencies": self.frequencies,
                "dim": self.dim, "scale": self.scale, "clip": self.clip}


@keras.saving.register_keras_serializable(package="sparkdeep")
class EnsembleAdapter(keras.layers.Layer):
    """The entry of a parameter-efficient ensemble (TabM-mini: Gorishniy et al., "TabM",
    ICLR 2025): ``(batch, d)`` -> ``(batch, members, d)``, member ``j``'s copy scaled
    elementwise by its own trainable vector ``r_j`` (initialised to random signs, so the
    members start different). The layers after it act on the last axis and so are shared
    by all members; :class:`EnsembleHeads` gives each member its own output. Members cost
    one vector each here, not a network each."""

    def __init__(self, members: int, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.members, self.seed = int(members), int(seed)
        if self.members < 1:
            raise ValueError(f"EnsembleAdapter needs members >= 1, got {self.members}")

    def build(self, input_shape):
        if self.built:
            return
        d = int(input_shape[-1])
        signs = np.random.default_rng(self.seed).choice([-1.0, 1.0], size=(self.members, d)).astype("float32")
        self.scales = self.add_weight(shape=(self.members, d), name="scales", trainable=True,
                                      initializer=keras.initializers.Constant(signs))
        self.built = True

    def call(self, x):
        x = ops.cast(x, self.compute_dtype)
        return ops.multiply(ops.expand_dims(x, 1), ops.cast(self.scales, self.compute_dtype))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.members, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "members": self.members, "seed": self.seed}


@keras.saving.register_keras_serializable(package="sparkdeep")
class EnsembleHeads(keras.layers.Layer):
    """Each member's own linear output: ``(batch, members, h)`` -> ``(batch, members, units)``
    with a ``(h, units)`` kernel and a bias per member (Glorot-uniform, zeros)."""

    def __init__(self, members: int, units: int, **kwargs):
        super().__init__(**kwargs)
        self.members, self.units = int(members), int(units)
        if self.members < 1 or self.units < 1:
            raise ValueError(f"EnsembleHeads needs members and units >= 1, got {self.members}, {self.units}")

    def build(self, input_shape):
        if self.built:
            return
        h = int(input_shape[-1])
        limit = (6.0 / (h + self.units)) ** 0.5
        self.kernel = self.add_weight(shape=(self.members, h, self.units), name="kernel", trainable=True,
                                      initializer=keras.initializers.RandomUniform(-limit, limit))
        self.bias = self.add_weight(shape=(self.members, self.units), name="bias", trainable=True,
                                    initializer="zeros")
        self.built = True

    def call(self, x):
        out = ops.einsum("bmh,mhu->bmu", ops.cast(x, self.compute_dtype), ops.cast(self.kernel, self.compute_dtype))
        return ops.add(out, ops.cast(self.bias, self.compute_dtype))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.members, self.units)

    def get_config(self):
        return {**super().get_config(), "members": self.members, "units": self.units}


@keras.saving.register_keras_serializable(package="sparkdeep")
class MaskedDense(keras.layers.Dense):
    """A ``Dense`` layer whose kernel is multiplied by a fixed 0/1 mask: magnitude pruning's
    fine-tuning network (``transformers/keras/compress.py``).

    The mask is a non-trainable weight (``kernel_mask``), so it travels in the ``.keras``
    archive and in the ranks' broadcast like any weight, and the layer's config is
    ``Dense``'s. A pruned weight gets no gradient (the output does not depend on it), so
    an optimizer update cannot revive it, whatever the optimizer or the training loop; the
    pruned network is turned back into plain ``Dense`` layers holding ``kernel * mask`` once
    trained. A constraint that re-zeroes the weights that are exactly zero would not hold:
    Adam moves them off zero in the very update the constraint then sees.
    """

    def build(self, input_shape):
        super().build(input_shape)
        self.kernel_mask = self.add_weight(name="kernel_mask", shape=tuple(self.kernel.shape),
                                           initializer="ones", trainable=False, dtype=self.variable_dtype)

    # Dense saves a fixed list of variables (its quantization modes'); the mask is one more,
    # so the layer saves and loads every weight in order, as a plain Layer does.
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)

    def call(self, inputs, training=None):
        y = ops.matmul(inputs, ops.multiply(self.kernel, ops.cast(self.kernel_mask, self.kernel.dtype)))
        if self.bias is not None:
            y = ops.add(y, self.bias)
        return self.activation(y) if self.activation is not None else y
