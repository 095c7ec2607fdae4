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

No rank ever holds a whole split table, nor receives one. The driver starts the ranks with
an archive whose split tables hold no rows (:func:`for_ranks`) and answers each rank's request
for its own rows (:class:`TableServer`, through :func:`sparkdeep.channel.get`), as it does for
a resumed checkpoint's optimizer slots and best weights. The trained network is put back
together on the driver (:func:`assemble`) from every rank's rows, and so is each checkpoint
(every rank hands its rows to the driver, :meth:`RankShards.checkpoint_part`;
:func:`assemble_checkpoint` writes the whole files). Invisible outside the ranks: a checkpoint
and the trained model hold the whole table, so the saved ``.keras`` file, scoring, the export
and the HTTP scorer never know the table was split. Only the ``horovod`` strategy shards
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


def _checked(value: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"the driver gave {tuple(value.shape)} for {what}, expected {tuple(shape)}")
    return value


def fetch(source: str, key: str, split: bool) -> np.ndarray:
    """From a rank: the array ``key`` of ``source`` (``model``: a split table's dataset in the
    archive's weights; ``optimizer`` or ``best``: a resumed checkpoint's ``v{i}`` / ``w{i}``), this
    rank's rows only when ``split``, as the driver's :class:`TableServer` answers."""
    from sparkdeep.channel import get
    return _npy_view(get(f"{source} {key} {int(bool(split))}"))


def _npy_view(data: bytes) -> np.ndarray:
    """The array of ``.npy`` bytes as a read-only view of them (no copy: a rank's rows of a
    large table are held once while they are assigned), never an object array."""
    buffer = io.BytesIO(data)
    major, _ = np.lib.format.read_magic(buffer)
    read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(buffer)
    if dtype.hasobject:
        raise ValueError("the driver's answer holds Python objects: refused")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=buffer.tell())
    return flat.reshape(shape, order="F" if fortran else "C")


def _split_datasets(weights, plans: list[TablePlan]) -> dict[str, TablePlan]:
    """The paths, in a ``.keras`` archive's open weights file, of the planned tables'
    datasets. A split layer is one of the model's own (top-level) layers, so its variables
    are the group ``/layers/<folder>/vars`` whose ``name`` attribute is the layer's name, and
    table ``g`` is that group's dataset ``g``, of the plan's shape.

    Raises
    ------
    ValueError
        A planned layer has no such group or more than one, or its table is missing or of
        another shape.
    """
    import h5py
    layers = weights.get("layers")
    groups: dict[str, list] = {}
    if isinstance(layers, h5py.Group):
        for folder in layers:
            entry = layers.get(folder, getlink=True)
            group = layers[folder] if isinstance(entry, h5py.HardLink) else None
            held = group.get("vars") if isinstance(group, h5py.Group) else None
            if isinstance(held, h5py.Group) and isinstance(layers[folder].get("vars", getlink=True), h5py.HardLink):
                groups.setdefault(str(held.attrs.get("name", "")), []).append(held)
    found: dict[str, TablePlan] = {}
    for p in plans:
        held = groups.get(p.layer, [])
        if len(held) != 1:
            raise ValueError(f"the archive's weights hold {len(held)} variable groups for the split layer "
                             f"{p.layer!r}, not one")
        data = held[0].get(str(p.table))
        if not isinstance(data, h5py.Dataset) or tuple(data.shape) != (p.rows, p.width):
            shape = tuple(data.shape) if isinstance(data, h5py.Dataset) else None
            raise ValueError(f"the archive's table {held[0].name}/{p.table} is {shape}, its layer's "
                             f"{(p.rows, p.width)}")
        if "dtype" in data.attrs:  # a dtype of Keras' own (bfloat16): served as Keras reads it, not here
            raise ValueError(f"the archive's table {data.name} is stored as {data.attrs['dtype']!r}")
        found[data.name] = p
    return found


def _copy_emptied(src, dst, emptied: set) -> None:
    """``src`` (an HDF5 group) into ``dst``: attributes, groups and datasets, each one
    passing Keras' safety checks and reached by one link only (a shared object would be
    copied once per path), the datasets at ``emptied`` with no rows."""
    import h5py
    from keras.src.saving.saving_lib import safe_get_h5_dataset
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for name in src:
        link = src.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise ValueError(f"the archive's weights hold a link at {src.name}/{name}: refused")
        obj = src[name]
        if h5py.h5o.get_info(obj.id).rc != 1:
            raise ValueError(f"the archive's weights reach {obj.name} by more than one path: refused")
        if isinstance(obj, h5py.Group):
            _copy_emptied(obj, dst.create_group(name), emptied)
            continue
        data = safe_get_h5_dataset(src, name)
        if data.name in emptied:
            out = dst.create_dataset(name, shape=(0,) + tuple(data.shape[1:]), dtype=data.dtype)
            for k, v in data.attrs.items():
                out.attrs[k] = v
        else:
            src.copy(data, dst, name=name)


