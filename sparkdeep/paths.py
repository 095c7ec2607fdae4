"""Where each step's tables, models and reports live under the output folder."""
from __future__ import annotations

import os
from dataclasses import dataclass


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

    def report(self, name: str) -> str:
        return os.path.join(self.root, "reports", f"{name}.json")

    def manifest(self, run_id: str) -> str:
        return os.path.join(self.root, "runs", run_id, "manifest.json")

    def run_report(self, run_id: str, name: str) -> str:
        return os.path.join(self.root, "runs", run_id, "reports", f"{name}.json")

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.root, "checkpoints")

    @property
    def staging(self) -> str:
        return os.path.join(self.root, "staging")
