"""The export as an MLflow model (issue 27): ``mlflow.pyfunc.load_model(uri).predict(df)``
gives the exported model's scores, and so Spark's, per task on raw rows under the source's
names (dots, spaces, backticks, brackets, non-ASCII letters; unseen and null categories,
null numbers); the signature is the raw columns by name and type; the folder holds no
pickle and names only our loader module; a wrong-typed column is refused by name; the
export job logs it into the train run's MLflow run.

The pipelines are small ones (as test_serve's): a renamer, string indices, imputed numbers,
a seeded random network from test_export; made and exported once for the module.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from pyspark.ml.functions import vector_to_array
from pyspark.sql import types as T

from sparkdeep import tracking
from sparkdeep.config import load_config
from sparkdeep.jobs import export as export_job
from sparkdeep.paths import Paths
from sparkdeep.pipelines import export
from sparkdeep.pipelines import mlflow_model as mm
from tests.test_export import CLASSES, REPO, random_network

TASKS = ("binary", "multiclass", "regression")
#: Source names Spark SQL, Delta and MLlib would each trip on.
ODD = "a.b `c` é 名"
PRICE = "price [USD] ✓ x.y"
RAW = T.StructType([T.StructField("id", T.LongType()), T.StructField(ODD, T.StringType()),
                    T.StructField("member", T.BooleanType()), T.StructField("k", T.LongType()),
                    T.StructField(PRICE, T.DoubleType()),
                    T.StructField("n", T.LongType(), nullable=False), T.StructField("m", T.LongType()),
                    T.StructField("label", T.DoubleType())])
#: The signature's inputs: the raw columns the pipeline reads, by source name and type.
SIGNATURE = [(ODD, "string"), ("member", "boolean"), ("k", "double"), (PRICE, "double"), ("n", "long"),
             ("m", "double")]
#: The nullable integer sources, declared double: sent as float64, as pandas holds them with a null.
AS_FLOAT = {"k": "float64", "m": "float64"}
TOL = 1e-6


def pipeline(spark, task: str):
    """A fitted scoring pipeline on the odd source names: a renamer (a boolean and an
    integer categorical among the sources), string indices, imputed numbers (a
    non-nullable and a nullable long), a seeded random network, class names for multiclass."""
    from pyspark.ml import PipelineModel
    from pyspark.ml.feature import Imputer, IndexToString, StringIndexer, VectorAssembler

    from sparkdeep.transformers.columns import ColumnRenamer
    numbers = ["price", "n", "m"]
    fit_rows = spark.createDataFrame([("red", "true", "1", 1.0, 3, 40), ("green", "false", "2", 2.0, 5, None),
                                      ("blue", None, None, None, 7, 10), ("red", "true", "1", 0.5, 1, 20)],
                                     "colour string, member string, k string, price double, n long, m long")
    stages = [ColumnRenamer(originals=[ODD, PRICE], internals=["colour", "price"], stringCols=["member", "k"]),
              StringIndexer(inputCols=["colour", "member", "k"], outputCols=["c_i", "m_i", "k_i"],
                            handleInvalid="keep").fit(fit_rows),
              Imputer(inputCols=numbers, outputCols=[f"{c}_imp" for c in numbers]).fit(fit_rows),
              VectorAssembler(inputCols=["c_i", "m_i", "k_i", *(f"{c}_imp" for c in numbers)], outputCol="features"),
              random_network(task, None, 6)]
    if task == "multiclass":
        stages.append(IndexToString(inputCol="prediction", outputCol="predicted_class", labels=CLASSES))
    return PipelineModel(stages)


def probe(seed: int = 5) -> list[dict]:
    """Raw rows: ordinary ones, then an unseen category, null ones, null numbers, numbers
    far outside the training range, -0.0, an unseen and a null integer category."""
    rng = np.random.default_rng(seed)
    base = {"id": 0, ODD: "red", "member": True, "k": 1, PRICE: 1.5, "n": 4, "m": 30, "label": 0.0}
    out = [{**base, ODD: str(rng.choice(["red", "green", "blue"])), "member": bool(rng.integers(2)),
            "k": int(rng.integers(1, 3)),
            PRICE: float(rng.normal()), "n": int(rng.integers(0, 9)), "m": int(rng.integers(0, 50))}
           for _ in range(10)]
    out += [{**base, ODD: "purple"}, {**base, ODD: None}, {**base, ODD: ""}, {**base, "member": None},
            {**base, PRICE: None, "m": None}, {**base, PRICE: 1e6, "n": 10**6, "m": -(10**6)},
            {**base, PRICE: -0.0}, {**base, "k": None}, {**base, "k": 99}]
    return [{**r, "id": i} for i, r in enumerate(out)]


def spark_scores(spark, model, task: str, rows: list[dict]) -> dict[str, np.ndarray]:
    """Spark's outputs for ``rows`` in order: the probability (binary P(1), multiclass the
    vector), the prediction, the class name."""
    scored = model.transform(spark.createDataFrame([tuple(r[f.name] for f in RAW.fields) for r in rows], RAW))
    cols = ["prediction"] + ([vector_to_array("probability").alias("p")] if task != "regression" else []) + \
        (["predicted_class"] if task == "multiclass" else [])
    got = scored.orderBy("id").select(*cols).collect()
    out = {"prediction": np.array([r["prediction"] for r in got], dtype="float64")}
    if task == "binary":
        out["probability"] = np.array([r["p"][1] for r in got])
    elif task == "multiclass":
        out["probability"] = np.array([r["p"] for r in got])
        out["predicted_class"] = np.array([r["predicted_class"] for r in got], dtype=object)
    return out


@pytest.fixture(scope="module")
def saved(spark, tmp_path_factory):
    """{task: {"export", "mlflow", "rows", "spark"}}: each task's export folder and its MLflow
    model folder, the probe rows and Spark's outputs on them."""
    tmp = tmp_path_factory.mktemp("mlflow_model")
    out = {}
    for task in TASKS:
        model = pipeline(spark, task)
        folder = export.export_pipeline(model, str(tmp / task), raw_schema=RAW)["out_dir"]
        rows = probe()
        out[task] = {"export": folder, "mlflow": mm.save_mlflow_model(folder, str(tmp / f"{task}_mlflow")),
                     "rows": rows, "spark": spark_scores(spark, model, task, rows)}
    return out