class TableServer:
    """The driver's side of a launch with split tables (``on_get`` of
    :func:`sparkdeep.distributed.run_on_ranks`): each rank's rows of the split tables of the
    network it starts from, and of a resumed checkpoint's optimizer slots and best weights,
    read as asked (``"<source> <key> <split>"``, :func:`fetch`) and sent as ``.npy`` bytes.

    Only the split tables' datasets are served from the archive, always as the asking rank's
    rows; of the checkpoint's files only the keys they hold, and any array of a split
    table's shape (a slot, a best table) as the rank's rows only. Each dataset passes Keras'
    own safety checks."""

    def __init__(self, network: bytes, plans: list[TablePlan], size: int, *,
                 optimizer: bytes | None = None, best: bytes | None = None):
        import threading

        import h5py
        self.size = int(size)
        with zipfile.ZipFile(io.BytesIO(network)) as zf:
            self._weights_bytes = zf.read("model.weights.h5")
        self._network = network
        self._weights = h5py.File(io.BytesIO(self._weights_bytes), "r")
        self._tables = _split_datasets(self._weights, plans)
        self._shapes = {(p.rows, p.width) for p in plans}
        self._files = {"optimizer": optimizer, "best": best}
        self._last: tuple | None = None  # (source, key, array): the ranks ask in the same order
        self._lock = threading.Lock()

    def rank_archive(self) -> bytes:
        """The archive the ranks start from: the network's, its split tables holding no rows."""
        import h5py
        out = io.BytesIO()
        with h5py.File(out, "w") as dst:
            _copy_emptied(self._weights, dst, set(self._tables))
        with zipfile.ZipFile(io.BytesIO(self._network)) as src, zipfile.ZipFile(archive := io.BytesIO(), "w") as zf:
            for info in src.infolist():
                zf.writestr(info, out.getvalue() if info.filename == "model.weights.h5" else src.read(info))
        return archive.getvalue()

    def _array(self, source: str, key: str) -> np.ndarray:
        if self._last is not None and self._last[:2] == (source, key):
            return self._last[2]
        with np.load(io.BytesIO(self._files[source]), allow_pickle=False) as saved:
            if key not in saved.files:
                raise ValueError(f"the checkpoint's {source} file holds no {key!r}")
            value = saved[key]
        self._last = (source, key, value)
        return value

    def __call__(self, rank: int, what: str) -> bytes:
        from keras.src.saving.saving_lib import safe_get_h5_dataset
        source, key, split = (what.split(" ") + ["", "", ""])[:3]
        if split not in ("0", "1") or not 0 <= int(rank) < self.size:
            raise ValueError(f"rank {rank} asked for {what!r}: not '<source> <key> 0|1' from a rank of {self.size}")
        with self._lock:
            if source == "model" and key in self._tables:
                if split != "1":
                    raise ValueError(f"rank {rank} asked for the whole split table {key}: only its rows are served")
                parent, _, name = key.rpartition("/")
                value = safe_get_h5_dataset(self._weights[parent], name)[int(rank)::self.size]
            elif self._files.get(source) is not None:
                value = self._array(source, key)
                table = value.ndim == 2 and tuple(value.shape) in self._shapes
                if table != (split == "1"):
                    raise ValueError(f"rank {rank} asked for {what!r}: {key} is {tuple(value.shape)}, "
                                     f"{'a split table: only its rows are' if table else 'served whole, not'} served")
                value = value[int(rank)::self.size] if table else value
            else:
                raise ValueError(f"rank {rank} asked for {what!r}, which this launch does not serve")
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(value), allow_pickle=False)
        return buffer.getvalue()


def for_ranks(spec, size: int):
    """``(spec, server)``: what the ranks are started with when ``spec`` splits a table over
    ``size`` ranks: the spec with archives whose split tables hold no rows and a resume without
    the checkpoint's optimizer and best-weights files, and the :class:`TableServer` that gives
    each rank its rows of them. ``(spec, None)`` when no table is split."""
    from dataclasses import replace
    above = int(spec.shard_embeddings_above)
    resume = spec.resume
    network = resume["model_bytes"] if resume else spec.model_bytes
    plans = plan_archive(network, above) if above and size > 1 else []
    if not plans:
        return spec, None
    try:
        server = TableServer(network, plans, size, optimizer=resume and resume.get("optimizer_bytes"),
                             best=resume and resume.get("best_bytes"))
    except ValueError as exc:
        if "stored as" not in str(exc):
            raise
        return spec, None  # a table in a dtype of Keras' own: the ranks cut it from the archive, as Keras reads it
    skeleton = server.rank_archive()
    if resume:
        resume = {**resume, "model_bytes": skeleton, "optimizer_bytes": None, "best_bytes": None,
                  "served": {"best": resume.get("best_bytes") is not None}}
    return replace(spec, model_bytes=skeleton, resume=resume), server


