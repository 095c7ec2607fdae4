"""What each rank runs: stream its own shard, train under its strategy, report.

Kept in an importable module (not a closure) so ranks unpickle it by reference and
autograph finds its source. Everything a rank needs arrives in one typed
:class:`~.contract.RankSpec` (plain values plus the model as ``.keras`` bytes: no pickled Keras
objects), built by the estimator from its params: the params hold the defaults, the spec
has none, so the two cannot disagree. The rank's rows are the files the launcher spilled
to the task's local disk (``SPARKDEEP_RANK_DATA``), streamed by :mod:`.feed`.

The pieces are small and testable alone: the feed (:mod:`.feed`), the learning-rate
schedule (:func:`learning_rate_at`), early stopping (:class:`EarlyStopping`), the step
(:class:`Steps`) and one epoch's updates (:func:`run_epoch`), which takes the all-reduce as
a function, so a test can run it in one process with an identity all-reduce. The epochs
themselves (history, early stopping, rank 0's line and checkpoint, the failure hook) are
:class:`EpochLoop`, which every strategy runs, the parameter server's coordinator too.

How the ranks agree is the spec's ``strategy`` (:mod:`.strategies`: Horovod's ring
all-reduce, TensorFlow's collective all-reduce, or local SGD); this module imports neither
Horovod nor TensorFlow's distribution code itself.

The training step is split in three so each part can be timed: local gradients
(``tf.function``), the strategy's reduction (eager) and the optimizer update
(``tf.function``). Per epoch rank 0 prints loss, metrics, samples/s and how the time
went: waiting for input, computing, communicating (and, with ``measure_wait``, waiting
for the other ranks before communicating).
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from typing import Callable, Iterator

import numpy as np

from sparkdeep.transformers._faults import after_epoch_hook

from .checkpoints import best_weights_from, load_optimizer_state, send_checkpoint, send_part, send_state
from .contract import RankResult, RankSpec, RankTimings
from .network import keras_from_bytes, keras_to_bytes, make_metric, weights_digest
from .optimizers import make_optimizer
from .profile import EpochClock, EpochTrace, MemoryMarks, peak_rss_mb, training_flops_per_sample
from .strategies import add_gradients, merged, scale_gradients

log = logging.getLogger(__name__)


def _pin_devices() -> str | None:
    """The GPU(s) Spark gave this rank's task: the launcher has already set
    ``CUDA_VISIBLE_DEVICES`` to them (None on CPU executors)."""
    from sparkdeep.channel import DEVICES_ENV
    return os.environ.get(DEVICES_ENV) or None


#: How a rank's error for a non-finite loss begins (a search prunes such a trial: pipelines/tune).
DIVERGED = "training diverged"


def require_finite(record: dict, epoch: int) -> None:
    """Stop training on a non-finite loss, naming the epoch. The epoch's loss is all-reduced,
    so every rank sees the same value and stops at the same point: no rank waits alone."""
    bad = {k: v for k, v in record.items() if k in ("loss", "val_loss") and not math.isfinite(v)}
    if bad:
        raise FloatingPointError(
            f"{DIVERGED}: {', '.join(f'{k}={v}' for k, v in bad.items())} at epoch {epoch} (learning rate "
            f"{record.get('learning_rate')}); lower learningRate, check the features' scale, or clip gradients")


def _os_threads() -> int:
    """This process's threads now (Linux ``/proc``; -1 elsewhere): a strategy that leaks
    threads per step shows here (TensorFlow's timed collectives did)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        return -1


def launch_instants(**now: float) -> dict:
    """The instants of this rank's launch (``time.time()``): those its task passed on (task
    start, shard spilled, process spawned), the process's own start, and ``now``'s."""
    from sparkdeep.channel import LAUNCH_TIMES_ENV, PROCESS_START_ENV
    out = dict(json.loads(os.environ.get(LAUNCH_TIMES_ENV) or "{}"))
    if os.environ.get(PROCESS_START_ENV):
        out["process_start"] = float(os.environ[PROCESS_START_ENV])
    out.update(now)
    return out


def _code_root() -> str:
    """The sys.path entry this package was imported from (a shipped .zip on a cluster)."""
    import sparkdeep
    return os.path.dirname(os.path.dirname(os.path.abspath(sparkdeep.__file__)))


def learning_rate_at(update_no: int, base_lr: float, target_lr: float, warmup: int, total: int,
                     schedule: str = "constant") -> float:
    """The learning rate for update ``update_no`` (1-based) of ``total``: a linear ramp from
    ``base_lr`` to ``target_lr`` over ``warmup`` updates, then constant, or (``'cosine'``)
    a half cosine from ``target_lr`` down to 5% of it at update ``total``."""
    if update_no <= warmup:
        return base_lr + (target_lr - base_lr) * update_no / max(warmup, 1)
    if schedule == "cosine":
        progress = min(1.0, (update_no - warmup) / max(total - warmup, 1))
        return target_lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * progress)))
    return target_lr


