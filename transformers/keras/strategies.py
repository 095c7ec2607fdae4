"""How the ranks of one fit agree: one interface, one module per strategy.

A rank's training loop (:func:`sparkdeep.transformers.train_rank`) knows
nothing of Horovod or TensorFlow's collectives: it asks its :class:`RankStrategy` to

- :meth:`~RankStrategy.start` (join the other ranks; gives this rank and the number of ranks),
- :meth:`~RankStrategy.broadcast` rank 0's variables into every replica once,
- reduce each update's gradients (:meth:`~RankStrategy.gradients`: an all-reduce, or
  nothing for local SGD), optionally after a timed :meth:`~RankStrategy.wait` for the others;
  a strategy whose reduction is a graph op (:attr:`~RankStrategy.reduces_in_graph`) has it
  traced into the step's one ``tf.function`` instead (:meth:`~RankStrategy.graph_gradients`,
  counted with :meth:`~RankStrategy.count`),
- act after each update (:meth:`~RankStrategy.after_update`: local SGD averages the
  weights every K updates) and at the end of each epoch (:meth:`~RankStrategy.end_epoch`),
- :meth:`~RankStrategy.average` and :meth:`~RankStrategy.sum` the epoch's figures.

Which backend launches the ranks (Horovod's Gloo rendezvous or ``TF_CONFIG``) follows from
the strategy (:func:`backend_for`), so the driver never imports Horovod for a strategy
that does not use it. Each strategy counts what it sent (:attr:`RankStrategy.calls`,
:attr:`RankStrategy.bytes`: payload bytes handed to the collective by this rank).
"""
from __future__ import annotations

import importlib

from sparkdeep.registry import STRATEGY_RULES, strategy_rule

# Where each declared strategy (sparkdeep.registry.STRATEGY_RULES: its name, backend and the
# settings it takes) is implemented: module of this package, class. Imported on use only, so
# the driver never imports Horovod for a strategy that does not need it.
IMPLEMENTATIONS: dict[str, tuple[str, str]] = {
    "horovod": ("horovod_ring", "HorovodRing"),
    "collective": ("tf_collective", "TensorFlowCollective"),
    "local_sgd": ("local_sgd", "LocalSGD"),
    "parameter_server": ("parameter_server", "ParameterServer"),
}
if set(IMPLEMENTATIONS) != set(STRATEGY_RULES):  # pragma: no cover - a declaration without its class
    raise ImportError(f"strategies declared {sorted(STRATEGY_RULES)} but implemented {sorted(IMPLEMENTATIONS)}")


def backend_for(strategy: str) -> str:
    """The launch backend (:func:`sparkdeep.distributed.run_on_ranks`) a strategy needs."""
    return strategy_rule(strategy).backend


