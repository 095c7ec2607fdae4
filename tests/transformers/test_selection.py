import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.feature import UnivariateFeatureSelector, VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.testing import assertDataFrameEqual

from sparkdeep.transformers._vectors import feature_names
from sparkdeep.transformers.selection import (CorrelationSelector, MissingRateSelector, ModelImportanceSelector,
                                              UnivariateSelector, VarianceSelector)

from ._roundtrip import transform_in_new_process


def assembled(spark, x, y, names):
    rows = [(i, float(t), *map(float, r)) for i, (r, t) in enumerate(zip(x, y))]
    df = spark.createDataFrame(rows, ["id", "label"] + names)
    return VectorAssembler(inputCols=names, outputCol="features", handleInvalid="keep").transform(df) \
        .select("id", "label", "features").cache()


@pytest.fixture(scope="module")
def cancer(spark):
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    names = [n.replace(" ", "_") for n in d.feature_names]
    return assembled(spark, d.data, d.target, names), d.data, d.target, names


@pytest.fixture(scope="module")
def digits(spark):
    from sklearn.datasets import load_digits
    d = load_digits()
    names = [f"px{i}" for i in range(64)]
    return assembled(spark, d.data, d.target, names), d.data, d.target, names


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_variance_selector_matches_numpy_and_keeps_names(digits, tmp_path):
    df, x, _, names = digits
    model = VarianceSelector(varianceThreshold=1.0).fit(df)
    expected = np.flatnonzero(np.var(x, axis=0, ddof=1) > 1.0)
    assert model.selected == expected.tolist()
    scores = model.featureScores
    np.testing.assert_allclose([scores[n] for n in names], np.var(x, axis=0, ddof=1), rtol=1e-9)
    out = model.transform(df)
    assert feature_names(out.schema, "selected") == [names[i] for i in expected]
    again = transform_in_new_process(model, df, tmp_path, ["id", "selected"])
    assertDataFrameEqual(again, out.select("id", "selected"))


def test_constant_features_are_dropped_at_threshold_zero(digits):
    df, x, _, names = digits
    model = VarianceSelector().fit(df)
    constant = {names[i] for i in np.flatnonzero(np.var(x, axis=0) == 0)}
    assert constant and not constant & set(model.selectedFeatureNames)


def test_univariate_anova_equals_sklearn_f_classif_and_mllib_selection(cancer):
    from sklearn.feature_selection import f_classif
    df, x, y, names = cancer
    model = UnivariateSelector(selectionMode="numTopFeatures", selectionThreshold=7).fit(df)
    f, p = f_classif(x, y)
    scores = model.featureScores
    np.testing.assert_allclose([scores[n] for n in names], f, rtol=1e-6)
    # Strong features' p-values underflow to 0; ties go to the larger F (MLlib keeps index
    # order), so top-k equals scikit-learn's SelectKBest on F.
    from sklearn.feature_selection import SelectKBest, SelectPercentile
    assert model.selected == np.flatnonzero(SelectKBest(f_classif, k=7).fit(x, y).get_support()).tolist()
    pct = UnivariateSelector(selectionMode="percentile", selectionThreshold=0.3).fit(df).selected
    assert pct == np.flatnonzero(SelectPercentile(f_classif, percentile=30).fit(x, y).get_support()).tolist()
    # Threshold modes do not depend on ties: they equal MLlib's own selector.
    for mode, threshold in (("fpr", 1e-10), ("fdr", 1e-10), ("fwe", 1e-10)):
        ours = UnivariateSelector(selectionMode=mode, selectionThreshold=threshold).fit(df).selected
        ref = UnivariateFeatureSelector(featuresCol="features", labelCol="label", selectionMode=mode) \
            .setFeatureType("continuous").setLabelType("categorical").setSelectionThreshold(threshold).fit(df)
        assert ours == sorted(ref.selectedFeatures), mode


def test_univariate_f_regression_equals_sklearn(cancer):
    from sklearn.feature_selection import f_regression
    df, x, _, names = cancer
    target = x[:, 0] * 2 + np.arange(len(x)) % 7
    reg = df.sparkSession.createDataFrame([(i, float(t)) for i, t in enumerate(target)], "id long, y double")
    model = UnivariateSelector(labelCol="y", featureType="continuous", labelType="continuous",
                               selectionThreshold=5).fit(df.join(reg, "id"))
    f, _ = f_regression(x, target)
    np.testing.assert_allclose([model.featureScores[n] for n in names], f, rtol=1e-6)


