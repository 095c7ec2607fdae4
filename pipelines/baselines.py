"""What a user would try instead: MLlib's usual strongest models on the *full* features.

The deep pipeline trains on reduced features (rebalanced sample, selected columns, PCA).
A fair comparison fits MLlib's models on every assembled feature of the whole training
table: the prepare pipeline's fitted encoding front (string indexers, one-hot encoders,
imputer, assembler), without the sampler, the selectors or PCA. Each baseline is a whole
``PipelineModel`` (that front + the model), so it scores raw holdout rows like the deep one.

Candidates per task (``BASELINES``):

- binary: logistic regression, gradient-boosted trees, random forest;
- multiclass: multinomial logistic regression, random forest (MLlib's GBT is binary only);
- regression: linear regression, gradient-boosted trees, random forest.
"""
from __future__ import annotations

import time

from pyspark.ml import PipelineModel
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import DataFrame

from sparkdeep import tasks

from .prepare import LABEL

ASSEMBLED = "assembled"
BASELINES = {
    "binary": ("logistic_regression", "gbt", "random_forest"),
    "multiclass": ("logistic_regression", "random_forest"),
    "regression": ("linear_regression", "gbt", "random_forest"),
}


def assembly_front(prepare_model: PipelineModel) -> PipelineModel:
    """The fitted stages of ``prepare_model`` up to its ``VectorAssembler`` (output
    ``assembled``), minus the class-balance sampler: every row, every feature."""
    from sparkdeep.transformers.sampling import ClassBalanceSamplerModel
    stages = []
    for stage in prepare_model.stages:
        if isinstance(stage, ClassBalanceSamplerModel):
            continue
        stages.append(stage)
        if isinstance(stage, VectorAssembler):
            if stage.getOutputCol() != ASSEMBLED:
                raise ValueError(f"the prepare pipeline's assembler writes {stage.getOutputCol()!r}, "
                                 f"expected {ASSEMBLED!r}")
            return PipelineModel(stages)
    raise ValueError("the prepare pipeline has no VectorAssembler: no full-feature baseline can be built")


def estimator(name: str, task: str, *, seed: int, trees: int = 50, depth: int = 6):
    """The unfitted MLlib estimator ``name`` for ``task`` (see ``BASELINES``)."""
    tasks.check_task(task)
    if name not in BASELINES[task]:
        raise ValueError(f"no baseline {name!r} for a {task} task; choose from {list(BASELINES[task])}")
    common = {"featuresCol": ASSEMBLED, "labelCol": LABEL}
    if task == "regression":
        from pyspark.ml import regression as R
        if name == "linear_regression":
            return R.LinearRegression(maxIter=100, regParam=0.0, **common)
        if name == "gbt":
            return R.GBTRegressor(maxIter=trees, maxDepth=depth, seed=seed, **common)
        return R.RandomForestRegressor(numTrees=2 * trees, maxDepth=depth + 4, seed=seed, **common)
    from pyspark.ml import classification as C
    if name == "logistic_regression":
        return C.LogisticRegression(maxIter=100, regParam=0.0, family="auto", **common)
    if name == "gbt":
        return C.GBTClassifier(maxIter=trees, maxDepth=depth, seed=seed, **common)
    return C.RandomForestClassifier(numTrees=2 * trees, maxDepth=depth + 4, seed=seed, **common)


def fit_baselines(train: DataFrame, prepare_model: PipelineModel, task: str, *, seed: int,
                  names: tuple[str, ...] | None = None, trees: int = 50,
                  depth: int = 6) -> dict[str, tuple[PipelineModel, float]]:
    """{name: (front + fitted model as one PipelineModel, fit seconds)} on every row of
    ``train`` (the training table as ingested, not the rebalanced sample)."""
    names = tuple(names) if names else BASELINES[task]
    front = assembly_front(prepare_model)
    assembled = front.transform(train).select(ASSEMBLED, LABEL).cache()
    try:
        assembled.count()  # the encoding is shared by the candidates, not timed against one
        out = {}
        for name in names:
            t0 = time.perf_counter()
            model = estimator(name, task, seed=seed, trees=trees, depth=depth).fit(assembled)
            out[name] = (PipelineModel(list(front.stages) + [model]), time.perf_counter() - t0)
        return out
    finally:
        assembled.unpersist()
