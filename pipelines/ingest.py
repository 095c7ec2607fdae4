"""Ingest any source a dataset spec names into two Delta tables: usable rows and rejected rows.

The usable table holds exactly what the later steps need, with one meaning per column:
the key, the categorical features as strings, the numeric features as doubles, and
``label`` (0/1 for binary, the class index for multiclass - its ML attribute metadata
lists the class values in order - the target's value for regression).

Every input row ends in exactly one place: the usable table, the rejected table (with a
``reason`` and the raw record: the text line for a malformed CSV/JSON row, the row as JSON
otherwise), or the count of rows the spec's ``filter`` leaves out. ``rows_in`` is counted
from the source itself and must equal the sum, or the step fails.

Drift: the declared schema is the spec's DDL, else what the previous ingest of this data
set recorded. A declared column that is missing or has another type stops the step
before anything is written, naming the column; a new source column is listed and ignored.
"""
from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep.dataset import DERIVED_KEY, LABEL, DatasetSpec, reserved

CORRUPT = "_corrupt_record"
MAX_CLASSES = 1000


class SourceError(ValueError):
    """The source does not match the spec (missing or retyped column, unreadable, drifted)."""


@dataclass
class Source:
    df: DataFrame                       # typed rows (+ CORRUPT for text formats)
    declared: T.StructType              # the columns and types the spec relies on
    declared_from: str                  # where ``declared`` came from (spec file / previous ingest / source)
    new_columns: list[str] = field(default_factory=list)
    version: int | None = None          # Delta: the version read
    notes: dict = field(default_factory=dict)


