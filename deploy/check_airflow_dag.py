"""Load the dags folder with Airflow's own DagBag and print what it found as JSON.

Run with the Airflow venv's python (scripts/airflow_env.sh):
  AIRFLOW_HOME=$(mktemp -d) .venv-airflow/bin/python deploy/check_airflow_dag.py deploy/airflow

Besides the DAG's structure it renders each task's command with Airflow's own templating
for a run at 2026-11-30 02:15 UTC, so a broken template shows up here, not at 2 a.m.
"""
import datetime
import json
import sys

try:
    from airflow.dag_processing.dagbag import DagBag  # Airflow 3
except ImportError:
    from airflow.models.dagbag import DagBag  # Airflow 2

LOGICAL = datetime.datetime(2026, 11, 30, 2, 15, tzinfo=datetime.timezone.utc)


def render(dag, task):
    params = {k: (v.value if hasattr(v, "value") else v) for k, v in dict(dag.params).items()}
    context = {"dag": dag, "params": params, "logical_date": LOGICAL, "ds": LOGICAL.date().isoformat(),
               "run_id": "scheduled__2026-11-30T02:15:00+00:00", "task": task}
    return task.render_template(task.bash_command, context)


folder = sys.argv[1]
try:
    bag = DagBag(folder, include_examples=False)  # Airflow 2
except TypeError:
    bag = DagBag(folder)  # Airflow 3: examples are governed by AIRFLOW__CORE__LOAD_EXAMPLES
out = {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
for dag_id, dag in bag.dags.items():
    out["dags"][dag_id] = {
        "schedule": str(getattr(dag, "schedule", None) or getattr(dag, "schedule_interval", None)),
        "max_active_runs": dag.max_active_runs,
        "tasks": {t.task_id: {"upstream": sorted(t.upstream_task_ids), "downstream": sorted(t.downstream_task_ids),
                              "bash_command": getattr(t, "bash_command", None), "retries": t.retries,
                              "operator": type(t).__name__,
                              "rendered": render(dag, t)} for t in dag.tasks},
        "topological": [t.task_id for t in dag.topological_sort()] if hasattr(dag, "topological_sort") else None,
    }
# One marked line: Airflow itself may log to stdout while loading.
print("DAGBAG-JSON " + json.dumps(out, sort_keys=True))
