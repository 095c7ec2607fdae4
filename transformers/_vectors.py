"""Shared helpers for stages over vector columns: validation, feature names, invalid rows."""
from __future__ import annotations

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T


def require_vector(schema: T.StructType, col: str, param: str = "featuresCol") -> None:
    """Refuse a missing or non-vector column, naming the param that named it.

    Raises
    ------
    ValueError
        ``col`` is not a column of ``schema``.
    TypeError
        ``col`` is not a vector column.
    """
    if col not in schema.fieldNames():
        raise ValueError(f"{param} {col!r} is not a column of the input "
                         f"(columns: {', '.join(schema.fieldNames())})")
    if not isinstance(schema[col].dataType, VectorUDT):
        raise TypeError(f"{param} {col!r} must be a vector column, got {schema[col].dataType.simpleString()}")


def require_new(schema: T.StructType, col: str, param: str = "outputCol") -> None:
    """Refuse an output column that already exists in the input, naming the param.

    Raises
    ------
    ValueError
        ``col`` is already a column of ``schema``.
    """
    if col in schema.fieldNames():
        raise ValueError(f"{param} {col!r} already exists in the input; choose another name")


def require_numeric(schema: T.StructType, col: str, param: str = "labelCol") -> None:
    """Refuse a missing or non-numeric column, naming the param that named it.

    Raises
    ------
    ValueError
        ``col`` is not a column of ``schema``.
    TypeError
        ``col`` is not numeric.
    """
    if col not in schema.fieldNames():
        raise ValueError(f"{param} {col!r} is not a column of the input")
    if not isinstance(schema[col].dataType, T.NumericType):
        raise TypeError(f"{param} {col!r} must be numeric, got {schema[col].dataType.simpleString()}")


def feature_names(schema: T.StructType, col: str, size: int | None = None) -> list[str]:
    """Names from the column's ML attributes (VectorAssembler, OneHotEncoder write them);
    ``col[i]`` where a name is unknown."""
    attrs = schema[col].metadata.get("ml_attr", {})
    n = size if size is not None else attrs.get("num_attrs")
    by_idx: dict[int, str] = {}
    for group in attrs.get("attrs", {}).values():
        for a in group:
            if "idx" in a and "name" in a:
                by_idx[int(a["idx"])] = a["name"]
    if n is None:
        n = (max(by_idx) + 1) if by_idx else 0
    return [by_idx.get(i, f"{col}[{i}]") for i in range(int(n))]


def vector_size(df: DataFrame, col: str) -> int:
    """The vector length from ML attributes, or from the first row."""
    n = df.schema[col].metadata.get("ml_attr", {}).get("num_attrs")
    if n is not None:
        return int(n)
    row = df.select(col).where(F.col(col).isNotNull()).first()
    if row is None:
        raise ValueError(f"column {col!r} has no non-null rows (is the input empty?)")
    return len(row[0])


def numeric_attrs_metadata(names: list[str]) -> dict:
    """ML attribute metadata naming each element of a vector column."""
    return {"ml_attr": {"attrs": {"numeric": [{"idx": i, "name": n} for i, n in enumerate(names)]},
                        "num_attrs": len(names)}}


def invalid_row(col: str, label: str | None = None) -> Column:
    """True for a null vector or one holding NaN or +-infinity (checked on the JVM), and,
    with ``label``, for a null or non-finite label."""
    arr = vector_to_array(F.col(col))
    bad = F.exists(arr, lambda x: F.isnan(x) | (x == float("inf")) | (x == float("-inf")))
    # vector_to_array fails on null, so test null first (OR does not short-circuit).
    out = F.when(F.col(col).isNull(), F.lit(True))
    if label is not None:
        y = F.col(label).cast("double")
        out = out.when(y.isNull() | F.isnan(y) | (F.abs(y) == float("inf")), F.lit(True))
    return out.otherwise(bad)


def handle_invalid_rows(df: DataFrame, col: str, mode: str, label: str | None = None) -> tuple[DataFrame, int]:
    """Apply ``handleInvalid`` to rows with null/NaN/infinite features (or label).

    'error' raises naming the column and the count; 'skip' drops them and returns how
    many; 'keep' leaves them (the caller treats NaN as missing).
    """
    if mode == "keep":
        return df, 0
    if mode not in ("error", "skip"):
        raise ValueError(f"handleInvalid must be 'error', 'skip' or 'keep', got {mode!r}")
    bad = df.where(invalid_row(col, label)).count()
    if bad and mode == "error":
        where = f"featuresCol {col!r}" + (f" or labelCol {label!r}" if label else "")
        raise ValueError(f"{where} has {bad} rows with null, NaN or infinite values; "
                         "set handleInvalid='skip' to drop and count them")
    return (df.where(~invalid_row(col, label)) if bad else df), bad


