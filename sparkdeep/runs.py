"""Runs: an id per run, one writer per output folder, a manifest per run, a Delta runs table.

A *run* is one pass of some or all steps over one output folder, named by a run id
(``--run-id``; a new one is made when none is given). :class:`Run` owns its life cycle:
a job enters it, and it takes the output lock, opens (or resumes) the manifest, brackets
each step, marks a step that raised as failed, records the run's row and releases the lock.

The manifest, ``<output>/runs/<run_id>/manifest.json``, records the config, the code
version, each step's status, the Delta table versions and model folders (with digests) it
read and wrote, row counts, metrics and timings. It is rewritten atomically after every
change, so a killed run leaves a manifest that says which steps finished: a rerun with the
same run id skips those and redoes the one that was interrupted. Redoing a step (``--force``,
or a resume) marks every later step of :data:`STEPS` that had finished ``stale``: each
step consumes the outputs of the steps before it, so those results no longer follow from
what is on disk, and the next invocation redoes them instead of skipping them.

Every Delta write of a step carries ``txnAppId = sparkdeep:<run_id>:<step>:<table>`` and
``txnVersion = <generation>``: Delta commits each pair once, so a step retried any number
of times adds no duplicate rows, and ``--force`` (a new generation) really rewrites.

Reads are pinned: a step reads the version of a table that an earlier step *of the same
run* wrote, not whatever is newest, so a resumed run sees exactly its own inputs. Models
have no versions, so each run writes its own folders
(``models/runs/<run_id>/<generation>/<name>``) and a step loads its run's model after
checking the folder's digest against the manifest; a run that wrote none loads the
promoted one, ``models/latest.json``, written only by :meth:`StepRun.promote` once a model
passed the quality gate.

:class:`OutputLock` is an exclusive ``flock`` on ``<output>/.lock``: a second run on the
same output fails at once naming the holder (or waits ``--wait-lock`` seconds). The
kernel drops the lock when its process dies, so a killed run never leaves a stale lock.
On ``hdfs://`` and other Hadoop URIs the lock is a file created only if absent; see
:class:`OutputLock` for what replaces the kernel's clean-up there.

Every file here goes through :mod:`sparkdeep.storage`, so the output folder may be local
or any Hadoop URI; the path keeps its scheme in the manifest and the runs table.
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

from sparkdeep import storage
from sparkdeep.config import Config, ConfigError
from sparkdeep.paths import ADHOC, MODELS, Paths, read_json, tree_digest, write_json

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

#: The steps of a run, in order: each consumes the outputs of the ones before it.
STEPS = ("ingest", "prepare", "train", "score", "evaluate")


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
    """An exclusive lock on an output folder for the life of a run.

    Local folders: ``flock`` on ``<output>/.lock``, which the kernel drops when the process
    dies. Hadoop URIs (``hdfs://``...), where ``flock`` means nothing: the lock file is
    created only if absent (:meth:`sparkdeep.storage.Storage.lock`) and deleted on release;
    one left by a run killed on this host is taken over, one from another host is reported
    with its owner and age (``--break-lock`` takes it over once that run is known to be gone).
    """

    def __init__(self, root: str, run_id: str, wait_s: float = 0.0, break_stale: bool = False):
        self.root = root
        self.break_stale = break_stale
        self.path = storage.join(root, ".lock")
        self.run_id = run_id
        self.wait_s = wait_s
        self._fd: int | None = None
        self._held = None

    def __enter__(self) -> "OutputLock":
        if not storage.is_local(self.root):
            return self._enter_remote()
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
                    raise self._locked(holder) from None
                time.sleep(0.5)
        holder = {"run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(), "since": now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def _enter_remote(self) -> "OutputLock":
        from sparkdeep.storage import LockHeldError, Storage
        deadline = time.monotonic() + self.wait_s
        while True:
            held = Storage().lock(self.path, owner=f"run {self.run_id}", break_after_s=0 if self.break_stale else None)
            try:
                held.__enter__()
                self._held = held
                return self
            except LockHeldError:
                if time.monotonic() >= deadline:
                    try:
                        holder = json.loads(Storage().read_bytes(self.path))
                        holder["run_id"] = str(holder.get("owner", "?")).removeprefix("run ")
                    except Exception:  # noqa: BLE001 - released meanwhile, or not ours
                        holder = {}
                    raise self._locked(holder, remote=True) from None
                time.sleep(1.0)

    def _locked(self, holder: dict, remote: bool = False) -> "OutputLocked":
        waited = f" after waiting {self.wait_s:.0f}s" if self.wait_s else ""
        stale = (f"; if that run is gone (killed on another host), pass --break-lock (or delete {self.path})"
                 if remote else "")
        return OutputLocked(
            f"output {self.root!r} is in use by run {holder.get('run_id', '?')!r} "
            f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')}, since "
            f"{holder.get('since', '?')}){waited}; wait for it, or pass --wait-lock SECONDS{stale}")

    def __exit__(self, *exc: Any) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held.__exit__(None, None, None)
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


def error_line(exc: BaseException) -> str:
    """One line naming the error: for a JVM error, its root cause (``java.io.IOException:
    No space left on device``), not py4j's ``An error occurred while calling o123.save``;
    where Hadoop wrapped the cause to name the address it failed to reach, that wrapper."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            chain = [java]
            while chain[-1].getCause() is not None and len(chain) < 50:
                chain.append(chain[-1].getCause())
            root = chain[-1]
            text = str(root.toString())
            # Hadoop wraps a network error in one of the same class that names the address
            # ("Call From host to 127.0.0.1:8020 failed on connection exception: ...").
            if len(chain) > 1 and chain[-2].getClass().getName() == root.getClass().getName() and \
                    str(root.getMessage() or "") in str(chain[-2].getMessage() or ""):
                text = str(chain[-2].toString())
            return f"{type(exc).__name__}: {text}".splitlines()[0]
        except Exception:  # noqa: BLE001 - the JVM may be gone: fall back to the Python text
            pass
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class StaleInputError(RuntimeError):
    """A step's input is not what its run recorded, or does not belong with its other inputs."""


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
        data = read_json(path)
        if data is not None:
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
        if force:  # recorded, so a resume of a forced run without --force keeps its own checkpoints
            data["forced"] = True
        data["code_version"] = code_version()
        m = cls(paths, data)
        m.save()
        return m

    def save(self) -> None:
        # What the run as a whole offers is derived from its finished steps on every save,
        # so a step made stale stops contributing its models and metrics at once.
        finished = [self.data["steps"][s] for s in STEPS if self.done(s)]
        self.data["models"] = {n: r["path"] for e in finished for n, r in e.get("model_outputs", {}).items()}
        metrics = [e["metrics"] for e in finished if "metrics" in e]
        self.data["metrics"] = metrics[-1] if metrics else None
        self.data["updated_at"] = now()
        write_json(self.path, self.data)

    def entry(self, step: str) -> dict:
        return self.data["steps"].get(step, {})

    def done(self, step: str) -> bool:
        return self.entry(step).get("status") == "succeeded"

    def written_version(self, table: str) -> int | None:
        """The version of ``table`` that an earlier step of this run wrote (latest step wins)."""
        found = None
        for name in STEPS:
            entry = self.entry(name)
            if entry.get("status") == "succeeded" and table in entry.get("outputs", {}):
                found = entry["outputs"][table]["version"]
        return found

    def written_model(self, name: str) -> dict | None:
        """``{"path", "digest"}`` of model ``name`` as a finished step of this run wrote it."""
        found = None
        for step in STEPS:
            entry = self.entry(step)
            if entry.get("status") == "succeeded" and name in entry.get("model_outputs", {}):
                found = entry["model_outputs"][name]
        return found

    def unfinished_writer(self, name: str) -> str | None:
        """The step of this run that began writing model ``name`` but has not (or no longer) succeeded."""
        for step in STEPS:
            entry = self.entry(step)
            if entry.get("status") != "succeeded" and name in entry.get("model_outputs", {}):
                return step
        return None

    def start(self, step: str) -> "StepRun":
        entry = self.data["steps"].setdefault(step, {"attempts": 0})
        entry.update({"status": "running", "started_at": now(), "attempts": entry.get("attempts", 0) + 1,
                      "inputs": {}, "outputs": {}, "model_inputs": {}, "model_outputs": {}})
        for key in ("error", "stale_because", "metrics"):
            entry.pop(key, None)
        for later in STEPS[STEPS.index(step) + 1:]:
            if self.done(later):
                self.data["steps"][later].update(status="stale", stale_because=f"{step} was redone at {now()}")
        self.data["status"] = "running"
        self.save()
        return StepRun(self, step)

    def finish(self, step: str, report: dict) -> None:
        entry = self.data["steps"][step]
        entry.update({"status": "succeeded", "finished_at": now(), "wall_s": report.get("wall_s"),
                      "rows": {k: v for k, v in report.items() if k.startswith("rows") and isinstance(v, int)},
                      "report": self.paths.run_report(self.data["run_id"], step)})
        if "metrics" in report:
            entry["metrics"] = report["metrics"]
        self.data["status"] = "succeeded" if all(self.done(s) for s in STEPS) else "partial"
        self.save()

    def fail(self, step: str, error: str) -> None:
        entry = self.data["steps"][step]
        entry.update({"status": "failed", "finished_at": now(), "error": error})
        self.data["status"] = "failed"
        self.save()

    def table_versions(self) -> dict[str, int]:
        """Every table this run read or wrote -> the version (writes win over reads); stale
        steps left out, as their outputs no longer follow from the run's inputs."""
        out: dict[str, int] = {}
        for name in STEPS:
            entry = self.entry(name)
            if entry.get("status") == "stale":
                continue
            for kind in ("inputs", "outputs"):
                for table, ref in entry.get(kind, {}).items():
                    if kind == "outputs" or table not in out:
                        out[table] = ref["version"]
        return out


def read_latest(paths: Paths) -> dict | None:
    """The promoted models' pointer, ``models/latest.json``, or None before any promotion."""
    return read_json(paths.latest)


class StepRun:
    """What a step uses to read and write tables and models inside a run: pinned reads, keyed writes."""

    def __init__(self, manifest: Manifest | None, step: str, paths: Paths | None = None):
        self.manifest = manifest
        self.step = step
        self.paths = paths or manifest.paths
        self.run_id = manifest.data["run_id"] if manifest else None
        self.generation = manifest.data.get("generation", 0) if manifest else 0
        self._entry = (manifest.data["steps"][step] if manifest else
                       {"inputs": {}, "outputs": {}, "model_inputs": {}, "model_outputs": {}})

    @classmethod
    def adhoc(cls, paths: Paths, step: str) -> "StepRun":
        """Outside a run (tests, notebooks): latest reads, plain writes, lineage kept in memory;
        models go to ``models/runs/_adhoc/0/<name>`` and are loaded from there unchecked."""
        return cls(None, step, paths)

    @property
    def inputs(self) -> dict:
        return self._entry["inputs"]

    @property
    def outputs(self) -> dict:
        return self._entry["outputs"]

    @property
    def model_inputs(self) -> dict:
        return self._entry["model_inputs"]

    @property
    def model_outputs(self) -> dict:
        return self._entry["model_outputs"]

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

    def from_this_run(self, table: str) -> bool:
        """Whether the version of ``table`` this step read was written by its own run."""
        own = self.manifest.written_version(table) if self.manifest else None
        return own is not None and self.inputs.get(table, {}).get("version") == own

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

    def save_model(self, model, name: str) -> str:
        """Save a fitted MLlib model as this run's ``name`` and record its folder's digest."""
        path = self.paths.model(name, self.run_id, self.generation)
        model.write().overwrite().save(path)
        self.model_outputs[name] = {"path": path, "digest": tree_digest(path)}
        self._save()
        return path

    def model_input(self, name: str) -> str:
        """The folder of model ``name`` this step is to load, checked and recorded as an input.

        This run's own model when one of its finished steps wrote it, else the promoted one
        (``models/latest.json``). Refused when the folder's digest is not the one recorded
        (something replaced the model since), when this run began writing the model but
        that step has not succeeded, or when the promoted model was made from other versions
        of the tables this step has already read (read tables before models).
        """
        ref, source = self._own_model(name), self.run_id or ADHOC
        if ref is None:
            writer = self.manifest.unfinished_writer(name) if self.manifest else None
            if writer:
                raise StaleInputError(f"model {name!r}: this run's {writer} step, which writes it, has status "
                                      f"{self.manifest.entry(writer)['status']!r}; run {writer} first")
            latest = read_latest(self.paths)
            if not latest or name not in latest.get("models", {}):
                raise FileNotFoundError(f"no model {name!r}: this run wrote none and none has been promoted "
                                        f"({self.paths.latest}); run the step that writes it first")
            ref, source = latest["models"][name], latest["run_id"]
            for table, got in self.inputs.items():
                want = latest.get("tables", {}).get(table)
                if want is not None and want != got["version"]:
                    raise StaleInputError(
                        f"model {name!r} (promoted from run {source!r}) was made with {table} v{want}, but this "
                        f"step read v{got['version']}; run the steps that write {name!r} in this run")
        digest = tree_digest(ref["path"])
        if digest != ref["digest"]:
            raise StaleInputError(f"model {name!r} at {ref['path']} is not the one run {source!r} recorded "
                                  f"(digest {digest[:12]}, recorded {ref['digest'][:12]}): another run or process "
                                  "replaced it; redo the step that writes it (--force)")
        self.model_inputs[name] = {**ref, "run_id": source}
        self._save()
        return ref["path"]

    def _own_model(self, name: str) -> dict | None:
        if self.manifest:
            return self.manifest.written_model(name)
        path = self.paths.model(name, None)
        return {"path": path, "digest": tree_digest(path)} if storage.Storage().is_dir(path) else None

    def promote(self, metrics: dict, evaluated: str | None = None) -> dict | None:
        """Point ``models/latest.json`` at this run's models; call only after they passed the gate.

        Inside a run, only when the ``evaluated`` table this step read was written by a step
        of this run from models this run wrote (else it returns None: the models evaluated
        were already promoted, or are another run's). Outside a run nothing tells where a
        table came from: the ``_adhoc`` models are promoted only on an explicit call without
        ``evaluated`` (tests, notebooks). The pointer names the run, each model's folder and
        digest (a model this run did not write but used, such as a promoted ``prepare``, is
        carried over), the held-out ``metrics`` the next gate compares against, and the
        table versions the run used.
        """
        if self.manifest:
            if not (evaluated and self._made_by_own_models(evaluated)):
                return None
        elif evaluated:
            return None
        models = {}
        for name in MODELS:
            ref = self._own_model(name) or self._used_model(name)
            if ref is None:
                raise StaleInputError(f"run {self.run_id or ADHOC!r} used no {name!r} model: nothing to promote")
            if tree_digest(ref["path"]) != ref["digest"]:
                raise StaleInputError(f"model {name!r} at {ref['path']} changed since run "
                                      f"{self.run_id or ADHOC!r} recorded it: not promoted")
            models[name] = {"path": ref["path"], "digest": ref["digest"]}
        tables = self.manifest.table_versions() if self.manifest else {}
        tables.update({t: ref["version"] for t, ref in self.inputs.items()})
        pointer = {"run_id": self.run_id or ADHOC, "promoted_at": now(), "models": models,
                   "metrics": metrics, "tables": tables}
        write_json(self.paths.latest, pointer)
        if self.manifest:
            self.manifest.data["promoted"] = pointer
            self._save()
        return pointer

    def _made_by_own_models(self, table: str) -> bool:
        if not self.from_this_run(table):
            return False
        for step in STEPS:
            entry = self.manifest.entry(step)
            if entry.get("status") == "succeeded" and \
                    entry.get("outputs", {}).get(table, {}).get("version") == self.inputs[table]["version"]:
                used = list(entry.get("model_inputs", {}).values())
                return bool(used) and all(ref["run_id"] == self.run_id for ref in used)
        return False

    def _used_model(self, name: str) -> dict | None:
        for step in STEPS:
            entry = self.manifest.entry(step) if self.manifest else {}
            if entry.get("status") == "succeeded" and name in entry.get("model_inputs", {}):
                return entry["model_inputs"][name]
        return None

    def report_of(self, step: str) -> dict | None:
        """A step's report: this run's own copy when it has one, else the latest."""
        own = read_json(self.paths.run_report(self.run_id, step)) if self.run_id else None
        return own if own is not None else read_json(self.paths.report(step))

    def save_report(self, report: dict) -> None:
        """``reports/<step>.json`` (the latest, any run) and the run's own copy."""
        write_json(self.paths.report(self.step), report)
        if self.run_id:
            write_json(self.paths.run_report(self.run_id, self.step), report)

    def _save(self) -> None:
        if self.manifest:
            self.manifest.save()


class Run:
    """One run's life cycle over one output folder: the context manager a job enters.

    Entering takes the output lock and opens (or resumes) the manifest. :meth:`pending`
    says whether a step is to run; :meth:`start` and :meth:`finish` bracket it. Leaving
    marks the step that raised as failed (naming the cause in one line), upserts the run's
    row into the runs table when the job attached a Spark session (:attr:`session`), and
    releases the lock. The job keeps its arguments, the session and the exit codes.

    >>> with Run(cfg, "nightly") as run:                       # doctest: +SKIP
    ...     for name in STEPS:
    ...         if run.pending(name):
    ...             step_run = run.start(name)
    ...             run.finish(step_run, step(spark, cfg, run.paths, step_run))
    """

    def __init__(self, cfg: Config, run_id: str | None = None, *, force: bool = False, wait_lock: float = 0.0,
                 break_lock: bool = False):
        self.cfg = cfg
        self.run_id = check_run_id(run_id) if run_id else new_run_id()
        self.paths = Paths.under(cfg.output_dir)
        self.force = force
        self.manifest: Manifest | None = None
        self.current: str | None = None
        self.session = None
        #: Why a failure could not be written to the manifest (disk full...), or None.
        self.unrecorded: str | None = None
        self._lock = OutputLock(self.paths.root, self.run_id, wait_s=wait_lock, break_stale=break_lock)

    def __enter__(self) -> "Run":
        self._lock.__enter__()
        try:
            self.manifest = Manifest.open(self.paths, self.run_id, self.cfg, force=self.force)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    def pending(self, step: str) -> bool:
        """Whether ``step`` is to run now: not finished in this run, made stale, or --force."""
        entry = self.manifest.entry(step)
        if entry.get("status") == "stale":
            print(f"[{step}] done in run {self.run_id} but stale ({entry['stale_because']}): redoing it", flush=True)
            return True
        if self.force or not self.manifest.done(step):
            return True
        print(f"[{step}] already done in run {self.run_id}: skipped (--force redoes it)", flush=True)
        return False

    def start(self, step: str) -> StepRun:
        self.current = step
        return self.manifest.start(step)

    def finish(self, step_run: StepRun, report: dict) -> None:
        self.manifest.finish(step_run.step, report)
        self.current = None

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc is not None and self.current is not None:
                try:
                    self.manifest.fail(self.current, error_line(exc))
                except OSError as err:  # the disk that failed the step may fail this too
                    self.unrecorded = error_line(err)
            if self.session is not None:
                try:
                    record_run(self.session, self.manifest)
                except Exception:  # noqa: BLE001 - after a failure, the step's own error is the one to report
                    if exc is None:
                        raise
        finally:
            self._lock.__exit__(None, None, None)


RUNS_SCHEMA = ("run_id STRING, status STRING, created_at STRING, updated_at STRING, attempts INT, "
               "code_version STRING, config_json STRING, steps_succeeded ARRAY<STRING>, "
               "table_versions MAP<STRING, BIGINT>, row_counts MAP<STRING, BIGINT>, "
               "metrics_json STRING, model_path STRING, step_wall_s MAP<STRING, DOUBLE>, manifest_path STRING")


def runs_row(m: Manifest) -> dict:
    d = m.data
    steps = d["steps"]
    rows = {f"{s}.{k}": int(v) for s in STEPS for k, v in steps.get(s, {}).get("rows", {}).items()}
    cv = d.get("code_version") or {}
    return {
        "run_id": d["run_id"], "status": d["status"], "created_at": d["created_at"],
        "updated_at": d.get("updated_at"), "attempts": int(d.get("attempts", 1)),
        "code_version": cv.get("git_commit") or cv.get("package"),
        "config_json": json.dumps(d["config"], sort_keys=True),
        "steps_succeeded": [s for s in STEPS if m.done(s)],
        "table_versions": {k: int(v) for k, v in m.table_versions().items()},
        "row_counts": rows, "metrics_json": json.dumps(d.get("metrics"), sort_keys=True),
        "model_path": (d.get("models") or {}).get("pipeline"),
        "step_wall_s": {s: float(steps[s]["wall_s"]) for s in STEPS
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
