"""Load a saved pipeline only after checking its folder, so that loading runs no code.

``PipelineModel.load(path)`` trusts the folder: for each stage it imports whatever module
the stage's ``metadata`` JSON names in ``class`` and calls that class's ``load`` on the
stage folder. A folder edited to name ``tensorflow.saved_model`` (or any installed
module) runs that module's import side effects and its ``load``. :func:`load_pipeline`
first reads every metadata file (nested pipelines included), checks each class against
:data:`ALLOWED_CLASSES` and every stage folder against the model folder, and only then
hands the folder to MLlib. The checks import nothing, so this module imports no stage
code either: the allow-list holds class names as strings, MLlib's here and the others
registered by the packages that own them (:func:`registered_classes`).

What stays trusted: whoever can write the folder can still swap in another valid model,
or change the folder between these checks and MLlib's reads. Protect the folder with
filesystem permissions (README: "Saved models: what loading checks").

Example
-------
>>> from sparkdeep import model_store
>>> model = model_store.load_pipeline(spark, "output/models/pipeline")  # doctest: +SKIP
>>> model.transform(df)                                                 # doctest: +SKIP
"""
from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from sparkdeep.storage import Storage

log = logging.getLogger(__name__)


class UnsafeModelError(ValueError):
    """A saved model folder that loading refuses: a class not on the allow-list, a path
    leaving the folder, malformed metadata, or a network file that fails its checks."""


def _names(prefix: str, names: str) -> frozenset[str]:
    return frozenset(f"{prefix}.{n}" for n in names.split())


_PIPELINE_MODELS = frozenset({"pyspark.ml.pipeline.PipelineModel", "org.apache.spark.ml.PipelineModel"})
_PIPELINES = _PIPELINE_MODELS | {"pyspark.ml.pipeline.Pipeline", "org.apache.spark.ml.Pipeline"}

#: Every ``class`` a metadata file may name, exactly as it is written there: MLlib's
#: JVM-backed stages are written by the JVM under ``org.apache.spark.ml...`` names,
#: Python stages under their module path. Estimators are listed so that a saved,
#: unfitted ``Pipeline`` loads too. Left out on purpose: ``SQLTransformer`` (its
#: statement is code), ``RFormula`` and the meta-estimators (``OneVsRest``,
#: ``CrossValidator``), whose nested stages MLlib loads past these checks.
_CORE_CLASSES: frozenset[str] = _PIPELINES | _names("org.apache.spark.ml.feature", """
    Binarizer Bucketizer BucketedRandomProjectionLSH BucketedRandomProjectionLSHModel
    ChiSqSelector ChiSqSelectorModel CountVectorizer CountVectorizerModel DCT
    ElementwiseProduct FeatureHasher HashingTF IDF IDFModel Imputer ImputerModel
    IndexToString Interaction MaxAbsScaler MaxAbsScalerModel MinHashLSH MinHashLSHModel
    MinMaxScaler MinMaxScalerModel NGram Normalizer OneHotEncoder OneHotEncoderModel PCA
    PCAModel PolynomialExpansion QuantileDiscretizer RegexTokenizer RobustScaler
    RobustScalerModel StandardScaler StandardScalerModel StopWordsRemover StringIndexer
    StringIndexerModel TargetEncoder TargetEncoderModel Tokenizer UnivariateFeatureSelector
    UnivariateFeatureSelectorModel VarianceThresholdSelector VarianceThresholdSelectorModel
    VectorAssembler VectorIndexer VectorIndexerModel VectorSizeHint VectorSlicer Word2Vec
    Word2VecModel""") | _names("org.apache.spark.ml.classification", """
    LogisticRegression LogisticRegressionModel LinearSVC LinearSVCModel
    DecisionTreeClassifier DecisionTreeClassificationModel RandomForestClassifier
    RandomForestClassificationModel GBTClassifier GBTClassificationModel NaiveBayes
    NaiveBayesModel MultilayerPerceptronClassifier MultilayerPerceptronClassificationModel
    FMClassifier FMClassificationModel""") | _names("org.apache.spark.ml.regression", """
    LinearRegression LinearRegressionModel GeneralizedLinearRegression
    GeneralizedLinearRegressionModel DecisionTreeRegressor DecisionTreeRegressionModel
    RandomForestRegressor RandomForestRegressionModel GBTRegressor GBTRegressionModel
    IsotonicRegression IsotonicRegressionModel AFTSurvivalRegression
    AFTSurvivalRegressionModel FMRegressor FMRegressionModel""") | _names(
    # the XGBoost baseline; its metadata is checked further (_XGBOOST_CODE)
    "xgboost.spark.estimator", """SparkXGBClassifier SparkXGBClassifierModel SparkXGBRegressor
    SparkXGBRegressorModel""")

#: The entry-point group through which a package lists the classes of its own that a saved
#: model folder may name: an entry point names a ``{module: "Class Class ..."}`` mapping in a
#: module of that package (sparkdeep's stages: ``transformers/_saved.py``, named in
#: pyproject.toml). A package lists only classes under its own package.
SAVED_CLASSES_GROUP = "sparkdeep.saved_classes"


