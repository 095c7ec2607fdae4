"""Run a function on N Horovod ranks that Spark launches, with errors that name the rank.

``horovod.spark.run`` turns N Spark tasks into N Horovod processes (Gloo rendezvous on
the driver). When a rank raises, Horovod only reports that "one or more processes
exited with non-zero status"; :func:`run_on_ranks` wraps the function so a failing rank
prints one marker line with its rank and message, captures the ranks' forwarded
output, and raises :class:`RankFailedError` naming the rank and its error. Horovod ends
the surviving ranks when one exits.

A rank that stops without exiting (frozen by SIGSTOP, swapped out, its host unreachable)
would leave the driver waiting forever: Gloo times out the other ranks, but Horovod keeps
waiting for the frozen process. So each rank sends a heartbeat every few seconds from a
thread of its own (it beats while training, all-reducing or waiting) over TCP to a small
listener on the driver (Horovod forwards rank output in blocks, too late to time); the
driver watches them, and a rank silent for ``stall_timeout`` seconds ends the run with a
:class:`RankFailedError` naming it. Its Spark job group is cancelled, which makes
Horovod's task service terminate every rank process (SIGKILL after a grace period, which
also ends a stopped process).
"""
from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
import traceback
from typing import Any, Callable, Sequence

_MARKER = "SPARKDEEP-RANK-FAILED"
_BEAT_ENV = "SPARKDEEP_HEARTBEAT"  # "host:port:token:interval_s", set for the ranks
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


class _Heartbeats:
    """The driver's listener: one short TCP line ``token rank pid`` per beat; ``beats``
    maps rank -> (monotonic time of the last beat, pid). Lines without the run's random
    token are ignored."""

    def __init__(self, host: str):
        import secrets
        import socketserver

        self.token = secrets.token_hex(8)
        self.beats: dict = {}
        beats, token = self.beats, self.token

        class Handler(socketserver.StreamRequestHandler):
            timeout = 5

            def handle(self):
                try:
                    words = self.rfile.readline(100).decode("ascii", "replace").split()
                except OSError:
                    return
                if len(words) == 3 and words[0] == token and words[1].isdigit() and words[2].isdigit():
                    beats[int(words[1])] = (time.monotonic(), int(words[2]))

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("0.0.0.0", 0), Handler)
        self.address = f"{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="sparkdeep-heartbeats", daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _heartbeat(rank: str, setting: str) -> None:
    """A daemon thread of the rank: a beat to the driver every few seconds while the
    process runs (a frozen process sends none)."""
    import socket
    host, port, token, interval = setting.rsplit(":", 3)

    def beat():
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=float(interval)) as conn:
                    conn.sendall(f"{token} {rank} {os.getpid()}\n".encode())
            except OSError:
                pass  # the driver notices the silence
            time.sleep(float(interval))
    threading.Thread(target=beat, name="sparkdeep-heartbeat", daemon=True).start()


def _rank_entry(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Runs inside each rank process: beat, call ``fn``, announce a failure before dying."""
    import os
    rank = os.environ.get("HOROVOD_RANK", "?")
    if os.environ.get(_BEAT_ENV):
        _heartbeat(rank, os.environ[_BEAT_ENV])
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
                 num_proc: int, start_timeout: int = 120, stall_timeout: float = 120.0,
                 env: dict | None = None, verbose: int = 1, stdout=None, stderr=None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` Horovod ranks; return results by rank.

    ``fn`` must be a module-level function that the ranks can import: from an installed
    package, or from the archives shipped with ``--py-files`` (put on the ranks' path).
    ``stall_timeout``: seconds without a heartbeat from a started rank before the run is
    ended with an error naming it (0 = no watchdog).

    Raises
    ------
    RankFailedError
        A rank raised, exited, or stalled; the error names the lowest failing rank and why.
    """
    import horovod.spark
    from horovod.spark.driver import job_id

    if stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 seconds, got {stall_timeout}")
    # Ranks start from the executor's environment; forward the driver's settings that
    # steer training (ours, Horovod's, TensorFlow's, NCCL's), plus any ``env`` given.
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)}
    forwarded.update(env or {})
    out = _Tee(stdout or sys.stdout)
    err = _Tee(stderr or sys.stderr)
    listener = None
    if stall_timeout:
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
        host = sc.getConf().get("spark.driver.host", "127.0.0.1") if sc is not None else "127.0.0.1"
        listener = _Heartbeats(host)
        interval = min(10.0, stall_timeout / 4)
        forwarded[_BEAT_ENV] = f"{listener.address}:{listener.token}:{interval:g}"
    target = f"{fn.__module__}:{fn.__qualname__}"

    # Horovod blocks the caller until every rank process has ended (and needs the main
    # thread for its signal handlers), so the watchdog runs beside it: on a stall it
    # cancels the run's Spark jobs, which ends the rank processes and so Horovod's wait.
    first_job = job_id.JOB_ID + 1
    stall: dict = {}
    done = threading.Event()

    def watch():
        while not done.wait(1.0):
            found = _stalled(listener.beats, stall_timeout)
            if found is not None:
                stall["found"] = found
                _cancel_ranks(first_job)
                return

    if stall_timeout:
        threading.Thread(target=watch, name="sparkdeep-rank-watchdog", daemon=True).start()
    try:
        return horovod.spark.run(_bootstrap(), args=(_shipped_files(), target, tuple(args), dict(kwargs or {})),
                                 num_proc=num_proc, start_timeout=start_timeout,
                                 use_gloo=True, env=forwarded, verbose=verbose,
                                 stdout=out, stderr=err)
    except Exception as exc:
        if "found" in stall:
            rank, silent_s, pid = stall["found"]
            raise RankFailedError(rank, f"stalled: no heartbeat for {silent_s:.0f} s (process {pid}; stall "
                                        f"timeout {stall_timeout:g} s): frozen, swapped out, or its host is "
                                        "unreachable. The run was cancelled and its rank processes "
                                        "ended") from exc
        _explain(exc, err.failures + out.failures, num_proc)
        raise  # pragma: no cover - _explain always raises
    finally:
        done.set()
        if listener is not None:
            listener.close()


def _stalled(beats: dict, timeout: float):
    """(rank, seconds silent, pid) of the rank silent longest past ``timeout``, or None."""
    now = time.monotonic()
    late = [(now - seen, rank, pid) for rank, (seen, pid) in list(beats.items()) if now - seen > timeout]
    if not late:
        return None
    silent_s, rank, pid = max(late)
    return rank, silent_s, pid


def _cancel_ranks(first_job: int) -> None:
    """Cancel the Spark job groups of this run (Horovod names them horovod.spark.run.<n>)."""
    from horovod.spark.driver import job_id
    from pyspark import SparkContext
    sc = SparkContext._active_spark_context
    if sc is None:
        return
    for n in range(first_job, job_id.JOB_ID + 1):
        sc.cancelJobGroup(f"horovod.spark.run.{n}")


def _explain(exc: BaseException, failures: list, num_proc: int) -> None:
    """Raise the RankFailedError that names the rank behind Horovod's ``exc``."""
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
