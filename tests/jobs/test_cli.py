import os
import re
import subprocess
import sys

import pytest

JOBS = ["ingest", "prepare", "train", "tune", "score", "evaluate", "pipeline"]


def sparkdeep_command() -> list[str]:
    """The installed console command (set-up installs the project), else its module."""
    installed = os.path.join(os.path.dirname(sys.executable), "sparkdeep")
    return [installed] if os.path.exists(installed) else [sys.executable, "-m", "sparkdeep.jobs.cli"]


def test_the_sparkdeep_command_lists_every_job_and_passes_the_rest_on(tmp_path):
    import doctest
    import tomllib

    import sparkdeep.jobs.cli as cli
    assert doctest.testmod(cli).failed == 0
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "pyproject.toml"), "rb") as fh:
        assert tomllib.load(fh)["project"]["scripts"]["sparkdeep"] == "sparkdeep.jobs.cli:main"
    listed = subprocess.run([*sparkdeep_command(), "--help"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for name in cli.JOBS:
        assert re.search(rf"^  {name} +\S", listed.stdout, re.M), listed.stdout
    unknown = subprocess.run([*sparkdeep_command(), "trian"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown command 'trian'" in unknown.stderr
    assert subprocess.run(sparkdeep_command(), capture_output=True, text=True, timeout=60).returncode == 2
    # Everything after the subcommand is the job's: a bad setting is the ingest job's one line.
    bad = subprocess.run([*sparkdeep_command(), "ingest", "--set", "train.epochs=lots", "--output-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'train.epochs'" in bad.stderr
    # A job's usage line names what was typed: the subcommand, or the module.
    for command, typed in (("run", "sparkdeep run"), ("export", "sparkdeep export")):
        shown = subprocess.run([*sparkdeep_command(), command, "--help"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and shown.stdout.startswith(f"usage: {typed} "), shown.stdout[:200]
    module = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.export", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert module.stdout.startswith("usage: python -m sparkdeep.jobs.export "), module.stdout[:200]


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


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
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


# A job whose step launches two ranks (the launch training uses: a DataFrame spilled to
# each rank); rank 1 raises through the fault hook.
RANK_JOB = """
import os
import sys

from sparkdeep.distributed import run_on_ranks
from sparkdeep.jobs._common import execute, parser
from sparkdeep.transformers._faults import after_epoch_hook


class Spill:  # the rank fails before it reads its rows
    def open(self, folder):
        return self

    def write(self, batch):
        pass

    def close(self):
        return {}


def train():
    after_epoch_hook()(int(os.environ["SPARKDEEP_RANK"]), 1)


def step(spark, cfg, paths, run):
    run_on_ranks(train, num_proc=2, backend="tensorflow", data=spark.range(4), spill=Spill())
    return {}


sys.exit(execute(["train"], {"train": step}, parser("train", "").parse_args(sys.argv[1:]), app_name="sparkdeep-train"))
"""
SPARK_LINE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d [A-Z]+ \S+: ")


@pytest.mark.slow
@pytest.mark.parametrize("show", [False, True], ids=["default", "traceback"])
def test_a_failing_rank_is_one_line_naming_it_and_its_frame_with_the_stacks_on_request(show, tmp_path):
    """Issue 38: a rank's error reached the console as a Java stack and a Python one, several
    screens, before the one line. Now: the line (rank, type, message, the frame that raised),
    and Spark's own lines one each; --traceback adds the JVM's stack and the rank's traceback."""
    import inspect

    from sparkdeep.transformers import _faults
    (tmp_path / "job.py").write_text(RANK_JOB)
    out = subprocess.run([sys.executable, "job.py", "--output-dir", str(tmp_path / "out"), "--set",
                          "spark.master=local[2]", *(["--traceback"] if show else [])],
                         capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                         env={**os.environ, _faults.FAIL_AT_EPOCH_ENV: "1:1"})
    assert out.returncode == 1, out.stderr[-3000:]
    source = inspect.getsource(_faults).splitlines()
    raised = 1 + next(i for i, line in enumerate(source) if "raise RuntimeError(" in line)
    line = (f"[train] rank 1 failed: RuntimeError: injected failure after epoch 1 ({_faults.FAIL_AT_EPOCH_ENV}) "
            f"(at transformers/_faults.py:{raised} in hook)")
    lines = out.stderr.strip().splitlines()
    assert lines[-1] == (line if show else f"{line}; rerun with --traceback for the full stacks")
    java = [x for x in lines if x.startswith("\tat org.apache.spark.")]
    rank_stack = f'_faults.py", line {raised}, in hook'
    if show:
        assert java, out.stderr[-3000:]
        assert "Rank 1's own traceback, in its process:" in out.stderr and rank_stack in out.stderr
    else:
        assert java == [] and rank_stack not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
        assert [x for x in lines if not SPARK_LINE.match(x) and not x.startswith("WARNING: Using incubator")] == \
            [lines[-1]], out.stderr[-3000:]
