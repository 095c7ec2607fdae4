import numpy as np
import pytest
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import Vectors
from pyspark.testing import assertDataFrameEqual

from sparkdeep.transformers._vectors import feature_names
from sparkdeep.transformers.pca import CenteredPCA, CenteredPCAModel

from ._roundtrip import transform_in_new_process
from .test_selection import assembled


@pytest.fixture(scope="module")
def cancer(spark):
    from sklearn.datasets import load_breast_cancer
    d = load_breast_cancer()
    return assembled(spark, d.data, d.target, [f"f{i}" for i in range(30)]).repartition(3).cache(), d.data


def sign_fixed(components):
    """Make each component's largest |loading| positive, as CenteredPCA does."""
    idx = np.abs(components).argmax(axis=1)
    return components * np.sign(components[np.arange(len(components)), idx])[:, None]


@pytest.mark.parametrize("scale", [False, True])
def test_matches_sklearn_pca(cancer, scale):
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler
    df, x = cancer
    ref_x = StandardScaler().fit_transform(x) if scale else x
    ref = PCA(n_components=30, svd_solver="full").fit(ref_x)
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=6, scale=scale).fit(df)
    ratio = model.explainedVarianceRatio
    # All ratios above numerical noise agree to 1e-6 relative.
    big = ref.explained_variance_ratio_ > 1e-9
    np.testing.assert_allclose(ratio[big], ref.explained_variance_ratio_[big], rtol=1e-6)
    np.testing.assert_allclose(model.components.T, sign_fixed(ref.components_[:6]), atol=1e-6)
    # The transform centres (and scales): it equals sklearn's projection.
    got = np.array([r[0] for r in model.transform(df).orderBy("id").select(vector_to_array("pcs")).collect()])
    expected_x = (x - x.mean(0)) / x.std(0, ddof=1) if scale else x - x.mean(0)
    np.testing.assert_allclose(got, expected_x @ model.components, rtol=1e-7, atol=1e-6)
    np.testing.assert_allclose(np.abs(got), np.abs(ref.transform(ref_x)[:, :6]) *
                               (np.sqrt((len(x) - 1) / len(x)) if scale else 1.0), rtol=1e-5, atol=1e-5)
    assert abs(got.mean(axis=0)).max() < 1e-6  # centred, unlike MLlib's PCA


def test_k_chosen_by_variance_target(cancer):
    df, x = cancer
    model = CenteredPCA(inputCol="features", outputCol="pcs", varianceTarget=0.99, scale=True).fit(df)
    cum = np.cumsum(model.explainedVarianceRatio)
    assert cum[model.numComponents - 1] >= 0.99 > cum[model.numComponents - 2]
    assert model.summary["k"] == model.numComponents
    out = model.transform(df)
    assert feature_names(out.schema, "pcs") == [f"pc{i + 1}" for i in range(model.numComponents)]


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_round_trip_in_new_process(cancer, tmp_path):
    df, _ = cancer
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=4, scale=True).fit(df)
    again = transform_in_new_process(model, df, tmp_path, ["id", "pcs"])
    assertDataFrameEqual(again, model.transform(df).select("id", "pcs"))
    loaded = CenteredPCAModel.load(str(tmp_path / "model" / "stages" / f"0_{model.uid}"))
    np.testing.assert_array_equal(loaded.components, model.components)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_two_thousand_features(spark):
    rng = np.random.default_rng(0)
    p, n = 2000, 600
    latent = rng.normal(size=(n, 5))
    x = latent @ rng.normal(size=(5, p)) + 0.01 * rng.normal(size=(n, p))
    df = spark.createDataFrame([(Vectors.dense(r),) for r in x], ["features"]).repartition(4)
    model = CenteredPCA(inputCol="features", outputCol="pcs", varianceTarget=0.99).fit(df)
    assert model.numComponents == 5
    ref = np.linalg.eigvalsh(np.cov(x, rowvar=False))[::-1]
    np.testing.assert_allclose(model.explainedVarianceRatio[:5], (ref / ref.sum())[:5], rtol=1e-6)