class EarlyStopping:
    """Early stopping on one metric of each epoch's record (lower is better), kept apart from
    Horovod so it is tested alone. ``history`` (a resumed run's earlier epochs) sets the
    best value so far; ``update`` takes one epoch and says whether training should stop
    (``patience`` epochs without an improvement of more than 1e-7; 0 = never); the best
    epoch's weights are kept (``weights`` is called on each improvement) and :meth:`restore`
    puts them back only when training stopped early."""

    def __init__(self, monitor: str, patience: int, history=(), saved: dict | None = None, best_weights=None):
        self.monitor, self.patience = monitor, int(patience)
        self.best = min((r[monitor] for r in history if monitor in r), default=math.inf)
        self.best_weights, self.waited, self.stopped = None, 0, False
        if saved:  # a resumed run: where the count stood, and the best epoch's weights
            self.waited, self.stopped = int(saved.get("waited", 0)), bool(saved.get("stopped", False))
            self.best_weights = best_weights

    def state(self) -> dict:
        """What a checkpoint keeps to resume the count (the best value follows from the history)."""
        return {"monitor": self.monitor, "best": self.best, "waited": self.waited, "stopped": self.stopped}

    def update(self, record: dict, weights=None) -> bool:
        if record[self.monitor] < self.best - 1e-7:
            self.best, self.waited = record[self.monitor], 0
            if self.patience and weights is not None:
                self.best_weights = weights()
        else:
            self.waited += 1
        self.stopped = bool(self.patience) and self.waited >= self.patience
        return self.stopped

    def restore(self, model) -> None:
        if self.stopped and self.best_weights is not None:
            model.set_weights(self.best_weights)


