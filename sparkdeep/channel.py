"""The channel between the launcher and its ranks: what a rank process and the driver both speak.

The driver (:func:`sparkdeep.distributed.run_on_ranks`) opens a :class:`_Channel`, a small TCP
listener; each barrier task and its rank process reach it through the setting in
``$SPARKDEEP_HEARTBEAT`` ("host:port:token:interval_s"): a task's :func:`join` (every task's
counts and ports, in rank order), a rank's :func:`heartbeat` thread, its output lines
(:class:`_Lines`), its error (:func:`send_failure`), the files it hands to the driver
(:func:`put`), what it asks the driver for (:func:`get`) and its result (:func:`send_result`). Also here: the names of the variables a rank is started with
(:data:`RANK_ENV`, :data:`RANK_DATA_ENV`, ...), read by ``sparkdeep._rank_process`` and the
rank's loop. Imports nothing of the project.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable

# The ranks' output lines are logged under the launcher's name, as run_on_ranks documents.
log = logging.getLogger("sparkdeep.distributed")

_BEAT_ENV = "SPARKDEEP_HEARTBEAT"  # "host:port:token:interval_s", set for the ranks
RANK_DATA_ENV = "SPARKDEEP_RANK_DATA"  # the folder holding this rank's spilled partition
DEVICES_ENV = "SPARKDEEP_DEVICES"  # the GPU addresses Spark gave the rank's task
RANK_ENV, SIZE_ENV = "SPARKDEEP_RANK", "SPARKDEEP_SIZE"  # this rank and the number of ranks
# The launch's instants (time.time()) a rank's task saw: its start, its shard spilled, its
# process spawned (JSON); the rank process adds its own start (:data:`PROCESS_START_ENV`).
LAUNCH_TIMES_ENV = "SPARKDEEP_LAUNCH_TIMES"
PROCESS_START_ENV = "SPARKDEEP_PROCESS_START"
# Set to "1" by a rank whose backend has shut down with its peers: its process may end
# without the interpreter's teardown once its result is written.
FAST_EXIT_ENV = "SPARKDEEP_FAST_EXIT"
_TRACE_CHARS = 100_000  # the most of a rank's traceback sent to the driver (its tail)


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
    <why>``) or ``result`` (rest: ``<length>``, then the rank's pickled result, kept in
    :attr:`results`; see :func:`send_result`) or ``get`` (rest: what the rank asks for, which
    the launch's ``on_get`` answers: ``ok <length>`` and that many bytes, else ``error
    <why>``; see :func:`get`). Lines without the run's random token are ignored."""

    def __init__(self, host: str, on_plan: Callable[[list], None], out,
                 on_put: Callable[[int, str, bytes], None] | None = None, size: int = 0,
                 on_get: Callable[[int, str], bytes] | None = None):
        import secrets
        import socketserver

        self.token = secrets.token_hex(8)
        self.size, self._joined, self._planned, self._closed = size, {}, False, False
        self._join = threading.Condition()
        self.beats: dict = {}
        self.finished: set = set()
        self.failures: list = []
        self.traces: dict = {}
        self.results: dict = {}  # rank -> its pickled result (:func:`send_result`)
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
                    elif kind in ("put", "result"):
                        size, _, name = rest.partition(" ")
                        if not size.isdigit():
                            return
                        data = self.rfile.read(int(size))
                        if len(data) != int(size):
                            return  # the rank went away mid-file: nothing is stored
                        try:
                            if kind == "result":
                                channel.results[rank] = data
                            elif on_put is None:
                                raise RuntimeError("this launch takes no files from its ranks")
                            else:
                                on_put(rank, name, data)
                            reply = b"ok\n"
                        except Exception as exc:  # noqa: BLE001 - the rank raises it, naming the file
                            reply = f"error {type(exc).__name__}: {exc}".replace("\n", " | ").encode() + b"\n"
                        self.wfile.write(reply)
                        self.wfile.flush()
                    elif kind == "get":
                        try:
                            if on_get is None:
                                raise RuntimeError("this launch serves no files to its ranks")
                            data = on_get(rank, rest)
                            if not isinstance(data, (bytes, bytearray)):
                                raise TypeError(f"on_get gave {type(data).__name__}, not bytes")
                            reply = f"ok {len(data)}\n".encode()
                        except Exception as exc:  # noqa: BLE001 - the rank raises it, naming what it asked
                            data = b""
                            reply = f"error {type(exc).__name__}: {exc}".replace("\n", " | ").encode() + b"\n"
                        try:
                            self.wfile.write(reply)
                            self.wfile.write(data)
                            self.wfile.flush()
                        except OSError:
                            return  # the rank went away: its get fails there
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


