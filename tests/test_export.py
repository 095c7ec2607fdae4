"""The scoring pipeline exported as one Keras model (issue 27): the same scores as Spark's
``PipelineModel.transform`` on raw rows under the source's names, unseen and null values
and numbers far outside the training range included; safe-mode reload in a new process;
the SavedModel's signature; refusal of a stage with no equivalent.

One fitted, saved and reloaded pipeline per task (module fixtures). Its network is built
by the train step's own builders with seeded random weights, not trained: the export
copies weights whatever they are, and random ones (a non-zero unseen/null embedding row
among them) make every mismatch show.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import Bucketizer, Imputer, SQLTransformer, StandardScaler, StringIndexer, VectorAssembler
from pyspark.ml.functions import vector_to_array
from pyspark.sql import types as T

from sparkdeep import delta_io, model_store
from sparkdeep.jobs import export as export_job
from sparkdeep.names import ORIGINAL_NAME
from sparkdeep.paths import Paths, tree_digest, write_json
from sparkdeep.pipelines import export
from sparkdeep.pipelines import prepare as prep
from sparkdeep.pipelines.train import scoring_pipeline
from sparkdeep.registry import Models, Tables
from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras.model import DistributedKerasModel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = ["low", "mid", "high"]
#: Source names Delta or MLlib refuse, as ingest leaves them for the renamer: {internal: source}.
ORIGINALS = {"x_a": "x.a", "price_USD_": "price (USD)"}
INTERNAL = {v: k for k, v in ORIGINALS.items()}
NUMERIC = ["x_a", "price_USD_", "x3"]
RAW = T.StructType([T.StructField("id", T.LongType()), T.StructField("colour", T.StringType()),
                    T.StructField("x.a", T.DoubleType()), T.StructField("price (USD)", T.DoubleType()),
                    T.StructField("x3", T.DoubleType()), T.StructField("label", T.DoubleType())])
TOL = 1e-5

#: Each task's prepare settings: between them one-hot and embedding encodings, CenteredPCA
#: (exact) and MLlib's StandardScaler, quantile bins, the class-balance sampler.
SETTINGS = {
    "binary": dict(encoding="onehot", pca=True, numeric_buckets=0, majority_ratio=1.0),
    "multiclass": dict(encoding="embedding", pca=False, numeric_buckets=4, majority_ratio=2.0),
    "regression": dict(encoding="embedding", pca=True, numeric_buckets=3, majority_ratio=0.0),
}


def rows(n: int, seed: int, task: str, empty_colour: bool) -> list[tuple]:
    """Training rows under the internal names: some null colours and numbers."""
    rng = np.random.default_rng(seed)
    colours = ["red", "green", "blue"] + ([""] if empty_colour else [])
    out = []
    for i in range(n):
        c = str(rng.choice(colours))
        xa, price, x3 = rng.normal(), 50 + 10 * rng.normal(), rng.normal()
        score = xa + 0.05 * (price - 50) + (c == "red") + 0.3 * rng.normal()
        label = {"binary": float(score > 0.8), "multiclass": float(np.digitize(score, [0.0, 1.0])),
                 "regression": 3 * score + 10}[task]
        out.append((i, None if i % 17 == 0 else c, xa, None if i % 13 == 0 else price,
                    float("nan") if i % 11 == 0 else x3, label))
    return out


def random_network(task: str, layout: dict | None, width: int):
    """The train step's network for this layout, with seeded random weights."""
    import keras

    from sparkdeep.transformers import keras_models as km
    keras.utils.set_random_seed(3)
    common = dict(hidden_units=(16, 8), dropout=0.0)
    if layout is None:
        net = {"binary": lambda: km.mlp_binary_classifier(width, **common),
               "multiclass": lambda: km.mlp_classifier(width, len(CLASSES), **common),
               "regression": lambda: km.mlp_regressor(width, target_mean=10.0, target_scale=3.0, **common)}[task]()
    else:
        args = dict(numeric_dim=layout["numeric_dim"], cardinalities=layout["cardinalities"], **common)
        net = {"binary": lambda: km.tabular_binary_classifier(width, **args),
               "multiclass": lambda: km.tabular_classifier(width, len(CLASSES), **args),
               "regression": lambda: km.tabular_regressor(width, target_mean=10.0, target_scale=3.0, **args)}[task]()
    rng = np.random.default_rng(4)
    net.set_weights([rng.normal(scale=0.5, size=w.shape).astype(w.dtype) for w in net.get_weights()])
    model = DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))
    model._set(task=task)
    return model


