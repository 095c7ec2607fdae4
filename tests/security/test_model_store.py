"""A crafted model folder must not run code, or read files outside itself, on load.

Each test copies one small saved pipeline (a nested MLlib PipelineModel of StringIndexer
+ VectorAssembler, then a tiny untrained DistributedKerasModel), tampers with the copy as an
attacker with write access to the folder would, and expects ``model_store`` to refuse it
with a message naming the folder or file, before importing or writing anything.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest
from pyspark.ml import PipelineModel
from pyspark.ml.feature import StringIndexer, VectorAssembler
from pyspark.testing import assertDataFrameEqual

from sparkdeep import model_store, storage
from sparkdeep.model_store import UnsafeModelError
from sparkdeep.transformers.keras import network
from sparkdeep.transformers.keras_estimator import KERAS_FILE, DistributedKerasModel
from sparkdeep.transformers.keras_models import mlp_binary_classifier

SCORED = ["id", "probability", "prediction"]


@pytest.fixture(scope="module")
def data(spark):
    rows = [(i, "abc"[i % 3], float(i), float(i % 5)) for i in range(30)]
    return spark.createDataFrame(rows, ["id", "cat", "x1", "x2"])


@pytest.fixture(scope="module")
def model(data):
    """PipelineModel([PipelineModel([StringIndexerModel, VectorAssembler]), DistributedKerasModel])."""
    import keras
    keras.utils.set_random_seed(0)
    inner = PipelineModel([StringIndexer(inputCol="cat", outputCol="cat_idx").fit(data),
                           VectorAssembler(inputCols=["cat_idx", "x1", "x2"], outputCol="features")])
    net = mlp_binary_classifier(3, hidden_units=(4,), dropout=0.0)
    return PipelineModel([inner, DistributedKerasModel(kerasBytes=network.keras_to_bytes(net))])


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("saved") / "pipeline")
    model.write().save(path)
    return path


@pytest.fixture
def folder(saved, tmp_path):
    """A private copy of the saved pipeline to tamper with."""
    return shutil.copytree(saved, str(tmp_path / "model"), symlinks=True)


@pytest.fixture
def sentinel(tmp_path, monkeypatch):
    """A fresh importable module whose import (or load) writes a marker file."""
    name = f"evil_sentinel_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "pwned"
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{name}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "class Evil:\n    @classmethod\n    def load(cls, path):\n        return cls()\n")
    monkeypatch.syspath_prepend(str(lib))
    yield name, marker
    sys.modules.pop(name, None)


def stage(folder: str, *index: int) -> str:
    """The folder of stage ``index`` (nested indices for nested pipelines)."""
    for i in index:
        folder = sorted(glob.glob(os.path.join(folder, "stages", f"{i}_*")))[0]
    return folder


def edit_metadata(folder: str, change) -> None:
    """Rewrite a stage's metadata JSON as an attacker would, dropping Hadoop's .crc."""
    (part,) = [p for p in glob.glob(os.path.join(folder, "metadata", "part-*"))]
    with open(part) as fh:
        meta = json.load(fh)
    change(meta)
    with open(part, "w") as fh:
        json.dump(meta, fh)
    drop_crc(os.path.join(folder, "metadata"))


def drop_crc(folder: str) -> None:
    for crc in glob.glob(os.path.join(folder, "**", ".*.crc"), recursive=True):
        os.remove(crc)


def set_class(name: str):
    return lambda meta: meta.update({"class": name})


# -- (h) the clean folder ---------------------------------------------------------------------

@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_clean_pipeline_loads_and_scores_like_the_in_memory_one(spark, saved, model, data):
    checked = model_store.check(spark, saved)
    assert [c for _, c in checked] == [
        "pyspark.ml.pipeline.PipelineModel", "org.apache.spark.ml.PipelineModel",
        "org.apache.spark.ml.feature.StringIndexerModel", "org.apache.spark.ml.feature.VectorAssembler",
        "sparkdeep.transformers.keras.model.DistributedKerasModel"]
    loaded = model_store.load_pipeline(spark, saved)
    assertDataFrameEqual(loaded.transform(data).select(*SCORED), model.transform(data).select(*SCORED))
    keras_stage = model_store.load(spark, stage(saved, 1))
    assert isinstance(keras_stage, DistributedKerasModel)
    assert keras_stage.kerasBytes == model.stages[1].kerasBytes


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_mllib_stages_a_user_saves_are_on_the_allow_list(spark, data, tmp_path):
    """The class names the JVM really writes, checked on a saved pipeline (fitted and not)."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import GBTClassifier, LogisticRegression
    from pyspark.ml.feature import Imputer, OneHotEncoder, PCA, StandardScaler, VectorSlicer
    df = data.withColumn("label", (data.id % 2).cast("double"))
    pipe = Pipeline(stages=[
        StringIndexer(inputCol="cat", outputCol="cat_idx"), OneHotEncoder(inputCol="cat_idx", outputCol="cat_ohe"),
        Imputer(inputCols=["x1"], outputCols=["x1_imp"]),
        VectorAssembler(inputCols=["cat_ohe", "x1_imp", "x2"], outputCol="raw"),
        VectorSlicer(inputCol="raw", outputCol="sliced", indices=[0, 1, 2, 3]),
        StandardScaler(inputCol="sliced", outputCol="scaled"), PCA(k=2, inputCol="scaled", outputCol="features"),
        LogisticRegression(maxIter=5, predictionCol="lr_pred", probabilityCol="lr_prob", rawPredictionCol="lr_raw"),
        GBTClassifier(maxIter=2, maxDepth=2)])
    pipe.save(str(tmp_path / "unfitted"))
    pipe.fit(df).save(str(tmp_path / "fitted"))
    classes = {c for _, c in model_store.check(spark, str(tmp_path / "fitted"))}
    assert {"org.apache.spark.ml.PipelineModel", "org.apache.spark.ml.feature.OneHotEncoderModel",
            "org.apache.spark.ml.feature.ImputerModel", "org.apache.spark.ml.feature.PCAModel",
            "org.apache.spark.ml.classification.GBTClassificationModel"} <= classes
    assert isinstance(model_store.load_pipeline(spark, str(tmp_path / "fitted")), PipelineModel)
    assert isinstance(model_store.load(spark, str(tmp_path / "unfitted")), Pipeline)
    with pytest.raises(UnsafeModelError, match=r"unfitted: holds a org\.apache\.spark\.ml\.Pipeline, not a fitted"):
        model_store.load_pipeline(spark, str(tmp_path / "unfitted"))