def _sharded_layer_class():
    from .._keras_layers import ColumnEmbeddings

    class ShardedColumnEmbeddings(ColumnEmbeddings):
        """:class:`ColumnEmbeddings` on one rank with some of its tables split: those hold
        this rank's rows only and are looked up through :func:`alltoall_lookup`. Lives on
        the ranks only; never saved (the driver saves the whole layer, :func:`assemble`)."""

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
            # A split table: this rank's rows, asked of the driver where the archive holds
            # none of them (:func:`for_ranks`), else cut from the archive's whole table.
            self._check_load_own_variables(store)
            split = {id(self.tables[g]): g for g in self._split}
            group = getattr(store, "_h5_entry_group", None)
            for i, v in enumerate(self._trainable_variables + self._non_trainable_variables):
                if id(v) not in split:
                    v.assign(store[f"{i}"])
                    continue
                width, _, rows = self._groups[split[id(v)]]
                if group is not None and f"{i}" in group and group[f"{i}"].shape[0] == 0:
                    want = (shard_rows(rows, self._rank, self._size), width)
                    v.assign(_checked(fetch("model", f"{group.name}/{i}", True), want, f"rows of {group.name}/{i}"))
                else:
                    v.assign(_stored_rows(store, f"{i}", (rows, width), self._rank, self._size))

    return ShardedColumnEmbeddings


