"""What each Horovod rank runs: read its own shard, train with all-reduce, report.

Kept in an importable module (not a closure) so ranks unpickle it by reference and
autograph finds its source. Everything a rank needs arrives in one plain ``spec`` dict
of JSON-like values plus the model as ``.keras`` bytes: no pickled Keras objects.

The training step is split in three so each part can be timed: local gradients
(``tf.function``), the all-reduce (Horovod, eager) and the optimizer update
(``tf.function``). Per epoch rank 0 prints loss, metrics, samples/s and how the time
went: waiting for input, computing, all-reducing.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time

# Tests: "RANK:EPOCH" makes that rank raise after that epoch; "RANK:EPOCH:exit" kills it;
# "RANK:EPOCH:stop" freezes it (SIGSTOP), as a hung host would.
FAIL_AT_EPOCH_ENV = "SPARKDEEP_TEST_FAIL_AT_EPOCH"


def keras_from_bytes(data: bytes):
    """Load a ``.keras`` archive in safe mode (refuses embedded Python code)."""
    import keras
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as fh:
            fh.write(data)
        return keras.saving.load_model(path, compile=False, safe_mode=True)


def keras_to_bytes(model) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as fh:
            return fh.read()


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()


def read_shard(path: str, features_col: str, label_col: str, weight_col: str | None,
               split_col: str | None = None):
    """One rank's shard as numpy arrays, converted per Arrow column (no per-row Python).

    Returns (x, y, w, is_validation) with ``is_validation`` None when there is no split.
    """
    import numpy as np
    import pyarrow.parquet as pq

    columns = [features_col, label_col] + ([weight_col] if weight_col else []) + ([split_col] if split_col else [])
    table = pq.read_table(path, columns=columns)
    n = table.num_rows
    feats = table.column(features_col).combine_chunks()
    if feats.null_count:
        raise ValueError(f"shard {path!r}: column {features_col!r} has {feats.null_count} null rows")
    flat = feats.flatten().to_numpy(zero_copy_only=False).astype("float32", copy=False)
    if n and flat.size % n:
        raise ValueError(f"shard {path!r}: column {features_col!r} has rows of different lengths")
    x = flat.reshape(n, flat.size // n if n else 0)
    y = table.column(label_col).to_numpy().astype("float32")
    w = (table.column(weight_col).to_numpy().astype("float32") if weight_col
         else np.ones(n, dtype="float32"))
    split = table.column(split_col).to_numpy(zero_copy_only=False).astype(bool) if split_col else None
    return x, y, w, split


def _pin_devices() -> str | None:
    """On GPU executors, use only the GPU(s) Spark gave this rank's task."""
    try:
        from horovod.spark.task import get_available_devices
        devices = get_available_devices()
    except Exception:  # noqa: BLE001 - not under horovod.spark, or no resources
        devices = None
    if devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
        return os.environ["CUDA_VISIBLE_DEVICES"]
    return None


def make_metric(name: str, task: str):
    """The Keras metric ``name`` means for a ``task`` network (one table: sparkdeep.tasks)."""
    import keras

    from sparkdeep.tasks import metric_class
    return getattr(keras.metrics, metric_class(name, task))(name=name)


def require_finite(record: dict, epoch: int) -> None:
    """Stop training on a non-finite loss, naming the epoch. The epoch's loss is all-reduced,
    so every rank sees the same value and stops at the same point: no rank waits alone."""
    bad = {k: v for k, v in record.items() if k in ("loss", "val_loss") and not math.isfinite(v)}
    if bad:
        raise FloatingPointError(
            f"training diverged: {', '.join(f'{k}={v}' for k, v in bad.items())} at epoch {epoch} (learning rate "
            f"{record.get('learning_rate')}); lower learningRate, check the features' scale, or clip gradients")


def _checkpoint(folder: str, model, optimizer, state: dict) -> None:
    """Rank 0 writes model, optimizer state and progress atomically (tmp dir + rename)."""
    import numpy as np
    os.makedirs(os.path.dirname(folder.rstrip("/")) or ".", exist_ok=True)
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.save(os.path.join(tmp, "model.keras"))
    arrays = {f"v{i}": np.asarray(v) for i, v in enumerate(optimizer.variables)}
    np.savez(os.path.join(tmp, "optimizer.npz"), **arrays)
    with open(os.path.join(tmp, "state.json"), "w") as fh:
        json.dump(state, fh)
    old = folder.rstrip("/") + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


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

    def __init__(self, monitor: str, patience: int, history=()):
        self.monitor, self.patience = monitor, int(patience)
        self.best = min((r[monitor] for r in history if monitor in r), default=math.inf)
        self.best_weights, self.waited, self.stopped = None, 0, False

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


