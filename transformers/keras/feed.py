"""A rank's training data: spilled once to the task's local disk, streamed every epoch.

The launcher hands each rank its partition as Arrow batches. :class:`ShardSpill` writes
them, as they arrive, to Arrow IPC files on the task's local disk (``train.arrow`` and
``validation.arrow``, in chunks of at most ``chunk_rows`` rows, with a small JSON index of
the chunk sizes), so no copy of the training set ever passes through a folder every
executor must see, and the task never holds more than one incoming batch.

:class:`ShardFeed` streams a spilled file in bounded memory:

- **epoch order**: each epoch reads the chunks in a new random order into a window of at
  most ``buffer_rows`` rows (+ one chunk), permutes the window and emits full batches
  from it; what is left (less than a batch) starts the next window. Every row comes out
  exactly once per epoch, reshuffled every epoch, and the rank never holds more than the
  window and a few batches, whatever the shard's size;
- **equal steps**: :func:`plan_steps` computes, from the row counts the ranks know after
  spilling (no second read), the steps every rank runs per epoch: the smallest shard's
  batch count, rounded down to whole accumulation groups. A larger shard's rows beyond
  ``steps x batch`` (the last ones of its epoch's random order, so different rows each
  epoch) are the trim, counted and reported;
- **validation** streams in file order, ``chunk`` rows at a time.

Everything here runs without Horovod or TensorFlow (numpy and pyarrow only), so it is
tested alone.
"""
from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .contract import Staged

TRAIN, VALIDATION = "train", "validation"


class ShardSpill:
    """Writes one partition's Arrow batches to ``folder`` as they arrive (picklable: it is
    built on the driver and used in the task). Columns: ``features`` (list<float>),
    ``label``, optional ``weight``; rows with ``split_col`` true go to the validation file."""

    def __init__(self, split_col: str | None = None, chunk_rows: int = 2048):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.split_col, self.chunk_rows = split_col, int(chunk_rows)
        self._writers: dict = {}
        self._chunks: dict = {TRAIN: [], VALIDATION: []}
        self.folder = None

    def open(self, folder: str) -> "ShardSpill":
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        return self

    def _write(self, part: str, batch) -> None:
        import pyarrow as pa
        if batch.num_rows == 0:
            return
        writer = self._writers.get(part)
        if writer is None:
            sink = pa.OSFile(os.path.join(self.folder, f"{part}.arrow"), "wb")
            writer = self._writers[part] = (sink, pa.ipc.new_file(sink, batch.schema))
        for start in range(0, batch.num_rows, self.chunk_rows):
            piece = batch.slice(start, self.chunk_rows)
            writer[1].write_batch(piece)
            self._chunks[part].append(piece.num_rows)

    def write(self, batch) -> None:
        if self.split_col is None:
            self._write(TRAIN, batch)
            return
        import pyarrow.compute as pc
        flag = batch.column(self.split_col)
        keep = [n for n in batch.schema.names if n != self.split_col]
        held = pc.fill_null(flag, False)
        self._write(TRAIN, batch.filter(pc.invert(held)).select(keep))
        self._write(VALIDATION, batch.filter(held).select(keep))

    def problem(self, counts: list, rank: int) -> str | None:
        """Checked by the launcher on every task once the counts are gathered, before any
        rank starts: why this task's rank cannot train (None when it can)."""
        return shard_problem(counts, rank)

    def close(self) -> dict:
        """Finish the files; the row counts and chunk sizes per part (also in ``index.json``)."""
        for sink, writer in self._writers.values():
            writer.close()
            sink.close()
        index = {part: {"rows": int(sum(sizes)), "chunks": sizes} for part, sizes in self._chunks.items()}
        with open(os.path.join(self.folder, "index.json"), "w") as fh:
            json.dump(index, fh)
        return {part: index[part]["rows"] for part in index}


def shard_problem(counts: list, rank: int) -> str | None:
    """Why ``rank`` cannot train, from every rank's spilled counts (None when it can)."""
    train = [c.get(TRAIN, 0) for c in counts]
    if train[rank] > 0:
        return None
    held = counts[rank].get(VALIDATION, 0)
    why = (f"all {held} of its rows are validation rows; lower validationFraction or change validationCol"
           if held else f"the input has {sum(train)} training rows for {len(counts)} ranks; lower numProc")
    return f"rank {rank} got no training rows: {why}"