def fit_and_save(spark, tmp, task: str) -> tuple[PipelineModel, str]:
    """The task's scoring pipeline, fitted, saved and loaded back as the score job loads it."""
    s = SETTINGS[task]
    internal = T.StructType([T.StructField(INTERNAL.get(f.name, f.name), f.dataType) for f in RAW.fields])
    train = spark.createDataFrame(rows(200, 1, task, empty_colour=task == "multiclass"), internal).cache()
    pipeline = prep.build_prepare_pipeline(
        task=task, categorical=["colour"], numeric=NUMERIC, key="id", majority_ratio=s["majority_ratio"],
        selector_top_fraction=0.75, pca_k=0, pca_variance_target=0.95, seed=1, encoding=s["encoding"],
        pca=s["pca"], numeric_buckets=s["numeric_buckets"], originals=ORIGINALS)
    front = pipeline.fit(train)
    width = len(front.transform(train).select(prep.FEATURES).first()[0])
    layout = prep.embedding_layout(front)
    if layout is not None:
        layout["numeric_dim"] = width - len(layout["cardinalities"])
    whole = scoring_pipeline(front, random_network(task, layout, width), CLASSES if task == "multiclass" else None)
    path = str(tmp / f"{task}_pipeline")
    whole.write().overwrite().save(path)
    train.unpersist()
    return model_store.load_pipeline(spark, path), path


def probe_rows(model: PipelineModel, seed: int = 9) -> list[dict]:
    """Holdout rows under the source's names: ordinary ones, then an unseen colour, a null
    colour, the empty string, null and NaN numbers, numbers far outside the training range,
    -0.0, and every quantile edge of each binned number exactly."""
    rng = np.random.default_rng(seed)
    base = {"colour": "red", "x.a": 0.1, "price (USD)": 55.0, "x3": -0.2, "label": 0.0}
    out = [{"colour": str(rng.choice(["red", "green", "blue"])), "x.a": rng.normal(),
            "price (USD)": 50 + 10 * rng.normal(), "x3": rng.normal(), "label": 0.0} for _ in range(12)]
    out += [{**base, "colour": "purple"}, {**base, "colour": None}, {**base, "colour": ""},
            {**base, "x.a": None, "price (USD)": None, "x3": None}, {**base, "x3": float("nan")},
            {**base, "x.a": 1e6, "price (USD)": -1e6, "x3": 3e7}, {**base, "x.a": -1e6, "price (USD)": 1e9},
            {**base, "colour": None, "x.a": None, "price (USD)": 1e6, "x3": None}, {**base, "x.a": -0.0, "x3": 0.0}]
    for stage in model.stages:
        if isinstance(stage, Bucketizer):
            for col, splits in zip(stage.getInputCols(), stage.getSplitsArray()):
                source = ORIGINALS.get(col.removesuffix("__imp"), col.removesuffix("__imp"))
                out += [{**base, source: float(e)} for e in splits[1:-1]]
                out += [{**base, source: float(np.nextafter(e, -np.inf))} for e in splits[1:-1]]
    return [{"id": i, **r} for i, r in enumerate(out)]


def spark_scores(spark, model: PipelineModel, task: str, probe: list[dict]) -> dict[str, np.ndarray]:
    """Spark's scores for ``probe``, by row id."""
    df = spark.createDataFrame([tuple(r[f.name] for f in RAW.fields) for r in probe], RAW)
    scored = model.transform(df).orderBy("id")
    if task == "regression":
        return {"prediction": np.array([r[0] for r in scored.select("prediction").collect()])}
    got = scored.select(vector_to_array("probability").alias("p"),
                        *(["predicted_class"] if task == "multiclass" else [])).collect()
    p = np.array([r["p"] for r in got])
    if task == "binary":
        return {"probability": p[:, 1]}
    return {"probabilities": p, "predicted_class": np.array([r["predicted_class"] for r in got], dtype=object)}


