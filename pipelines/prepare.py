"""The reduction pipeline: rebalance, encode, impute, assemble, select, scale, project.

One MLlib :class:`~pyspark.ml.Pipeline` whose fitted model is the front half of the
saved scoring pipeline. Fitting it on the training table fits every stage after the
sampler on the rebalanced sample; the fitted model passes every row through the sampler
when it scores.
"""
from __future__ import annotations

from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import Imputer, OneHotEncoder, StringIndexer, VectorAssembler
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep.transformers.pca import CenteredPCA, CenteredPCAModel
from sparkdeep.transformers.sampling import ClassBalanceSampler, ClassBalanceSamplerModel, hash_uniform
from sparkdeep.transformers.selection import (CorrelationSelector, SelectorModel, UnivariateSelector,
                                              VarianceSelector)

from .flights import CATEGORICAL, KEY, LABEL, NUMERIC

WEIGHT = "sample_weight"
FEATURES = "features"


def build_prepare_pipeline(*, majority_ratio: float, selector_top_fraction: float, pca_k: int,
                           seed: int, max_correlation: float = 0.95, pca_variance_target: float = 0.9,
                           categorical=tuple(CATEGORICAL), numeric=tuple(NUMERIC),
                           label: str = LABEL, key: str = KEY) -> Pipeline:
    """``pca_k=0`` lets PCA choose the smallest k reaching ``pca_variance_target``. The
    sampler decides membership by the row ``key`` alone, so a column added to the source
    later does not change the sample."""
    idx = [f"{c}__idx" for c in categorical]
    ohe = [f"{c}__ohe" for c in categorical]
    imp = [f"{c}__imp" for c in numeric]
    stages = [
        ClassBalanceSampler(labelCol=label, weightCol=WEIGHT, majorityRatio=majority_ratio, seed=seed,
                            keyCols=[key]),
        # 'keep': unseen categories and nulls get their own index instead of failing scoring.
        StringIndexer(inputCols=list(categorical), outputCols=idx, handleInvalid="keep",
                      stringOrderType="frequencyDesc"),
        OneHotEncoder(inputCols=idx, outputCols=ohe, dropLast=True),
        Imputer(inputCols=list(numeric), outputCols=imp, strategy="median"),
        VectorAssembler(inputCols=imp + ohe, outputCol="assembled", handleInvalid="error"),
        VarianceSelector(featuresCol="assembled", outputCol="varying", varianceThreshold=0.0),
        UnivariateSelector(featuresCol="varying", outputCol="informative", labelCol=label,
                           featureType="continuous", labelType="categorical",
                           selectionMode="percentile", selectionThreshold=selector_top_fraction),
        CorrelationSelector(featuresCol="informative", outputCol="selected", labelCol=label,
                            maxCorrelation=max_correlation),
        CenteredPCA(inputCol="selected", outputCol=FEATURES, k=pca_k, varianceTarget=pca_variance_target,
                    scale=True),
    ]
    return Pipeline(stages=stages)


def sampler_of(model: PipelineModel) -> ClassBalanceSamplerModel:
    for stage in model.stages:
        if isinstance(stage, ClassBalanceSamplerModel):
            return stage
    raise ValueError("the prepare pipeline model has no ClassBalanceSamplerModel stage")


def prepared_training_data(model: PipelineModel, train: DataFrame) -> DataFrame:
    """The rebalanced, weighted training sample run through the fitted feature stages."""
    sampler = sampler_of(model)
    rest = PipelineModel([s for s in model.stages if s is not sampler])
    return rest.transform(sampler.sample(train)).select(KEY, FEATURES, LABEL, WEIGHT)


def split_train_holdout(flights: DataFrame, holdout_fraction: float, seed: int) -> tuple[DataFrame, DataFrame]:
    """A deterministic split by a hash of the key: the same rows whatever the partitioning."""
    u = hash_uniform(F.xxhash64(F.lit(seed + 1), F.col(KEY)))
    return flights.where(u >= holdout_fraction), flights.where(u < holdout_fraction)


def prepare_report(model: PipelineModel) -> dict:
    """What the reduction did: class counts, features kept by each selector (by name),
    PCA's explained variance."""
    out: dict = {"sampler": sampler_of(model).summary, "selection": []}
    for stage in model.stages:
        if isinstance(stage, SelectorModel):
            summary = stage.summary
            scores = stage.featureScores
            summary["scores"] = {n: scores[n] for n in summary["selected_names"]}
            out["selection"].append(summary)
        if isinstance(stage, CenteredPCAModel):
            out["pca"] = stage.summary
    if out["selection"]:
        out["selected_features"] = out["selection"][-1]["selected_names"]
    if "pca" in out:
        out["pca_k"] = out["pca"]["k"]
        out["pca_explained_variance"] = out["pca"]["explained_variance"]
        out["pca_explained_variance_total"] = out["pca"]["explained_variance_total"]
    return out
