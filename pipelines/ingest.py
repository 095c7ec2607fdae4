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
import logging
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep import delta_io, names
from sparkdeep.dataset import DERIVED_KEY, LABEL, DatasetSpec, reserved
from sparkdeep.errors import error_line
from sparkdeep.paths import write_json

log = logging.getLogger(__name__)

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
                          f"({spec.schema!r}): {error_line(exc, typed=False, limit=400)}; a column name with a "
                          "space, dot or other character outside letters, digits and _ goes in backticks "
                          "(`income.usd` DOUBLE)") from None
    if not isinstance(parsed, T.StructType):
        raise SourceError(f"dataset spec {spec.file!r}, key 'schema': expected column definitions "
                          "like \"id BIGINT, price DOUBLE\"")
    _distinct_ignoring_case(parsed.fieldNames(), f"declared in the schema of {spec.file}")
    return parsed


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
                          f"{error_line(exc, typed=False, limit=300)}") from None
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
    declared_names = {f.name for f in declared.fields}
    new = [c for c in df.columns if c not in declared_names]
    df = df.selectExpr(*[names.quoted(f.name) for f in declared.fields])
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
                              f"{error_line(exc, typed=False, limit=300)}") from None
        missing = [c for c in declared if c not in header]
        if missing:
            raise SourceError(f"column {missing[0]!r} (declared in the spec's schema, {spec.file}) is missing "
                              f"from the header of the csv source {where!r}; header: {', '.join(header)}")
        new = [c for c in header if c not in declared]
        read_fields = [declared[c] if c in declared else T.StructField(c, T.StringType()) for c in header]
    schema = T.StructType(read_fields + [T.StructField(CORRUPT, T.StringType())])
    df = spark.read.format(s.format).schema(schema).options(**opts).load(s.path)
    df = df.selectExpr(*[names.quoted(f.name) for f in ddl.fields], CORRUPT)
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
_TEMPORAL = (T.DateType, T.TimestampType, T.TimestampNTZType)
#: Types a categorical feature may have: each value becomes its text (a float too: a code
#: column with nulls often arrives as one).
_CATEGORICAL = (T.StringType, T.BooleanType, *_NUMERIC, *_TEMPORAL)
#: The parts of a date a date or timestamp feature adds beside its own number (SQL functions).
_DATE_PARTS = {"year": "year", "month": "month", "day": "dayofmonth", "day_of_week": "dayofweek"}


def temporal_features(name: str, dtype: T.DataType) -> dict[str, str]:
    """``{feature: SQL over the source column}`` for a date or timestamp feature: the value
    itself as a number under its own name (days since 1970-01-01 for a date, seconds for a
    timestamp, in the session's time zone), and beside it ``<name>_year``, ``_month``,
    ``_day`` (of the month), ``_day_of_week`` (1 = Sunday) and, for a timestamp, ``_hour``.
    A null date gives null numbers (missing values, as any number's). Empty for other types."""
    if not isinstance(dtype, _TEMPORAL):
        return {}
    q = names.quoted(name)
    value = (f"CAST(unix_date({q}) AS DOUBLE)" if isinstance(dtype, T.DateType)
             else f"CAST(unix_micros(CAST({q} AS TIMESTAMP)) AS DOUBLE) / 1000000.0")
    parts = dict(_DATE_PARTS, **({} if isinstance(dtype, T.DateType) else {"hour": "hour"}))
    return {name: value, **{f"{name}_{part}": f"CAST({fn}({q}) AS DOUBLE)" for part, fn in parts.items()}}


def numeric_sql(declared: T.StructType, numeric: list[str]) -> dict[str, str]:
    """``{numeric feature: SQL}``: a number cast to double, a date or timestamp feature's
    value and parts (:func:`temporal_features`)."""
    types_ = {f.name: f.dataType for f in declared.fields}
    derived: dict[str, str] = {}
    for c in numeric:
        derived.update(temporal_features(c, types_.get(c)))
    return {c: derived.get(c) or f"CAST({names.quoted(c)} AS DOUBLE)" for c in numeric}


def _expand_temporal(num: list[str], types_: dict, spec: DatasetSpec) -> list[str]:
    """The numeric features with each date or timestamp column's parts after it; a part's
    name that is already a source column is an error naming both."""
    out: list[str] = []
    for c in num:
        parts = list(temporal_features(c, types_[c])) or [c]
        for p in parts[1:]:
            if p in types_:
                raise SourceError(f"dataset spec {spec.file!r}: the {types_[c].simpleString()} feature {c!r} adds "
                                  f"the number {p!r}, which is already a source column; rename one, or exclude "
                                  f"one of them (features.exclude)")
        out += parts
    return out


def check_names(spec: DatasetSpec, columns: list[str]) -> None:
    """The key and label name source columns exactly (Spark matches names without regard to
    case, so a near miss would select a column twice), and no two columns differ only in case."""
    def near(name: str) -> str:
        same = [c for c in columns if c.lower() == name.lower()]
        return f"; did you mean {same[0]!r} (names are case-sensitive here)?" if same else \
            f" (columns: {listed(columns)})"
    for what, name in (("key", spec.key), ("label.column", spec.label.column)):
        if name and name not in columns:
            raise SourceError(f"dataset spec {spec.file!r}, key {what!r}: {name!r} is not a column of the "
                              f"source{near(name)}")
    _distinct_ignoring_case(columns, f"source columns, dataset spec {spec.file}")
    check_derived_key(spec, columns)