class RankShards:
    """One rank's view of the split tables of a network.

    :meth:`load` builds this rank's network from a network's archive (the split tables'
    rows ``rank::size`` only, from the driver where the archive holds none: :func:`for_ranks`);
    :meth:`result_weights` is what the rank hands the driver to put the trained network
    together (:func:`assemble`), :meth:`checkpoint_part` its share of a checkpoint
    (:func:`assemble_checkpoint`); :meth:`load_optimizer` and :meth:`resumed_best` take a
    resumed checkpoint's arrays down to this rank's rows.
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

    # -- checkpoints ---------------------------------------------------------------------

    def _rows_of(self, variable) -> int | None:
        """The whole table's rows when ``variable`` is this rank's part of a split table or
        one of its optimizer slots (Keras names a slot after its variable's path), else None."""
        for p, v in self._split_vars:
            if variable is v or (variable.name.startswith(v.path.replace("/", "_") + "_")
                                 and tuple(variable.shape) == tuple(v.shape)):
                return p.rows
        return None

    def checkpoint_part(self, model, optimizer, best: list | None) -> bytes:
        """This rank's share of an epoch's checkpoint, as ``.npz`` bytes for the driver's
        :func:`assemble_checkpoint`: rank 0 every weight (``w{i}``), optimizer variable
        (``o{i}``) and best weight (``b{i}``), another rank its rows of the split tables and
        of their slots only; ``rows`` names, as JSON, each split array's whole rows."""
        arrays, rows = {}, {}
        named = [("w", v, v) for v in model.weights] + [("o", v, v) for v in optimizer.variables]
        if best is not None:
            named += [("b", v, w) for v, w in zip(model.weights, best)]
        counts: dict = {}
        for prefix, variable, value in named:
            i = counts[prefix] = counts.get(prefix, -1) + 1
            whole = self._rows_of(variable)
            if self.rank == 0 or whole is not None:
                arrays[f"{prefix}{i}"] = np.asarray(value)
            if whole is not None:
                rows[f"{prefix}{i}"] = whole
        buffer = io.BytesIO()
        np.savez(buffer, rows=np.array(json.dumps(rows)), **arrays)
        return buffer.getvalue()

    def load_optimizer(self, optimizer, data: bytes | None) -> None:
        """A resumed checkpoint's optimizer state into this rank's optimizer, each split
        table's slots cut to this rank's rows: from ``data`` (its ``optimizer.npz``) or, when
        None, asked of the driver variable by variable (:func:`fetch`)."""
        from .checkpoints import optimizer_arrays
        arrays = optimizer_arrays(data, len(optimizer.variables)) if data is not None else None
        for i, v in enumerate(optimizer.variables):
            split = self._rows_of(v) is not None
            if arrays is None:
                value = fetch("optimizer", f"v{i}", split)
            else:
                value = np.asarray(arrays[i])[self.rank::self.size] if split else arrays[i]
            v.assign(value)

    def resumed_best(self, model, resume: dict) -> list | None:
        """Early stopping's best weights of a resumed checkpoint, each split table cut to this
        rank's rows (from the driver where the spec does not carry them)."""
        from .checkpoints import best_weights_from
        if resume.get("served"):
            if not resume["served"]["best"]:
                return None
            return [fetch("best", f"w{i}", self._is_split(v)) for i, v in enumerate(model.weights)]
        weights = best_weights_from(resume.get("best_bytes"))
        if weights is None:
            return None
        return [np.asarray(w)[self.rank::self.size] if self._is_split(v) else w for v, w in zip(model.weights, weights)]

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


def _interleave(pieces: list, rows: int, what: str) -> np.ndarray:
    """The whole array of ``rows`` rows whose rows ``r::len(pieces)`` are ``pieces[r]``.

    Raises
    ------
    ValueError
        A piece is not of its rank's number of rows, or differs in width or dtype.
    """
    size, first = len(pieces), np.asarray(pieces[0])
    whole = np.empty((int(rows),) + first.shape[1:], dtype=first.dtype)
    for r, piece in enumerate(pieces):
        got, want = np.asarray(piece), (shard_rows(rows, r, size),) + first.shape[1:]
        if got.shape != want or got.dtype != whole.dtype:
            raise ValueError(f"rank {r} returned {got.shape} {got.dtype} of {what}, "
                             f"expected {want} {whole.dtype} (its rows of {rows})")
        whole[r::size] = got
    return whole


def _with_weights(model_bytes: bytes, weights: list) -> bytes:
    from .network import keras_from_bytes, keras_to_bytes
    whole = keras_from_bytes(model_bytes)
    whole.set_weights(weights)
    return keras_to_bytes(whole)


def assemble(model_bytes: bytes, parts: list[dict], above: int) -> bytes:
    """The trained whole network's ``.keras`` archive, on the driver: the architecture of
    ``model_bytes`` (the network the ranks started from), rank 0's weights, and every split
    table put back together from each rank's rows (``parts``, one
    :meth:`RankShards.result_weights` per rank, in rank order).

    Raises
    ------
    ValueError
        A rank's part lacks a weight or holds a split table of the wrong shape.
    """
    from .network import keras_from_bytes
    whole = keras_from_bytes(model_bytes)
    split = {}
    for p in plan_tables(whole, above):
        table = whole.get_layer(p.layer).tables[p.table]
        split[next(i for i, v in enumerate(whole.weights) if v is table)] = p.rows
    weights = []
    for i, v in enumerate(whole.weights):
        if any(i not in part for part in (parts if i in split else parts[:1])):
            raise ValueError(f"a rank's trained weights lack weight {i} ({v.path})")
        weights.append(_interleave([part[i] for part in parts], split[i], v.path) if i in split else parts[0][i])
    whole.set_weights(weights)
    from .network import keras_to_bytes
    return keras_to_bytes(whole)


def assemble_checkpoint(network: bytes, parts: list):
    """An epoch's checkpoint files, whole, on the driver, one at a time as ``(name, bytes)``
    (so the caller stores each and lets it go), from every rank's
    :meth:`RankShards.checkpoint_part` (files or bytes, in rank order) and the architecture of
    ``network``: ``model.keras``, ``optimizer.npz`` and, when the parts hold best weights,
    ``best.npz``, as a checkpoint of a replicated network would be
    (:func:`.checkpoints.read_checkpoint`). The parts are read an array at a time: the whole
    of one array and its pieces, not every rank's share at once.

    Raises
    ------
    ValueError
        A part lacks an array rank 0's names as split, or holds the wrong rows of it.
    """
    opened = [np.load(part if isinstance(part, str) else io.BytesIO(part), allow_pickle=False) for part in parts]
    try:
        rows = json.loads(str(opened[0]["rows"]))
        keys = [k for k in opened[0].files if k != "rows"]

        def merged(key: str) -> np.ndarray:
            if key not in rows:
                return opened[0][key]
            missing = [r for r, part in enumerate(opened) if key not in part.files]
            if missing:
                raise ValueError(f"rank {missing[0]}'s checkpoint part lacks {key}, a split table's")
            return _interleave([part[key] for part in opened], int(rows[key]), key)

        def count(prefix: str) -> int:
            return sum(1 for k in keys if k[0] == prefix and k[1:].isdigit())

        yield "model.keras", _with_weights(network, [merged(f"w{i}") for i in range(count("w"))])
        for name, prefix, key in (("optimizer.npz", "o", "v"), ("best.npz", "b", "w")):
            n = count(prefix)
            if not n and prefix == "b":
                continue
            buffer = io.BytesIO()  # what np.savez writes, an array at a time
            with zipfile.ZipFile(buffer, "w") as zf:
                for i in range(n):
                    with zf.open(f"{key}{i}.npy", "w", force_zip64=True) as fh:
                        np.lib.format.write_array(fh, np.asarray(merged(f"{prefix}{i}")), allow_pickle=False)
            yield name, buffer.getvalue()
    finally:
        for part in opened:
            part.close()
