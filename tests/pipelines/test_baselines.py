"""The full-feature baselines: every training row, every assembled feature, raw rows scored."""
import numpy as np
import pandas as pd
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.classification import LogisticRegressionModel
from pyspark.ml.feature import Bucketizer

from sparkdeep.pipelines import baselines as bl
from sparkdeep.pipelines import prepare as prep
from sparkdeep.transformers.sampling import ClassBalanceSamplerModel


def table(spark, task, n=400, seed=5):
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    score = x1 + (colour == "red") + 0.3 * rng.normal(size=n)
    if task == "binary":
        label = (score > 1.2).astype(float)  # about 1 in 4 positive: the sampler would drop rows
    elif task == "multiclass":
        label = np.digitize(score, [0.0, 1.0]).astype(float)
    else:
        label = 3 * score + 10
    pdf = pd.DataFrame({"id": np.arange(n), "colour": colour, "x1": x1, "x2": x2, "label": label})
    return spark.createDataFrame(pdf)


def fitted(spark, task, names=None):
    df = table(spark, task).cache()
    cat, num = prep.feature_columns(df, "id")
    model = prep.build_prepare_pipeline(task=task, categorical=cat, numeric=num, key="id", majority_ratio=1.0,
                                        selector_top_fraction=0.5, pca_k=1, seed=1).fit(df)
    return df, model, single_fits(df, model, task, names)


def single_fits(df, prepare_model, task, names=None):
    """{name: (front + that model alone, fit s)}: each baseline fitted on its own, the way a
    user would, to hold the combined pipeline of the train step against."""
    from pyspark.ml import PipelineModel
    front = bl.assembly_front(prepare_model, df)
    assembled = front.transform(df)
    out = {}
    for name in names or bl.BASELINES[task]:
        fit, fit_s = bl.fit_pipeline(df, prepare_model, task, seed=1, names=(name,), trees=5, depth=3)
        alone = bl.estimator(name, task, seed=1, trees=5, depth=3, **bl.features_for(name, assembled)).fit(assembled)
        out[name] = (PipelineModel(list(front.stages) + [alone]), fit_s[name], fit)
    return out


@pytest.fixture(scope="module")
def binary(spark):
    return fitted(spark, "binary")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_baselines_train_on_every_row_and_every_assembled_feature(binary):
    df, prepare_model, models = binary
    assert tuple(models) == bl.BASELINES["binary"]
    front = bl.assembly_front(prepare_model, df)
    assert not any(isinstance(s, ClassBalanceSamplerModel) for s in front.stages)
    first = front.transform(df).first()
    width = len(first[bl.ASSEMBLED])
    # x1, x2 and colour one-hot (3 values + the unseen/null index, last dropped): no selection, no PCA
    assert width == 2 + 3
    assert len(first[bl.INDEXED]) == 2 + 1  # the trees: x1, x2 and colour's index
    for name, (_, fit_s, combined) in models.items():
        last = combined.stages[-1]
        features = last.get_booster().num_features() if name == "xgboost" else last.numFeatures
        assert features == (3 if name in bl.TREES else width) and fit_s > 0, name
        if isinstance(last, LogisticRegressionModel):
            assert last.summary.predictions.count() == df.count()  # the whole table, not the sample


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_baselines_score_raw_rows_with_unseen_and_null_values(spark, binary):
    raw = spark.createDataFrame([(1000, "purple", 0.5, None, 1.0), (1001, None, None, 0.1, 0.0)],
                                "id long, colour string, x1 double, x2 double, label double")
    for name, (_, _, combined) in binary[2].items():
        rows = bl.model_frame(combined.transform(raw), name, "binary").select("id", "prediction", "probability").collect()
        assert [r["id"] for r in rows] == [1000, 1001], name
        assert all(r["prediction"] in (0.0, 1.0) and np.isfinite(r["probability"].toArray()).all()
                   for r in rows), name


