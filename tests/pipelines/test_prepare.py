import pytest
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import functions as F

from sparkdeep.dataset import load_spec
from sparkdeep.pipelines import ingest as ing
from sparkdeep.pipelines import prepare as prep

KEY = "flight_id"


@pytest.fixture(scope="module")
def sample(spark, repo_root):
    """2% of the default spec's usable rows, ingested as the ingest step does."""
    spec = load_spec("nycflights13", f"{repo_root}/conf")
    source = ing.read_source(spark, spec, None)
    categorical, numeric, _ = ing.resolve_features(spec, source)
    plan = ing.label_plan(spec, source, F.lit(True))
    classified = ing.classify_rows(spec, source, categorical, numeric, plan, sample_fraction=0.02, seed=3)
    usable, _ = ing.split_classified(classified, spec.key_column)
    assert spec.key_column == KEY
    return usable.cache()


def pipeline(sample, **kwargs):
    categorical, numeric = prep.feature_columns(sample, KEY)
    return prep.build_prepare_pipeline(task="binary", categorical=categorical, numeric=numeric, key=KEY,
                                       majority_ratio=1.0, selector_top_fraction=0.5, seed=1, **kwargs)


def test_split_is_disjoint_complete_and_deterministic(sample):
    train, holdout = prep.split_train_holdout(sample, 0.25, seed=1, key=KEY)
    t = {r[0] for r in train.select(KEY).collect()}
    h = {r[0] for r in holdout.select(KEY).collect()}
    assert not t & h and len(t) + len(h) == sample.count()
    assert 0.2 < len(h) / sample.count() < 0.3
    _, again = prep.split_train_holdout(sample.repartition(5), 0.25, seed=1, key=KEY)
    again = {r[0] for r in again.select(KEY).collect()}
    assert again == h


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_prepare_pipeline_reduces_to_k_features_and_keeps_holdout_rows(sample):
    train, holdout = prep.split_train_holdout(sample, 0.25, seed=1, key=KEY)
    model = pipeline(sample, pca_k=5).fit(train)
    prepared = prep.prepared_training_data(model, train, KEY)
    assert isinstance(prepared.schema[prep.FEATURES].dataType, VectorUDT)
    assert len(prepared.first()[prep.FEATURES]) == 5
    counts = {r["label"]: r["count"] for r in prepared.groupBy("label").count().collect()}
    assert abs(counts[0] - counts[1]) / counts[1] < 0.2  # rebalanced to about 1:1
    assert model.transform(holdout).count() == holdout.count()  # scoring drops nothing
    report = prep.prepare_report(model)
    assert report["pca_k"] == 5 and 0 < report["pca_explained_variance_total"] <= 1
    assert report["sampler"]["rows_out"] == prepared.count()


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_report_names_selected_features_and_pca_variance(sample):
    train, _ = prep.split_train_holdout(sample, 0.25, seed=1, key=KEY)
    model = pipeline(sample, pca_k=0, pca_variance_target=0.8).fit(train)
    report = prep.prepare_report(model)
    stages = [s["stage"] for s in report["selection"]]
    assert stages == ["VarianceSelectorModel", "UnivariateSelectorModel", "CorrelationSelectorModel"]
    names = report["selected_features"]
    assert names and all(isinstance(n, str) and "[" not in n for n in names)
    assert any(n.startswith("carrier__ohe") or n.endswith("__imp") for n in names)
    assert report["pca_explained_variance_total"] >= 0.8


