"""Asynchronous training through a parameter server: TensorFlow's ``ParameterServerStrategy``.

The roles, as the barrier tasks the launcher started (its ``tensorflow_ps`` backend: a
``TF_CONFIG`` naming one worker server per rank and one parameter server on rank 0's host):

- **every rank** turns its spilled rows into fixed-length float32 records
  (``train.rec``/``validation.rec``: features, label, weight), moves into its data folder and
  starts a TensorFlow **worker** server. The per-worker dataset function is traced once, on
  the coordinator, and runs on every worker; it names its file by a *relative* path, so
  each worker reads its own shard from its own folder, on its own host;
- **rank 0** also runs the **parameter server** (every variable: the model's, the
  optimizer's, the metrics' and the counters') and the **coordinator**, which schedules
  one closure per update (``ClusterCoordinator.schedule``); a free worker takes the next
  one, reads the weights, computes one batch's gradients and applies them on the parameter
  server, **without waiting for any other worker**. An epoch is as many updates as the
  ranks' rows make whole batches; a faster worker takes more of them.

**Staleness**: a counter on the parameter server counts the updates; a closure reads it
before it reads the weights and increments it after applying its own update, so
``new - 1 - read`` is the number of other workers' updates applied in between. Each epoch
records its mean and maximum (``staleness_mean``, ``staleness_max``).

The learning rate of update ``u`` is the same schedule as the other strategies'
(:func:`~.rank_loop.learning_rate_at`), as a table in the step's graph indexed by the
counter, not scaled by the number of ranks: each update is one worker's batch.

Validation runs each worker's own ``validation.rec`` on that worker (a function called on
its device), into metrics and sums on the parameter server. The coordinator tells the
workers' processes how far it got by writing a small file into each worker's folder
(``ps-control.json``, written by that worker's own server): the epoch finished, and at the
end that it may exit and the final weights' digest. A worker whose process fails or
freezes is found as every rank is: its error or its missing heartbeat.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time

import numpy as np

from .contract import RankResult, RankSpec, RankTimings
from .optimizers import make_optimizer
from .strategies import RankStrategy, merged

log = logging.getLogger(__name__)

RECORDS = {"train": "train.rec", "validation": "validation.rec"}
CONTROL = "ps-control.json"
POLL_S = 0.2
STALENESS_BINS = 256  # staleness counted per value 0..254, and 255 for "255 or more"


def write_records(folder: str, part: str, weight: bool) -> int:
    """``part``'s spilled rows as float32 records (features, label, weight) in
    ``folder/<part>.rec``, streamed a chunk at a time; the rows written (the file exists,
    maybe empty, for every part)."""
    from .feed import ShardFeed
    feed = ShardFeed(folder, part, batch_size=1, buffer_rows=1, seed=0, weight=weight)
    rows = 0
    with open(os.path.join(folder, RECORDS[part]), "wb") as fh:
        for x, y, w in feed.sequential():
            fh.write(np.concatenate([x, y[:, None], w[:, None]], axis=1).astype("<f4", copy=False).tobytes())
            rows += len(y)
    feed.close()
    return rows


def add_to_metrics(metrics, y_true, y_pred, weight) -> None:
    """Add one batch to Keras ``metrics`` that several workers update at once. A Keras
    variable's ``assign_add`` reads, then writes (a race loses updates: a training accuracy
    above 1 was seen), so the batch's own contribution (the metric's update from a zero
    state: Keras's metrics keep sums) goes in with TensorFlow's atomic ``assign_add``."""
    import tensorflow as tf
    for m in metrics:
        zeros = [tf.zeros(v.shape, v.dtype) for v in m.variables]
        delta = m.stateless_update_state(zeros, y_true, y_pred, sample_weight=weight)
        for var, d in zip(m.variables, delta):
            var.value.assign_add(d)


def learning_rates(spec: RankSpec, updates: int) -> list[float]:
    """The rate of every update of the schedule, 1 to ``schedule_epochs x updates`` (a fit
    stopping at ``epochs`` uses the first ``epochs x updates``): the synchronous strategies'
    schedule (:func:`~.rank_loop.learning_rate_at`), not scaled by the ranks."""
    from .rank_loop import learning_rate_at
    base, total = float(spec.learning_rate), int(spec.schedule_epochs) * updates
    warmup = int(round(float(spec.warmup_epochs) * updates))
    return [learning_rate_at(u, base, base, warmup, total, spec.lr_schedule) for u in range(1, total + 1)]


def _wait_for(address: str, deadline: float) -> None:
    host, port = address.rsplit(":", 1)
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the TensorFlow server at {address} did not start in time") from None
            time.sleep(0.2)


def _read_control() -> dict:
    try:
        with open(CONTROL) as fh:
            return json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        return {}  # not written yet, or being written: read again at the next poll


class ParameterServer(RankStrategy):
    """Strategy ``parameter_server``: asynchronous updates through TensorFlow's
    ``ParameterServerStrategy`` (the roles and the staleness count: this module's docstring).

    It ``trains_itself``: rank 0's coordinator drives every worker, instead of a step loop
    per rank.
    """
    name = "parameter_server"
    trains_itself = True  # the coordinator drives every worker: no per-rank step loop
    inter_op_threads = 4  # servers and the coordinator in one process need more than one

    def start(self) -> tuple[int, int]:
        from sparkdeep.backends import TIMEOUT_ENV
        config = json.loads(os.environ["TF_CONFIG"])
        self.cluster = config["cluster"]
        self.rank, self.size = int(config["task"]["index"]), len(self.cluster["worker"])
        self.timeout = float(os.environ.get(TIMEOUT_ENV) or 1800.0)
        return self.rank, self.size

    def _server(self, job: str, index: int):
        import tensorflow as tf
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=self.inter_op_threads,
                                          intra_op_parallelism_threads=int(self.spec.threads))
        return tf.distribute.Server(tf.train.ClusterSpec(self.cluster), job_name=job, task_index=index,
                                    protocol="grpc", config=config, start=True)

    def train(self, t_enter: float, devices: str | None) -> RankResult:
        from sparkdeep.distributed import RANK_DATA_ENV, read_shard_counts

        from .feed import TRAIN, VALIDATION
        spec = self.spec
        folder = os.environ[RANK_DATA_ENV]
        counts = read_shard_counts(folder)
        for part in (TRAIN, VALIDATION):
            write_records(folder, part, spec.has_weight)
        os.chdir(folder)  # the workers' dataset names its file relative to here
        self._servers = [self._server("worker", self.rank)]
        rows = [c.get(TRAIN, 0) for c in counts]
        # A batch never repeats a row: at most the smallest shard (as the synchronous
        # strategies' plan makes a partial batch of a shard smaller than one batch).
        batch = min(int(spec.batch_size), min(rows))
        updates = max(1, sum(rows) // batch)
        if self.rank == 0:
            self._servers.append(self._server("ps", 0))
            return Coordinator(self, counts, updates, batch).run(t_enter, devices)
        return self._serve(t_enter, devices, counts, updates)

    def _serve(self, t_enter, devices, counts, updates) -> RankResult:
        """A worker rank: its server does the work the coordinator sends; this process only
        waits for the coordinator's word (the epochs it finished, then the end)."""
        from sparkdeep.transformers._faults import after_epoch_hook

        from .feed import TRAIN, VALIDATION
        after_epoch = after_epoch_hook()
        resumed = int(self.spec.resume["completed_epochs"]) if self.spec.resume else 0
        t_start, seen, message = time.time(), resumed, {}
        while not message.get("done"):
            time.sleep(POLL_S)
            message = _read_control()
            while seen < int(message.get("epoch", 0)):
                seen += 1
                if after_epoch:
                    after_epoch(self.rank, seen)
        t_end = time.time()
        return _result(self, counts, updates, devices, digest=message.get("digest", ""),
                       stopped=bool(message.get("stopped")),
                       timings=RankTimings(enter=t_enter, train_start=t_start, first_step=t_start, end=t_end,
                                           checkpoints=0.0),
                       rows=(counts[self.rank].get(TRAIN, 0), counts[self.rank].get(VALIDATION, 0)))


def _result(strategy: ParameterServer, counts, updates, devices, *, digest, stopped, timings, rows,
            history=None, model_bytes=None, staleness=None) -> RankResult:
    from .rank_loop import _code_root, _os_threads
    return RankResult(
        rank=strategy.rank, size=strategy.size, strategy=strategy.name, rows=rows[0], validation_rows=rows[1],
        # Asynchronous: whichever worker is free takes the next update, so no rank has a
        # fixed share of an epoch and none is trimmed.
        rows_per_epoch=0, trimmed_per_epoch=0, rows_seen=[], max_window_rows=0,
        steps_per_epoch=updates, updates_per_epoch=updates, stopped_early=stopped,
        allreduce_calls=strategy.calls, allreduce_bytes=strategy.bytes, devices=devices,
        horovod_imported="horovod" in sys.modules, weights_digest=digest, code_path=_code_root(),
        os_threads=_os_threads(), timings=timings, history=history, model_bytes=model_bytes, staleness=staleness)


class Coordinator:
    """Rank 0's side: the variables on the parameter server, the scheduled updates, the
    epochs' records, validation, checkpoints and early stopping."""

    def __init__(self, strategy: ParameterServer, counts: list, updates: int, batch: int):
        self.ps, self.counts, self.updates, self.batch = strategy, counts, updates, batch

    def _connect(self):
        import tensorflow as tf
        deadline = time.monotonic() + self.ps.timeout
        for address in self.ps.cluster["worker"] + self.ps.cluster["ps"]:
            _wait_for(address, deadline)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(self.ps.cluster),
                                                                        rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)

    def run(self, t_enter: float, devices: str | None) -> RankResult:
        import keras
        import tensorflow as tf

        from .checkpoints import load_optimizer_state
        from .feed import TRAIN, VALIDATION
        from .network import keras_from_bytes, keras_to_bytes, make_metric, weights_digest
        from .rank_loop import EpochLoop, class_target, column_target, objective

        spec: RankSpec = self.ps.spec
        ps, updates, batch = self.ps, self.updates, self.batch
        if batch < int(spec.batch_size):
            log.info("[train] batchSize %s is more than the smallest shard's %s training rows: each update takes %s "
                     "rows", spec.batch_size, batch, batch)
        keras.utils.set_random_seed(int(spec.seed))
        strategy, coordinator = self._connect()
        resume = spec.resume
        start_epoch = int(resume["completed_epochs"]) if resume else 0
        with strategy.scope():
            model = keras_from_bytes(resume["model_bytes"] if resume else spec.model_bytes)
            optimizer = make_optimizer(spec.optimizer, float(spec.learning_rate))
            optimizer.build(model.trainable_variables)
            train_metrics = [make_metric(m, spec.task) for m in spec.metrics]
            val_metrics = [make_metric(m, spec.task) for m in spec.metrics]
            version = tf.Variable(start_epoch * updates, dtype=tf.int64)  # updates applied, over the run
            # Counted by atomic adds only (a read-then-write maximum would lose updates to a race).
            stale_hist = tf.Variable(tf.zeros([STALENESS_BINS], tf.int64))
            sums = [tf.Variable(0.0, dtype=tf.float64) for _ in range(4)]  # loss, rows, val loss, val rows
        if resume:
            load_optimizer_state(optimizer, resume["optimizer_bytes"])
        loss_fn = keras.losses.get(spec.loss)
        target = class_target if spec.task == "multiclass" else column_target
        step_loss = objective(model, loss_fn, target)
        width = int(model.inputs[0].shape[-1])
        record_bytes = 4 * (width + 2)
        lr_table = tf.constant(learning_rates(spec, updates), dtype=tf.float32)

        def decode(raw):
            v = tf.reshape(tf.io.decode_raw(raw, tf.float32), [-1, width + 2])
            return v[:, :width], v[:, width], v[:, width + 1]

        def train_data():
            rows = tf.data.FixedLengthRecordDataset(RECORDS[TRAIN], record_bytes)
            return (rows.shuffle(int(spec.shuffle_buffer_rows), seed=int(spec.seed), reshuffle_each_iteration=True)
                    .repeat().batch(batch, drop_remainder=True).map(decode).prefetch(2))

        batches = iter(coordinator.create_per_worker_dataset(train_data))

        @tf.function
        def step(iterator):
            def replica(data):
                x, y, w = data
                read = version.read_value()
                with tf.control_dependencies([read]):  # the weights are read after the counter
                    with tf.GradientTape() as tape:
                        loss, pred = step_loss(x, y, w)
                grads = merged(tape.gradient(loss, model.trainable_variables))  # one slice per embedding row
                optimizer.learning_rate.assign(lr_table[tf.minimum(read, len(lr_table) - 1)])
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                with tf.control_dependencies([optimizer.iterations.value.read_value()]):  # after the apply
                    stale = version.assign_add(1, read_value=True) - 1 - read
                stale_hist.assign_add(tf.one_hot(tf.minimum(stale, STALENESS_BINS - 1), STALENESS_BINS,
                                                 dtype=tf.int64))
                sums[0].assign_add(tf.cast(loss, tf.float64) * tf.cast(tf.shape(y)[0], tf.float64))
                sums[1].assign_add(tf.cast(tf.shape(y)[0], tf.float64))
                update(train_metrics, y, pred, w)
            strategy.run(replica, args=(next(iterator),))

        def update(metrics, y, pred, w):  # apart: a Python loop inside a dataset loop would be loop state
            add_to_metrics(metrics, target(y), pred, w)

        @tf.function
        def evaluate():
            for x, y, w in tf.data.FixedLengthRecordDataset(RECORDS[VALIDATION], record_bytes).batch(4096).map(decode):
                pred = model(x, training=False)
                sums[2].assign_add(tf.cast(tf.reduce_sum(loss_fn(target(y), pred) * w), tf.float64))
                sums[3].assign_add(tf.cast(tf.shape(y)[0], tf.float64))
                update(val_metrics, y, pred, w)

        @tf.function
        def tell(text):
            tf.io.write_file(CONTROL, text)

        def on_workers(fn, *args):
            for i in range(ps.size):
                with tf.device(f"/job:worker/replica:0/task:{i}"):
                    fn(*args)

        # Per update a worker reads every weight and sends a gradient of the same size.
        exchange = 2 * sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
        loop = EpochLoop(spec, model, optimizer, rank=0, has_validation=spec.has_validation)
        t_first, t_train0 = None, time.time()

        def one_epoch(epoch: int) -> dict:
            nonlocal t_first
            t0 = time.time()
            for v in (stale_hist, *sums):
                v.assign(tf.zeros_like(v))
            for m in train_metrics + val_metrics:
                m.reset_state()
            for _ in range(updates):
                coordinator.schedule(step, args=(batches,))
                t_first = t_first or time.time()
            coordinator.join()
            seconds = time.time() - t0
            ps.calls += updates
            ps.bytes += updates * exchange
            done = int(version.numpy())
            rows = float(sums[1].numpy())
            hist = stale_hist.numpy()
            record = {"epoch": epoch + 1, "loss": float(sums[0].numpy()) / max(rows, 1.0),
                      "learning_rate": float(lr_table[min(done, len(lr_table)) - 1]), "seconds": round(seconds, 3),
                      "samples_per_s": round(rows / seconds, 1), "input_s": 0.0, "compute_s": round(seconds, 3),
                      "allreduce_s": 0.0, "wait_s": 0.0, "comm_bytes": updates * exchange,
                      "staleness_mean": round(float(np.dot(np.arange(STALENESS_BINS), hist)) / max(hist.sum(), 1), 3),
                      "staleness_max": int(np.flatnonzero(hist).max(initial=0))}
            for m in train_metrics:
                record[m.name] = float(m.result())
            if spec.has_validation:
                on_workers(evaluate)
                record["val_loss"] = float(sums[2].numpy()) / max(float(sums[3].numpy()), 1.0)
                for m in val_metrics:
                    record[f"val_{m.name}"] = float(m.result())
            return record

        def describe(record: dict, left: float) -> None:
            extra = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k.startswith("val_") or
                             k in (m.name for m in train_metrics))
            log.info("[train] epoch %s/%s loss=%.4f %s samples/s=%.0f staleness mean=%.2f max=%s (%.1fs, ~%.0fs "
                     "left)", record["epoch"], loop.epochs, record["loss"], extra, record["samples_per_s"],
                     record["staleness_mean"], record["staleness_max"], record["seconds"], left)

        # The workers wait on this file after each epoch: go on, or stop (the last tell says done).
        loop.run(one_epoch, describe, notify=lambda epochs: on_workers(tell, tf.constant(json.dumps({"epoch": epochs}))))
        history, stopping, checkpoint_s = loop.history, loop.stopping, loop.checkpoint_s
        t_end = time.time()
        # The trained network as a plain model (no parameter-server variables in the file).
        plain = keras_from_bytes(spec.model_bytes)
        plain.set_weights(model.get_weights())
        digest = weights_digest(plain)
        on_workers(tell, tf.constant(json.dumps({"epoch": len(history), "done": True, "digest": digest,
                                                 "stopped": stopping.stopped})))
        staleness = {"mean": round(float(np.mean([h["staleness_mean"] for h in history[start_epoch:]] or [0])), 3),
                     "max": max([h["staleness_max"] for h in history[start_epoch:]] or [0])}
        return _result(ps, self.counts, updates, devices, digest=digest, stopped=stopping.stopped,
                       timings=RankTimings(enter=t_enter, train_start=t_train0, first_step=t_first or t_end,
                                           end=t_end, checkpoints=round(checkpoint_s, 3)),
                       rows=(self.counts[0].get(TRAIN, 0), self.counts[0].get(VALIDATION, 0)),
                       history=history, model_bytes=keras_to_bytes(plain), staleness=staleness)