def _close(got, want, what: str):
    got, want = np.asarray(got, dtype="float64"), np.asarray(want, dtype="float64")
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL, err_msg=what)


def _check(task: str, got: pd.DataFrame, exported: export.ExportedModel, frame: pd.DataFrame, spark: dict):
    assert list(got.columns) == mm.output_columns(exported.schema), task
    assert list(got.index) == list(frame.index)
    key = "prediction" if task == "regression" else "probability"
    scores = np.stack(got[key].to_numpy()) if task == "multiclass" else got[key].to_numpy()
    _close(scores, exported.predict(frame), f"{task}: MLflow vs the export")
    _close(scores, spark[key], f"{task}: MLflow vs Spark")
    assert got["prediction"].dtype == np.float64
    if task != "regression":
        assert got["prediction"].tolist() == spark["prediction"].tolist()
    if task == "multiclass":
        assert got["predicted_class"].tolist() == spark["predicted_class"].tolist()


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("task", TASKS)
def test_the_mlflow_model_predicts_as_the_export_and_spark(saved, task):
    import mlflow
    s = saved[task]
    frame = pd.DataFrame(s["rows"]).astype(AS_FLOAT).set_index(pd.Index([f"r{i}" for i in range(len(s["rows"]))]))
    got = mlflow.pyfunc.load_model(s["mlflow"]).predict(frame)
    _check(task, got, export.load_export(s["export"]), frame, s["spark"])
    # The unseen and the null category score alike (Spark's 'keep' index), "" apart from neither here.
    # Alike up to float noise: two rows of one batch may round apart in the last bits (2e-19 seen).
    for a, b in ((10, 11), (-1, -2)):  # then an unseen and a null integer category alike
        left, right = got.iloc[a].tolist(), got.iloc[b].tolist()
        assert len(left) == len(right)
        for x, y in zip(left, right):
            assert (np.allclose(x, y, rtol=1e-6, atol=1e-12) if not isinstance(x, str) else x == y), (left, right)


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_the_signature_is_the_raw_columns_by_source_name_and_type(saved):
    import mlflow
    for task, s in saved.items():
        sig = mlflow.models.get_model_info(s["mlflow"]).signature
        assert [(c.name, c.type.name) for c in sig.inputs.inputs] == SIGNATURE, task
        assert all(c.required for c in sig.inputs.inputs)
        assert [c.name for c in sig.outputs.inputs] == mm.output_columns(json.load(
            open(os.path.join(s["export"], "schema.json"))))
        meta = mlflow.models.Model.load(s["mlflow"]).metadata["sparkdeep"]
        assert {i["name"]: i["nullable"] for i in meta["inputs"]} == {ODD: True, "member": True, "k": True,
                                                                     PRICE: True, "n": False, "m": True}
        assert meta["task"] == task and meta["unused_columns"] == ["id", "label"]
    probability = mlflow.models.get_model_info(saved["multiclass"]["mlflow"]).signature.outputs.inputs[0]
    assert probability.name == "probability" and probability.type.to_dict()["type"] == "array"