def test_sample_ignores_a_column_added_to_the_source(sample):
    train, _ = prep.split_train_holdout(sample, 0.25, seed=1, key=KEY)
    from sparkdeep.transformers.sampling import ClassBalanceSampler
    sampler = next(s for s in pipeline(sample, pca_k=5).getStages() if isinstance(s, ClassBalanceSampler))
    kept = {r[0] for r in sampler.fit(train).sample(train).select(KEY).collect()}
    wider = train.withColumn("added_later", F.lit("x"))
    again = {r[0] for r in sampler.fit(wider).sample(wider).select(KEY).collect()}
    assert kept == again and 0 < len(kept) < train.count()


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_embedding_encoding_gives_standardised_numbers_then_category_indices(spark):
    """Issue 13: categories go to the network as indices (one per column), numbers as a
    standardised block; an unseen and a null category both get the column's extra index."""
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(4)
    n = 300
    pdf = pd.DataFrame({"id": np.arange(n), "colour": rng.choice(["red", "green", "blue"], n),
                        "size": rng.choice(["s", "m"], n), "x1": rng.normal(5, 3, n), "x2": rng.normal(size=n),
                        "label": rng.integers(0, 2, n).astype(float)})
    df = spark.createDataFrame(pdf)
    model = prep.build_prepare_pipeline(task="binary", categorical=["colour", "size"], numeric=["x1", "x2"],
                                        key="id", majority_ratio=1.0, selector_top_fraction=1.0, pca_k=0,
                                        max_correlation=1.0, seed=1, encoding="embedding", pca=False).fit(df)
    layout = prep.embedding_layout(model)
    assert layout == {"categorical": ["colour", "size"], "cardinalities": [4, 3]}
    prepared = prep.prepared_training_data(model, df, "id")
    x = np.array([r[0].toArray() for r in prepared.select(prep.FEATURES).collect()])
    assert x.shape[1] == 2 + 2
    np.testing.assert_allclose(x[:, :2].mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(x[:, :2].std(axis=0, ddof=1), 1, atol=1e-9)
    assert set(x[:, 2]) == {0.0, 1.0, 2.0} and set(x[:, 3]) == {0.0, 1.0}

    # Scoring rows with an unseen value, a null and a null number: kept, extra index, imputed.
    new = spark.createDataFrame([(1000, "purple", "s", 1.0, 0.0, 0.0), (1001, None, None, None, 0.0, 1.0)],
                                "id long, colour string, size string, x1 double, x2 double, label double")
    rows = {r["id"]: r[prep.FEATURES].toArray() for r in model.transform(new).collect()}
    assert rows[1000][2] == 3.0 and rows[1001][2] == 3.0 and rows[1001][3] == 2.0
    assert np.isfinite(rows[1001]).all()
    # Quantile bins of each number: one more embedded index per numeric column.
    binned = prep.build_prepare_pipeline(task="binary", categorical=["colour", "size"], numeric=["x1", "x2"],
                                         key="id", majority_ratio=1.0, selector_top_fraction=1.0, pca_k=0,
                                         max_correlation=1.0, seed=1, encoding="embedding", pca=False,
                                         numeric_buckets=4).fit(df)
    layout = prep.network_layout(binned, prep.prepared_training_data(binned, df, "id"))
    assert layout == {"categorical": ["colour", "size", "x1 (bins)", "x2 (bins)"],
                      "cardinalities": [4, 3, 5, 5], "numeric_dim": 2}
    b = np.array([r[0].toArray() for r in binned.transform(df).select(prep.FEATURES).collect()])
    assert b.shape[1] == 2 + 2 + 2 and set(b[:, 4]) == {0.0, 1.0, 2.0, 3.0}
    assert np.corrcoef(b[:, 4], pdf["x1"])[0, 1] > 0.9  # the bins follow the number
    # The one-hot encoding has no such layout.
    onehot = prep.build_prepare_pipeline(task="binary", categorical=["colour"], numeric=["x1"], key="id",
                                         majority_ratio=1.0, selector_top_fraction=1.0, pca_k=1, seed=1).fit(df)
    assert prep.embedding_layout(onehot) is None


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_levels_seen_fewer_than_min_count_times_share_the_unseen_index(spark, tmp_path):
    """An ID column where level k is seen k times (k = 1..20) and a second column with two
    frequent levels and three seen once: at min_count 5 the first keeps 16 levels (5..20),
    the second 2; rare levels, unseen ones and nulls all get the column's last index, in
    the prepared rows and after a save and load."""
    import numpy as np
    from pyspark.ml import PipelineModel
    rows = []
    for k in range(1, 21):
        rows += [(f"id{k}", "a" if j % 2 else "b") for j in range(k)]
    rows[0], rows[1], rows[2] = (rows[0][0], "r1"), (rows[1][0], "r2"), (rows[2][0], "r3")
    df = spark.createDataFrame([(i, user, kind, float(i % 3), float(i % 2)) for i, (user, kind) in enumerate(rows)],
                               "id long, user string, kind string, x1 double, label double")
    model = prep.build_prepare_pipeline(task="binary", categorical=["user", "kind"], numeric=["x1"], key="id",
                                        majority_ratio=0.0, selector_top_fraction=1.0, pca_k=0, max_correlation=1.0,
                                        seed=1, encoding="embedding", pca=False).fit(df)
    same, none = prep.drop_rare_levels(model, df, 1)
    assert same is model and none == {}
    trimmed, dropped = prep.drop_rare_levels(model, df, 5)
    assert dropped == {"user": 4, "kind": 3}
    assert prep.embedding_layout(trimmed)["cardinalities"] == [16 + 1, 2 + 1]
    trimmed.write().save(str(tmp_path / "m"))
    loaded = PipelineModel.load(str(tmp_path / "m"))
    new = spark.createDataFrame([(900, "id1", "r1", 0.0, 0.0), (901, "id20", "a", 0.0, 0.0),
                                 (902, None, "zzz", 0.0, 0.0)], "id long, user string, kind string, x1 double, label double")
    for m in (trimmed, loaded):
        got = {r["id"]: r[prep.FEATURES].toArray()[-2:] for r in m.transform(new).collect()}
        assert got[900].tolist() == [16.0, 2.0]       # rare: the unseen/null index of each column
        assert got[901][0] == 0.0 and got[901][1] in (0.0, 1.0)  # the most frequent ID keeps index 0
        assert got[902].tolist() == [16.0, 2.0]       # null and unseen: the same index
    indexed = np.array([r[prep.FEATURES].toArray()[-2] for r in prep.prepared_training_data(trimmed, df, "id")
                        .select(prep.FEATURES).collect()])
    assert (indexed == 16.0).sum() == 1 + 2 + 3 + 4   # the rows of id1..id4


def test_the_baselines_get_one_hot_features_from_an_embedding_prepare_model(spark):
    import numpy as np
    import pandas as pd

    from sparkdeep.pipelines import baselines as bl
    rng = np.random.default_rng(5)
    pdf = pd.DataFrame({"id": np.arange(200), "colour": rng.choice(["red", "green", "blue"], 200),
                        "x1": rng.normal(size=200), "label": rng.integers(0, 2, 200).astype(float)})
    df = spark.createDataFrame(pdf)
    model = prep.build_prepare_pipeline(task="binary", categorical=["colour"], numeric=["x1"], key="id",
                                        majority_ratio=1.0, selector_top_fraction=1.0, pca_k=0, seed=1,
                                        encoding="embedding", pca=False).fit(df)
    front = bl.assembly_front(model, df)
    assembled = front.transform(df).select(bl.ASSEMBLED).first()[0]
    assert assembled.size == 1 + 3  # x1, then colour one-hot: 3 values + the unseen/null bucket, last dropped
