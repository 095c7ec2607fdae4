"""Embedding tables split by rows across the ranks: model parallelism for the tables,
data parallelism for the rest of the network.

A table of :class:`~sparkdeep.transformers._keras_layers.ColumnEmbeddings` larger than
``shardEmbeddingsAbove`` bytes is held 1/N per rank: rank ``r`` of ``N`` holds global rows
``r, r + N, r + 2N, ...`` (interleaved, so the most frequent levels, which StringIndexer
numbers first, spread over every rank). Its optimizer slots follow, being built from the
rank's own variable. A lookup sends each wanted row number to the rank that owns it and gets
the row back (two all-to-alls, :func:`alltoall_lookup`); the gradient of those rows travels
back the same way, by the all-to-all's own gradient, so each owner receives the sum of every
rank's gradient for its rows. Every other weight stays a replica, averaged by the strategy.

No rank ever holds a whole split table: :meth:`RankShards.load` builds the rank's network
from the archive with its own rows only, and the trained network is put back together on the
driver (:func:`assemble`) from every rank's rows. Invisible outside the ranks: a checkpoint
and the trained model hold the whole table (a checkpoint's is gathered to rank 0,
:meth:`RankShards.whole_model`), so the saved ``.keras`` file, scoring, the export and the
HTTP scorer never know the table was split. Only the ``horovod`` strategy shards
(``sparkdeep.registry.STRATEGY_RULES``).
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import numpy as np

#: Bytes of one table entry (float32 weights).
_ENTRY_BYTES = 4


def shard_rows(rows: int, rank: int, size: int) -> int:
    """Rows of a ``rows``-row table that rank ``rank`` of ``size`` holds (rows ``rank::size``)."""
    return len(range(int(rank), int(rows), int(size)))


@dataclass(frozen=True)
class TablePlan:
    """One table to split: its layer, its index among the layer's tables, its shape."""
    layer: str
    table: int
    rows: int
    width: int

    @property
    def bytes(self) -> int:
        return self.rows * self.width * _ENTRY_BYTES


def _layer_plans(layer, above: int) -> list[TablePlan]:
    return [p for g, (width, _, rows) in enumerate(layer._groups)
            if (p := TablePlan(layer.name, g, int(rows), int(width))).bytes > int(above)]


def plan_tables(model, above: int) -> list[TablePlan]:
    """The tables of ``model``'s :class:`ColumnEmbeddings` layers holding more than ``above``
    bytes (none when ``above`` is 0)."""
    from .._keras_layers import ColumnEmbeddings
    if int(above) <= 0:
        return []
    return [p for layer in model.layers if isinstance(layer, ColumnEmbeddings) for p in _layer_plans(layer, above)]


#: How a ``.keras`` archive's config names the layer (its registered name), and the name a
#: rank loads a layer to split by (registered nowhere: it reaches :meth:`RankShards.load`'s class).
_REGISTERED = "sparkdeep>ColumnEmbeddings"
_RANK_REGISTERED = "sparkdeep_rank>ColumnEmbeddings"


def plan_archive(model_bytes: bytes, above: int) -> list[TablePlan]:
    """:func:`plan_tables` of the network in a ``.keras`` archive, read from its config alone
    (no weights loaded: a rank learns what it will split before it builds anything)."""
    from .._keras_layers import ColumnEmbeddings
    if int(above) <= 0:
        return []
    with zipfile.ZipFile(io.BytesIO(model_bytes)) as zf:
        config = json.loads(zf.read("config.json"))
    out = []
    for entry in (config.get("config") or {}).get("layers") or []:
        if entry.get("registered_name") == _REGISTERED:
            c = entry["config"]
            out += _layer_plans(ColumnEmbeddings(c["cardinalities"], c["dims"], name=c["name"]), above)
    return out