def parse_ddl(spark: SparkSession, spec: DatasetSpec) -> T.StructType | None:
    if not spec.schema.strip():
        return None
    try:
        parsed = T._parse_datatype_string(spec.schema)
    except Exception as exc:  # noqa: BLE001 - Spark's ParseException names the position
        raise SourceError(f"dataset spec {spec.file!r}, key 'schema': not a valid DDL schema "
                          f"({spec.schema!r}): {_first_line(exc)}") from None
    if not isinstance(parsed, T.StructType):
        raise SourceError(f"dataset spec {spec.file!r}, key 'schema': expected column definitions "
                          "like \"id BIGINT, price DOUBLE\"")
    _distinct_ignoring_case(parsed.fieldNames(), f"declared in the schema of {spec.file}")
    return parsed


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of an error (Spark's start with a newline), at most 400 characters."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:400]


def _distinct_ignoring_case(columns: list[str], where: str) -> None:
    lower: dict[str, str] = {}
    for c in columns:
        if c.lower() in lower:
            raise SourceError(f"columns {lower[c.lower()]!r} and {c!r} ({where}) differ only in case, which "
                              "Spark cannot tell apart; rename one")
        lower[c.lower()] = c


def read_source(spark: SparkSession, spec: DatasetSpec, recorded: T.StructType | None) -> Source:
    """Read the source with the declared schema; check it; raise :class:`SourceError` on drift."""
    s = spec.source
    ddl = parse_ddl(spark, spec)
    where = s.path or s.table or s.loader
    notes: dict = {}
    if s.format in ("csv", "json"):
        return _read_text(spark, spec, ddl, where)
    try:
        if s.format in ("delta", "parquet"):
            reader = spark.read.format(s.format).options(**dict(s.options))
            if s.format == "delta" and s.version is not None:
                reader = reader.option("versionAsOf", int(s.version))
            df = reader.load(s.path)
        elif s.format == "table":
            df = spark.table(s.table)
        else:
            module, fn = s.loader.split(":")
            out = getattr(importlib.import_module(module), fn)(spark, spec)
            df, notes = out if isinstance(out, tuple) else (out, {})
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a missing path, table or loader: one clear line
        raise SourceError(f"cannot read the {s.format} source {where!r} of dataset spec {spec.file!r}: "
                          f"{str(exc).splitlines()[0][:300]}") from None
    version = None
    if s.format == "delta":
        from sparkdeep import delta_io
        version = s.version if s.version is not None else delta_io.version_of(spark, s.path)
    declared, origin = ((ddl, f"the spec's schema ({spec.file})") if ddl is not None else
                        (recorded, "the previous ingest of this data set") if recorded is not None else
                        (df.schema, "the source (first ingest)"))
    actual = {f.name: f.dataType for f in df.schema.fields}
    for f in declared.fields:
        if f.name in spec.features.exclude and ddl is None:
            continue
        if f.name not in actual:
            raise SourceError(f"column {f.name!r} ({f.dataType.simpleString()}, declared in {origin}) is missing "
                              f"from the source {where!r}; source columns: {', '.join(actual)}")
        if actual[f.name] != f.dataType:
            raise SourceError(f"column {f.name!r} was {f.dataType.simpleString()} in {origin}, but the source "
                              f"{where!r} now has it as {actual[f.name].simpleString()}: retyped columns stop "
                              "the ingest (cast it in a view, or change the spec)")
    names = {f.name for f in declared.fields}
    new = [c for c in df.columns if c not in names]
    df = df.select(*[F.col(f"`{f.name}`") for f in declared.fields])
    return Source(df, declared, origin, new, version, notes)


def _read_text(spark: SparkSession, spec: DatasetSpec, ddl: T.StructType, where: str) -> Source:
    s = spec.source
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    if s.format == "csv":
        opts["header"] = "true"
    opts.update(dict(s.options))
    if opts.get("mode", "PERMISSIVE").upper() != "PERMISSIVE":
        raise SourceError(f"dataset spec {spec.file!r}, key 'source.options.mode': only PERMISSIVE is "
                          "supported: malformed rows go to the rejected table, counted")
    declared = {f.name: f for f in ddl.fields}
    new: list[str] = []
    read_fields = list(ddl.fields)
    if s.format == "csv" and opts.get("header", "false").lower() == "true":
        # CSV maps columns by position: read the header and put each declared type at its place.
        try:
            header = spark.read.options(**{k: v for k, v in opts.items() if k not in ("mode",)}) \
                .option("header", "true").option("inferSchema", "false").csv(s.path).columns
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"cannot read the csv source {where!r} of dataset spec {spec.file!r}: "
                              f"{str(exc).splitlines()[0][:300]}") from None
        missing = [c for c in declared if c not in header]
        if missing:
            raise SourceError(f"column {missing[0]!r} (declared in the spec's schema, {spec.file}) is missing "
                              f"from the header of the csv source {where!r}; header: {', '.join(header)}")
        new = [c for c in header if c not in declared]
        read_fields = [declared[c] if c in declared else T.StructField(c, T.StringType()) for c in header]
    schema = T.StructType(read_fields + [T.StructField(CORRUPT, T.StringType())])
    df = spark.read.format(s.format).schema(schema).options(**opts).load(s.path)
    df = df.select(*[F.col(f"`{f.name}`") for f in ddl.fields], CORRUPT)
    return Source(df, ddl, f"the spec's schema ({spec.file})", new, None, {})


@contextlib.contextmanager
def whole_csv_lines(spark: SparkSession):
    """Turn off CSV column pruning for the block (restored after): a malformed line is
    malformed in every pass, whichever columns the pass reads."""
    key = "spark.sql.csv.parser.columnPruning.enabled"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


# -- features --------------------------------------------------------------------------------

_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)


#: Characters Delta refuses in a column name, and '.', which Spark ML stages read as a struct field.
BAD_NAME_CHARS = " ,;{}()\n\t=."


def check_names(spec: DatasetSpec, columns: list[str]) -> None:
    """The key and label name source columns exactly (Spark matches names without regard to
    case, so a near miss would select a column twice); the columns the pipeline keeps have
    names Delta and MLlib can take."""
    def near(name: str) -> str:
        same = [c for c in columns if c.lower() == name.lower()]
        return f"; did you mean {same[0]!r} (names are case-sensitive here)?" if same else \
            f" (columns: {', '.join(columns)})"
    for what, name in (("key", spec.key), ("label.column", spec.label.column)):
        if name and name not in columns:
            raise SourceError(f"dataset spec {spec.file!r}, key {what!r}: {name!r} is not a column of the "
                              f"source{near(name)}")
    _distinct_ignoring_case(columns, f"source columns, dataset spec {spec.file}")
    excluded = set(spec.features.exclude)
    for c in columns:
        bad = sorted({ch for ch in c if ch in BAD_NAME_CHARS})
        if bad and c not in excluded:
            role = "key" if c == spec.key else "label" if c == spec.label.column else "feature"
            raise SourceError(f"source column {c!r} ({role}) has the character(s) {bad}, which Delta tables or "
                              f"MLlib stages cannot take in a column name; rename it in the source"
                              + ("" if role != "feature" else f", or add it to features.exclude in {spec.file}"))


