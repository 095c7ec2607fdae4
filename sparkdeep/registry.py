"""The names the steps share, said once: the Delta tables a run writes and reads (the
source table and its rejected rows are named by the dataset spec), and the models it
saves. ``tests/test_structure.py`` refuses these names as literals elsewhere in the jobs,
pipelines and core."""
from __future__ import annotations


class Tables:
    """The tables the steps pass on (under ``<output>/tables/<dataset>_<name>``)."""
    TRAIN = "train"                              # prepare: the training split, as ingested
    HOLDOUT = "holdout"                          # prepare: the held-out split, as ingested
    TRAIN_PREPARED = "train_prepared"            # prepare: features, label, weight: what train reads
    PREDICTIONS = "predictions"                  # score: the network's predictions on the holdout
    BASELINE_PREDICTIONS = "baseline_predictions"  # score: every baseline's predictions
    ALL = (TRAIN, HOLDOUT, TRAIN_PREPARED, PREDICTIONS, BASELINE_PREDICTIONS)


class Models:
    """The fitted pipelines a run saves, in the order its steps write them."""
    PREPARE = "prepare"      # the reduction pipeline alone (prepare)
    PIPELINE = "pipeline"    # prepare + the network: the model that is promoted and served (train)
    BASELINE = "baseline"    # prepare's front + the MLlib baselines (train)
    ALL = (PREPARE, PIPELINE, BASELINE)