def alltoall_lookup(hvd, shard, rows, rank: int, size: int):
    """Rows ``rows`` (int32, any shape) of the table split across the ranks, this rank
    holding ``shard`` (its rows ``rank::size``): ``rows.shape + (width,)``.

    Every rank must call it the same number of times (an all-to-all is collective; a rank
    with nothing to look up passes an empty ``rows``). The wanted row numbers go to their
    owners sorted by owner, the owners' rows come back in that order and are put back in
    the caller's. Differentiable: the gradient of the result reaches ``shard`` as
    ``tf.IndexedSlices`` holding, for this rank's rows, every rank's gradient."""
    import tensorflow as tf
    flat = tf.reshape(rows, [-1])
    owner = tf.math.floormod(flat, size)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=size, maxlength=size, dtype=tf.int32)
    wanted, wanted_splits = hvd.alltoall(tf.gather(flat, order), splits=splits)
    found = tf.gather(shard, tf.math.floordiv(wanted, size))
    back, _ = hvd.alltoall(found, splits=wanted_splits)
    vectors = tf.gather(back, tf.math.invert_permutation(order))
    return tf.reshape(vectors, tf.concat([tf.shape(rows), tf.shape(shard)[1:]], 0))


def _stored_rows(store, key: str, shape: tuple, rank: int, size: int) -> np.ndarray:
    """Rows ``rank::size`` of the array ``key`` (of ``shape``, the whole table's) of a Keras
    weights store. Where the store is Keras' HDF5 one, the dataset passes Keras' own safety
    checks (no links, external, virtual or bomb datasets) and its shape is checked, then
    h5py reads those rows only (the whole table is never an array here); any other store
    gives the whole array first.

    Raises
    ------
    ValueError
        The stored table is not of ``shape``, or Keras refuses the dataset.
    """
    group = getattr(store, "_h5_entry_group", None)
    dataset = None
    if hasattr(group, "get") and key in group:
        from keras.src.saving.saving_lib import safe_get_h5_dataset
        dataset = safe_get_h5_dataset(group, key)
        if "dtype" in dataset.attrs:  # stored in a dtype of Keras' own (bfloat16): its reader
            dataset = None
    value = dataset if dataset is not None else np.asarray(store[key])
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"the archive's table {key!r} is {tuple(value.shape)}, the layer's is {tuple(shape)}")
    return value[rank::size]


def _sharded_layer_class():
    from .._keras_layers import ColumnEmbeddings

    class ShardedColumnEmbeddings(ColumnEmbeddings):
        """:class:`ColumnEmbeddings` on one rank with some of its tables split: those hold
        this rank's rows only and are looked up through :func:`alltoall_lookup`. Lives on
        the ranks only; never saved (:meth:`RankShards.whole_model` saves the whole layer)."""

        def __init__(self, cardinalities, dims, *, split, lookup, rank, size, **kwargs):
            self._split, self._split_lookup = frozenset(split), lookup
            self._rank, self._size = int(rank), int(size)
            super().__init__(cardinalities, dims, **kwargs)

        def _new_table(self, g: int):
            if g not in self._split:
                return super()._new_table(g)
            width, _, rows = self._groups[g]
            return self.add_weight(shape=(shard_rows(rows, self._rank, self._size), width),
                                   name=f"shard_w{width}", trainable=True, initializer="zeros")

        def _lookup(self, g: int, table, rows):
            if g in self._split:
                return self._split_lookup(table, rows)
            return super()._lookup(g, table, rows)

        def load_own_variables(self, store):
            # A whole table from the archive, cut to this rank's rows as it is read.
            self._check_load_own_variables(store)
            split = {id(self.tables[g]): g for g in self._split}
            for i, v in enumerate(self._trainable_variables + self._non_trainable_variables):
                if id(v) in split:
                    width, _, rows = self._groups[split[id(v)]]
                    v.assign(_stored_rows(store, f"{i}", (rows, width), self._rank, self._size))
                else:
                    v.assign(store[f"{i}"])

    return ShardedColumnEmbeddings


