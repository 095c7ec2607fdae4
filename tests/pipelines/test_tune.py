"""The search (pipelines/tune): real Optuna studies in SQLite, each trial a real fit on
ranks launched by Spark, on scikit-learn's breast cancer set (569 rows, 30 features).

One search is shared by the module: three trials, the second failing after its first
epoch (an injected rank failure), then the same search rerun. The process death a kill
leaves (a trial RUNNING in storage) is made by a real SIGKILL, without Spark. Pruning,
XGBoost's search and MLlib's tuning classes have a small fit each.
"""
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import optuna
import pytest
from optuna.trial import TrialState
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.sql import functions as F

from sparkdeep import lineage, tracking
from sparkdeep.config import ConfigError, load_config
from sparkdeep.paths import Paths
from sparkdeep.pipelines import baselines as bl
from sparkdeep.pipelines import tune
from sparkdeep.pipelines.train import checkpoint_key, keras_estimator
from sparkdeep.runs import AdhocStep
from sparkdeep.transformers._faults import FAIL_AT_EPOCH_ENV
from sparkdeep.transformers.keras.rank_loop import learning_rate_at
from tests.transformers._plain import PLAIN

#: Small, quick trials: two epochs on two ranks, no early stopping, a quarter for validation.
SMALL = ["train.num_proc=2", "train.epochs=2", "train.batch_size=32", "train.validation_fraction=0.25",
         "train.early_stopping_patience=0", "tune.trials=3", "tune.pruner=none", "tune.startup_trials=1",
         "tune.network.hidden_units=[[8], [16]]", "tune.network.learning_rate=[0.001, 0.05]",
         "tune.network.dropout=[0.0, 0.2]", "tune.network.numeric_embedding=[]"]


@pytest.fixture(scope="module")
def cancer(spark):
    """scikit-learn's breast cancer set, scaled, as the prepared table's columns."""
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    rows = [(float(t), *map(float, x)) for x, t in zip(d.data, d.target)]
    cols = ["label"] + [f"f{j}" for j in range(d.data.shape[1])]
    df = VectorAssembler(inputCols=cols[1:], outputCol="raw").transform(spark.createDataFrame(rows, cols))
    scaled = StandardScaler(inputCol="raw", outputCol="features", withMean=True).fit(df).transform(df)
    return scaled.select("features", "label", F.lit(1.0).alias("sample_weight")).cache()


def config(repo_root, out, *overrides):
    return load_config(os.path.join(repo_root, "conf"), env="ci",
                       overrides=[*SMALL, f"output_dir={out}", *overrides])


def network_search(cfg, data, fingerprint, **kw):
    """The train step's search on ``data``, with the train step's estimator and checkpoint names."""
    paths = Paths.under(cfg.output_dir)

    def make_estimator(train_cfg, run_id):
        return keras_estimator(train_cfg, task="binary", seed=cfg.seed, run_id=run_id,
                               checkpoint_dir=paths.checkpoints, rows=fingerprint["rows"])

    def checkpoint_run(train_cfg):
        return checkpoint_key(dataclasses.replace(cfg, train=train_cfg), fingerprint)

    kw.setdefault("make_estimator", make_estimator)
    return tune.search_network(data, tune_cfg=cfg.tune, train_cfg=cfg.train, task="binary", gate_metric="",
                               ref=tune.study_ref(cfg.tune, paths, AdhocStep(paths, "train"), tune.NETWORK),
                               checkpoint_run=checkpoint_run, **kw)