def test_every_saveable_project_stage_is_on_the_allow_list():
    import inspect
    from pyspark.ml import Estimator, Model
    from pyspark.ml.util import MLWritable
    from sparkdeep.transformers import pca, sampling, selection
    from sparkdeep.transformers.keras import model as keras_model
    ours = {f"{m.__name__}.{n}" for m in (sampling, selection, pca, keras_model)
            for n, c in inspect.getmembers(m, inspect.isclass)
            if c.__module__ == m.__name__ and not n.startswith("_")
            and issubclass(c, (Estimator, Model)) and issubclass(c, MLWritable)}
    assert "sparkdeep.transformers.keras.model.DistributedKerasModel" in ours
    assert ours - model_store.ALLOWED_CLASSES == set()
    # Models saved before issue 24's package split name the old module, which still loads.
    assert "sparkdeep.transformers.keras_estimator.KerasHorovodModel" in model_store.ALLOWED_CLASSES
    assert "sparkdeep.transformers.keras.model.KerasHorovodModel" in model_store.ALLOWED_CLASSES


def test_every_allowed_name_is_a_loadable_class():
    """A typo in the allow-list would refuse a legitimate stage; each name must import."""
    import importlib
    for name in model_store.ALLOWED_CLASSES:
        module, _, cls = model_store.python_class(name).rpartition(".")
        assert hasattr(getattr(importlib.import_module(module), cls), "load"), name