def _in_rank(call: str) -> tuple[str, str]:
    """The channel's setting and this rank's number, inside a launched rank."""
    setting = os.environ.get(_BEAT_ENV, "")
    if not setting:
        raise RuntimeError(f"{call}: not inside a rank started by run_on_ranks")
    return setting, os.environ.get(RANK_ENV, "0")


def _send_for_reply(setting: str, kind: str, rank, text: str, body: Callable, timeout: float) -> str:
    """One message and its payload (``body(conn)`` writes it) on a connection of its own;
    the driver's one-line reply."""
    import socket
    address, line = _address_and_line(setting, kind, rank, text)
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.settimeout(timeout)
        conn.sendall(line)
        body(conn)
        return conn.makefile("rb").readline().decode("utf-8", "replace").strip()


def put(name: str, data: bytes, *, timeout: float = 600.0) -> None:
    """From a rank: hand the file ``name`` (its bytes) to the driver, which stores it with
    the launch's ``on_put`` (:func:`sparkdeep.distributed.run_on_ranks`), and wait until it is stored. A rank has
    no Spark session, so this is how it writes where only the driver can (``hdfs://``...).

    Raises
    ------
    RuntimeError
        Not inside a launched rank, or the driver could not store the file (its reason).
    """
    setting, rank = _in_rank(f"put({name!r})")
    reply = _send_for_reply(setting, "put", rank, f"{len(data)} {name}", lambda conn: conn.sendall(data), timeout)
    if reply != "ok":
        raise RuntimeError(f"the driver could not store {name}: {reply.removeprefix('error ') or 'no reply'}")


def get(what: str, *, timeout: float = 600.0) -> bytes:
    """From a rank: ask the driver for ``what`` (one line; the launch's ``on_get`` decides
    what it means, :func:`sparkdeep.distributed.run_on_ranks`) and return its bytes. How a rank
    gets what would be too large to ship to every rank in its call (its own rows of a split
    table).

    Raises
    ------
    RuntimeError
        Not inside a launched rank, or the driver refused (its reason).
    """
    import socket
    setting, rank = _in_rank(f"get({what!r})")
    address, line = _address_and_line(setting, "get", rank, what)
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.settimeout(timeout)
        conn.sendall(line)
        reader = conn.makefile("rb")
        reply = reader.readline().decode("utf-8", "replace").strip()
        size = reply.removeprefix("ok ")
        if not reply.startswith("ok ") or not size.isdigit():
            raise RuntimeError(f"the driver did not give {what}: {reply.removeprefix('error ') or 'no reply'}")
        data = reader.read(int(size))
    if len(data) != int(size):
        raise RuntimeError(f"the driver's answer to {what} was cut short ({len(data)} of {size} bytes)")
    return data


def send_result(setting: str, rank, path: str, *, timeout: float = 600.0) -> None:
    """From a task: hand its rank's pickled result (the file at ``path``) to the driver,
    streamed from disk, and wait until the driver holds it. A result can be a network of a
    gigabyte or more, which a Spark task result cannot carry within a driver JVM's memory
    (the task's own row then only says it finished).

    Raises
    ------
    RuntimeError
        The driver did not take it (its reply).
    """
    with open(path, "rb") as fh:
        reply = _send_for_reply(setting, "result", rank, str(os.path.getsize(path)), lambda conn: conn.sendfile(fh),
                                timeout)
    if reply != "ok":
        raise RuntimeError(f"rank {rank}: the driver did not take its result ({reply or 'no reply'})")


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
