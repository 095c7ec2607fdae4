"""What a step reads and writes through: one type per situation, chosen once by the job.

* :class:`RunStep` - inside a run (:meth:`sparkdeep.runs.Run.start`): reads pinned to the
  versions earlier steps of the run wrote, writes keyed for idempotency, models checked
  against their recorded digests, everything recorded in the manifest.
* :class:`AdhocStep` - outside a run (tests, notebooks): latest reads, plain writes,
  lineage kept in memory; models go to ``models/runs/_adhoc/0/<name>`` and are loaded from
  there unchecked.
"""
from __future__ import annotations

import logging

from sparkdeep import storage
from sparkdeep.paths import ADHOC, MODELS, Paths, read_json, tree_digest, write_json
from sparkdeep.runs.ids import now
from sparkdeep.runs.manifest import Manifest, ModelRef, StepRecord

log = logging.getLogger("sparkdeep.runs")


class StaleInputError(RuntimeError):
    """A step's input is not what its run recorded, or does not belong with its other inputs."""


def read_latest(paths: Paths) -> dict | None:
    """The promoted models' pointer, ``models/latest.json``, or None before any promotion."""
    return read_json(paths.latest)


class StepRun:
    """The reads and writes of one step; use :class:`RunStep` or :class:`AdhocStep`."""

    run_id: str | None = None
    generation: int = 0

    def __init__(self, paths: Paths, step: str, entry: StepRecord):
        self.paths = paths
        self.step = step
        self.entry = entry

    # -- what a subclass decides -------------------------------------------------------
    @property
    def forced(self) -> bool:
        """Whether this step belongs to a --force attempt (its checkpoints are its own)."""
        return False

    def _pinned(self, table: str) -> int | None:
        """The version of ``table`` this step must read, or None for the latest."""
        return None

    def _write(self, df, path: str, table: str, kwargs: dict):
        from sparkdeep import delta_io
        return delta_io.write(df, path, **kwargs)

    def _own_model(self, name: str) -> ModelRef | None:
        raise NotImplementedError

    def _check_model_source(self, name: str) -> None:
        """Refuse loading the promoted ``name`` when this step has reason to expect its own."""

    def _save(self) -> None:
        """Record a change of :attr:`entry`."""

    # -- shared ------------------------------------------------------------------------
    @property
    def inputs(self) -> dict:
        return self.entry.inputs

    @property
    def outputs(self) -> dict:
        return self.entry.outputs

    @property
    def model_inputs(self) -> dict:
        return self.entry.model_inputs

    @property
    def model_outputs(self) -> dict:
        return self.entry.model_outputs

    def read(self, spark, table: str):
        """The table as this run last wrote it (or its latest version), recorded as an input."""
        from sparkdeep import delta_io
        path = self.paths.table(table)
        version = self._pinned(table)
        if version is None:
            version = delta_io.version_of(spark, path)
        self.inputs[table] = {"path": path, "version": version}
        self._save()
        return delta_io.read(spark, path, version=version)

    def write(self, df, table: str, **kwargs):
        """Write ``df`` as ``table``; the version recorded is the one this step committed."""
        ref = self._write(df, self.paths.table(table), table, kwargs)
        self.outputs[table] = ref.as_dict()
        self._save()
        return ref

    def save_model(self, model, name: str) -> str:
        """Save a fitted MLlib model as this step's ``name`` and record its folder's digest."""
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
            self._check_model_source(name)
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

    def promote(self, metrics: dict, evaluated: str | None = None) -> dict | None:
        """Point ``models/latest.json`` at this step's models; call only after they passed the gate.
        Returns the pointer written, or None when these models are not this step's to promote."""
        raise NotImplementedError

    def _promote(self, metrics: dict, used, tables: dict) -> dict:
        """Write the pointer: the run, each model's folder and digest (a model this run did not
        write but used, such as a promoted ``prepare``, carried over), the held-out
        ``metrics`` the next gate compares against, and the table versions the run used."""
        models = {}
        for name in MODELS:
            ref = self._own_model(name) or used(name)
            if ref is None:
                raise StaleInputError(f"run {self.run_id or ADHOC!r} used no {name!r} model: nothing to promote")
            if tree_digest(ref["path"]) != ref["digest"]:
                raise StaleInputError(f"model {name!r} at {ref['path']} changed since run "
                                      f"{self.run_id or ADHOC!r} recorded it: not promoted")
            models[name] = {"path": ref["path"], "digest": ref["digest"]}
        tables.update({t: ref["version"] for t, ref in self.inputs.items()})
        pointer = {"run_id": self.run_id or ADHOC, "promoted_at": now(), "models": models,
                   "metrics": metrics, "tables": tables}
        write_json(self.paths.latest, pointer)
        return pointer

    def report_of(self, step: str) -> dict | None:
        """A step's report: this run's own copy when it has one, else the latest."""
        own = read_json(self.paths.run_report(self.run_id, step)) if self.run_id else None
        return own if own is not None else read_json(self.paths.report(step))

    def save_report(self, report: dict) -> None:
        """``reports/<step>.json`` (the latest, any run) and the run's own copy."""
        write_json(self.paths.report(self.step), report)
        if self.run_id:
            write_json(self.paths.run_report(self.run_id, self.step), report)


