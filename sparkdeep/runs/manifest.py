"""The manifest of a run: typed records, saved as JSON after every change.

``<output>/runs/<run_id>/manifest.json`` holds one :class:`RunRecord`: the config, the code
version, and per step a :class:`StepRecord` (status, attempts, the table versions and model
folders it read and wrote, row counts, metrics, timings). The JSON keys are the field names;
keys this version does not know are kept as they are (``extra``), so an older or newer
manifest survives a resume.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, TypedDict

from sparkdeep.config import Config, ConfigError
from sparkdeep.paths import Paths, read_json, write_json
from sparkdeep.runs.ids import STEPS, code_version, now


class Status(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STALE = "stale"      # a step whose inputs were redone since it finished
    PARTIAL = "partial"  # a run: some steps done, none failed, not all done


class TableRef(TypedDict):
    path: str
    version: int


class ModelRef(TypedDict, total=False):
    path: str
    digest: str
    run_id: str  # in model_inputs: the run that wrote the folder


def _known(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")


def _as_json(record) -> dict:
    out = dict(record.extra)
    for f in dataclasses.fields(record):
        if f.name == "extra":
            continue
        value = getattr(record, f.name)
        if value is None or (f.name in _OMIT_EMPTY and not value):
            continue
        out[f.name] = value
    return out


_OMIT_EMPTY = ("committed", "rows", "forced", "promoted")


@dataclass
class StepRecord:
    """One step of a run, as the manifest records it."""
    status: Status | None = None
    attempts: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None
    inputs: dict[str, TableRef] = field(default_factory=dict)
    outputs: dict[str, TableRef] = field(default_factory=dict)
    model_inputs: dict[str, ModelRef] = field(default_factory=dict)
    model_outputs: dict[str, ModelRef] = field(default_factory=dict)
    #: table -> the version this step's attempts committed, with the generation
    committed: dict[str, dict] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    metrics: dict | None = None
    report: str | None = None
    error: str | None = None
    stale_because: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.status == Status.SUCCEEDED

    @classmethod
    def from_json(cls, data: Mapping) -> "StepRecord":
        known = {k: data[k] for k in _known(cls) if k in data}
        if known.get("status") is not None:
            known["status"] = Status(known["status"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in _known(cls)})

    def to_json(self) -> dict:
        return _as_json(self)


@dataclass
class RunRecord:
    """A run as its manifest records it."""
    run_id: str
    created_at: str
    config: dict
    output_dir: str
    status: Status = Status.RUNNING
    attempts: int = 1
    generation: int = 0
    #: True once a --force attempt ran: a resume without --force keeps that attempt's checkpoints
    forced: bool = False
    steps: dict[str, StepRecord] = field(default_factory=dict)
    code_version: dict | None = None
    #: derived on every save from the finished steps: model name -> folder, the last metrics
    models: dict[str, str] = field(default_factory=dict)
    metrics: dict | None = None
    updated_at: str | None = None
    #: models/latest.json as this run wrote it, when its models were promoted
    promoted: dict | None = None
    extra: dict = field(default_factory=dict)

    def step(self, name: str) -> StepRecord:
        """The record of step ``name`` (an empty one, not stored, when it never started)."""
        return self.steps.get(name) or StepRecord()

    def done(self, name: str) -> bool:
        return self.step(name).succeeded

    @classmethod
    def from_json(cls, data: Mapping) -> "RunRecord":
        known = {k: data[k] for k in _known(cls) if k in data}
        known["status"] = Status(known.get("status", Status.RUNNING))
        known["steps"] = {n: StepRecord.from_json(s) for n, s in known.get("steps", {}).items()}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _known(cls)})

    def to_json(self) -> dict:
        out = _as_json(self)
        out["steps"] = {n: s.to_json() for n, s in self.steps.items()}
        out["models"] = dict(self.models)
        out["metrics"] = self.metrics  # null before any step reported metrics
        return out


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
    """The manifest of one run (:attr:`record`); every change is saved atomically."""

    def __init__(self, paths: Paths, record: RunRecord):
        self.paths = paths
        self.record = record

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def path(self) -> str:
        return self.paths.manifest(self.record.run_id)

    @classmethod
    def open(cls, paths: Paths, run_id: str, cfg: Config, force: bool) -> "Manifest":
        path = paths.manifest(run_id)
        config = config_dict(cfg)
        data = read_json(path)
        if data is not None:
            record = RunRecord.from_json(data)
            changed = [k for k in _diff(record.config, config) if not k.startswith(_VOLATILE)]
            if changed and not force:
                raise ConfigError(f"run {run_id!r} was started with a different config ({', '.join(changed)} "
                                  f"differ; see {path}): use a new --run-id, or --force to redo it with this one")
            record.config = config
            record.attempts += 1
            if force:
                record.generation += 1
        else:
            record = RunRecord(run_id=run_id, created_at=now(), config=config, output_dir=paths.root)
        if force:
            record.forced = True
        record.code_version = code_version()
        m = cls(paths, record)
        m.save()
        return m

    def save(self) -> None:
        # What the run as a whole offers is derived from its finished steps on every save,
        # so a step made stale stops contributing its models and metrics at once.
        r = self.record
        finished = [r.steps[s] for s in STEPS if r.done(s)]
        r.models = {n: ref["path"] for e in finished for n, ref in e.model_outputs.items()}
        metrics = [e.metrics for e in finished if e.metrics is not None]
        r.metrics = metrics[-1] if metrics else None
        r.updated_at = now()
        write_json(self.path, r.to_json())

    def entry(self, step: str) -> StepRecord:
        return self.record.step(step)

    def done(self, step: str) -> bool:
        return self.record.done(step)

    def _finished(self):
        for name in STEPS:
            entry = self.record.step(name)
            if entry.succeeded:
                yield name, entry

    def written_version(self, table: str) -> int | None:
        """The version of ``table`` that an earlier step of this run wrote (latest step wins)."""
        found = None
        for _, entry in self._finished():
            if table in entry.outputs:
                found = entry.outputs[table]["version"]
        return found

    def written_model(self, name: str) -> ModelRef | None:
        """``{"path", "digest"}`` of model ``name`` as a finished step of this run wrote it."""
        found = None
        for _, entry in self._finished():
            if name in entry.model_outputs:
                found = entry.model_outputs[name]
        return found

    def used_model(self, name: str) -> ModelRef | None:
        """The model ``name`` a finished step of this run loaded (first step wins)."""
        for _, entry in self._finished():
            if name in entry.model_inputs:
                return entry.model_inputs[name]
        return None

    def unfinished_writer(self, name: str) -> str | None:
        """The step of this run that began writing model ``name`` but has not (or no longer) succeeded."""
        for step in STEPS:
            entry = self.record.step(step)
            if not entry.succeeded and name in entry.model_outputs:
                return step
        return None

    def writer_of(self, table: str, version: int) -> StepRecord | None:
        """The finished step of this run that wrote ``version`` of ``table``."""
        for _, entry in self._finished():
            if entry.outputs.get(table, {}).get("version") == version:
                return entry
        return None

    def start(self, step: str) -> StepRecord:
        r = self.record
        old = r.steps.get(step)
        entry = StepRecord(status=Status.RUNNING, started_at=now(), attempts=(old.attempts if old else 0) + 1,
                           committed=old.committed if old else {}, extra=old.extra if old else {})
        r.steps[step] = entry
        for later in STEPS[STEPS.index(step) + 1:]:
            if r.done(later):
                r.steps[later].status = Status.STALE
                r.steps[later].stale_because = f"{step} was redone at {now()}"
        r.status = Status.RUNNING
        self.save()
        return entry

    def finish(self, step: str, report: dict) -> None:
        entry = self.record.steps[step]
        entry.status, entry.finished_at, entry.wall_s = Status.SUCCEEDED, now(), report.get("wall_s")
        entry.rows = {k: v for k, v in report.items() if k.startswith("rows") and isinstance(v, int)}
        entry.report = self.paths.run_report(self.record.run_id, step)
        if "metrics" in report:
            entry.metrics = report["metrics"]
        self.record.status = Status.SUCCEEDED if all(self.done(s) for s in STEPS) else Status.PARTIAL
        self.save()

    def fail(self, step: str, error: str) -> None:
        entry = self.record.steps[step]
        entry.status, entry.finished_at, entry.error = Status.FAILED, now(), error
        self.record.status = Status.FAILED
        self.save()

    def table_versions(self) -> dict[str, int]:
        """Every table this run read or wrote -> the version (writes win over reads); stale
        steps left out, as their outputs no longer follow from the run's inputs."""
        out: dict[str, int] = {}
        for name in STEPS:
            entry = self.record.step(name)
            if entry.status == Status.STALE:
                continue
            for kind in (entry.inputs, entry.outputs):
                for table, ref in kind.items():
                    if kind is entry.outputs or table not in out:
                        out[table] = ref["version"]
        return out