@pytest.fixture(scope="module")
def exported(spark, tmp_path_factory):
    """{task: (pipeline, its folder, export folder, probe rows, Spark's scores)}, made once."""
    tmp = tmp_path_factory.mktemp("export")
    out = {}
    for task in SETTINGS:
        model, path = fit_and_save(spark, tmp, task)
        probe = probe_rows(model)
        info = export.export_pipeline(model, str(tmp / "exports" / task), raw_schema=RAW, source=path)
        out[task] = {"model": model, "path": path, "dir": info["out_dir"], "info": info, "probe": probe,
                     "spark": spark_scores(spark, model, task, probe)}
    return out


def _close(got, want, what: str):
    got, want = np.asarray(got, dtype="float64"), np.asarray(want, dtype="float64")
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=what)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("task", list(SETTINGS))
def test_the_export_scores_raw_rows_as_the_spark_pipeline_does(exported, task):
    e = exported[task]
    loaded = export.load_export(e["dir"])
    frame = pd.DataFrame(e["probe"])
    want = e["spark"]
    if task == "binary":
        _close(loaded.predict(frame), want["probability"], task)
    elif task == "multiclass":
        _close(loaded.predict(frame), want["probabilities"], task)
        assert list(loaded.predict_class(e["probe"])) == list(want["predicted_class"])
    else:
        _close(loaded.predict(e["probe"]), want["prediction"], task)  # a list of dicts too


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_schema_lists_every_raw_column_with_its_keras_input(exported):
    for task, e in exported.items():
        with open(os.path.join(e["dir"], "schema.json")) as fh:
            schema = json.load(fh)
        inputs = {i["name"]: i for i in schema["inputs"]}
        assert set(inputs) == {"colour", "x.a", "price (USD)", "x3"}, task
        assert schema["unused_columns"] == ["id", "label"] and schema["task"] == task
        assert inputs["colour"]["type"] == "string" and inputs["x.a"]["type"] == "double"
        assert all(i["nullable"] for i in inputs.values())
        names = [i["keras_name"] for i in schema["inputs"]]
        assert len(set(names)) == len(names) and all(n.replace("_", "").isalnum() for n in names)
        assert schema["source"] == e["path"]
        assert schema["classes"] == (CLASSES if task == "multiclass" else None)
        assert [o["name"] for o in schema["outputs"]] == list(export.OUTPUTS[task])
    # "" is a training colour of the multiclass table: its null stands for itself elsewhere.
    null = {t: {i["name"]: i for i in json.load(open(os.path.join(e["dir"], "schema.json")))["inputs"]}["colour"]
            ["null_value"] for t, e in exported.items()}
    assert null["binary"] == "" and null["multiclass"] not in ("", "red", "green", "blue")


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_rows_without_a_column_the_model_reads_are_refused_naming_it(exported):
    loaded = export.load_export(exported["regression"]["dir"])
    with pytest.raises(ValueError, match="no column 'price \\(USD\\)'"):
        loaded.predict([{"colour": "red", "x.a": 1.0, "x3": 0.0}])


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_an_unseen_and_a_null_category_share_the_keep_index_but_not_the_empty_label(exported):
    e = exported["multiclass"]
    want = e["spark"]["probabilities"]
    ids = {r["colour"]: r["id"] for r in e["probe"][12:15]}  # purple, None, ""
    assert np.array_equal(want[ids["purple"]], want[ids[None]])
    assert not np.allclose(want[ids[""]], want[ids[None]])