def test_bad_input(spark, cancer):
    df, _ = cancer
    with pytest.raises(ValueError, match="k=31 is larger than the 30 features"):
        CenteredPCA(inputCol="features", k=31).fit(df)
    with pytest.raises(ValueError, match="inputCol 'nope' is not a column"):
        CenteredPCA(inputCol="nope").fit(df)
    with pytest.raises(ValueError, match="outputCol 'label' already exists"):
        CenteredPCA(inputCol="features", outputCol="label").fit(df)
    with pytest.raises(ValueError, match="needs about .* GiB of driver memory"):
        CenteredPCA(inputCol="features", maxCovarianceBytes=1000).fit(df)
    rows = [(Vectors.dense([1.0, float(i), float(i % 3)]),) for i in range(20)]
    rows += [(Vectors.dense([float("nan"), 1.0, 2.0]),), (None,), (Vectors.dense([1.0, float("inf"), 2.0]),)]
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import StructField, StructType
    bad = spark.createDataFrame(rows, StructType([StructField("features", VectorUDT(), True)]))
    with pytest.raises(ValueError, match=r"inputCol 'features' has 3 rows with null, NaN or infinite"):
        CenteredPCA(inputCol="features", k=1).fit(bad)
    model = CenteredPCA(inputCol="features", k=1, handleInvalid="skip").fit(bad)
    assert model.skippedRows == 3
    with pytest.raises(ValueError, match=r"constant features \['features\[0\]'\]"):
        CenteredPCA(inputCol="features", k=1, scale=True, handleInvalid="skip").fit(bad)


# -- the randomized solver (issue 14: wide data) -------------------------------------------

def low_rank(n, p, rank, seed=0, noise=0.05):
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10.0, 1.0, rank)
    return 5.0 + (rng.normal(size=(n, rank)) * scales) @ rng.normal(size=(rank, p)) + noise * rng.normal(size=(n, p))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("scale", [False, True])
def test_randomized_agrees_with_exact_within_tolerance(spark, scale):
    """Components to 1e-6 (cosine to 1 - 1e-10) and explained variance ratios to 1e-6
    relative on a spectrum with a gap after k: the tolerance the README states."""
    x = low_rank(500, 300, 6, seed=1)
    df = spark.createDataFrame([(i, Vectors.dense(r)) for i, r in enumerate(x)], ["id", "features"]).repartition(3)
    exact = CenteredPCA(inputCol="features", outputCol="pcs", k=6, scale=scale, solver="exact").fit(df)
    fast = CenteredPCA(inputCol="features", outputCol="pcs", k=6, scale=scale, solver="randomized").fit(df)
    assert fast.getOrDefault("solver") == "randomized" and exact.getOrDefault("solver") == "exact"
    np.testing.assert_allclose(fast.explainedVariance, exact.explainedVariance, rtol=1e-6)
    np.testing.assert_allclose(fast.components, exact.components, atol=1e-6)
    np.testing.assert_allclose(fast.mean, exact.mean, rtol=1e-12)
    # The randomized model projects x, then subtracts mean . W: the same numbers.
    got = np.array([r[0] for r in fast.transform(df).orderBy("id").select(vector_to_array("pcs")).collect()])
    want = np.array([r[0] for r in exact.transform(df).orderBy("id").select(vector_to_array("pcs")).collect()])
    np.testing.assert_allclose(got, want, atol=1e-6)


def sparse_wide(spark, n=1500, p=70_000, seed=2):
    """One-hot-like rows over 70,000 columns (beyond MLlib's 65,535): 3 latent groups of
    columns that switch on together, plus scattered noise columns."""
    from scipy import sparse
    rng = np.random.default_rng(seed)
    groups = [rng.choice(p, size=40, replace=False) for _ in range(3)]
    rows, cols = [], []
    for i in range(n):
        on = set(rng.choice(p, size=5, replace=False).tolist())
        for g, members in enumerate(groups):
            if rng.random() < (0.5, 0.3, 0.15)[g]:
                on.update(members.tolist())
        rows += [i] * len(on)
        cols += sorted(on)
    x = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, p))
    vectors = [(i, Vectors.sparse(p, x[i].indices.tolist(), x[i].data.tolist())) for i in range(n)]
    return spark.createDataFrame(vectors, ["id", "features"]).repartition(3), x


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_randomized_handles_sparse_vectors_beyond_mllibs_column_limit(spark):
    df, x = sparse_wide(spark)
    n, p = x.shape
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=3).fit(df)  # auto: randomized
    assert model.getOrDefault("solver") == "randomized" and model.components.shape == (p, 3)
    # The exact spectrum from the n x n Gram matrix of the centred rows (no p x p anywhere).
    mean = np.asarray(x.mean(axis=0)).ravel()
    xm = x @ mean
    gram = (x @ x.T).toarray() - xm[:, None] - xm[None, :] + mean @ mean
    eig, u = np.linalg.eigh(gram / (n - 1))
    eig, u = eig[::-1], u[:, ::-1]
    total = np.trace(gram) / (n - 1)
    np.testing.assert_allclose(model.explainedVariance, eig[:3] / total, rtol=1e-6)
    ref = np.asarray((x.T @ u[:, :3]) - np.outer(mean, u[:, :3].sum(axis=0))) / np.sqrt(eig[:3] * (n - 1))
    cos = np.abs((ref * model.components).sum(axis=0))
    assert cos.min() > 1 - 1e-8
    got = np.array([r[0] for r in model.transform(df).orderBy("id").select(vector_to_array("pcs")).collect()])
    np.testing.assert_allclose(got, (x @ model.components) - mean @ model.components, atol=1e-8)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_randomized_solver_errors_and_round_trip(spark, cancer, tmp_path):
    df, _ = cancer
    with pytest.raises(ValueError, match="randomized solver needs k"):
        CenteredPCA(inputCol="features", solver="randomized").fit(df)
    with pytest.raises(ValueError, match="solver must be one of"):
        CenteredPCA(inputCol="features", k=2, solver="lanczos").fit(df)
    with pytest.raises(ValueError, match=r"exact solver over 30 features .* Give k with solver='randomized'"):
        CenteredPCA(inputCol="features", solver="exact", maxCovarianceBytes=1000).fit(df)
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=3, scale=True, solver="randomized").fit(df)
    again = transform_in_new_process(model, df, tmp_path, ["id", "pcs"])
    assertDataFrameEqual(again, model.transform(df).select("id", "pcs"))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("scale", [False, True])
