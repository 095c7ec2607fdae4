"""HashIndexer: categories as hash buckets (no vocabulary), the same bucket Keras' Hashing
layer gives in the export; nulls apart; any column name, type and count in one projection;
and the prepare pipeline hashing only the columns with more levels than the buckets."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import PipelineModel

from sparkdeep.transformers.hashing import HashIndexer, bucket_of

VALUES = ["", "a", "A", " a", "user 12345", "é漢字🙂", "x" * 300, "[sparkdeep:null]x", "0", "true"]


def test_the_bucket_is_keras_hashing_s_for_any_string():
    import keras
    import tensorflow as tf
    for buckets in (2, 1000, 2 ** 30):
        want = keras.layers.Hashing(num_bins=buckets)(tf.constant([[v] for v in VALUES])).numpy().ravel().tolist()
        assert [bucket_of(v, buckets) for v in VALUES] == want
    assert bucket_of(None, 77) == 77


def test_transform_gives_each_value_its_bucket_and_a_null_its_own(spark):
    df = spark.createDataFrame([(i, v) for i, v in enumerate(VALUES + [None, "a", "a"])], "id long, `odd.name v` string")
    out = HashIndexer(inputCols=["odd.name v"], outputCols=["i`x"], numBuckets=16).transform(df)
    got = {r["id"]: r["i`x"] for r in out.collect()}
    assert [got[i] for i in range(len(VALUES))] == [float(bucket_of(v, 16)) for v in VALUES]
    assert got[len(VALUES)] == 16.0 and got[len(VALUES) + 1] == got[len(VALUES) + 2] == got[1]
    assert out.count() == df.count()  # duplicates and nulls kept: nothing dropped


def test_other_types_hash_as_their_strings_as_ingest_stores_them(spark):
    df = spark.createDataFrame([(7, True), (None, False)], "n int, b boolean")
    out = HashIndexer(inputCols=["n", "b"], outputCols=["ni", "bi"], numBuckets=100).transform(df).collect()
    assert out[0]["ni"] == bucket_of("7", 100) and out[1]["ni"] == 100.0
    assert out[0]["bi"] == bucket_of("true", 100) and out[1]["bi"] == bucket_of("false", 100)


def test_bad_settings_and_inputs_are_named(spark):
    with pytest.raises(ValueError, match="numBuckets must be between 2 and 2\\^30, got 1"):
        HashIndexer(inputCols=["a"], outputCols=["b"], numBuckets=1)
    with pytest.raises(ValueError, match="2 inputCols but 1 outputCols"):
        HashIndexer(inputCols=["a", "b"], outputCols=["c"])
    df = spark.createDataFrame([("x", "y")], "a string, b string")
    with pytest.raises(ValueError, match="the input has no column 'zz'"):
        HashIndexer(inputCols=["zz"], outputCols=["o"], numBuckets=4).transform(df)
    with pytest.raises(ValueError, match="already has a column 'b'"):
        HashIndexer(inputCols=["a"], outputCols=["b"], numBuckets=4).transform(df)
    with pytest.raises(ValueError, match="outputCols name 'o' more than once"):
        HashIndexer(inputCols=["a", "b"], outputCols=["o", "o"])
    with pytest.raises(ValueError, match="set inputCols and outputCols"):
        HashIndexer(numBuckets=4).transform(df)
    # A number's text form is Spark's own (1.0E7, NaN, 3.00): no scorer outside Spark hashes it alike.
    from decimal import Decimal
    nums = spark.createDataFrame([(1e7, Decimal("3"))], "d double, m decimal(10,2)")
    for col, kind in (("d", "double"), ("m", "decimal\\(10,2\\)")):
        with pytest.raises(ValueError, match=f"column '{col}' is {kind}; hash strings, integers"):
            HashIndexer(inputCols=[col], outputCols=["o"], numBuckets=4).transform(nums)


def test_hundreds_of_columns_hash_in_one_projection(spark):
    cols = [f"c.{i} x" for i in range(300)]
    df = spark.createDataFrame([tuple(f"v{i}" for i in range(300))], ", ".join(f"`{c}` string" for c in cols))
    out = HashIndexer(inputCols=cols, outputCols=[f"i{i}" for i in range(300)], numBuckets=8).transform(df)
    plan = out._jdf.queryExecution().analyzed().treeString()
    assert plan.count("Project") == 1, plan[:2000]
    row = out.first()
    assert [row[f"i{i}"] for i in range(300)] == [float(bucket_of(f"v{i}", 8)) for i in range(300)]


def test_saved_and_loaded_through_the_model_store(spark, tmp_path):
    from sparkdeep import model_store
    df = spark.createDataFrame([("a",), ("b",), (None,)], "v string")
    model = PipelineModel([HashIndexer(inputCols=["v"], outputCols=["i"], numBuckets=5)])
    model.write().overwrite().save(str(tmp_path / "m"))
    again = model_store.load_pipeline(spark, str(tmp_path / "m"))
    assert [r.i for r in again.transform(df).collect()] == [r.i for r in model.transform(df).collect()]
    assert again.stages[0].getNumBuckets() == 5


def test_the_export_hashes_as_spark_does_null_and_empty_apart(spark):
    from tests.test_export import scored_both
    values = VALUES + [None, "never seen in training", "", "\x00", "a\x00"]
    got, want = scored_both(spark, [HashIndexer(inputCols=["v"], outputCols=["i"], numBuckets=1000)],
                            "v string", values)
    assert got.tolist() == want.tolist()
    assert want[len(VALUES)] == 1000 and want[0] == bucket_of("", 1000) != 1000


def test_prepare_hashes_the_columns_with_more_levels_than_the_buckets(spark):
    """The approximate count picks the ID column (2,000 levels) and leaves the colour (3)
    its vocabulary; the layout gives the hashed one buckets + 1 rows; the baselines index
    its most frequent levels (counted on the executors)."""
    from sparkdeep.pipelines import baselines, prepare as prep
    rng = np.random.default_rng(1)
    n = 3_000
    users = rng.integers(0, 2_000, n)
    rows = [(i, f"u{users[i]}", ["red", "green", "blue"][i % 3], float(rng.normal()), float(users[i] % 2))
            for i in range(n)]
    rows[5] = (5, None, "red", 0.0, 1.0)
    train = spark.createDataFrame(rows, "id long, user string, colour string, x double, label double").cache()
    hashed = prep.hashed_columns(train, ["user", "colour"], 256)
    seen = len({r[1] for r in rows if r[1] is not None})
    assert set(hashed) == {"user"} and abs(hashed["user"] - seen) < 0.03 * seen, (hashed, seen)
    assert prep.hashed_columns(train, ["user", "colour"], 0) == {}
    pipe = prep.build_prepare_pipeline(task="binary", categorical=["user", "colour"], numeric=["x"], key="id",
                                       majority_ratio=0, selector_top_fraction=1.0, pca_k=0, seed=1,
                                       encoding="embedding", pca=False, hashed=list(hashed), hash_buckets=256)
    model = pipe.fit(train)
    layout = prep.embedding_layout(model)
    assert layout == {"categorical": ["user", "colour"], "cardinalities": [257, 4]}
    feats = model.transform(train).select("id", prep.FEATURES).orderBy("id").collect()
    assert feats[0][1][1] == bucket_of("u%d" % users[0], 256) and feats[5][1][1] == 256.0
    front = baselines.assembly_front(model, train, max_levels=10, max_bins=32)
    top = [s for s in front.stages if s.__class__.__name__ == "StringIndexerModel" and s.getInputCols() == ["user"]]
    assert len(top) == 1 and len(top[0].labelsArray[0]) == 31
    counts = {r["user"]: r["count"] for r in train.groupBy("user").count().where("user IS NOT NULL").collect()}
    kept = list(top[0].labelsArray[0])
    assert min(counts[u] for u in kept) >= max(c for u, c in counts.items() if u not in kept)  # the most frequent
    assert [counts[u] for u in kept] == sorted((counts[u] for u in kept), reverse=True)
    assembled = front.transform(train).select(baselines.ASSEMBLED).first()[0]
    assert assembled.size == 1 + 10 + 3  # x, the user's top 10 one-hot (dropLast: 10 of 11), colour (3 of 4)
    with pytest.raises(ValueError, match="hashed columns need encoding='embedding'"):
        prep.build_prepare_pipeline(task="binary", categorical=["user"], numeric=["x"], key="id", majority_ratio=0,
                                    selector_top_fraction=1.0, pca_k=0, seed=1, encoding="onehot", hashed=["user"],
                                    hash_buckets=256)
    train.unpersist()