def test_each_task_gets_mllibs_models_and_xgboost_for_it(spark):  # MLlib makes its JVM objects at once
    from pyspark.ml import classification as C
    from pyspark.ml import regression as R
    from xgboost.spark import SparkXGBClassifier, SparkXGBRegressor
    want = {"binary": (C.LogisticRegression, C.GBTClassifier, C.RandomForestClassifier, SparkXGBClassifier),
            "multiclass": (C.LogisticRegression, C.RandomForestClassifier, SparkXGBClassifier),
            "regression": (R.LinearRegression, R.GBTRegressor, R.RandomForestRegressor, SparkXGBRegressor)}
    for task, classes in want.items():
        made = [bl.estimator(name, task, seed=1, workers=2) for name in bl.BASELINES[task]]
        assert [type(m) for m in made] == list(classes), task
        assert all(m.getOrDefault("featuresCol") == bl.ASSEMBLED for m in made)
        xgb = made[-1]
        # the library's defaults, distributed over the given workers
        set_ = {p.name: v for p, v in xgb._paramMap.items()}
        assert set_ == {"featuresCol": bl.ASSEMBLED, "labelCol": "label", "num_workers": 2, "random_state": 1,
                        "verbose": False, "arbitrary_params_dict": {}}, task


def test_xgboost_refuses_a_multiclass_training_table_missing_a_class(spark):
    df = spark.createDataFrame([(float(c),) for c in (0, 0, 2, 2)], "label double")
    with pytest.raises(ValueError, match=r"xgboost baseline needs a training row of every class.*\[1\]"):
        bl.check_xgboost_classes(df)
    bl.check_xgboost_classes(spark.createDataFrame([(0.0,), (1.0,)], "label double"))


def test_a_baseline_the_task_lacks_is_named():
    with pytest.raises(ValueError, match="no baseline 'gbt' for a multiclass task"):
        bl.estimator("gbt", "multiclass", seed=1)
    with pytest.raises(ValueError, match="unknown task|task"):
        bl.estimator("gbt", "ranking", seed=1)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_one_saved_pipeline_holds_every_baseline_and_each_scores_like_its_own_fit(spark, task, tmp_path):
    """The train step's form: one PipelineModel, each model with its own output columns; the
    saved and reloaded pipeline names its baselines and gives each one's predictions."""
    from pyspark.ml import PipelineModel

    from sparkdeep.pipelines.evaluate import predictions_frame
    df, prepare_model, single = fitted(spark, task)
    combined, fit_s = bl.fit_pipeline(df, prepare_model, task, seed=1, trees=5, depth=3)
    assert list(fit_s) == list(bl.BASELINES[task]) and all(s > 0 for s in fit_s.values())
    combined.write().overwrite().save(str(tmp_path / "b"))
    loaded = PipelineModel.load(str(tmp_path / "b"))
    assert bl.names_in(loaded) == list(bl.BASELINES[task])
    scored = loaded.transform(df)
    classes = ["0", "1", "2"] if task == "multiclass" else None
    for name in bl.BASELINES[task]:
        got = predictions_frame(bl.model_frame(scored, name, task), name, key="id", task=task, classes=classes)
        want = predictions_frame(single[name][0].transform(df), name, key="id", task=task, classes=classes)
        assert sorted(got.collect()) == sorted(want.collect()), name
    with pytest.raises(ValueError, match="no baseline 'gbt' for a multiclass task"):
        bl.fit_pipeline(df, prepare_model, "multiclass", seed=1, names=("gbt",))


