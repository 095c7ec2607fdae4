import subprocess
import sys

import pytest

JOBS = ["ingest", "prepare", "train", "tune", "score", "evaluate", "pipeline"]


def test_reproduce_help():
    out = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.reproduce", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--model" in out.stdout and "--to" in out.stdout


@pytest.mark.parametrize("job", JOBS)
def test_help_documents_the_options(job):
    out = subprocess.run([sys.executable, "-m", f"sparkdeep.jobs.{job}", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--env", "--set", "--conf-dir", "--output-dir", "--run-id", "--force", "--wait-lock"):
        assert option in out.stdout


def test_bad_config_exits_non_zero_with_one_line_naming_the_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.ingest", "--set", "train.epochs=lots",
                          "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "'train.epochs'" in lines[0]


def test_missing_input_table_fails_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.evaluate", "--output-dir", str(tmp_path),
                          "--set", "spark.master=local[1]"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("evaluate: failed in step evaluate: FileNotFoundError") and "predictions" in last


@pytest.mark.slow
@pytest.mark.parametrize("job", JOBS + ["reproduce"])
def test_every_job_starts_under_spark_submit_with_the_shipped_code(job, repo_root, tmp_path):
    out = subprocess.run(["bash", f"{repo_root}/scripts/submit.sh", "--master", "local[1]", job, "--help"],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"python -m sparkdeep.jobs.{job}" in out.stdout
