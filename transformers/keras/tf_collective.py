"""TensorFlow's own synchronous collective all-reduce, with no Horovod anywhere.

The ranks form a ``MultiWorkerMirroredStrategy`` worker cluster from ``TF_CONFIG`` (set by
the launcher from the barrier tasks' hosts and free ports). Keras 3's ``fit`` does not
work under that strategy (keras-team/keras#20585), and does not need to: the rank keeps
its own loop and model, and the strategy only reduces tensors, inside one ``tf.function``
per shape (``strategy.run`` with the replica context's ``all_reduce``: ring collectives
over gRPC on CPU, NCCL on GPU when TensorFlow picks it).

The coordination service's heartbeat timeout follows the launcher's
``SPARKDEEP_COLLECTIVE_TIMEOUT`` (twice the stall timeout), so the driver's heartbeat
watchdog finds a frozen rank first and names it. Collectives get no timeout of their own
(see :meth:`TensorFlowCollective.start`).
"""
from __future__ import annotations

import json
import os

from .strategies import RankStrategy, payload_bytes


def _timeout_s() -> float:
    from sparkdeep.backends import TIMEOUT_ENV
    return float(os.environ.get(TIMEOUT_ENV) or 1800.0)


def _configure_coordination(workers: int, timeout_s: float) -> None:
    """The coordination service MultiWorkerMirroredStrategy would start, but with our
    timeouts instead of its 10 s heartbeat (a rank busy in a long step is not dead).
    TensorFlow's internal API: without it (another TensorFlow) the strategy's defaults hold."""
    try:
        from tensorflow.core.protobuf import coordination_config_pb2
        from tensorflow.python.eager import context
        context.context().configure_coordination_service(
            service_type="standalone", service_leader="/job:worker/replica:0/task:0",
            heartbeat_timeout_in_ms=int(timeout_s * 1000), shutdown_barrier_timeout_in_ms=int(timeout_s * 1000),
            coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=workers)])
    except (ImportError, AttributeError, TypeError):
        pass


class TensorFlowCollective(RankStrategy):
    """Strategy ``collective``: every update's gradients averaged by
    ``MultiWorkerMirroredStrategy``'s all-reduce, from a ``TF_CONFIG``; no Horovod import."""
    name = "collective"

    def start(self) -> tuple[int, int]:
        import tensorflow as tf
        config = json.loads(os.environ["TF_CONFIG"])
        workers = len(config["cluster"]["worker"])
        timeout = _timeout_s()
        _configure_coordination(workers, timeout)
        # No per-collective timeout: TensorFlow 2.18 runs each timed collective's timer on a
        # thread of its own that sleeps out the whole timeout, so a fast loop piles up
        # thousands of threads until one cannot start (EAGAIN, the process aborts; measured).
        # A silent peer is caught by the coordination service's heartbeat (set above) and,
        # first, by the driver's heartbeat watchdog.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        self.size = workers
        self.rank = int(config["task"]["index"])
        self._reduce = {}
        return self.rank, self.size

    def _all_reduce(self, op: str, tensors: list) -> list:
        """Every rank's ``tensors`` reduced (``'sum'`` or ``'mean'``); one traced function
        per op, so the collectives' keys match on every rank."""
        import tensorflow as tf
        fn = self._reduce.get(op)
        if fn is None:
            reduce_op = tf.distribute.ReduceOp.SUM if op == "sum" else tf.distribute.ReduceOp.MEAN
            strategy = self.strategy

            # reduce_retracing: one trace for a list of tensors of any shape of the same kind.
            @tf.function(reduce_retracing=True)
            def fn(values):
                def replica(vs):
                    # identity: a captured argument is no per-replica value to all-reduce
                    return tf.distribute.get_replica_context().all_reduce(reduce_op, [tf.identity(v) for v in vs])
                return strategy.run(replica, args=(values,))
            self._reduce[op] = fn
        out = fn(list(tensors))
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def broadcast(self, variables) -> None:
        import tensorflow as tf
        variables = list(variables)
        # One dtype per collective (it packs its tensors): all as float64, exact for float32
        # weights and for counters (the optimizer's iterations, seed states) below 2**53.
        mine = [tf.cast(tf.convert_to_tensor(v), tf.float64) for v in variables]
        masked = [t if self.rank == 0 else tf.zeros_like(t) for t in mine]
        for var, value in zip(variables, self._all_reduce("sum", masked)):
            var.assign(tf.cast(value, var.dtype))

    def gradients(self, grads: list) -> list:
        import tensorflow as tf
        # An embedding's gradient arrives as IndexedSlices, which TensorFlow would all-gather
        # (a size that changes every step): reduce it dense, as its variable is, so every
        # update sends the same bytes and the replicas apply the same tensor.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        self.calls += 1
        self.bytes += payload_bytes(grads)
        return self._all_reduce("mean", grads)

    def sum(self, values: list[float]) -> list[float]:
        import tensorflow as tf
        return [float(v) for v in self._all_reduce("sum", [tf.constant(values, tf.float64)])[0].numpy()]
