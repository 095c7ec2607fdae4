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
3. starts the rank as a child process (``python -m sparkdeep._rank_process``) with
   ``SPARKDEEP_RANK``/``SPARKDEEP_SIZE`` (rank = partition id), the variables of its
   ``backend``, the Spark-assigned GPUs, and the shipped code on its path; the child dies
   with the task (``PR_SET_PDEATHSIG``), so a killed task leaves no rank;
4. returns the child's pickled result as one Arrow row.

Two backends say how the ranks find each other (``backend=``):

- ``horovod``: the driver runs Horovod's Gloo rendezvous server, initialised with the host
  plan; each rank gets the ``HOROVOD_*`` variables (local and cross ranks from the task
  hosts) and ``HOROVOD_GLOO_TIMEOUT_SECONDS``;
- ``tensorflow``: no Horovod import anywhere; each rank gets ``TF_CONFIG`` naming every
  task's host and port (a worker cluster for ``MultiWorkerMirroredStrategy``).

Both get ``SPARKDEEP_COLLECTIVE_TIMEOUT``: twice the stall timeout, so that a frozen rank is
found by its missing heartbeat (and named) before a peer's collective gives up on it.

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
import logging
import math
import os
import re
import sys
import threading
import time
import uuid
from typing import Callable, Sequence

log = logging.getLogger(__name__)

_BEAT_ENV = "SPARKDEEP_HEARTBEAT"  # "host:port:token:interval_s", set for the ranks
RANK_DATA_ENV = "SPARKDEEP_RANK_DATA"  # the folder holding this rank's spilled partition
DEVICES_ENV = "SPARKDEEP_DEVICES"  # the GPU addresses Spark gave the rank's task
RANK_ENV, SIZE_ENV = "SPARKDEEP_RANK", "SPARKDEEP_SIZE"  # this rank and the number of ranks
TIMEOUT_ENV = "SPARKDEEP_COLLECTIVE_TIMEOUT"  # seconds a collective may wait for a peer
# The launch's instants (time.time()) a rank's task saw: its start, its shard spilled, its
# process spawned (JSON); the rank process adds its own start (:data:`PROCESS_START_ENV`).
LAUNCH_TIMES_ENV = "SPARKDEEP_LAUNCH_TIMES"
PROCESS_START_ENV = "SPARKDEEP_PROCESS_START"
# Set to "1" by a rank whose backend has shut down with its peers: its process may end
# without the interpreter's teardown once its result is written.
FAST_EXIT_ENV = "SPARKDEEP_FAST_EXIT"
BACKENDS = ("horovod", "tensorflow", "tensorflow_ps")
_FORWARD_PREFIXES = ("SPARKDEEP_", "HOROVOD_", "TF_", "NCCL_", "KERAS_")
_TRACE_CHARS = 100_000  # the most of a rank's traceback sent to the driver (its tail)


class RankFailedError(RuntimeError):
    """A rank raised, exited or stalled; ``rank`` and ``message`` (one line) say which and
    why; ``details`` is the rank's own Python traceback when it raised (else "")."""

    def __init__(self, rank: int | None, message: str, details: str = ""):
        self.rank = rank
        self.message = message
        self.details = details
        who = f"Training rank {rank}" if rank is not None else "A training rank"
        super().__init__(f"{who} failed: {message}")


