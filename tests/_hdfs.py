"""A real single-node HDFS on 127.0.0.1 for tests: Hadoop's MiniDFSCluster (NameNode and
one DataNode in one JVM), from the jars ``scripts/hdfs_jars.sh`` fetches.

Started as a child process in its own process group, so :meth:`MiniHDFS.stop` ends it
whatever happened in between; ready when the launcher writes its details file (which
holds the NameNode's port).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

from tests.conftest import ci_java_options


class MiniHDFS:
    def __init__(self, repo_root: str, work_dir: str):
        self.repo_root, self.work_dir = repo_root, work_dir
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120) -> "MiniHDFS":
        lib = subprocess.run(["bash", os.path.join(self.repo_root, "scripts", "hdfs_jars.sh")], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        os.makedirs(self.work_dir, exist_ok=True)
        details = os.path.join(self.work_dir, "details.json")
        java = shutil.which("java") or "java"
        cmd = [java, "-Xmx512m", *ci_java_options().split(), f"-Dtest.build.data={os.path.join(self.work_dir, 'data')}",
               "-cp", os.path.join(lib, "*"), "org.apache.hadoop.test.MiniDFSClusterManager",
               "-format", "-nnport", "0", "-httpport", "0", "-D", "dfs.permissions.enabled=false",
               "-D", "dfs.replication=1", "-writeDetails", details,
               "-writeConfig", os.path.join(self.work_dir, "hdfs-site.xml")]
        self.log = os.path.join(self.work_dir, "minidfs.log")
        with open(self.log, "w") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"MiniDFSCluster exited with {self.proc.returncode}; see {self.log}")
            if os.path.isfile(details) and os.path.getsize(details):
                try:
                    with open(details) as fh:
                        self.port = int(json.load(fh)["namenode_port"])
                    return self
                except (ValueError, KeyError):
                    pass  # being written
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"MiniDFSCluster not ready in {timeout_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=20)