class RankShards:
    """One rank's view of the split tables of a network.

    :meth:`load` builds this rank's network from a whole network's archive (the split
    tables' rows ``rank::size`` only); :meth:`result_weights` is what the rank hands the
    driver to put the trained network together (:func:`assemble`); :meth:`whole_model` and
    :meth:`whole_weights` put the tables back together on rank 0 for a checkpoint
    (collective: every rank calls them); :meth:`local_weights` and :meth:`load_optimizer`
    take a whole checkpoint's arrays down to this rank's rows.
    """

    def __init__(self, plans: list[TablePlan], hvd, rank: int, size: int):
        self.plans, self.hvd, self.rank, self.size = list(plans), hvd, int(rank), int(size)
        self._layers: dict[str, object] = {}  # layer name -> this rank's ShardedColumnEmbeddings
        self._configs: dict[str, dict] = {}   # layer name -> the whole layer's config
        self._calls = 0  # names the eager collectives (Horovod matches them across ranks by name)

    def __bool__(self) -> bool:
        return bool(self.plans)

    # -- the rank's network ---------------------------------------------------------------

    def load(self, model_bytes: bytes):
        """This rank's network from the whole network's ``.keras`` archive: each planned
        table built with this rank's rows only and filled from the archive's table as it
        is read (the whole table is never a variable here)."""
        from .._keras_layers import ColumnEmbeddings

        from .network import keras_from_bytes
        cls = _sharded_layer_class()
        by_layer: dict[str, set] = {}
        for p in self.plans:
            by_layer.setdefault(p.layer, set()).add(p.table)
        shards = self

        def lookup(table, rows):
            return alltoall_lookup(shards.hvd, table, rows, shards.rank, shards.size)

        class SplitOnLoad(ColumnEmbeddings):
            @classmethod
            def from_config(cls_, config):
                if config.get("name") not in by_layer:
                    return ColumnEmbeddings.from_config(config)
                split = by_layer[config["name"]]

                class Bound(cls):  # this rank's split of this layer; Keras' from_config reads the rest
                    def __init__(self, cardinalities, dims, **kwargs):
                        super().__init__(cardinalities, dims, split=split, lookup=lookup, rank=shards.rank,
                                         size=shards.size, **kwargs)

                # The archive files a layer's weights under its class's name: keep the whole layer's.
                Bound.__name__ = Bound.__qualname__ = ColumnEmbeddings.__name__
                shards._configs[config["name"]] = dict(config)
                layer = shards._layers[config["name"]] = Bound.from_config(config)
                return layer

        rank_model = keras_from_bytes(model_bytes, renamed={name: _RANK_REGISTERED for name in by_layer},
                                      custom_objects={_RANK_REGISTERED: SplitOnLoad})
        missing = sorted(set(by_layer) - set(self._layers))
        if missing:
            raise ValueError(f"the network has no ColumnEmbeddings layer named {missing} to split")
        # (plan, this rank's variable), in plan order
        self._split_vars = [(p, self._layers[p.layer].tables[p.table]) for p in self.plans]
        self._variables = [v for _, v in self._split_vars]
        return rank_model

    def is_local(self, variable) -> bool:
        """Whether ``variable`` (the model's or the optimizer's) holds this rank's rows of a
        split table: never broadcast, never all-reduced."""
        return self._rows_of(variable) is not None

    def _is_split(self, variable) -> bool:
        """Whether ``variable`` is this rank's part of a split table (not one of its slots)."""
        return any(variable is s for s in self._variables)

    def positions(self, variables) -> frozenset:
        """Indices in ``variables`` (the trainable ones, in order) of this rank's split tables."""
        return frozenset(i for i, v in enumerate(variables) if self._is_split(v))

    def held(self) -> list[dict]:
        """What this rank holds of each split table: rows, bytes (the summary's report)."""
        out = []
        for p in self.plans:
            local = shard_rows(p.rows, self.rank, self.size)
            out.append({"layer": p.layer, "table": p.table, "rows": p.rows, "width": p.width,
                        "rows_held": local, "bytes": p.bytes, "bytes_held": local * p.width * _ENTRY_BYTES})
        return out

    def result_weights(self, model) -> dict:
        """What this rank hands the driver for :func:`assemble`: ``model``'s weights by
        index in ``get_weights`` order, rank 0 all of them, another rank its rows of the split
        tables only (arrays, not an archive: one copy of the rows, which the result's
        pickling copies once more)."""
        return {i: v.numpy() for i, v in enumerate(model.weights) if self.rank == 0 or self._is_split(v)}

    # -- whole tables back (collective) -----------------------------------------------------

    def _gather(self, local: np.ndarray, rows: int) -> np.ndarray | None:
        """Every rank's ``local`` rows of a ``rows``-row table, as the whole table, on rank 0
        (None on the others: an all-to-all in which every rank sends its rows to rank 0
        only, so no other rank ever holds the whole table)."""
        import tensorflow as tf
        self._calls += 1
        local = np.asarray(local)
        splits = tf.constant([len(local)] + [0] * (self.size - 1), tf.int32)
        parts, _ = self.hvd.alltoall(tf.convert_to_tensor(local), splits=splits, name=f"shards_{self._calls}")
        if self.rank != 0:
            return None
        parts = np.asarray(parts)
        whole = np.empty((rows,) + parts.shape[1:], dtype=parts.dtype)
        at = 0
        for r in range(self.size):
            n = shard_rows(rows, r, self.size)
            whole[r::self.size] = parts[at:at + n]
            at += n
        return whole

    def _rows_of(self, variable) -> int | None:
        """The whole table's rows when ``variable`` is this rank's part of a split table or
        one of its optimizer slots (Keras names a slot after its variable's path), else None."""
        for p, v in self._split_vars:
            if variable is v or (variable.name.startswith(v.path.replace("/", "_") + "_")
                                 and tuple(variable.shape) == tuple(v.shape)):
                return p.rows
        return None

    def whole_weights(self, model, weights: list) -> list | None:
        """``weights`` (``model.get_weights()`` order, this rank's) with every split table
        whole: the arrays the whole network's ``get_weights`` would give, on rank 0 (None
        on the others). Collective."""
        out = list(weights)
        for i, v in enumerate(model.weights):
            if self._is_split(v):
                out[i] = self._gather(out[i], self._rows_of(v))
        return out if self.rank == 0 else None

    def local_weights(self, model, weights: list) -> list:
        """The whole network's ``weights`` cut to this rank's rows of each split table."""
        out = list(weights)
        for i, v in enumerate(model.weights):
            if self._is_split(v):
                out[i] = np.asarray(out[i])[self.rank::self.size]
        return out

    def whole_model(self, model):
        """The whole network (every split table gathered) with ``model``'s weights: the one a
        checkpoint or the trained model saves, on rank 0 (None on the others). Collective."""
        import keras

        from .._keras_layers import ColumnEmbeddings
        whole_tables = {}
        for name, layer in self._layers.items():
            whole_tables[name] = [self._gather(t.numpy(), layer._groups[g][2]) if g in layer._split else t.numpy()
                                  for g, t in enumerate(layer.tables)]
        if self.rank != 0:
            return None

        def clone(layer):
            if layer.name not in self._layers:
                return layer
            return ColumnEmbeddings.from_config(self._configs[layer.name])

        whole = keras.models.clone_model(model, clone_function=clone)
        for layer in whole.layers:
            if layer.name in whole_tables:
                for table, value in zip(layer.tables, whole_tables[layer.name]):
                    table.assign(value)
        return whole

    def optimizer_arrays(self, optimizer) -> list | None:
        """``optimizer.variables``' values with every split table's slots whole, on rank 0
        (None on the others). Collective."""
        out = []
        for v in optimizer.variables:
            value = np.asarray(v)
            rows = self._rows_of(v)
            out.append(self._gather(value, rows) if rows is not None else value)
        return out if self.rank == 0 else None

    def load_optimizer(self, optimizer, arrays: list) -> None:
        """A whole checkpoint's optimizer arrays into this rank's optimizer (each split
        table's slots cut to this rank's rows)."""
        for v, value in zip(optimizer.variables, arrays):
            value = np.asarray(value)
            if self._rows_of(v) is not None:
                value = value[self.rank::self.size]
            v.assign(value)

    def empty_batch(self, model) -> tuple:
        """A batch of no rows (a rank whose validation rows ran out still takes part in the
        others' lookups)."""
        width = int(model.inputs[0].shape[1])
        return np.zeros((0, width), "float32"), np.zeros((0,), "float32"), np.zeros((0,), "float32")

    def most(self, n: int) -> int:
        """The largest ``n`` over the ranks (collective)."""
        import tensorflow as tf
        self._calls += 1
        return int(self.hvd.allreduce(tf.constant(int(n), tf.int64), op=self.hvd.Max, name=f"shards_{self._calls}"))

    def step_bytes(self, batch: int) -> int:
        """Bytes one rank sends the other ranks through the all-to-alls per step of ``batch``
        rows, expected: of each lookup whose row another rank owns ((N - 1) / N of them,
        rows being spread evenly), its row number out, the row back, and its gradient back
        to the owner."""
        total = 0
        for p in self.plans:
            layer = self._layers[p.layer]
            lookups = int(batch) * len(layer._groups[p.table][1])
            total += lookups * (4 + 2 * p.width * _ENTRY_BYTES)
        return total * (self.size - 1) // self.size

    def digest(self, model) -> str:
        """SHA-256 of the replicated weights (every one but this rank's rows of the split
        tables): equal on every rank when the replicas ended identical."""
        import hashlib
        h = hashlib.sha256()
        for v, w in zip(model.weights, model.get_weights()):
            if not self._is_split(v):
                h.update(np.asarray(w).tobytes())
        return h.hexdigest()


