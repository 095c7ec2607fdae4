"""Experiment tracking with MLflow: one MLflow run per sparkdeep run id.

The train step logs the config as params, the per-epoch history as metrics (step =
epoch), the final epoch's metrics, the saved pipeline folder and its report; evaluate adds
the held-out metrics and the HTML/JSON report. Both steps find the MLflow run by the tag
``sparkdeep.run_id``, so five separate step processes (``make run``, Airflow) log into one
MLflow run. Tags also name every Delta table version the model was trained on. A search
(``tune.trials`` > 0) logs each finished trial as a child run of the train step's run: its
params, per-epoch metrics and value.

Default store: SQLite at ``<output_dir>/mlflow/mlflow.db`` with artifacts in
``<output_dir>/mlflow/artifacts`` (MLflow 3 keeps its plain-file store in maintenance
mode). ``tracking.uri`` points anywhere else (``http://mlflow:5000``, ``databricks``);
``tracking.enabled: false`` switches it off. A tracking failure fails the step after its
outputs are saved: rerunning the run id logs again (training then loads its finished
checkpoint instead of retraining).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from typing import Any

from sparkdeep.paths import Paths

RUN_TAG = "sparkdeep.run_id"
# A search trial's child run: its study, and "<study>/<trial number>" (never RUN_TAG: the
# steps find their own run by that tag).
STUDY_TAG, TRIAL_TAG = "sparkdeep.tune.study", "sparkdeep.tune.trial"
#: MLflow's end status of a trial's child run, by Optuna trial state.
TRIAL_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}


def tracking_uri(cfg, paths: Paths) -> str:
    return cfg.tracking.uri or f"sqlite:///{os.path.join(paths.root, 'mlflow', 'mlflow.db')}"


def _client(cfg, paths: Paths):
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient
    if not cfg.tracking.uri:
        os.makedirs(os.path.join(paths.root, "mlflow"), exist_ok=True)
    return MlflowClient(tracking_uri=tracking_uri(cfg, paths))


def _experiment_id(client, cfg, paths: Paths) -> str:
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    location = None if cfg.tracking.uri else "file://" + os.path.join(paths.root, "mlflow", "artifacts")
    return client.create_experiment(cfg.tracking.experiment, artifact_location=location)


def _find_run(client, experiment_id: str, run_id: str) -> str | None:
    found = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'", max_results=1)
    return found[0].info.run_id if found else None


def _run_for(client, experiment_id: str, run_id: str | None, tags: dict) -> str:
    found = _find_run(client, experiment_id, run_id) if run_id else None
    if found:
        return found
    return client.create_run(experiment_id, run_name=run_id or None,
                             tags={RUN_TAG: run_id or "adhoc", **tags}).info.run_id


def _flat(prefix: str, value: Any, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


@contextlib.contextmanager
def _local_copy(path: str):
    """``path`` itself when local; else a temporary local copy of the file or folder (MLflow
    logs artifacts from local files), removed afterwards."""
    from sparkdeep import storage
    if storage.is_local(path):
        yield path
        return
    st = storage.Storage()
    name = path.rstrip("/").rsplit("/", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="sparkdeep-artifact-") as tmp:
        target = os.path.join(tmp, name)
        if st.is_dir(path):
            for rel in st.files(path):
                if not rel.rsplit("/", 1)[-1].endswith(".crc"):
                    os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
                    with open(os.path.join(target, rel), "wb") as fh:
                        fh.write(st.read_bytes(storage.join(path, rel)))
        else:
            with open(target, "wb") as fh:
                fh.write(st.read_bytes(path))
        yield target


def _metric(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_run(cfg, paths: Paths, run_id: str | None) -> str | None:
    """The MLflow run of sparkdeep run ``run_id``, made now if there is none (None when
    tracking is off): the train step asks for it before a search, whose trials become its
    children, and logs into the same run afterwards (:func:`log_train`'s ``mlflow_run``)."""
    if not cfg.tracking.enabled:
        return None
    client = _client(cfg, paths)
    return _run_for(client, _experiment_id(client, cfg, paths), run_id, {})


def log_trials(cfg, paths: Paths, parent: str, study: str, trials: list[dict]) -> list[str]:
    """One child run of MLflow run ``parent`` per finished search trial of ``study``: its
    params, per-epoch metrics (step = epoch), value and duration; end status FINISHED,
    KILLED (pruned) or FAILED. A trial logged before is skipped, so a resumed search logs
    each trial once. ``trials``: dicts with number, state, params, value, history,
    duration_s and optionally error. Returns the new child runs' ids."""
    from mlflow.entities import Metric, Param, RunTag
    client = _client(cfg, paths)
    exp = client.get_run(parent).info.experiment_id
    logged = {r.data.tags.get(TRIAL_TAG) for r in client.search_runs(
        [exp], filter_string=f"tags.`{STUDY_TAG}` = '{study}'", max_results=50000)}
    made = []
    for t in trials:
        tag = f"{study}/{t['number']}"
        if tag in logged or t["state"] not in TRIAL_STATUS:
            continue
        child = client.create_run(exp, run_name=f"{study} trial {t['number']}", tags={
            "mlflow.parentRunId": parent, STUDY_TAG: study, TRIAL_TAG: tag,
            "sparkdeep.tune.state": t["state"]}).info.run_id
        metrics = [Metric(k, float(v), 0, int(h["epoch"])) for h in t.get("history") or [] for k, v in h.items()
                   if k != "epoch" and _metric(v) is not None]
        for key in ("value", "duration_s"):
            if _metric(t.get(key)) is not None:
                metrics.append(Metric(key, float(t[key]), 0, 0))
        tags = [RunTag("sparkdeep.tune.error", str(t["error"])[:5000])] if t.get("error") else []
        client.log_batch(child, metrics=metrics, params=[Param(k, str(v)[:6000]) for k, v in t["params"].items()],
                         tags=tags)
        client.set_terminated(child, status=TRIAL_STATUS[t["state"]])
        made.append(child)
    return made


def log_train(cfg, paths: Paths, run_id: str | None, report: dict, model_dir: str,
              mlflow_run: str | None = None) -> dict | None:
    """Params, per-epoch metrics, final metrics, lineage tags, the model folder and the
    report, into ``mlflow_run`` (:func:`step_run`'s), else the run found by ``run_id``."""
    if not cfg.tracking.enabled:
        return None
    from mlflow.entities import Metric, Param, RunTag
    client = _client(cfg, paths)
    exp = _experiment_id(client, cfg, paths)
    inputs = report.get("training_inputs") or {}
    tags = {f"delta.{name}.version": str(ref["version"]) for name, ref in inputs.get("tables", {}).items()}
    tags.update({f"delta.{name}.path": ref["path"] for name, ref in inputs.get("tables", {}).items()})
    from sparkdeep.runs import code_version
    cv = code_version()
    tags.update({"code.package": str(cv.get("package")), "code.git_commit": str(cv.get("git_commit"))})
    mlflow_run = mlflow_run or _run_for(client, exp, run_id, tags)
    params = {}
    for section in ("data", "prepare", "train", "baselines", "gate", "tune"):
        from sparkdeep.runs import config_dict
        _flat(section, config_dict(getattr(cfg, section)), params)
    params["seed"] = str(cfg.seed)
    searched = {name: s for name, s in (report.get("tune") or {}).items() if isinstance(s, dict) and s.get("best")}
    for name, search in searched.items():  # what the search chose, beside the config it searched from
        _flat(f"tuned.{name}", search["best"]["params"], params)
    history = (report.get("keras") or {}).get("history") or []
    metrics = []
    for h in history:
        for key, value in h.items():
            if key != "epoch" and _metric(value) is not None:
                metrics.append(Metric(key, float(value), 0, int(h["epoch"])))
    final = {f"final_{k}": float(v) for k, v in (history[-1] if history else {}).items()
             if k != "epoch" and _metric(v) is not None}
    final["train_rows"] = float(report.get("rows_in") or 0)
    for name, search in searched.items():
        final[f"tune_{name}_best_value"] = float(search["best"]["value"])
        final[f"tune_{name}_trials"] = float(len(search["trials"]))
    existing = client.get_run(mlflow_run).data.params
    client.log_batch(mlflow_run, metrics=metrics + [Metric(k, v, 0, len(history)) for k, v in final.items()],
                     params=[Param(k, v[:6000]) for k, v in params.items() if k not in existing],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    with _local_copy(model_dir) as folder:
        client.log_artifacts(mlflow_run, folder, artifact_path="model")
    client.log_dict(mlflow_run, json.loads(json.dumps(report, default=str)), "reports/train.json")
    return {"uri": tracking_uri(cfg, paths), "experiment_id": exp, "mlflow_run_id": mlflow_run}


def log_evaluate(cfg, paths: Paths, run_id: str | None, result: dict, files: list[str]) -> dict | None:
    """Held-out metrics per model and the report files; ends the MLflow run."""
    if not cfg.tracking.enabled:
        return None
    from mlflow.entities import Metric
    client = _client(cfg, paths)
    exp = _experiment_id(client, cfg, paths)
    mlflow_run = _run_for(client, exp, run_id, {})
    metrics = [Metric(f"holdout_{model}_{k}", float(v), 0, 0)
               for model, m in result["metrics"].items() for k, v in m.items() if _metric(v) is not None]
    metrics += [Metric(f"fit_s_{model}", float(v), 0, 0) for model, v in (result.get("fit_s") or {}).items()
                if _metric(v) is not None]
    client.log_batch(mlflow_run, metrics=metrics)
    client.log_dict(mlflow_run, json.loads(json.dumps(result, default=str)), "reports/evaluate.json")
    for path in files:
        with _local_copy(path) as copy:
            client.log_artifact(mlflow_run, copy, artifact_path="reports")
    client.set_terminated(mlflow_run, status="FINISHED")
    return {"uri": tracking_uri(cfg, paths), "experiment_id": exp, "mlflow_run_id": mlflow_run}


def log_compress(cfg, paths: Paths, run_id: str | None, report: dict, files: list[str]) -> dict | None:
    """The compress step's comparison (each variant's size, parameters, rows/s and held-out
    metric difference as metrics ``compress_<variant>_<figure>``; the report and its plot
    under ``compress/``) into the MLflow run of sparkdeep run ``run_id`` (made if there is none)."""
    if not cfg.tracking.enabled:
        return None
    from mlflow.entities import Metric
    client = _client(cfg, paths)
    exp = _experiment_id(client, cfg, paths)
    mlflow_run = _run_for(client, exp, run_id, {})
    figures = ("keras_bytes", "parameters", "transform_rows_per_s", "predict_rows_per_s", "server_rows_per_s",
               "metric_difference", "keras_bytes_ratio", "predict_rows_per_s_ratio")
    metrics = [Metric(f"compress_{row['variant']}_{k}", float(row[k]), 0, 0)
               for row in report.get("variants", []) for k in figures if _metric(row.get(k)) is not None]
    client.log_batch(mlflow_run, metrics=metrics)
    client.log_dict(mlflow_run, json.loads(json.dumps(report, default=str)), "compress/compress.json")
    for path in files:
        with _local_copy(path) as copy:
            client.log_artifact(mlflow_run, copy, artifact_path="compress")
    return {"uri": tracking_uri(cfg, paths), "experiment_id": exp, "mlflow_run_id": mlflow_run}


def existing_run(cfg, paths: Paths, run_id: str | None) -> str | None:
    """The MLflow run of sparkdeep run ``run_id`` if there is one; None when tracking is
    off, when there is none, or when the default local store was never made (it is not
    made here: a step that only looks leaves no empty store behind)."""
    if not cfg.tracking.enabled or not run_id:
        return None
    if not cfg.tracking.uri and not os.path.exists(os.path.join(paths.root, "mlflow", "mlflow.db")):
        return None
    client = _client(cfg, paths)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    return None if exp is None else _find_run(client, exp.experiment_id, run_id)


def log_model(cfg, paths: Paths, run_id: str | None, save, *, name: str, mlflow_run: str | None = None) -> dict | None:
    """An MLflow model (an MLflow 3 logged model named ``name``) of the MLflow run
    ``mlflow_run``, else sparkdeep run ``run_id``'s (made if there is none).

    ``save(folder, ids)`` writes the MLflow model folder ``folder`` (a temporary local one);
    ``ids`` holds ``model_id``, ``run_id`` and ``artifact_location`` for its ``MLmodel``.
    The model is READY once its files are logged, FAILED if ``save`` or the upload fails.
    Returns the tracking URI, the ids and ``model_uri`` (``models:/<model id>``) and
    ``run_uri`` (``runs:/<MLflow run id>/<name>``), both loadable with
    ``mlflow.pyfunc.load_model``. None when tracking is off."""
    if not cfg.tracking.enabled:
        return None
    from mlflow.entities import LoggedModelOutput
    client = _client(cfg, paths)
    exp = _experiment_id(client, cfg, paths)
    mlflow_run = mlflow_run or _run_for(client, exp, run_id, {})
    model = client.create_logged_model(exp, name=name, source_run_id=mlflow_run, tags={RUN_TAG: run_id or "adhoc"})
    try:
        with tempfile.TemporaryDirectory(prefix="sparkdeep-mlflow-model-") as tmp:
            folder = os.path.join(tmp, name)
            save(folder, {"model_id": model.model_id, "run_id": mlflow_run,
                          "artifact_location": model.artifact_location})
            client.log_model_artifacts(model.model_id, folder)
        client.log_outputs(mlflow_run, [LoggedModelOutput(model.model_id, step=0)])
    except BaseException:
        client.finalize_logged_model(model.model_id, "FAILED")
        raise
    client.finalize_logged_model(model.model_id, "READY")
    return {"uri": tracking_uri(cfg, paths), "experiment_id": exp, "mlflow_run_id": mlflow_run,
            "model_id": model.model_id, "model_uri": f"models:/{model.model_id}",
            "run_uri": f"runs:/{mlflow_run}/{name}"}
