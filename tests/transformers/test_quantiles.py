"""Medians and quantile bins in one pass (transformers/quantiles.py): the same models as
MLlib's Imputer and QuantileDiscretizer, within the documented rank error, for any width."""
import numpy as np
import pandas as pd
import pytest
from pyspark.ml import Pipeline
from pyspark.ml.feature import Bucketizer, Imputer, ImputerModel, QuantileDiscretizer

from sparkdeep import model_store
from sparkdeep.transformers.quantiles import (MedianImputer, QuantileBinner, _Levels, _Summary, approx_quantiles)


def _rank_error(values: np.ndarray, got: float, p: float) -> float:
    """How far (as a share of the values) ``got`` is from the ceil(p n)-th smallest value."""
    v = np.sort(values[~np.isnan(values)])
    lo, hi = np.searchsorted(v, got, side="left"), np.searchsorted(v, got, side="right")
    target = max(np.ceil(p * len(v)) - 1, 0)
    return 0.0 if lo <= target < hi else min(abs(lo - target), abs(hi - 1 - target)) / len(v)


@pytest.mark.parametrize("rows,points,batch,bound", [(500, 2048, 37, 0.0), (100_000, 2048, 10_000, 0.002),
                                                     (100_000, 64, 1_000, 0.11)])
def test_the_summary_is_exact_when_it_holds_every_value_and_bounded_otherwise(rows, points, batch, bound):
    rng = np.random.default_rng(rows + points)
    data = rng.normal(size=(rows, 4))
    data[::3, 0] = np.nan
    data[:, 2] = np.round(data[:, 2] * 2)  # ties
    data[:, 3] = np.nan                    # no values at all
    levels = _Levels(points)
    for i in range(0, rows, batch):
        levels.add(_Summary.of_batch(data[i:i + batch], points))
    probs = [0.0, 0.1, 0.5, 0.9, 1.0]
    q = levels.result().quantiles(probs)
    assert np.isnan(q[3]).all()
    worst = max(_rank_error(data[:, j], q[j, k], p) for j in range(3) for k, p in enumerate(probs))
    # The bound: about log2(batches) / points of the rows (module docstring).
    assert worst <= bound, worst
    assert q[0, 0] == np.nanmin(data[:, 0]) and q[0, -1] == np.nanmax(data[:, 0])


def test_a_sparse_column_stays_exact_in_batches_larger_than_the_points():
    """A column with at most ``points`` values, spread over batches longer than ``points``
    rows and merged past ``points`` rows, keeps every value: its quantiles are exact."""
    rng = np.random.default_rng(5)
    levels, seen = _Levels(64), []
    for b in range(12):
        batch = np.full((500, 2), np.nan)
        batch[:, 1] = rng.normal(size=500)          # dense: compressed
        v = rng.permutation(5) + 10.0 * b            # sparse: 5 values a batch, 60 in all
        batch[rng.choice(500, 5, replace=False), 0] = v
        seen += list(v)
        levels.add(_Summary.of_batch(batch, 64))
    probs = [0.0, 0.01, 0.25, 0.5, 0.9, 1.0]
    q = levels.result().quantiles(probs)
    assert max(_rank_error(np.array(seen), q[0, k], p) for k, p in enumerate(probs)) == 0.0
    assert _rank_error(np.array([1.0]), _Summary.of_batch(np.array([[1.0]] + [[np.nan]] * 99), 64)
                       .quantiles([0.5])[0, 0], 0.5) == 0.0


def _table(spark, rows=700, seed=3):
    rng = np.random.default_rng(seed)
    pdf = pd.DataFrame({"a": rng.normal(size=rows), "b": rng.integers(0, 12, rows).astype(float),
                        "c": rng.exponential(size=rows), "n": rng.integers(-5, 5, rows)})
    pdf.loc[::5, "a"] = np.nan
    pdf.loc[::9, "c"] = None
    return spark.createDataFrame(pdf).repartition(3), ["a", "b", "c", "n"]