def listed(columns: list[str], at_most: int = 20) -> str:
    """At most ``at_most`` names, then how many more: a message stays readable at 10,000 columns."""
    shown = ", ".join(columns[:at_most])
    return shown + (f", ... ({len(columns) - at_most} more)" if len(columns) > at_most else "")


def internal_names(spec: DatasetSpec, categorical: list[str], numeric: list[str]) -> dict[str, str]:
    """``{source name: internal name}`` for the key and feature columns whose names Delta or
    MLlib cannot take (``sparkdeep.names``); two that meet after mapping are an error naming both."""
    kept = ([spec.key] if spec.key else []) + list(categorical) + list(numeric)
    try:
        mapped = names.mapping(kept, f"dataset spec {spec.file}")
    except names.NameCollision as exc:
        raise SourceError(str(exc)) from None
    if spec.key and reserved(names.internal_name(spec.key)):
        raise SourceError(f"dataset spec {spec.file!r}, key 'key': {spec.key!r} becomes the internal name "
                          f"{names.internal_name(spec.key)!r}, a name the pipeline uses itself; rename the column")
    return mapped


def check_derived_key(spec: DatasetSpec, columns: list[str]) -> None:
    """Without a ``key``, ingest names the derived id ``row_id``: a source column that is, or
    becomes, that name (any case) would be ambiguous beside it."""
    if spec.key:
        return
    for c in columns:
        if names.internal_name(c).lower() == DERIVED_KEY:
            raise SourceError(f"source column {c!r} (internal name {names.internal_name(c)!r}) takes the name of the "
                              f"row id ingest derives when the spec has no key; if it identifies a row, set "
                              f"key: {c!r} in {spec.file}, else rename it in the source")


def resolve_features(spec: DatasetSpec, source: Source) -> tuple[list[str], list[str], dict]:
    """(categorical, numeric, left_out): declared lists as given, else inferred by type from
    the declared schema minus key, label and ``exclude``. Inferred string columns with more
    than ``features.max_categories`` distinct values are left out (an approximate count).
    A date or timestamp feature (inferred, or listed as numeric) is its number and its
    parts (:func:`temporal_features`); listed as categorical, its text. A declared column of
    a type neither list can take (arrays, maps, structs, binary) is an error naming it; an
    inferred one is left out, with the reason."""
    f = spec.features
    types_ = {c.name: c.dataType for c in source.declared.fields}
    check_names(spec, list(types_))
    skip = {spec.key, spec.label.column, *f.exclude}
    for c in list(f.categorical or ()) + list(f.numeric or ()):
        if c not in types_:
            raise SourceError(f"dataset spec {spec.file!r}: feature column {c!r} is not in the source "
                              f"(columns: {', '.join(types_)})")
    for c in f.numeric or ():
        if isinstance(types_[c], T.StringType):
            raise SourceError(f"dataset spec {spec.file!r}: features.numeric lists {c!r}, a "
                              f"{types_[c].simpleString()} column; list it under features.categorical")
        if not isinstance(types_[c], (*_NUMERIC, *_TEMPORAL, T.BooleanType)):
            raise SourceError(f"dataset spec {spec.file!r}: features.numeric lists {c!r}, a "
                              f"{types_[c].simpleString()} column; a numeric feature is a number, a date or a "
                              "timestamp: cast it in the source or exclude it")
    for c in f.categorical or ():
        if not isinstance(types_[c], _CATEGORICAL):
            raise SourceError(f"dataset spec {spec.file!r}: features.categorical lists {c!r}, a "
                              f"{types_[c].simpleString()} column; a category is a string, boolean, number, "
                              "date or timestamp value: cast it in the source or exclude it")
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
        elif isinstance(t, (*_NUMERIC, *_TEMPORAL)) and f.numeric is None:
            num.append(c)
        elif f.categorical is None or f.numeric is None:
            left_out[c] = f"type {t.simpleString()} is not used as a feature (declare or cast it)"
        else:
            left_out[c] = "not listed in features.categorical or features.numeric"
    for c in (*inferred_cat, *num, *cat):
        if reserved(names.internal_name(c)):
            raise SourceError(f"source column {c!r} has a name the pipeline uses itself; add it to "
                              f"features.exclude in {spec.file} or rename it")
    num = _expand_temporal(num, types_, spec)
    if inferred_cat:
        counts = approx_distinct(source.df, inferred_cat)
        for i, c in enumerate(inferred_cat):
            if counts[c] > f.max_categories:
                left_out[c] = (f"about {counts[c]} distinct values, more than features.max_categories="
                               f"{f.max_categories} (an id or free text?); declare it in features.categorical "
                               "to use it anyway")
            else:
                cat.append(c)
    if not cat and not num:
        raise SourceError(f"dataset spec {spec.file!r}: no feature columns (declared or inferred); "
                          f"left out: {left_out}")
    return cat, num, left_out


