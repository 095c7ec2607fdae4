"""One training rank as a process: ``python -m sparkdeep._rank_process WORKDIR``.

Started by its Spark barrier task (:func:`sparkdeep.distributed._rank_task`), which wrote
``WORKDIR/call.pkl`` (the function and its arguments, pickled on this run's driver) and
set its variables (``SPARKDEEP_RANK``, and its backend's: Horovod's or ``TF_CONFIG``). Beats to the driver while it runs; writes ``result.pkl``, or on
an exception ``failure.txt`` and exits 1. The exception's one line (its type, message and
the frame in the user's code, :func:`sparkdeep.errors.error_line`) goes to the driver with
the full traceback, which the driver shows on request (a job's ``--traceback``); on the
rank's standard error (the Spark task's log, in local mode the console) only when the
driver could not be told.

:func:`start` starts it. Where it can, it forks the task's own Python worker once that has
imported what the rank will (``preload``, e.g. TensorFlow: 4.3 s of CPU per process,
measured), so a rank reuses a worker's earlier import instead of paying it again; the fork
is refused, and a new interpreter started instead, when the worker is not in a state a fork
may copy (a thread other than its own, TensorFlow's runtime already started in it, a
native thread that was not there after its first preload) or when ``SPARKDEEP_RANK_START``
is ``exec`` (in the rank's environment: the driver's is forwarded). Either way the rank is the task's child and dies with it (``PR_SET_PDEATHSIG``).
A forked rank's command line is its worker's; its name (``ps -o comm``) is ``sparkdeep-rank``.
"""
from __future__ import annotations

import atexit
import importlib
import io
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from typing import Sequence

_STARTED = time.time()  # before any import of ours: the interpreter's own start is the gap before it

#: ``exec``: every rank a new interpreter (``python -m sparkdeep._rank_process``), never a fork.
START_ENV = "SPARKDEEP_RANK_START"
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15
_after_preload: int | None = None  # this worker's native threads right after its first preload


def main(work: str) -> int:
    from sparkdeep.channel import _BEAT_ENV, FAST_EXIT_ENV, PROCESS_START_ENV, RANK_ENV, heartbeat, send_failure
    from sparkdeep.errors import error_line
    from sparkdeep.logs import install_default

    install_default()  # the rank's lines (epochs, early stop) reach the task's console like a job's

    os.environ[PROCESS_START_ENV] = repr(_STARTED)
    rank = os.environ.get(RANK_ENV, "?")
    setting = os.environ.get(_BEAT_ENV, "")
    if setting:
        heartbeat(rank, setting)
    import cloudpickle
    try:
        with open(os.path.join(work, "call.pkl"), "rb") as fh:
            fn, args, kwargs = cloudpickle.load(fh)
        result = fn(*args, **kwargs)
        data = cloudpickle.dumps(result)
    except BaseException as exc:  # noqa: BLE001 - reported, then the process exits 1
        message = error_line(exc, whole=True, where=True)
        details = "".join(traceback.format_exception(exc))
        with open(os.path.join(work, "failure.txt"), "w") as fh:
            fh.write(message)
        told = False
        if setting:
            try:
                send_failure(setting, rank, message, details)
                told = True
            except OSError:
                pass  # the task still reports failure.txt with the stage
        if not told:
            sys.stderr.write(details)  # kept in the task's log
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # no atexit hooks: a backend's shutdown may block on a peer that is gone
    with open(os.path.join(work, "result.pkl.tmp"), "wb") as fh:
        fh.write(data)
    os.replace(os.path.join(work, "result.pkl.tmp"), os.path.join(work, "result.pkl"))
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get(FAST_EXIT_ENV) == "1":
        # The rank's backend has shut down with its peers (the strategy said so): nothing left
        # for the interpreter's teardown of TensorFlow to do but spend 1-2 s (measured).
        os._exit(0)
    return 0


def _prctl(option: int, value) -> None:
    """Linux's ``prctl``; nothing elsewhere (the task kill still ends the stage there)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value)
    except Exception:  # noqa: BLE001 - not Linux
        pass


def die_with_parent() -> None:
    """In a new child: SIGKILL when the process that started it dies (Linux)."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def start(work: str, env: dict, preload: Sequence[str] = ()):
    """Start the rank whose call is in ``work`` with ``env`` as its whole environment; return
    a handle with ``pid``, ``stdout`` and ``stderr`` (pipes, bytes), ``poll()``, ``wait()``
    and ``kill()`` (a :class:`subprocess.Popen`, or the same for a forked rank)."""
    if _may_fork(preload, env):
        return _Forked(work, env)
    return subprocess.Popen([sys.executable, "-m", "sparkdeep._rank_process", work], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent)


def _native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _may_fork(preload: Sequence[str], env: dict) -> bool:
    """Whether this process may be forked into a rank that runs with ``env``, after
    importing ``preload``."""
    global _after_preload
    if env.get(START_ENV) == "exec" or not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        return False  # a Python thread of ours or a library's: the child would hold its locks unowned
    try:
        for name in preload:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the new interpreter's own import reports it, as before
        return False
    if "tensorflow" in sys.modules:
        from tensorflow.python.eager import context
        ctx = context.context_safe()
        if ctx is not None and getattr(ctx, "_context_handle", None) is not None:
            return False  # its thread pools exist in this process only: a child would wait on them forever
    threads = _native_threads()
    if _after_preload is None:
        _after_preload = threads
    return threads <= _after_preload


class _Forked:
    """A rank forked from this process: the part of :class:`subprocess.Popen` the rank task uses."""

    def __init__(self, work: str, env: dict):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:  # the rank
            os.close(out_r)
            os.close(err_r)
            _become_rank(work, env, parent, out_w, err_w)  # never returns
        os.close(out_w)
        os.close(err_w)
        self.pid, self.returncode = pid, None
        self.stdout, self.stderr = os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _become_rank(work: str, env: dict, parent: int, out_w: int, err_w: int) -> None:
    """In the forked child: the state a new ``python -m sparkdeep._rank_process`` would
    start in (its environment, standard streams, signals, random seeds), then :func:`main`."""
    global _STARTED
    code = 1
    try:
        _STARTED = time.time()
        die_with_parent()
        if os.getppid() != parent:
            os._exit(1)  # the task died between the fork and the line above
        _prctl(_PR_SET_NAME, b"sparkdeep-rank")  # the name ps shows
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (null, out_w, err_w):
            os.close(fd)
        for name in os.listdir("/proc/self/fd"):  # the worker's connections to its JVM are not the rank's
            fd = int(name)
            try:
                if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.close(fd)
            except OSError:
                pass
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [os.path.abspath(__file__), work]
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # the worker's global stream is not this rank's
        code = main(work)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - main reports its own errors; this is the fork's
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
