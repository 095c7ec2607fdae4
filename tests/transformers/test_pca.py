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


def test_round_trip_in_new_process(cancer, tmp_path):
    df, _ = cancer
    model = CenteredPCA(inputCol="features", outputCol="pcs", k=4, scale=True).fit(df)
    again = transform_in_new_process(model, df, tmp_path, ["id", "pcs"])
    assertDataFrameEqual(again, model.transform(df).select("id", "pcs"))
    loaded = CenteredPCAModel.load(str(tmp_path / "model" / "stages" / f"0_{model.uid}"))
    np.testing.assert_array_equal(loaded.components, model.components)


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