def approx_distinct(df: DataFrame, columns: list[str]) -> dict[str, int]:
    """About how many distinct non-null values each of ``columns`` holds, in one pass.

    The columns are read as (column number, value) pairs and counted by one grouped
    ``approx_count_distinct``: one aggregate whatever the width, where one aggregate per
    column made a query whose planning and code grew with the columns (300 string columns:
    25 s for 320 rows). The pairs are SQL text parsed once: built as Column objects they
    cost five py4j calls a column (3,000 columns: 24 s before a row was read)."""
    if not columns:
        return {}
    pairs = ", ".join(f"named_struct('i', {i}, 'v', CAST({names.quoted(c)} AS STRING))" for i, c in enumerate(columns))
    rows = (df.selectExpr(f"explode(array({pairs})) AS p").select("p.i", "p.v").groupBy("i")
            .agg(F.approx_count_distinct("v").alias("n")).collect())
    found = {int(r["i"]): int(r["n"]) for r in rows}
    return {c: found.get(i, 0) for i, c in enumerate(columns)}


# -- the label ---------------------------------------------------------------------------------

#: How many class-0 values (with counts) a binary ``positive`` label lists in the report.
NEGATIVES_LISTED = 20


def label_plan(spec: DatasetSpec, source: Source, ok: Column) -> dict:
    """How the label column becomes ``label``: for binary the rule, for multiclass the
    classes in order (declared, else the sorted distinct values of the rows ``ok`` keeps)."""
    lab = spec.label
    col = F.col(names.quoted(lab.column))
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
        if lab.positive:
            _check_listed_values(spec, source, ok, col, t)
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
        # No rule: the column is 0/1 (or true/false). One with no such value at all lacks a
        # rule (an error for the step); in one that has them, a row with another value is
        # rejected with the value (label_column). Counted over every row, not a sample.
        text, zero_one = _text(col), ("0", "1", "true", "false")
        labelled = source.df.where(ok & col.isNotNull())
        row = labelled.agg(F.count(F.when(text.isin(*zero_one), 1)).alias("zero_one"),
                           F.count(F.when(~text.isin(*zero_one), 1)).alias("other")).first()
        if row["other"] and not row["zero_one"]:
            held = (labelled.groupBy(text.alias("v")).count().orderBy(F.desc("count"), "v").limit(5).collect())
            raise SourceError(f"binary label column {lab.column!r} holds no 0/1 value (e.g. "
                              f"{', '.join(f'{r[0]!r} ({r[1]} rows)' for r in held)}): set label.positive (the "
                              f"class-1 value(s)) or label.threshold in {spec.file}")
        return {"task": "binary", "rule": "as is (0/1); any other value rejected"}
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


#: What PyYAML reads as a boolean when unquoted (YAML 1.1), by the text the spec loader makes of it.
_YAML_BOOLEANS = {"true": ("yes", "on", "true"), "false": ("no", "off", "false")}


def _check_listed_values(spec: DatasetSpec, source: Source, ok: Column, col: Column, dtype: T.DataType) -> None:
    """Every ``positive`` and ``negative`` value matches some row (one aggregation): a value
    that matches none is a typo, or YAML's: an unquoted ``Yes`` is the boolean true, which the
    spec loader reads as 'true'; the error then names the column's value to quote."""
    lab = spec.label
    listed = [("positive", v) for v in lab.positive] + [("negative", v) for v in lab.negative]
    text = _text(col)
    labelled = source.df.where(ok & col.isNotNull())
    row = labelled.agg(F.count(F.lit(1)).alias("rows"),
                       *[F.count(F.when(text == F.lit(v), 1)).alias(f"n{i}") for i, (_, v) in enumerate(listed)]).first()
    missing = [(key, v) for i, (key, v) in enumerate(listed) if not row[f"n{i}"]]
    if not row["rows"] or not missing:  # no labelled row at all: the no-usable-rows error says so
        return
    key, value = missing[0]
    held = labelled.groupBy(text.alias("v")).count().orderBy(F.desc("count"), "v").limit(6).collect()
    shown = ", ".join(f"{r[0]!r} ({r[1]})" for r in held[:5]) + (", ..." if len(held) > 5 else "")
    hint = ""
    if value in _YAML_BOOLEANS and not isinstance(dtype, T.BooleanType):
        like = [r[0] for r in labelled.where(F.lower(text).isin(*_YAML_BOOLEANS[value]))
                .select(text.alias("v")).distinct().orderBy("v").limit(1).collect()]
        word = like[0] if like else ("Yes" if value == "true" else "No")
        hint = (f"; YAML read the unquoted {word} as a boolean; quote it: {key}: ['{word}']" if like else
                f"; if you wrote yes/no/on/off unquoted, YAML read it as a boolean: quote it ({key}: ['{word}'])")
    raise SourceError(f"dataset spec {spec.file!r}, key 'label.{key}': {value!r} matches no row of the label "
                      f"column {lab.column!r} (most common values: {shown}){hint}")