class _Channel:
    """The driver's listener for the ranks and their tasks: one text line per message,
    ``token kind rank rest``, where kind is ``beat`` (rest: pid), ``done`` (the rank's
    process ended), ``fail`` (rest: the error), ``trace`` (rest: the rank's traceback as a
    JSON string, sent before its ``fail``), ``log`` (rest: a line of the rank's output,
    printed on the driver), ``join`` (rest: what a task tells every other as JSON; answered,
    once all ``size`` tasks have joined and the rendezvous holds task 0's host plan, with
    ``ok`` and every task's JSON in rank order: Spark's ``allGather`` and ``barrier`` would do
    the same, but each polls once a second, which cost 2 s per launch) or ``put`` (rest:
    ``<length> <name>``, then that many bytes: a file
    for the driver to store, see :func:`put`; answered ``ok`` once stored, else ``error
    <why>``). Lines without the run's random token are ignored."""

    def __init__(self, host: str, on_plan: Callable[[list], None], out,
                 on_put: Callable[[int, str, bytes], None] | None = None, size: int = 0):
        import secrets
        import socketserver

        self.token = secrets.token_hex(8)
        self.size, self._joined, self._planned, self._closed = size, {}, False, False
        self._join = threading.Condition()
        self.beats: dict = {}
        self.finished: set = set()
        self.failures: list = []
        self.traces: dict = {}
        lock = threading.Lock()
        channel = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 600

            def handle(self):
                while True:
                    try:
                        line = self.rfile.readline(1 << 20).decode("utf-8", "replace")
                    except OSError:
                        return
                    if not line:
                        return
                    words = line.rstrip("\n").split(" ", 3)
                    if len(words) < 3 or words[0] != channel.token or not words[2].isdigit():
                        continue
                    kind, rank, rest = words[1], int(words[2]), words[3] if len(words) > 3 else ""
                    if kind == "beat" and rest.isdigit() and rank not in channel.finished:
                        channel.beats[rank] = (time.monotonic(), int(rest))
                    elif kind == "done":  # the rank's process has ended: no more beats to expect
                        channel.finished.add(rank)
                        channel.beats.pop(rank, None)
                    elif kind == "fail":
                        with lock:
                            channel.failures.append((rank, rest))
                    elif kind == "trace":
                        try:
                            channel.traces[rank] = str(json.loads(rest))
                        except ValueError:
                            pass  # cut short: the one-line error still comes
                    elif kind == "log":
                        try:
                            if out is None:
                                log.info(rest)
                            else:
                                out.write(rest + "\n")
                                out.flush()
                        except Exception:  # noqa: BLE001 - a closed notebook stream must not kill training
                            pass
                    elif kind == "put":
                        size, _, name = rest.partition(" ")
                        if not size.isdigit():
                            return
                        data = self.rfile.read(int(size))
                        if len(data) != int(size):
                            return  # the rank went away mid-file: nothing is stored
                        try:
                            if on_put is None:
                                raise RuntimeError("this launch takes no files from its ranks")
                            on_put(rank, name, data)
                            reply = b"ok\n"
                        except Exception as exc:  # noqa: BLE001 - the rank raises it, naming the file
                            reply = f"error {type(exc).__name__}: {exc}".replace("\n", " | ").encode() + b"\n"
                        self.wfile.write(reply)
                        self.wfile.flush()
                    elif kind == "join":
                        self.wfile.write(channel.join(rank, json.loads(rest), on_plan).encode() + b"\n")
                        self.wfile.flush()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("0.0.0.0", 0), Handler)
        self.address = f"{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="sparkdeep-rank-channel", daemon=True).start()

    def join(self, rank: int, info: dict, on_plan: Callable[[list], None]) -> str:
        """Task ``rank``'s join: wait for every task's, hand task 0's host plan to the
        rendezvous once, then answer with every task's ``info`` in rank order."""
        with self._join:
            self._joined[rank] = info
            self._join.notify_all()
            self._join.wait_for(lambda: len(self._joined) >= self.size or self._closed)
            if self._closed:
                return "error the launch ended before every task joined"
            if not self._planned:
                on_plan(self._joined[0]["plan"])
                self._planned = True
            return "ok " + json.dumps([self._joined[r] for r in range(self.size)])

    def close(self) -> None:
        with self._join:
            self._closed = True
            self._join.notify_all()
        self._server.shutdown()
        self._server.server_close()


def join(setting: str, rank: int, info: dict) -> list:
    """From a task: tell the driver ``info`` and get every task's, in rank order (no
    timeout: a task that never joins fails its stage, which kills this one)."""
    import socket
    address, line = _address_and_line(setting, "join", rank, json.dumps(info))
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(line)
        conn.settimeout(None)
        reply = conn.makefile("rb").readline().decode("utf-8", "replace")
    if not reply.startswith("ok "):
        raise RuntimeError(f"rank {rank}: the driver did not answer its join (reply {reply!r})")
    return json.loads(reply[3:])


def _address_and_line(setting: str, kind: str, rank, text: str) -> tuple[tuple[str, int], bytes]:
    """Where the driver's channel listens, and one message to it as a line of bytes
    (``setting`` = "host:port:token[:interval]"; newlines in ``text`` become " | ")."""
    host, port, token = setting.split(":")[:3]
    return (host, int(port)), f"{token} {kind} {rank} {text}".replace("\n", " | ").encode() + b"\n"