def test_each_source_type_has_its_mlflow_type():
    cases = {("string", True): "string", ("boolean", True): "boolean", ("double", False): "double",
             ("float", True): "double", ("decimal(10,2)", True): "double", ("bigint", False): "long",
             ("int", False): "long", ("smallint", False): "long", ("bigint", True): "double", ("int", True): "double"}
    for (raw, nullable), want in cases.items():
        assert mm.input_type({"name": "c", "type": "double", "raw_type": raw, "nullable": nullable}) == want, raw
    with pytest.raises(ValueError, match="'d'.*'date'"):
        mm.input_type({"name": "d", "type": "double", "raw_type": "date", "nullable": True})


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_the_folder_holds_data_only_and_names_our_loader_module(saved):
    folder = saved["binary"]["mlflow"]
    files = [os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs]
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".cloudpickle", ".py", ".pyc"))], files
    meta = yaml.safe_load(open(os.path.join(folder, "MLmodel")))
    assert list(meta["flavors"]) == ["python_function"]
    flavor = meta["flavors"]["python_function"]
    assert flavor["loader_module"] == "sparkdeep.pipelines.mlflow_model" == mm.LOADER_MODULE
    assert not {"python_model", "cloudpickle_version", "artifacts"} & set(flavor) and not flavor.get("code")
    data = os.path.join(folder, flavor["data"])
    assert {"model.keras", "schema.json", "saved_model"} <= set(os.listdir(data))
    reqs = open(os.path.join(folder, "requirements.txt")).read().split()
    assert any(r.startswith("sparkdeep==") for r in reqs) and not any(r.startswith("cloudpickle") for r in reqs)


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_a_wrong_typed_or_missing_column_is_refused_naming_it(saved):
    import mlflow
    from mlflow.exceptions import MlflowException
    s = saved["regression"]
    model = mlflow.pyfunc.load_model(s["mlflow"])
    # A nullable integer column is a double (MLflow's advice): sent as float64, as pandas holds
    # it once a value is missing. Integers without a null (int64) are refused by MLflow, naming it.
    frame = pd.DataFrame(s["rows"][:3]).astype(AS_FLOAT)
    _close(model.predict(frame)["prediction"], s["spark"]["prediction"][:3], "k and m as float64")
    with pytest.raises(MlflowException, match="column m. Can not safely convert int64 to float64"):
        model.predict(frame.astype({"m": "int64"}))
    # MLflow's schema enforcement: a number column of strings.
    with pytest.raises(MlflowException, match=f"column {re.escape(PRICE)}"):
        model.predict(frame.assign(**{PRICE: ["1.5", "x", "2"]}))
    # Ours behind it: a string category given a number (MLflow passes object columns through),
    # a whole number given a fraction, a missing column.
    with pytest.raises(Exception, match=f"row 1, column '{re.escape(ODD)}': expected a string category, got the number 3"):
        model.predict(frame.assign(**{ODD: ["red", 3, "blue"]}))
    with pytest.raises(Exception, match="row 0, column 'm': expected an integer"):
        model.predict(frame.assign(m=[2.5, 1.0, None]))
    with pytest.raises(Exception, match=re.escape(f"missing inputs ['{PRICE}']")):
        model.predict(frame.drop(columns=[PRICE]))
    # The loader module's own object, without MLflow's enforcement, names the column too.
    raw = mm._load_pyfunc(os.path.join(s["mlflow"], "data", os.path.basename(s["export"])))
    with pytest.raises(ValueError, match=f"column '{re.escape(PRICE)}': expected a number, got the string 'x'"):
        raw.predict(frame.assign(**{PRICE: [1.0, "x", 2.0]}))
    with pytest.raises(ValueError, match="no column 'member'"):
        raw.predict(frame.drop(columns=["member"]))
    assert list(raw.predict(frame.iloc[:0]).columns) == ["prediction"]  # no rows: no scores, the columns