def assemble(model_bytes: bytes, parts: list[dict], above: int) -> bytes:
    """The trained whole network's ``.keras`` archive, on the driver: the architecture of
    ``model_bytes`` (the network the ranks started from), rank 0's weights, and every split
    table put back together from each rank's rows (``parts``, one
    :meth:`RankShards.result_weights` per rank, in rank order).

    Raises
    ------
    ValueError
        A rank's part lacks a weight or holds a split table of the wrong number of rows.
    """
    from .network import keras_from_bytes, keras_to_bytes
    whole = keras_from_bytes(model_bytes)
    size = len(parts)
    split = {}
    for p in plan_tables(whole, above):
        table = whole.get_layer(p.layer).tables[p.table]
        split[next(i for i, v in enumerate(whole.weights) if v is table)] = p.rows
    weights = []
    for i, v in enumerate(whole.weights):
        if any(i not in part for part in (parts if i in split else parts[:1])):
            raise ValueError(f"a rank's trained weights lack weight {i} ({v.path})")
        if i not in split:
            weights.append(parts[0][i])
            continue
        rows = split[i]
        value = np.empty(tuple(v.shape), dtype=parts[0][i].dtype)
        for r, part in enumerate(parts):
            want = (shard_rows(rows, r, size),) + tuple(v.shape)[1:]
            got = np.asarray(part[i])
            if got.shape != want or got.dtype != value.dtype:
                raise ValueError(f"rank {r} returned {got.shape} {got.dtype} of {v.path}, "
                                 f"expected {want} {value.dtype} (its rows of {rows})")
            value[r::size] = got
        weights.append(value)
    whole.set_weights(weights)
    return keras_to_bytes(whole)
