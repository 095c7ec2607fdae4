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
from sparkdeep.runs import (AdhocStep, Manifest, OutputLock, OutputLocked, Run, RunStep, StaleInputError, Status,
                            check_run_id, new_run_id, read_latest, record_run)


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
    RunStep.start(m, "ingest")
    m.finish("ingest", {"wall_s": 1.5, "rows_in": 10, "rows_usable": 9, "note": "x"})
    on_disk = json.load(open(paths.manifest("r1")))
    assert on_disk["steps"]["ingest"]["status"] == "succeeded"
    assert on_disk["steps"]["ingest"]["rows"] == {"rows_in": 10, "rows_usable": 9}
    assert on_disk["status"] == "partial" and on_disk["code_version"]["package"] == "0.1.0"

    again = Manifest.open(paths, "r1", cfg, force=False)
    assert again.done("ingest") and again.record.attempts == 2 and again.record.generation == 0

    changed = load_config(os.path.join(repo_root, "conf"), env="ci",
                          overrides=[f"output_dir={cfg.output_dir}", "train.epochs=7"])
    with pytest.raises(ConfigError, match=r"train\.epochs"):
        Manifest.open(paths, "r1", changed, force=False)
    forced = Manifest.open(paths, "r1", changed, force=True)
    assert forced.record.generation == 1 and forced.record.config["train"]["epochs"] == 7


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_step_retried_five_times_leaves_no_duplicate_rows(spark, cfg):
    paths = Paths.under(cfg.output_dir)
    rows = spark.range(1000).selectExpr("id", "id % 7 AS k")
    versions = []
    for attempt in range(5):  # each attempt writes, then "dies" before the step is marked done
        m = Manifest.open(paths, "retry", cfg, force=False)
        run = RunStep.start(m, "ingest")
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
    RunStep.start(m, "ingest").write(rows, "events", mode="append")
    assert delta_io.read(spark, paths.table("events")).count() == 2000


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_reads_are_pinned_to_the_runs_own_writes(spark, cfg):
    paths = Paths.under(cfg.output_dir)
    m = Manifest.open(paths, "pinned", cfg, force=False)
    RunStep.start(m, "ingest").write(spark.range(5), "flights")
    m.finish("ingest", {"wall_s": 0.1})
    delta_io.write(spark.range(50), paths.table("flights"))  # someone else's newer version
    run = RunStep.start(m, "prepare")
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


# -- run-scoped models, the latest pointer, invalidation, failures writing the manifest ---------

def _model(threshold):
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import Binarizer
    return PipelineModel([Binarizer(threshold=threshold, inputCol="x", outputCol="y")])


def _threshold(path):
    from pyspark.ml import PipelineModel
    return PipelineModel.load(path).stages[0].getThreshold()


def _step(m, name, body):
    run = RunStep.start(m, name)
    body(run)
    m.finish(name, {"wall_s": 0.1})
    return run


def _whole_run(spark, paths, cfg, run_id, threshold):
    """prepare -> train -> score -> evaluate with tiny tables and models, promoting at the end."""
    m = Manifest.open(paths, run_id, cfg, force=False)
    _step(m, "prepare", lambda r: (r.write(spark.range(3), "holdout"), r.save_model(_model(threshold), "prepare")))
    _step(m, "train", lambda r: (r.model_input("prepare"), r.save_model(_model(threshold), "pipeline"),
                                 r.save_model(_model(threshold), "baseline")))
    _step(m, "score", lambda r: (r.read(spark, "holdout"), r.model_input("pipeline"), r.model_input("baseline"),
                                 r.write(spark.range(3), "predictions")))
    _step(m, "evaluate", lambda r: (r.read(spark, "predictions"), r.promote({"auc": threshold}, "predictions")))
    return m


