import json
import os

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import functions as F

from sparkdeep.transformers.sampling import ClassBalanceSampler, ClassBalanceSamplerModel, SamplingPipeline
from tests import _other_process


@pytest.fixture(scope="module")
def digits(spark):
    """scikit-learn's digits: 'is a zero' is a ~10% minority class."""
    from sklearn.datasets import load_digits
    d = load_digits()
    rows = [(i, int(t == 0), *map(float, x[:8])) for i, (x, t) in enumerate(zip(d.data, d.target))]
    cols = ["id", "label"] + [f"px{i}" for i in range(8)]
    return spark.createDataFrame(rows, cols).cache()


def class_counts(df):
    return {r["label"]: r["count"] for r in df.groupBy("label").count().collect()}


def test_rebalances_to_ratio_and_weights_restore_prior(digits):
    model = ClassBalanceSampler(labelCol="label", majorityRatio=2.0, seed=3).fit(digits)
    sample = model.sample(digits)
    before, after = class_counts(digits), class_counts(sample)
    assert after[1] == before[1]  # minority kept whole
    assert after[0] == 2 * before[1]  # exactly the ratio
    assert model.summary["rows_out"] == sum(after.values())
    # Weighted class totals are proportional to the original counts; mean weight is 1.
    w = {r["label"]: r["w"] for r in sample.groupBy("label").agg(F.sum("sample_weight").alias("w")).collect()}
    assert w[0] / w[1] == pytest.approx(before[0] / before[1], rel=1e-9)
    assert sample.agg(F.avg("sample_weight")).first()[0] == pytest.approx(1.0, rel=1e-9)


def test_sample_is_the_same_whatever_the_partitioning(digits):
    model = ClassBalanceSampler(labelCol="label", seed=11).fit(digits)
    ids = [sorted(r["id"] for r in model.sample(digits.repartition(n)).select("id").collect())
           for n in (1, 3, 7)]
    assert ids[0] == ids[1] == ids[2]
    other_seed = ClassBalanceSampler(labelCol="label", seed=12).fit(digits)
    assert sorted(r["id"] for r in other_seed.sample(digits).select("id").collect()) != ids[0]


def test_sampling_pipeline_fits_later_stages_on_sample_but_scores_every_row(digits):
    pipe = SamplingPipeline(stages=[ClassBalanceSampler(labelCol="label", seed=1),
                                    VectorAssembler(inputCols=["px1", "px2"], outputCol="v"),
                                    _RowCounter()])
    fitted = pipe.fit(digits)
    assert type(fitted) is PipelineModel
    sampler = fitted.stages[0]
    assert fitted.stages[2].rows_seen == sampler.summary["rows_out"] < digits.count()
    # Scoring with the fitted pipeline, even on the very training DataFrame, loses nothing.
    assert fitted.transform(digits).count() == digits.count()
    assert fitted.transform(digits).count() == digits.count()


def test_an_unfitted_sampling_pipeline_saves_and_loads_through_the_model_store(digits, spark, tmp_path):
    from pyspark.ml.feature import StandardScaler
    from sparkdeep import model_store
    pipe = SamplingPipeline(stages=[ClassBalanceSampler(labelCol="label", seed=1, majorityRatio=1.5),
                                    VectorAssembler(inputCols=["px1", "px2"], outputCol="v"),
                                    StandardScaler(inputCol="v", outputCol="s")])
    pipe.write().overwrite().save(str(tmp_path / "pipe"))
    loaded = model_store.load(spark, str(tmp_path / "pipe"))
    assert type(loaded) is SamplingPipeline
    assert [type(s) for s in loaded.getStages()] == [type(s) for s in pipe.getStages()]
    assert loaded.getStages()[0].getOrDefault("majorityRatio") == 1.5
    # Fitted, it still fits the scaler on the sample: the same means as the original's fit.
    ours, theirs = pipe.fit(digits).stages[2], loaded.fit(digits).stages[2]
    assert np.allclose(ours.mean.toArray(), theirs.mean.toArray())


