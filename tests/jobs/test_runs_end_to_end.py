"""Runs for real: a pipeline killed in the train step resumes and ends with the same tables as
an uninterrupted run; a second run on the same output cannot write; a run's models are its
own even when another run prepares in between; a model failing the quality gate is not
promoted; the model's recorded Delta versions re-create its training input by time travel."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from pyspark.ml import PipelineModel

from sparkdeep import delta_io, lineage
from sparkdeep.pipelines import baselines as bl

pytestmark = pytest.mark.slow

TABLES = ("flights", "flights_rejected", "train", "holdout", "train_prepared")


def pipeline_cmd(out_dir, run_id, *extra):
    return [sys.executable, "-m", "sparkdeep.jobs.pipeline", "--env", "ci", "--output-dir", str(out_dir),
            "--run-id", run_id, *extra]


def run(cmd, repo_root, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=repo_root)


def manifest(out_dir, run_id):
    with open(os.path.join(out_dir, "runs", run_id, "manifest.json")) as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def full_run(repo_root, tmp_path_factory):
    """Run "full" on one output, with run "other" preparing (other bin settings) between its
    prepare and train steps: issue 11.2, where "full" then trained on "other"'s stages."""
    out = tmp_path_factory.mktemp("full") / "out"
    for cmd in (pipeline_cmd(out, "full", "--steps", "ingest,prepare"),
                pipeline_cmd(out, "other", "--steps", "prepare", "--set", "prepare.numeric_buckets=4"),
                pipeline_cmd(out, "full")):
        done = run(cmd, repo_root)
        assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_run_trains_on_its_own_prepare_model_and_promotes_it(spark, repo_root, full_run):
    from sparkdeep import model_store
    m, other = manifest(full_run, "full"), manifest(full_run, "other")
    assert m["status"] == "succeeded" and other["status"] == "partial"
    own = str(full_run / "models" / "runs" / "full" / "0" / "prepare")
    assert m["steps"]["train"]["model_inputs"]["prepare"]["path"] == own
    assert m["steps"]["train"]["model_inputs"]["prepare"]["run_id"] == "full"
    assert m["steps"]["train"]["inputs"]["train_prepared"]["version"] == 0  # not "other"'s v1
    from sparkdeep.pipelines.prepare import embedding_layout
    layout = embedding_layout(model_store.load_pipeline(spark, m["models"]["pipeline"]))
    bins = [n for c, n in zip(layout["categorical"], layout["cardinalities"]) if c.endswith("(bins)")]
    assert bins == []  # prepare.numeric_buckets 0 by default: not "other"'s 4 bins (5 with the NaN bucket)
    latest = json.load(open(full_run / "models" / "latest.json"))
    assert latest["run_id"] == "full" and m["promoted"] == latest
    assert latest["models"]["pipeline"]["path"] == m["models"]["pipeline"]

    # A stricter gate: the same model evaluated again in a new run fails it, naming the key;
    # the step and run end failed, and latest.json is untouched.
    strict = run(pipeline_cmd(full_run, "strict", "--steps", "evaluate", "--set", "gate.min_value=0.99"), repo_root)
    assert strict.returncode == 1
    assert strict.stderr.strip().splitlines()[-1].startswith(
        "pipeline: failed in step evaluate: QualityGateError: quality gate: held-out auc")
    assert "below gate.min_value 0.99" in strict.stderr
    assert manifest(full_run, "strict")["steps"]["evaluate"]["status"] == "failed"
    assert json.load(open(full_run / "models" / "latest.json")) == latest