@pytest.fixture(scope="module")
def resumed(cancer, repo_root, tmp_path_factory):
    """A 3-trial search whose second trial fails after its first epoch, then rerun: each
    finished trial logged as a child run of one MLflow run, the estimators counted."""
    cfg = config(repo_root, tmp_path_factory.mktemp("tune") / "out")
    paths = Paths.under(cfg.output_dir)
    fingerprint = lineage.fingerprint(cancer)
    parent = tracking.step_run(cfg, paths, "tuned")
    logged, fits = [], []

    def log_trials(study, trials):
        logged.append([t["number"] for t in trials])
        tracking.log_trials(cfg, paths, parent, study, trials)
        if trials[0]["number"] == 0 and len(logged) == 1:  # after the first trial: the next one fails
            os.environ[FAIL_AT_EPOCH_ENV] = "0:1"

    def counted(train_cfg, run_id):
        fits.append(run_id)
        return keras_estimator(train_cfg, task="binary", seed=cfg.seed, run_id=run_id,
                               checkpoint_dir=paths.checkpoints, rows=fingerprint["rows"])
    try:
        with pytest.raises(Exception, match="injected failure after epoch 1") as failed:
            network_search(cfg, cancer, fingerprint, make_estimator=counted, log_trials=log_trials)
    finally:
        os.environ.pop(FAIL_AT_EPOCH_ENV, None)
    ref = tune.study_ref(cfg.tune, paths, AdhocStep(paths, "train"), tune.NETWORK)
    killed = optuna.load_study(study_name=ref.name, storage=ref.storage).get_trials()
    first_logs, first_fits = list(logged), list(fits)
    search = network_search(cfg, cancer, fingerprint, make_estimator=counted, log_trials=log_trials)
    return {"cfg": cfg, "paths": paths, "fingerprint": fingerprint, "parent": parent, "error": str(failed.value),
            "killed": killed, "first_logs": first_logs, "logs": logged[len(first_logs):],
            "first_fits": first_fits, "fits": fits[len(first_fits):], "search": search, "ref": ref}


@pytest.mark.slow
def test_a_search_killed_after_its_first_trial_resumes_without_rerunning_it(resumed):
    before = {t.number: t for t in resumed["killed"]}
    assert [(n, t.state) for n, t in before.items()] == [(0, TrialState.COMPLETE), (1, TrialState.FAIL)]
    assert "injected failure after epoch 1" in before[1].user_attrs["error"]
    assert len(resumed["first_fits"]) == 2

    study = optuna.load_study(study_name=resumed["ref"].name, storage=resumed["ref"].storage)
    after = {t.number: t for t in study.get_trials()}
    # Trial 0 kept as it was, never fitted again: the rerun fitted the failed trial's
    # settings (from its checkpoint after epoch 1) and one new trial.
    assert after[0].datetime_complete == before[0].datetime_complete and after[0].value == before[0].value
    assert len(resumed["fits"]) == 2 and before[0].user_attrs["checkpoint_run"] not in resumed["fits"]
    assert after[2].params == before[1].params and after[2].user_attrs["retry_of"] == 1
    assert after[2].user_attrs["resumed_from_epoch"] == 1
    assert after[2].user_attrs["checkpoint_run"] == before[1].user_attrs["checkpoint_run"]
    assert [after[n].state for n in sorted(after)] == [TrialState.COMPLETE, TrialState.FAIL,
                                                       TrialState.COMPLETE, TrialState.COMPLETE]
    report = resumed["search"].report
    assert report["states"] == {"COMPLETE": 3, "FAIL": 1}
    assert report["recovered"] == {"killed": [], "requeued": [1]}
    assert all(t["duration_s"] > 0 for t in report["trials"])
    # A finished search reruns as a no-op: no data is even read (None would fail a fit).
    again = network_search(resumed["cfg"], None, resumed["fingerprint"])
    assert again.best.number == resumed["search"].best.number


@pytest.mark.slow
def test_the_best_trial_by_the_validation_metric_is_the_final_model(resumed, cancer):
    search, paths, cfg = resumed["search"], resumed["paths"], resumed["cfg"]
    done = [t for t in search.report["trials"] if t["state"] == "COMPLETE"]
    assert len(done) == 3
    best = max(done, key=lambda t: t["value"])
    assert search.report["objective"] == {"metric": "val_auc", "keras_metric": "auc", "higher_is_better": True,
                                          "stands_for": "auc"}
    assert search.report["best"]["number"] == best["number"] == search.best.number
    assert search.best_train.learning_rate == best["params"]["learning_rate"]
    assert search.best_train.hidden_units == tuple(int(u) for u in best["params"]["hidden_units"].split("-"))
    # Each trial's value: val_auc of the kept (last) epoch of its own history.
    for t in resumed["search"].report["trials"]:
        if t["state"] == "COMPLETE":
            assert t["epochs"] == 2 and t["fit_s"] > 0
    # The train step's final fit under the best trial's checkpoint loads its model: no training.
    model = keras_estimator(search.best_train, task="binary", seed=cfg.seed, run_id=search.checkpoint_run,
                            checkpoint_dir=paths.checkpoints, rows=569).fit(cancer)
    summary = tune.tuned_summary(model.trainingSummary, search)
    assert summary["resumed_from_epoch"] == 2 and summary["history"][-1]["val_auc"] == best["value"]
    assert summary["tuned"]["trial"] == best["number"] and summary["timings_s"]["fit_total"] == best["fit_s"]