class EpochLoop:
    """The epochs, as every strategy runs them: the history (a resumed run's first), early
    stopping with the best epoch's weights, rank 0's line and checkpoint after each epoch,
    the injected-failure hook of the tests, and the early-stop line. How an epoch trains
    and validates is the strategy's: :meth:`run` takes it as a function.

    Parameters
    ----------
    spec : RankSpec
        The epochs, patience, checkpoint folder and resumed state.
    model, optimizer
        What a checkpoint saves; the model also gets the best weights back.
    rank : int
        This rank; rank 0 logs and checkpoints.
    has_validation : bool
        Early stopping watches ``val_loss`` when there are validation rows, else ``loss``.
    """

    def __init__(self, spec: RankSpec, model, optimizer, *, rank: int, has_validation: bool, shards=None):
        resume = spec.resume
        self.spec, self.model, self.optimizer, self.rank = spec, model, optimizer, rank
        # Split embedding tables (:class:`.sharding.RankShards`): every rank hands its share
        # of a checkpoint to the driver, rank 0 then names the epoch complete.
        self.shards = shards
        self.history: list[dict] = list(resume["history"]) if resume else []
        self.start_epoch = int(resume["completed_epochs"]) if resume else 0
        self.epochs = int(spec.epochs)
        self.monitor = "val_loss" if has_validation else "loss"
        self.stopping = EarlyStopping(self.monitor, int(spec.early_stopping_patience), self.history,
                                      saved=resume.get("stopping") if resume else None,
                                      best_weights=self._resumed_best(resume) if resume else None)
        self.checkpoint_s = 0.0  # rank 0: time spent handing checkpoints to the driver
        self._after_epoch = after_epoch_hook()  # None unless a test injects a failure

    def _resumed_best(self, resume: dict):
        if self.shards:
            return self.shards.resumed_best(self.model, resume)
        return best_weights_from(resume.get("best_bytes"))

    def run(self, one_epoch: Callable[[int], dict], describe: Callable[[dict, float], None],
            notify: Callable[[int], None] | None = None) -> None:
        """Train the epochs left: ``one_epoch(epoch)`` (0-based) trains and validates one and
        returns its record (``seconds`` among its keys); rank 0 then calls
        ``describe(record, seconds_left)`` and checkpoints; ``notify(epochs_done)``, when
        given, runs after the checkpoint on rank 0. The best weights are back in the model
        at the end when training stopped early."""
        for epoch in range(self.start_epoch, self.epochs):
            record = one_epoch(epoch)
            require_finite(record, epoch + 1)
            self.history.append(record)
            stop = self.stopping.update(record, self.model.get_weights)
            if stop:
                self.stopping.restore(self.model)  # before the last checkpoint: a reload gets the best epoch's weights
            if self.rank == 0:
                describe(record, (self.epochs - epoch - 1) * record["seconds"])
            if self.rank == 0 or self.shards:
                self._checkpoint(epoch + 1, finished=stop or epoch + 1 == self.epochs, stopped=stop)
            if self.rank == 0:
                if notify is not None:
                    notify(epoch + 1)
            if self._after_epoch:
                self._after_epoch(self.rank, epoch + 1)
            if stop:
                if self.rank == 0:
                    log.info("[train] early stop: %s has not improved for %s epochs", self.monitor,
                             self.stopping.patience)
                break
        self.stopping.restore(self.model)

    def _checkpoint(self, completed: int, *, finished: bool, stopped: bool) -> None:
        if not self.spec.checkpoint_dir:
            return
        t0 = time.time()
        best = None if stopped else self.stopping.best_weights
        state = {"completed_epochs": completed, "history": self.history, "finished": finished,
                 "stopping": self.stopping.state()}
        if self.shards:  # every rank its share; the driver puts the whole files together
            send_part(completed, self.rank, self.shards.checkpoint_part(self.model, self.optimizer, best))
            self.shards.most(0)  # every share is stored before rank 0 names the epoch complete
            if self.rank == 0:
                send_state(state)
        else:
            send_checkpoint(self.model, self.optimizer, state, best_weights=best)
        self.checkpoint_s += time.time() - t0



#: A record's keys the epoch line shows in its own words (the rest are metrics, printed as name=value).
_RECORD_TIMES = frozenset({"epoch", "loss", "seconds", "samples_per_s", "learning_rate", "input_s", "compute_s",
                           "allreduce_s", "wait_s", "comm_bytes", "idle_s", "cpu_percent", "gflop_s"})


def _identity(grads: list) -> list:
    return grads


def class_target(yb):
    """A multiclass label batch as the loss takes it (class indices)."""
    return yb


def column_target(yb):
    """A binary or regression label batch as the loss takes it (one column)."""
    return yb[:, None]


def objective(model, loss_fn, target) -> Callable:
    """``(x, y, w) -> (loss, prediction)`` of a training step (call it under a gradient tape).

    For an ensemble (a network ending in the layer
    :data:`~sparkdeep.transformers.keras_models.ENSEMBLE_MEAN`) each member is trained on its
    own loss, averaged over the members (TabM), not on the loss of the members' mean, which
    would train them as one network; the prediction the metrics see is the mean."""
    import keras
    import tensorflow as tf

    from sparkdeep.transformers.keras_models import ENSEMBLE_MEAN
    mean = next((layer for layer in model.layers if layer.name == ENSEMBLE_MEAN), None)
    if mean is None:
        def single(xb, yb, wb):
            pred = model(xb, training=True)
            return tf.reduce_mean(loss_fn(target(yb), pred) * wb), pred
        return single
    members_view = keras.Model(model.inputs, mean.input)  # the same layers and weights
    k = int(mean.input.shape[1])

    def members(xb, yb, wb):
        each = members_view(xb, training=True)  # (batch, members, outputs)
        flat = tf.reshape(each, [-1, each.shape[-1]])  # row b * k + j: member j of row b
        loss = tf.reduce_mean(loss_fn(tf.repeat(target(yb), k, axis=0), flat) * tf.repeat(wb, k, axis=0))
        return loss, tf.reduce_mean(each, axis=1)
    return members


