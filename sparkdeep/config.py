"""Layered YAML config loaded once into frozen, validated dataclasses.

``conf/base/*.yaml`` is read first, then ``conf/<env>/*.yaml`` (keys there replace the
base's, mappings merge), then ``--set a.b=value`` overrides. Every key ends in a typed
dataclass field; an unknown key, a wrong type, a non-finite number or a missing file is a
:class:`ConfigError` that names the key and the file it came from.

Defaults live in one place, ``conf/base/*.yaml``: the pipeline's dataclasses have none,
so a key missing from the base is an error, not a second, silently different default.
(:class:`SparkConfig` keeps its defaults: tests and benchmarks build sessions without
config files.) YAML aliases are refused: a few lines of ``&a [*b, *b, ...]`` expand to
gigabytes, and a config has no need for them.

Example
-------
>>> cfg = load_config("conf", env="ci", overrides=["train.epochs=1"])  # doctest: +SKIP
>>> cfg.train.epochs  # doctest: +SKIP
1
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from sparkdeep import tasks
from sparkdeep.dataset import load_spec
from sparkdeep.registry import STRATEGY_RULES, STRATEGY_SETTINGS, Choices, strategy_conflicts, strategy_values
from sparkdeep.typed_yaml import (ConfigError, Fields, _cut, _yaml, plain, put_dotted,  # noqa: F401 - ConfigError,
                                  read_mapping, shown)  # shown: this module's API


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[2]"
    app_name: str = "sparkdeep"
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    dataset: str            # a spec name under conf/datasets/, or a path to one (sparkdeep.dataset)
    sample_fraction: float


@dataclass(frozen=True, kw_only=True)
class PrepareConfig:
    holdout_fraction: float
    majority_ratio: float
    selector_top_fraction: float
    max_correlation: float
    pca_k: int
    pca_variance_target: float
    encoding: str           # embedding (categories -> the network's embeddings) or onehot
    pca: bool               # project the (numeric, for embedding) selected block with PCA
    numeric_buckets: int    # embedding: also each number's quantile bin as an embedded index (0 = off)
    min_category_count: int = 1  # embedding: levels seen fewer times share the unseen/null index (1 = keep all)
    hash_buckets: int = 0   # embedding: a column of more levels is hashed into this many buckets (0 = never)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    num_proc: int
    epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str          # Choices.OPTIMIZERS: adam, lazy_adam (row-wise sparse updates), sgd, ...
    loss: str
    hidden_units: tuple[int, ...]
    dropout: float
    metrics: tuple[str, ...]
    validation_fraction: float
    early_stopping_patience: int
    accumulation_steps: int
    compression: str
    scale_learning_rate: bool
    warmup_epochs: float
    normalization: str      # tabular network (embedding encoding): layer, batch or none
    numeric_embedding: str  # tabular network: none or periodic (Choices.NUMERIC_EMBEDDINGS)
    ensemble: int           # tabular network: members sharing the hidden layers (TabM-mini); 0 or 1 = one network
    lr_schedule: str        # after warm-up: constant or cosine
    shuffle_buffer_rows: int  # each rank's shuffle window (its memory bound), rows
    strategy: str           # how the ranks agree: horovod, collective, local_sgd or parameter_server (STRATEGY_RULES)
    local_steps: int        # local_sgd: updates each rank takes alone between weight averages
    stall_timeout: float    # seconds without a rank's heartbeat before fit fails naming it
    shard_embeddings_above: int  # bytes: a larger embedding table is split by rows across the ranks (0 = never)
    trace: bool             # TensorFlow profiler (epoch 2, else 1) and Horovod timeline beside the run's reports


@dataclass(frozen=True, kw_only=True)
class BaselinesConfig:
    """MLlib models fitted beside the network on every assembled feature."""
    models: tuple[str, ...]  # () = the task's (sparkdeep.tasks.BASELINES)
    trees: int               # GBT iterations; random forest grows 2x this many trees
    depth: int               # GBT depth; random forest grows depth + 4
    max_iter: int            # logistic/linear regression iterations
    ablation: str            # bench/ablation_bench.py's results JSON for the report's "Ablation" section


@dataclass(frozen=True, kw_only=True)
class NetworkSpace:
    """What a search varies in the network (only settings the estimator takes)."""
    learning_rate: tuple[float, ...]        # [low, high], log-uniform
    hidden_units: tuple[tuple[int, ...], ...]  # layer-width choices
    dropout: tuple[float, ...]              # [low, high], uniform
    batch_size: tuple[int, ...]             # choices; () = train.batch_size
    numeric_embedding: tuple[str, ...]      # choices; () = train.numeric_embedding
    ensemble: tuple[int, ...]               # choices; () = train.ensemble


@dataclass(frozen=True, kw_only=True)
class XGBoostSpace:
    """Tuning the XGBoost baseline with the network's budget: whether, on which rows, and over what."""
    enabled: bool
    validation_fraction: float              # share of the baselines' training rows each trial is scored on
    max_depth: tuple[int, ...]              # [low, high]
    learning_rate: tuple[float, ...]        # [low, high], log-uniform
    n_estimators: tuple[int, ...]           # [low, high], log-uniform
    subsample: tuple[float, ...]            # [low, high]
    colsample_bytree: tuple[float, ...]     # [low, high]
    min_child_weight: tuple[float, ...]     # [low, high], log-uniform
    reg_lambda: tuple[float, ...]           # [low, high], log-uniform


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    """The hyperparameter search the train step runs first when ``trials`` > 0 (pipelines/tune)."""
    trials: int             # finished (complete or pruned) trials per search, the network's and XGBoost's; 0 = off
    seed: int               # the TPE sampler's
    startup_trials: int     # random trials before TPE models the results; the median pruner waits as long
    pruner: str             # median, successive_halving or none (Choices.PRUNERS)
    prune_every: int        # epochs between a network trial's pruning decisions
    storage: str            # "" = SQLite under the run's folder; else an Optuna RDB URL
    network: NetworkSpace
    xgboost: XGBoostSpace


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    """What a trained model must pass on held-out data before it becomes "latest"."""
    metric: str
    min_value: float
    against_latest: bool
    max_regression: float
    beat_baselines: bool    # refuse promotion when a baseline beats the network on the gate metric


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    enabled: bool
    uri: str
    experiment: str


