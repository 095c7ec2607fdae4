"""Run a function on N ranks launched as one Spark barrier stage.

:func:`run_on_ranks` runs one **barrier** Spark stage of ``num_proc`` tasks (``mapInArrow(..., barrier=True)`` over the
repartitioned ``data``, or a barrier RDD when there is none). Each task:

1. receives its own partition as Arrow batches and spills it, as it arrives, to the
   task's local disk (a ``spill`` object decides the format: :class:`ShardSpill` for
   training), so no copy of the data passes through a folder every executor must see;
2. learns every task's row counts, host (and, for TensorFlow, a free port) with one
   ``join`` round trip to the driver's channel (nothing is read twice; no Spark barrier
   call, each of which polls once a second); task 0's join carries the host plan, which
   the rendezvous holds before any task gets its answer;
3. starts the rank as a child process (:func:`sparkdeep._rank_process.start`: a fork of the
   task's worker once it has imported ``preload``, or ``python -m sparkdeep._rank_process``) with
   ``SPARKDEEP_RANK``/``SPARKDEEP_SIZE`` (rank = partition id), the variables of its
   ``backend``, the Spark-assigned GPUs, and the shipped code on its path; the child dies
   with the task (``PR_SET_PDEATHSIG``), so a killed task leaves no rank;
4. hands the child's pickled result to the driver through the channel, streamed from the
   task's disk (a result can be a network of gigabytes, more than a Spark task result
   carries), and returns one Arrow row saying it finished.

This module is the launcher: the barrier stage, the rank task, the watch loop and the
explanation of a failure. How the ranks find each other under each backend (``backend=``:
``horovod``, Gloo rendezvous and ``HOROVOD_*``; ``tensorflow``, ``TF_CONFIG`` and no Horovod
import anywhere) is :mod:`sparkdeep.backends`; the channel the tasks and ranks speak to the
driver (join, heartbeats, output, errors, files) and the variables a rank is started with
are :mod:`sparkdeep.channel`.

Failures end the run with a :class:`RankFailedError` naming the rank, never a hang:

- a rank that raises sends its error to the driver (a small TCP channel) as one line (type,
  message, and the frame in the user's code: :func:`sparkdeep.errors.error_line`) with its
  full traceback (the error's ``details``), a rank that exits without an exception is
  reported by its task with the exit code; Spark then kills the stage's other tasks
  (barrier semantics), and their ranks with them;
- each rank sends a heartbeat every few seconds from a thread of its own; a rank silent for
  ``stall_timeout`` seconds (frozen, swapped out, its host unreachable) makes the driver
  cancel the stage's job (by job tag), which kills every task and rank; when a collective
  fails first, the driver still names a rank whose heartbeats stopped, not the peer whose
  collective timed out waiting for it;
- a barrier result stage is not retried by Spark; a task attempt after the first (a
  speculative or retried copy) refuses to start a second copy of its rank.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import uuid
from typing import Callable, Sequence

from sparkdeep import _rank_process
from sparkdeep.backends import (BACKENDS, TIMEOUT_ENV, _free_ports, backend_env, collective_timeout, host_plan,
                                rendezvous_for)
from sparkdeep.channel import (_BEAT_ENV, DEVICES_ENV, LAUNCH_TIMES_ENV, RANK_DATA_ENV, RANK_ENV, SIZE_ENV, _Channel,
                               _Lines, join, send, send_result)

# The channel and the backends' environments were split out of this module: their names
# that callers import from here still resolve.
from sparkdeep.backends import _free_port, _interface_for, tf_config  # noqa: F401 - moved; importable here as before
from sparkdeep.channel import (  # noqa: F401 - moved; importable here as before
    _TRACE_CHARS, FAST_EXIT_ENV, PROCESS_START_ENV, _address_and_line, heartbeat, put, send_failure)

_FORWARD_PREFIXES = ("SPARKDEEP_", "HOROVOD_", "TF_", "NCCL_", "KERAS_")


class RankFailedError(RuntimeError):
    """A rank raised, exited or stalled; ``rank`` and ``message`` (one line) say which and
    why; ``details`` is the rank's own Python traceback when it raised (else "")."""

    def __init__(self, rank: int | None, message: str, details: str = ""):
        self.rank = rank
        self.message = message
        self.details = details
        who = f"Training rank {rank}" if rank is not None else "A training rank"
        super().__init__(f"{who} failed: {message}")