class Steps:
    """The step. Split in three so each part is timed from Python: local gradients (which
    also update the training metrics; ``tf.function``), the reduction (given: the strategy's,
    identity in a test), the optimizer update (``tf.function``). With ``reduce`` (a
    strategy's in-graph reduction, :meth:`~.strategies.RankStrategy.graph_gradients`), also
    :attr:`fused`: the three in one ``tf.function``, no Python between them, which stamps
    the time (``tf.timestamp``) after the gradients, after the reduction and after the
    update, so the split survives the fusion."""

    def __init__(self, model, optimizer, loss_fn, task: str, metrics=(), reduce: Callable | None = None):
        import tensorflow as tf
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        # Integer class labels against k outputs; otherwise one column per row.
        self.target = target = class_target if task == "multiclass" else column_target
        self.metrics = metrics = list(metrics)
        step_loss = objective(model, loss_fn, target)

        def gradients(xb, yb, wb):
            with tf.GradientTape() as tape:
                loss, pred = step_loss(xb, yb, wb)
            # An embedding's slices merged (each looked-up row once): applied sparse, they update
            # as the dense gradient would (strategies.merge_slices).
            grads = merged(tape.gradient(loss, model.trainable_variables))
            # A Dense layer on (batch, members, d) inputs (an ensemble) returns its kernel's
            # gradient without a static shape; the strategies size their payload from it.
            grads = [g if g is None or isinstance(g, tf.IndexedSlices) else tf.ensure_shape(g, v.shape)
                     for g, v in zip(grads, model.trainable_variables)]
            for m in metrics:
                m.update_state(target(yb), pred, sample_weight=wb)
            return loss, grads

        # reduce_retracing: an epoch's last batch may be partial; one more trace, not one per size.
        local_gradients = tf.function(gradients, reduce_retracing=True)

        @tf.function
        def apply(grads):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        @tf.function(reduce_retracing=True)
        def predict(xb):
            return model(xb, training=False)

        self.local_gradients, self.apply, self.predict = local_gradients, apply, predict
        self.fused = None
        # One rank reduces with the identity: the time between its stamps is not communication.
        self.exchanges = reduce is not None and reduce is not _identity
        if reduce is not None:
            @tf.function(reduce_retracing=True)
            def fused(xb, yb, wb):
                t0 = tf.timestamp()
                with tf.control_dependencies([t0]):
                    loss, grads = gradients(xb, yb, wb)
                with tf.control_dependencies(tf.nest.flatten([loss, grads], expand_composites=True)):
                    t1 = tf.timestamp()
                with tf.control_dependencies([t1]):
                    reduced = reduce(grads)
                with tf.control_dependencies(tf.nest.flatten(reduced, expand_composites=True)):
                    t2 = tf.timestamp()
                with tf.control_dependencies([t2]):
                    optimizer.apply_gradients(zip(reduced, model.trainable_variables))
                with tf.control_dependencies([tf.convert_to_tensor(v) for v in model.trainable_variables]):
                    t3 = tf.timestamp()
                return loss, tf.stack([t0, t1, t2, t3])
            self.fused = fused


