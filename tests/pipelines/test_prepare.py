import pytest
from pyspark.ml.linalg import VectorUDT

from sparkdeep.pipelines import flights as fl
from sparkdeep.pipelines import prepare as prep


@pytest.fixture(scope="module")
def sample(spark):
    raw = fl.load_raw(spark)
    usable, _, _ = fl.build_flights(raw, 15, sample_fraction=0.02, seed=3)
    return usable.cache()


def test_split_is_disjoint_complete_and_deterministic(sample):
    train, holdout = prep.split_train_holdout(sample, 0.25, seed=1)
    t = {r[0] for r in train.select(fl.KEY).collect()}
    h = {r[0] for r in holdout.select(fl.KEY).collect()}
    assert not t & h and len(t) + len(h) == sample.count()
    assert 0.2 < len(h) / sample.count() < 0.3
    again = {r[0] for r in prep.split_train_holdout(sample.repartition(5), 0.25, seed=1)[1].select(fl.KEY).collect()}
    assert again == h


def test_prepare_pipeline_reduces_to_k_features_and_keeps_holdout_rows(sample):
    train, holdout = prep.split_train_holdout(sample, 0.25, seed=1)
    model = prep.build_prepare_pipeline(majority_ratio=1.0, selector_top_fraction=0.5, pca_k=5, seed=1).fit(train)
    prepared = prep.prepared_training_data(model, train)
    assert isinstance(prepared.schema[prep.FEATURES].dataType, VectorUDT)
    assert len(prepared.first()[prep.FEATURES]) == 5
    counts = {r["label"]: r["count"] for r in prepared.groupBy("label").count().collect()}
    assert abs(counts[0] - counts[1]) / counts[1] < 0.2  # rebalanced to about 1:1
    assert model.transform(holdout).count() == holdout.count()  # scoring drops nothing
    report = prep.prepare_report(model)
    assert report["pca_k"] == 5 and 0 < report["pca_explained_variance_total"] <= 1
    assert report["sampler"]["rows_out"] == prepared.count()


def test_report_names_selected_features_and_pca_variance(sample):
    train, _ = prep.split_train_holdout(sample, 0.25, seed=1)
    model = prep.build_prepare_pipeline(majority_ratio=1.0, selector_top_fraction=0.5, pca_k=0,
                                        pca_variance_target=0.8, seed=1).fit(train)
    report = prep.prepare_report(model)
    stages = [s["stage"] for s in report["selection"]]
    assert stages == ["VarianceSelectorModel", "UnivariateSelectorModel", "CorrelationSelectorModel"]
    names = report["selected_features"]
    assert names and all(isinstance(n, str) and "[" not in n for n in names)
    assert any(n.startswith("carrier__ohe") or n.endswith("__imp") for n in names)
    assert report["pca_explained_variance_total"] >= 0.8


def test_sample_ignores_a_column_added_to_the_source(sample):
    from pyspark.sql import functions as F
    train, _ = prep.split_train_holdout(sample, 0.25, seed=1)
    sampler = prep.build_prepare_pipeline(majority_ratio=1.0, selector_top_fraction=0.5, pca_k=5,
                                          seed=1).getStages()[0]
    kept = {r[0] for r in sampler.fit(train).sample(train).select(fl.KEY).collect()}
    wider = train.withColumn("added_later", F.lit("x"))
    again = {r[0] for r in sampler.fit(wider).sample(wider).select(fl.KEY).collect()}
    assert kept == again and 0 < len(kept) < train.count()