def resolve_features(spec: DatasetSpec, source: Source) -> tuple[list[str], list[str], dict]:
    """(categorical, numeric, left_out): declared lists as given, else inferred by type from
    the declared schema minus key, label and ``exclude``. Inferred string columns with more
    than ``features.max_categories`` distinct values are left out (an approximate count)."""
    f = spec.features
    types_ = {c.name: c.dataType for c in source.declared.fields}
    check_names(spec, list(types_))
    skip = {spec.key, spec.label.column, *f.exclude}
    for c in list(f.categorical or ()) + list(f.numeric or ()):
        if c not in types_:
            raise SourceError(f"dataset spec {spec.file!r}: feature column {c!r} is not in the source "
                              f"(columns: {', '.join(types_)})")
    for c in f.numeric or ():
        if not isinstance(types_[c], (*_NUMERIC, T.BooleanType)):
            raise SourceError(f"dataset spec {spec.file!r}: features.numeric lists {c!r}, a "
                              f"{types_[c].simpleString()} column; list it under features.categorical")
    left_out: dict = {}
    declared = set(f.categorical or ()) | set(f.numeric or ())
    candidates = [c for c in types_ if c not in skip and c not in declared]
    cat = list(f.categorical) if f.categorical is not None else []
    num = list(f.numeric) if f.numeric is not None else []
    inferred_cat = []
    for c in candidates:
        t = types_[c]
        if isinstance(t, (T.StringType, T.BooleanType)) and f.categorical is None:
            inferred_cat.append(c)
        elif isinstance(t, _NUMERIC) and f.numeric is None:
            num.append(c)
        elif f.categorical is None or f.numeric is None:
            left_out[c] = f"type {t.simpleString()} is not used as a feature (declare or cast it)"
        else:
            left_out[c] = "not listed in features.categorical or features.numeric"
    for c in (*inferred_cat, *num, *cat):
        if reserved(c):
            raise SourceError(f"source column {c!r} has a name the pipeline uses itself; add it to "
                              f"features.exclude in {spec.file} or rename it")
    if inferred_cat:
        row = source.df.select(*[F.approx_count_distinct(F.col(f"`{c}`")).alias(c) for c in inferred_cat]).first()
        for c in inferred_cat:
            if row[c] > f.max_categories:
                left_out[c] = (f"about {row[c]} distinct values, more than features.max_categories="
                               f"{f.max_categories} (an id or free text?); declare it in features.categorical "
                               "to use it anyway")
            else:
                cat.append(c)
    if not cat and not num:
        raise SourceError(f"dataset spec {spec.file!r}: no feature columns (declared or inferred); "
                          f"left out: {left_out}")
    return cat, num, left_out


# -- the label ---------------------------------------------------------------------------------

#: How many class-0 values (with counts) a binary ``positive`` label lists in the report.
NEGATIVES_LISTED = 20