def check_label_classes(spec: DatasetSpec, plan: dict, class_counts: dict, rejected: dict,
                        filtered: int) -> None:
    """A classification label needs two classes among the usable rows: one class alone is an
    error naming it, with the rows it has, before anything is written (not a selector's error
    in prepare). ``class_counts`` maps a usable row's ``label`` value to its count."""
    if plan["task"] not in ("binary", "multiclass") or not class_counts:
        return
    present = {k: v for k, v in class_counts.items() if v}
    if len(present) >= 2:
        return
    (value, n), = present.items()
    lab = spec.label
    if plan["task"] == "binary":
        cls = int(value)
        what = (f"class {cls} ({lab.column!r} {plan['rule']}): {n} rows, none of class {1 - cls}; a binary "
                "label needs both")
    else:
        cls = plan["classes"][int(value)]
        others = [c for c in plan["classes"] if c != cls]
        what = (f"class {cls!r}: {n} rows, none of {others}; a multiclass label needs at least two "
                "classes present")
    raise SourceError(f"label {lab.column!r}: every usable row is {what} (rejected: {rejected or 'none'}; "
                      f"left out by the filter: {filtered}) (dataset spec {spec.file})")


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
    col = F.col(names.quoted(lab.column))
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
    text = F.expr("to_json(struct(" + ", ".join(names.quoted(c) for c in columns) + "))")
    h = F.lower(F.hex(F.xxhash64(text)))
    n = F.row_number().over(Window.partitionBy(h).orderBy(text)) - 1
    return F.concat(h, F.lit("-"), n.cast("string"))


def classify_rows(spec: DatasetSpec, source: Source, categorical: list[str], numeric: list[str],
                  plan: dict, sample_fraction: float = 1.0, seed: int = 42,
                  renamed: dict[str, str] | None = None) -> DataFrame:
    """Every source row with ``reason`` (null = usable; "__filtered__" = left out by the
    filter), ``raw_record`` and the output columns, under their internal names
    (``renamed``: :func:`internal_names`; each renamed column's metadata keeps its source name).

    The plan stays flat and cheap to build whatever the width. The per-column work is SQL
    text Spark parses once (``selectExpr``), not a Column built call by call over py4j
    (about 90 driver round trips per numeric column before), and the NaN/infinity check of
    every number is one expression over an array of them (the first bad column's name is
    looked up by its position), not one ``when`` per column in a chain: nested, 33 numeric
    columns took over 17 minutes to plan and 500 overflowed the driver's stack."""
    from sparkdeep.transformers.sampling import hash_uniform
    renamed = dict(renamed or {})
    q, lit = names.quoted, names.sql_string
    df = source.df
    text = CORRUPT in df.columns
    key = spec.key or DERIVED_KEY
    if not spec.key:
        df = df.withColumn(DERIVED_KEY, derived_key(list(df.columns)))
    if sample_fraction < 1.0:
        df = df.where(hash_uniform(F.xxhash64(F.lit(seed), F.col(q(key)))) < sample_fraction)
    value, label_reason = label_column(spec, plan, source.declared[spec.label.column].dataType)
    first = F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed record or a value that does not parse as its "
                                                     "declared type")) if text else None
    if spec.key:
        first = (first if first is not None else F).when(F.col(q(key)).isNull(), F.lit(f"key {spec.key!r} is null"))
    if spec.filter:
        first = (first if first is not None else F).when(~F.coalesce(filter_condition(spec, df), F.lit(False)),
                                                         F.lit("__filtered__"))
    first = first if first is not None else F.lit(None).cast("string")
    # A few Columns for the row-level rules (key, filter, label), then the wide part as SQL.
    staged = df.select("*", first.alias(_STAGED["first"]), label_reason.alias(_STAGED["label_reason"]),
                       value.alias(_STAGED["label"]))
    checks = [q(_STAGED["first"]), q(_STAGED["label_reason"])]
    as_number = numeric_sql(source.declared, numeric)
    if numeric:
        values = "array(" + ", ".join(as_number[c] for c in numeric) + ")"
        labels = "array(" + ", ".join(lit(repr(c)) for c in numeric) + ")"
        pos = f"CAST(array_position(transform({values}, x -> isnan(x) OR abs(x) = double('inf')), true) AS INT)"
        checks.append(f"CASE WHEN {pos} > 0 THEN concat('numeric feature ', element_at({labels}, {pos}), "
                      "' is NaN or infinite') END")
    raw = q(CORRUPT) if text else "CAST(NULL AS STRING)"
    row_json = "to_json(struct(" + ", ".join(q(c) for c in source.declared.fieldNames()) + "))"

    def out(c: str) -> str:
        return q(renamed.get(c, c))

    exprs = [f"{q(key)} AS {out(key)}"]
    exprs += [f"lower(CAST({q(c)} AS STRING)) AS {out(c)}" if isinstance(source.declared[c].dataType, T.BooleanType)
              else f"CAST({q(c)} AS STRING) AS {out(c)}" for c in categorical]
    exprs += [f"{as_number[c]} AS {out(c)}" for c in numeric]
    exprs += [f"{q(_STAGED['label'])} AS {LABEL}", f"coalesce({', '.join(checks)}) AS reason",
              f"coalesce({raw}, {row_json}) AS raw_record"]
    wide = staged.selectExpr(*exprs)
    # Metadata in one step: each renamed column's source name, the label's classes.
    meta = {renamed[c]: {names.ORIGINAL_NAME: c} for c in renamed}
    meta[LABEL] = label_metadata(plan)
    schema = T.StructType([T.StructField(f.name, f.dataType, f.nullable, {**(f.metadata or {}), **meta.get(f.name, {})})
                           for f in wide.schema.fields])
    return wide.to(schema)


