"""An ID of a million levels through the export and the HTTP scorer: the vocabulary of the
fitted StringIndexer (10^6 labels) and an embedding table of 10^6 + 1 rows, exported,
loaded back in safe mode and served, score as Spark's pipeline does, the unseen and the
null level included."""
from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import StringIndexer, VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.sql import types as T

from sparkdeep.pipelines import export
from sparkdeep.pipelines.scoring import ServeOptions
from sparkdeep.pipelines.serve import create_app
from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_estimator import DistributedKerasModel
from tests.test_serve import Running, call

LEVELS = 1_000_000
RAW = T.StructType([T.StructField("user", T.StringType()), T.StructField("x", T.DoubleType())])


@pytest.fixture(scope="module")
def million(spark, tmp_path_factory):
    import keras

    from sparkdeep.transformers.keras_models import tabular_binary_classifier
    fit_rows = spark.range(LEVELS).selectExpr("concat('user ', id) AS user", "CAST(id % 7 AS DOUBLE) AS x")
    indexer = StringIndexer(inputCols=["user"], outputCols=["user_i"], handleInvalid="keep").fit(fit_rows)
    assert len(indexer.labelsArray[0]) == LEVELS
    keras.utils.set_random_seed(2)
    net = tabular_binary_classifier(2, numeric_dim=1, cardinalities=[LEVELS + 1], hidden_units=(8,), dropout=0.0)
    rng = np.random.default_rng(3)
    net.set_weights([rng.normal(scale=0.5, size=w.shape).astype(w.dtype) for w in net.get_weights()])
    keras_model = DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))
    keras_model._set(task="binary")
    model = PipelineModel([indexer, VectorAssembler(inputCols=["x", "user_i"], outputCol="features"), keras_model])
    folder = export.export_pipeline(model, str(tmp_path_factory.mktemp("levels") / "export"),
                                    raw_schema=RAW)["out_dir"]
    return model, folder


def _probe():
    rng = np.random.default_rng(5)
    ids = [0, 1, LEVELS - 1, *rng.integers(0, LEVELS, 20).tolist()]
    rows = [{"user": f"user {i}", "x": float(i % 7)} for i in ids]
    return rows + [{"user": "never seen", "x": 1.0}, {"user": None, "x": 1.0}]


@pytest.mark.slow
def test_a_million_level_vocabulary_exports_serves_and_scores_as_spark_does(spark, million):
    model, folder = million
    rows = _probe()
    df = spark.createDataFrame([(r["user"], r["x"]) for r in rows], RAW)
    want = np.array([r[0] for r in model.transform(df).select(vector_to_array("probability")[1]).collect()])
    loaded = export.load_export(folder)
    np.testing.assert_allclose(loaded.predict(rows), want, rtol=1e-5, atol=1e-6)
    server = Running(create_app(folder, ServeOptions(max_batch_rows=64, max_wait_ms=10)))
    try:
        status, got = call(server.port, "POST", "/predict", {"rows": rows})
    finally:
        server.stop()
    assert status == 200, got
    np.testing.assert_allclose([p["probability"] for p in got["predictions"]], want, rtol=1e-5, atol=1e-6)
    # The unseen and the null level share the table's last row: one score.
    # (Spark scores them in different batches: equal to float32 rounding.)
    assert abs(want[-1] - want[-2]) < 1e-6 and len(set(np.round(want, 6))) > 10
