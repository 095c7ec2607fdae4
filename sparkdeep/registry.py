"""The names the steps share, said once: the Delta tables a run writes and reads (the
source table and its rejected rows are named by the dataset spec), and the models it
saves. ``tests/test_structure.py`` refuses these names as literals elsewhere in the jobs,
pipelines and core."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Tables:
    """The tables the steps pass on (under ``<output>/tables/<name>``, beside the dataset's
    own ``<dataset>`` and ``<dataset>_rejected``)."""
    TRAIN = "train"                              # prepare: the training split, as ingested
    HOLDOUT = "holdout"                          # prepare: the held-out split, as ingested
    TRAIN_PREPARED = "train_prepared"            # prepare: features, label, weight: what train reads
    PREDICTIONS = "predictions"                  # score: the network's predictions on the holdout
    BASELINE_PREDICTIONS = "baseline_predictions"  # score: every baseline's predictions
    ALL = (TRAIN, HOLDOUT, TRAIN_PREPARED, PREDICTIONS, BASELINE_PREDICTIONS)
    RUNS = "runs"                                # every run: one row per run id (sparkdeep.runs.table)


class Models:
    """The fitted pipelines a run saves, in the order its steps write them."""
    PREPARE = "prepare"      # the reduction pipeline alone (prepare)
    PIPELINE = "pipeline"    # prepare + the network: the model that is promoted and served (train)
    BASELINE = "baseline"    # prepare's front + the MLlib baselines (train)
    ALL = (PREPARE, PIPELINE, BASELINE)


class Columns:
    """The columns the steps make and pass on, beside the source's own."""
    KEY = "row_id"                      # ingest: the row id derived when the spec names no key
    LABEL = "label"                     # ingest: the label, encoded for the task
    WEIGHT = "sample_weight"            # prepare: the rebalancing weight
    FEATURES = "features"               # prepare: the assembled vector the network trains on
    NUMERIC = "numeric_scaled"          # prepare: the numbers, imputed, selected and scaled
    PREDICTION = "prediction"           # score: a model's prediction (a class index or a value)
    PROBABILITY = "probability"         # score: the class probabilities (classification)
    MODEL = "model"                     # score: which model predicted the row
    LABEL_CLASS = "label_class"         # score: the label's class name (multiclass)
    PREDICTED_CLASS = "predicted_class"  # score: the predicted class name (multiclass)


class Choices:
    """The values a setting may take, said once: config checks them, the estimator checks
    its params against them, the ranks act on them."""
    LR_SCHEDULES = ("constant", "cosine")   # after warm-up: hold the rate, or decay it to 5%
    COMPRESSIONS = ("none", "fp16")         # the gradients on the wire
    # How the ranks agree: the names of STRATEGY_RULES below, where each strategy says what it takes.
    STRATEGIES: tuple[str, ...] = ()  # filled from STRATEGY_RULES at the end of this module
    ENCODINGS = ("embedding", "onehot")     # prepare: categories as indices for embeddings, or one-hot
    NORMALIZATIONS = ("layer", "batch", "none")  # the tabular network's hidden layers
    # The tabular network's numbers: as they come (standardised), or also through learned periodic features.
    NUMERIC_EMBEDDINGS = ("none", "periodic")
    # compress (pipelines/compress.py): post-training quantization modes, magnitude pruning, distillation.
    COMPRESS_VARIANTS = ("int8", "int4", "float8", "bfloat16", "prune", "distill")
    # tune: which trials stop early (pipelines/tune.py): below the median of the finished trials at
    # the same epoch, Optuna's successive halving (asynchronous), or none (every trial runs its epochs).
    PRUNERS = ("median", "successive_halving", "none")
    # train.optimizer: Keras' own optimizers by name, and lazy_adam (Adam whose sparse updates touch
    # the looked-up rows only: transformers/keras/optimizers.py). The estimator also takes any name
    # Keras' registry knows.
    OPTIMIZERS = ("adam", "lazy_adam", "adamw", "adamax", "nadam", "sgd", "rmsprop", "adagrad", "adadelta",
                  "adafactor", "ftrl", "lion")
    # prepare.hash_buckets / HashIndexer: the most buckets a column may have (its table's rows stay int32).
    MAX_HASH_BUCKETS = 2 ** 30


@dataclass(frozen=True)
class StrategySetting:
    """A training setting only some strategies use: its config key (under ``train.``), the
    estimator's param, and the value that means "not used" (``None``: any value set is a use).
    ``where_taken``: a default that applies only where the strategy takes it (config's
    ``local_steps: 8`` is no error under horovod); otherwise a value other than ``neutral``
    under a strategy that does not take it is an error."""
    key: str
    param: str
    neutral: Any
    what: str
    where_taken: bool = False


