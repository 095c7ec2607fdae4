"""Local SGD: each rank takes K optimizer steps on its own shard, then the ranks average
their weights (one collective per K updates instead of one per update).

The hybrid between synchronous and asynchronous training: between averages the replicas
drift apart (each follows its own data), which is what saves the messages; at the end of
every epoch they are averaged once more, so validation, checkpoints and the returned
model see one set of weights, identical on every rank. The optimizer's own state (Adam's
moments) stays local. The averages go through TensorFlow's collectives
(:mod:`.tf_collective`): no Horovod import.
"""
from __future__ import annotations

from .strategies import payload_bytes
from .tf_collective import TensorFlowCollective


class LocalSGD(TensorFlowCollective):
    """Strategy ``local_sgd``: ``localSteps`` updates alone on each rank, then the weights
    averaged over TensorFlow's collectives, and once more at the end of every epoch."""
    name = "local_sgd"
    reduces_in_graph = True  # nothing to reduce: the step is one graph call

    def graph_gradients(self, grads: list) -> list:
        return grads

    def count(self, updates: int) -> None:
        """Nothing sent per update (the weight averages count themselves)."""

    def start(self) -> tuple[int, int]:
        self.every = int(self.spec.local_steps)
        self._since = 0
        return super().start()

    def gradients(self, grads: list) -> list:
        return grads  # this rank's own gradients: nothing sent

    def wait(self) -> None:
        """The barrier of ``measureWait`` only before an update that ends in an average: a
        barrier every update would synchronise the ranks K times as often as local SGD does."""
        if self._since + 1 >= self.every:
            super().wait()

    def _average_weights(self, model) -> None:
        import tensorflow as tf
        variables = [v for v in model.variables if "float" in str(v.dtype)]  # not seed counters
        values = [tf.convert_to_tensor(v) for v in variables]
        self.calls += 1
        self.bytes += payload_bytes(values)
        for var, value in zip(variables, self._all_reduce("mean", values)):
            var.assign(value)
        self._since = 0

    def after_update(self, model, update_no: int) -> bool:
        self._since += 1
        if self._since >= self.every:
            self._average_weights(model)
            return True
        return False

    def end_epoch(self, model) -> bool:
        if self._since:
            self._average_weights(model)
            return True
        return False