class AdhocStep(StepRun):
    """A step outside a run: latest reads, plain writes, lineage in memory only."""

    def __init__(self, paths: Paths, step: str):
        super().__init__(paths, step, StepRecord())

    def _own_model(self, name: str) -> ModelRef | None:
        path = self.paths.model(name, None)
        return {"path": path, "digest": tree_digest(path)} if storage.Storage().is_dir(path) else None

    def promote(self, metrics: dict, evaluated: str | None = None) -> dict | None:
        """Outside a run nothing tells where a table came from: the ``_adhoc`` models are
        promoted only on an explicit call without ``evaluated`` (tests, notebooks)."""
        if evaluated:
            return None
        return self._promote(metrics, lambda name: None, {})


class RunStep(StepRun):
    """A step of a run: pinned reads, keyed writes, checked models, all in the manifest."""

    def __init__(self, manifest: Manifest, step: str, entry: StepRecord):
        super().__init__(manifest.paths, step, entry)
        self.manifest = manifest
        self.run_id = manifest.run_id
        self.generation = manifest.record.generation

    @classmethod
    def start(cls, manifest: Manifest, step: str) -> "RunStep":
        """Mark ``step`` running in ``manifest`` (later finished steps become stale)."""
        return cls(manifest, step, manifest.start(step))

    @property
    def forced(self) -> bool:
        return self.generation > 0 or self.manifest.record.forced

    def _pinned(self, table: str) -> int | None:
        return self.manifest.written_version(table)

    def from_this_run(self, table: str) -> bool:
        """Whether the version of ``table`` this step read was written by its own run."""
        own = self.manifest.written_version(table)
        return own is not None and self.inputs.get(table, {}).get("version") == own

    def _write(self, df, path: str, table: str, kwargs: dict):
        """Write with this run's idempotency key. When Delta skips the write (an earlier
        attempt of this step committed it), the version comes from that attempt's record,
        not from the table's latest version, which another run may have written since."""
        from sparkdeep import delta_io
        spark = df.sparkSession
        before = delta_io.version_of(spark, path) if delta_io.is_table(spark, path) else None
        ref = delta_io.write(df, path, txn=(f"sparkdeep:{self.run_id}:{self.step}:{table}", self.generation),
                             **kwargs)
        committed = self.entry.committed
        if before is not None and ref.version == before:  # skipped: committed by an earlier attempt
            earlier = committed.get(table)
            if earlier and earlier["generation"] == self.generation:
                return delta_io.TableRef(path, earlier["version"])
            log.warning("[%s] %s: Delta skipped the write (this run committed it before) but the attempt "
                        "that did left no record; using the latest version %s", self.step, table, ref.version)
            return ref
        committed[table] = {**ref.as_dict(), "generation": self.generation}
        return ref

    def _own_model(self, name: str) -> ModelRef | None:
        return self.manifest.written_model(name)

    def _check_model_source(self, name: str) -> None:
        writer = self.manifest.unfinished_writer(name)
        if writer:
            raise StaleInputError(f"model {name!r}: this run's {writer} step, which writes it, has status "
                                  f"{str(self.manifest.entry(writer).status)!r}; run {writer} first")

    def promote(self, metrics: dict, evaluated: str | None = None) -> dict | None:
        """Only when the ``evaluated`` table this step read was written by a step of this run
        from models this run wrote (else None: the models evaluated were already promoted,
        or are another run's)."""
        if not (evaluated and self._made_by_own_models(evaluated)):
            return None
        pointer = self._promote(metrics, self.manifest.used_model, self.manifest.table_versions())
        self.manifest.record.promoted = pointer
        self._save()
        return pointer

    def _made_by_own_models(self, table: str) -> bool:
        if not self.from_this_run(table):
            return False
        writer = self.manifest.writer_of(table, self.inputs[table]["version"])
        used = list(writer.model_inputs.values()) if writer else []
        return bool(used) and all(ref["run_id"] == self.run_id for ref in used)

    def _save(self) -> None:
        self.manifest.save()