def test_the_console_table_lists_every_model_best_first_with_fit_times():
    from sparkdeep.pipelines.evaluate import metrics_table
    m = {"keras_horovod": {"auc": 0.70, "average_precision": 0.4, "accuracy": 0.6, "log_loss": 0.6, "rows": 10},
         "gbt": {"auc": 0.77, "average_precision": 0.5, "accuracy": 0.7, "log_loss": 0.5, "rows": 10}}
    text = metrics_table(m, {"keras_horovod": 30.0, "gbt": None}, "binary")
    lines = text.splitlines()
    assert "auc" in lines[0] and "fit s" in lines[0]
    assert lines[1].split()[0] == "gbt" and lines[1].split()[-2] == "-"
    assert lines[2].split()[0] == "keras_horovod" and lines[2].split()[-2] == "30.0"


# -- categories of many levels ----------------------------------------------------------

ITEM, USER = "item n.é", "user id"  # source names: ingest stores them as item_n_é, user_id


def many_levels(spark, n=20_000, seed=11):
    """(ingested training rows, their pandas frame): a 5,000-level item and a 600-level user
    (source names with a dot, a space and an accent), a 3-level colour and two numbers;
    the label leans on the item, so the trees have a reason to split on it."""
    rng = np.random.default_rng(seed)
    item = rng.integers(0, 5000, n)
    effect = rng.normal(size=5000)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    pdf = pd.DataFrame({"id": np.arange(n), "item_n_é": [f"film {v:04d} – ü" for v in item],
                        "user_id": [f"u{v}" for v in rng.integers(0, 600, n)],
                        "colour": rng.choice(["red", "green", "blue"], size=n), "x1": x1, "x2": x2,
                        "label": (x1 + 2 * effect[item] + 0.5 * rng.normal(size=n) > 0.5).astype(float)})
    return spark.createDataFrame(pdf), pdf


@pytest.fixture(scope="module")
def wide_categories(spark):
    import logging
    df, pdf = many_levels(spark)
    df = df.cache()
    model = prep.build_prepare_pipeline(task="binary", categorical=["item_n_é", "user_id", "colour"],
                                        numeric=["x1", "x2"], key="id", majority_ratio=0, selector_top_fraction=1.0,
                                        pca_k=0, seed=1, encoding="embedding", pca=False,
                                        originals={"item_n_é": ITEM, "user_id": USER}).fit(df)
    # caplog is per test; the fit is the module's, so its lines are kept here.
    logger, lines = logging.getLogger("sparkdeep"), []
    handler, level = logging.Handler(), logger.level
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        combined, fit_s = bl.fit_pipeline(df, model, "binary", seed=1, trees=5, depth=3)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    yield df, pdf, model, combined, fit_s, lines
    df.unpersist()


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_column_of_thousands_of_levels_is_capped_and_every_baseline_fits(wide_categories):
    df, pdf, _, combined, fit_s, lines = wide_categories
    assert bl.names_in(combined) == list(bl.BASELINES["binary"]) and all(s > 0 for s in fit_s.values())
    front = PipelineModel(combined.stages[:-len(fit_s)])
    levels = {ITEM: pdf["item_n_é"].nunique(), USER: pdf["user_id"].nunique()}
    assert levels[ITEM] > 4900 and levels[USER] == 600
    trees = bl.TREE_MAX_BINS - 1
    assert bl.capped_columns(front) == {c: {"levels": n, "one_hot": bl.MAX_LEVELS, "trees": trees}
                                        for c, n in levels.items()}
    for c, n in levels.items():
        assert (f"[train] baselines: column {c!r} has {n} levels; the one-hot encoding keeps the top "
                f"{bl.MAX_LEVELS} and the trees keep the top {trees}; the rest share one bucket with unseen and "
                "null values" in lines), lines
    assert not any("'colour'" in line for line in lines)  # 3 levels: not capped, not mentioned
    # One Bucketizer caps both columns for both encodings: the plan does not deepen with them.
    assert [len(s.getOutputCols()) for s in front.stages if isinstance(s, Bucketizer)] == [4]
    width = len(front.transform(df).first()[bl.ASSEMBLED])
    # x1, x2, then one-hot: item and user the top 255 + one shared bucket, colour 3 + unseen (last dropped)
    assert width == 2 + bl.MAX_LEVELS + bl.MAX_LEVELS + 3 <= 2 + 3 * bl.MAX_LEVELS
    models = dict(zip(bl.names_in(combined), combined.stages[-len(fit_s):]))
    assert models["logistic_regression"].numFeatures == width
    assert models["xgboost"].get_booster().num_features() == width


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_the_trees_split_the_categories_as_mllib_categorical_features(wide_categories):
    df, _, _, combined, fit_s, lines = wide_categories
    front = PipelineModel(combined.stages[:-len(fit_s)])
    attrs = front.transform(df).schema[bl.INDEXED].metadata["ml_attr"]["attrs"]
    # x1, x2 numeric; item, user (capped: 63 + the shared bucket) and colour (3 + unseen) nominal
    assert [a["idx"] for a in attrs["numeric"]] == [0, 1]
    assert [(a["idx"], len(a["vals"])) for a in attrs["nominal"]] == [(2, 64), (3, 64), (4, 4)]
    models = dict(zip(bl.names_in(combined), combined.stages[-len(fit_s):]))
    for name in bl.TREES:
        tree = models[name]
        assert tree.getFeaturesCol() == bl.INDEXED and tree.numFeatures == 5, name
        assert tree.getMaxBins() == bl.TREE_MAX_BINS == 64, name
        assert " in {" in tree.toDebugString, name  # MLlib's categorical split: a set of levels
    assert "[train] baselines: the trees split each categorical column as one feature of its categories " \
           "(maxBins 64)" in lines