# Errors a rank raises only because another rank left the ring first.
_COLLATERAL = ("Horovod has been shut down", "HorovodAllreduce", "HorovodBroadcast",
               "HorovodAllgather", "Gloo", "gloo", "connection closed by peer", "Connection reset by peer",
               # TensorFlow's collectives and coordination service, when a peer went away
               "UnavailableError", "Collective ops is aborted", "CancelledError", "DeadlineExceededError",
               "Socket closed", "failed to connect to all addresses", "heartbeat timeout",
               "The coordination service", "coordination service has stopped")


def _is_collateral(message: str) -> bool:
    return any(marker in message for marker in _COLLATERAL)


def _root_cause(failures: list[tuple[int, str]]) -> tuple[int, str]:
    """The first failure, in arrival order, that is not a consequence of another."""
    for rank, message in failures:
        if not _is_collateral(message):
            return rank, message
    return failures[0]


def read_shard_counts(folder: str) -> list:
    """Every rank's spilled row counts (by part), as gathered by the launcher."""
    with open(os.path.join(folder, "ranks.json")) as fh:
        return json.load(fh)["counts"]


def _sweep(root: str | None) -> None:
    """Remove rank folders whose task's Python worker is gone (killed with its stage, so its
    own clean-up never ran): each folder names its owner's pid in ``owner.pid``."""
    import glob
    import shutil
    import tempfile
    for folder in glob.glob(os.path.join(root or tempfile.gettempdir(), "sparkdeep-rank*-*")):
        try:
            with open(os.path.join(folder, "owner.pid")) as fh:
                os.kill(int(fh.read().strip()), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):
            continue  # not ours to judge (no pid file yet, another user's process)