def label_plan(spec: DatasetSpec, source: Source, ok: Column) -> dict:
    """How the label column becomes ``label``: for binary the rule, for multiclass the
    classes in order (declared, else the sorted distinct values of the rows ``ok`` keeps)."""
    lab = spec.label
    col = F.col(f"`{lab.column}`")
    t = source.declared[lab.column].dataType
    numeric = isinstance(t, _NUMERIC)
    if lab.task == "regression":
        if not numeric:
            raise SourceError(f"label column {lab.column!r} is {t.simpleString()}: a regression target "
                              f"must be numeric ({spec.file})")
        return {"task": "regression"}
    if lab.task == "binary":
        if lab.threshold is not None:
            if not numeric:
                raise SourceError(f"label.threshold needs a numeric label column; {lab.column!r} is "
                                  f"{t.simpleString()} ({spec.file}); use label.positive")
            return {"task": "binary", "rule": f">= {lab.threshold}"}
        if lab.positive and lab.negative:
            return {"task": "binary", "rule": f"in {list(lab.positive)}; 0 if in {list(lab.negative)}; "
                                              "any other value rejected"}
        if lab.positive:
            # Every other value is class 0: list them with their counts, so a typo of a
            # positive value ('Churned', 'churnd') is seen, not silently made a negative.
            rows = (source.df.where(ok & col.isNotNull() & ~_text(col).isin(list(lab.positive)))
                    .groupBy(_text(col).alias("v")).count().orderBy(F.desc("count"), "v")
                    .limit(NEGATIVES_LISTED + 1).collect())
            return {"task": "binary", "rule": f"in {list(lab.positive)}; every other value 0",
                    "class_0_values": {r["v"]: int(r["count"]) for r in rows[:NEGATIVES_LISTED]},
                    "class_0_values_listed_all": len(rows) <= NEGATIVES_LISTED}
        values = [r[0] for r in source.df.where(ok & col.isNotNull()).select(_text(col)).distinct().limit(3).collect()]
        if not set(values) <= {"0", "1", "true", "false"}:
            raise SourceError(f"binary label column {lab.column!r} holds values other than 0/1 "
                              f"(e.g. {sorted(values)[:3]}): set label.positive (the class-1 value(s)) or "
                              f"label.threshold in {spec.file}")
        return {"task": "binary", "rule": "as is (0/1)"}
    if lab.classes:
        return {"task": "multiclass", "classes": list(lab.classes), "declared": True}
    rows = (source.df.where(ok & col.isNotNull() & _finite_or_text(col, numeric)).select(col.alias("v"))
            .distinct().limit(MAX_CLASSES + 1).collect())
    if len(rows) > MAX_CLASSES:
        raise SourceError(f"multiclass label column {lab.column!r} has more than {MAX_CLASSES} distinct values: "
                          f"a continuous target? Use task: regression, or declare label.classes ({spec.file})")
    values = sorted(r["v"] for r in rows)
    classes = [_value_text(v) for v in values]
    if len(classes) < 2:
        raise SourceError(f"multiclass label column {lab.column!r} has {len(classes)} distinct value(s) "
                          f"{classes}: nothing to classify ({spec.file})")
    return {"task": "multiclass", "classes": classes, "declared": False}


def _text(col: Column) -> Column:
    """A value as the text the spec compares it with: booleans true/false, whole doubles
    without '.0' (so 1, 1.0 and "1" all read "1")."""
    s = col.cast("string")
    return F.when(s.rlike(r"^-?\d+\.0$"), F.regexp_replace(s, r"\.0$", "")).otherwise(s)


def _value_text(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _finite_or_text(col: Column, numeric: bool) -> Column:
    if not numeric:
        return F.lit(True)
    d = col.cast("double")
    return ~F.isnan(d) & (F.abs(d) != float("inf"))


def label_column(spec: DatasetSpec, plan: dict, dtype: T.DataType) -> tuple[Column, Column]:
    """(the ``label`` value, a reason when the row's label is unusable or null)."""
    lab = spec.label
    col = F.col(f"`{lab.column}`")
    reason = F.when(col.isNull(), F.lit(f"label {lab.column!r} is null"))
    if plan["task"] == "multiclass":
        classes = plan["classes"]
        idx = F.array_position(F.array(*[F.lit(c) for c in classes]), _text(col)) - 1
        reason = reason.when(idx < 0, F.concat(F.lit(f"label {lab.column!r} value '"), _text(col),
                                               F.lit(f"' is not one of the classes {classes}")))
        value = idx.cast("double")
    else:
        d = col.cast("double")
        numeric = isinstance(dtype, _NUMERIC)
        if plan["task"] == "regression" or numeric:
            reason = reason.when(F.isnan(d) | (F.abs(d) == float("inf")),
                                 F.lit(f"label {lab.column!r} is NaN or infinite"))
        if plan["task"] == "regression":
            value = d
        elif lab.threshold is not None:
            value = (d >= F.lit(lab.threshold)).cast("double")
        elif lab.positive:
            value = _text(col).isin(list(lab.positive)).cast("double")
            if lab.negative:
                known = list(lab.positive) + list(lab.negative)
                reason = reason.when(~_text(col).isin(known), F.concat(
                    F.lit(f"label {lab.column!r} value '"), _text(col),
                    F.lit(f"' is neither positive {list(lab.positive)} nor negative {list(lab.negative)}")))
        else:
            t = _text(col)
            reason = reason.when(~t.isin("0", "1", "true", "false"),
                                 F.concat(F.lit(f"label {lab.column!r} value '"), t, F.lit("' is not 0/1")))
            value = t.isin("1", "true").cast("double")
    return value, reason


def label_metadata(plan: dict) -> dict:
    if plan["task"] == "multiclass":
        return {"ml_attr": {"type": "nominal", "name": LABEL, "vals": plan["classes"]}}
    if plan["task"] == "binary":
        return {"ml_attr": {"type": "binary", "name": LABEL, "vals": ["0", "1"]}}
    return {}


# -- the table ---------------------------------------------------------------------------------

def derived_key(columns: list[str]) -> Column:
    """A stable id from the row alone: the hex xxhash64 of its values (as JSON, so any
    column type hashes), then '-' and the row's place among identical rows (0, 1, ...).
    The same content gets the same id on every run whatever the partitioning; identical
    rows get distinct ids; two different rows sharing a hash are ordered by their text."""
    from pyspark.sql import Window
    text = F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]))
    h = F.lower(F.hex(F.xxhash64(text)))
    n = F.row_number().over(Window.partitionBy(h).orderBy(text)) - 1
    return F.concat(h, F.lit("-"), n.cast("string"))


