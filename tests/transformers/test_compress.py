"""Smaller variants of a fitted network (issue 27, ``transformers/keras/compress.py``):
each variant saved inside a ``PipelineModel``, loaded in a fresh process and scoring
there exactly as in this one; quantized files smaller than the original; the pruned
kernels at the target sparsity as saved; the student smaller and close to its teacher;
the variants exported through ``pipelines/export.py``.

The teacher is an MLP fitted here with ``model.fit`` on seeded data (no ranks: what is
tested is what the variants do to a fitted network); pruning's fine-tuning and the
student's training run on real rank processes (marked slow).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.functions import vector_to_array

from sparkdeep.transformers.keras import compress
from sparkdeep.transformers.keras.model import DistributedKerasModel
from sparkdeep.transformers.keras.network import keras_from_bytes, keras_to_bytes
from tests import _other_process

WIDTH = 12
COLS = [f"x{i}" for i in range(WIDTH)]
#: The student's predictions against the teacher's on the sample: mean |P_student - P_teacher|.
STUDENT_TOLERANCE = 0.08
SPARSITY = 0.5
#: Each quantized variant's P(1) against the original's on the holdout: (worst, mean) |difference|.
#: float8 (e4m3, 3 mantissa bits) is the coarsest.
#: The export (eager Keras ops) against Spark's scoring (one traced graph, whose fused
#: MatMul+BiasAdd+ReLU keeps float32 between the ops): bfloat16 rounds after every op in
#: one and not the other, about 2^-8 of a probability apart.
EXPORT_TOLERANCE = {"bfloat16": 1e-2}
QUANTIZED_TOLERANCE = {"int8": (0.05, 0.005), "int4": (0.2, 0.02), "float8": (0.3, 0.02), "bfloat16": (0.05, 0.005)}


def _rows(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, WIDTH))
    score = x[:, 0] - 0.8 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + 0.3 * rng.normal(size=n)
    return x, (score > 0).astype("float64")


@pytest.fixture(scope="module")
def frames(spark):
    out = {}
    for name, (n, seed) in {"train": (2400, 1), "holdout": (600, 2)}.items():
        x, y = _rows(n, seed)
        rows = [(i, *map(float, x[i]), float(y[i])) for i in range(n)]
        df = spark.createDataFrame(rows, ["id", *COLS, "label"])
        out[name] = df
    return out


@pytest.fixture(scope="module")
def assembler():
    return VectorAssembler(inputCols=COLS, outputCol="features")


@pytest.fixture(scope="module")
def teacher():
    """A fitted binary MLP (128, 64): large enough that its weights, not the archive's
    config, make its file size."""
    import keras

    from sparkdeep.transformers.keras_models import mlp_binary_classifier
    keras.utils.set_random_seed(7)
    net = mlp_binary_classifier(WIDTH, hidden_units=(128, 64), dropout=0.0)
    net.compile(optimizer=keras.optimizers.Adam(3e-3), loss="binary_crossentropy")
    x, y = _rows(2400, 1)
    net.fit(x.astype("float32"), y.astype("float32"), epochs=8, batch_size=128, verbose=0)
    # Saved as the ranks save it: the network alone (a compiled model's file also holds Adam's state).
    model = DistributedKerasModel(kerasBytes=keras_to_bytes(keras_from_bytes(keras_to_bytes(net))),
                              trainingSummary={"task": "binary"})
    model._set(task="binary")
    return model


def _scores(pipeline, df) -> np.ndarray:
    out = pipeline.transform(df).select("id", vector_to_array("probability")[1].alias("p")).orderBy("id")
    return np.array([r["p"] for r in out.collect()])


def _auc(y, p) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, p))


def _fresh_process_scores(paths: dict[str, str], data_path: str, out_path: str) -> dict[str, np.ndarray]:
    """Each saved pipeline loaded (through model_store's checks) and scored in one new process."""
    code = (
        "import json, sys\n"
        "from pyspark.ml.functions import vector_to_array\n"
        "from sparkdeep.session import builder\n"
        "from sparkdeep import model_store\n"
        "spark = (builder(app_name='compress').master('local[2]').config('spark.ui.enabled', 'false')\n"
        "         .config('spark.default.parallelism', '2').config('spark.sql.shuffle.partitions', '4')\n"
        "         .getOrCreate())\n"
        f"paths = json.loads({json.dumps(json.dumps(paths))})\n"
        f"df = spark.read.parquet({data_path!r})\n"
        "out = {}\n"
        "for name, path in paths.items():\n"
        "    m = model_store.load_pipeline(spark, path)\n"
        "    rows = m.transform(df).select('id', vector_to_array('probability')[1].alias('p')).orderBy('id')\n"
        "    out[name] = [r['p'] for r in rows.collect()]\n"
        f"json.dump(out, open({out_path!r}, 'w'))\n"
    )
    done = _other_process.run(code, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out_path) as fh:
        return {k: np.array(v) for k, v in json.load(fh).items()}


def _kernel_file_size(pipeline_path: str) -> int:
    """The saved network's ``model.keras`` in a saved pipeline."""
    import glob
    import os
    [found] = glob.glob(os.path.join(pipeline_path, "stages", "*_DistributedKerasModel_*", "model", "model.keras"))
    return os.path.getsize(found)


# -- quantization (no ranks) ----------------------------------------------------------------

@pytest.fixture(scope="module")
def quantized(teacher):
    return {mode: compress.quantize(teacher, mode) for mode in compress.QUANTIZE_MODES}


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_quantized_variants_are_smaller_and_close(quantized, teacher, frames, assembler):
    original = len(teacher.kerasBytes)
    sizes = {mode: len(v.kerasBytes) for mode, v in quantized.items()}
    # The archive's config is about 20 KB whatever the weights (40 KB of float32 here).
    # float8 keeps per-tensor scales and amax histories: larger for a network this size.
    for mode, most in {"int8": 0.6, "int4": 0.6, "bfloat16": 0.75}.items():
        assert sizes[mode] < most * original, (mode, sizes, original)
    base = _scores(PipelineModel([assembler, teacher]), frames["holdout"])
    for mode, variant in quantized.items():
        assert variant.trainingSummary["compressed"]["method"] == "quantize"
        assert variant.trainingSummary["compressed"]["mode"] == mode
        assert variant.trainingSummary["compressed"]["from_digest"] == compress._digest(teacher)
        assert variant.getOrDefault(variant.task) == "binary"
        got = _scores(PipelineModel([assembler, variant]), frames["holdout"])
        worst, mean = QUANTIZED_TOLERANCE[mode]
        assert np.abs(got - base).max() < worst, (mode, np.abs(got - base).max())
        assert np.abs(got - base).mean() < mean, (mode, np.abs(got - base).mean())


def test_bfloat16_keeps_float32_outputs(quantized):
    net = quantized["bfloat16"].keras_model()
    assert net.outputs[0].dtype == "float32"
    assert {layer.dtype_policy.name for layer in net.layers if layer.weights} == {"bfloat16", "float32"}


def test_bad_mode_is_named(teacher):
    with pytest.raises(ValueError, match="'int2'"):
        compress.quantize(teacher, "int2")


def test_multiclass_distillation_refused(spark):
    from sparkdeep.transformers.keras_models import mlp_classifier
    model = DistributedKerasModel(kerasBytes=keras_to_bytes(mlp_classifier(4, 3, hidden_units=(8,))))
    with pytest.raises(ValueError, match="multiclass"):
        compress.distill(model, spark.range(1), alpha=0.5)


def test_prune_without_fine_tuning_reaches_target(teacher):
    pruned = compress.prune(teacher, None, sparsity=0.7, epochs=0)
    net = pruned.keras_model()
    assert all(type(layer).__name__ != "MaskedDense" for layer in net.layers)
    assert min(compress.kernel_sparsity(net).values()) >= 0.7 - 1e-3
    with pytest.raises(ValueError, match="sparsity"):
        compress.prune(teacher, None, sparsity=1.0, epochs=0)


# -- on the ranks, and the round trip of every variant --------------------------------------

@pytest.fixture(scope="module")
def trained_variants(teacher, frames, assembler):
    train = assembler.transform(frames["train"]).select("features", "label")
    common = dict(numProc=2, batchSize=128, seed=3)
    pruned = compress.prune(teacher, train, sparsity=SPARSITY, epochs=2, learningRate=5e-4, **common)
    student = compress.distill(teacher, train, alpha=0.5, epochs=6, learningRate=3e-3, **common)
    return {"prune50": pruned, "distill": student}


@pytest.mark.slow
def test_pruned_keeps_target_sparsity_as_saved(trained_variants, teacher, frames, assembler, tmp_path, spark):
    pruned = trained_variants["prune50"]
    path = str(tmp_path / "pruned")
    PipelineModel([assembler, pruned]).write().overwrite().save(path)
    from sparkdeep import model_store
    loaded = model_store.load_pipeline(spark, path).stages[-1]
    sparsity = compress.kernel_sparsity(loaded.keras_model())
    assert set(sparsity) == {"dense_0", "dense_1", "probabilities"}
    assert min(sparsity.values()) >= SPARSITY - 1e-3, sparsity
    assert pruned.trainingSummary["compressed"]["fine_tune_epochs"] == 2
    y = np.array([r["label"] for r in frames["holdout"].orderBy("id").collect()])
    auc_t = _auc(y, _scores(PipelineModel([assembler, teacher]), frames["holdout"]))
    auc_p = _auc(y, _scores(PipelineModel([assembler, pruned]), frames["holdout"]))
    assert auc_p > auc_t - 0.03, (auc_p, auc_t)


@pytest.mark.slow
def test_student_is_smaller_and_close_to_teacher(trained_variants, teacher, frames, assembler):
    student = trained_variants["distill"]
    assert compress.parameter_count(student.keras_model()) < compress.parameter_count(teacher.keras_model()) / 2
    assert student.trainingSummary["compressed"]["hidden_units"] == [64, 32]
    sample = frames["holdout"].limit(300)
    p_t = _scores(PipelineModel([assembler, teacher]), sample)
    p_s = _scores(PipelineModel([assembler, student]), sample)
    assert np.abs(p_s - p_t).mean() < STUDENT_TOLERANCE, np.abs(p_s - p_t).mean()


@pytest.mark.slow
def test_every_variant_round_trips_in_a_new_process(quantized, trained_variants, teacher, frames, assembler,
                                                    tmp_path, spark):
    """Both processes score the same Parquet rows on local[2]: the same Arrow batches, so the
    same sums in the same order (a batch of another size may round the last bit differently)."""
    data = str(tmp_path / "holdout")
    frames["holdout"].write.mode("overwrite").parquet(data)
    holdout = spark.read.parquet(data)
    variants = {"original": teacher, **quantized, **trained_variants}
    paths, expected = {}, {}
    for name, stage in variants.items():
        pipeline = PipelineModel([assembler, stage])
        paths[name] = str(tmp_path / name)
        pipeline.write().overwrite().save(paths[name])
        expected[name] = _scores(pipeline, holdout)
    for mode in ("int8", "int4", "bfloat16"):
        assert _kernel_file_size(paths[mode]) < _kernel_file_size(paths["original"]), mode
    got = _fresh_process_scores(paths, data, str(tmp_path / "scores.json"))
    for name in variants:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_variants_export(quantized, trained_variants, frames, assembler, tmp_path):
    from sparkdeep.pipelines import export

    raw = frames["holdout"].select(*COLS).schema
    sample = frames["holdout"].orderBy("id").limit(200)
    rows = sample.select(*COLS).toPandas()
    for name, stage in {"int8": quantized["int8"], "bfloat16": quantized["bfloat16"],
                        "prune50": trained_variants["prune50"]}.items():
        pipeline = PipelineModel([assembler, stage])
        export.export_pipeline(pipeline, str(tmp_path / name), raw_schema=raw)
        got = export.load_export(str(tmp_path / name)).predict(rows)
        want = _scores(pipeline, sample)
        np.testing.assert_allclose(got, want, atol=EXPORT_TOLERANCE.get(name, 1e-5), err_msg=name)


def test_masked_dense_round_trips_its_mask(teacher):
    net = teacher.keras_model()
    masks = compress.magnitude_masks(net, 0.5)
    masked = keras_from_bytes(keras_to_bytes(compress.masked_network(net, masks)))
    assert [type(layer).__name__ for layer in masked.layers if layer.weights] == ["MaskedDense"] * 3
    for name, mask in masks.items():
        np.testing.assert_array_equal(np.asarray(masked.get_layer(name).kernel_mask), mask)


def test_soft_labels_are_for_a_binary_network_only(spark):
    from pyspark.ml.linalg import Vectors

    from sparkdeep.transformers.keras.estimator import DistributedKerasEstimator
    df = spark.createDataFrame([(Vectors.dense([0.0, 1.0]), 0.3)], ["features", "label"])
    with pytest.raises(ValueError, match="softLabels=True applies to a binary network"):
        DistributedKerasEstimator(loss="mse", softLabels=True, numProc=1)._validate(df)