def registered_classes() -> frozenset[str]:
    """Every class the installed packages register under :data:`SAVED_CLASSES_GROUP`.

    Reading an entry point imports only the module it names (a list of strings for
    sparkdeep's own): no stage is imported to learn what may be loaded.

    Raises
    ------
    UnsafeModelError
        When an entry point lists a class outside the package that registers it, or
        something other than a mapping of module names to class names.
    """
    names: set[str] = set()
    for ep in _entry_points():
        try:
            names |= _registered_by(ep)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop every model load
            log.warning("model_store: entry point %r (%s) in %s left out, its classes refused: %s",
                        ep.name, ep.value, SAVED_CLASSES_GROUP, exc)
    return frozenset(names)


def _registered_by(ep) -> frozenset[str]:
    """The classes one entry point lists, after its rules: a mapping of module names to class
    names, each module inside the entry point's own package, none in :data:`_RESERVED`, and
    sparkdeep's names from sparkdeep's distribution only."""
    where = f"entry point {ep.name!r} ({ep.value}) in {SAVED_CLASSES_GROUP}"
    owner = ep.module.rpartition(".")[0] or ep.module
    listed = ep.load()
    if not isinstance(listed, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in listed.items()):
        raise UnsafeModelError(f"{where}: must name a mapping of module names to space-separated class names")
    dist = (getattr(getattr(ep, "dist", None), "name", "") or "").lower()
    for module in listed:
        if module != owner and not module.startswith(owner + "."):
            raise UnsafeModelError(f"{where}: lists module {module!r}, outside its own package {owner!r}")
        top = module.split(".")[0]
        if top in _RESERVED or (top == __name__.split(".")[0] and dist != top):
            raise UnsafeModelError(f"{where}: lists module {module!r}; classes of {top!r} are allowed here or by "
                                   "its own distribution only")
    return frozenset().union(*(_names(m, c) for m, c in listed.items()))


#: Namespaces whose classes only this module's own list allows (MLlib's JVM and Python
#: names, XGBoost's, Py4J's): a registration cannot widen it to, say, SQLTransformer.
_RESERVED = frozenset({"org", "pyspark", "xgboost", "py4j", "builtins"})


def _entry_points() -> list:
    """The group's entry points of every distribution on the path. ``entry_points()`` keeps
    the first distribution of a name only, and a build's ``sparkdeep.egg-info`` in the
    working directory would then hide the installed metadata."""
    seen, found = set(), []
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points.select(group=SAVED_CLASSES_GROUP):
            if (ep.name, ep.value) not in seen:
                seen.add((ep.name, ep.value))
                found.append(ep)
    return found


#: Every ``class`` a metadata file may name, exactly as it is written there: MLlib's and
#: XGBoost's stages (:data:`_CORE_CLASSES`) and those the installed packages register
#: (:func:`registered_classes`; sparkdeep's own stages among them).
ALLOWED_CLASSES: frozenset[str] = _CORE_CLASSES | registered_classes()

#: Metadata fields ``xgboost.spark`` reads besides params: ``serialized_callbacks`` is a
#: cloudpickle its loader unpickles (code), ``init_booster`` a further file to read. Our
#: baselines write neither; a folder that has one is refused.
_XGBOOST_CODE = ("serialized_callbacks", "init_booster")

# MLlib names a stage folder ``<index>_<uid>``; a uid is a class-like prefix, "_" and hex.
# Anything with a separator could step out of ``stages/``.
_UID = re.compile(r"[A-Za-z0-9_.\-]+")


def python_class(name: str) -> str:
    """The Python class MLlib imports for a metadata ``class``.

    The same rule as ``pyspark.ml.util.DefaultParamsReader.loadParamsInstance``: a
    ``pyspark.ml.`` name as written, otherwise ``org.apache.spark`` becomes ``pyspark``.
    """
    return name if name.startswith("pyspark.ml.") else name.replace("org.apache.spark", "pyspark")


def check(spark: SparkSession, path: str) -> list[tuple[str, str]]:
    """Check a saved model folder without importing anything from it.

    Parameters
    ----------
    spark : SparkSession
        Reads the metadata files (any Hadoop path: local, ``file://``, ``hdfs://``).
    path : str
        The folder ``Pipeline.save`` / ``PipelineModel.save`` (or a stage's ``save``) wrote.

    Returns
    -------
    list of (str, str)
        ``(folder, class)`` of the folder and of every stage under it, depth first.

    Raises
    ------
    UnsafeModelError
        Naming the folder or file: a symbolic link out of a local folder, a missing or
        malformed metadata file, a class not in :data:`ALLOWED_CLASSES`, or a stage uid
        that would put the stage folder outside ``stages/``.
    """
    local = Storage(spark).local_path(path)
    if local is not None:
        _check_links(local)
    found: list[tuple[str, str]] = []
    _check_stage(spark, path, found)
    return found


