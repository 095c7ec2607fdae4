"""A split, a sample or a validation set is a sample of rows: identical rows are separate rows.

The table: 20 distinct feature rows, each repeated 10,000 times, each copy's label drawn
from that row's own probability, so the same (features, label) pair repeats thousands of
times. A split that hashes the content would put every copy of a pair on one side."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from sparkdeep.transformers.keras_estimator import DistributedKerasEstimator
from sparkdeep.transformers.sampling import UniformSampler, hash_uniform, with_row_draw

DISTINCT, COPIES = 20, 10_000


def _probabilities():
    return np.linspace(0.05, 0.95, DISTINCT)


@pytest.fixture(scope="module")
def repeated(spark):
    """200,000 rows of 20 distinct feature vectors; P(label = 1 | row i) = p_i."""
    rng = np.random.default_rng(11)
    p = _probabilities()
    feats = rng.normal(size=(DISTINCT, 3))
    labels = (rng.random((DISTINCT, COPIES)) < p[:, None]).astype(float)
    rows = [(Vectors.dense(feats[i]), float(labels[i, j])) for i in range(DISTINCT) for j in range(COPIES)]
    return spark.createDataFrame(rows, ["features", "label"]).repartition(4).cache()


def test_each_copy_of_a_repeated_row_draws_its_own_side_whatever_the_partitioning(repeated):
    def per_row(df):
        drawn = with_row_draw(df, "u", seed=3, purpose="validation")
        return {tuple(r["f"]): (r["n"], r["val"]) for r in drawn.groupBy(vector_to_array("features").alias("f"))
                .agg(F.count("*").alias("n"), F.sum((F.col("u") < 0.2).cast("int")).alias("val")).collect()}

    one, other = per_row(repeated), per_row(repeated.repartition(7))
    assert one == other  # the same rows on each side, partitioned otherwise
    assert len(one) == DISTINCT
    for n, val in one.values():  # about a fifth of every distinct row's copies
        assert n == COPIES and 0.17 * COPIES < val < 0.23 * COPIES


def test_a_key_decides_alone_when_given(spark):
    df = spark.createDataFrame([(i, 1.0) for i in range(1000)], ["id", "x"])
    a = with_row_draw(df, "u", seed=3, id_cols=["id"], purpose="validation").collect()
    b = with_row_draw(df.withColumn("x", F.lit(2.0)), "u", seed=3, id_cols=["id"], purpose="validation").collect()
    assert [r["u"] for r in a] == [r["u"] for r in b]


def test_a_draw_is_independent_of_an_earlier_sample_by_the_same_key_and_seed(spark):
    """Ingest samples by ``hash(seed, key) < fraction``; the validation split that follows,
    by the same key and seed, must not see the same numbers (it did: every sampled row drew
    under the sample's 5% and so under a 20% validation fraction)."""
    df = spark.range(200_000).withColumnRenamed("id", "key")
    sampled = df.where(hash_uniform(F.xxhash64(F.lit(7), F.col("key"))) < 0.05)
    n = sampled.count()
    for purpose in ("validation", "tune-validation"):
        drawn = with_row_draw(sampled, "u", seed=7, id_cols=["key"], purpose=purpose)
        share = drawn.where(F.col("u") < 0.2).count() / n
        assert 0.18 < share < 0.22, (purpose, share, n)
    one = with_row_draw(sampled, "u", seed=7, id_cols=["key"], purpose="validation")
    other = with_row_draw(sampled, "v", seed=7, id_cols=["key"], purpose="sample")
    both = one.join(other, "key").where((F.col("u") < 0.2) & (F.col("v") < 0.2)).count() / n
    assert 0.03 < both < 0.05, both  # independent: 0.2 x 0.2


def test_a_draw_names_its_purpose(spark):
    with pytest.raises(ValueError, match="purpose"):
        with_row_draw(spark.range(3), "u", seed=1, purpose="")


def test_a_uniform_fraction_keeps_copies_of_a_row_apart(repeated):
    kept = UniformSampler(fraction=0.3, seed=5).fit(repeated).sample(repeated)
    counts = [r["count"] for r in kept.groupBy(vector_to_array("features")).count().collect()]
    assert len(counts) == DISTINCT
    assert all(0.27 * COPIES < c < 0.33 * COPIES for c in counts), counts


@pytest.mark.slow
def test_training_and_validation_agree_and_reach_the_bayes_rate_on_repeated_rows(repeated):
    model = DistributedKerasEstimator(
        featuresCol="features", labelCol="label", numProc=2, epochs=2, batchSize=256, learningRate=0.01,
        warmupEpochs=0.0, seed=4, metrics=["auc", "accuracy"], validationFraction=0.2,
        modelArgs={"hidden_units": [32], "dropout": 0.0}).fit(repeated)
    s = model.trainingSummary
    last = s["history"][-1]
    ranks = s["ranks"]
    validation_rows = sum(r["validation_rows"] for r in ranks)
    assert abs(validation_rows - 0.2 * DISTINCT * COPIES) < 0.01 * DISTINCT * COPIES
    assert abs(last["val_loss"] - last["loss"]) < 0.02, last
    assert abs(last["val_auc"] - last["auc"]) < 0.02, last
    p = _probabilities()
    bayes = float(np.mean(np.maximum(p, 1 - p)))
    assert last["val_accuracy"] > bayes - 0.015, (last, bayes)
    # Scoring equals training: the fitted model's log loss on every row (training and
    # validation rows alike: they are one population) is the ranks' last-epoch figure.
    scored = model.transform(repeated).select("label", vector_to_array("probability")[1].alias("p"))
    eps = 1e-7
    logloss = scored.select(F.avg(-(F.col("label") * F.log(F.greatest(F.col("p"), F.lit(eps))) +
                                    (1 - F.col("label")) * F.log(F.greatest(1 - F.col("p"), F.lit(eps))))
                                  ).alias("l")).first()["l"]
    assert abs(logloss - last["loss"]) < 0.02 and abs(logloss - last["val_loss"]) < 0.02, (logloss, last)
