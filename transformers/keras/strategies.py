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

# name -> (module, class, launch backend)
STRATEGIES: dict[str, tuple[str, str, str]] = {
    "horovod": ("horovod_ring", "HorovodRing", "horovod"),
    "collective": ("tf_collective", "TensorFlowCollective", "tensorflow"),
    "local_sgd": ("local_sgd", "LocalSGD", "tensorflow"),
    "parameter_server": ("parameter_server", "ParameterServer", "tensorflow_ps"),
}


def backend_for(strategy: str) -> str:
    """The launch backend (:func:`sparkdeep.distributed.run_on_ranks`) a strategy needs."""
    return _entry(strategy)[2]


def _entry(strategy: str) -> tuple[str, str, str]:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}")
    return STRATEGIES[strategy]


def make(strategy: str, spec) -> "RankStrategy":
    """The :class:`RankStrategy` named ``strategy``, for a rank training ``spec``."""
    module, cls, _ = _entry(strategy)
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)(spec)


def dense_gradients(grads: list) -> list:
    """Each embedding gradient (``tf.IndexedSlices``: one row per looked-up index, so a
    batch's rows x width values plus their indices) as the dense tensor of its table when
    that holds fewer numbers, which it does for the small tables of a tabular network.
    Reduced sparse, Horovod would all-gather values and indices (two more collectives per
    update, sizes exchanged first); dense, the table joins the one grouped all-reduce."""
    import tensorflow as tf
    out = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            dense = 1
            for d in g.dense_shape if isinstance(g.dense_shape, (tuple, list)) else tf.get_static_value(g.dense_shape):
                dense *= int(d)
            rows = g.values.shape[0]
            sparse = None if rows is None else int(rows) * (g.values.shape[1:].num_elements() + 1)
            if sparse is None or dense <= sparse:
                g = tf.convert_to_tensor(g)
        out.append(g)
    return out


def payload_bytes(tensors) -> int:
    """Bytes of ``tensors`` as they are handed to a collective (their own dtype)."""
    total = 0
    for t in tensors:
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