@pytest.mark.slow  # its module fixture fits the baselines: left to make test
def test_capped_indices_are_the_most_frequent_levels_then_one_shared_bucket(wide_categories):
    """Against pandas: the top levels by training count (ties alphabetical, as StringIndexer's
    frequencyDesc) keep their rank, every other level shares the next index: 63 for the
    trees; 255 one-hot, where it is the dropped last column (no one in the item's block)."""
    df, pdf, _, combined, fit_s, _ = wide_categories
    front = PipelineModel(combined.stages[:-len(fit_s)])
    counts = pdf["item_n_é"].value_counts()
    rank = {v: i for i, v in enumerate(sorted(counts.index, key=lambda v: (-counts[v], v)))}
    got = front.transform(df).select("item_n_é", bl.ASSEMBLED, bl.INDEXED).toPandas()
    ranks = got["item_n_é"].map(rank)
    trees = bl.TREE_MAX_BINS - 1
    assert (got[bl.INDEXED].map(lambda v: v[2]) == ranks.clip(upper=trees)).all()
    block = got[bl.ASSEMBLED].map(lambda v: v.toArray()[2:2 + bl.MAX_LEVELS])  # after x1, x2
    one_hot = block.map(lambda b: int(b.argmax()) if b.any() else bl.MAX_LEVELS)
    assert (one_hot == ranks.clip(upper=bl.MAX_LEVELS)).all() and (ranks > bl.MAX_LEVELS).any()