def _rank_task(batches, conf: dict, payload: bytes):
    """One barrier task: spill the partition, agree on the plan, run the rank as a child."""
    import shutil
    import tempfile

    from pyspark import BarrierTaskContext
    t_task = time.time()
    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    setting = conf["channel"]
    if ctx.attemptNumber() > 0:
        raise RuntimeError(f"rank {rank}: task attempt {ctx.attemptNumber()} refused: a rank is never started "
                           "twice (the first attempt failed; see its error)")
    roots = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d and os.path.isdir(d)]
    _sweep(roots[0] if roots else None)
    work = tempfile.mkdtemp(prefix=f"sparkdeep-rank{rank}-", dir=roots[0] if roots else None)
    with open(os.path.join(work, "owner.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    child = None
    lines = _Lines(setting, rank)
    try:
        data = os.path.join(work, "data")
        os.makedirs(data)
        counts, t_spilled = _spill(batches, conf, data, rank) if batches is not None else ({}, t_task)
        plan, ports = _agree(ctx, conf, batches is not None, counts, data, rank)
        env = {**os.environ, **conf["env"], **backend_env(conf["backend"], conf, plan, ports, rank),
               RANK_ENV: str(rank), SIZE_ENV: str(len(plan)), TIMEOUT_ENV: f"{conf['collective_timeout']:g}",
               RANK_DATA_ENV: data, _BEAT_ENV: setting, "PYTHONUNBUFFERED": "1",
               LAUNCH_TIMES_ENV: json.dumps({"task_start": t_task, "spilled": t_spilled, "spawn": time.time()}),
               # The shipped --py-files archives are on this worker's path, not on a new process's.
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        gpus = ctx.resources().get("gpu")
        if gpus is not None and gpus.addresses:
            env["CUDA_VISIBLE_DEVICES"] = env[DEVICES_ENV] = ",".join(gpus.addresses)
        with open(os.path.join(work, "call.pkl"), "wb") as fh:
            fh.write(payload)
        child = _rank_process.start(work, env, conf.get("preload", ()))
        code, tail = _relay(child, lines)
        lines.send("done", "")
        if code != 0:
            raise RuntimeError(f"Training rank {rank} failed: {_exit_message(work, code, tail, setting, rank)}")
        send_result(setting, rank, os.path.join(work, "result.pkl"))
        return rank, b""  # the result itself went through the channel
    finally:
        lines.close()
        if child is not None and child.poll() is None:
            child.kill()
        shutil.rmtree(work, ignore_errors=True)


def _spill(batches, conf: dict, data: str, rank: int) -> tuple[dict, float]:
    """Write the task's partition into ``data`` with the run's spill; (its counts, when done).
    A failure is told to the driver first, so the run names this rank."""
    try:
        spill = conf["spill"].open(data)
        for batch in batches:
            spill.write(batch)
        return spill.close(), time.time()
    except BaseException as exc:
        try:
            send(conf["channel"], "fail", rank, f"spilling its partition: {type(exc).__name__}: {exc}")
        except OSError:
            pass  # the stage's own error still names the task
        raise


def _agree(ctx, conf: dict, has_data: bool, counts: dict, data: str, rank: int) -> tuple[list, list]:
    """Every task's counts and ports through one join on the driver's channel (task 0's
    carries the host plan, which the rendezvous holds once this returns); the counts go to
    ``data/ranks.json``. (the plan, every task's ports). Unusable shards are found here,
    before any rank starts (no TensorFlow import, no rendezvous): the rank concerned reports
    why, the others stop without blaming themselves."""
    setting = conf["channel"]
    hosts = [t.address.rsplit(":", 1)[0] for t in ctx.getTaskInfos()]
    wanted = {"tensorflow": 1, "tensorflow_ps": 2}.get(conf["backend"], 0)  # worker (and ps) servers
    plan = host_plan(hosts)
    shared = join(setting, rank, {"counts": counts, "ports": _free_ports(wanted),
                                  "plan": plan if rank == 0 else None})
    gathered, ports = [g["counts"] for g in shared], [g["ports"] for g in shared]
    with open(os.path.join(data, "ranks.json"), "w") as fh:
        json.dump({"counts": gathered, "hosts": hosts}, fh)
    check = getattr(conf["spill"], "problem", None) if has_data else None
    problems = [check(gathered, r) for r in range(len(gathered))] if check else []
    if problems and problems[rank]:
        send(setting, "fail", rank, problems[rank])
        raise RuntimeError(f"Training rank {rank} failed: {problems[rank]}")
    if any(problems):
        raise RuntimeError(f"rank {rank} not started: {next(p for p in problems if p)}")
    return plan, ports


def _relay(child, lines: _Lines) -> tuple[int, list]:
    """The rank's standard output to the driver line by line and its standard error to the
    task's, until it exits; (its exit code, its last lines of standard error)."""
    from collections import deque
    tail: deque = deque(maxlen=40)

    def pump_out():
        for raw in child.stdout:
            lines.send("log", raw.decode("utf-8", "replace").rstrip("\n"))

    def pump_err():
        for raw in child.stderr:
            line = raw.decode("utf-8", "replace")
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
    pumps = [threading.Thread(target=f, daemon=True) for f in (pump_out, pump_err)]
    for t in pumps:
        t.start()
    code = child.wait()
    for t in pumps:
        t.join(timeout=10)
    return code, list(tail)


def _exit_message(work: str, code: int, tail: list, setting: str, rank: int) -> str:
    """Why a rank exited ``code``: its own ``failure.txt`` (already sent to the driver), or
    the exit code and its last output, which is sent here."""
    failure = os.path.join(work, "failure.txt")
    if os.path.isfile(failure):
        with open(failure) as fh:
            return fh.read().strip()
    message = (f"process exited (code {code}) without a Python exception (killed, out of memory, or "
               f"os._exit); its last output: {' | '.join(tail[-5:])}")
    send(setting, "fail", rank, message)
    return message


def run_on_ranks(fn: Callable, args: Sequence = (), kwargs: dict | None = None, *,
                 num_proc: int, data=None, spill=None, stall_timeout: float = 120.0,
                 env: dict | None = None, stdout=None,
                 on_put: Callable[[int, str, bytes], None] | None = None,
                 on_get: Callable[[int, str], bytes] | None = None, backend: str = "horovod",
                 shuffle_seed: int | None = None, preload: Sequence[str] = ()) -> list:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks; return results by rank.

    ``data`` (a DataFrame), when given, is repartitioned into ``num_proc`` partitions and
    rank r receives partition r, written by ``spill`` (an object with ``open(folder)``,
    ``write(arrow_batch)`` and ``close() -> counts``) to the task's local disk; the rank
    finds it in the folder named by ``$SPARKDEEP_RANK_DATA``, with every rank's counts
    (:func:`read_shard_counts`). ``fn`` is pickled by value or by reference (cloudpickle);
    the ranks run with the driver's code path, including ``--py-files`` archives.
    ``stall_timeout``: seconds without a heartbeat from a started rank before the run is
    ended with an error naming it (0 = no watchdog). ``on_put(rank, name, data)``: called on
    the driver (a thread of its own) for each :func:`put` of a rank; what it raises is
    raised in that rank. ``on_get(rank, what)``: called on the driver for each
    :func:`sparkdeep.channel.get` of a rank, returns the bytes the rank gets (what it raises,
    the rank raises). ``stdout``: a stream for the ranks' output lines (default: the
    ``sparkdeep.distributed`` logger, at INFO). ``backend``: how the ranks find each other,
    ``'horovod'`` (Gloo rendezvous, ``HOROVOD_*``) or ``'tensorflow'`` (``TF_CONFIG``; no
    Horovod import on the driver or in the ranks). ``shuffle_seed``: each partition's rows
    in a seeded random order, so a rank's shard is spilled shuffled: rows that arrive in
    runs (a table sorted by a column, copies of a repeated row, which the repartition's
    local sort puts side by side) do not stay in runs a streamed window cannot mix.
    ``preload``: modules every rank imports (``("tensorflow",)``); a task's Python worker
    imports them once and is forked into each rank it starts, which then need not.

    Raises
    ------
    RankFailedError
        A rank raised, exited, or stalled; the error names the rank and why in one line
        (``message``: a raising rank's error and the frame of the user's code it came from),
        a raising rank's own traceback in ``details``.
    """
    import cloudpickle
    from pyspark import SparkContext

    _check_launch(backend, stall_timeout, num_proc, data, spill)
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("run_on_ranks needs an active SparkContext")
    host = sc.getConf().get("spark.driver.host", "127.0.0.1")
    out = stdout  # None: the ranks' lines go to this module's logger
    rendezvous, on_plan = rendezvous_for(backend)
    channel = _Channel(host, on_plan, out, on_put, size=num_proc, on_get=on_get)
    port = rendezvous.start() if rendezvous is not None else 0
    interval = min(10.0, stall_timeout / 4) if stall_timeout else 10.0
    conf = {"channel": f"{channel.address}:{channel.token}:{interval:g}", "rendezvous": (host, port),
            "env": _forwarded(env), "spill": spill, "backend": backend,
            "collective_timeout": collective_timeout(stall_timeout), "preload": tuple(preload)}
    shipped = sc.broadcast(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))))
    tag = f"sparkdeep-ranks-{uuid.uuid4().hex[:12]}"
    stall: dict = {}
    done = threading.Event()

    def watch():
        while not done.wait(1.0):
            found = _stalled(channel.beats, stall_timeout)
            if found is not None:
                stall["found"] = found
                sc.cancelJobsWithTag(tag)
                return

    if stall_timeout:
        threading.Thread(target=watch, name="sparkdeep-rank-watchdog", daemon=True).start()
    sc.addJobTag(tag)
    sc.setInterruptOnCancel(True)
    try:
        ranks = _barrier_stage(sc, conf, shipped, num_proc, data, shuffle_seed)
        return [_result_of(channel, rank) for rank in sorted(ranks)]
    except Exception as exc:
        if "found" in stall:
            rank, silent_s, pid = stall["found"]
            raise RankFailedError(rank, f"stalled: no heartbeat for {silent_s:.0f} s (process {pid}; stall "
                                        f"timeout {stall_timeout:g} s): frozen, swapped out, or its host is "
                                        "unreachable. The run was cancelled and its rank processes "
                                        "ended") from exc
        _explain(exc, channel, silent_after=2.5 * interval)
        raise  # pragma: no cover - _explain always raises
    finally:
        done.set()
        sc.removeJobTag(tag)
        sc.setInterruptOnCancel(False)  # Spark's default, for this thread's later jobs
        channel.close()
        if rendezvous is not None:
            rendezvous.stop()
        shipped.destroy()


def _check_launch(backend: str, stall_timeout: float, num_proc: int, data, spill) -> None:
    """:func:`run_on_ranks`'s arguments, checked on the driver before anything starts."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 seconds, got {stall_timeout}")
    if num_proc < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    if data is not None and spill is None:
        raise ValueError("run_on_ranks: data needs a spill (how a task writes its partition)")


def _forwarded(env: dict | None) -> dict:
    """What the ranks get of the driver's environment: ranks start from the executor's, so
    the settings that steer training (ours, Horovod's, TensorFlow's, NCCL's) are forwarded,
    plus any ``env`` given."""
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)
                 and k not in (_BEAT_ENV, RANK_DATA_ENV, DEVICES_ENV)}
    forwarded.update(env or {})
    return forwarded


