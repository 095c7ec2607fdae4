"""Run a function on N Horovod ranks that Spark launches, with errors that name the rank.

``horovod.spark.run`` turns N Spark tasks into N Horovod processes (Gloo rendezvous on
the driver). When a rank raises, Horovod only reports that "one or more processes
exited with non-zero status"; :func:`run_on_ranks` wraps the function so a failing rank
prints one marker line with its rank and message, captures the ranks' forwarded
output, and raises :class:`RankFailedError` naming the rank and its error. Horovod ends
the surviving ranks when one exits, so a failure cannot hang the driver.
"""
from __future__ import annotations

import io
import os
import re
import sys
import threading
import traceback
from typing import Any, Callable, Sequence

_MARKER = "SPARKDEEP-RANK-FAILED"
_FORWARD_PREFIXES = ("SPARKDEEP_", "HOROVOD_", "TF_", "NCCL_", "KERAS_")
_MARKER_RE = re.compile(_MARKER + r" rank=(\d+) error=(.*)")


class RankFailedError(RuntimeError):
    """A Horovod rank raised; ``rank`` and ``message`` say which and why."""

    def __init__(self, rank: int | None, message: str):
        self.rank = rank
        self.message = message
        who = f"Horovod rank {rank}" if rank is not None else "A Horovod rank"
        super().__init__(f"{who} failed: {message}")


class _Tee(io.TextIOBase):
    """Forwards rank output to a stream and remembers the failure markers in it."""

    def __init__(self, target):
        self._target = target
        self._lock = threading.Lock()
        self.failures: list[tuple[int, str]] = []

    def write(self, text: str) -> int:
        with self._lock:
            for match in _MARKER_RE.finditer(text):
                self.failures.append((int(match.group(1)), match.group(2).strip()))
            try:
                self._target.write(text)
                self._target.flush()
            except Exception:  # a closed notebook stream must not kill training
                pass
        return len(text)

    def flush(self) -> None:
        pass


def _rank_entry(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Runs inside each rank process: call ``fn``, announce a failure before dying."""
    import os
    rank = os.environ.get("HOROVOD_RANK", "?")
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported, then re-raised
        message = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
        traceback.print_exc(file=sys.stderr)
        print(f"{_MARKER} rank={rank} error={message}", file=sys.stderr, flush=True)
        raise


# Errors a rank raises only because another rank left the ring first.
_COLLATERAL = ("Horovod has been shut down", "HorovodAllreduce", "HorovodBroadcast",
               "HorovodAllgather", "Gloo", "gloo", "connection closed by peer")


def _is_collateral(message: str) -> bool:
    return any(marker in message for marker in _COLLATERAL)


def _root_cause(failures: list[tuple[int, str]]) -> tuple[int, str]:
    """The first failure, in arrival order, that is not a consequence of another."""
    for rank, message in failures:
        if not _is_collateral(message):
            return rank, message
    return failures[0]


def _shipped_files() -> list[str]:
    """Names of the --py-files / addPyFile archives: on executors they sit in the working directory."""
    from pyspark import SparkContext
    sc = SparkContext._active_spark_context
    return [os.path.basename(p) for p in getattr(sc, "_python_includes", None) or []]


def _bootstrap() -> Callable:
    """The function Horovod ships to the ranks, pickled by value (a closure), not by reference.

    Rank processes are started by Horovod from a Spark task, but not as Spark's Python
    worker, so they do not get the --py-files archives on ``sys.path``. Unpickling a
    reference to this package would fail on a cluster where it is only shipped, not
    installed; this closure needs nothing but the standard library to put the shipped
    archives (in the executor's working directory, the rank's too) on ``sys.path`` first.
    """
    def boot(shipped, target, args, kwargs):
        import importlib
        import os as _os
        import sys as _sys
        for name in reversed(shipped):
            path = _os.path.abspath(name)
            if _os.path.exists(path) and path not in _sys.path:
                _sys.path.insert(0, path)
        module, _, attr = target.partition(":")
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
        return importlib.import_module("sparkdeep.distributed")._rank_entry(fn, args, kwargs)
    return boot


def run_on_ranks(fn: Callable, args: Sequence = (), kwargs: dict | None = None, *,
                 num_proc: int, start_timeout: int = 120, env: dict | None = None,
                 verbose: int = 1, stdout=None, stderr=None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` Horovod ranks; return results by rank.

    ``fn`` must be a module-level function that the ranks can import: from an installed
    package, or from the archives shipped with ``--py-files`` (put on the ranks' path).

    Raises
    ------
    RankFailedError
        A rank raised or exited; the error names the lowest failing rank and its message.
    """
    import horovod.spark

    # Ranks start from the executor's environment; forward the driver's settings that
    # steer training (ours, Horovod's, TensorFlow's, NCCL's), plus any ``env`` given.
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)}
    forwarded.update(env or {})
    out = _Tee(stdout or sys.stdout)
    err = _Tee(stderr or sys.stderr)
    target = f"{fn.__module__}:{fn.__qualname__}"
    try:
        return horovod.spark.run(_bootstrap(), args=(_shipped_files(), target, tuple(args), dict(kwargs or {})),
                                 num_proc=num_proc, start_timeout=start_timeout,
                                 use_gloo=True, env=forwarded, verbose=verbose,
                                 stdout=out, stderr=err)
    except Exception as exc:
        failures = err.failures + out.failures
        exited = re.search(r"Process name: (\d+)\s+Exit code: (-?\d+)", str(exc))
        marked = {r for r, _ in failures}
        silent = sorted(set(range(num_proc)) - marked)
        if failures and silent and all(_is_collateral(m) for _, m in failures):
            # Every error we saw is a consequence of a rank leaving the ring, and some
            # rank left no Python error at all: it was killed or exited hard.
            rank = silent[0]
            code = exited.group(2) if exited and int(exited.group(1)) == rank else "unknown"
            raise RankFailedError(rank, f"process exited (code {code}) without a Python exception "
                                        "(killed, out of memory, or os._exit)") from exc
        if failures:
            rank, message = _root_cause(failures)
            others = sorted({r for r, _ in failures if r != rank})
            if others:
                message += f" (then rank(s) {', '.join(map(str, others))} stopped too)"
            raise RankFailedError(rank, message) from exc
        match = re.search(r"Process name: (\d+)", str(exc))
        rank = int(match.group(1)) if match else None
        raise RankFailedError(rank, str(exc).strip().splitlines()[0] if str(exc).strip()
                              else type(exc).__name__) from exc