def test_steps_reconcile_and_a_fresh_process_scores_exactly_like_the_saved_model(spark, full_run):
    """The slice: row counts reconcile step to step, the ranks end identical, the saved model
    holds no pickle, and the score step's process (which loaded the saved pipeline) wrote
    exactly what the same saved pipeline predicts here, in another process."""
    from sparkdeep import model_store
    from sparkdeep.pipelines.evaluate import predictions_frame
    m = manifest(full_run, "full")
    rows = {s: m["steps"][s]["rows"] for s in ("ingest", "prepare", "score")}
    assert rows["ingest"]["rows_usable"] + rows["ingest"]["rows_rejected"] == rows["ingest"]["rows_in"] > 5000
    report = json.load(open(full_run / "runs" / "full" / "reports" / "train.json"))
    assert len(report["keras"]["ranks"]) == 2
    assert len({r["weights_digest"] for r in report["keras"]["ranks"]}) == 1
    # The saved network scores its training rows as the ranks measured them (their figure is
    # taken while training, dropout on: a little higher), not worse.
    scored = report["keras"]["scored_train_loss"]
    assert scored["rows"] > 1000 and scored["loss"] < scored["ranks_kept_epoch"] + 0.02, scored

    saved = [f for f in glob.glob(m["models"]["pipeline"] + "/**/*", recursive=True) if os.path.isfile(f)]
    assert any(f.endswith(".keras") for f in saved)
    assert not any(f.endswith((".pkl", ".pickle", ".pt", ".h5")) for f in saved)

    holdout_ref = m["steps"]["score"]["inputs"]["holdout"]
    holdout = delta_io.read(spark, holdout_ref["path"], holdout_ref["version"])
    pipeline = model_store.load_pipeline(spark, m["models"]["pipeline"])
    here = {r["flight_id"]: (r["probability"], r["prediction"])
            for r in predictions_frame(pipeline.transform(holdout), "keras", key="flight_id",
                                       task="binary").collect()}
    written = {r["flight_id"]: (r["probability"], r["prediction"])
               for r in delta_io.read(spark, str(full_run / "tables" / "predictions")).collect()}
    assert len(written) == holdout.count() == len(here) == rows["score"]["rows_out_predictions"]
    assert written == here  # exactly, not approximately

    result = json.load(open(full_run / "runs" / "full" / "reports" / "evaluate.json"))
    assert set(result["metrics"]) == {"keras_horovod", "logistic_regression", "gbt", "random_forest", "xgboost"}
    for name in result["metrics"]:
        assert 0.5 < result["metrics"][name]["auc"] <= 1.0
        assert result["fit_s"][name] > 0
    # The baselines scored every holdout row each, from one saved pipeline.
    baselines = len(result["metrics"]) - 1
    assert rows["score"]["rows_out_baseline_predictions"] == baselines * rows["score"]["rows_out_predictions"]
    assert result["row_counts"]["score"]["out"] == result["row_counts"]["prepare"]["holdout"]
    assert set(result["step_wall_s"]) == {"ingest", "prepare", "train", "score"}