def run_epoch(steps: Steps, batches: Iterator[tuple], *, updates: int, accumulation: int,
              allreduce: Callable, set_lr: Callable[[], float],
              after_update: Callable[[], bool] | None = None, wait: Callable[[], None] | None = None) -> dict:
    """One epoch: ``updates`` optimizer updates of ``accumulation`` batches each, gradients
    reduced by ``allreduce`` once per update, then ``after_update()`` (a strategy's own
    exchange, e.g. local SGD's weight average; timed as communication). With ``wait``,
    a barrier before each reduction, timed apart: time spent waiting for the other ranks.
    One batch per update, no ``wait`` and a fused step (:attr:`Steps.fused`): the whole
    step is one graph call, its parts timed inside it.

    Returns the mean batch loss, the rows and batches seen, the last learning rate and how
    the time went: input, compute, communication, waiting, and ``idle_s``, the rest of the
    loop's wall time (Python between the parts, the learning-rate update, dispatch), so the
    five add up to ``loop_s``."""
    t_input = t_compute = t_comm = t_wait = 0.0
    total, rows, batches_seen, lr = 0.0, 0, 0, float("nan")
    first_step = None
    fused = steps.fused if accumulation == 1 and wait is None else None
    for m in steps.metrics:
        m.reset_state()
    t_loop = time.perf_counter()
    for _ in range(updates):
        if fused is not None:
            ta = time.perf_counter()
            xb, yb, wb = next(batches)
            t_input += time.perf_counter() - ta
            lr = set_lr()
            loss, stamps = fused(xb, yb, wb)
            t0, t1, t2, t3 = (float(t) for t in stamps.numpy())
            if steps.exchanges:
                t_compute += (t1 - t0) + (t3 - t2)
                t_comm += t2 - t1
            else:
                t_compute += t3 - t0
            total += float(loss)
            rows += len(yb)
            batches_seen += 1
            first_step = first_step or time.time()
            if after_update is not None:
                te = time.perf_counter()
                after_update()
                t_comm += time.perf_counter() - te
            continue
        acc = None
        for _ in range(accumulation):
            ta = time.perf_counter()
            xb, yb, wb = next(batches)
            tb = time.perf_counter()
            loss, grads = steps.local_gradients(xb, yb, wb)
            acc = grads if acc is None else add_gradients(acc, grads)
            total += float(loss)
            rows += len(yb)
            batches_seen += 1
            t_input += tb - ta
            t_compute += time.perf_counter() - tb
            first_step = first_step or time.time()
        if accumulation > 1:
            acc = scale_gradients(acc, 1.0 / accumulation)
        if wait is not None:
            tw = time.perf_counter()
            wait()
            t_wait += time.perf_counter() - tw
        tc = time.perf_counter()
        reduced = allreduce(acc)
        td = time.perf_counter()
        lr = set_lr()
        steps.apply(reduced)
        te = time.perf_counter()
        if allreduce is _identity:  # nothing exchanged (one rank, or a test)
            t_compute += te - tc
        else:
            t_comm += td - tc
            t_compute += te - td
        if after_update is not None:
            after_update()
            t_comm += time.perf_counter() - te
    loop_s = time.perf_counter() - t_loop
    return {"loss": total / max(batches_seen, 1), "rows": rows, "batches": batches_seen, "learning_rate": lr,
            "input_s": t_input, "compute_s": t_compute, "allreduce_s": t_comm, "wait_s": t_wait,
            "idle_s": max(0.0, loop_s - t_input - t_compute - t_comm - t_wait), "loop_s": loop_s,
            "fused": fused is not None, "first_step": first_step}


def evaluate_stream(steps: Steps, batches: Iterator[tuple], metrics=()) -> tuple[float, int]:
    """Weighted loss sum and row count over ``batches`` (this rank's validation rows)."""
    import tensorflow as tf
    for m in metrics:
        m.reset_state()
    total, n = 0.0, 0
    for xb, yb, wb in batches:
        pred = steps.predict(xb)
        total += float(tf.reduce_sum(steps.loss_fn(steps.target(yb), pred) * wb))
        n += len(yb)
        for m in metrics:
            m.update_state(steps.target(yb), pred, sample_weight=wb)
    return total, n


def _as_tensors(batch: tuple) -> tuple:
    import tensorflow as tf
    return tuple(tf.convert_to_tensor(a) for a in batch)


def _shard_counts(folder: str) -> list:
    """Every rank's training row count, as the launcher gathered them after spilling."""
    from sparkdeep.distributed import read_shard_counts
    return [c.get("train", 0) for c in read_shard_counts(folder)]


