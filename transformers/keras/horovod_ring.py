"""Horovod's synchronous ring all-reduce of the gradients, every update (the default).

Keras 3 models cannot use ``hvd.DistributedGradientTape`` (horovod#4290), so the gradients
are taken with a plain tape and averaged with one grouped all-reduce (Gloo on CPU, NCCL on
GPU), optionally as float16 on the wire (``compression='fp16'``).

An embedding table larger than a batch's lookups keeps its gradient sparse: its values and
indices are all-gathered (every rank's rows, of any count) and merged, each index once with
its values summed, then divided by the rank count: the dense average's rows, without
sending the table. Horovod 0.28.1's own sparse path of ``grouped_allreduce`` fails inside
a ``tf.function`` (it pairs the gathered values with the wrong input's ``dense_shape``).
"""
from __future__ import annotations

from .profile import horovod_timeline_env
from .strategies import RankStrategy, dense_gradients, merge_slices, payload_bytes, sparse_bytes


class HorovodRing(RankStrategy):
    """Strategy ``horovod``: every update's gradients averaged by Horovod's ring all-reduce.

    The all-reduce runs inside the rank's one-graph step (``reduces_in_graph``); it takes
    ``compression`` and ``accumulation_steps``.
    """
    name = "horovod"
    reduces_in_graph = True

    def start(self) -> tuple[int, int]:
        import horovod.tensorflow as hvd
        horovod_timeline_env(self.spec.trace_dir)  # read by hvd.init
        hvd.init()
        self.hvd = hvd
        self.size = hvd.size()
        self._compression = hvd.Compression.fp16 if self.spec.compression == "fp16" else hvd.Compression.none
        self._n = 0
        return hvd.rank(), hvd.size()

    def _name(self, what: str) -> str:
        self._n += 1
        return f"{what}_{self._n}"

    def broadcast(self, variables) -> None:
        import tensorflow as tf
        for var in variables:
            var.assign(self.hvd.broadcast(tf.convert_to_tensor(var), root_rank=0, name=self._name("init")))

    def gradients(self, grads: list) -> list:
        out = self.graph_gradients(grads)
        self.count(1)
        return out

    def graph_gradients(self, grads: list) -> list:
        import tensorflow as tf
        lookups = int(self.spec.batch_size)
        grads = dense_gradients(grads, lookups)
        dense = [i for i, g in enumerate(grads) if not isinstance(g, tf.IndexedSlices)]
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        wire = 2 if self.spec.compression == "fp16" else 1
        self.update_bytes = (payload_bytes([grads[i] for i in dense]) // wire
                             + sum(sparse_bytes(grads[i], lookups) for i in sparse))
        out = list(grads)
        if dense:
            reduced = self.hvd.grouped_allreduce([grads[i] for i in dense], op=self.hvd.Average,
                                                 compression=self._compression)
            for i, g in zip(dense, reduced):
                out[i] = g
        if sparse:
            values = self.hvd.grouped_allgather([grads[i].values for i in sparse])
            indices = self.hvd.grouped_allgather([grads[i].indices for i in sparse])
            for i, v, idx in zip(sparse, values, indices):
                out[i] = merge_slices(tf.IndexedSlices(v / self.size, idx, grads[i].dense_shape))
        return out

    def sum(self, values: list[float]) -> list[float]:
        import tensorflow as tf
        out = self.hvd.allreduce(tf.constant(values, tf.float64), op=self.hvd.Sum, name=self._name("sum"))
        return [float(v) for v in out.numpy()]

    def average(self, value: float) -> float:
        import tensorflow as tf
        return float(self.hvd.allreduce(tf.constant(float(value)), op=self.hvd.Average, name=self._name("avg")))

    def finish(self) -> None:
        """Horovod's shutdown is collective (every rank's background thread agrees on it),
        so after it no peer can be waiting on this rank: the process may end at once."""
        import os

        from sparkdeep.channel import FAST_EXIT_ENV
        self.hvd.shutdown()
        os.environ[FAST_EXIT_ENV] = "1"
