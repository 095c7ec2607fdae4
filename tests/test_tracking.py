"""MLflow tracking: what the train and evaluate steps log, read back through MLflow's own API."""
import os

import pytest

from sparkdeep import tracking
from sparkdeep.config import load_config
from sparkdeep.paths import Paths


def _cfg(repo_root, out, *extra):
    return load_config(os.path.join(repo_root, "conf"), env="ci", overrides=[f"output_dir={out}", *extra])


TRAIN_REPORT = {
    "rows_in": 3790,
    "keras": {"history": [{"epoch": 1, "loss": 0.64, "val_loss": 0.60, "auc": 0.50, "val_auc": 0.58},
                          {"epoch": 2, "loss": 0.56, "val_loss": 0.53, "auc": 0.59, "val_auc": 0.67}]},
    "training_inputs": {"tables": {"train_prepared": {"path": "/x/tables/train_prepared", "version": 3},
                                   "flights": {"path": "/x/tables/flights", "version": 1}}},
}
RESULT = {"metrics": {"keras_horovod": {"auc": 0.71, "accuracy": 0.77, "rows": 100},
                      "logistic_regression": {"auc": 0.68, "accuracy": 0.76, "rows": 100}}}


def test_train_and_evaluate_log_into_one_run_read_back_through_mlflow(repo_root, tmp_path):
    from mlflow.tracking import MlflowClient
    cfg = _cfg(repo_root, tmp_path / "out")
    paths = Paths.under(cfg.output_dir)
    model = tmp_path / "model"
    (model / "stages").mkdir(parents=True)
    (model / "stages" / "model.keras").write_bytes(b"weights")
    html = tmp_path / "evaluate.html"
    html.write_text("<html></html>")

    first = tracking.log_train(cfg, paths, "run-a", TRAIN_REPORT, str(model))
    second = tracking.log_evaluate(cfg, paths, "run-a", RESULT, [str(html)])
    assert first["mlflow_run_id"] == second["mlflow_run_id"]  # found again by the run id tag
    assert first["uri"] == f"sqlite:///{paths.root}/mlflow/mlflow.db"

    client = MlflowClient(first["uri"])
    exp = client.get_experiment_by_name("sparkdeep")
    [run] = client.search_runs([exp.experiment_id], filter_string="tags.`sparkdeep.run_id` = 'run-a'")
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert run.data.params["train.epochs"] == "2" and run.data.params["data.sample_fraction"] == "0.03"
    assert run.data.params["baselines.trees"] == "5" and run.data.params["gate.metric"] == cfg.gate.metric
    assert run.data.tags["delta.train_prepared.version"] == "3" and run.data.tags["delta.flights.version"] == "1"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_auc")] == [(1, 0.58), (2, 0.67)]
    assert run.data.metrics["final_loss"] == pytest.approx(0.56)
    assert run.data.metrics["holdout_keras_horovod_auc"] == pytest.approx(0.71)
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert arts == {"reports/train.json", "reports/evaluate.json", "reports/evaluate.html"}
    assert [a.path for a in client.list_artifacts(run.info.run_id, "model/stages")] == ["model/stages/model.keras"]

    tracking.log_train(cfg, paths, "run-b", TRAIN_REPORT, str(model))  # another run id: another MLflow run
    assert len(client.search_runs([exp.experiment_id])) == 2


def test_tracking_switched_off_logs_nothing(repo_root, tmp_path):
    cfg = _cfg(repo_root, tmp_path / "out", "tracking.enabled=false")
    paths = Paths.under(cfg.output_dir)
    assert tracking.log_train(cfg, paths, "r", TRAIN_REPORT, str(tmp_path)) is None
    assert tracking.log_evaluate(cfg, paths, "r", RESULT, []) is None
    assert not os.path.exists(os.path.join(paths.root, "mlflow"))