#: Columns classify_rows stages between its two projections (not in its output).
_STAGED = {"first": "__sparkdeep_first_reason", "label_reason": "__sparkdeep_label_reason",
           "label": "__sparkdeep_label"}


# -- the filter: data, not code ------------------------------------------------------------------

#: The functions a spec's ``filter`` may call: Spark builtins that compute a value from the row
#: alone. An allow-list: anything else - a Java call (reflect, java_method, try_reflect), a read
#: of files, the session or its config, a random or file-layout value, an aggregate, window or
#: generator, a UDF, a catalog function, an unknown name - is refused before Spark runs anything.
FILTER_FUNCTIONS = frozenset("""
    and or not if nullif nvl nvl2 ifnull coalesce isnull isnotnull isnan nanvl equal_null between in
    greatest least nullifzero zeroifnull
    like ilike rlike regexp regexp_like regexp_extract regexp_extract_all regexp_replace regexp_count
    regexp_instr regexp_substr startswith endswith contains find_in_set instr locate position
    lower upper lcase ucase initcap length len char_length character_length octet_length bit_length
    trim ltrim rtrim btrim substr substring substring_index left right lpad rpad concat concat_ws replace
    translate reverse split split_part ascii chr char levenshtein soundex format_string printf
    format_number overlay elt mask luhn_check to_char to_varchar to_number try_to_number
    base64 unbase64 hex unhex parse_url try_parse_url url_decode try_url_decode url_encode collate
    abs negative positive sign signum ceil ceiling floor round bround rint sqrt cbrt exp expm1 ln log
    log10 log2 log1p pow power mod pmod div try_add try_subtract try_multiply try_divide try_mod sin cos
    tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh cot sec csc degrees radians pi e hypot
    factorial width_bucket bin conv shiftleft shiftright shiftrightunsigned bit_count bit_get getbit
    hash xxhash64 crc32 md5 sha sha1 sha2
    current_date current_timestamp now localtimestamp date to_date try_to_date to_timestamp
    try_to_timestamp to_timestamp_ltz to_timestamp_ntz timestamp date_add date_sub dateadd datediff
    date_diff add_months months_between date_trunc trunc date_format date_part datepart extract year
    quarter month day dayofmonth dayofweek dayofyear weekday weekofyear hour minute second last_day
    next_day dayname monthname make_date make_timestamp make_interval make_dt_interval make_ym_interval
    from_unixtime unix_timestamp to_unix_timestamp unix_date unix_seconds unix_millis unix_micros
    timestamp_seconds timestamp_millis timestamp_micros date_from_unix_date from_utc_timestamp
    to_utc_timestamp convert_timezone
    cast bigint int smallint tinyint double float decimal string boolean
    array array_contains arrays_overlap array_position array_size size cardinality element_at
    try_element_at get slice array_distinct array_join array_max array_min array_sort sort_array
    array_union array_intersect array_except array_remove array_compact flatten map map_keys map_values
    map_contains_key struct named_struct exists forall filter transform aggregate reduce zip_with
    get_json_object json_array_length json_object_keys
""".split())

#: Why some builtins are not on the list (any other function is refused as not on it).
_FILTER_REFUSED_WHY = {
    **dict.fromkeys(("reflect", "java_method", "try_reflect"), "it calls a Java method"),
    **dict.fromkeys(("from_protobuf", "to_protobuf", "from_avro", "to_avro", "schema_of_avro"),
                    "it can read a descriptor file or a schema registry"),
    **dict.fromkeys(("current_user", "user", "session_user", "current_catalog", "current_database",
                     "current_schema", "current_timezone", "version"),
                    "it reads the session, not the row: the rows kept would depend on who runs ingest where"),
    **dict.fromkeys(("input_file_name", "input_file_block_start", "input_file_block_length",
                     "spark_partition_id", "monotonically_increasing_id"),
                    "it depends on the files' layout, not on the row"),
    **dict.fromkeys(("rand", "randn", "random", "uuid", "shuffle", "randstr", "uniform"),
                    "it is random: the rows kept would change between runs (data.sample_fraction samples "
                    "by key, repeatably)"),
    **dict.fromkeys(("raise_error", "assert_true"), "it fails the query on purpose"),
}
_FILTER_GROUP_WHY = {"agg_funcs": "it is an aggregate, and a filter is a condition on one row",
                     "window_funcs": "it is a window function, and a filter is a condition on one row",
                     "generator_funcs": "it makes rows, and a filter is a condition on one row"}