#: What the compress keys take, for their errors.
COMPRESS_HINTS = {"compress.variants": f"distinct names from {list(Choices.COMPRESS_VARIANTS)}",
                  "compress.student_units": "layer widths, each >= 1; [] = half the teacher's"}


@dataclass(frozen=True, kw_only=True)
class CompressConfig:
    """Smaller variants of the promoted network, measured against it (off by default)."""
    enabled: bool
    variants: tuple[str, ...]           # from Choices.COMPRESS_VARIANTS
    sparsity: float                     # prune: fraction of each Dense kernel zeroed
    fine_tune_epochs: int               # prune: epochs on the ranks with the zeros kept (0 = none)
    student_units: tuple[int, ...]      # distill: the student's hidden widths; [] = half the teacher's
    alpha: float                        # distill: the labels' weight in the target (the teacher's: 1 - alpha)
    distill_epochs: int


@dataclass(frozen=True, kw_only=True)
class Config:
    output_dir: str
    seed: int
    spark: SparkConfig
    data: DataConfig
    prepare: PrepareConfig
    train: TrainConfig
    baselines: BaselinesConfig
    gate: GateConfig
    tracking: TrackingConfig
    tune: TuneConfig
    compress: CompressConfig
    # The data set's spec (conf/datasets/<data.dataset>.yaml), attached by load_config.
    dataset: Any = None

    def __post_init__(self) -> None:
        task = self.dataset.task if self.dataset is not None else None
        metric = self.gate.metric
        gate_ok = metric == "" or (metric in tasks.HOLDOUT_METRICS and (
            task is None or task in tasks.HOLDOUT_METRICS[metric].tasks))
        lower = metric in tasks.HOLDOUT_METRICS and not tasks.HOLDOUT_METRICS[metric].higher_is_better
        unit = metric in ("auc", "average_precision", "accuracy", "macro_f1")
        metric_names = tasks.METRICS[task] if task else tasks.METRIC_NAMES
        loss_ok = self.train.loss == "" or (self.train.loss.lower() in tasks.LOSS_TASK and (
            task is None or tasks.LOSS_TASK[self.train.loss.lower()] == task))
        checks = [
            ("output_dir", bool(self.output_dir.strip()) and _usable_folder(self.output_dir)),
            ("data.sample_fraction", 0 < self.data.sample_fraction <= 1),
            ("prepare.holdout_fraction", 0 < self.prepare.holdout_fraction < 1),
            ("prepare.majority_ratio", self.prepare.majority_ratio >= 0),
            ("prepare.selector_top_fraction", 0 < self.prepare.selector_top_fraction <= 1),
            ("prepare.max_correlation", 0 < self.prepare.max_correlation <= 1),
            ("prepare.pca_k", self.prepare.pca_k >= 0),
            ("prepare.pca_variance_target", 0 < self.prepare.pca_variance_target <= 1),
            ("prepare.encoding", self.prepare.encoding in Choices.ENCODINGS),
            ("prepare.numeric_buckets", self.prepare.numeric_buckets == 0 or 2 <= self.prepare.numeric_buckets <= 1000),
            ("prepare.min_category_count", self.prepare.min_category_count >= 1 and (
                self.prepare.min_category_count == 1 or self.prepare.encoding == "embedding")),
            ("prepare.hash_buckets", self.prepare.hash_buckets == 0 or (
                2 <= self.prepare.hash_buckets <= Choices.MAX_HASH_BUCKETS and self.prepare.encoding == "embedding")),
            ("train.normalization", self.train.normalization in Choices.NORMALIZATIONS),
            ("train.numeric_embedding", self.train.numeric_embedding in Choices.NUMERIC_EMBEDDINGS),
            ("train.ensemble", 0 <= self.train.ensemble <= 64),
            ("train.lr_schedule", self.train.lr_schedule in Choices.LR_SCHEDULES),
            ("train.shuffle_buffer_rows", self.train.shuffle_buffer_rows >= 1),
            ("train.num_proc", self.train.num_proc >= 1),
            ("train.epochs", self.train.epochs >= 1),
            ("train.batch_size", self.train.batch_size >= 0),
            ("train.hidden_units", bool(self.train.hidden_units) and min(self.train.hidden_units) >= 1),
            ("train.metrics", all(m.lower() in metric_names for m in self.train.metrics)),
            ("train.loss", loss_ok),
            ("train.learning_rate", self.train.learning_rate > 0),
            ("train.optimizer", self.train.optimizer.lower() in Choices.OPTIMIZERS),
            ("train.dropout", 0 <= self.train.dropout < 1),
            ("train.validation_fraction", 0 <= self.train.validation_fraction < 1),
            ("train.early_stopping_patience", self.train.early_stopping_patience >= 0),
            ("train.accumulation_steps", self.train.accumulation_steps >= 1),
            ("train.compression", self.train.compression in Choices.COMPRESSIONS),
            ("train.strategy", self.train.strategy in STRATEGY_RULES),
            ("train.local_steps", self.train.local_steps >= 1),
            ("train.stall_timeout", 0 < self.train.stall_timeout < float("inf")),
            ("train.shard_embeddings_above", self.train.shard_embeddings_above >= 0),
            ("train.warmup_epochs", self.train.warmup_epochs >= 0),
            ("baselines.models", len(set(self.baselines.models)) == len(self.baselines.models) and all(
                m in (tasks.BASELINES[task] if task else {n for v in tasks.BASELINES.values() for n in v})
                for m in self.baselines.models)),
            ("baselines.trees", self.baselines.trees >= 1),
            ("baselines.depth", 1 <= self.baselines.depth <= 26),
            ("baselines.max_iter", self.baselines.max_iter >= 1),
            ("gate.metric", gate_ok),
            ("gate.min_value", self.gate.min_value >= 0 if lower else
             0 <= self.gate.min_value <= 1 if unit else self.gate.min_value <= 1),
            ("gate.max_regression", self.gate.max_regression >= 0 and (lower or self.gate.max_regression <= 1)),
            *self._tune_checks(task),
            ("tracking.experiment", bool(self.tracking.experiment.strip())),
            *self._compress_checks(),
            # MLflow's default store is a SQLite file under the output folder: only a local one.
            ("tracking.uri", bool(self.tracking.uri) or not self.tracking.enabled or _is_local(self.output_dir)),
        ]
        allowed = {"output_dir": "a folder (an empty one would mean the current directory): a path, "
                                 "file:///absolute/path, or a Hadoop URI such as hdfs://namenode:8020/path",
                   "tracking.uri": ("an MLflow tracking URI (a server, or sqlite:///<a local file>) when "
                                    f"output_dir is not local ({self.output_dir}): the default SQLite store "
                                    "lives under the output folder; or set tracking.enabled=false"),
                   "train.hidden_units": "one or more layer widths, each >= 1",
                   "train.strategy": f"one of {list(STRATEGY_RULES)}",
                   "train.compression": f"one of {list(Choices.COMPRESSIONS)}",
                   "train.optimizer": f"one of {list(Choices.OPTIMIZERS)}",
                   "train.stall_timeout": "a finite number of seconds > 0",
                   "train.shard_embeddings_above": "a number of bytes >= 0 (0 = never split a table)",
                   "prepare.hash_buckets": "0 (every level its own index), or 2 to 2^30 buckets with "
                                           "prepare.encoding embedding",
                   "train.local_steps": "an integer >= 1 (updates between weight averages; used by "
                                        "train.strategy local_sgd only)",
                   "train.batch_size": "rows per rank per step, or 0 to choose it from the training row count",
                   "train.metrics": (f"{task} metric names from {sorted(metric_names)}" if task else
                                     f"metric names from {sorted(metric_names)}"),
                   "train.loss": ("'' (the task's default) or a loss for a " + (task or "supported") +
                                  f" network: {sorted(k for k, t in tasks.LOSS_TASK.items() if t == task or not task)}"),
                   "baselines.models": ("distinct names from " + (
                       str(list(tasks.BASELINES[task])) if task else str(tasks.BASELINES)) + "; [] = all of them"),
                   "baselines.depth": "1 to 26 (the random forest grows depth + 4, MLlib's limit is 30)",
                   "gate.metric": (f'"" (the task\'s default: {tasks.DEFAULT_GATE_METRIC}) or a held-out metric '
                                   f'of the {task or "any"} task: '
                                   f'{[m for m, h in tasks.HOLDOUT_METRICS.items() if not task or task in h.tasks]}'),
                   **self._tune_hints(task), **COMPRESS_HINTS}
        for key, ok in checks:
            if not ok:
                value = self
                for part in key.split("."):
                    value = getattr(value, part)
                hint = f" (expected {allowed[key]})" if key in allowed else ""
                raise ConfigError(f"config key {key!r}: value {shown(value)} is out of range{hint}")
        # What the strategy takes, by its own declaration (the estimator asks the same rule).
        given = strategy_values(self.train.strategy, {k: getattr(self.train, k) for k in STRATEGY_SETTINGS
                                                      if hasattr(self.train, k)})
        for key, line in strategy_conflicts(self.train.strategy, given, naming="key").items():
            raise ConfigError(f"config key 'train.{key}': {line}")


    def _compress_checks(self) -> list[tuple[str, bool]]:
        c = self.compress
        return [
            ("compress.variants", len(set(c.variants)) == len(c.variants) and all(
                v in Choices.COMPRESS_VARIANTS for v in c.variants)),
            ("compress.sparsity", 0 < c.sparsity < 1),
            ("compress.fine_tune_epochs", c.fine_tune_epochs >= 0),
            ("compress.student_units", all(u >= 1 for u in c.student_units)),
            ("compress.alpha", 0 <= c.alpha <= 1),
            ("compress.distill_epochs", c.distill_epochs >= 1),
        ]

    def _tune_checks(self, task: str | None) -> list[tuple[str, bool]]:
        """The ``tune`` section's checks (and, with a search on, what it needs of the others)."""
        u, net, xgb = self.tune, self.tune.network, self.tune.xgboost
        on = u.trials > 0
        aimed = not on or task is None or (task, self.gate.metric or tasks.DEFAULT_GATE_METRIC[task]) \
            in tasks.VALIDATION_METRICS
        return [
            ("tune.trials", u.trials >= 0),
            ("tune.startup_trials", u.startup_trials >= 0),
            ("tune.pruner", u.pruner in Choices.PRUNERS),
            ("tune.prune_every", u.prune_every >= 1),
            # Optuna's default store is a SQLite file under the run's folder: only a local one.
            ("tune.storage", bool(u.storage) or not on or _is_local(self.output_dir)),
            ("tune.network.learning_rate", _span(net.learning_rate) and net.learning_rate[0] > 0),
            ("tune.network.hidden_units", bool(net.hidden_units) and all(
                c and min(c) >= 1 for c in net.hidden_units) and len(set(net.hidden_units)) == len(net.hidden_units)),
            ("tune.network.dropout", _span(net.dropout) and 0 <= net.dropout[0] and net.dropout[1] < 1),
            ("tune.network.batch_size", all(b >= 1 for b in net.batch_size) and
             len(set(net.batch_size)) == len(net.batch_size)),
            ("tune.network.numeric_embedding", all(e in Choices.NUMERIC_EMBEDDINGS for e in net.numeric_embedding)
             and len(set(net.numeric_embedding)) == len(net.numeric_embedding)),
            ("tune.network.ensemble", all(0 <= k <= 64 for k in net.ensemble) and
             len(set(net.ensemble)) == len(net.ensemble)),
            ("tune.xgboost.validation_fraction", 0 < xgb.validation_fraction < 1),
            ("tune.xgboost.max_depth", _span(xgb.max_depth) and xgb.max_depth[0] >= 1),
            ("tune.xgboost.learning_rate", _span(xgb.learning_rate) and xgb.learning_rate[0] > 0),
            ("tune.xgboost.n_estimators", _span(xgb.n_estimators) and xgb.n_estimators[0] >= 1),
            ("tune.xgboost.subsample", _span(xgb.subsample) and 0 < xgb.subsample[0] and xgb.subsample[1] <= 1),
            ("tune.xgboost.colsample_bytree", _span(xgb.colsample_bytree) and 0 < xgb.colsample_bytree[0]
             and xgb.colsample_bytree[1] <= 1),
            ("tune.xgboost.min_child_weight", _span(xgb.min_child_weight) and xgb.min_child_weight[0] > 0),
            ("tune.xgboost.reg_lambda", _span(xgb.reg_lambda) and xgb.reg_lambda[0] > 0),
            ("tune.xgboost.enabled", not (on and xgb.enabled and self.baselines.models
                                          and "xgboost" not in self.baselines.models)),
            # What a search needs of the other sections: validation rows to score trials on,
            # and a gate metric the network reports on them every epoch.
            ("train.validation_fraction", not on or self.train.validation_fraction > 0),
            ("train.trace", not (on and self.train.trace)),
            ("gate.metric", aimed),
        ]

    def _tune_hints(self, task: str | None) -> dict[str, str]:
        usable = [m for (t, m) in tasks.VALIDATION_METRICS if t == task] if task else \
            sorted({m for _, m in tasks.VALIDATION_METRICS})
        out = {"tune.trials": "an integer >= 0: trials per search (0 = no search)",
               "tune.pruner": f"one of {list(Choices.PRUNERS)}",
               "tune.prune_every": "an integer >= 1: epochs between a network trial's pruning decisions",
               "tune.storage": (f"an Optuna storage URL (sqlite:///<a local file>, postgresql://...) when "
                                f"output_dir is not local ({self.output_dir}): the default SQLite file lives "
                                "under the run's folder; or set tune.trials=0"),
               "tune.network.learning_rate": "[low, high] with 0 < low <= high (sampled log-uniform)",
               "tune.network.hidden_units": "one or more distinct choices, each a list of layer widths >= 1",
               "tune.network.dropout": "[low, high] with 0 <= low <= high < 1",
               "tune.network.batch_size": "distinct choices >= 1, or [] for train.batch_size",
               "tune.network.numeric_embedding": (f"distinct choices among {list(Choices.NUMERIC_EMBEDDINGS)}, "
                                                  "or [] for train.numeric_embedding"),
               "tune.network.ensemble": "distinct choices from 0 to 64, or [] for train.ensemble",
               "tune.xgboost.validation_fraction": "a share of the rows strictly between 0 and 1",
               "tune.xgboost.max_depth": "[low, high] whole numbers with 1 <= low <= high",
               "tune.xgboost.n_estimators": "[low, high] whole numbers with 1 <= low <= high",
               "tune.xgboost.enabled": ("false, or baselines.models including xgboost: the search tunes the xgboost "
                                        "baseline, which baselines.models leaves out"),
               "train.trace": ("false while tune.trials > 0: the trace profiles one fit, and a search's fits are "
                               "its trials (the final model is the best trial's); trace a run without a search"),
               "train.validation_fraction": ("a share in [0, 1); > 0 while tune.trials > 0: trials are scored on "
                                             "the validation rows, never on the holdout")}
        for key in ("learning_rate", "min_child_weight", "reg_lambda"):
            out[f"tune.xgboost.{key}"] = "[low, high] with 0 < low <= high (sampled log-uniform)"
        for key in ("subsample", "colsample_bytree"):
            out[f"tune.xgboost.{key}"] = "[low, high] with 0 < low <= high <= 1"
        if self.tune.trials > 0 and task and not (task, self.gate.metric or tasks.DEFAULT_GATE_METRIC[task]) \
                in tasks.VALIDATION_METRICS:
            out["gate.metric"] = (f"while tune.trials > 0, a metric the network reports per epoch on its validation "
                                  f"rows, which trials are compared on: one of {usable} for a {task} task")
        return out