def test_model_store_imports_no_stage_code():
    # Only the package that registers its classes and the list itself (strings) are read.
    code = ("import sys, sparkdeep.model_store\n"
            "bad = [m for m in sys.modules if m.startswith(('sparkdeep.transformers', 'sparkdeep.pipelines',"
            " 'sparkdeep.jobs', 'tensorflow', 'keras'))\n"
            "       and m not in ('sparkdeep.transformers', 'sparkdeep.transformers._saved')]\n"
            "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


#: What misbehaving entry points could list: another package's class (SQLTransformer runs
#: SQL); not a mapping; MLlib's JVM names from a module called ``org``; sparkdeep's names
#: from another distribution.
OTHERS = {"pyspark.ml.feature": "SQLTransformer"}
NOT_A_MAPPING = ["sparkdeep.transformers.pca.CenteredPCA"]
JVM_NAMES = {"org.apache.spark.ml.feature": "SQLTransformer"}
OURS_FROM_ELSEWHERE = {"sparkdeep.transformers.evil": "Evil"}


def test_the_stage_packages_register_their_classes_and_only_their_own(monkeypatch):
    """The allow-list's sparkdeep names come from the owning package's entry point (core
    names none). An entry point that breaks a rule is left out with a warning naming it
    (one broken plugin does not stop every model load), and its classes stay refused."""
    from importlib.metadata import EntryPoint

    from sparkdeep.transformers._saved import SAVED_CLASSES
    [ours] = [ep for ep in model_store._entry_points() if ep.name == "transformers"]
    assert ours.value == "sparkdeep.transformers._saved:SAVED_CLASSES"
    listed = {f"{m}.{c}" for m, names in SAVED_CLASSES.items() for c in names.split()}
    assert listed == {c for c in model_store.ALLOWED_CLASSES if c.startswith("sparkdeep.")}
    assert model_store.registered_classes() == listed

    for value, why in [("tests.security.test_model_store:OTHERS", "outside its own package 'tests.security'"),
                       ("tests.security.test_model_store:NOT_A_MAPPING", "must name a mapping of module names"),
                       ("org.reg:JVM_NAMES", "classes of 'org' are allowed here or by its own distribution only"),
                       ("sparkdeep.transformers.reg:OURS_FROM_ELSEWHERE", "classes of 'sparkdeep' are allowed")]:
        module, _, attr = value.partition(":")
        ep = EntryPoint(name="plugin", value=value, group=model_store.SAVED_CLASSES_GROUP)
        loaded = globals()[attr]
        monkeypatch.setattr(EntryPoint, "load", lambda self, loaded=loaded: loaded)
        monkeypatch.setattr(model_store, "_entry_points", lambda ep=ep: [ep])
        warned: list[str] = []
        monkeypatch.setattr(model_store.log, "warning", lambda msg, *args: warned.append(msg % args))
        assert model_store.registered_classes() == frozenset()
        assert len(warned) == 1 and f"entry point 'plugin' ({value})" in warned[0] and why in warned[0], warned


def test_the_stages_inside_any_container_class_are_checked(spark, tmp_path, sentinel):
    """A registered class saved in MLlib's pipeline layout (SamplingPipeline) holds stages of
    its own: they pass the same checks before MLlib would import them."""
    from sparkdeep.transformers.sampling import ClassBalanceSampler, SamplingPipeline
    name, marker = sentinel
    path = str(tmp_path / "sampling")
    SamplingPipeline(stages=[ClassBalanceSampler(labelCol="label"),
                             StringIndexer(inputCol="cat", outputCol="cat_idx")]).write().save(path)
    assert [c for _, c in model_store.check(spark, path)] == [
        "sparkdeep.transformers.sampling.SamplingPipeline", "sparkdeep.transformers.sampling.ClassBalanceSampler",
        "org.apache.spark.ml.feature.StringIndexer"]
    edit_metadata(stage(path, 1), set_class(f"{name}.Evil"))
    with pytest.raises(UnsafeModelError, match=rf"class '{name}\.Evil' in its metadata is not one"):
        model_store.load(spark, path)
    assert name not in sys.modules and not marker.exists()


@pytest.mark.slow  # builds the wheel and its zip (scripts/package.sh)
def test_the_registration_reads_from_the_py_files_zip_without_any_other_package(repo_root):
    """On a cluster the driver may have only the zip: its metadata (the wheel's) carries the
    entry point, and reading the list needs nothing else installed (no site-packages here)."""
    zip_path = subprocess.run(["bash", f"{repo_root}/scripts/package.sh"], capture_output=True, text=True,
                              timeout=600, cwd=repo_root, check=True).stdout.strip().splitlines()[-1]
    code = ("import sys, importlib.metadata as md\n"
            "sys.path[:] = [sys.argv[1]] + [p for p in sys.path if 'site-packages' not in p]\n"
            "[ep] = [e for e in md.entry_points(group='sparkdeep.saved_classes') if e.name == 'transformers']\n"
            "listed = ep.load()\n"
            "assert 'DistributedKerasModel' in listed['sparkdeep.transformers.keras.model'], listed\n"
            "assert sys.modules['sparkdeep'].__file__.startswith(sys.argv[1]), sys.modules['sparkdeep'].__file__\n"
            "print(sorted(m for m in sys.modules if m.startswith('sparkdeep')))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code, zip_path], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['sparkdeep', 'sparkdeep.transformers', 'sparkdeep.transformers._saved']"


# -- (a), (b) classes that are not stages ----------------------------------------------------------

@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_plain_mllib_load_runs_the_sentinel(spark, folder, sentinel):
    """The hole these checks close: without them the sentinel is imported."""
    name, marker = sentinel
    edit_metadata(stage(folder, 1), set_class(f"{name}.Evil"))
    PipelineModel.load(folder)
    assert name in sys.modules and marker.exists()


@pytest.mark.slow  # its module fixture fits a model: left to make test
@pytest.mark.parametrize("where", [(), (1,), (0,), (0, 1)], ids=["top", "stage", "nested-pipeline", "nested-stage"])
def test_a_class_off_the_allow_list_is_refused_before_import(spark, folder, sentinel, where):
    name, marker = sentinel
    target = stage(folder, *where)
    edit_metadata(target, set_class(f"{name}.Evil"))
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(target)}: class '{name}\.Evil' in its metadata is not one"):
        model_store.load_pipeline(spark, folder)
    assert name not in sys.modules
    assert not marker.exists()


@pytest.mark.parametrize("cls", ["tensorflow.saved_model", "os.system", "subprocess.Popen",
                                 "pyspark.ml.feature.SQLTransformer", "org.apache.spark.ml.feature.SQLTransformer"])
@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_installed_modules_are_refused(spark, folder, cls):
    edit_metadata(stage(folder, 1), set_class(cls))
    with pytest.raises(UnsafeModelError, match=rf"stages/1_DistributedKerasModel_\w+: class '{re.escape(cls)}'"):
        model_store.load_pipeline(spark, folder)


# -- (g) stage folders outside the model folder --------------------------------------------------

@pytest.mark.slow  # its module fixture fits a model: left to make test
@pytest.mark.parametrize("uid", ["../../../elsewhere", "x/../../../elsewhere", "/tmp/elsewhere", "a\\..\\b"])
def test_stage_uids_that_leave_the_folder_are_refused(spark, folder, uid):
    def point_out(meta):
        meta["paramMap"]["stageUids"][1] = uid
    edit_metadata(folder, point_out)
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(folder)}/metadata: stage uid '.*' would name a folder outside"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_a_symlinked_stage_folder_is_refused(spark, folder, tmp_path):
    keras_stage = stage(folder, 1)
    outside = shutil.move(keras_stage, str(tmp_path / "outside"))
    os.symlink(outside, keras_stage)
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(keras_stage)}: a symbolic link to {re.escape(outside)}, outside"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_malformed_metadata_is_named(spark, folder):
    part = glob.glob(os.path.join(stage(folder, 1), "metadata", "part-*"))[0]
    with open(part, "w") as fh:
        fh.write('{"class": "sparkdeep.transformers.keras_estimator.KerasHorovodModel", ')
    drop_crc(stage(folder, 1))
    with pytest.raises(UnsafeModelError, match=r"stages/1_DistributedKerasModel_\w+/metadata: metadata is not valid JSON"):
        model_store.load_pipeline(spark, folder)
    with open(part, "w") as fh:
        fh.write('{"class": "a", "uid": "b"}\n{"class": "c", "uid": "d"}\n')
    with pytest.raises(UnsafeModelError, match=r"/metadata: holds 2 non-empty lines"):
        model_store.load_pipeline(spark, folder)
    shutil.rmtree(os.path.join(stage(folder, 1), "metadata"))
    with pytest.raises(UnsafeModelError, match=r"stages/1_DistributedKerasModel_\w+/metadata: no metadata to read"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_tampered_metadata_fails_its_hadoop_checksum(spark, folder):
    part = glob.glob(os.path.join(folder, "metadata", "part-*"))[0]
    with open(part) as fh:
        text = fh.read()
    with open(part, "w") as fh:
        fh.write(text.replace("PipelineModel", "PipelineMod3l", 1))
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(folder)}/metadata: checksum failure"):
        model_store.load_pipeline(spark, folder)


