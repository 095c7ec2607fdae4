import subprocess
import sys

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import functions as F

from sparkdeep.transformers.sampling import ClassBalanceSampler, ClassBalanceSamplerModel


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
    assert abs(after[0] / after[1] - 2.0) < 0.25  # hash Bernoulli: close to the ratio
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


def test_pipeline_fits_later_stages_on_sample_but_scores_every_row(digits):
    pipe = Pipeline(stages=[ClassBalanceSampler(labelCol="label", seed=1),
                            VectorAssembler(inputCols=["px1", "px2"], outputCol="v"),
                            _RowCounter()])
    fitted = pipe.fit(digits)
    sampler = fitted.stages[0]
    assert fitted.stages[2].rows_seen == sampler.summary["rows_out"] < digits.count()
    # Scoring with the fitted pipeline, even on the very training DataFrame, loses nothing.
    assert fitted.transform(digits).count() == digits.count()
    assert fitted.transform(digits).count() == digits.count()


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
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