def test_univariate_chi2_equals_contingency_chi2(digits):
    """Spark's chi-squared test is Pearson's test of independence on each feature's
    contingency table: scipy's chi2_contingency is its independent reference (sklearn's
    chi2 is a different statistic over feature frequencies)."""
    from scipy.stats import chi2_contingency
    df, x, y, names = digits
    model = UnivariateSelector(featureType="categorical", labelType="categorical",
                               selectionMode="numTopFeatures", selectionThreshold=10).fit(df)
    for j in (5, 20, 42):
        values, labels = np.unique(x[:, j]), np.unique(y)
        table = np.array([[np.sum((x[:, j] == v) & (y == c)) for c in labels] for v in values])
        stat = chi2_contingency(table, correction=False)[0] if len(values) > 1 else 0.0
        assert model.featureScores[names[j]] == pytest.approx(stat, rel=1e-6)


def test_correlation_selector_matches_numpy_and_keeps_label_related_feature(spark, cancer):
    df, x, y, names = cancer
    from sparkdeep.transformers.selection import correlation_with_label
    corr = correlation_with_label(df, "features", "label", x.shape[1])
    np.testing.assert_allclose(corr, np.corrcoef(np.column_stack([x, y]), rowvar=False), atol=1e-9)
    model = CorrelationSelector(maxCorrelation=0.9).fit(df)
    # Of mean_radius / mean_perimeter (r ~ 0.998) at most one survives.
    assert len(set(model.selectedFeatureNames) & {"mean_radius", "mean_perimeter"}) <= 1
    # Controlled case: b duplicates a up to noise, and b is the one the label follows.
    rng = np.random.default_rng(0)
    a = rng.normal(size=400)
    b = a + 0.05 * rng.normal(size=400)
    c = rng.normal(size=400)
    label = (b + 0.5 * rng.normal(size=400) > 0).astype(float)
    syn = assembled(spark, np.column_stack([a, b, c]), label, ["a", "b", "c"])
    corr_l = [abs(np.corrcoef(v, label)[0, 1]) for v in (a, b)]
    kept = CorrelationSelector(maxCorrelation=0.9).fit(syn).selectedFeatureNames
    assert kept == (["b", "c"] if corr_l[1] > corr_l[0] else ["a", "c"])
    sub = corr[np.ix_(model.selected, model.selected)]
    assert np.all(np.abs(sub[np.triu_indices(len(model.selected), 1)]) <= 0.9)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_model_importance_selectors(cancer, tmp_path):
    df, _, _, names = cancer
    rf = ModelImportanceSelector(method="randomForest", numTopFeatures=5, seed=3).fit(df)
    assert len(rf.selected) == 5 and sum(v for v in rf.featureScores.values()) == pytest.approx(1.0)
    top = sorted(rf.featureScores, key=rf.featureScores.get, reverse=True)[:5]
    assert set(top) == set(rf.selectedFeatureNames)
    from pyspark.ml.feature import StandardScaler
    scaled = StandardScaler(inputCol="features", outputCol="z").fit(df).transform(df).drop("features") \
        .withColumnRenamed("z", "features")
    l1 = ModelImportanceSelector(method="l1", numTopFeatures=4, regParam=0.05).fit(scaled)
    assert len(l1.selected) == 4
    again = transform_in_new_process(rf, df, tmp_path, ["id", "selected"])
    assertDataFrameEqual(again, rf.transform(df).select("id", "selected"))


def test_missing_rate_selector_counts_nan(spark):
    rows = [(Vectors.dense([float("nan") if i % 2 else 1.0, float("nan") if i % 10 == 0 else 2.0, 3.0]),)
            for i in range(100)]
    df = spark.createDataFrame(rows, ["features"])
    model = MissingRateSelector(maxMissingRate=0.2).fit(df)
    assert model.selected == [1, 2]
    rates = list(model.featureScores.values())
    assert rates == pytest.approx([0.5, 0.1, 0.0])