def test_each_run_loads_its_own_models_and_refuses_a_replaced_one(spark, cfg):
    # Issue 11.2: run A prepared, run B prepared with other settings on the same output,
    # then A trained: with one shared models/prepare folder A's network sat behind B's stages.
    paths = Paths.under(cfg.output_dir)
    for run_id, threshold in (("A", 0.25), ("B", 0.75)):
        _step(Manifest.open(paths, run_id, cfg, force=False), "prepare",
              lambda r: r.save_model(_model(threshold), "prepare"))
    train = RunStep.start(Manifest.open(paths, "A", cfg, force=False), "train")
    path = train.model_input("prepare")
    assert path == paths.model("prepare", "A") and _threshold(path) == 0.25
    assert train.model_inputs["prepare"]["run_id"] == "A"
    assert _threshold(paths.model("prepare", "B")) == 0.75

    # Something replaces A's model in place (as B did to the shared folder): refused, named.
    _model(0.75).write().overwrite().save(path)
    again = RunStep.start(Manifest.open(paths, "A", cfg, force=False), "train")
    with pytest.raises(StaleInputError, match=r"model 'prepare' at .*models/runs/A/0/prepare is not the one "
                                              r"run 'A' recorded"):
        again.model_input("prepare")
    # A run whose own writer of a model has not succeeded does not fall back to another's.
    m = Manifest.open(paths, "C", cfg, force=False)
    RunStep.start(m, "prepare").save_model(_model(0.5), "prepare")
    m.fail("prepare", "killed")
    with pytest.raises(StaleInputError, match="this run's prepare step, which writes it, has status 'failed'"):
        RunStep.start(m, "train").model_input("prepare")


def test_promoted_models_serve_runs_without_their_own_and_must_match_their_tables(spark, cfg):
    paths = Paths.under(cfg.output_dir)
    lonely = RunStep.start(Manifest.open(paths, "lonely", cfg, force=False), "score")
    with pytest.raises(FileNotFoundError, match="none has been promoted"):
        lonely.model_input("pipeline")

    good = _whole_run(spark, paths, cfg, "good", 0.5)
    latest = read_latest(paths)
    assert latest["run_id"] == "good" and set(latest["models"]) == {"prepare", "pipeline", "baseline"}
    assert latest["models"]["pipeline"]["path"] == paths.model("pipeline", "good")
    assert latest["metrics"] == {"auc": 0.5} and latest["tables"]["holdout"] == 0
    assert good.record.promoted == latest

    # A run that only scores and evaluates uses the promoted models, and promotes nothing.
    m = Manifest.open(paths, "rescore", cfg, force=False)
    score = _step(m, "score", lambda r: (r.read(spark, "holdout"), r.model_input("pipeline"),
                                         r.write(spark.range(3), "predictions")))
    assert score.model_inputs["pipeline"]["run_id"] == "good"
    evaluate = RunStep.start(m, "evaluate")
    evaluate.read(spark, "predictions")
    assert evaluate.promote({"auc": 0.9}, "predictions") is None and read_latest(paths) == latest
    assert AdhocStep(paths, "evaluate").promote({}, "predictions") is None  # no telling whose

    # Another run's prepare rewrote holdout: the promoted pipeline was not made from it.
    _step(Manifest.open(paths, "newer", cfg, force=False), "prepare", lambda r: r.write(spark.range(5), "holdout"))
    mixed = RunStep.start(Manifest.open(paths, "mixed", cfg, force=False), "score")
    mixed.read(spark, "holdout")
    with pytest.raises(StaleInputError, match=r"promoted from run 'good'\) was made with holdout v0, but this "
                                              r"step read v1"):
        mixed.model_input("pipeline")


def test_a_model_failing_the_quality_gate_fails_the_step_and_leaves_latest_alone(spark, cfg):
    # Issue 11.5: a NaN model replaced the good one and evaluate exited 0.
    from sparkdeep.pipelines.evaluate import QualityGateError, check_gate
    paths = Paths.under(cfg.output_dir)
    _whole_run(spark, paths, cfg, "good", 0.5)
    before = open(paths.latest).read()
    with pytest.raises(QualityGateError, match="held-out auc not finite"):
        with Run(cfg, "nan") as run:
            for name in ("prepare", "train"):
                step = run.start(name)
                for model in ("prepare",) if name == "prepare" else ("pipeline", "baseline"):
                    step.save_model(_model(0.1), model)
                run.finish(step, {"wall_s": 0.1})
            step = run.start("evaluate")
            check_gate({"auc": float("nan"), "rows": 3}, cfg.gate, read_latest(paths), cfg.dataset.task)
            step.promote({"auc": float("nan")}, "predictions")
    m = json.load(open(paths.manifest("nan")))
    assert m["status"] == "failed" and m["steps"]["evaluate"]["status"] == "failed"
    assert m["steps"]["evaluate"]["error"].startswith("QualityGateError: quality gate: held-out auc not finite")
    assert open(paths.latest).read() == before


