"""What each rank measures about itself per epoch, so a user sees where the time went
before optimising anything: CPU utilisation of the rank's process, achieved FLOP/s against
an estimate of the network's FLOPs per sample, peak memory, and the epoch's time split
into input wait, compute, communication, waiting for the other ranks and idle (the rest:
Python between the parts, dispatch), which add up to the epoch's seconds within
:data:`SPLIT_TOLERANCE`.

Optional deep traces, written under a folder the caller names (the pipeline puts it
beside the run's reports): TensorFlow's profiler for one epoch of each rank
(``rank-<n>/``, for TensorBoard's profile tab) and Horovod's timeline (``horovod-timeline.json``,
for ``chrome://tracing``), which Horovod must know before ``hvd.init``.
"""
from __future__ import annotations

import os
import resource
import time

# The parts of an epoch's split, in the order the report stacks them.
SPLIT = ("input_s", "compute_s", "allreduce_s", "wait_s", "idle_s")
# The parts sum to the epoch's seconds within this share of it (or 50 ms for a short epoch):
# what lies outside the loop (the prefetch thread's start, the strategy's end-of-epoch
# exchange is inside) is small by construction.
SPLIT_TOLERANCE = 0.05
HOROVOD_TIMELINE = "horovod-timeline.json"


def _lookup(layer) -> bool:
    """An embedding table: a lookup per sample, no multiply-adds."""
    return type(layer).__name__ in ("Embedding", "ColumnEmbeddings")


#: Weights applied one value each (added or multiplied elementwise) whatever their shape:
#: the ensemble heads' per-member bias, the ensemble adapter's per-member scales.
_ELEMENTWISE = frozenset({"bias", "scales"})


def forward_flops_per_sample(model) -> int:
    """Floating-point operations of one sample's forward pass, estimated from the weights:
    2 per weight of a matrix (a multiply and an add; dense and einsum layers) and 1 per
    weight of a vector or applied elementwise (bias, normalisation scale and offset, an
    ensemble's member scales); embedding tables cost none.
    A layer shared by an ensemble's members (after an ``EnsembleAdapter``: its input has a
    members axis) runs once per member. Exact for dense networks up to activations and
    normalisation statistics (a few per unit); a convolution's kernel is counted once, not
    once per position (an underestimate)."""
    total = 0
    layers = [layer for layer in model._flatten_layers(include_self=False, recursive=True)
              if not list(layer._flatten_layers(include_self=False, recursive=False))]
    members = max([int(layer.members) for layer in layers if type(layer).__name__ == "EnsembleAdapter"] or [0])
    for layer in layers:
        if _lookup(layer):
            continue
        weights = 0
        for w in layer.weights:
            n = 1
            for d in w.shape:
                n *= int(d)
            weights += 2 * n if len(w.shape) >= 2 and w.name not in _ELEMENTWISE else n
        total += weights * _member_runs(layer, members)
    return total


def _member_runs(layer, members: int) -> int:
    """How many times a layer's weights are applied per sample: once per ensemble member
    when its input carries the members axis and its weights are shared (not a layer of the
    ensemble's own, whose weights are already one set per member); else once."""
    if members < 2 or hasattr(layer, "members"):
        return 1
    try:
        shape = layer.input.shape
    except (AttributeError, ValueError):  # a layer called more than once, or never
        return 1
    return members if len(shape) == 3 and shape[1] == members else 1


def training_flops_per_sample(model) -> int:
    """Forward and backward: the backward pass takes about twice the forward's
    multiply-adds (gradients with respect to both the inputs and the weights)."""
    return 3 * forward_flops_per_sample(model)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if os.uname().sysname == "Darwin" else 1024), 1)