def train_rank(spec: RankSpec) -> RankResult:
    """Train on this rank's streamed shard; rank 0 also returns the trained model and history."""
    from sparkdeep.channel import RANK_DATA_ENV

    from .feed import TRAIN, VALIDATION, Prefetch, ShardFeed, plan_steps
    t_enter = time.time()
    pinned = _pin_devices()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from . import strategies
    strategy = strategies.make(spec.strategy, spec)
    tf.config.threading.set_intra_op_parallelism_threads(int(spec.threads))
    tf.config.threading.set_inter_op_parallelism_threads(strategy.inter_op_threads)
    import keras
    launch = launch_instants(enter=t_enter, imported=time.time())

    rank, size = strategy.start()
    launch["joined"] = time.time()
    if strategy.trains_itself:
        return strategy.train(t_enter, pinned)
    keras.utils.set_random_seed(int(spec.seed) + rank)

    resume = spec.resume
    memory = MemoryMarks()
    memory.mark("joined")
    model, shards = _load_network(resume["model_bytes"] if resume else spec.model_bytes, spec, strategy, rank, size)
    memory.mark("loaded")
    folder = os.environ[RANK_DATA_ENV]
    counts = _shard_counts(folder)
    batch, accum = int(spec.batch_size), int(spec.accumulation_steps)
    # Every rank runs the same number of steps (or an all-reduce would wait forever for a
    # rank that finished its epoch), planned from the counts every rank already knows.
    plan = plan_steps(counts, batch, accum)
    steps_n, updates = plan.steps, plan.updates
    feed = ShardFeed(folder, TRAIN, batch_size=batch, buffer_rows=spec.shuffle_buffer_rows,
                     seed=int(spec.seed) * 1000 + rank, weight=spec.has_weight)
    val_feed = ShardFeed(folder, VALIDATION, batch_size=batch, buffer_rows=spec.shuffle_buffer_rows,
                         seed=0, weight=spec.has_weight) if spec.has_validation else None

    base_lr = float(spec.learning_rate)
    target_lr = base_lr * (size if spec.scale_lr else 1)
    warmup = int(round(float(spec.warmup_epochs) * updates))
    optimizer = make_optimizer(spec.optimizer, base_lr)
    optimizer.build(model.trainable_variables)
    if resume and shards:  # every rank its own rows of the split tables' slots
        shards.load_optimizer(optimizer, resume.get("optimizer_bytes"))
    elif resume and rank == 0:
        load_optimizer_state(optimizer, resume["optimizer_bytes"])
    train_metrics = [make_metric(m, spec.task) for m in spec.metrics]
    val_metrics = [make_metric(m, spec.task) for m in spec.metrics]
    # One rank has nothing to exchange: no reduction at all. A strategy whose reduction is a
    # graph op has it inside the step's one tf.function.
    alone = size == 1
    reduce_in_graph = _identity if alone else strategy.graph_gradients if strategy.reduces_in_graph else None
    reduce_eager = _identity if alone else strategy.gradients
    if shards:  # a split table's gradient already holds every rank's: not all-reduced again
        where = shards.positions(model.trainable_variables)
        reduce_in_graph = reduce_in_graph and _around(where, reduce_in_graph, size)
        reduce_eager = _around(where, reduce_eager, size)
    steps = Steps(model, optimizer, keras.losses.get(spec.loss), spec.task, metrics=train_metrics,
                  reduce=reduce_in_graph)
    flops = training_flops_per_sample(model)
    trace = EpochTrace(spec.trace_dir, spec.trace_epoch, rank)

    # Rank 0's state wins: model weights and optimizer slots (fresh or resumed), so the
    # replicas start identical (and, synchronous, stay identical under averaged gradients).
    strategy.broadcast([v for v in list(model.variables) + list(optimizer.variables)
                        if not (shards and shards.is_local(v))])
    launch["model_ready"] = time.time()
    memory.mark("ready")

    def after_update() -> bool:
        return strategy.after_update(model, update_no)

    loop = EpochLoop(spec, model, optimizer, rank=rank, has_validation=val_feed is not None, shards=shards)
    t_first_step = None
    t_train0 = time.time()
    update_no = loop.start_epoch * updates
    seen_rows, profile = [], []

    def set_lr() -> float:
        nonlocal update_no
        update_no += 1
        lr = learning_rate_at(update_no, base_lr, target_lr, warmup, int(spec.schedule_epochs) * updates,
                              spec.lr_schedule)
        optimizer.learning_rate.assign(lr)
        return lr

    def one_epoch(epoch: int) -> dict:
        nonlocal t_first_step
        memory.mark(f"epoch {epoch + 1} start")
        t0 = time.time()
        bytes_before = strategy.bytes
        trace.begin(epoch + 1)
        clock = EpochClock()
        batches = Prefetch(feed.epoch(epoch, steps_n), depth=3, convert=_as_tensors)
        try:
            done = run_epoch(steps, batches, updates=updates, accumulation=accum,
                             allreduce=reduce_eager,
                             set_lr=set_lr, after_update=None if alone else after_update,
                             wait=strategy.wait if spec.measure_wait else None)
            if done["fused"] and not alone:
                strategy.count(updates)
            if shards:
                strategy.bytes += done["batches"] * shards.step_bytes(batch)
            t_sync = time.perf_counter()
            if strategy.end_epoch(model) and not alone:
                done["allreduce_s"] += time.perf_counter() - t_sync
        finally:
            batches.close()
        epoch_profile = clock.profile(done, flops)
        memory.mark(f"epoch {epoch + 1} trained")
        trace.end()
        profile.append({"epoch": epoch + 1, **epoch_profile})
        seen_rows.append(done["rows"])
        t_first_step = t_first_step or done["first_step"]
        seconds = time.time() - t0
        record = {"epoch": epoch + 1, "loss": strategy.average(done["loss"]),
                  "learning_rate": float(done["learning_rate"]), "seconds": round(seconds, 3),
                  "samples_per_s": round(strategy.average(done["rows"]) * size / seconds, 1),
                  "input_s": round(done["input_s"], 3), "compute_s": round(done["compute_s"], 3),
                  "allreduce_s": round(done["allreduce_s"], 3), "wait_s": round(done["wait_s"], 3),
                  "idle_s": epoch_profile["idle_s"], "cpu_percent": epoch_profile["cpu_percent"],
                  "gflop_s": epoch_profile["gflop_s"], "comm_bytes": strategy.bytes - bytes_before}
        for m in train_metrics:
            record[m.name] = strategy.average(m.result())
        if val_feed is not None:
            val_batches = val_feed.sequential()
            if shards:  # a lookup is collective: every rank runs the most batches any rank has
                val_batches = _padded(val_batches, shards.most(val_feed.sequential_batches()),
                                      shards.empty_batch(model))
            total, n = evaluate_stream(steps, val_batches, val_metrics)
            sums = strategy.sum([total, float(n)])
            record["val_loss"] = float(sums[0] / max(float(sums[1]), 1.0))
            for m in val_metrics:
                record[f"val_{m.name}"] = strategy.average(m.result())
        return record

    def describe(record: dict, left: float) -> None:
        extra = " ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in _RECORD_TIMES)
        log.info("[train] epoch %s/%s loss=%.4f %s samples/s=%.0f input=%.1fs compute=%.1fs allreduce=%.1fs "
                 "%sidle=%.1fs cpu=%.0f%% %.1f GFLOP/s (%.1fs, ~%.0fs left)",
                 record["epoch"], loop.epochs, record["loss"], extra, record["samples_per_s"], record["input_s"],
                 record["compute_s"], record["allreduce_s"],
                 f"wait={record['wait_s']:.1f}s " if spec.measure_wait else "",
                 record["idle_s"], record["cpu_percent"], record["gflop_s"], record["seconds"], left)

    loop.run(one_epoch, describe)
    history, stopping, checkpoint_s = loop.history, loop.stopping, loop.checkpoint_s
    t_end = time.time()
    feed.close()
    if val_feed is not None:
        val_feed.close()

    chief = rank == 0
    memory.mark("trained")
    digest, held, model_bytes, split_weights = _handover(model, optimizer, shards, chief)
    memory.mark("saved")
    strategy.finish()
    return RankResult(
        rank=rank, size=size, strategy=spec.strategy, rows=feed.rows,
        validation_rows=val_feed.rows if val_feed else 0, rows_per_epoch=plan.rows_per_epoch[rank],
        trimmed_per_epoch=plan.trimmed_per_epoch[rank], rows_seen=seen_rows, max_window_rows=feed.max_window_rows,
        steps_per_epoch=steps_n, updates_per_epoch=updates, stopped_early=stopping.stopped,
        allreduce_calls=strategy.calls, allreduce_bytes=strategy.bytes, devices=pinned,
        horovod_imported="horovod" in sys.modules, weights_digest=digest, code_path=_code_root(),
        os_threads=_os_threads(),
        timings=RankTimings(enter=t_enter, first_step=t_first_step or t_end, train_start=t_train0, end=t_end,
                            checkpoints=round(checkpoint_s, 3), launch=launch),
        profile=profile, flops_per_sample=flops,
        history=history if chief else None, model_bytes=model_bytes, split_weights=split_weights,
        sharded=shards.held() if shards else None,
        variable_bytes=held, peak_rss_mb=peak_rss_mb(), memory=memory.report())


