"""Hyperparameter search: Optuna's TPE over the network's and XGBoost's settings.

Optuna, not Hyperopt (unmaintained): TPE samples near the good trials so far, a pruner
stops a bad trial from its per-epoch validation metric, and its RDB storage lets a killed
search go on where it stopped. The train step runs a search first when ``tune.trials`` > 0
(``jobs/tune.py`` is that step with a search required); ``tune.trials`` trials tune the
network and as many tune the XGBoost baseline, so the comparison stays fair.

The network (:func:`search_network`). A trial is the ``train`` section with the trial's
learning rate, layer widths and dropout (and batch size, when ``tune.network.batch_size``
lists choices) in place, fitted by the estimator on ``train_prepared``: a distributed fit
on the ranks, with a checkpoint folder of its own named from the training input and those
settings (:func:`sparkdeep.pipelines.train.checkpoint_key`). It trains in rungs of
``tune.prune_every`` epochs: after each, every new epoch's validation metric goes to the
pruner, which may stop the trial there (PRUNED). A rung is a refit of the same ``runId``
with more epochs, which resumes from the last checkpoint on the learning-rate schedule of
the whole ``train.epochs`` (the estimator's ``scheduleEpochs``), so a trial trained in rungs
is the fit the train step would make with its settings. A trial's value is its validation
metric (:func:`sparkdeep.tasks.validation_metric`: the gate metric's per-epoch counterpart)
at the epoch whose weights the model keeps: the last, or, stopped early, the one with the
best ``val_loss``. Never the holdout, which stays for the evaluate step. A trial whose
training diverges (a non-finite loss) is pruned, its error kept.

The final network is the best trial's own model: the train step fits the best settings
under that trial's checkpoint ``runId``, which loads the finished checkpoint instead of
training again, then saves and promotes it as any run's.

XGBoost (:func:`search_xgboost`): each trial fits ``xgboost.spark`` on the baselines'
assembled training rows minus a validation share (``tune.xgboost.validation_fraction``, by
a seeded hash of the row) and scores the gate metric itself on that share. The best
settings are then fitted on every row, beside the other baselines
(:func:`sparkdeep.pipelines.baselines.fit_assembled`).

Storage and resume. A study lives in ``tune.storage``, by default a SQLite file under the
run's folder (``runs/<run id>/tune/optuna.db``; an hdfs:// or other non-local output folder
needs ``tune.storage``), named from the run id, its ``--force`` generation and the search
(``network``, ``xgboost``), and is opened with ``load_if_exists``. The run's output lock
means no other process works on this run, so a trial still RUNNING in storage was killed
with its process: opening the study marks it FAIL and queues its settings again, once (so
does a trial that failed with an error); the rerun trains it again, resuming from its
checkpoint, which is named from those settings. COMPLETE and PRUNED trials are kept, never
rerun; a search ends when ``tune.trials`` of them are finished. Each trial's sampler is
seeded from ``tune.seed`` and the count of finished trials before it, so the samples follow
from the seed and the finished trials, not from when a search was interrupted.

(An external ``tune.storage`` is shared: two output folders using the same run id there
would share a study.)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep import storage, tasks
from sparkdeep.distributed import RankFailedError
from sparkdeep.errors import error_line
from sparkdeep.registry import Columns
from sparkdeep.transformers.keras.rank_loop import DIVERGED
from sparkdeep.transformers.sampling import with_row_draw

from . import baselines as bl
from . import evaluate

log = logging.getLogger(__name__)

#: What a search tunes: the network on ``train_prepared``, the XGBoost baseline on its rows.
NETWORK, XGBOOST = "network", "xgboost"
#: The trial states a search counts towards ``tune.trials``.
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

#: Called with a study's name and its newly finished trials (as :func:`trial_row` with the history).
TrialLog = Callable[[str, list[dict]], Any]


# -- the study ----------------------------------------------------------------------------

@dataclass(frozen=True)
class StudyRef:
    """Where a search's study lives: an Optuna storage URL and the study's name."""
    storage: str
    name: str

    def shown(self) -> str:
        """The storage without credentials a URL may carry (``user:password@``)."""
        scheme, sep, rest = self.storage.partition("://")
        return scheme + sep + rest.rpartition("@")[2] if sep else self.storage


def study_ref(tune_cfg, paths, run, search: str) -> StudyRef:
    """The study of ``search`` (:data:`NETWORK` or :data:`XGBOOST`) for step run ``run``:
    ``tune.storage``, else SQLite under the run's folder, which must be local."""
    name = f"{run.run_id or 'adhoc'}-g{run.generation}-{search}"
    if tune_cfg.storage:
        return StudyRef(tune_cfg.storage, name)
    folder = paths.tune_dir(run.run_id)
    if not storage.is_local(folder):  # config refuses it; a Paths made by hand is caught here
        raise ValueError(f"the search's default SQLite storage lives under the output folder, which is not local "
                         f"({paths.root}): set tune.storage to an Optuna storage URL")
    os.makedirs(folder, exist_ok=True)
    return StudyRef(f"sqlite:///{os.path.join(folder, 'optuna.db')}", name)