def train_rank(spec: dict) -> dict:
    """Train on this rank's shard; rank 0 also returns the trained model and history."""
    t_enter = time.time()
    pinned = _pin_devices()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    threads = int(spec.get("threads") or 0)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd
    import keras

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(int(spec["seed"]) + rank)

    resume = spec.get("resume")
    model = keras_from_bytes(resume["model_bytes"] if resume else spec["model_bytes"])
    x, y, w, split = read_shard(spec["shards"][rank], "features", "label",
                                "weight" if spec.get("weight_col") else None,
                                "is_validation" if spec.get("has_validation") else None)
    if split is not None:
        xv, yv, wv = x[split], y[split], w[split]
        x, y, w = x[~split], y[~split], w[~split]
    else:
        xv = yv = wv = None
    if len(y) == 0:
        raise ValueError(f"rank {rank} got no training rows in shard {spec['shards'][rank]!r}")
    batch = int(spec["batch_size"])
    accum = max(1, int(spec.get("accumulation_steps", 1)))
    # Every rank must run the same number of steps, or the all-reduce would wait forever
    # for a rank that has finished its epoch: take the smallest shard's count, rounded
    # to whole accumulation groups.
    local_steps = -(-len(y) // batch)
    steps = int(hvd.allreduce(tf.constant(local_steps, tf.int64), op=hvd.Min, name="steps_per_epoch"))
    updates = max(1, steps // accum)
    steps = updates * accum

    base_lr = float(spec["learning_rate"])
    target_lr = base_lr * (size if spec.get("scale_lr", True) else 1)
    warmup = int(round(float(spec.get("warmup_epochs", 0)) * updates))
    optimizer = keras.optimizers.get({"class_name": spec.get("optimizer", "adam"),
                                      "config": {"learning_rate": base_lr}})
    optimizer.build(model.trainable_variables)
    if resume and rank == 0:
        with np.load(resume["optimizer_path"], allow_pickle=False) as saved:
            for i, var in enumerate(optimizer.variables):
                var.assign(saved[f"v{i}"])
    loss_fn = keras.losses.get(spec["loss"])
    task = spec["task"]
    sparse = task == "multiclass"  # integer class labels against k outputs

    # Rank 0's state wins: model weights and optimizer slots (fresh or resumed), so the
    # replicas start identical and stay identical under averaged gradients.
    for i, var in enumerate(list(model.variables) + list(optimizer.variables)):
        var.assign(hvd.broadcast(tf.convert_to_tensor(var), root_rank=0, name=f"init_{i}"))

    ds = (tf.data.Dataset.from_tensor_slices((x, y, w))
          .shuffle(len(y), seed=int(spec["seed"]) + rank, reshuffle_each_iteration=True)
          .repeat().batch(batch).prefetch(tf.data.AUTOTUNE))
    it = iter(ds)
    compression = hvd.Compression.fp16 if spec.get("compression") == "fp16" else hvd.Compression.none
    grad_bytes_each = 2 if spec.get("compression") == "fp16" else 4
    train_metrics = [make_metric(m, task) for m in spec.get("metrics", [])]
    val_metrics = [make_metric(m, task) for m in spec.get("metrics", [])]

    def _target(yb):
        return yb if sparse else yb[:, None]

    @tf.function
    def local_gradients(xb, yb, wb):
        with tf.GradientTape() as tape:
            pred = model(xb, training=True)
            loss = tf.reduce_mean(loss_fn(_target(yb), pred) * wb)
        return loss, pred, tape.gradient(loss, model.trainable_variables)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def predict(xb):
        return model(xb, training=False)

    def evaluate(xe, ye, we, metrics):
        """Weighted loss and metrics on this rank's rows, averaged over ranks by row count."""
        for m in metrics:
            m.reset_state()
        total, n = 0.0, 0
        for start in range(0, len(ye), 4096):
            xb, yb, wb = xe[start:start + 4096], ye[start:start + 4096], we[start:start + 4096]
            pred = predict(xb)
            total += float(tf.reduce_sum(loss_fn(_target(yb), pred) * wb))
            n += len(yb)
            for m in metrics:
                m.update_state(_target(yb), pred, sample_weight=wb)
        sums = hvd.allreduce(tf.constant([total, float(n)], tf.float64), op=hvd.Sum, name="eval_sums")
        out = {"loss": float(sums[0] / max(float(sums[1]), 1.0))}
        for m in metrics:
            out[m.name] = float(hvd.allreduce(tf.constant(float(m.result())), op=hvd.Average,
                                              name=f"eval_{m.name}"))
        return out

    fail_at = os.environ.get(FAIL_AT_EPOCH_ENV, "")
    history = list(resume["history"]) if resume else []
    start_epoch = int(resume["completed_epochs"]) if resume else 0
    epochs = int(spec["epochs"])
    monitor = "val_loss" if xv is not None else "loss"
    stopping = EarlyStopping(monitor, int(spec.get("early_stopping_patience", 0)), history)
    t_first_step = None
    t_train0 = time.time()
    update_no = start_epoch * updates
    comm_calls = comm_bytes = 0
    for epoch in range(start_epoch, epochs):
        t0 = time.time()
        t_input = t_compute = t_comm = 0.0
        total = 0.0
        for m in train_metrics:
            m.reset_state()
        for _ in range(updates):
            acc = None
            for _ in range(accum):
                ta = time.perf_counter()
                xb, yb, wb = next(it)
                tb = time.perf_counter()
                loss, pred, grads = local_gradients(xb, yb, wb)
                for m in train_metrics:
                    m.update_state(_target(yb), pred, sample_weight=wb)
                acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]
                total += float(loss)
                tc = time.perf_counter()
                t_input += tb - ta
                t_compute += tc - tb
                if t_first_step is None:
                    t_first_step = time.time()
            if accum > 1:
                acc = [a / accum for a in acc]
            tc = time.perf_counter()
            reduced = hvd.grouped_allreduce(acc, op=hvd.Average, compression=compression)
            td = time.perf_counter()
            comm_calls += 1
            comm_bytes += sum(int(np.prod(g.shape)) for g in acc) * grad_bytes_each
            update_no += 1
            lr = learning_rate_at(update_no, base_lr, target_lr, warmup, epochs * updates,
                                  spec.get("lr_schedule", "constant"))
            optimizer.learning_rate.assign(lr)
            apply(reduced)
            t_comm += td - tc
            t_compute += time.perf_counter() - td
        seconds = time.time() - t0
        record = {"epoch": epoch + 1,
                  "loss": float(hvd.allreduce(tf.constant(total / steps), op=hvd.Average, name=f"loss_{epoch}")),
                  "learning_rate": float(lr), "seconds": round(seconds, 3),
                  "samples_per_s": round(steps * batch * size / seconds, 1),
                  "input_s": round(t_input, 3), "compute_s": round(t_compute, 3), "allreduce_s": round(t_comm, 3)}
        for m in train_metrics:
            record[m.name] = float(hvd.allreduce(tf.constant(float(m.result())), op=hvd.Average,
                                                 name=f"train_{m.name}_{epoch}"))
        if xv is not None:
            for k, v in evaluate(xv, yv, wv, val_metrics).items():
                record[f"val_{k}"] = v
        require_finite(record, epoch + 1)
        history.append(record)
        stop = stopping.update(record, model.get_weights)
        if rank == 0:
            left = (epochs - epoch - 1) * seconds
            extra = " ".join(f"{k}={v:.4f}" for k, v in record.items()
                             if k not in ("epoch", "loss", "seconds", "samples_per_s", "learning_rate",
                                          "input_s", "compute_s", "allreduce_s"))
            print(f"[train] epoch {epoch + 1}/{epochs} loss={record['loss']:.4f} {extra} "
                  f"samples/s={record['samples_per_s']:.0f} input={t_input:.1f}s compute={t_compute:.1f}s "
                  f"allreduce={t_comm:.1f}s ({seconds:.1f}s, ~{left:.0f}s left)", flush=True)
            if spec.get("checkpoint_dir"):
                _checkpoint(spec["checkpoint_dir"], model, optimizer,
                            {"completed_epochs": epoch + 1, "history": history})
        if fail_at and fail_at.split(":")[:2] == [str(rank), str(epoch + 1)]:
            if fail_at.endswith(":exit"):
                os._exit(3)  # a rank that dies without a Python exception
            if fail_at.endswith(":stop"):
                import signal
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen: no exit, no error, no heartbeat
            raise RuntimeError(f"injected failure after epoch {epoch + 1} ({FAIL_AT_EPOCH_ENV})")
        if stop:
            if rank == 0:
                print(f"[train] early stop: {monitor} has not improved for {stopping.patience} epochs", flush=True)
            break
    stopping.restore(model)
    stopped_early = stopping.stopped
    t_end = time.time()

    result = {
        "rank": rank, "size": size, "rows": int(len(y)), "validation_rows": int(len(yv) if yv is not None else 0),
        "steps_per_epoch": steps, "updates_per_epoch": updates, "stopped_early": stopped_early,
        "allreduce_calls": comm_calls, "allreduce_bytes": comm_bytes, "devices": pinned,
        "weights_digest": weights_digest(model),
        # Where this rank imported the project from: the shipped archive on a cluster.
        "code_path": _code_root(),
        "timings": {"enter": t_enter, "first_step": t_first_step or t_end, "train_start": t_train0, "end": t_end},
    }
    if rank == 0:
        result["history"] = history
        result["model_bytes"] = keras_to_bytes(model)
    return result
