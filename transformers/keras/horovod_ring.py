"""Horovod's synchronous ring all-reduce of the gradients, every update (the default).

Keras 3 models cannot use ``hvd.DistributedGradientTape`` (horovod#4290), so the gradients
are taken with a plain tape and averaged with one grouped all-reduce (Gloo on CPU, NCCL on
GPU), optionally as float16 on the wire (``compression='fp16'``).
"""
from __future__ import annotations

from .strategies import RankStrategy, dense_gradients, payload_bytes


class HorovodRing(RankStrategy):
    name = "horovod"
    reduces_in_graph = True

    def start(self) -> tuple[int, int]:
        import horovod.tensorflow as hvd
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
        grads = dense_gradients(grads)
        self.update_bytes = payload_bytes(grads) // (2 if self.spec.compression == "fp16" else 1)
        return self.hvd.grouped_allreduce(grads, op=self.hvd.Average, compression=self._compression)

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

        from sparkdeep.distributed import FAST_EXIT_ENV
        self.hvd.shutdown()
        os.environ[FAST_EXIT_ENV] = "1"