def test_bad_input_is_named_or_skipped_and_counted(spark, cancer):
    df, *_ = cancer
    bad = spark.createDataFrame([(Vectors.dense([1.0, float("inf")]), 1.0), (Vectors.dense([2.0, 3.0]), 0.0),
                                 (Vectors.dense([float("nan"), 1.0]), 1.0), (Vectors.dense([4.0, 5.0]), 0.0),
                                 (Vectors.dense([5.0, 1.0]), 1.0)], ["features", "label"])
    with pytest.raises(ValueError, match=r"featuresCol 'features' has 2 rows with null, NaN or infinite"):
        VarianceSelector().fit(bad)
    assert VarianceSelector(handleInvalid="skip").fit(bad).getOrDefault("skippedRows") == 2
    with pytest.raises(ValueError, match="featuresCol 'nope' is not a column"):
        VarianceSelector(featuresCol="nope").fit(df)
    with pytest.raises(TypeError, match="featuresCol 'label' must be a vector"):
        VarianceSelector(featuresCol="label").fit(df)
    with pytest.raises(ValueError, match="outputCol 'label' already exists"):
        VarianceSelector(outputCol="label").fit(df)
    with pytest.raises(ValueError, match=r"numTopFeatures\) = 99 is larger than the 30 features"):
        UnivariateSelector(selectionThreshold=99).fit(df)
    with pytest.raises(ValueError, match="numTopFeatures=40 must be between 1 and the 30"):
        ModelImportanceSelector(numTopFeatures=40).fit(df)
    const = spark.createDataFrame([(Vectors.dense([1.0, float(i)]), float(i % 2)) for i in range(10)],
                                  ["features", "label"])
    with pytest.raises(ValueError, match=r"constant features \['features\[0\]'\]"):
        CorrelationSelector().fit(const)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_stages_work_in_pipeline_crossvalidator_and_trainvalidationsplit(cancer):
    df, *_ = cancer
    from sparkdeep.transformers.pca import CenteredPCA
    from sparkdeep.transformers.sampling import ClassBalanceSampler, SamplingPipeline
    pca = CenteredPCA(inputCol="selected", outputCol="pcs", k=3, scale=True)
    # SamplingPipeline: the later stages fit on the sampler's sample, inside each fold too.
    pipe = SamplingPipeline(stages=[ClassBalanceSampler(labelCol="label", seed=1), VarianceSelector(),
                                    CorrelationSelector(maxCorrelation=0.95, outputCol="decorrelated")
                                    .setFeaturesCol("selected"),
                                    UnivariateSelector(selectionThreshold=8).setFeaturesCol("decorrelated"),
                                    pca, LogisticRegression(featuresCol="pcs", labelCol="label",
                                                            weightCol="sample_weight")])
    # UnivariateSelector reads "decorrelated" and writes the default "selected": rename clash avoided
    pipe.getStages()[1].setOutputCol("var_selected")
    pipe.getStages()[2].setFeaturesCol("var_selected")
    grid = ParamGridBuilder().addGrid(pca.k, [2, 4]).build()
    evaluator = BinaryClassificationEvaluator(labelCol="label")
    cv = CrossValidator(estimator=pipe, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2, seed=1).fit(df)
    assert max(cv.avgMetrics) > 0.9
    tvs = TrainValidationSplit(estimator=pipe, estimatorParamMaps=grid, evaluator=evaluator, seed=1).fit(df)
    assert tvs.bestModel.transform(df).count() == df.count()


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_remaining_stages_round_trip_in_new_process(cancer, tmp_path):
    """Univariate, correlation and missing-rate selectors and the uniform and stratified
    samplers, chained in one PipelineModel, reload in a fresh process with identical output."""
    from pyspark.ml import PipelineModel
    from sparkdeep.transformers.sampling import StratifiedSampler, UniformSampler
    df, *_ = cancer
    stages = Pipeline(stages=[
        UniformSampler(targetCount=400, seed=1),
        StratifiedSampler(stratumCol="label", fractions={"0.0": 0.5, "1.0": 0.5}),
        MissingRateSelector(outputCol="complete"),
        UnivariateSelector(featuresCol="complete", outputCol="informative", selectionThreshold=12),
        CorrelationSelector(featuresCol="informative", outputCol="selected", maxCorrelation=0.9),
    ]).fit(df).stages
    chained = PipelineModel(stages)
    path = str(tmp_path / "chain")
    chained.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert [type(s).__name__ for s in loaded.stages] == [type(s).__name__ for s in stages]
    assert loaded.stages[1].summary == stages[1].summary
    assert loaded.stages[4].selectedFeatureNames == stages[4].selectedFeatureNames
    expected = chained.transform(df).select("id", "selected")
    assert expected.count() == df.count()  # the samplers pass every row through when scoring
    from ._roundtrip import transform_in_new_process
    # transform_in_new_process wraps one stage; wrap the whole chain as that stage.
    again = transform_in_new_process(chained, df, tmp_path, ["id", "selected"])
    assertDataFrameEqual(again, expected)
