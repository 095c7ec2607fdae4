"""What a user would try instead: MLlib's usual strongest models on the *full* features.

The deep pipeline trains on reduced features (rebalanced sample, selected columns, PCA).
A fair comparison fits MLlib's models on every assembled feature of the whole training
table: the prepare pipeline's fitted encoding front (string indexers, one-hot encoders,
imputer, assembler), without the sampler, the selectors or PCA. Each baseline is a whole
``PipelineModel`` (that front + the model), so it scores raw holdout rows like the deep one.

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
import time
from typing import Iterator, Mapping

from pyspark.ml import PipelineModel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep import tasks
from sparkdeep.registry import Columns
from sparkdeep.tasks import BASELINES

from sparkdeep.transformers.columns import WideAssembler, wide_plans

from .prepare import ASSEMBLERS, LABEL

ASSEMBLED = "assembled"
#: Suffixes of each baseline's output columns in the combined pipeline.
PREDICTION, PROBABILITY, RAW = "__prediction", "__probability", "__raw"


def assembly_front(prepare_model: PipelineModel, train: DataFrame | None = None) -> PipelineModel:
    """The fitted encoding of ``prepare_model`` writing every feature to ``assembled``,
    minus the class-balance sampler: every row, every feature.

    A one-hot prepare model has it: its stages up to the assembler of
    ``assembled``. An embedding one indexes categories but never one-hot encodes them, so
    the front is its ``StringIndexer`` and ``Imputer`` models, a ``OneHotEncoder`` fitted
    here on ``train``, and an assembler of the imputed numbers and the one-hot columns.
    """
    from pyspark.ml.feature import ImputerModel, OneHotEncoder, StringIndexerModel

    from sparkdeep.transformers.sampling import ClassBalanceSamplerModel
    stages = []
    for stage in prepare_model.stages:
        if isinstance(stage, ClassBalanceSamplerModel):
            continue
        stages.append(stage)
        if isinstance(stage, ASSEMBLERS) and stage.getOutputCol() == ASSEMBLED:
            return PipelineModel(stages)
    indexers = [s for s in prepare_model.stages if isinstance(s, StringIndexerModel)]
    imputers = [s for s in prepare_model.stages if isinstance(s, ImputerModel)]
    if not indexers and not imputers:
        raise ValueError("the prepare pipeline has neither a StringIndexer nor an Imputer: no full-feature "
                         "baseline can be built")
    from sparkdeep.transformers.columns import ColumnRenamer
    front = [s for s in prepare_model.stages if isinstance(s, ColumnRenamer)] + list(indexers) + list(imputers)
    idx = [c for s in indexers for c in s.getOutputCols()]
    ohe = [f"{c}__ohe" for c in idx]
    if idx:
        if train is None:
            raise ValueError("an embedding prepare model needs the training rows to fit the baselines' one-hot encoder")
        front.append(OneHotEncoder(inputCols=idx, outputCols=ohe, dropLast=True).fit(
            PipelineModel(list(indexers)).transform(train)))
    imp = [c for s in imputers for c in s.getOutputCols()]
    front.append(WideAssembler(inputCols=imp + ohe, outputCol=ASSEMBLED, handleInvalid="error"))
    return PipelineModel(front)


#: The XGBoost settings a search may set (``xgboost_params``): numbers only, nothing that
#: names code or files (callbacks, an initial booster), which the saved model would carry.
XGBOOST_PARAMS = ("max_depth", "learning_rate", "n_estimators", "subsample", "colsample_bytree",
                  "min_child_weight", "reg_lambda")


def estimator(name: str, task: str, *, seed: int, trees: int = 50, depth: int = 6, max_iter: int = 100,
              workers: int = 1, xgboost_params: Mapping[str, float] | None = None):
    """The unfitted estimator ``name`` for ``task`` (see ``BASELINES``); ``workers``: XGBoost's
    barrier tasks (the others are MLlib's and use every partition); ``xgboost_params``:
    XGBoost's settings in place of the library's defaults (names from :data:`XGBOOST_PARAMS`)."""
    tasks.check_task(task)
    if name not in BASELINES[task]:
        raise ValueError(f"no baseline {name!r} for a {task} task; choose from {list(BASELINES[task])}")
    unknown = sorted(set(xgboost_params or {}) - set(XGBOOST_PARAMS))
    if unknown:
        raise ValueError(f"xgboost_params {unknown} are not settings a search may give XGBoost; "
                         f"known: {list(XGBOOST_PARAMS)}")
    if name == "xgboost":
        return _xgboost(task, seed=seed, workers=workers, params=xgboost_params or {})
    common = {"featuresCol": ASSEMBLED, "labelCol": LABEL}
    if task == "regression":
        from pyspark.ml import regression as R
        if name == "linear_regression":
            return R.LinearRegression(maxIter=max_iter, regParam=0.0, **common)
        if name == "gbt":
            return R.GBTRegressor(maxIter=trees, maxDepth=depth, seed=seed, **common)
        return R.RandomForestRegressor(numTrees=2 * trees, maxDepth=depth + 4, seed=seed, **common)
    from pyspark.ml import classification as C
    if name == "logistic_regression":
        return C.LogisticRegression(maxIter=max_iter, regParam=0.0, family="auto", **common)
    if name == "gbt":
        return C.GBTClassifier(maxIter=trees, maxDepth=depth, seed=seed, **common)
    return C.RandomForestClassifier(numTrees=2 * trees, maxDepth=depth + 4, seed=seed, **common)


def _xgboost(task: str, *, seed: int, workers: int, params: Mapping[str, float]):
    import logging

    from xgboost.spark import SparkXGBClassifier, SparkXGBRegressor
    # Its driver logger says INFO per fit and passes its level to the barrier tasks.
    logging.getLogger("XGBoost-PySpark").setLevel(logging.WARNING)
    cls = SparkXGBRegressor if task == "regression" else SparkXGBClassifier
    # verbose=False: no training-set evaluation printed (and computed) every round.
    return cls(features_col=ASSEMBLED, label_col=LABEL, num_workers=max(1, int(workers)), random_state=seed,
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
def assembled_rows(train: DataFrame, prepare_model: PipelineModel) -> Iterator[tuple[PipelineModel, DataFrame]]:
    """(the fitted front, every row of ``train`` as ``assembled`` + ``label``), the rows
    cached while inside: the encoding is done once for every candidate (and a search)."""
    with wide_plans(train.sparkSession):  # MLlib's per-column stages plan in linear time at width
        front = assembly_front(prepare_model, train)
        assembled = front.transform(train).select(ASSEMBLED, LABEL).cache()
    try:
        assembled.count()  # the encoding is shared by the candidates, not timed against one
        yield front, assembled
    finally:
        assembled.unpersist()


def fit_pipeline(train: DataFrame, prepare_model: PipelineModel, task: str, *, seed: int,
                 names: tuple[str, ...] | None = None, trees: int = 50, depth: int = 6,
                 max_iter: int = 100, workers: int = 1,
                 xgboost_params: Mapping[str, float] | None = None) -> tuple[PipelineModel, dict[str, float]]:
    """Every baseline in one ``PipelineModel`` (front + one model per name, each with its
    own output columns) fitted on every row of ``train``; and {name: fit seconds}.
    ``workers``: XGBoost's barrier tasks (the train step passes the network's rank count)."""
    names = names_for(task, names)
    with assembled_rows(train, prepare_model) as (front, assembled):
        return fit_assembled(front, assembled, task, seed=seed, names=names, trees=trees, depth=depth,
                             max_iter=max_iter, workers=workers, xgboost_params=xgboost_params)


def fit_assembled(front: PipelineModel, assembled: DataFrame, task: str, *, seed: int, names: tuple[str, ...],
                  trees: int = 50, depth: int = 6, max_iter: int = 100, workers: int = 1,
                  xgboost_params: Mapping[str, float] | None = None) -> tuple[PipelineModel, dict[str, float]]:
    """:func:`fit_pipeline` on rows :func:`assembled_rows` made (the train step searches
    XGBoost's settings on the same rows first)."""
    if "xgboost" in names and task == "multiclass":
        check_xgboost_classes(assembled)
    models, fit_s = [], {}
    for name in names:
        t0 = time.perf_counter()
        models.append(_outputs(estimator(name, task, seed=seed, trees=trees, depth=depth, max_iter=max_iter,
                                         workers=workers, xgboost_params=xgboost_params), name, task)
                      .fit(assembled))
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
