"""Where a synchronous step's all-reduce time goes (issue 25, target 1), without Spark.

The default job's network (the flights tabular network: 16 trainable tensors, 82,927
parameters, 332 KB of float32 gradient) is rebuilt in each rank from its saved shapes; every
rank runs the same measurements, timed best-of-rounds, with a Horovod barrier before each:

- ``copy``: one memory copy of the gradient's bytes (numpy): the floor of moving them;
- ``allreduce_eager``: one ``hvd.grouped_allreduce`` of the 16 tensors from Python, as the
  rank loop did (an eager call between two graph calls);
- ``allreduce_graph``: the same call inside a ``tf.function``;
- ``step_local``: local gradients + optimizer update, no all-reduce (compute alone);
- ``step_split``: local gradients (graph) + eager all-reduce + update (graph): the rank
  loop's step before this issue;
- ``step_fused``: one ``tf.function``: gradients, all-reduce and update in one graph.

Each for 1 and 2 ranks (Gloo, one intra-op thread per rank, as the estimator's ranks on 2
cores), and for Horovod's background cycle time at its default and at ``--cycle-ms``.

    .venv/bin/python bench/allreduce_bench.py [--batch 1024] [--steps 200]

Writes bench/results/allreduce.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _results  # bench/_results.py (the script folder is on sys.path)

# The default flights network: embeddings of 8 categorical columns, then 175 -> 256 -> 128 -> 1
# with layer normalisation (its saved model's trainable shapes).
EMBEDDINGS = [(15, 3), (10, 4), (9, 5), (12, 6), (42, 7), (153, 8), (36, 12), (105, 22)]
DENSE_INPUT = 175  # the embeddings' 67 values and 108 numeric ones


def network():
    import keras
    idx = keras.Input((len(EMBEDDINGS),), dtype="int32")
    num = keras.Input((DENSE_INPUT - sum(d for _, d in EMBEDDINGS),))
    parts = [keras.layers.Flatten()(keras.layers.Embedding(n, d)(idx[:, i:i + 1]))
             for i, (n, d) in enumerate(EMBEDDINGS)]
    h = keras.layers.Concatenate()(parts + [num])
    for units in (256, 128):
        h = keras.layers.LayerNormalization()(keras.layers.Dense(units, activation="relu")(h))
    return keras.Model([idx, num], keras.layers.Dense(1, activation="sigmoid")(h))


def rank(cfg):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if cfg["cycle_ms"] is not None:
        os.environ["HOROVOD_CYCLE_TIME"] = str(cfg["cycle_ms"])
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd
    import keras
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())
    model = network()
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.BinaryCrossentropy()
    b = cfg["batch"]
    rng = np.random.default_rng(hvd.rank())
    x = (tf.constant(rng.integers(0, 9, (b, len(EMBEDDINGS))), tf.int32),
         tf.constant(rng.normal(size=(b, model.inputs[1].shape[1])).astype("float32")))
    y = tf.constant((rng.random((b, 1)) > 0.5).astype("float32"))
    grads = [tf.random.normal(v.shape) for v in model.trainable_variables]
    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)

    @tf.function
    def local_gradients():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def apply(g):
        opt.apply_gradients(zip(g, model.trainable_variables))

    @tf.function
    def allreduce_graph(g):
        return hvd.grouped_allreduce(g, op=hvd.Average)

    @tf.function
    def fused():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        g = hvd.grouped_allreduce(tape.gradient(loss, model.trainable_variables), op=hvd.Average)
        opt.apply_gradients(zip(g, model.trainable_variables))

    cases = {
        "copy": lambda: np.copyto(dst, src),
        "allreduce_eager": lambda: hvd.grouped_allreduce(grads, op=hvd.Average),
        "allreduce_graph": lambda: allreduce_graph(grads),
        "step_local": lambda: apply(local_gradients()),
        "step_split": lambda: apply(hvd.grouped_allreduce(local_gradients(), op=hvd.Average)),
        "step_fused": fused,
    }
    out = {}
    for _ in range(cfg["rounds"]):
        for name, fn in cases.items():
            for _ in range(5):
                fn()
            hvd.allreduce(tf.constant(0.0), name=f"barrier_{name}")
            t0 = time.perf_counter()
            for _ in range(cfg["steps"]):
                fn()
            ms = (time.perf_counter() - t0) / cfg["steps"] * 1000
            out[name] = min(out.get(name, float("inf")), ms)
    out["bytes"] = nbytes
    out["parameters"] = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cycle-ms", type=float, default=0.1, help="the second cycle time tried (ms)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "allreduce.json"))
    args = p.parse_args(argv)
    from horovod.runner import run
    results = {"runs": []}
    for cycle in (None, args.cycle_ms):
        for n in (1, 2):
            cfg = {"batch": args.batch, "steps": args.steps, "rounds": args.rounds, "cycle_ms": cycle}
            per_rank = run(rank, args=(cfg,), np=n, use_gloo=True)
            row = {"ranks": n, "cycle_ms": cycle if cycle is not None else "default",
                   **{k: round(max(r[k] for r in per_rank), 4) for k in per_rank[0]}}
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
    return _results.finish(args.out, results, args)


if __name__ == "__main__":
    sys.exit(main())
