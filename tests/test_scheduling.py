"""Scheduling for real: the Airflow DAG loaded by Airflow's own DagBag in a separate venv
(Airflow's pins clash with ours), its rendered commands run; the cron entry's script runs."""
import json
import os
import re
import subprocess
import sys

import pytest

from sparkdeep.runs import check_run_id

STEPS = ["ingest", "prepare", "train", "score", "evaluate"]


@pytest.fixture(scope="module")
def airflow_python():
    from tests.conftest import airflow_env
    rc, out = airflow_env()  # started in the background when this test was collected (conftest)
    assert rc == 0, out[-3000:]
    return out.strip().splitlines()[-1]


@pytest.mark.slow
def test_airflow_loads_the_dag_with_five_ordered_spark_submit_tasks(airflow_python, repo_root, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               SPARKDEEP_HOME=repo_root, SPARKDEEP_ENV="ci", SPARKDEEP_SUBMIT_ARGS="--master local[1]",
               SPARKDEEP_ARGS="--help")
    done = subprocess.run([airflow_python, os.path.join(repo_root, "deploy", "check_airflow_dag.py"),
                           os.path.join(repo_root, "deploy", "airflow")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    marked = [ln for ln in done.stdout.splitlines() if ln.startswith("DAGBAG-JSON ")]
    assert len(marked) == 1, done.stdout[-3000:]
    found = json.loads(marked[0][len("DAGBAG-JSON "):])
    assert found["import_errors"] == {}
    dag = found["dags"]["sparkdeep_pipeline"]
    assert dag["schedule"] == "15 2 * * *" and dag["max_active_runs"] == 1
    assert dag["topological"] == STEPS
    tasks = dag["tasks"]
    assert sorted(tasks) == sorted(STEPS)
    run_ids = set()
    for i, step in enumerate(STEPS):
        t = tasks[step]
        assert t["operator"] == "BashOperator" and t["retries"] >= 1
        assert t["upstream"] == ([STEPS[i - 1]] if i else [])
        m = re.fullmatch(rf"{re.escape(repo_root)}/scripts/submit.sh --master local\[1\] {step} --env ci "
                         r"--run-id (\S+) --wait-lock 3600 --help", t["rendered"].strip())
        assert m, t["rendered"]
        run_ids.add(check_run_id(m.group(1)))
    assert run_ids == {"sparkdeep_pipeline-20261130T021500"}  # one run id for the whole DAG run

    # The rendered command really runs: spark-submit starts the job (here, its --help).
    ran = subprocess.run(["bash", "-c", tasks["train"]["rendered"]], capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "python -m sparkdeep.jobs.train" in ran.stdout and "--run-id" in ran.stdout


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_cron_entry_calls_the_scheduled_run_script(repo_root, tmp_path):
    lines = [ln for ln in open(os.path.join(repo_root, "deploy", "cron", "sparkdeep.crontab"))
             if ln.strip() and not ln.startswith("#") and "=" not in ln.split()[0]]
    assert len(lines) == 2
    env = [ln for ln in open(os.path.join(repo_root, "deploy", "cron", "sparkdeep.crontab")) if ln.startswith("SPARKDEEP_ARGS=")]
    assert env and "--output-dir" in env[0]  # conf/cluster requires one
    for line in lines:
        fields = line.split()
        assert all(re.fullmatch(r"[\d*/,-]+", f) for f in fields[:5]), line
        assert fields[5] == "/opt/sparkdeep/scripts/scheduled_run.sh"
    script = os.path.join(repo_root, "scripts", "scheduled_run.sh")
    ran = subprocess.run(["bash", script], capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env={**os.environ, "SPARKDEEP_ENV": "ci", "SPARKDEEP_SUBMIT_ARGS": "--master local[1]",
                              "SPARKDEEP_ARGS": "--help"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert re.search(r"run daily-\d{4}-\d{2}-\d{2}", ran.stdout)
    assert "python -m sparkdeep.jobs.pipeline" in ran.stdout