def label_summary(df: DataFrame, label: str) -> dict:
    """One aggregation over the label column alone (Spark reads nothing else): rows,
    non-null finite labels, min, max, and how many are not whole numbers."""
    y = F.col(label).cast("double")
    ok = y.isNotNull() & ~F.isnan(y) & (F.abs(y) != float("inf"))
    row = df.select(
        F.count(F.lit(1)).alias("rows"),
        F.sum(ok.cast("long")).alias("valid"),
        F.min(F.when(ok, y)).alias("min"), F.max(F.when(ok, y)).alias("max"),
        F.sum((ok & (y != F.floor(y))).cast("long")).alias("fractional"),
        F.first(F.when(ok & (y != F.floor(y)), y), ignorenulls=True).alias("fraction_example"),
        F.approx_count_distinct(F.when(ok, y), 0.01).alias("distinct"),
    ).first()
    return {k: (row[k] if row[k] is not None else 0) if k in ("rows", "valid", "fractional", "distinct")
            else row[k] for k in row.asDict()}


def require_categorical_label(df: DataFrame, label: str, stage: str, hint: str, max_classes: int) -> dict:
    """A categorical label holds class indices: whole numbers, at least two distinct, and
    at most ``max_classes`` of them (a count or a price in whole units is not a class)."""
    stats = label_summary(df, label)
    if stats["rows"] == 0:
        raise ValueError(f"{stage}: the input has no rows")
    if stats["fractional"]:
        raise ValueError(f"{stage}: labelCol {label!r} holds {stats['fractional']} non-integer values "
                         f"(e.g. {stats['fraction_example']}): a categorical label must hold class indices. "
                         f"{hint}")
    if stats["valid"] and stats["min"] == stats["max"]:
        raise ValueError(f"{stage}: labelCol {label!r} is constant ({stats['min']}) over the "
                         f"{stats['valid']} rows with a label: nothing can be tested against it")
    if stats["distinct"] > max_classes:
        raise ValueError(f"{stage}: labelCol {label!r} has about {stats['distinct']} distinct values in "
                         f"{stats['valid']} rows, more than maxClasses={max_classes}: that looks like a "
                         f"continuous target. {hint} If it really has that many classes, raise maxClasses.")
    if stats["valid"] and (stats["min"] < 0 or stats["max"] >= max_classes):
        raise ValueError(f"{stage}: labelCol {label!r} holds values from {stats['min']} to {stats['max']}: class "
                         f"labels must be class indices 0..maxClasses-1 ({max_classes - 1}), as MLlib's "
                         "classifiers require; index them with StringIndexer. " + hint)
    return stats


def class_index_or_fail(label: str, max_classes: int) -> Column:
    """The label as a double, failing the Spark job on a finite value that is not a class
    index (a whole number in [0, max_classes)). Null stays null and NaN/infinity become
    NaN, which MLlib's tests refuse, so invalid rows go to ``handleInvalid``. Costs no
    extra pass: the caller runs it inside the statistic's own job and, when that job
    fails, names the problem with :func:`require_categorical_label`."""
    y = F.col(label).cast("double")
    finite = ~F.isnan(y) & (F.abs(y) != float("inf"))
    bad = finite & ((y != F.floor(y)) | (y < 0) | (y >= max_classes))
    return (F.when(y.isNull(), y)
            .when(~finite, F.lit(float("nan")))
            .when(bad, F.raise_error(F.concat(F.lit(f"labelCol {label!r}: not a class index: "), y.cast("string"))))
            .otherwise(y))


# -- row checks shared by every stage that reads vectors ------------------------------------

def list_matrix(arr, width: int | None, col: str):
    """An Arrow list array (no nulls) as an ``(n, width)`` float64 matrix.

    Every row's length is checked from the list offsets (one vectorised pass over n
    integers, no copy of the values): reshaping the flat values alone would accept rows
    of lengths 4, 2, 6, 2 whenever their total divides by the width. ``width=None``
    takes the first row's length.
    """
    import numpy as np
    import pyarrow.compute as pc

    n = len(arr)
    if not n:
        return np.zeros((0, width or 0))
    lengths = pc.list_value_length(arr)
    lo, hi = pc.min_max(lengths).values()
    lo, hi = lo.as_py(), hi.as_py()
    if width is None:
        width = int(pc.list_value_length(arr.slice(0, 1))[0].as_py())
    if lo != width or hi != width:
        raise ValueError(f"column {col!r} holds vectors of different lengths (from {lo} to {hi}; "
                         f"expected {width} for every row)")
    return arr.flatten().to_numpy(zero_copy_only=False).reshape(n, width)


