"""An export as an MLflow model: ``mlflow.pyfunc.load_model(uri).predict(pandas_df)`` scores
raw rows without Spark.

The MLflow model is MLflow's *custom pyfunc flavour with a loader module*: its ``MLmodel``
names this module (``loader_module: sparkdeep.pipelines.mlflow_model``) and its ``data/``
folder holds the export itself (``model.keras``, ``saved_model/``, ``schema.json``,
:func:`sparkdeep.pipelines.export.export_pipeline`). Loading it imports this installed
module and calls :func:`_load_pyfunc`, which loads the Keras file in safe mode
(:func:`~sparkdeep.pipelines.export.load_export`). Why not a ``PythonModel``: MLflow
cloudpickles one into the folder, and unpickling runs whatever code the pickle names;
"models from code" runs a Python file copied into the folder. Loading a saved model folder
must never run code it was not built to run, so the folder holds data only (no pickle, no
``code/``), and the code is the installed ``sparkdeep`` (a pip requirement of the model).

The signature is the raw columns the export reads (``schema.json``'s ``inputs``), under the
source's names, with the source's types:

===============================================  =====================
source type (``raw_type``)                       MLflow column type
===============================================  =====================
string                                           string
boolean                                          boolean
double, float, decimal                           double
bigint, int, smallint, tinyint, ... not nullable long
the same integer types, nullable                 double
===============================================  =====================

A nullable integer column is declared double, as MLflow advises ("Handling Integers With
Missing Values"): pandas holds an integer column with a missing value as float64, which
MLflow's enforcement refuses for a long column, so a long could never be sent null. Send
such a column as float64 (``df.astype({"n": float})``); a value that is not a whole number
is still refused, naming the column. Every input is ``required``: MLflow's ``required`` is
about a column being present, not about nulls, and a missing column is refused rather than
scored as null (a misspelt name is never scored as missing, as the HTTP scorer does).
Which columns may hold nulls is in the model's metadata (``sparkdeep.inputs``) and in
``schema.json``; a null in a column that may not hold one is refused naming it.

:meth:`ExportPyfunc.predict` answers a pandas DataFrame with the columns batch scoring and
the HTTP scorer (:mod:`sparkdeep.pipelines.serve`) give the task, in the input's row order
and index: binary ``probability`` (P(class 1)) and ``prediction`` (0.0 or 1.0); multiclass
``probability`` (a list, one per class), ``prediction`` (the class index) and
``predicted_class`` (its name, where the export names the classes); regression
``prediction``. A row whose outputs are not finite (numbers so far out that the network
overflows) gets NaN (and no class name) rather than failing its batch.

Example
-------
>>> path = save_mlflow_model("output/export/r1", "/tmp/r1-mlflow")  # doctest: +SKIP
>>> import mlflow  # doctest: +SKIP
>>> mlflow.pyfunc.load_model(path).predict(pd.DataFrame([{"colour": None, "x.a": 0.3}]))  # doctest: +SKIP
   probability  prediction
0     0.731059         1.0
"""
from __future__ import annotations

import math
import os

import numpy as np

from sparkdeep.pipelines import export as ex
from sparkdeep.pipelines.scoring import PREDICTED_CLASS, PREDICTION, PROBABILITY, RowChecker, Scorer, ServeOptions

#: The module MLflow imports to load the model (this one, under its installed name).
LOADER_MODULE = "sparkdeep.pipelines.mlflow_model"
#: The MLflow model's name in a run (its artifact path for ``runs:/<run id>/<name>``).
MODEL_NAME = "export_model"
#: The distributions the model needs, pinned to the versions it is saved with.
REQUIREMENTS = ("sparkdeep", "mlflow-skinny", "tensorflow-cpu", "keras", "pandas", "numpy")
#: The key of sparkdeep's entry in the MLmodel ``metadata``.
METADATA_KEY = "sparkdeep"

_INTEGRAL = ("bigint", "long", "int", "integer", "smallint", "short", "tinyint", "byte")
_FRACTIONAL = ("double", "float", "decimal")