#: The parsed (unresolved) expression nodes a filter may hold, besides calls of the functions above.
_FILTER_NODES = frozenset("""
    UnresolvedAttribute UnresolvedFunction UnresolvedExtractValue Literal And Or Not EqualTo EqualNullSafe
    LessThan LessThanOrEqual GreaterThan GreaterThanOrEqual In IsNull IsNotNull IsUnknown IsNotUnknown
    Like ILike RLike LikeAny LikeAll NotLikeAny NotLikeAll Cast CaseWhen Add Subtract Multiply Divide
    Remainder IntegralDivide UnaryMinus UnaryPositive BitwiseNot BitwiseAnd BitwiseOr BitwiseXor ShiftLeft
    ShiftRight ShiftRightUnsigned Concat Substring StringTrim StringTrimLeft StringTrimRight StringLocate
    Overlay TimestampAdd TimestampDiff LambdaFunction UnresolvedNamedLambdaVariable NamedArgumentExpression
    CreateNamedStruct Collate UnresolvedCollation
""".split())
_FILTER_NODES_WHY = {
    "ScalarSubquery": "a subquery (SELECT): a filter is a condition on the source's own rows, it may not read "
                      "other tables",
    "Exists": "a subquery (EXISTS): a filter is a condition on the source's own rows, it may not read other tables",
    "ListQuery": "a subquery (IN (SELECT ...)): a filter is a condition on the source's own rows, it may not read "
                 "other tables",
    "InSubquery": "a subquery (IN (SELECT ...)): a filter is a condition on the source's own rows, it may not read "
                  "other tables",
    "LateralSubquery": "a subquery: a filter is a condition on the source's own rows, it may not read other tables",
    "ExpressionWithUnresolvedIdentifier": "IDENTIFIER(), which makes a name (a function's too) from a value",
    "WindowExpression": "a window (OVER): a filter is a condition on one row",
    "AggregateExpression": "an aggregate: a filter is a condition on one row",
    "NamedParameter": "a parameter marker, which nothing binds",
    "PosParameter": "a parameter marker, which nothing binds",
    "UnresolvedStar": "a star (*): name the columns",
}
#: Bare names Spark reads as a call when no column has the name (``current_user`` = ``current_user()``).
_NAME_CALLS = ("current_date", "current_timestamp", "current_time", "current_user", "user", "session_user")
_CATALYST = ("org.apache.spark.sql.catalyst.expressions.", "org.apache.spark.sql.catalyst.analysis.")


def check_filter(spark: SparkSession, spec: DatasetSpec, columns: list[str] | None = None) -> None:
    """Refuse a ``filter`` that could do more than compute a true/false from the row's values:
    Spark's own parser reads it (nothing runs), and every node of the parsed expression must be
    plain syntax (comparison, arithmetic, CASE, CAST, LIKE, IN a list, lambdas...) and every call
    one of :data:`FILTER_FUNCTIONS`, unqualified, still Spark's builtin in this session (a UDF
    registered under a builtin's name is refused). With ``columns`` (the source's), a name that is
    not a column is refused too: Spark would read it as a session variable or a call
    (``current_user``). A ``SourceError`` names the function or construct, the key and the file."""
    if not spec.filter.strip():
        return
    where = f"dataset spec {spec.file!r}, key 'filter': {spec.filter!r}"
    jvm, session = spark._jvm, spark._jsparkSession
    try:
        tree = session.sessionState().sqlParser().parseExpression(spec.filter)
    except Exception as exc:  # noqa: BLE001 - Spark's ParseException names the position
        raise SourceError(f"{where} is not a valid SQL condition on the source: {error_line(exc, typed=False, limit=400)}") from None
    known = None if columns is None else {c.lower() for c in columns}
    calls: list[str] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        cls = node.getClass().getName().split("$$anon")[0]
        simple = cls.rsplit(".", 1)[-1].rstrip("$")
        if not cls.startswith(_CATALYST) or simple not in _FILTER_NODES:
            why = _FILTER_NODES_WHY.get(simple, f"the SQL construct {node.nodeName()}, which a filter may not use: a "
                                                "filter is a condition on the row's values")
            raise SourceError(f"{where} holds {why} (ingest refuses it before reading any row)")
        if simple == "UnresolvedFunction":
            parts = [str(p) for p in _seq(node.nameParts())]
            calls.append(".".join(parts))
        elif simple == "UnresolvedAttribute" and known is not None:
            parts = [str(p) for p in _seq(node.nameParts())]
            if parts[0].lower() not in known:
                if len(parts) == 1 and parts[0].lower() in _NAME_CALLS:
                    calls.append(parts[0])
                else:
                    whole = ".".join(parts)
                    hint = ("; quote a column name with a dot, space or parenthesis in backticks, e.g. "
                            f"{names.quoted(whole)}" if any(ch in names.UNSAFE for c in columns for ch in c) else "")
                    raise SourceError(f"{where} is not a valid SQL condition on the source: {whole!r} is "
                                      f"not a column (columns: {', '.join(columns[:20])}"
                                      f"{', ...' if len(columns) > 20 else ''}){hint}")
        stack.extend(_seq(node.children()))
    if not calls:
        return
    fid = jvm.org.apache.spark.sql.catalyst.FunctionIdentifier
    builtin = jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin()
    registry = session.sessionState().functionRegistry()
    for name in calls:
        low = name.lower()
        info = None if "." in name else builtin.lookupFunction(fid.apply(low))
        if "." in name:
            why = "a qualified name: a catalog's function, not Spark's builtin (write the bare builtin name)"
        elif info is None or not info.isDefined():
            why = "not a Spark builtin function (a UDF registered in the session, a catalog function, or a typo)"
        elif low in FILTER_FUNCTIONS:
            mine = registry.lookupFunction(fid.apply(low))
            if mine.isDefined() and mine.get().getClassName() == info.get().getClassName():
                continue
            why = "a function registered in this session under a builtin's name (a UDF), not Spark's builtin"
        else:
            why = _FILTER_REFUSED_WHY.get(low) or _FILTER_GROUP_WHY.get(str(info.get().getGroup())) or \
                "it is not one of the pure builtins a filter may use (pipelines/ingest.py FILTER_FUNCTIONS)"
        raise SourceError(f"{where} calls {name}(): {why}. A filter may call only Spark's builtins that compute "
                          "from the row alone (comparison, arithmetic, string, math, date, null handling, "
                          "conditional, cast, regexp, array/map); ingest refuses it before reading any row")