# -- (c)-(f) the Keras stage's network file ------------------------------------------------------

@pytest.mark.slow  # its module fixture fits a model: left to make test
@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_keras_file_outside_the_stage_folder_is_refused(spark, folder, tmp_path, kind):
    keras_stage = stage(folder, 1)
    # A valid network outside the folder, with its checksum: only the path check stops it.
    outside = tmp_path / "x" / "model.keras"
    outside.parent.mkdir()
    shutil.copy(os.path.join(keras_stage, KERAS_FILE), outside)
    pointer = os.path.relpath(outside, keras_stage) if kind == "relative" else str(outside)
    assert (kind == "absolute") != pointer.startswith("..")
    edit_metadata(keras_stage, lambda meta: meta.update({"kerasFile": pointer}))
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(keras_stage)}/metadata: kerasFile is '{re.escape(pointer)}'"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_keras_file_without_a_checksum_is_refused(spark, folder):
    edit_metadata(stage(folder, 1), lambda meta: meta.pop("kerasSha256"))
    with pytest.raises(UnsafeModelError, match=r"/metadata: no kerasSha256 for .*/model/model\.keras"):
        model_store.load_pipeline(spark, folder)


def flip_byte(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_a_flipped_byte_fails_the_hadoop_checksum(spark, folder):
    keras_file = os.path.join(stage(folder, 1), KERAS_FILE)
    flip_byte(keras_file)
    with pytest.raises(storage.ChecksumError, match=rf"{re.escape(keras_file)}: checksum failure"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_a_flipped_byte_without_crc_files_fails_the_sha256(spark, folder):
    keras_file = os.path.join(stage(folder, 1), KERAS_FILE)
    flip_byte(keras_file)
    drop_crc(folder)
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(keras_file)} does not match the checksum in its metadata"):
        model_store.load_pipeline(spark, folder)


def junk_zip() -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("config.json", "{not json")
    return buf.getvalue()


@pytest.mark.slow  # its module fixture fits a model: left to make test
@pytest.mark.parametrize("broken", ["truncated", "junk zip"])
def test_a_broken_archive_with_a_matching_sha256_is_named(spark, folder, broken):
    keras_stage = stage(folder, 1)
    keras_file = os.path.join(keras_stage, KERAS_FILE)
    with open(keras_file, "rb") as fh:
        data = fh.read()[: os.path.getsize(keras_file) // 2] if broken == "truncated" else junk_zip()
    with open(keras_file, "wb") as fh:
        fh.write(data)
    edit_metadata(keras_stage, lambda meta: meta.update({"kerasSha256": hashlib.sha256(data).hexdigest()}))
    drop_crc(folder)
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(keras_file)}: not a valid Keras archive \(\w+"):
        model_store.load_pipeline(spark, folder)


@pytest.mark.slow  # its module fixture fits a model: left to make test
def test_a_lambda_layer_is_refused_by_keras_safe_mode(spark, model, tmp_path):
    import keras
    inputs = keras.Input((3,))
    outputs = keras.layers.Lambda(lambda t: t[:, :1])(inputs)  # arbitrary Python in the archive
    unsafe = DistributedKerasModel(kerasBytes=network.keras_to_bytes(keras.Model(inputs, outputs)))
    path = str(tmp_path / "unsafe")
    PipelineModel([model.stages[0], unsafe]).write().save(path)
    keras_file = os.path.join(stage(path, 1), KERAS_FILE)
    with pytest.raises(UnsafeModelError, match=rf"{re.escape(keras_file)}: refused by Keras safe mode .*Lambda"):
        model_store.load_pipeline(spark, path)


# -- XGBoost's pickled callbacks --------------------------------------------------------------------

class _WritesOnUnpickle:
    """Unpickling calls ``Path.write_text``: what a crafted ``serialized_callbacks`` can do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import pathlib
        return pathlib.Path.write_text, (pathlib.Path(self.path), "unpickled")


@pytest.mark.parametrize("field", ["serialized_callbacks", "init_booster"])
def test_an_xgboost_stage_with_pickled_callbacks_or_an_init_booster_is_refused(spark, tmp_path, field):
    import base64
    import pickle

    from xgboost.spark import SparkXGBClassifier
    path = str(tmp_path / "xgb")
    SparkXGBClassifier(num_workers=1).save(path)
    marker = tmp_path / "pwned"
    payload = base64.encodebytes(pickle.dumps(_WritesOnUnpickle(marker))).decode("ascii")
    edit_metadata(path, lambda meta: meta.update({field: payload if field == "serialized_callbacks" else "b"}))
    if field == "serialized_callbacks":  # the hole: xgboost.spark's own load unpickles it
        SparkXGBClassifier.load(path)
        assert marker.read_text() == "unpickled"
        marker.unlink()
    with pytest.raises(UnsafeModelError, match=rf"xgb/metadata: field '{field}' is pickled code or a file"):
        model_store.load(spark, path)
    assert not marker.exists()
