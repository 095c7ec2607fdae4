"""A real Spark standalone cluster on 127.0.0.1 for tests: one master, N one-core workers.

Started as plain child processes (``spark-class ...Master`` / ``...Worker``) in their own
process groups, so :meth:`StandaloneCluster.stop` can kill every JVM it started whatever
happened in between.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

from tests.conftest import ci_java_options


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket is held open until all are bound, so the
    kernel cannot hand one port out twice (a worker's web UI on the master's once answered
    the master's ``/json/`` with a worker page)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


class StandaloneCluster:
    def __init__(self, spark_home: str, work_dir: str, workers: int = 2, cores: int = 1, memory: str = "2g"):
        self.spark_home = spark_home
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port, self.ui_port, *self.worker_ui_ports = free_ports(2 + workers)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> None:
        log = os.path.join(self.work_dir, f"{name}.log")
        self.logs.append(log)
        env = {**os.environ, "SPARK_HOME": self.spark_home, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1", "SPARK_DAEMON_JAVA_OPTS": ci_java_options()}
        with open(log, "w") as fh:
            self.procs.append(subprocess.Popen([os.path.join(self.spark_home, "bin", "spark-class"), *args],
                                               stdout=fh, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))

    def start(self, timeout_s: float = 300) -> "StandaloneCluster":  # 3 JVMs on 2 busy cores: 120 s was short
        os.makedirs(self.work_dir, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        for i in range(self.workers):
            self._spawn(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                       "--cores", str(self.cores), "--memory", self.memory,
                                       "--webui-port", str(self.worker_ui_ports[i]),
                                       "--work-dir", os.path.join(self.work_dir, f"worker{i}"), self.url])
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for p, log in zip(self.procs, self.logs):
                if p.poll() is not None:
                    raise RuntimeError(f"{log} exited with {p.returncode}:\n{open(log).read()[-2000:]}")
            if self.alive_workers() == self.workers:
                return self
            time.sleep(1)
        raise TimeoutError(f"{self.workers} workers did not register with {self.url} in {timeout_s}s")

    def _bound_ui_port(self) -> int:
        """The master's web UI port as its log states it: Spark takes the next port when the
        asked one was taken in between."""
        try:
            with open(self.logs[0]) as fh:
                found = re.search(r"Bound MasterWebUI to \S+ and started at http://[^:]+:(\d+)", fh.read())
        except OSError:
            found = None
        return int(found.group(1)) if found else self.ui_port

    def state(self) -> dict:
        self.ui_port = self._bound_ui_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except (OSError, ValueError):  # not up yet, or another process's page on the port
            return 0

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=20)

    def __enter__(self) -> "StandaloneCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
