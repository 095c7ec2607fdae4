"""Where each step's tables, models and reports live under the output folder.

Tables are shared by all runs (Delta versions tell runs apart). Models are not versioned
by anything, so each run writes its own, ``models/runs/<run_id>/<generation>/<name>`` (a
``--force`` starts a new generation, so it never rewrites a folder that may have been
promoted), and ``models/latest.json`` points at the set that last passed the quality gate.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sparkdeep import storage
from sparkdeep.errors import error_line
from sparkdeep.registry import Models
from sparkdeep.storage import Storage

#: The models a run writes, in the order its steps write them.
MODELS = Models.ALL

# Not a run id (those start with a letter or digit): models written outside a run.
ADHOC = "_adhoc"


class OutputWriteError(OSError):
    """A file under the output folder could not be written; the message names it and the cause."""


def write_json(path: str, data: dict) -> str:
    """Write ``data`` as JSON atomically (temp file + rename, or one PUT on an object store):
    readers never see half a file. ``path`` is local or any Hadoop URI (:mod:`sparkdeep.storage`).

    A failure (disk full, no permission, the file system unreachable) raises
    :class:`OutputWriteError` naming ``path`` and the cause, and leaves no temp file behind.
    """
    try:
        Storage().write_json(path, data)
    except OSError as exc:
        raise OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # noqa: BLE001 - a Py4J error from the Hadoop FileSystem
        raise OutputWriteError(None, f"cannot write {path}: {error_line(exc, typed=False)}") from exc
    return path


def read_json(path: str):
    """The JSON document at ``path`` (local or a Hadoop URI), or None when there is none."""
    try:
        return Storage().read_json(path)
    except FileNotFoundError:
        return None


def _walk_order(relative: str) -> tuple:
    """A folder's files first (by name), then each sub-folder's (by name), depth first: the
    order of a sorted ``os.walk``, so digests recorded before stay valid."""
    *dirs, name = relative.split("/")
    return tuple((1, d) for d in dirs) + ((0, name),)


def tree_digest(folder: str) -> str:
    """SHA-256 over every file's relative path and bytes under ``folder`` (a saved model),
    local or on any Hadoop file system.

    Hadoop's ``.crc`` side files and ``_SUCCESS`` markers are left out: they follow from
    the files themselves. Two folders have the same digest exactly when they hold the same
    model, whatever their location.
    """
    st = Storage()
    try:
        names = st.files(folder)
    except FileNotFoundError:
        raise FileNotFoundError(f"no model folder at {folder!r}") from None
    h = hashlib.sha256()
    for name in sorted(names, key=_walk_order):
        if name.rsplit("/", 1)[-1].endswith(".crc") or name.rsplit("/", 1)[-1] == "_SUCCESS":
            continue
        h.update(name.encode() + b"\0")
        h.update(st.read_bytes(storage.join(folder, name)))
        h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Paths:
    """The output folder's layout. ``root`` keeps its scheme: a local folder is made
    absolute, ``hdfs://``, ``s3a://``... URIs stay as they are."""

    root: str

    @classmethod
    def under(cls, output_dir: str) -> "Paths":
        return cls(storage.qualify(output_dir))

    def table(self, name: str) -> str:
        return storage.join(self.root, "tables", name)

    def model(self, name: str, run_id: str | None, generation: int = 0) -> str:
        """The model ``name`` as written by run ``run_id`` (``None``: outside a run)."""
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; known: {MODELS}")
        return storage.join(self.root, "models", "runs", run_id or ADHOC, str(generation), name)

    @property
    def latest(self) -> str:
        """The pointer to the promoted models (which run, folders, digests, metrics)."""
        return storage.join(self.root, "models", "latest.json")

    def report(self, name: str, ext: str = "json") -> str:
        return storage.join(self.root, "reports", f"{name}.{ext}")

    def manifest(self, run_id: str) -> str:
        return storage.join(self.root, "runs", run_id, "manifest.json")

    def run_report(self, run_id: str, name: str, ext: str = "json") -> str:
        return storage.join(self.root, "runs", run_id, "reports", f"{name}.{ext}")

    def trace_dir(self, run_id: str | None) -> str:
        """The run's optional deep traces (TensorFlow profiler, Horovod timeline); a step run
        outside a run (no id) writes them under ``runs/_adhoc``."""
        return storage.join(self.root, "runs", run_id or ADHOC, "reports", "trace")

    def tune_dir(self, run_id: str | None) -> str:
        """The run's hyperparameter search: ``optuna.db``, its SQLite storage by default
        (``tune.storage``); a step outside a run keeps it under ``runs/_adhoc``."""
        return storage.join(self.root, "runs", run_id or ADHOC, "tune")

    @property
    def checkpoints(self) -> str:
        return storage.join(self.root, "checkpoints")