def _seq(seq) -> list:
    """A Scala Seq from py4j as a Python list."""
    return [seq.apply(i) for i in range(seq.size())]


def filter_condition(spec: DatasetSpec, df: DataFrame) -> Column:
    """The spec's ``filter`` as a boolean column of ``df``, checked now: a syntax error, an
    unknown column, a call :func:`check_filter` refuses or a non-boolean condition is a
    ``SourceError`` naming the filter and file."""
    check_filter(df.sparkSession, spec, df.columns)
    try:
        cond = F.expr(spec.filter)
        kind = df.select(cond.alias("f")).schema["f"].dataType
    except Exception as exc:  # noqa: BLE001 - Spark's parse/analysis errors carry the detail
        raise SourceError(f"dataset spec {spec.file!r}, key 'filter': {spec.filter!r} is not a valid SQL "
                          f"condition on the source: {error_line(exc, typed=False, limit=400)}") from None
    if not isinstance(kind, T.BooleanType):
        raise SourceError(f"dataset spec {spec.file!r}, key 'filter': {spec.filter!r} is {kind.simpleString()}, "
                          "not a true/false condition")
    return cond


def split_classified(classified: DataFrame, key: str) -> tuple[DataFrame, DataFrame]:
    usable = classified.where(F.col("reason").isNull()).drop("reason", "raw_record")
    rejected = (classified.where(F.col("reason").isNotNull() & (F.col("reason") != "__filtered__"))
                .select(F.col(names.quoted(key)).cast("string").alias(key), "reason", "raw_record"))
    return usable, rejected


def check_key_unique(usable: DataFrame, key: str, spec: DatasetSpec) -> None:
    dup = usable.groupBy(names.quoted(key)).count().where("count > 1")
    row = dup.agg(F.count(F.lit(1)).alias("n"), F.first(F.col(names.quoted(key))).alias("example")).first()
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


# -- the step (jobs/ingest.py runs it) ----------------------------------------


def ingest_step(spark, cfg, paths, run) -> dict:
    # Spark parses only the CSV columns a query needs, and then sees fewer malformed lines:
    # every pass here must judge a line the same way, so pruning is off while ingesting.
    with whole_csv_lines(spark):
        try:
            return _ingest_step(spark, cfg, paths, run)
        except SourceError as exc:
            if cfg.dataset.file in str(exc):
                raise
            raise SourceError(f"{exc} (dataset spec {cfg.dataset.file})") from None


def _ingest_step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    # A spec is data, not code: its filter may only compute from the row (Spark's parser
    # reads it, nothing runs), checked before the source is touched, and again against the
    # source's columns (a bare name that is no column would be a session variable or a call).
    check_filter(spark, spec)
    claim_output(paths, spec)
    record = schema_record_path(paths.table(""), spec)
    source = read_source(spark, spec, read_recorded_schema(record))
    check_filter(spark, spec, source.df.columns)
    categorical, numeric, left_out = resolve_features(spec, source)
    ok = F.col(CORRUPT).isNull() if CORRUPT in source.df.columns else F.lit(True)
    plan = label_plan(spec, source, ok)
    # Kept for the key check, the counts and both writes: one pass over the source instead
    # of four (a builtin loader's joins ran again on each). On the executors' local disk,
    # not in memory: a memory cache is built inside the key check's tasks and starved their
    # hash aggregation (10x rows with a 3g JVM failed with AGGREGATE_OUT_OF_MEMORY; on disk
    # it passes, and takes the same time at 1x: bench/RESULTS.md).
    renamed = internal_names(spec, categorical, numeric)
    classified = classify_rows(spec, source, categorical, numeric, plan,
                                   cfg.data.sample_fraction, cfg.seed, renamed).persist(StorageLevel.DISK_ONLY)
    try:
        report = _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
                        classified)
        report["renamed_columns"] = renamed
        if renamed:
            shown = ", ".join(f"{k!r} -> {v!r}" for k, v in list(renamed.items())[:5])
            log.info("[ingest] %s column name(s) Delta or MLlib cannot take are stored under internal names "
                     "(%s%s); the saved model accepts either, and reports show the source names",
                     len(renamed), shown, ', ...' if len(renamed) > 5 else '')
        return report
    finally:
        classified.unpersist()