def test_redoing_a_step_makes_the_later_steps_stale(spark, cfg):
    # Issue 11.6: after `ingest --force`, prepare said "already done: skipped" and its
    # outputs (and the manifest) still came from the old flights version.
    paths = Paths.under(cfg.output_dir)
    m = Manifest.open(paths, "six", cfg, force=False)
    _step(m, "ingest", lambda r: r.write(spark.range(5), "flights"))
    _step(m, "prepare", lambda r: (r.read(spark, "flights"), r.write(spark.range(2), "train"),
                                   r.save_model(_model(0.5), "prepare")))
    assert m.done("prepare") and m.record.models == {"prepare": paths.model("prepare", "six")}

    with Run(cfg, "six", force=True) as run:
        assert run.pending("ingest")
        step = run.start("ingest")
        step.write(spark.range(7), "flights")
        run.finish(step, {"wall_s": 0.1})
    with Run(cfg, "six") as run:
        entry = run.manifest.entry("prepare")
        assert entry.status == Status.STALE and entry.stale_because.startswith("ingest was redone")
        assert not run.manifest.done("prepare") and run.pending("prepare") and not run.pending("ingest")
        assert run.manifest.table_versions() == {"flights": 1}  # prepare's old reads and writes left out
        assert run.manifest.record.models == {} and run.status == Status.PARTIAL
        prepare = run.start("prepare")
        assert prepare.read(spark, "flights").count() == 7
        prepare.write(spark.range(3), "train")  # generation 1: really written again
        run.finish(prepare, {"wall_s": 0.1})
    assert delta_io.read(spark, paths.table("train")).count() == 3
    assert json.load(open(paths.manifest("six")))["steps"]["prepare"]["inputs"]["flights"]["version"] == 1


def test_forced_upstream_job_reruns_downstream_jobs(spark, cfg, repo_root, capsys):
    from sparkdeep.jobs._common import execute, parser
    paths = Paths.under(cfg.output_dir)
    calls = []

    def ingest(spark, cfg, paths, run):
        calls.append("ingest")
        run.write(spark.range(5 + len(calls)), "flights")
        return {}

    def prepare(spark, cfg, paths, run):
        calls.append("prepare")
        return {"rows_train": run.read(spark, "flights").count()}

    steps = {"ingest": ingest, "prepare": prepare}

    def job(names, *extra):
        args = parser("t", "").parse_args(["--conf-dir", f"{repo_root}/conf", "--env", "ci", "--run-id", "j",
                                           "--output-dir", cfg.output_dir, *extra])
        return execute(names, steps, args, app_name="sparkdeep-test")

    assert job(["ingest", "prepare"]) == 0 and calls == ["ingest", "prepare"]
    assert job(["ingest"], "--force") == 0 and job(["prepare"]) == 0
    assert calls == ["ingest", "prepare", "ingest", "prepare"]
    assert "[prepare] done in run j but stale (ingest was redone" in capsys.readouterr().out
    m = json.load(open(paths.manifest("j")))
    assert m["steps"]["prepare"]["rows"] == {"rows_train": 8}  # the forced ingest's 8 rows
    assert m["steps"]["prepare"]["inputs"]["flights"]["version"] == m["steps"]["ingest"]["outputs"]["flights"]["version"]


@pytest.mark.parametrize("cause", ["No space left on device", "Permission denied"])
def test_a_manifest_that_cannot_be_written_fails_the_run_in_one_line(spark, cfg, repo_root, capsys,
                                                                     monkeypatch, cause):
    from sparkdeep import storage as storage_module
    from sparkdeep.jobs._common import execute, parser
    paths = Paths.under(cfg.output_dir)
    manifest = paths.manifest("full-disk")

    def step(spark, cfg, paths, run):
        if cause.startswith("No space"):
            # The next manifest write goes to /dev/full: a real ENOSPC, once (the temp file is removed).
            os.symlink("/dev/full", f"{manifest}.tmp-{os.getpid()}")
        else:  # root ignores file modes, so the refusal is simulated, for good
            real = storage_module.os.replace
            monkeypatch.setattr(storage_module.os, "replace", lambda a, b: real(a, b) if not b.endswith(
                "manifest.json") else (_ for _ in ()).throw(PermissionError(13, "Permission denied", a)))
        return {}

    args = parser("t", "").parse_args(["--conf-dir", f"{repo_root}/conf", "--env", "ci", "--run-id", "full-disk",
                                       "--output-dir", cfg.output_dir])
    assert execute(["ingest"], {"ingest": step}, args, app_name="sparkdeep-test") == 1
    [line] = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert line.startswith("test: failed in step ingest: OutputWriteError: ")
    assert f"cannot write {manifest}: {cause}" in line
    m = json.load(open(manifest))
    if cause.startswith("No space"):  # the disk had room again for the failure record
        assert m["status"] == "failed" and cause in m["steps"]["ingest"]["error"]
    else:
        assert "could not record it" in line and m["steps"]["ingest"]["status"] == "running"