def test_mllibs_pipeline_and_transform_never_sample(digits):
    """Who calls makes no difference: MLlib's Pipeline fits the later stages on every row,
    and a fitted sampler's transform passes every row, even on the rows it was fitted on."""
    fitted = Pipeline(stages=[ClassBalanceSampler(labelCol="label", seed=1), _RowCounter()]).fit(digits)
    assert fitted.stages[1].rows_seen == digits.count() > fitted.stages[0].summary["rows_out"]
    model = ClassBalanceSampler(labelCol="label", seed=1).fit(digits)
    assert model.transform(digits).count() == digits.count()
    assert model.sample(digits).count() == model.summary["rows_out"]


FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "prepare_model_2026_12")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_prepare_model_saved_before_the_explicit_api_scores_and_samples_the_same(spark):
    """A fitted prepare pipeline saved on 2026-12-02 (while Pipeline.fit still made the sampler
    sample through a look at its caller): loaded, it transforms, samples and prepares as
    then; and fitting the same pipeline now gives the same features."""
    from sparkdeep import model_store
    from sparkdeep.pipelines import prepare as prep
    expected = json.load(open(os.path.join(FIXTURE, "expected.json")))
    df = spark.createDataFrame([tuple(r) for r in expected["rows"]],
                               "key string, label double, x double, c string, y double")

    def features(frame, *extra):
        return sorted([[r.key, list(map(float, r.features)), *[r[c] for c in extra]] for r in frame.collect()])

    model = model_store.load_pipeline(spark, os.path.join(FIXTURE, "model"))
    # Exact: the same stages on the same rows (JSON keeps a double's every digit).
    assert features(model.transform(df)) == expected["transformed"]
    assert sorted(r.key for r in prep.sampler_of(model).sample(df).collect()) == expected["sampled_keys"]
    assert features(prep.prepared_training_data(model, df, "key"), "sample_weight") == expected["prepared"]
    refit = prep.build_prepare_pipeline(task="binary", categorical=["c"], numeric=["x", "y"], key="key",
                                        majority_ratio=2.0, selector_top_fraction=1.0, pca_k=0, seed=7,
                                        encoding="embedding", pca=False, numeric_buckets=3).fit(df)
    again = features(refit.transform(df))  # a new fit: sums may add in another order, to the last digit
    assert [k for k, _ in again] == [k for k, _ in expected["transformed"]]
    assert np.allclose([v for _, v in again], [v for _, v in expected["transformed"]], rtol=1e-9, atol=1e-12)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_saved_and_loaded_model_passes_every_row_in_new_process(digits, tmp_path, spark):
    fitted = Pipeline(stages=[ClassBalanceSampler(labelCol="label", majorityRatio=1.5, seed=5)]).fit(digits)
    path = str(tmp_path / "pm")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    assert isinstance(loaded.stages[0], ClassBalanceSamplerModel)
    assert loaded.stages[0].summary == fitted.stages[0].summary
    assert loaded.transform(digits).count() == digits.count()
    code = (
        "import sys; from sparkdeep.session import builder; from pyspark.ml import PipelineModel\n"
        "spark = builder(app_name='reload').master('local[1]').getOrCreate()\n"
        f"m = PipelineModel.load({path!r}).stages[0]\n"
        "print('ROWS', m.transform(spark.range(100).selectExpr('id', 'id % 2 as label')).count(), m.summary['rows_out'])\n"
    )
    out = _other_process.run(code, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"ROWS 100 {fitted.stages[0].summary['rows_out']}" in out.stdout


def test_null_labels_error_names_column_or_are_counted_when_skipped(spark):
    df = spark.createDataFrame([(i, None if i < 3 else i % 4 == 0) for i in range(40)], "id long, label boolean")
    with pytest.raises(ValueError, match=r"labelCol 'label' has 3 null"):
        ClassBalanceSampler(labelCol="label").fit(df)
    model = ClassBalanceSampler(labelCol="label", handleInvalid="skip").fit(df)
    assert model.summary["skipped_null_label"] == 3
    assert model.sample(df).where("label is null").count() == 0


def test_bad_params_and_columns_are_named(digits):
    with pytest.raises(ValueError, match="labelCol 'nope'"):
        ClassBalanceSampler(labelCol="nope").fit(digits)
    with pytest.raises(ValueError, match="weightCol 'px1' already exists"):
        ClassBalanceSampler(labelCol="label", weightCol="px1").fit(digits)
    with pytest.raises(ValueError, match="majorityRatio must be > 0"):
        ClassBalanceSampler(labelCol="label", majorityRatio=0.0).fit(digits)
    one_class = digits.where("label = 0")
    with pytest.raises(ValueError, match="1 class"):
        ClassBalanceSampler(labelCol="label").fit(one_class)


class _RowCounter:
    """A test Estimator that records how many rows it was fitted on."""

    def __new__(cls):
        from pyspark.ml import Estimator, Model

        class Counted(Model):
            rows_seen = 0

            def _transform(self, df):
                return df

        class Counter(Estimator):
            def _fit(self, df):
                m = Counted()
                m.rows_seen = df.count()
                return m

        return Counter()


def test_weights_numpy_reference(digits):
    """The weight formula against an independent numpy computation."""
    model = ClassBalanceSampler(labelCol="label", majorityRatio=1.0, seed=2).fit(digits)
    stats = {s["label"]: s for s in model.summary["classes"]}
    n_in = np.array([stats[0]["rows_in"], stats[1]["rows_in"]], dtype=float)
    n_out = np.array([stats[0]["rows_out"], stats[1]["rows_out"]], dtype=float)
    expected = n_in / n_out * n_out.sum() / n_in.sum()
    assert np.allclose([stats[0]["weight"], stats[1]["weight"]], expected)


# -- uniform and stratified (exact counts) -------------------------------------------------

from sparkdeep.transformers.sampling import StratifiedSampler, UniformSampler  # noqa: E402


def test_uniform_target_count_is_exact_and_partition_independent(digits):
    model = UniformSampler(targetCount=300, seed=4).fit(digits)
    a = model.sample(digits)
    assert a.count() == 300
    ids = sorted(r[0] for r in a.select("id").collect())
    assert ids == sorted(r[0] for r in model.sample(digits.repartition(5)).select("id").collect())
    frac = UniformSampler(fraction=0.25, seed=4).fit(digits).sample(digits).count()
    assert abs(frac - 0.25 * digits.count()) < 0.05 * digits.count()
    with pytest.raises(ValueError, match="exactly one of fraction and targetCount"):
        UniformSampler().fit(digits)
    with pytest.raises(ValueError, match="targetCount=99999 is more than"):
        UniformSampler(targetCount=99999).fit(digits)


def test_stratified_counts_are_exact_unlike_sampleBy(spark):
    from sklearn.datasets import load_digits
    d = load_digits()
    df = spark.createDataFrame([(i, int(t), float(x[10])) for i, (x, t) in enumerate(zip(d.data, d.target))],
                               "id long, digit int, px double")
    sizes = {r[0]: r[1] for r in df.groupBy("digit").count().collect()}
    fractions = {str(k): 0.3 for k in range(10)}
    model = StratifiedSampler(stratumCol="digit", fractions=fractions, seed=9).fit(df)
    got = {r[0]: r[1] for r in model.sample(df).groupBy("digit").count().collect()}
    assert got == {k: int(round(0.3 * n)) for k, n in sizes.items()}
    counts = StratifiedSampler(stratumCol="digit", targetCounts={"0": 10, "1": 25}).fit(df)
    got = {r[0]: r[1] for r in counts.sample(df).groupBy("digit").count().collect()}
    assert got == {0: 10, 1: 25}
    assert counts.summary["rows_unlisted_strata"] == sum(n for k, n in sizes.items() if k not in (0, 1))
    # The same model passes every row through when it scores.
    assert counts.transform(df).count() == df.count()


def test_stratum_smaller_than_asked_errors_or_is_recorded(spark):
    df = spark.createDataFrame([(i, "a" if i < 5 else "b") for i in range(50)], "id long, s string")
    with pytest.raises(ValueError, match=r"stratum 'a' of 's' has 5 rows, fewer than the 8 asked"):
        StratifiedSampler(stratumCol="s", targetCounts={"a": 8, "b": 10}).fit(df)
    model = StratifiedSampler(stratumCol="s", targetCounts={"a": 8, "b": 10}, handleInvalid="keep").fit(df)
    assert model.summary["shortfall"] == {"a": 3}
    assert model.sample(df).count() == 15
    with pytest.raises(ValueError, match=r"strata \['zz'\] of 's' do not occur"):
        StratifiedSampler(stratumCol="s", targetCounts={"zz": 1}).fit(df)
    with pytest.raises(ValueError, match="stratumCol 'nope'"):
        StratifiedSampler(stratumCol="nope", targetCounts={"a": 1}).fit(df)


# -- the cost of exactness (issue 25) --------------------------------------------------------

def test_a_fit_hashes_each_row_once_and_sampling_once_more(spark):
    """The fit reads the hashed columns in one pass (its other query counts the strata from
    the stratum column alone); sampling is the second. Counted on a key column computed
    per row, so each pass that reads it shows."""
    from pyspark.sql import types as T
    calls = spark.sparkContext.accumulator(0)

    def key(ids):
        calls.add(len(ids))
        return ids

    key_udf = F.pandas_udf(key, T.LongType())
    df = spark.range(3000, numPartitions=3).select(key_udf("id").alias("k"), (F.col("id") % 3).alias("s"))
    model = StratifiedSampler(stratumCol="s", fractions={"0": 0.3, "1": 0.5, "2": 0.9}, keyCols=["k"], seed=3).fit(df)
    assert calls.value == 3000
    got = {r["s"]: r["count"] for r in model.sample(df).groupBy("s").count().collect()}
    assert got == {0: 300, 1: 500, 2: 900}
    assert calls.value == 2 * 3000


def test_thresholds_are_the_same_when_the_first_window_misses(spark, monkeypatch):
    """The narrowing passes that follow a missed window (forced here: an empty window, and
    buckets for every range) find the same thresholds and ties as the window does."""
    from sparkdeep.transformers import sampling
    rows = [(i, i % 4, float(i % 50)) for i in range(4000)] + [(-1, 1, 7.0)] * 300  # a heavy duplicate
    df = spark.createDataFrame(rows, "id long, s long, x double").cache()

    def fitted():
        m = StratifiedSampler(stratumCol="s", targetCounts={"0": 1, "1": 611, "2": 999, "3": 500}, seed=8,
                              keyCols=["s", "x"]).fit(df)
        return m._plan, sorted(r["id"] for r in m.sample(df).collect())

    passes = []
    narrow = sampling._narrow
    monkeypatch.setattr(sampling, "_narrow", lambda *args: passes.append(1) or narrow(*args))
    plan, ids = fitted()
    assert plan["ties"]  # 25 distinct keys per stratum: the boundary key is shared
    assert len(ids) == 1 + 611 + 999 + 500
    default_passes = len(passes)
    monkeypatch.setattr(sampling, "_WINDOW_SIGMAS", 0.0)
    monkeypatch.setattr(sampling, "_EXACT_ROWS", 4)
    assert fitted() == (plan, ids)
    assert len(passes) - default_passes > max(2, default_passes)


def test_dense_and_sparse_vectors_hash_as_their_values_whichever_way_they_are_read(spark, monkeypatch):
    """Dense vectors are hashed from their stored values, sparse ones through
    ``vector_to_array``: the same hash as converting every row (saved thresholds stay valid),
    and the same for a dense and a sparse vector of equal values, nested ones too."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T
    from sparkdeep.transformers import sampling
    schema = T.StructType([T.StructField("v", VectorUDT()), T.StructField("a", T.ArrayType(VectorUDT()))])
    dense, sparse = Vectors.dense([1.0, 0.0, 3.0]), Vectors.sparse(3, [0, 2], [1.0, 3.0])
    df = spark.createDataFrame([(dense, [sparse]), (sparse, [dense]), (None, None), (Vectors.dense([2.0]), [])],
                               schema)
    fast = [r[0] for r in df.select(sampling.row_hash(["v", "a"], 5, df.schema)).collect()]
    assert fast[0] == fast[1] != fast[3]
    reference = F.xxhash64(F.lit(5), F.when(F.col("v").isNotNull(), vector_to_array("v")),
                           F.transform("a", lambda x: F.when(x.isNotNull(), vector_to_array(x))))
    assert fast == [r[0] for r in df.select(reference).collect()]
    monkeypatch.setattr(sampling, "_stored_vector", lambda col: None)  # as on Spark Connect
    assert fast == [r[0] for r in df.select(sampling.row_hash(["v", "a"], 5, df.schema)).collect()]
