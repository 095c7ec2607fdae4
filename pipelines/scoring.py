"""Score rows with an export, without Spark and without HTTP: the rows checked, then one
traced forward pass.

:class:`RowChecker` turns request rows (JSON objects under the source's column names) into
the export's inputs or refuses them naming the row, field and value; :class:`Scorer` runs
the export's network as one traced graph and answers in batch scoring's columns. The
HTTP server (:mod:`sparkdeep.pipelines.serve`), the MLflow model
(:mod:`sparkdeep.pipelines.mlflow_model`) and the compress step's measurements use them.

What a request may hold (over HTTP each refusal is a 4xx with ``{"error": ..., "field": ...,
"value": ..., "row": ...}``, never a 500):

- 400: an empty body, a body that is not JSON (``NaN`` and ``Infinity`` are not JSON: send
  ``null``), a body that is neither an object nor a list, ``rows`` that is not a list or is
  empty, a row that is not an object;
- 413: a body over ``max_body_bytes``, more than ``max_request_rows`` rows;
- 422: a row without a column the model reads (a nullable one too: send ``null``, so a
  misspelt column is never scored as missing), a column the export does not know (unless
  ``ignore_unknown``; the raw columns the pipeline does not read, ``unused_columns`` in
  ``schema.json``, such as the key and the label, are always accepted and ignored),
  ``null`` where the schema says the column is not nullable, a value of the wrong JSON type,
  a number out of the double range, a non-finite output (a value so far out that the
  network overflows).

Types follow the source's column types (``raw_type`` in ``schema.json``), because that is
what the batch pipeline reads: a number column takes a JSON number (not a numeric string,
not ``true``); a categorical column whose source type is a string takes a JSON string only
(not ``3``: the source could not hold one); one whose source is a boolean or a number takes
that JSON type and is cast to a string as Spark casts it (``true`` -> ``"true"``).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import numpy as np

from sparkdeep.pipelines import export as ex
from sparkdeep.registry import Columns, Tables

#: The names batch scoring gives: the response's list is named after its predictions table,
#: each prediction's fields after that table's columns.
PREDICTIONS = Tables.PREDICTIONS
PREDICTION, PROBABILITY, PREDICTED_CLASS = Columns.PREDICTION, Columns.PROBABILITY, Columns.PREDICTED_CLASS

log = logging.getLogger(__name__)

_INTEGRAL = ("int", "integer", "bigint", "long", "smallint", "short", "tinyint", "byte")
_FRACTIONAL = ("double", "float", "decimal")


@dataclass(frozen=True)
class ServeOptions:
    """How the server batches and what it accepts. Each default lives here; the job's
    arguments default to these."""
    #: Rows scored in one forward pass at most (a larger request is scored alone).
    max_batch_rows: int = 256
    #: How long the first request of a batch waits for others to join it (0: no wait).
    max_wait_ms: float = 5.0
    #: The largest request body read (413 beyond).
    max_body_bytes: int = 8 * 1024 * 1024
    #: The most rows one request may hold (413 beyond).
    max_request_rows: int = 10_000
    #: Accept (and ignore) columns the export does not know, instead of refusing them.
    ignore_unknown: bool = False
    #: Run the model as a traced graph (:class:`Scorer`); False: eagerly, as ``ExportedModel.predict``.
    traced: bool = True

    def __post_init__(self):
        for name in ("max_batch_rows", "max_body_bytes", "max_request_rows"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        if not self.max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be 0 or more, got {self.max_wait_ms!r}")


class BadRequest(ValueError):
    """A request the server refuses: its HTTP status, and the field and value at fault."""

    def __init__(self, status: int, message: str, *, field: str | None = None, value=None, row: int | None = None):
        super().__init__(message)
        self.status, self.field, self.value, self.row = status, field, value, row

    def body(self) -> dict:
        out = {"error": str(self)}
        if self.field is not None:
            out["field"] = self.field
            out["value"] = _short(self.value)
        if self.row is not None:
            out["row"] = self.row
        return out


def _short(value, limit: int = 200):
    """``value`` as the error quotes it: itself when small, else a cut repr."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # inf is no JSON value
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def reject_constant(name: str):
    """``json.loads``'s ``parse_constant``: ``NaN`` and ``Infinity`` are refused, not read."""
    raise ValueError(f"{name} is not JSON; send null for a missing number")