def test_medians_and_bins_are_mllibs_on_a_table_small_enough_for_exact_quantiles(spark):
    df, cols = _table(spark)
    imp = [f"{c}_i" for c in cols]
    ours = MedianImputer(inputCols=cols, outputCols=imp).fit(df)
    theirs = Imputer(inputCols=cols, outputCols=imp, strategy="median").fit(df)
    assert isinstance(ours, ImputerModel)
    assert ours.surrogateDF.collect() == theirs.surrogateDF.collect()
    assert ours.transform(df).select(imp).collect() == theirs.transform(df).select(imp).collect()

    filled = theirs.transform(df)
    bins = [f"{c}_b" for c in cols]
    b = QuantileBinner(inputCols=imp, outputCols=bins, numBuckets=8, handleInvalid="keep").fit(filled)
    mllib = QuantileDiscretizer(inputCols=imp, outputCols=bins, numBuckets=8, handleInvalid="keep").fit(filled)
    assert isinstance(b, Bucketizer) and b.getHandleInvalid() == "keep"
    assert b.getSplitsArray() == mllib.getSplitsArray()
    assert b.transform(filled).select(bins).collect() == mllib.transform(filled).select(bins).collect()


def test_a_fitted_pipeline_saves_as_mllib_classes_and_loads_through_the_allow_list(spark, tmp_path):
    df, cols = _table(spark, rows=200)
    model = Pipeline(stages=[MedianImputer(inputCols=cols, outputCols=[f"{c}_i" for c in cols]),
                             QuantileBinner(inputCols=[f"{c}_i" for c in cols], outputCols=[f"{c}_b" for c in cols],
                                            numBuckets=4, handleInvalid="keep")]).fit(df)
    model.write().save(str(tmp_path / "m"))
    back = model_store.load_pipeline(spark, str(tmp_path / "m"))
    assert [type(s).__name__ for s in back.stages] == ["ImputerModel", "Bucketizer"]
    assert back.transform(df).collect() == model.transform(df).collect()


def test_quantiles_of_a_wide_table_match_numpy(spark):
    rng = np.random.default_rng(11)
    data = rng.normal(size=(300, 600))
    data[::4, ::5] = np.nan
    names = [f"x.{i} (v)" for i in range(600)]  # names that need quoting
    df = spark.createDataFrame(pd.DataFrame(data, columns=names)).repartition(2)
    q = approx_quantiles(df, names, [0.0, 0.5, 1.0])
    for j in range(0, 600, 37):
        col = data[:, j][~np.isnan(data[:, j])]
        assert q[j, 0] == col.min() and q[j, 2] == col.max()
        assert q[j, 1] == np.sort(col)[int(np.ceil(0.5 * len(col))) - 1]


def test_bad_input_is_a_clear_error_naming_the_column(spark):
    df = spark.createDataFrame([(1.0, None, "x"), (2.0, None, "y")], "a DOUBLE, empty DOUBLE, s STRING")
    with pytest.raises(ValueError, match=r"\['empty'\] have no non-null"):
        MedianImputer(inputCols=["a", "empty"], outputCols=["a_i", "e_i"]).fit(df)
    with pytest.raises(ValueError, match=r"\['empty'\] have no non-null"):
        QuantileBinner(inputCols=["a", "empty"], outputCols=["a_b", "e_b"], numBuckets=2).fit(df)
    with pytest.raises(ValueError, match=r"not numeric: \{'s': 'string'\}"):
        MedianImputer(inputCols=["s"], outputCols=["s_i"]).fit(df)
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the input"):
        MedianImputer(inputCols=["nope"], outputCols=["n_i"]).fit(df)
    with pytest.raises(ValueError, match="numBuckets must be at least 2"):
        QuantileBinner(inputCols=["a"], outputCols=["a_b"], numBuckets=1).fit(df)
    with pytest.raises(ValueError, match="differ in length"):
        MedianImputer(inputCols=["a"], outputCols=[]).fit(df)
    with pytest.raises(ValueError, match=r"\['a'\] have no non-null"):  # no rows at all
        MedianImputer(inputCols=["a"], outputCols=["a_i"]).fit(df.limit(0))


def test_many_partitions_merge_on_the_executors_to_the_exact_answer(spark):
    """17 partitions: two rounds of executor-side merges (17 -> 5 -> 2 -> 1); every column
    holds under ``points`` values, so the quantiles are the exact rank quantiles."""
    rng = np.random.default_rng(8)
    pdf = pd.DataFrame({"u": rng.normal(size=900), "t": rng.integers(0, 7, 900).astype(float)})
    pdf.loc[::4, "u"] = np.nan
    df = spark.createDataFrame(pdf).repartition(17)
    probs = [0.0, 0.2, 0.5, 0.77, 1.0]
    q = approx_quantiles(df, ["u", "t"], probs)
    for j, c in enumerate(["u", "t"]):
        assert max(_rank_error(pdf[c].to_numpy(), q[j, k], p) for k, p in enumerate(probs)) == 0.0
    empty = approx_quantiles(df.where("u > 100"), ["u"], [0.5])
    assert np.isnan(empty).all()