def rss_mb() -> float:
    """This process's resident memory now (Linux; 0.0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except OSError:
        return 0.0
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


class MemoryMarks:
    """Resident memory at the named points of a rank's life (``mark``): where its peak
    came from. :meth:`report` is ``{point: [rss_mb, peak_rss_mb so far]}``."""

    def __init__(self):
        self._marks: dict[str, list] = {}

    def mark(self, point: str) -> None:
        self._marks[point] = [rss_mb(), peak_rss_mb()]

    def report(self) -> dict:
        return dict(self._marks)


class EpochClock:
    """Wall and CPU time of one epoch of this process (all its threads: TensorFlow's,
    the feed's prefetch thread, Horovod's background thread)."""

    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def profile(self, done: dict, flops_per_sample: int) -> dict:
        """The rank's profile of the epoch from its loop's figures (``run_epoch``'s ``done``,
        its end-of-epoch exchange already added to ``allreduce_s``)."""
        seconds = time.perf_counter() - self.wall0
        cpu = time.process_time() - self.cpu0
        split = {k: float(done.get(k, 0.0)) for k in SPLIT[:-1]}
        # Idle: the rest of the epoch (Python between the parts, dispatch, the loop's start and end).
        split["idle_s"] = max(0.0, seconds - sum(split.values()))
        rows = int(done["rows"])
        return {"seconds": round(seconds, 4), **{k: round(v, 4) for k, v in split.items()},
                "cpu_percent": round(100.0 * cpu / seconds, 1) if seconds > 0 else 0.0,
                "rows": rows, "gflop_s": round(flops_per_sample * rows / seconds / 1e9, 3) if seconds > 0 else 0.0,
                "gflop_s_computing": round(flops_per_sample * rows / split["compute_s"] / 1e9, 3)
                if split["compute_s"] > 0 else 0.0,
                "peak_rss_mb": peak_rss_mb(), "fused_step": bool(done.get("fused", False))}


def horovod_timeline_env(trace_dir: str | None) -> None:
    """Ask Horovod (before ``hvd.init``) for its timeline of every collective, in ``trace_dir``."""
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
        os.environ["HOROVOD_TIMELINE"] = os.path.join(trace_dir, HOROVOD_TIMELINE)


class EpochTrace:
    """TensorFlow's profiler over one epoch (1-based ``epoch``) of this rank, into
    ``trace_dir/rank-<rank>``; nothing when ``trace_dir`` is empty or ``epoch`` is 0."""

    def __init__(self, trace_dir: str | None, epoch: int, rank: int):
        self.folder = os.path.join(trace_dir, f"rank-{rank}") if trace_dir and epoch > 0 else None
        self.epoch, self.on = int(epoch), False

    def begin(self, epoch: int) -> None:
        if self.folder and epoch == self.epoch:
            import tensorflow as tf
            os.makedirs(self.folder, exist_ok=True)
            tf.profiler.experimental.start(self.folder)
            self.on = True

    def end(self) -> None:
        if self.on:
            import tensorflow as tf
            tf.profiler.experimental.stop()
            self.on = False


def profile_summary(results) -> dict | None:
    """``trainingSummary['profile']``: every rank's per-epoch profile (None when no rank
    kept one: a strategy that runs its own loop)."""
    ranks = [{"rank": r.rank, "epochs": r.profile} for r in results if r.profile]
    if not ranks:
        return None
    return {"flops_per_sample": results[0].flops_per_sample, "split": list(SPLIT),
            "split_tolerance": SPLIT_TOLERANCE, "ranks": ranks}


# The launch from ``fit`` to the first step, in order: (name, the instant it ends at, what it is).
LAUNCH_PARTS = (
    ("checks", "staged", "the driver's input checks and staging plan"),
    ("spark_job", "task_start", "Spark starts the job: the repartition and the barrier stage's tasks"),
    ("spill", "spilled", "each task writes its partition to local disk"),
    ("plan", "spawn", "the tasks gather row counts and hosts, the rendezvous gets its plan"),
    ("process_start", "process_start", "the rank's Python process starts"),
    ("imports", "imported", "the rank unpickles its call and imports TensorFlow and Keras"),
    ("rendezvous", "joined", "the ranks join (Horovod's init, or the TensorFlow cluster)"),
    ("model", "model_ready", "the network is loaded, the optimizer built, rank 0's state broadcast"),
    ("first_step", "first_step", "the feed starts and the first step is traced and run"),
)


def launch_breakdown(t_launch: float, t_staged: float, ranks: list[dict]) -> dict | None:
    """Seconds of each part of the launch (:data:`LAUNCH_PARTS`), each ending at the slowest
    rank's instant (every rank waits for the slowest at the rendezvous); None when the ranks
    kept no instants."""
    if not ranks or not all(ranks):
        return None
    ends = {"staged": t_staged}
    for _, key, _ in LAUNCH_PARTS[1:]:
        seen = [r[key] for r in ranks if key in r]
        if len(seen) == len(ranks):
            ends[key] = max(seen)
    out, before = {}, t_launch
    for name, key, _ in LAUNCH_PARTS:
        if key in ends:
            out[name] = round(max(0.0, ends[key] - before), 3)
            before = max(before, ends[key])
    return out