@pytest.mark.slow  # its module fixture fits the baselines: left to make test
def test_raw_holdout_rows_score_with_rare_unseen_and_null_levels_alike(spark, wide_categories):
    """Rows under the source's names; a rare item, an unseen one and a null share a bucket, so
    every baseline scores them alike; a top item is its own category."""
    _, pdf, _, combined, _, _ = wide_categories
    counts = pdf["item_n_é"].value_counts()
    top, rare = counts.index[0], counts.index[-1]
    raw = spark.createDataFrame(
        [(i, item, "u1", "red", 0.3, None, 1.0) for i, item in
         enumerate([rare, "a film never seen", None, top])],
        f"id long, `{ITEM}` string, `{USER}` string, colour string, x1 double, x2 double, label double")
    scored = combined.transform(raw)
    for name in bl.BASELINES["binary"]:
        rows = bl.model_frame(scored, name, "binary").orderBy("id").select("prediction", "probability").collect()
        assert len(rows) == 4 and all(r["prediction"] in (0.0, 1.0) for r in rows), name
        p = [r["probability"].toArray() for r in rows]
        assert all(np.isfinite(x).all() for x in p), name
        np.testing.assert_allclose(p[1], p[0], err_msg=name)
        np.testing.assert_allclose(p[2], p[0], err_msg=name)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_the_capped_baselines_save_and_load_through_the_model_store(spark, wide_categories, tmp_path):
    from sparkdeep import model_store
    df, _, _, combined, _, _ = wide_categories
    combined.write().save(str(tmp_path / "baseline"))
    classes = [c for _, c in model_store.check(spark, str(tmp_path / "baseline"))]
    assert "org.apache.spark.ml.feature.Bucketizer" in classes
    loaded = model_store.load_pipeline(spark, str(tmp_path / "baseline"))
    rows = df.limit(200)
    cols = ["id"] + [n + bl.PROBABILITY for n in bl.BASELINES["binary"]]
    got = loaded.transform(rows).select(cols).orderBy("id").collect()
    want = combined.transform(rows).select(cols).orderBy("id").collect()
    for g, w in zip(got, want):
        for c in cols[1:]:
            np.testing.assert_allclose(g[c].toArray(), w[c].toArray(), rtol=1e-9, err_msg=c)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_onehot_prepare_model_gets_the_same_capped_front(spark, binary):
    """``prepare.encoding: onehot``: its own one-hot and assembler are not the baselines'; the
    front is built from its indexers and imputer as for an embedding model."""
    df, onehot, _ = binary
    embedding = prep.build_prepare_pipeline(task="binary", categorical=["colour"], numeric=["x1", "x2"], key="id",
                                            majority_ratio=1.0, selector_top_fraction=1.0, pca_k=0, seed=1,
                                            encoding="embedding", pca=False).fit(df)
    fronts = [bl.assembly_front(m, df, max_levels=2, max_bins=3) for m in (onehot, embedding)]
    kinds = [[type(s).__name__ for s in f.stages] for f in fronts]
    assert kinds[0] == kinds[1] and "Bucketizer" in kinds[0]
    for front in fronts:
        # the same cap for both encodings: one capped column they share
        assert [s.getOutputCols() for s in front.stages if type(s).__name__ == "Bucketizer"] == [["colour__idx__top2"]]
        assert bl.capped_columns(front) == {"colour": {"levels": 3, "one_hot": 2, "trees": 2}}
        scored = front.transform(df)
        assert len(scored.first()[bl.ASSEMBLED]) == 2 + 2  # x1, x2, colour's top 2 + the shared bucket (dropped)
        assert len(scored.schema[bl.INDEXED].metadata["ml_attr"]["attrs"]["nominal"][0]["vals"]) == 3
    # only the one-hot encoding capped: the trees see colour's 3 levels and the unseen bucket
    assert bl.capped_columns(bl.assembly_front(onehot, df, max_levels=2)) == {
        "colour": {"levels": 3, "one_hot": 2, "trees": 3}}
    combined, _ = bl.fit_pipeline(df, onehot, "binary", seed=1, trees=5, depth=3, max_levels=2, max_bins=3)
    assert bl.names_in(combined) == list(bl.BASELINES["binary"])


@pytest.mark.slow  # its module fixture fits the baselines: left to make test
def test_a_cap_below_one_level_of_its_own_is_refused(binary):
    df, model, _ = binary
    with pytest.raises(ValueError, match="max_levels must be at least 1 .*got max_levels 0, max_bins 64"):
        bl.assembly_front(model, df, max_levels=0)
    with pytest.raises(ValueError, match="max_bins at least 2 .*got max_levels 255, max_bins 1"):
        bl.assembly_front(model, df, max_bins=1)