@pytest.mark.slow
def test_a_new_process_loads_the_keras_file_in_safe_mode_and_the_saved_model_alone(exported, tmp_path):
    """``model.keras`` in safe mode after importing sparkdeep's layers; ``saved_model/`` with
    TensorFlow only (no sparkdeep import at all): both score as the Spark pipeline did."""
    jobs = {task: {"dir": e["dir"], "probe": e["probe"], "out": str(tmp_path / task)} for task, e in exported.items()}
    code = (
        "import json, sys, numpy as np, pandas as pd, tensorflow as tf\n"
        "jobs = json.loads(sys.argv[1])\n"
        "for task, j in jobs.items():\n"
        "    schema = json.load(open(j['dir'] + '/schema.json'))\n"
        "    feed = {}\n"
        "    for i in schema['inputs']:\n"
        "        v = [r[i['name']] for r in j['probe']]\n"
        "        if i['type'] == 'string':\n"
        "            feed[i['keras_name']] = tf.constant([[i['null_value'] if x is None else x] for x in v])\n"
        "        else:\n"
        "            feed[i['keras_name']] = tf.constant([[np.nan if x is None else x] for x in v], tf.float64)\n"
        "    sig = tf.saved_model.load(j['dir'] + '/saved_model').signatures['serving_default']\n"
        "    np.save(j['out'] + '_sm.npy', sig(**feed)[schema['outputs'][0]['name']].numpy())\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'sparkdeep']\n"
        "import keras\n"
        "import sparkdeep.transformers._keras_layers\n"
        "from sparkdeep.pipelines.export import load_export\n"
        "for task, j in jobs.items():\n"
        "    keras.saving.load_model(j['dir'] + '/model.keras', safe_mode=True)\n"
        "    np.save(j['out'] + '.npy', load_export(j['dir']).predict(pd.DataFrame(j['probe'])))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task, e in exported.items():
        want = next(iter(e["spark"].values()))
        _close(np.load(jobs[task]["out"] + ".npy"), want, task)
        sm = np.load(jobs[task]["out"] + "_sm.npy")
        _close(sm[:, 0] if task != "multiclass" else sm, want, f"{task} SavedModel")


# -- single stages against Spark, exactly ----------------------------------------------------------

def identity_network(width: int = 1) -> DistributedKerasModel:
    """A one-unit linear network whose prediction is its first input: the stage's value itself."""
    import keras
    inputs = keras.Input((width,), name="features")
    layer = keras.layers.Dense(1, name="probabilities")
    out = layer(inputs)
    layer.set_weights([np.eye(width, 1, dtype="float32"), np.zeros(1, dtype="float32")])
    model = DistributedKerasModel(kerasBytes=network.keras_to_bytes(keras.Model(inputs, out)))
    model._set(task="regression")
    return model


def scored_both(spark, stages, schema: str, values: list, column: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(export, Spark) of the value the last stage makes (its first output column, or ``column``)
    for one raw column ``v`` holding ``values``."""
    column = column or stages[-1].getOutputCols()[0]
    model = PipelineModel([*stages, VectorAssembler(inputCols=[column], outputCol="features"), identity_network()])
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], f"id long, {schema}")
    want = np.array([r[0] for r in model.transform(df).orderBy("id").select("prediction").collect()])
    # The graph alone (the files are the fixture tests' business): a SavedModel takes seconds to trace.
    got = export.ExportedModel(*export.build_model(model, raw_schema=df.schema)).predict([{"v": v} for v in values])
    return got, want


def test_bucket_edges_are_left_closed_with_inf_in_the_last_and_nan_apart(spark):
    inf = math.inf
    bins = Bucketizer(splitsArray=[[-inf, -2.0, 0.0, 1.0, 2.5, inf]], inputCols=["v"], outputCols=["b"],
                      handleInvalid="keep")
    values = [-inf, -1e300, -2.0, -1.9999999999999998, -0.0, 0.0, 5e-324, 0.5, 1.0, 2.4999999999999996, 2.5, 1e300,
              inf, float("nan")]
    got, want = scored_both(spark, [bins], "v double", values)
    assert want.tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5]
    assert got.tolist() == want.tolist()


def test_string_indices_match_for_null_empty_and_unseen_values(spark):
    fit_rows = spark.createDataFrame([("a",), ("b",), ("a",), ("",), (None,), ("a",), ("b",)], "v string")
    indexer = StringIndexer(inputCols=["v"], outputCols=["i"], handleInvalid="keep").fit(fit_rows)
    values = ["a", "b", "", "zzz", None, "A", " a"]
    got, want = scored_both(spark, [indexer], "v string", values)
    assert got.tolist() == want.tolist()
    assert want[2] != want[4] == want[3] == len(indexer.labelsArray[0])  # "" is a label; null is not
    no_empty = StringIndexer(inputCols=["v"], outputCols=["i"], handleInvalid="keep").fit(
        fit_rows.where("v != ''"))
    got, want = scored_both(spark, [no_empty], "v string", values)
    assert got.tolist() == want.tolist() and want[2] == want[4]


def test_imputed_integers_and_a_zero_std_feature_score_as_in_spark(spark):
    ints = Imputer(inputCols=["v"], outputCols=["o"], strategy="mean").fit(
        spark.createDataFrame([(1,), (2,), (None,), (4,)], "v int"))
    got, want = scored_both(spark, [ints], "v int", [None, 3, -7])
    assert want.tolist() == [2, 3, -7] and got.tolist() == want.tolist()  # the mean 7/3, cast back to int
    vec = VectorAssembler(inputCols=["v"], outputCol="vec")
    scaler = StandardScaler(inputCol="vec", outputCol="s", withMean=True).fit(
        vec.transform(spark.createDataFrame([(5.0,), (5.0,)], "v double")))
    got, want = scored_both(spark, [vec, scaler], "v double", [5.0, 1.0, 1e9], column="s")
    assert want.tolist() == [0, 0, 0] and got.tolist() == want.tolist()  # std 0: MLlib's 0, not a division


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_a_stage_without_an_equivalent_is_refused_by_name_and_nothing_is_written(exported, tmp_path):
    stages = list(exported["binary"]["model"].stages)
    odd = PipelineModel([stages[0], SQLTransformer(statement="SELECT * FROM __THIS__"), *stages[1:]])
    with pytest.raises(export.UnsupportedStageError, match="SQLTransformer"):
        export.export_pipeline(odd, str(tmp_path / "odd"), raw_schema=RAW)
    assert not (tmp_path / "odd").exists()
    strict = Bucketizer(splitsArray=[[-math.inf, 0.0, math.inf]], inputCols=["x3"], outputCols=["b"],
                        handleInvalid="error")
    with pytest.raises(export.UnsupportedStageError, match="Bucketizer.*handleInvalid='error'"):
        export.export_pipeline(PipelineModel([strict, *stages]), str(tmp_path / "strict"), raw_schema=RAW)


# -- the promoted model and the job ----------------------------------------------------------------

@pytest.fixture(scope="module")
def promoted(spark, exported, tmp_path_factory) -> str:
    """An output folder whose ``models/latest.json`` promotes the binary pipeline as run r1's
    --force generation 1, with a holdout table as ingest writes it (internal names, the
    source's names in the columns' metadata)."""
    paths = Paths.under(str(tmp_path_factory.mktemp("promoted") / "output"))
    folder = paths.model(Models.PIPELINE, "r1", 1)
    shutil.copytree(exported["binary"]["path"], folder)
    fields = [T.StructField(INTERNAL.get(f.name, f.name), f.dataType, True,
                            {ORIGINAL_NAME: f.name} if f.name in INTERNAL else {}) for f in RAW.fields]
    rows = [tuple(r[f.name] for f in RAW.fields) for r in exported["binary"]["probe"][:5]]
    ref = delta_io.write(spark.createDataFrame(rows, T.StructType(fields)), paths.table(Tables.HOLDOUT))
    write_json(paths.latest, {"run_id": "r1", "models": {Models.PIPELINE: {"path": folder, "digest": tree_digest(folder)}},
                              "tables": {Tables.HOLDOUT: ref.version}})
    return paths.root


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_the_promoted_pipeline_exports_under_its_run_id_and_the_source_names(spark, exported, promoted, tmp_path):
    info = export.export_promoted(spark, Paths.under(promoted))
    assert info["out_dir"] == os.path.join(promoted, "export", "r1.g1") and info["run_id"] == "r1"
    assert [i["name"] for i in info["inputs"]] == ["colour", "x.a", "price (USD)", "x3"]
    assert info["unused_columns"] == ["id", "label"] and info["source"].endswith(os.path.join("r1", "1", "pipeline"))
    e = exported["binary"]
    _close(export.load_export(info["out_dir"]).predict(e["probe"]), e["spark"]["probability"], "promoted")
    with pytest.raises(FileNotFoundError, match="no promoted model to export"):
        export.export_promoted(spark, Paths.under(str(tmp_path / "empty")))


def test_the_export_job_says_a_bad_argument_in_one_line(tmp_path, capsys):
    assert export_job.main(["--output-dir", str(tmp_path), "--set", "train.epochs=lots"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("export: config error:") and "train.epochs" in err[0]


@pytest.mark.slow
def test_the_export_job_exports_the_promoted_model_in_its_own_process(promoted, tmp_path):
    to = tmp_path / "served"
    proc = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.export", "--output-dir", promoted, "--env", "ci",
                           "--to", str(to)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"out_dir": str(to), "run_id": "r1", "task": "binary"}
    assert {p.name for p in to.iterdir()} == {"model.keras", "saved_model", "schema.json"}
    assert "[export] the binary pipeline of run r1" in proc.stdout