@pytest.mark.slow
def test_a_new_process_loads_the_mlflow_models_and_runs_no_code_from_their_folders(saved, tmp_path):
    jobs = {task: {"dir": s["mlflow"], "rows": s["rows"], "out": str(tmp_path / task)} for task, s in saved.items()}
    code = (
        "import json, os, sys, numpy as np, pandas as pd, mlflow\n"
        "jobs = json.loads(sys.argv[1])\n"
        "for task, j in jobs.items():\n"
        "    got = mlflow.pyfunc.load_model(j['dir']).predict(pd.DataFrame(j['rows']).astype(json.loads(sys.argv[2])))\n"
        "    p = got['prediction' if task == 'regression' else 'probability']\n"
        "    np.save(j['out'] + '.npy', np.stack(p.to_numpy()) if task == 'multiclass' else p.to_numpy())\n"
        "    inside = [m for m, v in list(sys.modules.items())\n"
        "              if os.path.realpath(getattr(v, '__file__', None) or '/').startswith(os.path.realpath(j['dir']))]\n"
        "    assert not inside, inside\n"
        "    assert not [p for p in sys.path if os.path.realpath(p).startswith(os.path.realpath(j['dir']))]\n"
        # MLflow imports pyspark where it is installed; no Spark (a JVM) is started.
        "assert 'pyspark' not in sys.modules or sys.modules['pyspark'].SparkContext._active_spark_context is None\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(jobs), json.dumps(AS_FLOAT)], capture_output=True,
                          text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task, s in saved.items():
        _close(np.load(jobs[task]["out"] + ".npy"), s["spark"]["prediction" if task == "regression" else "probability"],
               task)


# -- logged into MLflow ------------------------------------------------------------------------------

def _cfg(out, *extra):
    return load_config(os.path.join(REPO, "conf"), env="ci", overrides=[f"output_dir={out}", *extra])


@pytest.mark.slow  # its module fixture fits a pipeline: left to make test
def test_the_export_job_logs_it_into_the_train_run_and_loads_by_both_uris(saved, tmp_path):
    import mlflow
    from mlflow.entities import LoggedModelStatus
    cfg = _cfg(tmp_path / "out")
    paths = Paths.under(cfg.output_dir)
    s = saved["multiclass"]
    info = {"run_id": "r1", "out_dir": s["export"]}
    # No store yet: by default nothing is logged, and no store is made to find that out.
    assert export_job._log_mlflow(cfg, paths, info, None) is None
    assert not os.path.exists(os.path.join(paths.root, "mlflow"))
    assert export_job._log_mlflow(_cfg(tmp_path / "out", "tracking.enabled=false"), paths, info, True) is None
    train_run = tracking.step_run(cfg, paths, "r1")  # the train step's MLflow run
    assert tracking.existing_run(cfg, paths, "r1") == train_run and tracking.existing_run(cfg, paths, "r2") is None
    assert export_job._log_mlflow(cfg, paths, info, False) is None

    logged = export_job._log_mlflow(cfg, paths, info, None)
    assert logged["mlflow_run_id"] == train_run and logged["run_uri"] == f"runs:/{train_run}/export_model"
    assert logged["model_uri"] == f"models:/{logged['model_id']}"
    client = mlflow.MlflowClient(logged["uri"])
    model = client.get_logged_model(logged["model_id"])
    assert model.source_run_id == train_run and model.name == "export_model" and model.status == LoggedModelStatus.READY
    assert [o.model_id for o in client.get_run(train_run).outputs.model_outputs] == [logged["model_id"]]
    frame = pd.DataFrame(s["rows"]).astype(AS_FLOAT)
    mlflow.set_tracking_uri(logged["uri"])
    try:
        for uri in (logged["model_uri"], logged["run_uri"]):
            loaded = mlflow.pyfunc.load_model(uri)
            assert loaded.metadata.model_id == logged["model_id"]
            _check("multiclass", loaded.predict(frame), export.load_export(s["export"]), frame, s["spark"])
    finally:
        mlflow.set_tracking_uri(None)

    # --mlflow without a train run: a new MLflow run tagged with the run id.
    other = export_job._log_mlflow(cfg, paths, {**info, "run_id": "r2"}, True)
    assert other["mlflow_run_id"] != train_run == tracking.existing_run(cfg, paths, "r1")
    assert tracking.existing_run(cfg, paths, "r2") == other["mlflow_run_id"]


def test_the_job_refuses_mlflow_with_tracking_off_before_exporting(tmp_path, capsys):
    assert export_job.main(["--output-dir", str(tmp_path), "--set", "tracking.enabled=false", "--mlflow"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "--mlflow needs tracking on" in err[0]
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_export_job_logs_the_promoted_export_into_its_train_run_and_prints_the_uri(spark, saved, tmp_path):
    """The job in its own process, as a scheduler runs it: the promoted binary pipeline (run
    r1, whose train step made an MLflow run) exported and logged by default; the printed
    ``models:/`` URI loads here and scores as Spark does."""
    import mlflow

    from sparkdeep import delta_io
    from sparkdeep.names import ORIGINAL_NAME
    from sparkdeep.paths import tree_digest, write_json
    from sparkdeep.registry import Models, Tables
    paths = Paths.under(str(tmp_path / "output"))
    folder = paths.model(Models.PIPELINE, "r1")
    pipeline(spark, "binary").write().overwrite().save(folder)
    internal = {ODD: "colour", PRICE: "price"}  # the holdout as ingest writes it: internal names, sources in metadata
    fields = [T.StructField(internal.get(f.name, f.name), f.dataType, f.nullable,
                            {ORIGINAL_NAME: f.name} if f.name in internal else {}) for f in RAW.fields]
    rows = [tuple(r[f.name] for f in RAW.fields) for r in probe()[:5]]
    ref = delta_io.write(spark.createDataFrame(rows, T.StructType(fields)), paths.table(Tables.HOLDOUT))
    write_json(paths.latest, {"run_id": "r1", "models": {Models.PIPELINE: {"path": folder, "digest": tree_digest(folder)}},
                              "tables": {Tables.HOLDOUT: ref.version}})
    train_run = tracking.step_run(_cfg(paths.root), paths, "r1")
    proc = subprocess.run([sys.executable, "-m", "sparkdeep.jobs.export", "--output-dir", paths.root, "--env", "ci"],
                          capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    logged = result["mlflow"]
    assert logged["mlflow_run_id"] == train_run and logged["run_uri"] == f"runs:/{train_run}/export_model"
    assert f"[export] MLflow model {logged['model_uri']}" in proc.stdout
    mlflow.set_tracking_uri(logged["uri"])
    try:
        model = mlflow.pyfunc.load_model(logged["model_uri"])
    finally:
        mlflow.set_tracking_uri(None)
    # A column the signature declares double (a nullable integer) is sent as float64.
    doubles = {c.name: "float64" for c in model.metadata.get_input_schema().inputs if c.type.name == "double"}
    got = model.predict(pd.DataFrame(saved["binary"]["rows"]).astype(doubles))
    _close(got["probability"], saved["binary"]["spark"]["probability"], "the job's MLflow model vs Spark")
