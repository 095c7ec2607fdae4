"""The whole slice on a small sample: Delta tables, Horovod training, persistence, and
scoring in a fresh process that must reproduce the in-memory model's predictions exactly."""
import glob
import json
import os
import subprocess
import sys

import pytest

from sparkdeep import delta_io
from sparkdeep.config import load_config
from sparkdeep.jobs import evaluate, ingest, prepare, train
from sparkdeep.jobs._common import run_step
from sparkdeep.paths import Paths
from sparkdeep.pipelines.evaluate import predictions_frame
from sparkdeep.runs import StepRun


def run_job(repo_root, job, out_dir):
    cmd = [sys.executable, "-m", f"sparkdeep.jobs.{job}", "--env", "ci", "--output-dir", out_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_slice_end_to_end_and_reload_in_fresh_process(spark, repo_root, tmp_path):
    out_dir = str(tmp_path / "out")
    cfg = load_config(os.path.join(repo_root, "conf"), env="ci", overrides=[f"output_dir={out_dir}"])
    paths = Paths.under(cfg.output_dir)

    ing = run_step("ingest", ingest.step, spark, cfg, paths)
    assert ing["rows_usable"] + ing["rows_rejected"] == ing["rows_in"] > 5000
    prep = run_step("prepare", prepare.step, spark, cfg, paths)
    assert prep["pca_k"] == cfg.prepare.pca_k

    train_run = StepRun.adhoc(paths, "train")
    keras_pipeline, baseline_pipeline, report = train.fit_models(spark, cfg, paths, train_run)
    holdout = delta_io.read(spark, paths.table("holdout"))
    spec = cfg.dataset
    before = {r[spec.key_column]: (r["probability"], r["prediction"])
              for r in predictions_frame(keras_pipeline.transform(holdout), "keras", key=spec.key_column,
                                         task=spec.task).collect()}
    train_run.save_model(keras_pipeline, "pipeline")
    train_run.save_model(baseline_pipeline, "baseline")
    train_run.save_report({"step": "train", **report})
    # The score and evaluate jobs below are runs of their own: they load the promoted models.
    pointer = train_run.promote(metrics={})
    assert pointer["models"]["pipeline"]["path"] == paths.model("pipeline", None)
    assert len({r["weights_digest"] for r in report["keras"]["ranks"]}) == 1

    saved = [f for f in glob.glob(paths.model("pipeline", None) + "/**/*", recursive=True) if os.path.isfile(f)]
    assert any(f.endswith(".keras") for f in saved)
    assert not any(f.endswith((".pkl", ".pickle", ".pt", ".h5")) for f in saved)

    score_out = run_job(repo_root, "score", out_dir)  # a new Python process loads the pipeline
    assert "holdout rows scored" in score_out
    after = {r[spec.key_column]: (r["probability"], r["prediction"])
             for r in delta_io.read(spark, paths.table("predictions")).collect()}
    assert len(after) == holdout.count() == len(before)
    assert after == before  # exactly, not approximately

    eval_out = run_job(repo_root, "evaluate", out_dir)
    assert "keras_horovod" in eval_out and "logistic_regression" in eval_out
    with open(paths.report("evaluate")) as fh:
        result = json.load(fh)
    for name in ("keras_horovod", "logistic_regression"):
        assert 0.5 < result["metrics"][name]["auc"] <= 1.0
    assert result["row_counts"]["score"]["out"] == result["row_counts"]["prepare"]["holdout"]
    assert set(result["step_wall_s"]) == set(evaluate.STEPS)