@pytest.mark.slow
def test_each_finished_trial_is_an_mlflow_child_run_logged_once(resumed):
    assert resumed["first_logs"] == [[0], [1]]
    assert resumed["logs"][:2] == [[2], [3]]  # then the closing call with every trial: none new
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking.tracking_uri(resumed["cfg"], resumed["paths"]))
    exp = client.get_run(resumed["parent"]).info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`mlflow.parentRunId` = '{resumed['parent']}'")
    by_trial = {int(r.data.tags[tracking.TRIAL_TAG].rsplit("/", 1)[1]): r for r in children}
    assert sorted(by_trial) == [0, 1, 2, 3]
    assert {n: r.info.status for n, r in by_trial.items()} == {0: "FINISHED", 1: "FAILED", 2: "FINISHED",
                                                              3: "FINISHED"}
    history = client.get_metric_history(by_trial[2].info.run_id, "val_auc")
    assert [m.step for m in history] == [1, 2]
    assert by_trial[2].data.metrics["value"] == pytest.approx(history[-1].value)
    assert set(by_trial[2].data.params) == {"learning_rate", "hidden_units", "dropout"}


@pytest.mark.slow
def test_a_trial_left_running_by_a_killed_process_is_failed_and_its_settings_queued_once(repo_root, tmp_path):
    cfg = config(repo_root, tmp_path / "out")
    ref = tune.StudyRef(f"sqlite:///{tmp_path / 'optuna.db'}", "killed")
    # A process that finishes one trial, starts a second and dies with it (SIGKILL: no clean-up).
    code = textwrap.dedent(f"""
        import os, signal
        from sparkdeep.config import load_config
        from sparkdeep.pipelines import tune
        cfg = load_config({os.path.join(repo_root, 'conf')!r}, env="ci", overrides={SMALL!r})
        study, _ = tune.open_study(tune.StudyRef({ref.storage!r}, {ref.name!r}), cfg.tune, True)
        first = study.ask()
        tune.network_params(first, cfg.tune.network)
        study.tell(first, 0.9)
        second = study.ask()
        tune.network_params(second, cfg.tune.network)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo_root)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    left = optuna.load_study(study_name=ref.name, storage=ref.storage).get_trials()
    assert [t.state for t in left] == [TrialState.COMPLETE, TrialState.RUNNING]

    study, recovered = tune.open_study(ref, cfg.tune, True)
    assert recovered == {"killed": [1], "requeued": [1]}
    assert [t.state for t in study.get_trials()[:2]] == [TrialState.COMPLETE, TrialState.FAIL]
    assert tune.open_study(ref, cfg.tune, True)[1] == {"killed": [], "requeued": []}  # queued once
    again = study.ask()
    assert again.number == 2 and tune.network_params(again, cfg.tune.network) == {
        k: left[1].params[k] for k in ("learning_rate", "hidden_units", "dropout")}
    assert again.user_attrs["retry_of"] == 1
    with pytest.raises(ValueError, match="made to maximize its value, this search would minimize"):
        tune.open_study(ref, cfg.tune, False)


@pytest.mark.slow
def test_a_trial_with_a_terrible_learning_rate_is_pruned_after_its_first_rung(spark, cancer, repo_root, tmp_path):
    cfg = config(repo_root, tmp_path / "out", "train.num_proc=1", "train.warmup_epochs=0", "tune.trials=2",
                 "tune.pruner=median", "tune.prune_every=1", "tune.network.learning_rate=[0.000001, 0.05]")
    paths = Paths.under(cfg.output_dir)
    ref = tune.study_ref(cfg.tune, paths, AdhocStep(paths, "train"), tune.NETWORK)
    queued = optuna.create_study(storage=ref.storage, study_name=ref.name, direction="maximize")
    for lr in (0.02, 0.000001):
        queued.enqueue_trial({"learning_rate": lr, "hidden_units": "8", "dropout": 0.0})
    search = network_search(cfg, cancer, lineage.fingerprint(cancer))
    good, bad = search.report["trials"]
    assert (good["state"], bad["state"]) == ("COMPLETE", "PRUNED")
    assert good["epochs"] == 2 and bad["epochs"] == 1  # stopped at its first rung
    study = optuna.load_study(study_name=ref.name, storage=ref.storage)
    trials = study.get_trials()
    assert trials[1].intermediate_values[1] < trials[0].intermediate_values[1]
    assert trials[1].value == trials[1].intermediate_values[1]
    # The good trial trained in two rungs (two fits, the second resumed) on the one cosine
    # schedule of two epochs: halfway down after the first, at 5% after the second.
    history = trials[0].user_attrs["history"]
    updates = 1000  # any count: the rate at the middle and at the end of a cosine does not depend on it
    assert [h["learning_rate"] for h in history] == pytest.approx(
        [learning_rate_at(u, 0.02, 0.02, 0, 2 * updates, "cosine") for u in (updates, 2 * updates)], rel=1e-5)


@pytest.mark.slow
def test_xgboost_is_tuned_with_the_same_budget_and_its_best_settings_reach_the_saved_baseline(
        spark, cancer, repo_root, tmp_path):
    from sparkdeep import model_store
    cfg = config(repo_root, tmp_path / "out", "tune.xgboost.n_estimators=[5, 20]", "tune.xgboost.max_depth=[2, 4]")
    paths = Paths.under(cfg.output_dir)
    rows = cancer.select(F.col("features").alias(bl.ASSEMBLED), "label")
    ref = tune.study_ref(cfg.tune, paths, AdhocStep(paths, "train"), tune.XGBOOST)
    search = tune.search_xgboost(rows, tune_cfg=cfg.tune, task="binary", gate_metric="", seed=1, workers=1, ref=ref)
    report = search.report
    assert report["states"] == {"COMPLETE": 3} and report["objective"]["metric"] == "auc"
    assert sum(report["objective"]["rows"].values()) == 569 and report["objective"]["rows"]["validation"] > 80
    best = max(report["trials"], key=lambda t: t["value"])
    assert search.best_params == best["params"] and set(best["params"]) == set(bl.XGBOOST_PARAMS)
    # Rerun: every trial finished, nothing fitted again.
    assert tune.search_xgboost(rows, tune_cfg=cfg.tune, task="binary", gate_metric="", seed=1, workers=1,
                               ref=ref).report["trials"] == report["trials"]
    from pyspark.ml import PipelineModel
    model, _ = bl.fit_assembled(PipelineModel([]), rows, "binary", seed=1, names=("xgboost",), workers=1,
                                xgboost_params=search.best_params)
    model.write().save(str(tmp_path / "baseline"))
    loaded = model_store.load_pipeline(spark, str(tmp_path / "baseline")).stages[-1]
    assert {k: loaded.getOrDefault(k) for k in bl.XGBOOST_PARAMS} == search.best_params
    with pytest.raises(ValueError, match=r"xgboost_params \['callbacks'\] are not settings a search may give"):
        bl.estimator("xgboost", "binary", seed=1, xgboost_params={"callbacks": []})


def test_the_numeric_embedding_and_ensemble_choices_reach_the_trial_fit_and_empty_choices_keep_train_s(
        repo_root, tmp_path):
    cfg = config(repo_root, tmp_path, "tune.network.numeric_embedding=[periodic, none]",
                 "tune.network.ensemble=[0, 4]")
    aim = tune.network_aim("", "binary", cfg.train)
    trial = optuna.trial.FixedTrial({"learning_rate": 0.01, "hidden_units": "8", "dropout": 0.1,
                                     "numeric_embedding": "none", "ensemble": 4})
    params = tune.network_params(trial, cfg.tune.network)
    assert params["numeric_embedding"] == "none" and params["ensemble"] == 4
    fitted = tune.trial_train_config(cfg.train, params, aim, "binary")
    assert (fitted.numeric_embedding, fitted.ensemble, fitted.hidden_units) == ("none", 4, (8,))
    assert cfg.train.numeric_embedding == "periodic"  # the search's choice, not train's

    fixed = config(repo_root, tmp_path)  # SMALL: numeric_embedding [] and ensemble [] = train's
    params = tune.network_params(optuna.trial.FixedTrial(
        {"learning_rate": 0.01, "hidden_units": "8", "dropout": 0.1}), fixed.tune.network)
    assert "numeric_embedding" not in params and "ensemble" not in params
    kept = tune.trial_train_config(fixed.train, params, aim, "binary")
    assert (kept.numeric_embedding, kept.ensemble) == (fixed.train.numeric_embedding, fixed.train.ensemble)


@pytest.mark.parametrize("override, key", [
    ("tune.trials=-1", "tune.trials"),
    ("tune.pruner=hyperband", "tune.pruner"),
    ("tune.prune_every=0", "tune.prune_every"),
    ("tune.network.learning_rate=[0.1, 0.01]", "tune.network.learning_rate"),
    ("tune.network.learning_rate=[0, 0.01]", "tune.network.learning_rate"),
    ("tune.network.hidden_units=[]", "tune.network.hidden_units"),
    ("tune.network.dropout=[0.1, 1.0]", "tune.network.dropout"),
    ("tune.network.batch_size=[64, 64]", "tune.network.batch_size"),
    ("tune.network.numeric_embedding=[periodic, linear]", "tune.network.numeric_embedding"),
    ("tune.network.numeric_embedding=[none, none]", "tune.network.numeric_embedding"),
    ("tune.network.ensemble=[0, 65]", "tune.network.ensemble"),
    ("tune.xgboost.validation_fraction=1.0", "tune.xgboost.validation_fraction"),
    ("tune.xgboost.max_depth=[0, 4]", "tune.xgboost.max_depth"),
    ("tune.xgboost.subsample=[0.5, 1.5]", "tune.xgboost.subsample"),
    ("tune.xgboost.reg_lambda=[0.0, 1.0]", "tune.xgboost.reg_lambda"),
    ("train.validation_fraction=0", "train.validation_fraction"),
    ("gate.metric=average_precision", "gate.metric"),
    ("baselines.models=[gbt]", "tune.xgboost.enabled"),
    ("train.trace=true", "train.trace"),
    ("output_dir=hdfs://namenode:8020/out", "tune.storage"),
])
def test_bad_tune_settings_are_refused_naming_the_key(repo_root, tmp_path, override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        config(repo_root, tmp_path, override)


def test_without_trials_nothing_is_searched_and_the_tune_job_refuses_to_start(repo_root, tmp_path, capsys):
    from sparkdeep.jobs import tune as tune_job
    base = load_config(os.path.join(repo_root, "conf"), env="ci")
    assert base.tune.trials == 0  # off unless asked for
    # The settings a search needs are only required while it is on.
    load_config(os.path.join(repo_root, "conf"), env="ci", overrides=["gate.metric=average_precision",
                                                                      "train.validation_fraction=0"])
    rc = tune_job.main(["--env", "ci", "--output-dir", str(tmp_path / "out")])
    assert rc == 2 and "config key 'tune.trials': value 0 means no search" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "runs")  # refused before a run was opened


@pytest.mark.slow
def test_train_validation_split_and_cross_validator_pick_the_best_keras_model(cancer):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit

    from sparkdeep.transformers.keras.estimator import DistributedKerasEstimator
    from sparkdeep.transformers.keras.model import DistributedKerasModel
    est = DistributedKerasEstimator(featuresCol="features", labelCol="label", numProc=1, epochs=1, batchSize=32,
                                    modelArgs={"hidden_units": [8], "dropout": 0.0}, seed=3, **PLAIN)
    grid = ParamGridBuilder().addGrid(est.learningRate, [0.000001, 0.05]).build()
    evaluator = BinaryClassificationEvaluator(rawPredictionCol="probability")
    for tuner in (TrainValidationSplit(estimator=est, estimatorParamMaps=grid, evaluator=evaluator,
                                       trainRatio=0.75, seed=1),
                  CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=1)):
        fitted = tuner.fit(cancer)
        metrics = fitted.validationMetrics if hasattr(fitted, "validationMetrics") else fitted.avgMetrics
        assert len(metrics) == 2 and metrics[1] > metrics[0], type(tuner).__name__
        best = fitted.bestModel
        assert isinstance(best, DistributedKerasModel) and len(best.trainingSummary["history"]) == 1
        # The best model was refitted on every row with the better rate.
        assert best.trainingSummary["history"][0]["learning_rate"] == pytest.approx(0.05)
        assert evaluator.evaluate(best.transform(cancer)) > 0.95