def load(spark: SparkSession, path: str) -> Any:
    """Check ``path`` (:func:`check`), then load it with MLlib: a pipeline or one stage."""
    cls = check(spark, path)[0][1]
    module, _, name = python_class(cls).rpartition(".")
    # Only an allow-listed name reaches this import.
    return getattr(importlib.import_module(module), name).load(path)


def load_pipeline(spark: SparkSession, path: str):
    """Check ``path`` (:func:`check`), then ``PipelineModel.load`` it.

    Raises
    ------
    UnsafeModelError
        As :func:`check`, or when the folder holds something other than a fitted pipeline.
    """
    from pyspark.ml import PipelineModel

    folder, cls = check(spark, path)[0]
    if cls not in _PIPELINE_MODELS:
        raise UnsafeModelError(f"{folder}: holds a {cls}, not a fitted PipelineModel")
    return PipelineModel.load(path)


def _check_stage(spark: SparkSession, folder: str, found: list[tuple[str, str]]) -> None:
    meta = _read_metadata(spark, folder)
    cls = meta["class"]
    if cls not in ALLOWED_CLASSES:
        raise UnsafeModelError(
            f"{folder}: class {cls!r} in its metadata is not one sparkdeep loads (refused before "
            f"importing anything). If it is a legitimate stage, the package that owns it lists it under the "
            f"{SAVED_CLASSES_GROUP!r} entry point{_unregistered_hint(cls)}")
    if cls.startswith("xgboost."):
        extra = [k for k in _XGBOOST_CODE if k in meta]
        if extra:
            raise UnsafeModelError(f"{folder}/metadata: field {extra[0]!r} is pickled code or a file xgboost.spark "
                                   "would load; sparkdeep's XGBoost stages never write it (refused)")
    found.append((folder, cls))
    # A pipeline, or any class saved in MLlib's pipeline layout (SamplingPipeline does):
    # the stages under it are checked too, whoever registered the class.
    uids = meta.get("paramMap", {}).get("stageUids") if isinstance(meta.get("paramMap"), dict) else None
    if cls not in _PIPELINES and uids is None:
        return
    if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
        raise UnsafeModelError(f"{folder}/metadata: paramMap.stageUids must be a list of strings, got {uids!r}")
    for index, uid in enumerate(uids):
        if not _UID.fullmatch(uid):
            raise UnsafeModelError(f"{folder}/metadata: stage uid {uid!r} would name a folder outside "
                                   f"{folder}/stages; a uid has only letters, digits, '_', '.' and '-'")
        # The path PipelineSharedReadWrite.getStagePath builds.
        name = str(index).zfill(len(str(len(uids)))) + "_" + uid
        _check_stage(spark, os.path.join(folder, "stages", name), found)


def _unregistered_hint(cls: str) -> str:
    """Why one of sparkdeep's own classes is missing: no installed metadata registered them."""
    if not cls.startswith("sparkdeep.") or any(c.startswith("sparkdeep.") for c in ALLOWED_CLASSES):
        return ""
    return ("; no installed package registered sparkdeep's own stages: install sparkdeep (pip install), or put "
            "its wheel, or the zip scripts/package.sh copies from it, on the Python path")


def _read_metadata(spark: SparkSession, folder: str) -> dict:
    """The one JSON line MLlib's ``DefaultParamsReader.loadMetadata`` would read.

    Read the same way (``spark.read.text`` of ``<folder>/metadata``) so both see the same
    files; more than one line is refused, as MLlib would silently take the first.
    """
    where = os.path.join(folder, "metadata")
    try:
        lines = [r[0] for r in spark.read.text(where).collect() if r[0].strip()]
    except AnalysisException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsafeModelError(f"{where}: no metadata to read ({first})") from None
    except Exception as e:  # a Py4J error from the executor, whose text names the Java cause
        if "ChecksumException" not in str(e):
            raise
        raise UnsafeModelError(f"{where}: checksum failure (the metadata does not match its Hadoop "
                               ".crc side file: it was changed after it was written)") from e
    if len(lines) != 1:
        raise UnsafeModelError(f"{where}: holds {len(lines)} non-empty lines; MLlib metadata is one JSON line")
    try:
        meta = json.loads(lines[0])
    except json.JSONDecodeError as e:
        raise UnsafeModelError(f"{where}: metadata is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("class"), str) or not isinstance(meta.get("uid"), str):
        raise UnsafeModelError(f"{where}: metadata must be a JSON object with string 'class' and 'uid' fields")
    return meta


def _check_links(root: str) -> None:
    """No symbolic link under a local model folder may lead outside it."""
    real_root = os.path.realpath(root)
    for dirpath, dirnames, filenames in os.walk(root):  # links are listed, not followed
        for name in dirnames + filenames:
            entry = os.path.join(dirpath, name)
            if os.path.islink(entry):
                target = os.path.realpath(entry)
                if os.path.commonpath([target, real_root]) != real_root:
                    raise UnsafeModelError(f"{entry}: a symbolic link to {target}, outside the model folder {root}")


__all__ = ["ALLOWED_CLASSES", "SAVED_CLASSES_GROUP", "UnsafeModelError", "check", "load", "load_pipeline",
           "python_class", "registered_classes"]
