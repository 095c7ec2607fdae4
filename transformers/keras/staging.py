"""The driver's side of the rows: the features as the ranks see them, the slots Spark has,
and one pass over the rows before any rank starts (lengths, unusable rows, label range)."""
from __future__ import annotations

import logging
import time

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep.names import quoted

from .contract import Staged

log = logging.getLogger(__name__)


def float_arrays(schema: T.StructType, fcol: str):
    """The features as ``array<float>`` (what the network sees); a null vector stays null
    (``vector_to_array`` itself fails on null)."""
    col = F.col(quoted(fcol))  # any name: a dot or a backtick in it is not a path
    if isinstance(schema[fcol].dataType, VectorUDT):
        return F.when(col.isNotNull(), vector_to_array(col, "float32"))
    return col.cast("array<float>")

def task_slots(sc, wanted: int, wait_s: float = 60.0) -> int:
    """Tasks Spark can run at once now: the executors' free cores over ``spark.task.cpus``
    (what barrier mode checks), not ``spark.default.parallelism`` from the config. On a
    cluster, executors may still be registering: wait up to ``wait_s`` for ``wanted``."""
    jsc = sc._jsc.sc()
    deadline = time.time() + (0 if sc.master.startswith("local") else wait_s)
    while True:
        try:
            slots = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        except Exception:  # noqa: BLE001 - a Spark without the method: the best we know
            return sc.defaultParallelism
        if slots >= wanted or time.time() >= deadline:
            return slots
        time.sleep(1.0)

def check_training_rows(staged: DataFrame, fcol: str, wcol: str | None) -> dict:
    """One aggregation over the rows to train on (features as float32 arrays, as the ranks
    will see them): vector lengths, unusable rows by reason, and the range of the labels."""
    inf = float("inf")
    f, y = F.col(Staged.FEATURES), F.col(Staged.LABEL).cast("double")

    def finite(c):
        return c.isNotNull() & ~F.isnan(c) & (F.abs(c) != inf)

    count = lambda cond: F.sum(cond.cast("long"))  # noqa: E731
    aggs = [F.count(F.lit(1)).alias("rows"),
            F.min(F.size(f)).alias("width_min"), F.max(F.size(f)).alias("width_max"),
            count(f.isNull()).alias("null_features"),
            count(f.isNotNull() & F.exists(f, lambda x: F.isnan(x) | (F.abs(x) == inf))).alias("nonfinite_features"),
            count(~finite(F.col(Staged.LABEL))).alias("bad_label"),
            F.min(F.when(finite(y), y)).alias("min"), F.max(F.when(finite(y), y)).alias("max"),
            F.avg(F.when(finite(y), y)).alias("mean"), F.stddev_pop(F.when(finite(y), y)).alias("std"),
            count(finite(y) & (y != F.floor(y))).alias("fractional")]
    if wcol:
        w = F.col(Staged.WEIGHT)
        aggs.append(count(~finite(w) | (w < 0)).alias("bad_weight"))
    row = staged.agg(*aggs).first().asDict()
    row = {k: (v or 0) if k not in ("min", "max", "mean", "std") else v for k, v in row.items()}
    row.setdefault("bad_weight", 0)
    if row["rows"] == 0:
        raise ValueError("DistributedKerasEstimator: the training input has no rows")
    if row["width_min"] != row["width_max"]:
        raise ValueError(f"featuresCol {fcol!r} holds vectors of different lengths (from {row['width_min']} "
                         f"to {row['width_max']}); every row must have the same length")
    row["width"] = int(row["width_max"] or 0)
    if row["width"] == 0 and row["null_features"] < row["rows"]:
        raise ValueError(f"featuresCol {fcol!r} holds empty vectors")
    return row

def apply_handle_invalid(staged: DataFrame, checked: dict, mode: str, fcol: str, lcol: str,
                         wcol: str | None) -> tuple[DataFrame, int]:
    """'error': name every kind of unusable row and its count; 'skip': drop them, counted."""
    reasons = [(checked["null_features"], f"a null featuresCol {fcol!r}"),
               (checked["nonfinite_features"], f"NaN or infinite values in featuresCol {fcol!r} (as float32)"),
               (checked["bad_label"], f"a null, NaN or infinite labelCol {lcol!r} (as float32)"),
               (checked["bad_weight"], f"a null, negative, NaN or infinite weightCol {wcol!r}")]
    found = [f"{n} rows with {why}" for n, why in reasons if n]
    if not found:
        return staged, 0
    if mode == "error":
        raise ValueError(f"DistributedKerasEstimator: the training input has {'; '.join(found)}. Fix or drop those "
                         "rows, or set handleInvalid='skip' to drop and count them")
    inf = float("inf")
    ok = (F.col(Staged.FEATURES).isNotNull() & ~F.exists(Staged.FEATURES, lambda x: F.isnan(x) | (F.abs(x) == inf))
          & F.col(Staged.LABEL).isNotNull() & ~F.isnan(Staged.LABEL) & (F.abs(F.col(Staged.LABEL)) != inf))
    if Staged.WEIGHT in staged.columns:
        ok = ok & F.col(Staged.WEIGHT).isNotNull() & ~F.isnan(Staged.WEIGHT) & (F.abs(F.col(Staged.WEIGHT)) != inf) & (
            F.col(Staged.WEIGHT) >= 0)
    kept = staged.where(ok)
    skipped = checked["rows"] - kept.count()
    if skipped == checked["rows"]:
        raise ValueError(f"DistributedKerasEstimator: every one of the {skipped} training rows is unusable "
                         f"({'; '.join(found)})")
    log.info("[train] handleInvalid='skip': %s of %s rows dropped (%s)", skipped, checked['rows'], '; '.join(found))
    return kept, skipped
