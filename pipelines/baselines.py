"""What a user would try instead: MLlib's usual strongest models on the *full* features.

The deep pipeline trains on reduced features (rebalanced sample, selected columns, PCA).
A fair comparison fits MLlib's models on every feature of the whole training table: the
prepare pipeline's fitted encoding (string indexers, imputer), without the sampler, the
selectors or PCA. Each baseline is a whole ``PipelineModel`` (that front + the model), so
it scores raw holdout rows like the deep one.

Categories, at any number of levels, are encoded as a Spark user would for each model
(:func:`assembly_front`):

- the trees (``TREES``: gradient-boosted trees, random forest) read ``assembled__indexed``:
  the imputed numbers and *one index per categorical column*, which the indexer's ML
  attribute marks nominal, so MLlib splits it as a category (a set of levels on each side,
  found by sorting the levels by their label statistics: no search over subsets), with
  ``maxBins`` raised to the largest category count (:func:`features_for`);
- the linear models and XGBoost read ``assembled``: the imputed numbers and each column
  one-hot.

Each keeps a column's most frequent levels in training as their own, at most
``max_levels`` (:data:`MAX_LEVELS`) one-hot and ``max_bins - 1`` (:data:`TREE_MAX_BINS`)
for the trees; the other levels share one bucket with unseen and null values (an MLlib
``Bucketizer`` on the index: the top levels keep their index, the rest one more), and each
capped column is logged. So a column of 9,000 item ids costs the one-hot vector 255
columns and the trees one feature of 64 categories, where uncapped one-hot gave 9,000
columns: MLlib's trees hold a bin per row and feature and XGBoost a histogram per column.

Candidates per task (``BASELINES``, from ``sparkdeep.tasks``):

- binary: logistic regression, gradient-boosted trees, random forest, XGBoost;
- multiclass: multinomial logistic regression, random forest, XGBoost (MLlib's GBT is
  binary only);
- regression: linear regression, gradient-boosted trees, random forest, XGBoost.

XGBoost is ``xgboost.spark``'s estimator with the library's default settings (100 rounds
of depth 6, learning rate 0.3), or with the settings a search found (``xgboost_params``,
``pipelines/tune``), trained by as many barrier tasks as the network has ranks
(``workers``); it saves as MLlib stages do (metadata JSON and the booster as XGBoost's own
JSON), and ``sparkdeep.model_store`` refuses the pickled callbacks its format allows.

The train step saves them as one ``PipelineModel`` (:func:`fit_pipeline`): the shared
encoding front, then each model writing its own ``<name>__prediction`` (and
``__probability``/``__raw``) columns, so one pass over the holdout scores all of them and
the names travel in the saved model itself (:func:`names_in`, :func:`model_frame`).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Mapping

from pyspark.ml import PipelineModel
from pyspark.ml.feature import Bucketizer, ImputerModel, OneHotEncoder, OneHotEncoderModel, StringIndexerModel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep import tasks
from sparkdeep.registry import Columns
from sparkdeep.tasks import BASELINES

from sparkdeep.transformers.columns import ColumnRenamer, WideAssembler, wide_plans
from sparkdeep.transformers.hashing import HashIndexer

from .prepare import LABEL, LISTED, top_levels_indexer

log = logging.getLogger(__name__)

ASSEMBLED = "assembled"
#: The trees' features: the imputed numbers, then one nominal index per categorical column.
INDEXED = "assembled__indexed"
#: The baselines that read :data:`INDEXED` (where the front writes it).
TREES = ("gbt", "random_forest")
#: The most levels of a categorical column the one-hot encoding keeps as its own (the most
#: frequent); the others share one bucket with unseen and null values.
MAX_LEVELS = 255
#: MLlib's ``maxBins`` default, which the trees keep unless a column has more categories.
MAX_BINS = 32
#: The trees' ``maxBins`` at most: a categorical column keeps ``TREE_MAX_BINS - 1`` levels
#: as its own. MLlib sizes each node's statistics by ``maxBins`` (the numbers get that many
#: thresholds too): a random forest on 100,000 rows took as long at 64 as at 32, twice as
#: long at 256 (bench/RESULTS.md).
TREE_MAX_BINS = 64
#: Suffixes of each baseline's output columns in the combined pipeline.
PREDICTION, PROBABILITY, RAW = "__prediction", "__probability", "__raw"


def assembly_front(prepare_model: PipelineModel, train: DataFrame, *, max_levels: int = MAX_LEVELS,
                   max_bins: int = TREE_MAX_BINS) -> PipelineModel:
    """The fitted encoding of ``prepare_model`` for the baselines, minus the class-balance
    sampler (every row, every feature): its column renamer, string indexers and imputer,
    then the categorical columns assembled twice: ``assembled`` (numbers, then each column
    one-hot with at most ``max_levels`` levels of its own) and, when there are any,
    :data:`INDEXED` (numbers, then one index per column with at most ``max_bins - 1``
    levels of its own). A capped column keeps its most frequent levels; the rest share one
    bucket with unseen and null values, and the column is logged with its level count
    (:func:`capped_columns`). A one-hot and an embedding prepare model give the same front.

    ``train`` gives the one-hot encoder its input schema: the indexers' attributes carry
    the level counts, so no row is read.

    Examples
    --------
    >>> front = assembly_front(prepare_model, train, max_levels=100)  # doctest: +SKIP
    >>> front.transform(holdout).select(ASSEMBLED, INDEXED)            # doctest: +SKIP
    """
    if int(max_levels) < 1 or int(max_bins) < 2:
        raise ValueError(f"max_levels must be at least 1 and max_bins at least 2 (a level of its own and the "
                         f"shared bucket), got max_levels {max_levels!r}, max_bins {max_bins!r}")
    keep = {"one_hot": int(max_levels), "trees": int(max_bins) - 1}
    stages = prepare_model.stages
    indexers = [s for s in stages if isinstance(s, StringIndexerModel)]
    hashers = [s for s in stages if isinstance(s, HashIndexer)]
    if hashers:
        # A hashed column has no vocabulary: the baselines index its most frequent levels,
        # as many as either encoding keeps, counted on the executors.
        k = max(keep.values())
        cols = [c for h in hashers for c in h.getInputCols()]
        indexers.append(top_levels_indexer(train, cols, [c for h in hashers for c in h.getOutputCols()], k))
        log.info("[train] baselines: %d hashed column(s) (%s) index their %d most frequent levels", len(cols),
                 ", ".join(cols[:LISTED]), k)
    imputers = [s for s in stages if isinstance(s, ImputerModel)]
    if not indexers and not imputers:
        raise ValueError("the prepare pipeline has neither a StringIndexer nor an Imputer: no full-feature "
                         "baseline can be built")
    front = [s for s in stages if isinstance(s, ColumnRenamer)] + indexers + imputers
    inputs = {use: [] for use in keep}  # the categorical columns each encoding reads
    buckets = {}  # {(index column, levels kept): capped column}
    for stage in indexers:
        for col, labels in zip(stage.getOutputCols(), stage.labelsArray):
            for use, k in keep.items():
                if len(labels) <= k:
                    inputs[use].append(col)
                    continue
                if stage.getStringOrderType() != "frequencyDesc":
                    # The cap keeps the first indices: the most frequent levels only in this order.
                    raise ValueError(f"the prepare model indexes {stage.getInputCols()} in stringOrderType "
                                     f"{stage.getStringOrderType()!r}; capping at {k} levels needs "
                                     "'frequencyDesc' (prepare's), or max_levels and max_bins above their "
                                     "level counts")
                inputs[use].append(buckets.setdefault((col, k), f"{col}__top{k}"))
    if buckets:
        # A level below k keeps its index, the rest (rarer levels, then unseen and null)
        # share k. A Bucketizer's output is nominal: the trees and the encoder see k + 1
        # categories. One stage for every capped column: the plan does not deepen with them.
        front.append(Bucketizer(inputCols=[c for c, _ in buckets], outputCols=list(buckets.values()),
                                splitsArray=[[float(i) for i in range(k + 1)] + [float("inf")] for _, k in buckets]))
    ohe = [f"{c}__ohe" for c in inputs["one_hot"]]
    imp = [c for s in imputers for c in s.getOutputCols()]
    if ohe:
        # Sized by the columns' attributes: the fit reads no row.
        front.append(OneHotEncoder(inputCols=inputs["one_hot"], outputCols=ohe, dropLast=True).fit(
            PipelineModel(list(front)).transform(train)))
        front.append(WideAssembler(inputCols=imp + inputs["trees"], outputCol=INDEXED, handleInvalid="error"))
    front.append(WideAssembler(inputCols=imp + ohe, outputCol=ASSEMBLED, handleInvalid="error"))
    model = PipelineModel(front)
    _log_capped(model)
    return model


def capped_columns(front: PipelineModel) -> dict[str, dict[str, int]]:
    """``{column: {"levels": its levels in training, "one_hot": the levels the one-hot
    encoding keeps as their own, "trees": those the trees keep}}`` of every categorical
    column :func:`assembly_front` capped (under its source name where renamed)."""
    shown, levels = {}, {}
    for stage in front.stages:
        if isinstance(stage, ColumnRenamer):
            shown.update((internal, original) for original, internal in stage.pairs())
        elif isinstance(stage, StringIndexerModel):
            levels.update((out, (col, len(labels))) for col, out, labels
                          in zip(stage.getInputCols(), stage.getOutputCols(), stage.labelsArray))
    kept = {}  # {encoded column: (index column, levels kept)}
    for stage in front.stages:
        if isinstance(stage, Bucketizer) and stage.isSet("splitsArray"):
            kept.update((out, (col, len(splits) - 2)) for col, out, splits
                        in zip(stage.getInputCols(), stage.getOutputCols(), stage.getSplitsArray()) if col in levels)
    reads = {}  # {"one_hot"/"trees": the categorical columns that encoding reads}
    for stage in front.stages:
        if isinstance(stage, OneHotEncoderModel):
            reads["one_hot"] = stage.getInputCols()
        elif isinstance(stage, WideAssembler) and stage.getOutputCol() == INDEXED:
            reads["trees"] = stage.getInputCols()
    out = {}
    for col, (name, n) in levels.items():
        caps = {use: min([kept[c][1] for c in cols if kept.get(c, ("",))[0] == col] or [n])
                for use, cols in reads.items()}
        if any(k < n for k in caps.values()):
            out[shown.get(name, name)] = {"levels": n, **caps}
    return out


def _log_capped(front: PipelineModel) -> None:
    capped = capped_columns(front)
    for col, c in list(capped.items())[:LISTED]:
        kept = [f"{what} the top {c[use]}" for use, what in (("one_hot", "the one-hot encoding keeps"),
                                                             ("trees", "the trees keep")) if c[use] < c["levels"]]
        log.info("[train] baselines: column %r has %d levels; %s; the rest share one bucket with unseen and null "
                 "values", col, c["levels"], " and ".join(kept))
    if len(capped) > LISTED:
        log.info("[train] baselines: ... and %d more columns capped the same way", len(capped) - LISTED)


def features_for(name: str, rows: DataFrame) -> dict:
    """``{"features": column, "max_bins": bins}`` for baseline ``name`` on ``rows`` (as
    :func:`assembled_rows` gives them): a tree reads :data:`INDEXED` where the rows have it,
    with ``maxBins`` the largest category count among its nominal features (MLlib's
    default, :data:`MAX_BINS`, at least); everything else reads ``assembled``."""
    if name not in TREES or INDEXED not in rows.columns:
        return {"features": ASSEMBLED, "max_bins": MAX_BINS}
    attrs = rows.schema[INDEXED].metadata.get("ml_attr", {}).get("attrs", {})
    counts = [len(a["vals"]) if "vals" in a else int(a.get("num_vals", 0)) for a in attrs.get("nominal", [])]
    return {"features": INDEXED, "max_bins": max([MAX_BINS, *counts])}


#: The XGBoost settings a search may set (``xgboost_params``): numbers only, nothing that
#: names code or files (callbacks, an initial booster), which the saved model would carry.
XGBOOST_PARAMS = ("max_depth", "learning_rate", "n_estimators", "subsample", "colsample_bytree",
                  "min_child_weight", "reg_lambda")


def estimator(name: str, task: str, *, seed: int, trees: int = 50, depth: int = 6, max_iter: int = 100,
              workers: int = 1, xgboost_params: Mapping[str, float] | None = None, features: str = ASSEMBLED,
              max_bins: int = MAX_BINS):
    """The unfitted estimator ``name`` for ``task`` (see ``BASELINES``); ``workers``: XGBoost's
    barrier tasks (the others are MLlib's and use every partition); ``xgboost_params``:
    XGBoost's settings in place of the library's defaults (names from :data:`XGBOOST_PARAMS`);
    ``features`` and the trees' ``max_bins``: what :func:`features_for` says."""
    tasks.check_task(task)
    if name not in BASELINES[task]:
        raise ValueError(f"no baseline {name!r} for a {task} task; choose from {list(BASELINES[task])}")
    unknown = sorted(set(xgboost_params or {}) - set(XGBOOST_PARAMS))
    if unknown:
        raise ValueError(f"xgboost_params {unknown} are not settings a search may give XGBoost; "
                         f"known: {list(XGBOOST_PARAMS)}")
    if name == "xgboost":
        return _xgboost(task, seed=seed, workers=workers, params=xgboost_params or {}, features=features)
    common = {"featuresCol": features, "labelCol": LABEL}
    forest = {"numTrees": 2 * trees, "maxDepth": depth + 4, "maxBins": max_bins, "seed": seed, **common}
    boosted = {"maxIter": trees, "maxDepth": depth, "maxBins": max_bins, "seed": seed, **common}
    if task == "regression":
        from pyspark.ml import regression as R
        if name == "linear_regression":
            return R.LinearRegression(maxIter=max_iter, regParam=0.0, **common)
        if name == "gbt":
            return R.GBTRegressor(**boosted)
        return R.RandomForestRegressor(**forest)
    from pyspark.ml import classification as C
    if name == "logistic_regression":
        return C.LogisticRegression(maxIter=max_iter, regParam=0.0, family="auto", **common)
    if name == "gbt":
        return C.GBTClassifier(**boosted)
    return C.RandomForestClassifier(**forest)


def _xgboost(task: str, *, seed: int, workers: int, params: Mapping[str, float], features: str):
    from xgboost.spark import SparkXGBClassifier, SparkXGBRegressor
    # Its driver logger says INFO per fit and passes its level to the barrier tasks.
    logging.getLogger("XGBoost-PySpark").setLevel(logging.WARNING)
    cls = SparkXGBRegressor if task == "regression" else SparkXGBClassifier
    # verbose=False: no training-set evaluation printed (and computed) every round.
    return cls(features_col=features, label_col=LABEL, num_workers=max(1, int(workers)), random_state=seed,
               verbose=False, **params)


def _outputs(est, name: str, task: str):
    outputs = {"predictionCol": name + PREDICTION}
    if task != "regression":
        outputs.update(probabilityCol=name + PROBABILITY, rawPredictionCol=name + RAW)
    for param, value in outputs.items():  # MLlib's and xgboost.spark's estimators alike
        est.set(est.getParam(param), value)
    return est


def check_xgboost_classes(assembled: DataFrame) -> None:
    """XGBoost takes the class count from the distinct training labels: a class index with
    no training row would make a higher one out of range. Refused, naming the indices."""
    row = assembled.agg(F.countDistinct(LABEL).alias("n"), F.max(LABEL).alias("top")).first()
    if row["top"] is not None and row["n"] != int(row["top"]) + 1:
        present = {int(r[0]) for r in assembled.select(LABEL).distinct().collect()}
        missing = sorted(set(range(int(row["top"]) + 1)) - present)
        raise ValueError(f"the xgboost baseline needs a training row of every class below the highest; class "
                         f"indices {missing} have none (drop xgboost from baselines.models, or keep those "
                         "classes' rows in the training table)")


def names_for(task: str, names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The baselines to fit: ``names``, or the task's (``BASELINES``); an unknown one is named."""
    names = tuple(names) if names else BASELINES[tasks.check_task(task)]
    for name in names:
        estimator(name, task, seed=0)  # an unknown name fails before any work
    return names


@contextlib.contextmanager
def assembled_rows(train: DataFrame, prepare_model: PipelineModel, *, max_levels: int = MAX_LEVELS,
                   max_bins: int = TREE_MAX_BINS) -> Iterator[tuple[PipelineModel, DataFrame]]:
    """(the fitted front, every row of ``train`` as ``assembled`` (+ :data:`INDEXED` where
    there are categorical columns) + ``label``), the rows cached while inside: the encoding
    is done once for every candidate (and a search). With categorical columns the numbers
    are held twice, once in each vector. ``max_levels``, ``max_bins``: :func:`assembly_front`."""
    with wide_plans(train.sparkSession):  # MLlib's per-column stages plan in linear time at width
        front = assembly_front(prepare_model, train, max_levels=max_levels, max_bins=max_bins)
        scored = front.transform(train)
        assembled = scored.select(*[c for c in (ASSEMBLED, INDEXED) if c in scored.columns], LABEL).cache()
    try:
        assembled.count()  # the encoding is shared by the candidates, not timed against one
        yield front, assembled
    finally:
        assembled.unpersist()


def fit_pipeline(train: DataFrame, prepare_model: PipelineModel, task: str, *, seed: int,
                 names: tuple[str, ...] | None = None, trees: int = 50, depth: int = 6,
                 max_iter: int = 100, workers: int = 1, xgboost_params: Mapping[str, float] | None = None,
                 max_levels: int = MAX_LEVELS, max_bins: int = TREE_MAX_BINS) -> tuple[PipelineModel, dict[str, float]]:
    """Every baseline in one ``PipelineModel`` (front + one model per name, each with its
    own output columns) fitted on every row of ``train``; and {name: fit seconds}.
    ``workers``: XGBoost's barrier tasks (the train step passes the network's rank count);
    ``max_levels``, ``max_bins``: the levels a categorical column keeps (:func:`assembly_front`)."""
    names = names_for(task, names)
    with assembled_rows(train, prepare_model, max_levels=max_levels, max_bins=max_bins) as (front, assembled):
        return fit_assembled(front, assembled, task, seed=seed, names=names, trees=trees, depth=depth,
                             max_iter=max_iter, workers=workers, xgboost_params=xgboost_params)


def fit_assembled(front: PipelineModel, assembled: DataFrame, task: str, *, seed: int, names: tuple[str, ...],
                  trees: int = 50, depth: int = 6, max_iter: int = 100, workers: int = 1,
                  xgboost_params: Mapping[str, float] | None = None) -> tuple[PipelineModel, dict[str, float]]:
    """:func:`fit_pipeline` on rows :func:`assembled_rows` made (the train step searches
    XGBoost's settings on the same rows first)."""
    if "xgboost" in names and task == "multiclass":
        check_xgboost_classes(assembled)
    inputs = {name: features_for(name, assembled) for name in names}
    bins = [i["max_bins"] for i in inputs.values() if i["features"] == INDEXED]
    if bins:
        log.info("[train] baselines: the trees split each categorical column as one feature of its categories "
                 "(maxBins %d)", bins[0])
    models, fit_s = [], {}
    for name in names:
        t0 = time.perf_counter()
        models.append(_outputs(estimator(name, task, seed=seed, trees=trees, depth=depth, max_iter=max_iter,
                                         workers=workers, xgboost_params=xgboost_params, **inputs[name]),
                               name, task).fit(assembled))
        fit_s[name] = round(time.perf_counter() - t0, 3)
    return PipelineModel(list(front.stages) + models), fit_s


def names_in(model: PipelineModel) -> list[str]:
    """The baselines a pipeline from :func:`fit_pipeline` holds, in fitting order."""
    out = []
    for stage in model.stages:
        if stage.hasParam("predictionCol") and stage.getOrDefault("predictionCol").endswith(PREDICTION):
            out.append(stage.getOrDefault("predictionCol")[:-len(PREDICTION)])
    return out


def model_frame(scored: DataFrame, name: str, task: str) -> DataFrame:
    """``scored`` (the output of a :func:`fit_pipeline` model) with baseline ``name``'s
    outputs as the usual ``prediction``/``probability``/``rawPrediction`` columns."""
    out = {Columns.PREDICTION: F.col(name + PREDICTION)}
    if task != "regression":
        out.update({Columns.PROBABILITY: F.col(name + PROBABILITY), "rawPrediction": F.col(name + RAW)})
    return scored.withColumns(out)
