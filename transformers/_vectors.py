"""Shared helpers for stages over vector columns: validation, feature names, invalid rows."""
from __future__ import annotations

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T


def require_vector(schema: T.StructType, col: str, param: str = "featuresCol") -> None:
    if col not in schema.fieldNames():
        raise ValueError(f"{param} {col!r} is not a column of the input "
                         f"(columns: {', '.join(schema.fieldNames())})")
    if not isinstance(schema[col].dataType, VectorUDT):
        raise TypeError(f"{param} {col!r} must be a vector column, got {schema[col].dataType.simpleString()}")


def require_new(schema: T.StructType, col: str, param: str = "outputCol") -> None:
    if col in schema.fieldNames():
        raise ValueError(f"{param} {col!r} already exists in the input; choose another name")


def require_numeric(schema: T.StructType, col: str, param: str = "labelCol") -> None:
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
        raise ValueError(f"column {col!r} has no non-null rows")
    return len(row[0])


def numeric_attrs_metadata(names: list[str]) -> dict:
    """ML attribute metadata naming each element of a vector column."""
    return {"ml_attr": {"attrs": {"numeric": [{"idx": i, "name": n} for i, n in enumerate(names)]},
                        "num_attrs": len(names)}}


def invalid_row(col: str) -> Column:
    """True for a null vector or one holding NaN or +-infinity (checked on the JVM)."""
    arr = vector_to_array(F.col(col))
    bad = F.exists(arr, lambda x: F.isnan(x) | (x == float("inf")) | (x == float("-inf")))
    # vector_to_array fails on null, so test null first (OR does not short-circuit).
    return F.when(F.col(col).isNull(), F.lit(True)).otherwise(bad)


def handle_invalid_rows(df: DataFrame, col: str, mode: str) -> tuple[DataFrame, int]:
    """Apply ``handleInvalid`` to rows with null/NaN/infinite features.

    'error' raises naming the column and the count; 'skip' drops them and returns how
    many; 'keep' leaves them (the caller treats NaN as missing).
    """
    if mode == "keep":
        return df, 0
    if mode not in ("error", "skip"):
        raise ValueError(f"handleInvalid must be 'error', 'skip' or 'keep', got {mode!r}")
    bad = df.where(invalid_row(col)).count()
    if bad and mode == "error":
        raise ValueError(f"featuresCol {col!r} has {bad} rows with null, NaN or infinite values; "
                         "set handleInvalid='skip' to drop and count them")
    return (df.where(~invalid_row(col)) if bad else df), bad