def lengths(arr) -> tuple[int | None, int | None]:
    """Shortest and longest row of an Arrow list array (nulls ignored), from its offsets."""
    import pyarrow.compute as pc
    if not len(arr):
        return None, None
    lo, hi = pc.min_max(pc.list_value_length(arr)).values()
    return lo.as_py(), hi.as_py()


class BatchMatrices:
    """A partition's Arrow batches of one list column as ``(n, width)`` float matrices,
    null rows left out and counted (``rows``, ``nulls``). Row lengths come from the
    offsets; a batch holding another length is not yielded but recorded (``lo``/``hi``),
    so the driver can name the column (:func:`require_one_length`) rather than a worker
    failing with a traceback."""

    def __init__(self, batches, width: int):
        self._batches, self.width = batches, width
        self.rows = self.nulls = 0
        self.lo = self.hi = None

    def __iter__(self):
        for batch in self._batches:
            arr = batch.column(0)
            self.rows += len(arr)
            self.nulls += arr.null_count
            valid = arr.drop_null() if arr.null_count else arr
            if not len(valid):
                continue
            a, b = lengths(valid)
            self.lo = a if self.lo is None else min(self.lo, a)
            self.hi = b if self.hi is None else max(self.hi, b)
            if a == self.width and b == self.width:
                yield valid.flatten().to_numpy(zero_copy_only=False).reshape(len(valid), self.width)

    def length_columns(self) -> dict:
        import pyarrow as pa
        return {"len_lo": pa.array([self.lo], pa.int64()), "len_hi": pa.array([self.hi], pa.int64())}


def require_one_length(parts, col: str, width: int) -> None:
    """Raise on the driver when any partition saw rows of another length than ``width``;
    ``parts`` are rows with ``len_lo``/``len_hi`` from :func:`lengths` per partition."""
    seen = [(r["len_lo"], r["len_hi"]) for r in parts if r["len_lo"] is not None]
    if not seen:
        return
    lo, hi = min(a for a, _ in seen), max(b for _, b in seen)
    if lo != width or hi != width:
        raise ValueError(f"column {col!r} holds vectors of different lengths (from {lo} to {hi}; "
                         f"expected {width} for every row)")


def row_problem(col: str, size: int | None, finite: bool) -> Column:
    """Why a row's vector is unusable, as a string column (null when it is fine): it is
    null, its length is not ``size``, or (``finite=True``) it holds NaN or an infinity.
    Evaluated on the JVM."""
    arr = vector_to_array(F.col(col))
    checks = []
    if size is not None:
        checks.append((F.size(arr) != F.lit(int(size)),
                       F.concat(F.lit("length "), F.size(arr).cast("string"), F.lit(f" instead of {int(size)}"))))
    if finite:
        checks.append((F.exists(arr, lambda x: F.isnan(x) | (F.abs(x) == float("inf"))),
                       F.lit("a NaN or infinite value")))
    out = F.when(F.col(col).isNull(), F.lit("a null vector"))
    for cond, why in checks:
        out = out.when(cond, why)
    return out


def guard_input(df: DataFrame, col: str, size: int | None, *, finite: bool, mode: str,
                stage: str, param: str):
    """Check every row of ``col`` at transform before a JVM stage sees it.

    A vector of another length than at fit always fails the job. A null vector (and with
    ``finite=True`` one holding NaN or an infinity) fails it too with ``mode='error'``;
    otherwise the row's output is null, so a bad row is kept, never dropped, and never
    turned into numbers. Messages name the stage, the column and the problem.

    Returns ``(frame, checked, finish)``: the stage reads column ``checked`` (a zero
    vector stands in for a bad row, so the stage never fails on it) and its output
    column expression goes through ``finish``, which raises or nulls for bad rows. The
    raise sits in the final expression on purpose: the optimizer inlines the projections
    and would skip a check placed only on the input of a branch it never evaluates.
    """
    from pyspark.ml.functions import array_to_vector

    problem, checked = f"__{stage}_problem", f"__{stage}_in"
    df = df.withColumn(problem, row_problem(col, size, finite))
    zero = array_to_vector(F.array_repeat(F.lit(0.0), int(size or 0)))
    value = F.when(F.col(problem).isNotNull(), zero).otherwise(F.col(col))
    # Keep the ML attributes (feature names) for the stage that reads the checked column.
    df = df.withColumn(checked, value.alias(checked, metadata=df.schema[col].metadata))
    hint = ("; fix or drop such rows, or set handleInvalid='skip' to give them a null output"
            if mode == "error" else "")
    fail = F.raise_error(F.concat(F.lit(f"{stage}: {param} {col!r} has a row with "), F.col(problem),
                                  F.lit(hint)))
    fatal = F.col(problem).isNotNull() if mode == "error" else F.col(problem).startswith("length")

    def finish(output):
        return F.when(F.col(problem).isNull(), output).when(fatal, fail)

    return df, checked, finish