def sampler(tune_cfg, finished: int) -> optuna.samplers.TPESampler:
    """TPE, seeded from ``tune.seed`` and the count of finished trials: the next sample
    follows from the seed and the trials so far, whichever process draws it."""
    return optuna.samplers.TPESampler(seed=tune_cfg.seed + finished, n_startup_trials=tune_cfg.startup_trials)


def pruner(tune_cfg) -> optuna.pruners.BasePruner:
    """``tune.pruner``'s pruner (:data:`sparkdeep.registry.Choices.PRUNERS`)."""
    if tune_cfg.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=tune_cfg.startup_trials, n_warmup_steps=0)
    if tune_cfg.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=tune_cfg.prune_every)
    if tune_cfg.pruner == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"tune.pruner {tune_cfg.pruner!r} is not one of median, successive_halving, none")


def open_study(ref: StudyRef, tune_cfg, higher_is_better: bool) -> tuple[optuna.Study, dict]:
    """The study at ``ref`` (made if new) and what :func:`recover` did to a killed attempt's trials."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is ours (with the params)
    direction = "maximize" if higher_is_better else "minimize"
    study = optuna.create_study(storage=ref.storage, study_name=ref.name, direction=direction,
                                sampler=sampler(tune_cfg, 0), pruner=pruner(tune_cfg), load_if_exists=True)
    if study.direction.name.lower() != direction:
        raise ValueError(f"study {ref.name!r} in {ref.shown()} was made to {study.direction.name.lower()} its value, "
                         f"this search would {direction} it: use a new run id, or --force")
    return study, recover(study)


def _params_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def recover(study: optuna.Study) -> dict:
    """Make a study that an attempt left behind ready to go on.

    A RUNNING trial belongs to no process (the run's lock is ours), so it died with the
    one that ran it: marked FAIL. The settings of a failed trial are queued again, once:
    unless a finished, waiting or queued trial already has them. Returns
    ``{"killed": [trial numbers], "requeued": [trial numbers]}``."""
    killed = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for number in killed:
        study.tell(number, state=TrialState.FAIL)
    taken = {_params_key(t.system_attrs.get("fixed_params", t.params))
             for t in study.get_trials(deepcopy=False, states=FINISHED + (TrialState.WAITING,))}
    requeued = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        key = _params_key(t.params)
        if t.params and key not in taken:
            study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
            taken.add(key)
            requeued.append(t.number)
    return {"killed": killed, "requeued": requeued}


def finished(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=FINISHED)


def run_trials(study: optuna.Study, tune_cfg, objective: Callable[[optuna.Trial], float],
               on_finished: Callable[[FrozenTrial], None]) -> None:
    """Ask, run and tell trials (queued ones first) until ``tune.trials`` are finished.

    ``objective`` returns the trial's value or raises ``optuna.TrialPruned``; any other
    error marks the trial FAIL (naming the error in its ``error`` attribute) and ends the
    search with it: a rerun of the run queues its settings again (:func:`recover`)."""
    while len(done := finished(study)) < tune_cfg.trials:
        study.sampler = sampler(tune_cfg, len(done))
        trial = study.ask()
        try:
            value = objective(trial)
        except optuna.TrialPruned:
            frozen = study.tell(trial, state=TrialState.PRUNED)
        except BaseException as exc:  # a Ctrl-C too: the trial is over, not running
            trial.set_user_attr("error", error_line(exc))
            on_finished(study.tell(trial, state=TrialState.FAIL))
            raise
        else:
            frozen = study.tell(trial, value)
        on_finished(frozen)


def trial_row(t: FrozenTrial) -> dict:
    """One trial as the report shows it (the per-epoch history stays in the storage and MLflow)."""
    attrs = t.user_attrs
    row = {"number": t.number, "state": t.state.name, "params": dict(t.params), "value": t.value,
           "duration_s": round(t.duration.total_seconds(), 3) if t.duration else None}
    for key in ("epochs", "fit_s", "resumed_from_epoch", "checkpoint_run", "retry_of", "error"):
        if key in attrs:
            row[key] = attrs[key]
    return row


def study_report(study: optuna.Study, ref: StudyRef, tune_cfg, aim: dict, recovered: dict, wall_s: float) -> dict:
    """What the train report and MLflow record of a search: every trial, the counts by
    state, the best trial, where the study lives and what this attempt recovered."""
    trials = [trial_row(t) for t in study.get_trials(deepcopy=False)]
    states: dict[str, int] = {}
    for t in trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    best = study.best_trial
    return {"study": ref.name, "storage": ref.shown(), "objective": aim, "budget": tune_cfg.trials,
            "sampler": f"TPE (seed {tune_cfg.seed} + finished trials, {tune_cfg.startup_trials} random first)",
            "pruner": tune_cfg.pruner, "states": states, "trials": trials,
            "best": {"number": best.number, "params": dict(best.params), "value": best.value,
                     **({"checkpoint_run": best.user_attrs["checkpoint_run"]}
                        if "checkpoint_run" in best.user_attrs else {})},
            "recovered": recovered, "wall_s": round(wall_s, 2)}


def _search(name: str, ref: StudyRef, tune_cfg, higher: bool, objective: Callable[[optuna.Trial], float],
            describe: Callable[[FrozenTrial], str], log_trials: TrialLog | None) -> tuple[optuna.Study, dict]:
    """Open the study, recover a killed attempt, run the trials, log each: the part both searches share."""
    study, recovered = open_study(ref, tune_cfg, higher)
    before = finished(study)
    log.info("[tune] %s: study %r in %s: %s/%s trials finished%s%s", name, ref.name, ref.shown(), len(before),
             tune_cfg.trials,
             f"; trial(s) {recovered['killed']} left running by a killed attempt marked failed"
             if recovered["killed"] else "",
             f"; the settings of failed trial(s) {recovered['requeued']} queued again"
             if recovered["requeued"] else "")

    def on_finished(t: FrozenTrial) -> None:
        log.info("[tune] %s trial %s: %s%s%s; %s (%.0fs; %s/%s finished)", name, t.number, t.state.name,
                 f" {describe(t)}" if t.value is not None else "",
                 f" ({t.user_attrs['error']})" if "error" in t.user_attrs else "",
                 ", ".join(f"{k}={_short(v)}" for k, v in t.params.items()),
                 t.duration.total_seconds(), len(finished(study)), tune_cfg.trials)
        if log_trials is not None:
            log_trials(ref.name, [{**trial_row(t), "history": t.user_attrs.get("history") or []}])

    run_trials(study, tune_cfg, objective, on_finished)
    if log_trials is not None:  # trials a killed attempt finished but did not get to log
        log_trials(ref.name, [{**trial_row(t), "history": t.user_attrs.get("history") or []}
                              for t in study.get_trials(deepcopy=False, states=FINISHED + (TrialState.FAIL,))])
    if not any(t.state == TrialState.COMPLETE for t in finished(study)):
        raise RuntimeError(f"{name} search: none of the {tune_cfg.trials} trials of study {ref.name!r} completed "
                           "(all pruned or diverged; see the train report): widen tune's search space, lower "
                           "the learning rates, or set tune.pruner=none")
    return study, recovered


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# -- the network --------------------------------------------------------------------------

def network_aim(gate_metric: str, task: str, train_cfg) -> dict:
    """What the network's search optimises: the history key (``val_<metric>``), the Keras
    metric the trials must report, its direction, and the held-out metric it stands for."""
    keras_metric, higher = tasks.validation_metric(gate_metric, task)
    given = train_cfg.metrics or tasks.DEFAULT_METRICS[task]
    name = next((m for m in given if m.lower() == keras_metric), keras_metric)
    return {"metric": f"val_{name}", "keras_metric": name, "higher_is_better": higher,
            "stands_for": tasks.gate_metric(gate_metric, task)[0]}


def units_label(units: tuple[int, ...]) -> str:
    """A layer-width choice as Optuna stores a categorical value: ``(256, 128)`` -> ``"256-128"``."""
    return "-".join(str(int(u)) for u in units)


def network_params(trial: optuna.Trial, space) -> dict:
    """The trial's network settings, drawn from ``tune.network``."""
    params = {"learning_rate": trial.suggest_float("learning_rate", *space.learning_rate, log=True),
              "hidden_units": trial.suggest_categorical("hidden_units", [units_label(c) for c in space.hidden_units]),
              "dropout": trial.suggest_float("dropout", *space.dropout)}
    if space.batch_size:
        params["batch_size"] = trial.suggest_categorical("batch_size", list(space.batch_size))
    if space.numeric_embedding:
        params["numeric_embedding"] = trial.suggest_categorical("numeric_embedding", list(space.numeric_embedding))
    if space.ensemble:
        params["ensemble"] = trial.suggest_categorical("ensemble", list(space.ensemble))
    return params


def trial_train_config(train_cfg, params: dict, aim: dict, task: str):
    """The ``train`` section a trial fits with: its settings in place, and the metric the
    search compares trials on among the reported ones."""
    metrics = tuple(train_cfg.metrics or tasks.DEFAULT_METRICS[task])
    if aim["keras_metric"] not in metrics:
        metrics += (aim["keras_metric"],)
    return dataclasses.replace(
        train_cfg, learning_rate=float(params["learning_rate"]), dropout=float(params["dropout"]),
        hidden_units=tuple(int(u) for u in str(params["hidden_units"]).split("-")),
        batch_size=int(params.get("batch_size", train_cfg.batch_size)),
        numeric_embedding=str(params.get("numeric_embedding", train_cfg.numeric_embedding)),
        ensemble=int(params.get("ensemble", train_cfg.ensemble)), metrics=metrics)


def kept_epoch(history: list[dict], stopped_early: bool) -> dict:
    """The epoch whose weights a fit keeps: the last, or, stopped early, the best ``val_loss``."""
    return min(history, key=lambda h: h["val_loss"]) if stopped_early else history[-1]


@dataclass
class NetworkTrials:
    """The network search's objective: one trial fitted in rungs, reported epoch by epoch.

    ``make_estimator(train_cfg, checkpoint_run)`` builds the train step's estimator and
    ``checkpoint_run(train_cfg)`` names a setting's checkpoint folder
    (``pipelines/train``), so a trial trains exactly as the train step would."""
    train: DataFrame
    tune_cfg: Any
    train_cfg: Any
    task: str
    aim: dict
    make_estimator: Callable[[Any, str], Any]
    checkpoint_run: Callable[[Any], str]

    def rungs(self, epochs: int) -> list[int]:
        """The epoch counts a trial stops at to ask the pruner (the last is ``epochs``)."""
        step = epochs if self.tune_cfg.pruner == "none" else self.tune_cfg.prune_every
        return sorted({min(e, epochs) for e in range(step, epochs + step, step)})

    def __call__(self, trial: optuna.Trial) -> float:
        cfg = trial_train_config(self.train_cfg, network_params(trial, self.tune_cfg.network), self.aim, self.task)
        run_id = self.checkpoint_run(cfg)
        trial.set_user_attr("checkpoint_run", run_id)
        key, reported = self.aim["metric"], 0
        # A retried trial resumes the failed one's checkpoint: its fit time counts that one's fits too.
        retried = trial.user_attrs.get("retry_of")
        before = trial.study.get_trials(deepcopy=False)[retried].user_attrs if retried is not None else {}
        fit_s = float(before.get("fit_s") or 0.0)
        for end in self.rungs(cfg.epochs):
            estimator = self.make_estimator(cfg, run_id).setEpochs(end).setScheduleEpochs(cfg.epochs)
            try:
                summary = estimator.fit(self.train).trainingSummary
            except RankFailedError as exc:
                if DIVERGED not in exc.message:
                    raise
                trial.set_user_attr("error", exc.message[:500])
                raise optuna.TrialPruned(exc.message) from exc
            fit_s += float((summary.get("timings_s") or {}).get("fit_total") or 0.0)
            history = summary["history"]
            if reported == 0:
                trial.set_user_attr("resumed_from_epoch", int(summary.get("resumed_from_epoch") or 0))
            for record in history[reported:]:
                trial.report(float(record[key]), int(record["epoch"]))
            reported = len(history)
            trial.set_user_attr("history", history)
            trial.set_user_attr("epochs", len(history))
            trial.set_user_attr("fit_s", round(fit_s, 3))
            if summary.get("stopped_early") or end == cfg.epochs:
                break
            if trial.should_prune():
                raise optuna.TrialPruned(f"{key} {history[-1][key]:.4f} after epoch {end}")
        value = float(kept_epoch(history, bool(summary.get("stopped_early")))[key])
        if not math.isfinite(value):
            trial.set_user_attr("error", f"{key} is {value} (not finite)")
            raise optuna.TrialPruned(f"{key} is {value}")
        return value


@dataclass(frozen=True)
class NetworkSearch:
    """A finished network search: the best trial's ``train`` section and checkpoint run, and the report."""
    best_train: Any
    checkpoint_run: str
    best: FrozenTrial
    report: dict


def search_network(train: DataFrame, *, tune_cfg, train_cfg, task: str, gate_metric: str, ref: StudyRef,
                   make_estimator: Callable[[Any, str], Any], checkpoint_run: Callable[[Any], str],
                   log_trials: TrialLog | None = None) -> NetworkSearch:
    """Search the network's settings on ``train`` (:class:`NetworkTrials`) until
    ``tune.trials`` trials are finished; resume the study at ``ref`` if it has trials."""
    t0 = time.time()
    aim = network_aim(gate_metric, task, train_cfg)
    objective = NetworkTrials(train, tune_cfg, train_cfg, task, aim, make_estimator, checkpoint_run)
    study, recovered = _search(NETWORK, ref, tune_cfg, aim["higher_is_better"], objective,
                               lambda t: f"{aim['metric']}={t.value:.4f}", log_trials)
    best = study.best_trial
    report = study_report(study, ref, tune_cfg, aim, recovered, time.time() - t0)
    log.info("[tune] network: best of %s trials is trial %s, %s=%.4f (for held-out %s)",
             len(report['trials']), best.number, aim['metric'], best.value, aim['stands_for'])
    return NetworkSearch(trial_train_config(train_cfg, best.params, aim, task), best.user_attrs["checkpoint_run"],
                         best, report)


def tuned_summary(summary: dict, search: NetworkSearch) -> dict:
    """The final model's training summary: the best trial's checkpoint loaded (no training
    now, so no launch timings), marked with the trial it is, and its fit time the trial's."""
    out = dict(summary)
    out["tuned"] = {"study": search.report["study"], "trial": search.best.number, "params": dict(search.best.params),
                    "value": search.best.value, "metric": search.report["objective"]["metric"]}
    if not (out.get("timings_s") or {}).get("fit_total"):
        out["timings_s"] = {"fit_total": float(search.best.user_attrs.get("fit_s") or 0.0)}
        out["timings_from"] = f"tune trial {search.best.number}'s fits (the model is that trial's)"
    return out


# -- XGBoost ------------------------------------------------------------------------------

def xgboost_params(trial: optuna.Trial, space) -> dict:
    """The trial's XGBoost settings, drawn from ``tune.xgboost``."""
    return {"max_depth": trial.suggest_int("max_depth", *space.max_depth),
            "learning_rate": trial.suggest_float("learning_rate", *space.learning_rate, log=True),
            "n_estimators": trial.suggest_int("n_estimators", *space.n_estimators, log=True),
            "subsample": trial.suggest_float("subsample", *space.subsample),
            "colsample_bytree": trial.suggest_float("colsample_bytree", *space.colsample_bytree),
            "min_child_weight": trial.suggest_float("min_child_weight", *space.min_child_weight, log=True),
            "reg_lambda": trial.suggest_float("reg_lambda", *space.reg_lambda, log=True)}


def validation_split(rows: DataFrame, fraction: float, seed: int) -> tuple[DataFrame, DataFrame]:
    """(fit rows, validation rows) of assembled rows, each row on its own side by a seeded
    hash of its features, label and place among identical rows
    (:func:`~sparkdeep.transformers.sampling.with_row_draw`): the same rows whatever their
    order or partitioning, and the copies of a repeated row on both sides as chance has it."""
    marked = with_row_draw(rows, "_draw", seed, purpose="tune-validation").withColumn("_validation", F.col("_draw") < fraction).drop("_draw")
    return (marked.filter(~F.col("_validation")).drop("_validation"),
            marked.filter(F.col("_validation")).drop("_validation"))


@dataclass
class XGBoostTrials:
    """The XGBoost search's objective: fit on the rows minus the validation share, score the
    gate metric on that share."""
    fit_rows: DataFrame
    validation_rows: DataFrame
    tune_cfg: Any
    task: str
    metric: str
    seed: int
    workers: int

    def __call__(self, trial: optuna.Trial) -> float:
        params = xgboost_params(trial, self.tune_cfg.xgboost)
        t0 = time.perf_counter()
        model = bl.estimator(XGBOOST, self.task, seed=self.seed, workers=self.workers,
                             xgboost_params=params).fit(self.fit_rows)
        trial.set_user_attr("fit_s", round(time.perf_counter() - t0, 3))
        scored = model.transform(self.validation_rows).withColumn(Columns.KEY, F.monotonically_increasing_id())
        metrics = evaluate.task_metrics(
            evaluate.predictions_frame(scored, XGBOOST, key=Columns.KEY, task=self.task), self.task)
        return float(metrics[self.metric])


@dataclass(frozen=True)
class XGBoostSearch:
    """A finished XGBoost search: the best settings, and the report."""
    best_params: dict
    report: dict


def search_xgboost(rows: DataFrame, *, tune_cfg, task: str, gate_metric: str, seed: int, workers: int,
                   ref: StudyRef, log_trials: TrialLog | None = None) -> XGBoostSearch:
    """Search XGBoost's settings (:class:`XGBoostTrials`) on ``rows`` (the baselines'
    assembled training rows) until ``tune.trials`` trials are finished."""
    t0 = time.time()
    metric, higher = tasks.gate_metric(gate_metric, task)
    fraction = tune_cfg.xgboost.validation_fraction
    fit_rows, validation_rows = validation_split(rows, fraction, tune_cfg.seed)
    counts = {"fit": fit_rows.count(), "validation": validation_rows.count()}
    if not counts["validation"] or not counts["fit"]:
        raise ValueError(f"tune.xgboost.validation_fraction {fraction} puts {counts['validation']} of the "
                         f"{sum(counts.values())} baseline training rows in validation: each side needs rows "
                         "(choose a fraction nearer 0.5, or train on more rows)")
    if task == "multiclass":
        bl.check_xgboost_classes(fit_rows)
    objective = XGBoostTrials(fit_rows, validation_rows, tune_cfg, task, metric, seed, workers)
    aim = {"metric": metric, "higher_is_better": higher, "stands_for": metric,
           "rows": counts, "validation_fraction": fraction}
    study, recovered = _search(XGBOOST, ref, tune_cfg, higher, objective, lambda t: f"{metric}={t.value:.4f}",
                               log_trials)
    report = study_report(study, ref, tune_cfg, aim, recovered, time.time() - t0)
    log.info("[tune] xgboost: best of %s trials is trial %s, validation %s=%.4f",
             len(report['trials']), study.best_trial.number, metric, study.best_value)
    return XGBoostSearch(dict(study.best_params), report)