# -- what a request may hold ----------------------------------------------------------------

class RowChecker:
    """Checks rows against an export's ``schema.json`` and keeps only the inputs the model
    reads, with their values as :meth:`ExportedModel.predict` takes them."""

    def __init__(self, schema: dict, options: ServeOptions):
        self.inputs = {e["name"]: e for e in schema["inputs"]}
        self.unused = set(schema.get("unused_columns") or [])
        self.options = options

    def rows_of(self, body) -> list:
        """The rows of a parsed request body (not checked yet)."""
        if isinstance(body, dict):
            if "rows" in body and "rows" not in self.inputs:
                rows = body["rows"]
                if not isinstance(rows, list):
                    raise BadRequest(400, f"'rows' must be a list of row objects, got {type(rows).__name__}",
                                     field="rows", value=rows)
                if len(body) > 1:
                    extra = sorted(k for k in body if k != "rows")
                    raise BadRequest(400, f"the body holds {extra} beside 'rows'; put the columns in the rows",
                                     field=extra[0], value=body[extra[0]])
            else:
                rows = [body]
        elif isinstance(body, list):
            rows = body
        else:
            raise BadRequest(400, f"the body must be a JSON object (one row, or {{\"rows\": [...]}}) or a list of "
                                  f"rows, got {type(body).__name__}", field="body", value=body)
        if not rows:
            raise BadRequest(400, "'rows' is empty: send at least one row", field="rows", value=rows)
        if len(rows) > self.options.max_request_rows:
            raise BadRequest(413, f"{len(rows)} rows in one request, more than max_request_rows="
                                  f"{self.options.max_request_rows}; split the request",
                             field="rows", value=len(rows))
        return rows

    def check(self, rows: list) -> list[dict]:
        """Each row as ``{input name: value}`` (the inputs only), or :class:`BadRequest`
        naming the first fault."""
        out = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise BadRequest(400, f"row {i} must be an object of column: value, got {type(row).__name__}",
                                 field="rows", value=row, row=i)
            unknown = [k for k in row if k not in self.inputs and k not in self.unused]
            if unknown and not self.options.ignore_unknown:
                raise BadRequest(422, f"row {i} has column {unknown[0]!r}, which the model does not know (it reads "
                                      f"{list(self.inputs)})", field=unknown[0], value=row[unknown[0]], row=i)
            missing = [n for n in self.inputs if n not in row]
            if missing:
                raise BadRequest(422, f"row {i} has no column {missing[0]!r} (send null for a missing value where "
                                      f"the column is nullable); the model reads {list(self.inputs)}",
                                 field=missing[0], value=None, row=i)
            out.append({n: self._value(i, e, row[n]) for n, e in self.inputs.items()})
        return out

    @staticmethod
    def _value(i: int, e: dict, v):
        name, raw = e["name"], str(e.get("raw_type", "")).split("(")[0]
        if v is None:
            if not e.get("nullable", True):
                raise BadRequest(422, f"row {i}, column {name!r}: null, but the column is not nullable",
                                 field=name, value=v, row=i)
            return None
        if e["type"] == ex.DOUBLE:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise BadRequest(422, f"row {i}, column {name!r}: expected a number, got {_kind(v)} {_short(v)!r}",
                                 field=name, value=v, row=i)
            if raw in _INTEGRAL and isinstance(v, float) and not v.is_integer():
                raise BadRequest(422, f"row {i}, column {name!r}: expected an integer ({raw}), got {v!r}",
                                 field=name, value=v, row=i)
            try:
                x = float(v)
            except OverflowError:
                x = math.inf
            if not math.isfinite(x):
                raise BadRequest(422, f"row {i}, column {name!r}: {_short(v)!r} is out of the double range",
                                 field=name, value=v, row=i)
            return v
        # A categorical input: the JSON type its source column has.
        if raw == "string" and not isinstance(v, str):
            raise BadRequest(422, f"row {i}, column {name!r}: expected a string category, got {_kind(v)} "
                                  f"{_short(v)!r} (the source column is a string; quote it)",
                             field=name, value=v, row=i)
        if raw == "boolean" and not isinstance(v, bool):
            raise BadRequest(422, f"row {i}, column {name!r}: expected true or false, got {_kind(v)} {_short(v)!r}",
                             field=name, value=v, row=i)
        if raw in _INTEGRAL and (isinstance(v, bool) or not isinstance(v, int)):
            raise BadRequest(422, f"row {i}, column {name!r}: expected an integer category ({raw}), got "
                                  f"{_kind(v)} {_short(v)!r}", field=name, value=v, row=i)
        if raw in _FRACTIONAL and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise BadRequest(422, f"row {i}, column {name!r}: expected a number category ({raw}), got "
                                  f"{_kind(v)} {_short(v)!r}", field=name, value=v, row=i)
        if not isinstance(v, (str, bool, int, float)):
            raise BadRequest(422, f"row {i}, column {name!r}: expected a category (a string), got {_kind(v)}",
                             field=name, value=v, row=i)
        return v


