"""Runs: an id per run, one writer per output folder, a manifest per run, a Delta runs table.

A *run* is one pass of some or all steps over one output folder, named by a run id
(``--run-id``; a new one is made when none is given). Its manifest,
``<output>/runs/<run_id>/manifest.json``, records the config, the code version, each
step's status, the Delta table versions it read and wrote, row counts, metrics, the model
path and timings. It is rewritten atomically after every change, so a killed run leaves a
manifest that says which steps finished: a rerun with the same run id skips those and
redoes the one that was interrupted.

Every Delta write of a step carries ``txnAppId = sparkdeep:<run_id>:<step>:<table>`` and
``txnVersion = <generation>``: Delta commits each pair once, so a step retried any number
of times adds no duplicate rows, and ``--force`` (a new generation) really rewrites.

Reads are pinned: a step reads the version of a table that an earlier step *of the same
run* wrote, not whatever is newest, so a resumed run sees exactly its own inputs.

:class:`OutputLock` is an exclusive ``flock`` on ``<output>/.lock``: a second run on the
same output fails at once naming the holder (or waits ``--wait-lock`` seconds). The
kernel drops the lock when its process dies, so a killed run never leaves a stale lock.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import fcntl
import json
import os
import re
import secrets
import socket
import subprocess
import time
from typing import Any, Mapping

from sparkdeep.config import Config, ConfigError
from sparkdeep.paths import Paths, write_json

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STEP_ORDER = ("ingest", "prepare", "train", "score", "evaluate")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    if not RUN_ID.match(run_id):
        raise ConfigError(f"--run-id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return run_id


def code_version() -> dict:
    """The package version and, from a checkout, the git commit (and whether it is dirty)."""
    from importlib import metadata
    try:
        package = metadata.version("sparkdeep")
    except metadata.PackageNotFoundError:
        package = None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
        if commit:
            dirty = bool(subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": package, "git_commit": commit, "git_dirty": dirty}


class OutputLocked(RuntimeError):
    """Another run holds the output folder."""


class OutputLock:
    """An exclusive, process-lifetime lock on an output folder (``flock`` on ``.lock``)."""

    def __init__(self, root: str, run_id: str, wait_s: float = 0.0):
        self.path = os.path.join(root, ".lock")
        self.run_id = run_id
        self.wait_s = wait_s
        self._fd: int | None = None

    def __enter__(self) -> "OutputLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    waited = f" after waiting {self.wait_s:.0f}s" if self.wait_s else ""
                    raise OutputLocked(
                        f"output {os.path.dirname(self.path)!r} is in use by run {holder.get('run_id', '?')!r} "
                        f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since "
                        f"{holder.get('since', '?')}){waited}; wait for it, or pass --wait-lock SECONDS") from None
                time.sleep(0.5)
        holder = {"run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(), "since": now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def config_dict(cfg: Any) -> Any:
    """The config as plain JSON-able data (mappings and tuples included)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {str(k): config_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [config_dict(v) for v in cfg]
    return cfg


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


# Config keys that may differ between attempts of one run without changing its results.
_VOLATILE = ("output_dir", "spark.", "tracking.")


class Manifest:
    """The JSON manifest of one run; every mutation is saved atomically."""

    def __init__(self, paths: Paths, data: dict):
        self.paths = paths
        self.data = data

    @property
    def path(self) -> str:
        return self.paths.manifest(self.data["run_id"])

    @classmethod
    def open(cls, paths: Paths, run_id: str, cfg: Config, force: bool) -> "Manifest":
        path = paths.manifest(run_id)
        config = config_dict(cfg)
        if os.path.exists(path):
            with open(path) as fh:
                data = json.load(fh)
            changed = [k for k in _diff(data["config"], config) if not k.startswith(_VOLATILE)]
            if changed and not force:
                raise ConfigError(f"run {run_id!r} was started with a different config ({', '.join(changed)} "
                                  f"differ; see {path}): use a new --run-id, or --force to redo it with this one")
            data["config"] = config
            data["attempts"] = data.get("attempts", 1) + 1
            if force:
                data["generation"] = data.get("generation", 0) + 1
        else:
            data = {"run_id": run_id, "status": "running", "created_at": now(), "attempts": 1,
                    "generation": 0, "config": config, "output_dir": paths.root, "steps": {}}
        data["code_version"] = code_version()
        m = cls(paths, data)
        m.save()
        return m

    def save(self) -> None:
        self.data["updated_at"] = now()
        write_json(self.path, self.data)

    def done(self, step: str) -> bool:
        return self.data["steps"].get(step, {}).get("status") == "succeeded"

    def written_version(self, table: str) -> int | None:
        """The version of ``table`` that an earlier step of this run wrote (latest step wins)."""
        found = None
        for name in STEP_ORDER:
            entry = self.data["steps"].get(name, {})
            if entry.get("status") == "succeeded" and table in entry.get("outputs", {}):
                found = entry["outputs"][table]["version"]
        return found

    def start(self, step: str) -> "StepRun":
        entry = self.data["steps"].setdefault(step, {"attempts": 0})
        entry.update({"status": "running", "started_at": now(), "attempts": entry.get("attempts", 0) + 1,
                      "inputs": {}, "outputs": {}})
        entry.pop("error", None)
        self.data["status"] = "running"
        self.save()
        return StepRun(self, step)

    def finish(self, step: str, report: dict) -> None:
        entry = self.data["steps"][step]
        entry.update({"status": "succeeded", "finished_at": now(), "wall_s": report.get("wall_s"),
                      "rows": {k: v for k, v in report.items() if k.startswith("rows") and isinstance(v, int)},
                      "report": self.paths.run_report(self.data["run_id"], step)})
        if "metrics" in report:
            self.data["metrics"] = report["metrics"]
        if "models" in report:
            self.data["models"] = report["models"]
        self.data["status"] = "succeeded" if all(self.done(s) for s in STEP_ORDER) else "partial"
        self.save()

    def fail(self, step: str, error: str) -> None:
        entry = self.data["steps"][step]
        entry.update({"status": "failed", "finished_at": now(), "error": error})
        self.data["status"] = "failed"
        self.save()

    def table_versions(self) -> dict[str, int]:
        """Every table this run read or wrote -> the version (writes win over reads)."""
        out: dict[str, int] = {}
        for name in STEP_ORDER:
            entry = self.data["steps"].get(name, {})
            for kind in ("inputs", "outputs"):
                for table, ref in entry.get(kind, {}).items():
                    if kind == "outputs" or table not in out:
                        out[table] = ref["version"]
        return out


class StepRun:
    """What a step uses to read and write Delta tables inside a run: pinned reads, keyed writes."""

    def __init__(self, manifest: Manifest | None, step: str, paths: Paths | None = None):
        self.manifest = manifest
        self.step = step
        self.paths = paths or manifest.paths
        self.run_id = manifest.data["run_id"] if manifest else None
        self.generation = manifest.data.get("generation", 0) if manifest else 0
        self._entry = manifest.data["steps"][step] if manifest else {"inputs": {}, "outputs": {}}

    @classmethod
    def adhoc(cls, paths: Paths, step: str) -> "StepRun":
        """Outside a run (tests, notebooks): latest reads, plain writes, lineage kept in memory."""
        return cls(None, step, paths)

    @property
    def inputs(self) -> dict:
        return self._entry["inputs"]

    @property
    def outputs(self) -> dict:
        return self._entry["outputs"]

    def read(self, spark, table: str):
        """The table as this run last wrote it (or its latest version), recorded as an input."""
        from sparkdeep import delta_io
        path = self.paths.table(table)
        version = self.manifest.written_version(table) if self.manifest else None
        if version is None:
            version = delta_io.version_of(spark, path)
        self.inputs[table] = {"path": path, "version": version}
        self._save()
        return delta_io.read(spark, path, version=version)

    def write(self, df, table: str, **kwargs):
        """Write with this run's idempotency key; the version recorded is the one *this run* committed.

        When Delta skips the write (an earlier attempt of this step committed it), the
        version comes from that attempt's record, not from the table's latest version,
        which another run may have written since.
        """
        from sparkdeep import delta_io
        path = self.paths.table(table)
        if not self.run_id:
            ref = delta_io.write(df, path, **kwargs)
        else:
            before = delta_io.version_of(df.sparkSession, path) if delta_io.is_table(df.sparkSession, path) else None
            ref = delta_io.write(df, path, txn=(f"sparkdeep:{self.run_id}:{self.step}:{table}", self.generation),
                                 **kwargs)
            committed = self._entry.setdefault("committed", {})
            if before is not None and ref.version == before:  # skipped: committed by an earlier attempt
                earlier = committed.get(table)
                if earlier and earlier["generation"] == self.generation:
                    ref = delta_io.TableRef(path, earlier["version"])
                else:
                    print(f"[{self.step}] {table}: Delta skipped the write (this run committed it before) but "
                          f"the attempt that did left no record; using the latest version {ref.version}", flush=True)
            else:
                committed[table] = {**ref.as_dict(), "generation": self.generation}
        self.outputs[table] = ref.as_dict()
        self._save()
        return ref

    def _save(self) -> None:
        if self.manifest:
            self.manifest.save()


RUNS_SCHEMA = ("run_id STRING, status STRING, created_at STRING, updated_at STRING, attempts INT, "
               "code_version STRING, config_json STRING, steps_succeeded ARRAY<STRING>, "
               "table_versions MAP<STRING, BIGINT>, row_counts MAP<STRING, BIGINT>, "
               "metrics_json STRING, model_path STRING, step_wall_s MAP<STRING, DOUBLE>, manifest_path STRING")


def runs_row(m: Manifest) -> dict:
    d = m.data
    steps = d["steps"]
    rows = {f"{s}.{k}": int(v) for s in STEP_ORDER for k, v in steps.get(s, {}).get("rows", {}).items()}
    cv = d.get("code_version") or {}
    return {
        "run_id": d["run_id"], "status": d["status"], "created_at": d["created_at"],
        "updated_at": d.get("updated_at"), "attempts": int(d.get("attempts", 1)),
        "code_version": cv.get("git_commit") or cv.get("package"),
        "config_json": json.dumps(d["config"], sort_keys=True),
        "steps_succeeded": [s for s in STEP_ORDER if m.done(s)],
        "table_versions": {k: int(v) for k, v in m.table_versions().items()},
        "row_counts": rows, "metrics_json": json.dumps(d.get("metrics"), sort_keys=True),
        "model_path": (d.get("models") or {}).get("pipeline"),
        "step_wall_s": {s: float(steps[s]["wall_s"]) for s in STEP_ORDER
                        if steps.get(s, {}).get("wall_s") is not None},
        "manifest_path": m.path,
    }


def record_run(spark, m: Manifest) -> None:
    """Upsert the run's row into the Delta table ``<output>/tables/runs`` (MERGE on run_id)."""
    from delta.tables import DeltaTable
    from sparkdeep import delta_io
    path = m.paths.table("runs")
    row = spark.createDataFrame([runs_row(m)], RUNS_SCHEMA)
    if not delta_io.is_table(spark, path):
        try:
            row.write.format("delta").mode("errorifexists").save(path)
            return
        except Exception:  # noqa: BLE001 - created meanwhile: fall through to the merge
            pass
    (DeltaTable.forPath(spark, path).alias("t")
     .merge(row.alias("s"), "t.run_id = s.run_id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
