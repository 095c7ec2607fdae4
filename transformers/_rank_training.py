"""What each Horovod rank runs: read its own shard, train with all-reduce, report.

Kept in an importable module (not a closure) so ranks unpickle it by reference and
autograph finds its source. Everything the rank needs arrives in one plain ``spec`` dict
of JSON-like values plus the model as ``.keras`` bytes: no pickled Keras objects.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import time


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


def read_shard(path: str, features_col: str, label_col: str, weight_col: str | None):
    """One rank's shard as numpy arrays, converted per Arrow column (no per-row Python)."""
    import numpy as np
    import pyarrow.parquet as pq

    columns = [features_col, label_col] + ([weight_col] if weight_col else [])
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
    return x, y, w


def train_rank(spec: dict) -> dict:
    """Train on this rank's shard; rank 0 also returns the trained model and history."""
    t_enter = time.time()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    threads = int(spec.get("threads") or 0)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(int(spec["seed"]) + rank)

    model = keras_from_bytes(spec["model_bytes"])
    x, y, w = read_shard(spec["shards"][rank], spec["features_col"], spec["label_col"],
                         spec.get("weight_col"))
    if len(y) == 0:
        raise ValueError(f"rank {rank} got an empty shard {spec['shards'][rank]!r}")
    batch = int(spec["batch_size"])
    # Every rank must run the same number of steps, or the all-reduce would wait forever
    # for a rank that has finished its epoch: take the smallest shard's count.
    local_steps = -(-len(y) // batch)
    steps = int(hvd.allreduce(tf.constant(local_steps, tf.int64), op=hvd.Min,
                              name="steps_per_epoch"))

    optimizer = keras.optimizers.get({"class_name": spec.get("optimizer", "adam"),
                                      "config": {"learning_rate": float(spec["learning_rate"])}})
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.get(spec.get("loss", "binary_crossentropy"))

    # Rank 0's initial state wins: model weights and optimizer slots, so that the
    # replicas start identical and stay identical under averaged gradients.
    for i, var in enumerate(list(model.variables) + list(optimizer.variables)):
        var.assign(hvd.broadcast(tf.convert_to_tensor(var), root_rank=0, name=f"init_{i}"))

    ds = (tf.data.Dataset.from_tensor_slices((x, y, w))
          .shuffle(len(y), seed=int(spec["seed"]) + rank, reshuffle_each_iteration=True)
          .repeat().batch(batch).prefetch(tf.data.AUTOTUNE))
    it = iter(ds)

    @tf.function
    def train_step(xb, yb, wb):
        with tf.GradientTape() as tape:
            pred = model(xb, training=True)
            loss = tf.reduce_mean(loss_fn(yb[:, None], pred) * wb)
        grads = tape.gradient(loss, model.trainable_variables)
        grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    history = []
    t_first_step = None
    t_train0 = time.time()
    for epoch in range(int(spec["epochs"])):
        t0 = time.time()
        total = 0.0
        for _ in range(steps):
            xb, yb, wb = next(it)
            loss = train_step(xb, yb, wb)
            if t_first_step is None:
                t_first_step = time.time()
            total += float(loss)
        mean_loss = float(hvd.allreduce(tf.constant(total / steps), op=hvd.Average,
                                        name=f"epoch_loss_{epoch}"))
        seconds = time.time() - t0
        record = {"epoch": epoch + 1, "loss": mean_loss, "seconds": round(seconds, 3),
                  "samples_per_s": round(steps * batch * size / seconds, 1)}
        history.append(record)
        if rank == 0:
            print(f"[train] epoch {epoch + 1}/{spec['epochs']} loss={mean_loss:.4f} "
                  f"samples/s={record['samples_per_s']:.0f} ({seconds:.1f}s)", flush=True)
    t_end = time.time()

    result = {
        "rank": rank,
        "size": size,
        "rows": int(len(y)),
        "steps_per_epoch": steps,
        "weights_digest": weights_digest(model),
        "timings": {"enter": t_enter, "first_step": t_first_step or t_end,
                    "train_start": t_train0, "end": t_end},
    }
    if rank == 0:
        result["history"] = history
        result["model_bytes"] = keras_to_bytes(model)
    return result