def _kind(v) -> str:
    return {bool: "a boolean", str: "the string", int: "the number", float: "the number", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


# -- scoring --------------------------------------------------------------------------------

class Scorer:
    """An :class:`~sparkdeep.pipelines.export.ExportedModel` turned into the predictions'
    JSON rows of its task.

    ``traced`` runs the export's graph as one ``tf.function`` with a fixed signature (any
    number of rows, traced once): an eager call of the graph (``ExportedModel.predict``)
    costs 15-25 ms of per-op dispatch whatever the rows, the traced one about 1 ms. The
    scores are the same kernels' (within float32 rounding, ~1e-7)."""

    def __init__(self, model: ex.ExportedModel, traced: bool = True):
        self.model, self.task, self.classes = model, model.task, model.classes
        # Two softmax units: Spark's prediction is their first argmax (P(1) > 0.5), one
        # sigmoid unit P(1) >= 0.5 (DistributedKerasModel).
        self.two_units = int(model.schema.get("network", {}).get("outputs", 1)) == 2
        self._call = self._forward
        if traced:
            import tensorflow as tf
            signature = {e["keras_name"]: tf.TensorSpec((None, 1), tf.string if e["type"] == ex.STRING else tf.float64,
                                                        name=e["keras_name"]) for e in model.schema["inputs"]}
            self._call = tf.function(self._forward, input_signature=[signature], autograph=False)

    def _forward(self, inputs: dict):
        return self.model.model(inputs, training=False)

    def outputs(self, rows: list[dict]) -> dict[str, np.ndarray]:
        """Every output for checked rows, by name, as ``ExportedModel.outputs`` gives them."""
        import pandas as pd
        got = self._call(self.model.inputs(pd.DataFrame.from_records(rows, columns=list(rows[0]))))
        out = {}
        for k, v in got.items():
            v = v.numpy()
            out[k] = np.array([b.decode() for b in v[:, 0]], dtype=object) if v.dtype == object else v
        return out

    def score(self, rows: list[dict]) -> list[dict]:
        """The predictions of checked rows, in order; a row whose outputs are not finite
        gets ``None`` (the caller refuses it)."""
        out = self.outputs(rows)
        if self.task == "binary":
            p = out[ex.PROBABILITY][:, 0].astype("float64")
            pred = (p > 0.5) if self.two_units else (p >= 0.5)
            return [None if not math.isfinite(a) else {PROBABILITY: float(a), PREDICTION: int(b)}
                    for a, b in zip(p, pred)]
        if self.task == "multiclass":
            p = out[ex.PROBABILITIES].astype("float64")
            best = np.argmax(p, axis=1)
            names = out.get(ex.PREDICTED_CLASS)
            res = []
            for k in range(len(p)):
                if not np.isfinite(p[k]).all():
                    res.append(None)
                    continue
                one = {PROBABILITY: p[k].tolist(), PREDICTION: int(best[k])}
                if names is not None:
                    one[PREDICTED_CLASS] = str(names[k])
                res.append(one)
            return res
        y = out[ex.PREDICTION][:, 0].astype("float64")
        return [None if not math.isfinite(a) else {PREDICTION: float(a)} for a in y]