def make(strategy: str, spec) -> "RankStrategy":
    """The :class:`RankStrategy` named ``strategy``, for a rank training ``spec``."""
    module, cls = IMPLEMENTATIONS[strategy_rule(strategy).name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(spec)


def merge_slices(g):
    """``g`` (``tf.IndexedSlices``) with each index once, its values summed: what the dense
    tensor of its table holds, row by row. An embedding's gradient names a row once per
    lookup, and an optimizer applying the slices as they come squares each lookup's part
    apart (Adam's second moment would add squares instead of squaring the sum); merged,
    a sparse update equals the dense one."""
    import tensorflow as tf
    unique, position = tf.unique(g.indices)
    values = tf.math.unsorted_segment_sum(g.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, g.dense_shape)


def merged(grads: list) -> list:
    """``grads`` with every ``tf.IndexedSlices`` merged (:func:`merge_slices`), the rest as they are."""
    import tensorflow as tf
    return [merge_slices(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def add_gradients(acc: list, grads: list) -> list:
    """Two updates' gradients added, position by position (accumulation): two sparse ones by
    joining their slices, merged (:func:`merge_slices`) so the sum stays one slice per row."""
    import tensorflow as tf
    out = []
    for a, g in zip(acc, grads):
        if isinstance(a, tf.IndexedSlices) and isinstance(g, tf.IndexedSlices):
            out.append(merge_slices(tf.IndexedSlices(
                tf.concat([a.values, g.values], 0), tf.concat([a.indices, tf.cast(g.indices, a.indices.dtype)], 0),
                a.dense_shape)))
        else:
            out.append(tf.convert_to_tensor(a) + tf.convert_to_tensor(g))
    return out


def scale_gradients(grads: list, factor: float) -> list:
    """``grads`` times ``factor``, sparse ones as sparse."""
    import tensorflow as tf
    return [tf.IndexedSlices(g.values * factor, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
            else g * factor for g in grads]


def _static_rows(shape) -> int | None:
    n = 1
    for d in shape:
        if d is None:
            return None
        n *= int(d)
    return n


def dense_gradients(grads: list, lookups: int) -> list:
    """Each embedding gradient (``tf.IndexedSlices``: one row per looked-up index) as the
    dense tensor of its table when that holds no more numbers than its slices can (``lookups``
    rows of values plus their indices: a batch's rows), which it does for the small tables
    of a tabular network; the others stay
    sparse. Dense, a table joins the one grouped all-reduce; sparse, its values and indices
    are all-gathered (:meth:`~.horovod_ring.HorovodRing.graph_gradients`), which costs the
    rows looked up, not the table: a table of a million IDs sends a batch's rows."""
    import tensorflow as tf
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            dense = _static_rows(g.dense_shape if isinstance(g.dense_shape, (tuple, list))
                                 else tf.get_static_value(g.dense_shape))
            width = g.values.shape[1:].num_elements() or 1
            # The bound, not this batch's count: a traced step and an eager one decide alike.
            if dense is not None and dense <= int(lookups) * (width + 1):
                g = tf.convert_to_tensor(g)
        out.append(g)
    return out


def sparse_bytes(g, lookups: int) -> int:
    """Bytes one rank hands the all-gathers for sparse gradient ``g``, at most: ``lookups``
    rows of values and their indices (merged, a batch's distinct rows are fewer)."""
    width = g.values.shape[1:].num_elements() or 1
    return int(lookups) * (width * g.values.dtype.size + g.indices.dtype.size)


def payload_bytes(tensors) -> int:
    """Bytes of ``tensors`` as they are handed to a collective (their own dtype)."""
    import tensorflow as tf
    total = 0
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            raise TypeError("payload_bytes takes dense tensors; count sparse ones with sparse_bytes")
        n = 1
        for d in t.shape:
            n *= int(d)
        total += n * t.dtype.size
    return total


class RankStrategy:
    """The interface; a strategy overrides what it does differently. ``calls`` and
    ``bytes`` count the collectives of :meth:`gradients` and :meth:`after_update` (the
    per-update traffic), not the few per epoch."""

    name = ""
    trains_itself = False  # True: :meth:`train` runs the whole rank (a coordinator drives the workers)
    reduces_in_graph = False  # True: :meth:`graph_gradients` may be traced into the step's tf.function
    inter_op_threads = 1

    def __init__(self, spec):
        self.spec = spec
        self.calls = 0
        self.bytes = 0

    def start(self) -> tuple[int, int]:
        raise NotImplementedError

    def train(self, t_enter: float, devices: str | None):
        """The whole rank, for a strategy that ``trains_itself``: the :class:`~.contract.RankResult`."""
        raise NotImplementedError

    def broadcast(self, variables) -> None:
        """Set every variable to rank 0's value on every rank."""
        raise NotImplementedError

    def wait(self) -> None:
        """Return once every rank has reached this point (a one-number collective): timed
        before :meth:`gradients`, it separates waiting for the others from sending."""
        self.average(0.0)

    def gradients(self, grads: list) -> list:
        """This update's gradients as the optimizer should apply them."""
        raise NotImplementedError

    def graph_gradients(self, grads: list) -> list:
        """:meth:`gradients` as graph ops, for a strategy that :attr:`reduces_in_graph`: it is
        traced once into the step's ``tf.function``, so it counts nothing itself; the loop
        calls :meth:`count` with the updates it ran."""
        raise NotImplementedError

    def count(self, updates: int) -> None:
        """Add ``updates`` in-graph reductions to :attr:`calls` and :attr:`bytes`."""
        self.calls += updates
        self.bytes += updates * getattr(self, "update_bytes", 0)

    def after_update(self, model, update_no: int) -> bool:
        """After the optimizer applied update ``update_no`` (1-based, counted over the run);
        True if it communicated."""
        return False

    def end_epoch(self, model) -> bool:
        """At the end of an epoch, before validation and checkpoints; True if it communicated."""
        return False

    def finish(self) -> None:
        """After the rank's last collective: release the backend. A strategy whose ranks shut
        down together (a collective shutdown) may let the rank process skip the interpreter's
        teardown (:data:`sparkdeep.distributed.FAST_EXIT_ENV`)."""

    def average(self, value: float) -> float:
        return self.sum([float(value)])[0] / self.size

    def sum(self, values: list[float]) -> list[float]:
        raise NotImplementedError