def test_randomized_is_exact_when_a_mean_dwarfs_the_spread(spark, scale):
    """A feature at 1e8 + N(0, 1): a raw sum of squares loses its variance entirely (the
    randomized solver then called it constant, or got the components wrong)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(200, 5)) * np.arange(1, 6)
    x[:, 0] += 1e8
    df = spark.createDataFrame([(i, Vectors.dense(r)) for i, r in enumerate(x)], ["id", "features"]).repartition(3)
    exact = CenteredPCA(inputCol="features", outputCol="pcs", k=3, scale=scale, solver="exact").fit(df)
    fast = CenteredPCA(inputCol="features", outputCol="pcs", k=3, scale=scale, solver="randomized").fit(df)
    np.testing.assert_allclose(fast.explainedVariance, exact.explainedVariance, rtol=1e-6)
    np.testing.assert_allclose(fast.components, exact.components, atol=1e-6)
    if scale:
        np.testing.assert_allclose(fast.std, x.std(axis=0, ddof=1), rtol=1e-9)


@pytest.mark.parametrize("solver", ["exact", "randomized"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_a_constant_column_is_refused_for_scaling_whatever_its_rounding(spark, solver, partitions):
    """0.1 everywhere: the computed spread is rounding noise (about 1e-17, not 0, and
    partition-dependent); both solvers refuse it the same way on every partitioning."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 4))
    x[:, 2] = 0.1
    df = spark.createDataFrame([(Vectors.dense(r),) for r in x], ["features"]).repartition(partitions)
    with pytest.raises(ValueError, match=r"constant features \['features\[2\]'\]"):
        CenteredPCA(inputCol="features", k=2, scale=True, solver=solver).fit(df)


@pytest.mark.parametrize("chunk", [7, 1 << 24])
def test_the_scatter_matrix_reaches_the_driver_whole_in_any_number_of_pieces(spark, chunk, monkeypatch):
    """A partition's p x p matrix travels as float64 bytes, cut into rows of ``chunk``
    values; put back together it is numpy's, with the null and NaN rows counted."""
    import sparkdeep.transformers.pca as pca
    monkeypatch.setattr(pca, "SCATTER_CHUNK", chunk)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 6)) * [1, 10, 100, 0.1, 3, 1e4] + [0, 0, 5, 1e6, -3, 0]
    rows = [(Vectors.dense(r),) for r in x] + [(None,), (Vectors.dense([np.nan] * 6),)]
    df = spark.createDataFrame(rows, ["v"]).repartition(3)
    n, mean, scatter, bad = pca.centred_scatter(df, "v", 6)
    xc = x - x.mean(axis=0)
    assert (n, bad) == (60, 2)
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(scatter, xc.T @ xc, rtol=1e-9)


def test_redundant_pairs_are_the_upper_triangles_pairs_above_the_limit_in_row_order():
    from sparkdeep.transformers.selection import redundant_pairs
    rng = np.random.default_rng(2)
    c = np.corrcoef(rng.normal(size=(8, 40)) + rng.normal(size=(1, 40)) * np.arange(8)[:, None] / 3)
    i, j, s = redundant_pairs(c, 0.7)
    iu = np.triu_indices(len(c), k=1)
    want = np.abs(c[iu]) > 0.7
    assert want.any() and not want.all()
    np.testing.assert_array_equal(i, iu[0][want])
    np.testing.assert_array_equal(j, iu[1][want])
    np.testing.assert_array_equal(s, np.abs(c[iu])[want])
    assert [len(a) for a in redundant_pairs(c, 1.0)] == [0, 0, 0]