def _span(values: tuple) -> bool:
    """A [low, high] range: two values, low <= high."""
    return len(values) == 2 and values[0] <= values[1]


def _usable_folder(path: str) -> bool:
    from sparkdeep.storage import qualify
    try:
        qualify(path)
    except ValueError:
        return False
    return True


def _is_local(path: str) -> bool:
    from sparkdeep.storage import is_local
    return is_local(path)


# -- loading -----------------------------------------------------------------------------

def _merge(base: dict, over: Mapping, origins: dict, source: str, prefix: str = "") -> None:
    for key, value in over.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict) and dotted != "spark.settings":
            _merge(base[key], value, origins, source, dotted + ".")
        elif isinstance(value, Mapping) and dotted == "spark.settings" and isinstance(base.get(key), dict):
            for k, v in value.items():
                base[key][k] = v
                origins[f"{dotted}.{k}"] = source
        else:
            base[key] = plain(value)
            _record(origins, dotted, value, source)


def _record(origins: dict, dotted: str, value: Any, source: str) -> None:
    origins[dotted] = source
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record(origins, f"{dotted}.{k}", v, source)


def _read_dir(folder: Path, tree: dict, origins: dict, required: bool) -> None:
    if not folder.is_dir():
        if required:
            raise ConfigError(f"config folder {str(folder)!r} does not exist")
        return
    files = sorted(folder.glob("*.yaml"))
    if required and not files:
        raise ConfigError(f"config folder {str(folder)!r} holds no .yaml file")
    for path in files:
        _merge(tree, read_mapping(path, "config file", ConfigError), origins, str(path))


