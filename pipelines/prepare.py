"""The reduction pipeline: rebalance, encode, impute, assemble, select, scale, project.

One MLlib :class:`~pyspark.ml.Pipeline` whose fitted model is the front half of the
saved scoring pipeline. Fitting it on the training table fits every stage after the
sampler on the rebalanced sample; the fitted model passes every row through the sampler
when it scores. It reads the ingested table's own shape: string columns are categorical,
double columns numeric, ``label`` the label; the task decides rebalancing (classification
only) and the univariate test (ANOVA F for classes, F-regression for a number).
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

LABEL = "label"
WEIGHT = "sample_weight"
FEATURES = "features"


def feature_columns(df: DataFrame, key: str) -> tuple[list[str], list[str]]:
    """(categorical, numeric) of an ingested table: its string and double columns."""
    from pyspark.sql import types as T
    cat = [f.name for f in df.schema.fields if f.name not in (key, LABEL) and isinstance(f.dataType, T.StringType)]
    num = [f.name for f in df.schema.fields if f.name not in (key, LABEL) and isinstance(f.dataType, T.DoubleType)]
    return cat, num


def build_prepare_pipeline(*, task: str, categorical, numeric, key: str, majority_ratio: float,
                           selector_top_fraction: float, pca_k: int, seed: int, max_correlation: float = 0.95,
                           pca_variance_target: float = 0.9, label: str = LABEL) -> Pipeline:
    """``pca_k=0`` lets PCA choose the smallest k reaching ``pca_variance_target``. The
    sampler decides membership by the row ``key`` alone, so a column added to the source
    later does not change the sample."""
    categorical, numeric = list(categorical), list(numeric)
    idx = [f"{c}__idx" for c in categorical]
    ohe = [f"{c}__ohe" for c in categorical]
    imp = [f"{c}__imp" for c in numeric]
    classify = task != "regression"
    stages = []
    if classify:
        stages.append(ClassBalanceSampler(labelCol=label, weightCol=WEIGHT, majorityRatio=majority_ratio,
                                          seed=seed, keyCols=[key]))
    if categorical:
        # 'keep': unseen categories and nulls get their own index instead of failing scoring.
        stages += [StringIndexer(inputCols=categorical, outputCols=idx, handleInvalid="keep",
                                 stringOrderType="frequencyDesc"),
                   OneHotEncoder(inputCols=idx, outputCols=ohe, dropLast=True)]
    if numeric:
        stages.append(Imputer(inputCols=numeric, outputCols=imp, strategy="median"))
    stages += [
        VectorAssembler(inputCols=imp + ohe, outputCol="assembled", handleInvalid="error"),
        VarianceSelector(featuresCol="assembled", outputCol="varying", varianceThreshold=0.0),
        UnivariateSelector(featuresCol="varying", outputCol="informative", labelCol=label,
                           featureType="continuous", labelType="categorical" if classify else "continuous",
                           selectionMode="percentile", selectionThreshold=selector_top_fraction),
        CorrelationSelector(featuresCol="informative", outputCol="selected", labelCol=label,
                            maxCorrelation=max_correlation),
        # pca_k is a maximum: a table with fewer features after selection keeps them all.
        CenteredPCA(inputCol="selected", outputCol=FEATURES, k=pca_k, varianceTarget=pca_variance_target,
                    scale=True, kAtMost=True),
    ]
    return Pipeline(stages=stages)


def sampler_of(model: PipelineModel) -> ClassBalanceSamplerModel | None:
    """The fitted class-balance sampler (None for regression, which is not rebalanced)."""
    for stage in model.stages:
        if isinstance(stage, ClassBalanceSamplerModel):
            return stage
    return None


def prepared_training_data(model: PipelineModel, train: DataFrame, key: str) -> DataFrame:
    """The rebalanced, weighted training sample run through the fitted feature stages
    (regression: every row, weight 1)."""
    sampler = sampler_of(model)
    if sampler is None:
        return model.transform(train.withColumn(WEIGHT, F.lit(1.0))).select(key, FEATURES, LABEL, WEIGHT)
    rest = PipelineModel([s for s in model.stages if s is not sampler])
    return rest.transform(sampler.sample(train)).select(key, FEATURES, LABEL, WEIGHT)


def split_train_holdout(table: DataFrame, holdout_fraction: float, seed: int,
                        key: str) -> tuple[DataFrame, DataFrame]:
    """A deterministic split by a hash of the key: the same rows whatever the partitioning."""
    u = hash_uniform(F.xxhash64(F.lit(seed + 1), F.col(key)))
    return table.where(u >= holdout_fraction), table.where(u < holdout_fraction)


def prepare_report(model: PipelineModel, rows_train: int | None = None) -> dict:
    """What the reduction did: class counts, features kept by each selector (by name),
    PCA's explained variance."""
    sampler = sampler_of(model)
    summary = sampler.summary if sampler is not None else {
        "stage": None, "rows_in": rows_train, "rows_out": rows_train, "note": "regression: not rebalanced"}
    out: dict = {"sampler": summary, "selection": []}
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