STRATEGY_SETTINGS: dict[str, StrategySetting] = {s.key: s for s in (
    StrategySetting("compression", "compression", "none", "Horovod's fp16 wire format"),
    StrategySetting("accumulation_steps", "accumulationSteps", 1,
                    "gradients of several batches summed into one exchange"),
    StrategySetting("local_steps", "localSteps", None, "updates each rank takes alone between weight averages",
                    where_taken=True),
    StrategySetting("scale_learning_rate", "scaleLearningRate", False,
                    "the learning rate times the ranks, as one step of every rank is one update", where_taken=True),
    StrategySetting("measure_wait", "measureWait", False, "a barrier timed before each exchange"),
    StrategySetting("shard_embeddings_above", "shardEmbeddingsAbove", 0,
                    "embedding tables above this many bytes split by rows across the ranks"),
)}


@dataclass(frozen=True)
class StrategyRule:
    """One way the ranks agree, declared once: the launch backend it needs
    (:func:`sparkdeep.distributed.run_on_ranks`), the settings of :data:`STRATEGY_SETTINGS`
    it takes, and what to set instead of one it does not take. Config, the estimator and the
    ranks' contract all ask :func:`strategy_conflicts`."""
    name: str
    backend: str
    summary: str                 # ``{local_steps}`` stands for the setting's value
    takes: frozenset[str]
    instead: dict[str, str] = field(default_factory=dict)  # setting -> a hint ({other} names a setting)


STRATEGY_RULES: dict[str, StrategyRule] = {r.name: r for r in (
    StrategyRule("horovod", "horovod", "ring all-reduce of the gradients every update, through Horovod",
                 frozenset({"compression", "accumulation_steps", "scale_learning_rate", "measure_wait",
                            "shard_embeddings_above"})),
    StrategyRule("collective", "tensorflow", "TensorFlow's collective all-reduce of the gradients every update, no Horovod",
                 frozenset({"accumulation_steps", "scale_learning_rate", "measure_wait"})),
    StrategyRule("local_sgd", "tensorflow", "each rank alone, weights averaged every {local_steps} updates",
                 frozenset({"local_steps", "scale_learning_rate", "measure_wait"}),
                 instead={"accumulation_steps": "it already exchanges every {local_steps} updates: set {local_steps} "
                                                "instead"}),
    StrategyRule("parameter_server", "tensorflow_ps",
                 "asynchronous: workers wait for no one; each worker's batch is one update of the variables on "
                 "the servers",
                 frozenset(),
                 instead={"accumulation_steps": "each update is one worker's batch: raise {batch_size} instead",
                          "scale_learning_rate": "each update is one worker's batch and the learning rate is used "
                                                 "as given: leave it at False",
                          "measure_wait": "its workers never wait for each other: leave it at False"}),
)}
Choices.STRATEGIES = tuple(STRATEGY_RULES)


def strategy_rule(name: str) -> StrategyRule:
    """The rule of strategy ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    if name not in STRATEGY_RULES:
        raise ValueError(f"strategy must be one of {', '.join(map(repr, STRATEGY_RULES))}, got {name!r}")
    return STRATEGY_RULES[name]


def strategy_conflicts(name: str, values: dict[str, Any], *, naming: str = "param") -> dict[str, str]:
    """What is wrong with ``values`` (setting key -> value; only the settings a caller has a
    value for) under strategy ``name``: setting key -> one line, empty when nothing is.
    ``naming`` is ``"param"`` (the estimator's names) or ``"key"`` (config's ``train.`` keys),
    for the messages. A ``where_taken`` setting is the caller's to leave out when it only holds
    a default (:func:`strategy_values`)."""
    rule = strategy_rule(name)

    def named(key: str) -> str:
        if naming == "key":
            return f"train.{key}"
        return STRATEGY_SETTINGS[key].param if key in STRATEGY_SETTINGS else {"batch_size": "batchSize"}[key]

    strategy = f"train.strategy={name!r}" if naming == "key" else f"strategy={name!r}"
    found = {}
    for key, value in values.items():
        setting = STRATEGY_SETTINGS[key]
        if key in rule.takes or (setting.neutral is not None and value == setting.neutral):
            continue
        takers = [r.name for r in STRATEGY_RULES.values() if key in r.takes]
        who = (f"strategy={takers[0]!r} only" if len(takers) == 1 else
               "strategies " + ", ".join(map(repr, takers)))
        hint = rule.instead.get(key)
        leave = "leave it unset" if setting.neutral is None else f"leave it at {setting.neutral!r}"
        hint = hint.format(**{k: named(k) for k in (*STRATEGY_SETTINGS, "batch_size")}) if hint else \
            f"{leave}, or choose {'that strategy' if len(takers) == 1 else 'one of those'}"
        hint = ": " + hint
        found[key] = f"{named(key)}={value!r} ({setting.what}) applies to {who}, not {strategy}{hint}"
    return found


def strategy_takes(name: str, key: str) -> bool:
    """Whether strategy ``name`` uses the setting ``key`` (of :data:`STRATEGY_SETTINGS`)."""
    return key in strategy_rule(name).takes


def strategy_values(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (setting key -> value) without the ``where_taken`` settings strategy
    ``name`` does not take: what a config's defaults hand the estimator."""
    rule = strategy_rule(name)
    return {k: v for k, v in values.items() if k in rule.takes or not STRATEGY_SETTINGS[k].where_taken}
