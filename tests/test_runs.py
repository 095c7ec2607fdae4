"""Run ids, the output lock, manifests and idempotent (txnAppId/txnVersion) writes."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sparkdeep import delta_io
from sparkdeep.config import ConfigError, load_config
from sparkdeep.paths import Paths
from sparkdeep.runs import Manifest, OutputLock, OutputLocked, check_run_id, new_run_id, record_run


@pytest.fixture
def cfg(repo_root, tmp_path):
    return load_config(os.path.join(repo_root, "conf"), env="ci", overrides=[f"output_dir={tmp_path / 'out'}"])


def test_run_ids_are_new_each_time_and_checked():
    a, b = new_run_id(), new_run_id()
    assert a != b and check_run_id(a) == a
    for bad in ("", "../etc", "a b", "-x", "x" * 200):
        with pytest.raises(ConfigError, match="--run-id"):
            check_run_id(bad)


def test_second_lock_on_one_output_fails_naming_the_holder(tmp_path):
    with OutputLock(str(tmp_path), "first"):
        with pytest.raises(OutputLocked, match=r"run 'first' \(pid %d" % os.getpid()):
            with OutputLock(str(tmp_path), "second"):
                pass
    with OutputLock(str(tmp_path), "second"):  # released on exit
        pass


def test_lock_of_a_killed_process_is_released_and_a_waiter_gets_it(tmp_path, repo_root):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from sparkdeep.runs import OutputLock
        with OutputLock({str(tmp_path)!r}, "holder"):
            print("locked", flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=repo_root)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLocked, match=f"run 'holder' \\(pid {holder.pid}"):
            with OutputLock(str(tmp_path), "mine"):
                pass
        t0 = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)  # no clean-up runs: the kernel drops the flock
        with OutputLock(str(tmp_path), "mine", wait_s=30):
            assert time.monotonic() - t0 < 30
    finally:
        holder.kill()
        holder.wait()


def test_manifest_records_steps_and_refuses_a_changed_config(cfg, repo_root):
    paths = Paths.under(cfg.output_dir)
    m = Manifest.open(paths, "r1", cfg, force=False)
    m.start("ingest")
    m.finish("ingest", {"wall_s": 1.5, "rows_in": 10, "rows_usable": 9, "note": "x"})
    on_disk = json.load(open(paths.manifest("r1")))
    assert on_disk["steps"]["ingest"]["status"] == "succeeded"
    assert on_disk["steps"]["ingest"]["rows"] == {"rows_in": 10, "rows_usable": 9}
    assert on_disk["status"] == "partial" and on_disk["code_version"]["package"] == "0.1.0"

    again = Manifest.open(paths, "r1", cfg, force=False)
    assert again.done("ingest") and again.data["attempts"] == 2 and again.data["generation"] == 0

    changed = load_config(os.path.join(repo_root, "conf"), env="ci",
                          overrides=[f"output_dir={cfg.output_dir}", "train.epochs=7"])
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        Manifest.open(paths, "r1", changed, force=False)
    forced = Manifest.open(paths, "r1", changed, force=True)
    assert forced.data["generation"] == 1 and forced.data["config"]["train"]["epochs"] == 7


def test_a_step_retried_five_times_leaves_no_duplicate_rows(spark, cfg):
    paths = Paths.under(cfg.output_dir)
    rows = spark.range(1000).selectExpr("id", "id % 7 AS k")
    versions = []
    for attempt in range(5):  # each attempt writes, then "dies" before the step is marked done
        m = Manifest.open(paths, "retry", cfg, force=False)
        run = m.start("ingest")
        run.write(rows, "events", mode="append")
        run.write(rows.where("k = 0"), "events_zero")  # overwrite mode
        versions.append((run.outputs["events"]["version"], run.outputs["events_zero"]["version"]))
        m.fail("ingest", f"killed in attempt {attempt}")
        if attempt == 1:  # another run overwrites the table between attempts
            delta_io.write(rows.where("k = 1"), paths.table("events_zero"))
    events = delta_io.read(spark, paths.table("events"))
    assert events.count() == 1000
    assert events.groupBy("id").count().where("count > 1").count() == 0
    assert versions == [(0, 0)] * 5  # attempts 2-5 committed nothing, and still name this run's version
    assert delta_io.version_of(spark, paths.table("events_zero")) == 1  # the other run's write stands

    # --force is a new generation: the same writes really happen again.
    m = Manifest.open(paths, "retry", cfg, force=True)
    m.start("ingest").write(rows, "events", mode="append")
    assert delta_io.read(spark, paths.table("events")).count() == 2000


def test_reads_are_pinned_to_the_runs_own_writes(spark, cfg):
    paths = Paths.under(cfg.output_dir)
    m = Manifest.open(paths, "pinned", cfg, force=False)
    m.start("ingest").write(spark.range(5), "flights")
    m.finish("ingest", {"wall_s": 0.1})
    delta_io.write(spark.range(50), paths.table("flights"))  # someone else's newer version
    run = m.start("prepare")
    assert run.read(spark, "flights").count() == 5
    assert run.inputs["flights"]["version"] == 0
    m.finish("prepare", {"wall_s": 0.1})
    record_run(spark, m)
    record_run(spark, m)  # upsert: one row per run id
    runs = delta_io.read(spark, paths.table("runs"))
    assert runs.count() == 1
    row = runs.first()
    assert row["run_id"] == "pinned" and row["table_versions"]["flights"] == 0
    assert row["steps_succeeded"] == ["ingest", "prepare"]
