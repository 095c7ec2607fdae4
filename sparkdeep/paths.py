"""Where each step's tables, models and reports live under the output folder."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


def write_json(path: str, data: dict) -> str:
    """Write ``data`` as JSON atomically (temp file + rename): readers never see half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Paths:
    root: str

    @classmethod
    def under(cls, output_dir: str) -> "Paths":
        return cls(os.path.abspath(output_dir))

    def table(self, name: str) -> str:
        return os.path.join(self.root, "tables", name)

    def model(self, name: str) -> str:
        return os.path.join(self.root, "models", name)

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