# -- the signature ------------------------------------------------------------------------------

def input_type(entry: dict) -> str:
    """The MLflow column type (a ``DataType`` name) of one input of ``schema.json``; see the
    module's table."""
    raw = str(entry.get("raw_type") or entry["type"]).split("(")[0].lower()
    if raw == "string":
        return "string"
    if raw == "boolean":
        return "boolean"
    if raw in _INTEGRAL:
        return "double" if entry.get("nullable", True) else "long"
    if raw in _FRACTIONAL:
        return "double"
    raise ValueError(f"input {entry['name']!r}: source type {raw!r} has no MLflow column type here (the export reads "
                     "strings, booleans and numbers)")


def output_columns(schema: dict) -> list[str]:
    """The prediction columns of the export's task, in order (as the HTTP scorer names them)."""
    task = schema["task"]
    if task == "binary":
        return [PROBABILITY, PREDICTION]
    if task == "multiclass":
        return [PROBABILITY, PREDICTION] + ([PREDICTED_CLASS] if schema.get("classes") else [])
    return [PREDICTION]


def signature(schema: dict):
    """The ``ModelSignature`` of an export's ``schema.json``: its raw inputs by source name
    and type, its prediction columns."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, Schema

    inputs = [ColSpec(getattr(DataType, input_type(e)), e["name"], required=True) for e in schema["inputs"]]
    types = {PROBABILITY: Array(DataType.double) if schema["task"] == "multiclass" else DataType.double,
             PREDICTION: DataType.double, PREDICTED_CLASS: DataType.string}
    outputs = [ColSpec(types[c], c) for c in output_columns(schema)]
    return ModelSignature(Schema(inputs), Schema(outputs))


def input_example(schema: dict):
    """One row of neutral values under the raw names (0 for numbers, false, null for a
    string category): what the MLflow UI shows and ``mlflow models serve`` checks."""
    import pandas as pd
    neutral = {"string": None, "boolean": False, "long": 0, "double": 0.0}
    return pd.DataFrame([{e["name"]: neutral[input_type(e)] for e in schema["inputs"]}])


def requirements() -> list[str]:
    """The pip requirements of the model: :data:`REQUIREMENTS` at their installed versions."""
    from importlib import metadata
    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def _read_schema(export_dir: str) -> dict:
    import json
    with open(os.path.join(export_dir, ex.SCHEMA_FILE)) as fh:
        return json.load(fh)


# -- saving and logging -------------------------------------------------------------------------

def save_mlflow_model(export_dir: str, path: str, *, mlflow_model=None) -> str:
    """Write the export at ``export_dir`` as an MLflow model folder at ``path`` (which must
    not exist): ``MLmodel`` (pyfunc flavour, loader module :data:`LOADER_MODULE`, the
    signature of :func:`signature`), ``data/<export folder>``, the environment files and
    the input example. Returns ``path``.

    ``mlflow_model``: an ``mlflow.models.Model`` to fill (its run and logged-model ids),
    as :func:`log_mlflow_model` passes one."""
    import mlflow

    schema = _read_schema(export_dir)
    # The export loads and scores as written before it is wrapped (a broken one fails here).
    ExportPyfunc(ex.load_export(export_dir), traced=False).predict(input_example(schema))
    metadata = {METADATA_KEY: {
        "task": schema["task"], "classes": schema.get("classes"), "source": schema.get("source"),
        "inputs": [{"name": e["name"], "raw_type": e.get("raw_type"), "nullable": bool(e.get("nullable", True))}
                   for e in schema["inputs"]],
        "unused_columns": schema.get("unused_columns") or []}}
    mlflow.pyfunc.save_model(path, loader_module=LOADER_MODULE, data_path=os.path.abspath(export_dir),
                             signature=signature(schema), input_example=input_example(schema),
                             pip_requirements=requirements(), metadata=metadata, mlflow_model=mlflow_model)
    return path


def log_mlflow_model(cfg, paths, run_id: str | None, export_dir: str, *, mlflow_run: str | None = None,
                     name: str = MODEL_NAME) -> dict | None:
    """Log the export at ``export_dir`` as an MLflow model of the MLflow run ``mlflow_run``
    (else sparkdeep run ``run_id``'s, made if there is none): see
    :func:`sparkdeep.tracking.log_model`. None when tracking is off."""
    from mlflow.models import Model

    from sparkdeep import tracking

    def save(folder: str, ids: dict) -> None:
        save_mlflow_model(export_dir, folder, mlflow_model=Model(
            artifact_path=ids["artifact_location"], run_id=ids["run_id"], model_id=ids["model_id"],
            model_uuid=ids["model_id"]))

    return tracking.log_model(cfg, paths, run_id, save, name=name, mlflow_run=mlflow_run)


# -- loading and scoring (MLflow calls these) ---------------------------------------------------

class ExportPyfunc:
    """The MLflow pyfunc implementation of an export: :meth:`predict` takes raw rows (a
    pandas DataFrame, a list of dicts or one dict) and answers a DataFrame of the task's
    prediction columns."""

    def __init__(self, model: ex.ExportedModel, traced: bool = True):
        self.model, self.schema = model, model.schema
        self.names = [e["name"] for e in self.schema["inputs"]]
        self.columns = output_columns(self.schema)
        # Integer sources that may arrive as float64 (declared double: see the module's table).
        self.integral = {e["name"] for e in self.schema["inputs"]
                         if str(e.get("raw_type", "")).split("(")[0].lower() in _INTEGRAL}
        # The HTTP scorer's own check and scoring, so the three ways to score agree.
        self.checker = RowChecker(self.schema, ServeOptions(ignore_unknown=True))
        self.scorer = Scorer(model, traced=traced)

    def predict(self, model_input, params=None):
        import pandas as pd
        frame = ex._as_frame(model_input)
        missing = [n for n in self.names if n not in frame.columns]
        if missing:
            raise ValueError(f"the input has no column {missing[0]!r}; the model reads {self.names} (send null, "
                             "or NaN, for a missing value where the column is nullable)")
        records = frame[self.names].to_dict(orient="records") if len(frame) else []
        rows = self.checker.check([{k: self._value(k, v) for k, v in r.items()} for r in records])
        scored = self.scorer.score(rows) if rows else []
        k = int(self.schema.get("network", {}).get("outputs", 1))
        empty = {PROBABILITY: [math.nan] * k if self.model.task == "multiclass" else math.nan,
                 PREDICTION: math.nan, PREDICTED_CLASS: None}
        out = {c: [(p or empty)[c] for p in scored] for c in self.columns}
        frame_out = pd.DataFrame(out, columns=self.columns, index=frame.index)
        # A class index as batch scoring writes it (a double), NaN where the outputs are not finite.
        frame_out[PREDICTION] = frame_out[PREDICTION].astype("float64")
        if self.model.task == "binary":
            frame_out[PROBABILITY] = frame_out[PROBABILITY].astype("float64")
        return frame_out

    def _value(self, name: str, v):
        """A cell as the HTTP scorer's check takes it: None for a pandas null; a whole float
        of an integer source back to an int (a category ``3`` reads ``"3"``, as Spark casts
        the source's integer, not ``"3.0"``); anything else as it is, for the check to judge."""
        v = None if ex._is_null(v) else v
        if name in self.integral and isinstance(v, (float, np.floating)) and float(v).is_integer():
            return int(v)
        return v


def _load_pyfunc(data_path: str) -> ExportPyfunc:
    """MLflow's entry point: the export in ``data_path`` (the model's ``data/`` copy),
    loaded in Keras safe mode."""
    return ExportPyfunc(ex.load_export(data_path))


__all__ = ["ExportPyfunc", "LOADER_MODULE", "MODEL_NAME", "input_type", "log_mlflow_model", "output_columns",
           "requirements", "save_mlflow_model", "signature"]