def send(setting: str, kind: str, rank, text: str = "", *, wait_reply: bool = False, timeout: float = 30.0):
    """One message to the driver's channel, on a connection of its own."""
    import socket
    address, line = _address_and_line(setting, kind, rank, text)
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.sendall(line)
        if wait_reply:
            conn.settimeout(timeout)
            reply = conn.makefile("rb").readline()
            if reply.strip() != b"ok":
                raise RuntimeError(f"the driver did not accept the {kind} message (reply {reply!r})")


def send_failure(setting: str, rank, message: str, details: str = "") -> None:
    """From a rank: its error as one line and, before it on the same connection (so the
    driver holds both once it sees the error), its full traceback ``details``."""
    import socket
    address, fail = _address_and_line(setting, "fail", rank, message)
    lines = [fail]
    if details:
        # The channel reads lines of up to 1 MiB: the innermost frames are the ones to keep.
        lines.insert(0, _address_and_line(setting, "trace", rank, json.dumps(details[-_TRACE_CHARS:]))[1])
    with socket.create_connection(address, timeout=30) as conn:
        conn.sendall(b"".join(lines))


def put(name: str, data: bytes, *, timeout: float = 600.0) -> None:
    """From a rank: hand the file ``name`` (its bytes) to the driver, which stores it with
    the launch's ``on_put`` (:func:`run_on_ranks`), and wait until it is stored. A rank has
    no Spark session, so this is how it writes where only the driver can (``hdfs://``...).

    Raises
    ------
    RuntimeError
        Not inside a launched rank, or the driver could not store the file (its reason).
    """
    import socket
    setting = os.environ.get(_BEAT_ENV, "")
    if not setting:
        raise RuntimeError(f"put({name!r}): not inside a rank started by run_on_ranks")
    rank = os.environ.get(RANK_ENV, "0")
    address, line = _address_and_line(setting, "put", rank, f"{len(data)} {name}")
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.settimeout(timeout)
        conn.sendall(line)
        conn.sendall(data)
        reply = conn.makefile("rb").readline().decode("utf-8", "replace").strip()
    if reply != "ok":
        raise RuntimeError(f"the driver could not store {name}: {reply.removeprefix('error ') or 'no reply'}")


class _Lines:
    """One connection to the driver's channel for many lines (a rank's output), reopened
    once if it breaks; lines that cannot be sent are printed locally instead."""

    def __init__(self, setting: str, rank):
        self.setting, self.rank, self._conn = setting, rank, None

    def send(self, kind: str, text: str) -> None:
        import socket
        address, line = _address_and_line(self.setting, kind, self.rank, text)
        for _ in range(2):
            try:
                if self._conn is None:
                    self._conn = socket.create_connection(address, timeout=30)
                self._conn.sendall(line)
                return
            except OSError:
                self.close()
        log.info(text)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None


def heartbeat(rank, setting: str) -> None:
    """A daemon thread of the rank: a beat to the driver every few seconds while the
    process runs (a frozen process sends none)."""
    interval = float(setting.split(":")[3])

    def beat():
        while True:
            try:
                send(setting, "beat", rank, str(os.getpid()), timeout=interval)
            except OSError:
                pass  # the driver notices the silence
            time.sleep(interval)
    threading.Thread(target=beat, name="sparkdeep-heartbeat", daemon=True).start()


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


def host_plan(hosts: list[str]) -> list[dict]:
    """Horovod's slot plan for tasks on ``hosts`` (rank = task index): local rank and size
    among the tasks of one host, cross rank and size among the hosts with that local rank."""
    plan = []
    for rank, host in enumerate(hosts):
        local = [r for r, h in enumerate(hosts) if h == host]
        plan.append({"hostname": host, "rank": rank, "size": len(hosts), "local_rank": local.index(rank),
                     "local_size": len(local)})
    for slot in plan:
        peers = [p for p in plan if p["local_rank"] == slot["local_rank"]]
        slot["cross_rank"] = [p["rank"] for p in peers].index(slot["rank"])
        slot["cross_size"] = len(peers)
    return plan


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on this host now (the rank's TensorFlow servers bind
    them moments later); all held open at once, so no two are the same."""
    import socket
    from contextlib import ExitStack
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in socks]


def _free_port() -> int:
    return _free_ports(1)[0]


def tf_config(hosts: list[str], ports: list, rank: int, ps: bool = False) -> str:
    """``TF_CONFIG`` for rank ``rank``: a worker cluster of every task's ``host:port``; with
    ``ps``, also one parameter server on rank 0's host (its second port)."""
    cluster = {"worker": [f"{h}:{p[0]}" for h, p in zip(hosts, ports)]}
    if ps:
        cluster["ps"] = [f"{hosts[0]}:{ports[0][1]}"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})