def test_killed_in_train_resumes_and_matches_an_uninterrupted_run(spark, repo_root, tmp_path, full_run):
    out = tmp_path / "out"
    # Long enough training that the kill (within 0.1 s of epoch 1's checkpoint) lands
    # between epochs, not after the last one: an epoch here takes seconds.
    slow = ["--set", "train.epochs=4", "--set", "train.early_stopping_patience=4"]
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(pipeline_cmd(out, "nightly", *slow), stdout=log, stderr=subprocess.STDOUT,
                            cwd=repo_root, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not glob.glob(str(out / "runs" / "nightly" / "manifest.json")) and time.time() < deadline:
            time.sleep(0.2)
        # A second run on the same output while the first holds it: refused, writes nothing.
        intruder = run(pipeline_cmd(out, "intruder"), repo_root, timeout=120)
        assert intruder.returncode == 3, intruder.stderr
        assert "in use by run 'nightly'" in intruder.stderr.strip().splitlines()[-1]
        assert not os.path.exists(out / "runs" / "intruder")

        while not glob.glob(str(out / "checkpoints" / "*" / "state.json")):
            assert proc.poll() is None, open(tmp_path / "killed.log").read()[-3000:]
            assert time.time() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # driver, JVM and Horovod ranks, no clean-up
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()

    killed = manifest(out, "nightly")
    assert [killed["steps"][s]["status"] for s in ("ingest", "prepare", "train")] == \
        ["succeeded", "succeeded", "running"]
    state = json.load(open(glob.glob(str(out / "checkpoints" / "*" / "state.json"))[0]))
    assert 1 <= state["completed_epochs"] < 4

    resumed = run(pipeline_cmd(out, "nightly", *slow), repo_root)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[ingest] already done in run nightly: skipped" in resumed.stdout
    assert "[prepare] already done in run nightly: skipped" in resumed.stdout
    assert f"resuming run" in resumed.stdout
    after = manifest(out, "nightly")
    assert after["status"] == "succeeded" and after["steps"]["train"]["attempts"] == 2
    assert after["steps"]["ingest"]["attempts"] == 1

    # Same tables as the uninterrupted run: row counts per step, and the contents.
    reference = manifest(full_run, "full")
    for step in ("ingest", "prepare", "train", "score"):
        assert after["steps"][step]["rows"] == reference["steps"][step]["rows"], step
    versions = {t: ref["version"] for s in ("ingest", "prepare") for t, ref in reference["steps"][s]["outputs"].items()}
    for table in TABLES:
        mine = delta_io.read(spark, str(out / "tables" / table))
        theirs = delta_io.read(spark, str(full_run / "tables" / table), versions[table])
        assert lineage.fingerprint(mine) == lineage.fingerprint(theirs), table
        assert delta_io.version_of(spark, str(out / "tables" / table)) == 0  # each written once

    # A completed run id reruns as a no-op: every step skipped, nothing written.
    again = run(pipeline_cmd(out, "nightly", *slow), repo_root)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already done in run nightly: skipped") == 5
    assert delta_io.version_of(spark, str(out / "tables" / "predictions")) == 0


def test_manifest_names_versions_and_the_model_reproduces_from_them(spark, repo_root, tmp_path, full_run):
    m = manifest(full_run, "full")
    assert m["status"] == "succeeded" and m["code_version"]["package"] == "0.1.0"
    prepared = m["steps"]["prepare"]["outputs"]["train_prepared"]
    assert m["steps"]["train"]["inputs"]["train_prepared"] == prepared
    assert m["steps"]["prepare"]["inputs"]["flights"]["version"] == m["steps"]["ingest"]["outputs"]["flights"]["version"]
    assert set(m["metrics"]) == {"keras_horovod", "logistic_regression", "gbt", "random_forest", "xgboost"}

    runs = delta_io.read(spark, str(full_run / "tables" / "runs")).where("run_id = 'full'").collect()
    assert len(runs) == 1 and runs[0]["status"] == "succeeded"
    assert runs[0]["table_versions"]["train_prepared"] == prepared["version"]
    assert runs[0]["row_counts"]["train.rows_in"] == m["steps"]["train"]["rows"]["rows_in"]

    recorded = lineage.training_inputs(spark, m["models"]["pipeline"])
    assert recorded["tables"]["train_prepared"] == prepared
    assert recorded["tables"]["flights"]["version"] == m["steps"]["ingest"]["outputs"]["flights"]["version"]
    assert recorded["fingerprint"]["rows"] == m["steps"]["train"]["rows"]["rows_in"]

    # A later run overwrites the training table; time travel still gets the original back.
    live = str(full_run / "tables" / "train_prepared")
    original = delta_io.read(spark, live, prepared["version"])
    before = delta_io.version_of(spark, live)
    delta_io.write(original.limit(10), live)
    assert delta_io.version_of(spark, live) == before + 1

    done = run([sys.executable, "-m", "sparkdeep.jobs.reproduce", "--model", str(full_run / "models" / "latest.json"),
                "--to", str(tmp_path / "again")], repo_root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["verified"] and info["version"] == prepared["version"]
    assert info["fingerprint"] == recorded["fingerprint"]

    # ... and the deterministic logistic baseline refits to the same coefficients from the
    # recorded version of the training rows it was fitted on.
    train_rows, _ = lineage.reproduce(spark, recorded, table="train")
    saved = PipelineModel.load(m["models"]["baseline"])
    prepare = PipelineModel.load(m["steps"]["train"]["model_inputs"]["prepare"]["path"])
    b = m["config"]["baselines"]
    refit, _ = bl.fit_pipeline(train_rows, prepare, "binary", seed=m["config"]["seed"], names=("logistic_regression",),
                               max_iter=b["max_iter"])
    coef = [s.coefficients.toArray() for p in (refit, saved) for s in p.stages if hasattr(s, "coefficients")]
    np.testing.assert_allclose(coef[0], coef[1], rtol=1e-6, atol=1e-9)

    # A tampered recorded version no longer matches and says so.
    tampered = {**recorded, "tables": {**recorded["tables"], "train_prepared": {"path": live, "version":
                                                                                prepared["version"] + 1}}}
    with pytest.raises(ValueError, match="no longer matches the training input"):
        lineage.reproduce(spark, tampered)


def test_the_run_leaves_an_html_report_and_an_mlflow_run(full_run, tmp_path):
    from mlflow.tracking import MlflowClient

    from tests import _browser
    m = manifest(full_run, "full")
    page = full_run / "runs" / "full" / "reports" / "evaluate.html"
    assert page.exists() and (full_run / "reports" / "evaluate.html").exists()
    text = page.read_text()
    for name in ("keras_horovod", "logistic_regression", "gbt", "random_forest", "fit s", "every assembled feature"):
        assert name in text, name
    if _browser.available():
        imgs = _browser.images(str(page))
        assert len(imgs) >= 11  # ROC, PR, 4 confusion, calibration, learning, 3 selectors, timings
        assert all(i["complete"] and i["width"] > 100 for i in imgs), imgs
    else:
        pytest.skip("Debian chromium + chromium-driver not installed")

    client = MlflowClient(f"sqlite:///{full_run}/mlflow/mlflow.db")
    exp = client.get_experiment_by_name("sparkdeep")
    [run] = client.search_runs([exp.experiment_id], filter_string="tags.`sparkdeep.run_id` = 'full'")
    prepared = m["steps"]["prepare"]["outputs"]["train_prepared"]
    assert run.data.tags["delta.train_prepared.version"] == str(prepared["version"])
    assert run.data.params["train.epochs"] == str(m["config"]["train"]["epochs"])
    assert run.data.metrics["holdout_keras_horovod_auc"] == pytest.approx(m["metrics"]["keras_horovod"]["auc"])
    assert run.data.metrics["holdout_gbt_auc"] == pytest.approx(m["metrics"]["gbt"]["auc"])
    assert run.data.metrics["fit_s_gbt"] > 0
    epochs = client.get_metric_history(run.info.run_id, "val_loss")
    assert [e.step for e in epochs] == list(range(1, len(epochs) + 1)) and len(epochs) >= 1
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert {"reports/evaluate.html", "reports/train.json", "reports/evaluate.json"} <= arts
    assert client.list_artifacts(run.info.run_id, "model")