def classify_rows(spec: DatasetSpec, source: Source, categorical: list[str], numeric: list[str],
                  plan: dict, sample_fraction: float = 1.0, seed: int = 42) -> DataFrame:
    """Every source row with ``reason`` (null = usable; "__filtered__" = left out by the
    filter), ``raw_record`` and the output columns."""
    from sparkdeep.transformers.sampling import hash_uniform
    df = source.df
    text = CORRUPT in df.columns
    key = spec.key_column
    if not spec.key:
        base = [c for c in df.columns]
        df = df.withColumn(DERIVED_KEY, derived_key(base))
    if sample_fraction < 1.0:
        df = df.where(hash_uniform(F.xxhash64(F.lit(seed), F.col(f"`{key}`"))) < sample_fraction)
    value, label_reason = label_column(spec, plan, source.declared[spec.label.column].dataType)
    reason = F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed record or a value that does not parse as its "
                                                      "declared type")) if text else F.when(F.lit(False), F.lit(""))
    if spec.key:
        reason = reason.when(F.col(f"`{key}`").isNull(), F.lit(f"key {key!r} is null"))
    if spec.filter:
        reason = reason.when(~F.coalesce(filter_condition(spec, df), F.lit(False)), F.lit("__filtered__"))
    # Append the label's conditions to the chain by re-wrapping: first match wins.
    reason = F.coalesce(reason, label_reason)
    for c in numeric:
        d = F.col(f"`{c}`").cast("double")
        reason = F.coalesce(reason, F.when(F.isnan(d) | (F.abs(d) == float("inf")),
                                           F.lit(f"numeric feature {c!r} is NaN or infinite")))
    raw = F.col(CORRUPT) if text else F.lit(None).cast("string")
    row_json = F.to_json(F.struct(*[F.col(f"`{c}`") for c in source.declared.fieldNames()]))
    out = [F.col(f"`{key}`").alias(key)]
    out += [F.col(f"`{c}`").cast("string").alias(c) if not isinstance(source.declared[c].dataType, T.BooleanType)
            else F.lower(F.col(f"`{c}`").cast("string")).alias(c) for c in categorical]
    out += [F.col(f"`{c}`").cast("double").alias(c) for c in numeric]
    out += [value.alias(LABEL, metadata=label_metadata(plan)), reason.alias("reason"),
            F.coalesce(raw, row_json).alias("raw_record")]
    return df.select(*out)


def filter_condition(spec: DatasetSpec, df: DataFrame) -> Column:
    """The spec's ``filter`` as a boolean column of ``df``, checked now: a syntax error, an
    unknown column or a non-boolean condition is a ``SourceError`` naming the filter and file."""
    try:
        cond = F.expr(spec.filter)
        kind = df.select(cond.alias("f")).schema["f"].dataType
    except Exception as exc:  # noqa: BLE001 - Spark's parse/analysis errors carry the detail
        raise SourceError(f"dataset spec {spec.file!r}, key 'filter': {spec.filter!r} is not a valid SQL "
                          f"condition on the source: {_first_line(exc)}") from None
    if not isinstance(kind, T.BooleanType):
        raise SourceError(f"dataset spec {spec.file!r}, key 'filter': {spec.filter!r} is {kind.simpleString()}, "
                          "not a true/false condition")
    return cond