def backend_env(backend: str, conf: dict, plan: list[dict], ports: list[int], rank: int) -> dict:
    """The variables by which rank ``rank`` finds its peers under ``backend``."""
    slot = plan[rank]
    if backend.startswith("tensorflow"):
        return {"TF_CONFIG": tf_config([p["hostname"] for p in plan], ports, rank, ps=backend == "tensorflow_ps")}
    rendezvous_host, rendezvous_port = conf["rendezvous"]
    env = {"HOROVOD_HOSTNAME": slot["hostname"], "HOROVOD_RANK": str(rank),
           "HOROVOD_SIZE": str(slot["size"]), "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
           "HOROVOD_LOCAL_SIZE": str(slot["local_size"]), "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
           "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_host, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(math.ceil(conf["collective_timeout"])))}
    iface = _interface_for(rendezvous_host)
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    return env


def collective_timeout(stall_timeout: float) -> float:
    """How long a collective may wait for a peer: twice the stall timeout (the heartbeat
    watchdog fires first and names a frozen rank); 30 minutes without a watchdog."""
    return 2.0 * stall_timeout if stall_timeout else 1800.0


def _interface_for(address: str) -> str | None:
    """The network interface this host uses to reach ``address`` (Gloo binds to it)."""
    import socket

    import psutil
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == local for a in addrs):
            return name
    return None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the task's Python worker dies (Linux)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the task kill still ends the stage
        pass


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
    import subprocess
    import tempfile
    from collections import deque

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
        counts: dict = {}
        t_spilled = t_task  # no data: nothing to spill
        try:
            if batches is not None:
                spill = conf["spill"].open(data)
                for batch in batches:
                    spill.write(batch)
                counts = spill.close()
            t_spilled = time.time()
        except BaseException as exc:
            try:
                send(setting, "fail", rank, f"spilling its partition: {type(exc).__name__}: {exc}")
            except OSError:
                pass  # the stage's own error still names the task
            raise
        hosts = [t.address.rsplit(":", 1)[0] for t in ctx.getTaskInfos()]
        wanted = {"tensorflow": 1, "tensorflow_ps": 2}.get(conf["backend"], 0)  # worker (and ps) servers
        plan = host_plan(hosts)
        # Every task's counts and ports; the rendezvous holds the plan once this returns.
        shared = join(setting, rank, {"counts": counts, "ports": _free_ports(wanted),
                                      "plan": plan if rank == 0 else None})
        gathered, ports = [g["counts"] for g in shared], [g["ports"] for g in shared]
        with open(os.path.join(data, "ranks.json"), "w") as fh:
            json.dump({"counts": gathered, "hosts": hosts}, fh)
        # Unusable shards are found here, before any rank starts (no TensorFlow import, no
        # rendezvous): the rank concerned reports why, the others stop without blaming themselves.
        check = getattr(conf["spill"], "problem", None) if batches is not None else None
        problems = [check(gathered, r) for r in range(len(gathered))] if check else []
        if problems and problems[rank]:
            send(setting, "fail", rank, problems[rank])
            raise RuntimeError(f"Training rank {rank} failed: {problems[rank]}")
        if any(problems):
            raise RuntimeError(f"rank {rank} not started: {next(p for p in problems if p)}")
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
        child = subprocess.Popen([sys.executable, "-m", "sparkdeep._rank_process", work], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
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
        lines.send("done", "")
        if code != 0:
            failure = os.path.join(work, "failure.txt")
            if os.path.isfile(failure):
                with open(failure) as fh:
                    message = fh.read().strip()
            else:
                message = (f"process exited (code {code}) without a Python exception (killed, out of memory, or "
                           f"os._exit); its last output: {' | '.join(list(tail)[-5:])}")
                send(setting, "fail", rank, message)
            raise RuntimeError(f"Training rank {rank} failed: {message}")
        with open(os.path.join(work, "result.pkl"), "rb") as fh:
            result = fh.read()
        return rank, result
    finally:
        lines.close()
        if child is not None and child.poll() is None:
            child.kill()
        shutil.rmtree(work, ignore_errors=True)


def run_on_ranks(fn: Callable, args: Sequence = (), kwargs: dict | None = None, *,
                 num_proc: int, data=None, spill=None, stall_timeout: float = 120.0,
                 env: dict | None = None, stdout=None,
                 on_put: Callable[[int, str, bytes], None] | None = None, backend: str = "horovod",
                 shuffle_seed: int | None = None) -> list:
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
    raised in that rank. ``stdout``: a stream for the ranks' output lines (default: the
    ``sparkdeep.distributed`` logger, at INFO). ``backend``: how the ranks find each other,
    ``'horovod'`` (Gloo rendezvous, ``HOROVOD_*``) or ``'tensorflow'`` (``TF_CONFIG``; no
    Horovod import on the driver or in the ranks). ``shuffle_seed``: each partition's rows
    in a seeded random order, so a rank's shard is spilled shuffled: rows that arrive in
    runs (a table sorted by a column, copies of a repeated row, which the repartition's
    local sort puts side by side) do not stay in runs a streamed window cannot mix.

    Raises
    ------
    RankFailedError
        A rank raised, exited, or stalled; the error names the rank and why in one line
        (``message``: a raising rank's error and the frame of the user's code it came from),
        a raising rank's own traceback in ``details``.
    """
    import cloudpickle
    import pyarrow as pa
    from pyspark import SparkContext

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 seconds, got {stall_timeout}")
    if num_proc < 1:
        raise ValueError(f"num_proc must be >= 1, got {num_proc}")
    if data is not None and spill is None:
        raise ValueError("run_on_ranks: data needs a spill (how a task writes its partition)")
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("run_on_ranks needs an active SparkContext")
    host = sc.getConf().get("spark.driver.host", "127.0.0.1")
    out = stdout  # None: the ranks' lines go to this module's logger
    rendezvous, on_plan = _rendezvous(backend)
    channel = _Channel(host, on_plan, out, on_put, size=num_proc)
    port = rendezvous.start() if rendezvous is not None else 0
    interval = min(10.0, stall_timeout / 4) if stall_timeout else 10.0
    # Ranks start from the executor's environment; forward the driver's settings that
    # steer training (ours, Horovod's, TensorFlow's, NCCL's), plus any ``env`` given.
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(_FORWARD_PREFIXES)
                 and k not in (_BEAT_ENV, RANK_DATA_ENV, DEVICES_ENV)}
    forwarded.update(env or {})
    conf = {"channel": f"{channel.address}:{channel.token}:{interval:g}", "rendezvous": (host, port),
            "env": forwarded, "spill": spill, "backend": backend,
            "collective_timeout": collective_timeout(stall_timeout)}
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
        if data is None:
            def run_task(_):
                yield _rank_task(None, conf, shipped.value)
            rows = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(run_task).collect()
        else:
            schema = pa.schema([("rank", pa.int32()), ("result", pa.binary())])

            def run_arrow(batches):
                rank, result = _rank_task(batches, conf, shipped.value)
                yield pa.RecordBatch.from_arrays([pa.array([rank], pa.int32()), pa.array([result], pa.binary())],
                                                 schema=schema)
            parts = data.repartition(num_proc)
            if shuffle_seed is not None:
                from pyspark.sql import functions as F
                parts = parts.sortWithinPartitions(F.rand(int(shuffle_seed)))
            rows = [(r["rank"], r["result"]) for r in
                    parts.mapInArrow(run_arrow, "rank int, result binary", barrier=True).collect()]
        return [cloudpickle.loads(result) for _, result in sorted(rows, key=lambda r: r[0])]
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


def _rendezvous(backend: str):
    """The driver's rendezvous for ``backend`` (Horovod's Gloo server, or None) and what to
    do with the host plan task 0 sends."""
    if backend != "horovod":
        return None, lambda plan: None
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer
    rendezvous = RendezvousServer(verbose=0)

    def on_plan(plan: list) -> None:
        rendezvous.init([SlotInfo(hostname=p["hostname"], rank=p["rank"], local_rank=p["local_rank"],
                                  cross_rank=p["cross_rank"], size=p["size"], local_size=p["local_size"],
                                  cross_size=p["cross_size"]) for p in plan])
    return rendezvous, on_plan


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
