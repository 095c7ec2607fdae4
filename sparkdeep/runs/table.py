"""The Delta table of runs, ``<output>/tables/runs``: one row per run id."""
from __future__ import annotations

import json

from sparkdeep.registry import Models, Tables
from sparkdeep.runs.ids import STEPS
from sparkdeep.runs.manifest import Manifest

RUNS_SCHEMA = ("run_id STRING, status STRING, created_at STRING, updated_at STRING, attempts INT, "
               "code_version STRING, config_json STRING, steps_succeeded ARRAY<STRING>, "
               "table_versions MAP<STRING, BIGINT>, row_counts MAP<STRING, BIGINT>, "
               "metrics_json STRING, model_path STRING, step_wall_s MAP<STRING, DOUBLE>, manifest_path STRING")


def runs_row(m: Manifest) -> dict:
    r = m.record
    steps = {s: r.step(s) for s in STEPS}
    cv = r.code_version or {}
    return {
        "run_id": r.run_id, "status": str(r.status), "created_at": r.created_at,
        "updated_at": r.updated_at, "attempts": int(r.attempts),
        "code_version": cv.get("git_commit") or cv.get("package"),
        "config_json": json.dumps(r.config, sort_keys=True),
        "steps_succeeded": [s for s in STEPS if m.done(s)],
        "table_versions": {k: int(v) for k, v in m.table_versions().items()},
        "row_counts": {f"{s}.{k}": int(v) for s, e in steps.items() for k, v in e.rows.items()},
        "metrics_json": json.dumps(r.metrics, sort_keys=True),
        "model_path": r.models.get(Models.PIPELINE),
        "step_wall_s": {s: float(e.wall_s) for s, e in steps.items() if e.wall_s is not None},
        "manifest_path": m.path,
    }


def record_run(spark, m: Manifest) -> None:
    """Upsert the run's row into the Delta table ``<output>/tables/runs`` (MERGE on run_id)."""
    from delta.tables import DeltaTable
    from sparkdeep import delta_io
    path = m.paths.table(Tables.RUNS)
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