def _barrier_stage(sc, conf: dict, shipped, num_proc: int, data, shuffle_seed: int | None) -> list[int]:
    """The ranks' barrier stage, one task per rank (over ``data`` repartitioned ``num_proc``
    ways, or over nothing); the ranks whose tasks finished."""
    if data is None:
        def run_task(_):
            yield _rank_task(None, conf, shipped.value)
        return [r[0] for r in sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(run_task).collect()]
    import pyarrow as pa
    schema = pa.schema([("rank", pa.int32()), ("result", pa.binary())])

    def run_arrow(batches):
        rank, result = _rank_task(batches, conf, shipped.value)
        yield pa.RecordBatch.from_arrays([pa.array([rank], pa.int32()), pa.array([result], pa.binary())],
                                         schema=schema)
    parts = data.repartition(num_proc)
    if shuffle_seed is not None:
        from pyspark.sql import functions as F
        parts = parts.sortWithinPartitions(F.rand(int(shuffle_seed)))
    return [r["rank"] for r in parts.mapInArrow(run_arrow, "rank int, result binary", barrier=True).collect()]


def _result_of(channel: _Channel, rank: int):
    """Rank ``rank``'s result, unpickled, from what its task sent the channel (dropped from it)."""
    import cloudpickle
    data = channel.results.pop(rank, None)
    if data is None:  # pragma: no cover - a task returns only once the driver has its result
        raise RankFailedError(rank, "its task finished but its result never reached the driver")
    return cloudpickle.loads(data)