def _load_network(network: bytes, spec: RankSpec, strategy, rank: int, size: int):
    """``(model, shards)``: this rank's network from the ``network`` archive, with only its
    rows of any table it splits (``shards``, a :class:`.sharding.RankShards`, else None)."""
    shards = _split_tables(network, spec, strategy, rank, size)
    return (shards.load(network) if shards else keras_from_bytes(network)), shards


def _handover(model, optimizer, shards, chief: bool) -> tuple:
    """What the trained rank reports: ``(weights digest, variable bytes, model_bytes,
    split_weights)``. Rank 0 of a replicated network gives its archive; with split tables
    every rank gives its rows instead and the driver puts the network together."""
    digest = weights_digest(model) if not shards else shards.digest(model)
    held = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in list(model.variables) + list(optimizer.variables))
    model_bytes = keras_to_bytes(model) if chief and not shards else None
    return digest, held, model_bytes, shards.result_weights(model) if shards else None


def _split_tables(network: bytes, spec: RankSpec, strategy, rank: int, size: int):
    """The :class:`.sharding.RankShards` of this rank when ``spec`` splits a table of the
    ``network`` archive (one larger than ``shard_embeddings_above`` bytes, more than one
    rank), else None."""
    if not spec.shard_embeddings_above or size < 2:
        return None
    from .sharding import RankShards, plan_archive
    plans = plan_archive(network, spec.shard_embeddings_above)
    if not plans:
        return None
    if rank == 0:
        log.info("[train] %d embedding table(s) split across %d ranks: %s", len(plans), size,
                 ", ".join(f"{p.layer}[{p.table}] {p.rows}x{p.width} ({p.bytes / 2**20:.1f} MiB)" for p in plans))
    return RankShards(plans, strategy.hvd, rank, size)


def _around(split: frozenset, reduce: Callable, size: int) -> Callable:
    """``reduce`` over every gradient but those at ``split`` (a split table's: each already the
    sum of every rank's, through the lookup's all-to-all), which are divided by ``size`` to
    match the others' average."""
    import tensorflow as tf

    def reduced(grads: list) -> list:
        shared = iter(reduce([g for i, g in enumerate(grads) if i not in split]))
        out = []
        for i, g in enumerate(grads):
            if i not in split:
                out.append(next(shared))
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values / size, g.indices, g.dense_shape))
            else:
                out.append(g / size)
        return out
    return reduced


def _padded(batches: Iterator[tuple], count: int, empty: tuple) -> Iterator[tuple]:
    """``batches``, then ``empty`` until ``count`` batches have been given."""
    import tensorflow as tf
    n = 0
    for b in batches:
        n += 1
        yield b
    for _ in range(count - n):
        yield tuple(tf.convert_to_tensor(a) for a in empty)