def split_classified(classified: DataFrame, key: str) -> tuple[DataFrame, DataFrame]:
    usable = classified.where(F.col("reason").isNull()).drop("reason", "raw_record")
    rejected = (classified.where(F.col("reason").isNotNull() & (F.col("reason") != "__filtered__"))
                .select(F.col(f"`{key}`").cast("string").alias(key), "reason", "raw_record"))
    return usable, rejected


def check_key_unique(usable: DataFrame, key: str, spec: DatasetSpec) -> None:
    dup = usable.groupBy(f"`{key}`").count().where("count > 1")
    row = dup.agg(F.count(F.lit(1)).alias("n"), F.first(F.col(f"`{key}`")).alias("example")).first()
    if row["n"]:
        raise SourceError(f"key column {key!r} is not unique: {row['n']} values occur more than once "
                          f"(e.g. {row['example']!r}); name a unique column as key in {spec.file}, or set "
                          "key: \"\" to derive a row id")


def ingest_report(rows_in: int, classified_counts: dict, usable: DataFrame, plan: dict) -> dict:
    """Counts that must reconcile: rows_in = usable + rejected + filtered. ``classified_counts``
    maps a reason (None = usable) to its row count; it is not modified."""
    classified_counts = dict(classified_counts)
    filtered = classified_counts.pop("__filtered__", 0)
    usable_rows = classified_counts.pop(None, 0)
    rejected = sum(classified_counts.values())
    report = {"rows_in": rows_in, "rows_usable": usable_rows, "rows_rejected": rejected,
              "rows_filtered": filtered, "rejected_by_reason": classified_counts,
              "accounted": rows_in == usable_rows + rejected + filtered}
    if plan["task"] == "binary":
        pos = usable.agg(F.sum(LABEL)).first()[0] or 0
        report.update(positives=int(pos), positive_rate=round(pos / usable_rows, 4) if usable_rows else None)
    elif plan["task"] == "multiclass":
        counts = {int(r[0]): int(r[1]) for r in usable.groupBy(LABEL).count().collect()}
        report["class_counts"] = {c: counts.get(i, 0) for i, c in enumerate(plan["classes"])}
        report["classes"] = plan["classes"]
    else:
        r = usable.agg(F.min(LABEL), F.max(LABEL), F.avg(LABEL), F.stddev(LABEL)).first()
        report["target"] = {"min": r[0], "max": r[1], "mean": r[2], "stddev": r[3]}
    return report


def schema_record_path(tables_root: str, spec: DatasetSpec) -> str:
    from sparkdeep import storage
    return storage.join(tables_root, f"_{spec.name}_source_schema.json")


def read_recorded_schema(path: str) -> T.StructType | None:
    from sparkdeep.paths import read_json
    recorded = read_json(path)
    return None if recorded is None else T.StructType.fromJson(recorded)


def classes_of(df: DataFrame, col: str = LABEL) -> list[str] | None:
    """The class values a multiclass ``label`` column carries in its metadata (None otherwise)."""
    attr = df.schema[col].metadata.get("ml_attr", {})
    return list(attr["vals"]) if attr.get("type") == "nominal" and attr.get("vals") else None


def task_of(df: DataFrame, col: str = LABEL) -> str:
    attr = df.schema[col].metadata.get("ml_attr", {})
    return {"nominal": "multiclass", "binary": "binary"}.get(attr.get("type"), "regression")


def claim_output(paths, spec: DatasetSpec, write: bool = False) -> None:
    """An output folder holds one data set's tables, models and runs: refuse another's.
    ``write=True`` (after a successful ingest) records the owner."""
    from sparkdeep import storage
    from sparkdeep.paths import read_json
    path = storage.join(paths.root, "dataset.json")
    owner = (read_json(path) or {}).get("name")
    if owner is not None and owner != spec.name:
        raise SourceError(f"the output folder {paths.root!r} holds data set {owner!r} (see {path}); "
                          f"data set {spec.name!r} needs its own: pass --output-dir")
    if owner is None and write:
        from sparkdeep.paths import write_json
        write_json(path, {"name": spec.name, "spec_file": spec.file})