def _stalled(beats: dict, timeout: float):
    """(rank, seconds silent, pid) of the rank silent longest past ``timeout``, or None."""
    now = time.monotonic()
    late = [(now - seen, rank, pid) for rank, (seen, pid) in list(beats.items()) if now - seen > timeout]
    if not late:
        return None
    silent_s, rank, pid = max(late)
    return rank, silent_s, pid


def _explain(exc: BaseException, channel: _Channel, silent_after: float = 25.0) -> None:
    """Raise the RankFailedError that names the rank behind the failed stage ``exc``.

    A rank whose heartbeats stopped ``silent_after`` seconds ago while it has not finished
    (frozen: it reports nothing) is named first: a peer's collective that timed out
    waiting for it is a consequence, not the cause."""
    deadline = time.time() + 3.0
    # A rank's own report can trail Spark's news of the stage failure by a moment.
    while time.time() < deadline and all(_is_collateral(m) for _, m in channel.failures):
        time.sleep(0.1)
    reporters = {r for r, _ in channel.failures}
    frozen = _stalled({r: b for r, b in channel.beats.items() if r not in reporters}, silent_after)
    if frozen is not None:
        rank, silent_s, pid = frozen
        others = sorted(reporters)
        then = (f"; rank(s) {', '.join(map(str, others))} then failed waiting for it "
                f"({_root_cause(channel.failures)[1][:300]})") if others else ""
        raise RankFailedError(rank, f"stalled: no heartbeat for {silent_s:.0f} s (process {pid}): frozen, "
                                    f"swapped out, or its host is unreachable{then}") from exc
    if channel.failures:
        rank, message = _root_cause(channel.failures)
        others = sorted({r for r, _ in channel.failures if r != rank})
        if others:
            message += f" (then rank(s) {', '.join(map(str, others))} stopped too)"
        raise RankFailedError(rank, message, channel.traces.get(rank, "")) from exc
    text = str(exc)
    match = re.search(r"Training rank (\d+) failed: ([^\n]*)", text)
    if match:
        raise RankFailedError(int(match.group(1)), match.group(2).strip()) from exc
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    raise RankFailedError(None, f"the training stage failed before any rank reported: {first}") from exc