#: The config's wording of the shared YAML-to-dataclass rules (sparkdeep.typed_yaml.Fields).
_FIELDS = Fields(
    error=ConfigError,
    where=lambda key, source: f"config key {key!r} (from {source})",
    unknown=lambda key, source, known: f"unknown config key {key!r} in {source} (known here: {known})",
    missing=lambda key, source: (f"config key {key!r} is missing: every key has its default in "
                                 "conf/base/*.yaml (an overlay or --set may change it, not remove it)"))


def _build(cls: type, tree: Mapping, prefix: str, source_of: dict | None = None,
           default_source: str = "defaults") -> Any:
    return _FIELDS.build(cls, tree, prefix, lambda dotted: _source(source_of, dotted, default_source))


def _source(origins: dict | None, dotted: str, default: str) -> str:
    if not origins:
        return default
    if dotted in origins:
        return origins[dotted]
    children = [v for k, v in origins.items() if k.startswith(dotted + ".")]
    return children[0] if children else default


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.epochs=3"`` -> ``("train.epochs", 3)``; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {shown(text)} must look like key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {shown(text)} has an empty key")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ConfigError as exc:
        raise ConfigError(f"override {shown(text)}: {exc}") from None
    return key, value


def load_config(conf_dir: str | Path = "conf", env: str | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``conf_dir/base``, then ``conf_dir/<env>``, then ``key=value`` overrides."""
    conf_dir = Path(conf_dir)
    tree: dict = {}
    origins: dict = {}
    _read_dir(conf_dir / "base", tree, origins, required=True)
    if env:
        _read_dir(conf_dir / env, tree, origins, required=True)
    spec_overrides: dict = {}
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("dataset."):  # a key of the dataset spec, not of this config
            spec_overrides[key[len("dataset."):]] = value
            continue
        nested: dict = {}
        parts = key.split(".")
        if key.startswith("spark.settings.") and len(parts) > 2:
            # Spark keys contain dots themselves: spark.settings.<spark.key>.
            parts = ["spark", "settings", key[len("spark.settings."):]]
        put_dotted(nested, parts, value)
        _merge(tree, nested, origins, f"--set {_cut(text)}")
    if "dataset" in tree:
        raise ConfigError(f"config key 'dataset' (from {origins.get('dataset', 'config')}): the dataset spec "
                          "lives in its own file, conf/datasets/<name>.yaml, chosen by data.dataset "
                          "(--dataset); change one of its keys with --set dataset.<key>=<value>")
    cfg = _build(Config, tree, "", origins)
    spec = load_spec(cfg.data.dataset, conf_dir, spec_overrides)
    return dataclasses.replace(cfg, dataset=spec)


def default_conf_dir() -> Path:
    """``$SPARKDEEP_CONF_DIR``, else the repo's ``conf/`` from a checkout, else the copy
    installed with the package (``sparkdeep.conf``: a wheel ships it), else ``./conf``."""
    import importlib.resources
    import os
    if os.environ.get("SPARKDEEP_CONF_DIR"):
        return Path(os.environ["SPARKDEEP_CONF_DIR"])
    here = Path(__file__).resolve().parent.parent / "conf"
    if here.is_dir():
        return here
    try:
        shipped = Path(str(importlib.resources.files("sparkdeep.conf")))
    except ModuleNotFoundError:
        return Path("conf")
    return shipped if (shipped / "base").is_dir() else Path("conf")