def chunk_rows_for(buffer_rows: int) -> int:
    """Stored chunk size for a shuffle window: an eighth of it (a window mixes at least eight
    chunks from anywhere in the shard and exceeds the bound by at most 1/8), 16 to 2048 rows."""
    return max(16, min(2048, int(buffer_rows) // 8))


def read_index(folder: str) -> dict:
    """The spill index of a rank's folder (``index.json``): each part's row count and
    chunk files; empty parts when nothing was spilled there."""
    path = os.path.join(folder, "index.json")
    if not os.path.isfile(path):
        return {TRAIN: {"rows": 0, "chunks": []}, VALIDATION: {"rows": 0, "chunks": []}}
    with open(path) as fh:
        return json.load(fh)


@dataclass(frozen=True)
class StepPlan:
    """Steps every rank runs per epoch, and the rows each rank leaves out of every epoch."""
    steps: int
    updates: int
    rows_per_epoch: list
    trimmed_per_epoch: list


def plan_steps(rows: list, batch: int, accumulation: int = 1) -> StepPlan:
    """Equal steps for every rank from the ranks' training row counts: the smallest shard's
    batch count (its last batch may be partial), rounded down to whole groups of
    ``accumulation`` batches. Raises if a rank has no rows, or if the smallest shard holds
    fewer batches than one accumulation group."""
    if batch < 1 or accumulation < 1:
        raise ValueError(f"batch ({batch}) and accumulation ({accumulation}) must be >= 1")
    empty = [r for r, n in enumerate(rows) if n <= 0]
    if empty:
        raise ValueError(f"rank(s) {', '.join(map(str, empty))} got no training rows (of {sum(rows)} in all): "
                         "too few rows for the number of ranks; lower numProc")
    steps = min(-(-n // batch) for n in rows)
    if steps < accumulation:
        raise ValueError(f"accumulationSteps={accumulation} needs {accumulation} batches per epoch, but the "
                         f"smallest rank's shard ({min(rows)} training rows) holds {steps} batch(es) of {batch}: "
                         "lower accumulationSteps or batchSize")
    updates = steps // accumulation
    steps = updates * accumulation
    used = [min(n, steps * batch) for n in rows]
    return StepPlan(steps, updates, used, [n - u for n, u in zip(rows, used)])


class ShardFeed:
    """Streams one spilled part (``train`` or ``validation``) of a rank's shard.

    ``buffer_rows``: the shuffle window; with ``chunk`` rows per stored chunk a rank holds
    at most ``max(buffer_rows, batch) + chunk`` rows in the window (what is left of a
    window, less than a batch, starts the next one), plus the batches queued for the step.
    ``max_window_rows`` records the largest window actually held (tests check the bound).
    """

    def __init__(self, folder: str, part: str = TRAIN, *, batch_size: int, buffer_rows: int, seed: int,
                 weight: bool = False):
        if buffer_rows < 1:
            raise ValueError(f"buffer_rows must be >= 1, got {buffer_rows}")
        info = read_index(folder)[part]
        self.path = os.path.join(folder, f"{part}.arrow")
        self.rows, self.chunks = int(info["rows"]), list(info["chunks"])
        self.batch, self.buffer_rows, self.seed, self.weight = int(batch_size), int(buffer_rows), seed, weight
        self.max_window_rows = 0
        self._reader = self._file = None

    def _chunk(self, i: int):
        import pyarrow as pa
        if self._reader is None:
            # Plain reads, not a memory map: pages of a mapped file would count in the
            # rank's resident memory, growing with the shard.
            self._file = pa.OSFile(self.path, "rb")
            self._reader = pa.ipc.open_file(self._file)
        b = self._reader.get_batch(i)
        feats = b.column(b.schema.get_field_index(Staged.FEATURES))
        n = b.num_rows
        flat = feats.flatten().to_numpy(zero_copy_only=False)
        x = flat.astype("float32", copy=False).reshape(n, flat.size // n if n else 0)
        y = b.column(b.schema.get_field_index(Staged.LABEL)).to_numpy(zero_copy_only=False).astype("float32", copy=False)
        if self.weight:
            w = b.column(b.schema.get_field_index(Staged.WEIGHT)).to_numpy(zero_copy_only=False).astype("float32",
                                                                                                 copy=False)
        else:
            w = np.ones(n, dtype="float32")
        return x, y, w

    def epoch(self, epoch: int, steps: int) -> Iterator[tuple]:
        """``steps`` batches for this epoch (full ones; the last may be partial when the
        shard runs out); rows beyond ``steps x batch`` are not read."""
        rng = np.random.default_rng([int(self.seed), int(epoch)])
        order = rng.permutation(len(self.chunks))
        window: list = []
        held = emitted = 0

        def drain(final: bool):
            nonlocal window, held, emitted
            x, y, w = (np.concatenate([c[k] for c in window]) if len(window) > 1 else window[0][k] for k in range(3))
            perm = rng.permutation(len(y))
            start = 0
            while emitted < steps and (len(y) - start >= self.batch or (final and len(y) > start)):
                end = min(start + self.batch, len(y))
                idx = perm[start:end]
                yield x[idx], y[idx], w[idx]
                emitted += 1
                start = end
            rest = perm[start:]
            window = [(x[rest], y[rest], w[rest])] if len(rest) else []
            held = len(rest)

        for i in order:
            if emitted >= steps:
                return
            chunk = self._chunk(int(i))
            window.append(chunk)
            held += len(chunk[1])
            self.max_window_rows = max(self.max_window_rows, held)
            if held >= self.buffer_rows:
                yield from drain(final=False)
        if window and emitted < steps:
            yield from drain(final=True)

    def sequential_batches(self, chunk: int = 4096) -> int:
        """How many batches :meth:`sequential` gives, without reading them."""
        return sum(-(-int(n) // chunk) for n in self.chunks)

    def sequential(self, chunk: int = 4096) -> Iterator[tuple]:
        """Every row once, in file order, at most ``chunk`` rows at a time (validation)."""
        for i in range(len(self.chunks)):
            x, y, w = self._chunk(i)
            for start in range(0, len(y), chunk):
                yield x[start:start + chunk], y[start:start + chunk], w[start:start + chunk]

    def close(self) -> None:
        self._reader = None
        if self._file is not None:
            self._file.close()
            self._file = None


class Prefetch:
    """Runs an iterator in a background thread, ``depth`` items ahead (reading and
    shuffling the next batches while the current step computes); re-raises its errors.
    ``convert`` is applied to each item in that thread (the rank turns numpy batches into
    tensors there: a step called with tensors dispatches faster than with numpy)."""

    _END = object()

    def __init__(self, items: Iterator, depth: int = 3, convert=None):
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._stop = threading.Event()
        if convert is not None:
            items = (convert(item) for item in items)
        self._thread = threading.Thread(target=self._run, args=(items,), name="sparkdeep-prefetch", daemon=True)
        self._thread.start()

    def _run(self, items) -> None:
        try:
            for item in items:
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._error = exc
        while not self._stop.is_set():
            try:
                self._q.put(self._END, timeout=0.5)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            self._thread.join()
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()
