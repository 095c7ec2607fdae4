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
promoted one, ``models/latest.json``, written only by :meth:`RunStep.promote` once a model
passed the quality gate.

Where each part lives: ``ids`` (run ids, :data:`STEPS`, the code version), ``lock`` (the
output lock), ``manifest`` (the typed records and their JSON), ``steps`` (:class:`RunStep`
inside a run, :class:`AdhocStep` outside one), ``run`` (:class:`Run`, the life cycle) and
``table`` (the Delta table of runs).

:class:`OutputLock` is :meth:`sparkdeep.storage.Storage.lock` on ``<output>/.lock``, an
exclusive ``flock`` on a local folder: a second run on the same output fails at once naming the holder (or waits ``--wait-lock`` seconds). The
kernel drops the lock when its process dies, so a killed run never leaves a stale lock.
On ``hdfs://`` and other Hadoop URIs the lock is a file created only if absent; see
:class:`OutputLock` for what replaces the kernel's clean-up there.

Every file here goes through :mod:`sparkdeep.storage`, so the output folder may be local
or any Hadoop URI; the path keeps its scheme in the manifest and the runs table.
"""
from sparkdeep.errors import error_line
from sparkdeep.runs.ids import RUN_ID, STEPS, check_run_id, code_version, new_run_id, now
from sparkdeep.runs.lock import OutputLock, OutputLocked
from sparkdeep.runs.manifest import Manifest, ModelRef, RunRecord, Status, StepRecord, TableRef, config_dict
from sparkdeep.runs.run import Run
from sparkdeep.runs.steps import AdhocStep, RunStep, StaleInputError, StepRun, read_latest
from sparkdeep.runs.table import RUNS_SCHEMA, record_run, runs_row

__all__ = ["RUN_ID", "RUNS_SCHEMA", "STEPS", "AdhocStep", "Manifest", "ModelRef", "OutputLock", "OutputLocked",
           "Run", "RunRecord", "RunStep", "StaleInputError", "Status", "StepRecord", "StepRun", "TableRef",
           "check_run_id", "code_version", "config_dict", "error_line", "new_run_id", "now", "read_latest",
           "record_run", "runs_row"]
