"""Where each step's tables, models and reports live under the output folder.

Tables are shared by all runs (Delta versions tell runs apart). Models are not versioned
by anything, so each run writes its own, ``models/runs/<run_id>/<generation>/<name>`` (a
``--force`` starts a new generation, so it never rewrites a folder that may have been
promoted), and ``models/latest.json`` points at the set that last passed the quality gate.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

#: The models a run writes, in the order its steps write them.
MODELS = ("prepare", "pipeline", "baseline")

# Not a run id (those start with a letter or digit): models written outside a run.
ADHOC = "_adhoc"


class OutputWriteError(OSError):
    """A file under the output folder could not be written; the message names it and the cause."""


def write_json(path: str, data: dict) -> str:
    """Write ``data`` as JSON atomically (temp file + rename): readers never see half a file.

    A failure (disk full, no permission) raises :class:`OutputWriteError` naming ``path``
    and the cause, and leaves no temp file behind.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputWriteError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def tree_digest(folder: str) -> str:
    """SHA-256 over every file's relative path and bytes under ``folder`` (a saved model).

    Hadoop's ``.crc`` side files and ``_SUCCESS`` markers are left out: they follow from
    the files themselves. Two folders have the same digest exactly when they hold the same
    model, whatever their location.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no model folder at {folder!r}")
    h = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".crc") or name == "_SUCCESS":
                continue
            full = os.path.join(root, name)
            h.update(os.path.relpath(full, folder).encode() + b"\0")
            with open(full, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            h.update(b"\0")
    return h.hexdigest()


@dataclass(frozen=True)
class Paths:
    root: str

    @classmethod
    def under(cls, output_dir: str) -> "Paths":
        return cls(os.path.abspath(output_dir))

    def table(self, name: str) -> str:
        return os.path.join(self.root, "tables", name)

    def model(self, name: str, run_id: str | None, generation: int = 0) -> str:
        """The model ``name`` as written by run ``run_id`` (``None``: outside a run)."""
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; known: {MODELS}")
        return os.path.join(self.root, "models", "runs", run_id or ADHOC, str(generation), name)

    @property
    def latest(self) -> str:
        """The pointer to the promoted models (which run, folders, digests, metrics)."""
        return os.path.join(self.root, "models", "latest.json")

    def report(self, name: str, ext: str = "json") -> str:
        return os.path.join(self.root, "reports", f"{name}.{ext}")

    def manifest(self, run_id: str) -> str:
        return os.path.join(self.root, "runs", run_id, "manifest.json")

    def run_report(self, run_id: str, name: str, ext: str = "json") -> str:
        return os.path.join(self.root, "runs", run_id, "reports", f"{name}.{ext}")

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.root, "checkpoints")

    @property
    def staging(self) -> str:
        return os.path.join(self.root, "staging")