def _write(spark, cfg, paths, run, spec, record, source, categorical, numeric, left_out, plan,
           classified) -> dict:
    usable, rejected = split_classified(classified, spec.key_column)
    if spec.key:
        check_key_unique(usable, spec.key_column, spec)
    # One aggregation: the rows by reason, and the usable rows by class (a label with one
    # class stops the step here, before anything is written).
    by_class = F.when(F.col("reason").isNull(), F.col(LABEL)) if plan["task"] != "regression" else F.lit(None)
    counts, class_counts = {}, {}
    for r in classified.groupBy("reason", by_class.alias("_class")).count().collect():
        counts[r["reason"]] = counts.get(r["reason"], 0) + int(r["count"])
        if r["reason"] is None and r["_class"] is not None:
            class_counts[r["_class"]] = int(r["count"])
    # The full source is counted on its own; a sample's input is the rows the sample kept.
    rows_in = source.df.count() if cfg.data.sample_fraction >= 1.0 else sum(counts.values())
    if not counts.get(None):  # checked before any write: a failed ingest leaves the output as it was
        filtered = counts.get("__filtered__", 0)
        by_reason = {k: v for k, v in counts.items() if k not in (None, "__filtered__")}
        raise ValueError(
            f"no usable rows in {spec.source.path or spec.source.table or spec.source.loader} "
            f"({spec.file}): {rows_in} rows read, {filtered} left out by the filter {spec.filter!r}, "
            f"rejected: {by_reason or 'none'}" + (f"; sample_fraction {cfg.data.sample_fraction} kept "
                                                 f"{sum(counts.values())}" if cfg.data.sample_fraction < 1 else ""))
    check_label_classes(spec, plan, class_counts,
                            {k: v for k, v in counts.items() if k not in (None, "__filtered__")},
                            counts.get("__filtered__", 0))

    out = run.write(usable, spec.table)
    rej = run.write(rejected.coalesce(1), spec.rejected_table)
    written = delta_io.read(spark, out.path, out.version)
    report = ingest_report(rows_in, dict(counts), written, plan)
    written_rejected = delta_io.read(spark, rej.path, rej.version).count()
    written_usable = written.count()
    if report["rows_usable"] != written_usable or report["rows_rejected"] != written_rejected:
        raise RuntimeError(f"ingest wrote {written_usable} usable and {written_rejected} rejected rows, "
                           f"but classified {report['rows_usable']} and {report['rows_rejected']}")
    if not report["accounted"]:
        raise RuntimeError(f"ingest lost rows: {report['rows_in']} in, {report['rows_usable']} usable + "
                           f"{report['rows_rejected']} rejected + {report['rows_filtered']} filtered")
    write_json(record, source.declared.jsonValue())
    claim_output(paths, spec, write=True)
    levels = approx_distinct(source.df, categorical)  # every categorical column's levels, in one pass
    report.update({
        "dataset": spec.name, "task": spec.task, "spec_file": spec.file,
        "source": {"format": spec.source.format, "path": spec.source.path, "table": spec.source.table,
                   "loader": spec.source.loader, "version": source.version,
                   "declared_from": source.declared_from, **source.notes},
        "features": {"categorical": categorical, "numeric": numeric, "left_out": left_out,
                     "levels": levels},
        "new_columns_ignored": source.new_columns,
        "label": {"column": spec.label.column, **{k: v for k, v in plan.items() if k != "task"}},
        "tables": {spec.table: out.as_dict(), spec.rejected_table: rej.as_dict()},
        "sample_fraction": cfg.data.sample_fraction,
    })
    log.info("[ingest] %s: %s rows read: %s usable, %s rejected %s, %s left out by the filter",
             spec.name, report['rows_in'], report['rows_usable'], report['rows_rejected'],
             _top(report['rejected_by_reason']), report['rows_filtered'])
    if plan.get("class_0_values"):
        more = "" if plan["class_0_values_listed_all"] else ", ..."
        log.info("[ingest] label %r: class 1 = %s; class 0 = every other value: %s%s (set label.negative to reject "
                 "values in neither list)",
                 spec.label.column, list(spec.label.positive), plan['class_0_values'], more)
    log.info("[ingest] features: %s categorical, %s numeric%s%s", len(categorical), len(numeric),
             f"; left out {len(left_out)}: {listed(sorted(left_out), 10)}" if left_out else "",
             f"; new source columns ignored: {listed(source.new_columns, 10)}" if source.new_columns else "")
    log_levels(levels, left_out)
    return report


#: The most columns :func:`log_levels` names one line each (the report holds them all).
LINES_PER_KIND = 20


def log_levels(levels: dict[str, int], left_out: dict[str, str]) -> None:
    """One console line per categorical column with its level count (the most levels first)
    and one per column left out, with the reason: no column leaves the features unsaid. Past
    :data:`LINES_PER_KIND` lines of a kind, one line counts the rest."""
    ranked = sorted(levels.items(), key=lambda kv: -kv[1])
    for name, n in ranked[:LINES_PER_KIND]:
        log.info("[ingest] categorical %r: about %d levels", name, n)
    if len(ranked) > LINES_PER_KIND:
        log.info("[ingest] ... and %d more categorical columns (features.levels in the ingest report)",
                 len(ranked) - LINES_PER_KIND)
    for name in sorted(left_out)[:LINES_PER_KIND]:
        log.info("[ingest] left out %r: %s", name, left_out[name])
    if len(left_out) > LINES_PER_KIND:
        log.info("[ingest] ... and %d more columns left out (features.left_out in the ingest report)",
                 len(left_out) - LINES_PER_KIND)


def _top(counts: dict, at_most: int = 10) -> str:
    """The ``at_most`` largest counts (a wide table can reject rows for thousands of reasons:
    one per column; the report has them all)."""
    if len(counts) <= at_most:
        return str(counts)
    top = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:at_most])
    return f"{top} and {len(counts) - at_most} more reasons (in the ingest report)"
