"""The names the steps share, said once: the Delta tables a run writes and reads (the
source table and its rejected rows are named by the dataset spec), and the models it
saves. ``tests/test_structure.py`` refuses these names as literals elsewhere in the jobs,
pipelines and core."""
from __future__ import annotations


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
    # How the ranks agree (transformers/keras/strategies.py): Horovod ring all-reduce, TensorFlow's
    # collective all-reduce (no Horovod), local SGD (K updates alone, then the weights averaged).
    STRATEGIES = ("horovod", "collective", "local_sgd", "parameter_server")
    ENCODINGS = ("embedding", "onehot")     # prepare: categories as indices for embeddings, or one-hot
    NORMALIZATIONS = ("layer", "batch", "none")  # the tabular network's hidden layers
    # The tabular network's numbers: as they come (standardised), or also through learned periodic features.
    NUMERIC_EMBEDDINGS = ("none", "periodic")
    # compress (pipelines/compress.py): post-training quantization modes, magnitude pruning, distillation.
    COMPRESS_VARIANTS = ("int8", "int4", "float8", "bfloat16", "prune", "distill")
    # tune: which trials stop early (pipelines/tune.py): below the median of the finished trials at
    # the same epoch, Optuna's successive halving (asynchronous), or none (every trial runs its epochs).
    PRUNERS = ("median", "successive_halving", "none")
