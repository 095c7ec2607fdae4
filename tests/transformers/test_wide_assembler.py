"""WideAssembler: MLlib's VectorAssembler output, rows and ML attributes alike, its plan built
at a cost linear in the columns, Spark's settings left as they were, and saved through the
allow-list."""
import contextlib
import math

import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import OneHotEncoder, StringIndexer, VectorAssembler
from pyspark.sql import functions as F

from sparkdeep import model_store
from sparkdeep.transformers.columns import SELF_JOIN_CHECK, WideAssembler


@contextlib.contextmanager
def _check_on(spark):
    """The self-join check set on for the block, then put back as the session had it."""
    before = spark.conf.get(SELF_JOIN_CHECK, None)
    spark.conf.set(SELF_JOIN_CHECK, "true")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(SELF_JOIN_CHECK)
        else:
            spark.conf.set(SELF_JOIN_CHECK, before)


def _mixed(spark):
    """Doubles (non-ASCII names: MLlib's assembler parses a dot as a struct field, so the
    pipeline gives it ingest's internal names), an integer, a boolean, a string index (nominal attribute) and a
    one-hot vector (binary attributes): every input kind VectorAssembler takes."""
    rows = [(float(i), i % 3, i % 2 == 0, "abc"[i % 3], i * 0.5) for i in range(12)]
    df = spark.createDataFrame(rows, ["x_1_kg", "n", "flag", "cat", "größe"])
    df = StringIndexer(inputCol="cat", outputCol="cat_idx").fit(df).transform(df)
    df = OneHotEncoder(inputCol="cat_idx", outputCol="cat_ohe").fit(df).transform(df)
    return df, ["x_1_kg", "n", "flag", "cat_idx", "cat_ohe", "größe"]


def test_the_vector_and_its_attributes_are_mllibs(spark):
    df, cols = _mixed(spark)
    ours = WideAssembler(inputCols=cols, outputCol="v").transform(df)
    mllib = VectorAssembler(inputCols=cols, outputCol="v").transform(df)
    assert ours.schema["v"].metadata == mllib.schema["v"].metadata
    assert "größe" in str(ours.schema["v"].metadata)  # named attributes came through
    assert ours.select("v").collect() == mllib.select("v").collect()


def test_the_self_join_setting_is_put_back_as_it_was(spark):
    df, cols = _mixed(spark)
    conf = spark.conf
    assert conf.get(SELF_JOIN_CHECK, None) in (None, "true")
    before = conf.get(SELF_JOIN_CHECK, None)
    WideAssembler(inputCols=cols, outputCol="v").transform(df)
    assert conf.get(SELF_JOIN_CHECK, None) == before
    with _check_on(spark):
        with pytest.raises(Exception, match="nope"):  # a failing transform restores it too
            WideAssembler(inputCols=["nope"], outputCol="v").transform(df)
        assert conf.get(SELF_JOIN_CHECK) == "true"


def test_invalid_values_fail_as_mllibs_do(spark):
    df = spark.createDataFrame([(1.0, None), (2.0, 3.0)], "a double, b double")
    with pytest.raises(Exception, match="null"):
        WideAssembler(inputCols=["a", "b"], outputCol="v").transform(df).collect()
    kept = WideAssembler(inputCols=["a", "b"], outputCol="v", handleInvalid="keep").transform(df).collect()
    assert math.isnan(kept[0].v[1]) and list(kept[1].v) == [2.0, 3.0]
    skipped = WideAssembler(inputCols=["a", "b"], outputCol="v", handleInvalid="skip").transform(df).collect()
    assert [list(r.v) for r in skipped] == [[2.0, 3.0]]


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_wide_frame_builds_flat_and_saves_through_the_allow_list(spark, tmp_path):
    n = 1500
    df = spark.range(20).select(F.col("id").alias("key"),
                                *[(F.col("id") * j + 0.5).cast("double").alias(f"c_{j}_ü") for j in range(n)])
    cols = [f"c_{j}_ü" for j in range(n)]
    model = PipelineModel([WideAssembler(inputCols=cols, outputCol="v")])
    out = model.transform(df)
    # At most one projection over the source's: the plan does not deepen with the columns.
    def projects(frame):
        return frame._jdf.queryExecution().optimizedPlan().treeString().count("Project [")
    assert projects(out) <= projects(df) + 1
    model.write().save(str(tmp_path / "m"))
    back = model_store.load_pipeline(spark, str(tmp_path / "m"))
    assert [type(s).__name__ for s in back.stages] == ["WideAssembler"]
    first = back.transform(df).where("key = 3").first()
    assert len(first.v) == n and first.v[7] == 3 * 7 + 0.5


def test_wide_plans_nests_and_puts_the_setting_back(spark):
    from sparkdeep.transformers.columns import wide_plans
    conf = spark.conf
    with _check_on(spark):
        df, cols = _mixed(spark)
        with wide_plans(spark):
            assert conf.get(SELF_JOIN_CHECK) == "false"
            # A stage opening its own block inside one (WideAssembler) neither blocks nor resets it.
            out = WideAssembler(inputCols=cols, outputCol="v").transform(df)
            assert conf.get(SELF_JOIN_CHECK) == "false"
        assert conf.get(SELF_JOIN_CHECK) == "true"
        assert out.count() == 12
        with pytest.raises(ZeroDivisionError):
            with wide_plans(spark):
                1 / 0
        assert conf.get(SELF_JOIN_CHECK) == "true"
