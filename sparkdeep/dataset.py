"""A dataset spec: which table, which rows, which columns, which task.

One YAML file per data set, ``conf/datasets/<name>.yaml`` (or any path), chosen with
``--dataset NAME|PATH`` (the config key ``data.dataset``); ``--set dataset.label.threshold=30``
overrides one key of it. Every step below the spec receives it; nothing there names a
data set. Keys::

    name: gems                     # letters, digits, _ ; names the Delta tables
    source:
      format: csv                  # delta | parquet | csv | json | table | builtin
      path: /data/gems.csv     # delta/parquet/csv/json (a folder or file, any Hadoop URI)
      table: ""                    # format: table - a catalog table name
      loader: ""                   # format: builtin - "sparkdeep.<module>:<function>(spark)"
      options: {header: "true"}    # reader options
      version: null                # delta: pin this table version
    schema: "carat DOUBLE, cut STRING, price INT"   # DDL; required for csv/json, checked otherwise
    key: ""                        # a unique row id column; "" = row_id derived from the row
    label:
      column: price
      task: regression             # binary | multiclass | regression
      positive: []                 # binary: the value(s) that are class 1 (quote Yes/No/on/off:
                                   #   unquoted they are YAML booleans, read as true/false)
      negative: []                 # binary with positive: the class-0 value(s); any other value is
                                   #   rejected (empty: every other value is class 0, listed in the report)
      threshold: null              # binary: a number; column >= threshold is class 1
      classes: []                  # multiclass: a fixed class order (default: sorted values)
    features:
      categorical: null            # null = every string/boolean column (inferred)
      numeric: null                # null = every numeric column (inferred)
      exclude: []                  # leaking or useless columns, never features
      max_categories: 1000         # inferred string columns with more distinct values are left out
    filter: ""                     # a SQL condition; rows failing it are counted, not ingested.
                                   #   Data, not code: plain SQL and pure Spark builtins only
                                   #   (pipelines/ingest.py check_filter)

Errors are :class:`~sparkdeep.config.ConfigError` naming the key and the file. The spec is
checked again against the real source at ingest (see ``pipelines/ingest.py``).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sparkdeep import tasks
from sparkdeep.registry import Columns, Tables
from sparkdeep.typed_yaml import ConfigError, Fields, put_dotted, read_mapping

FORMATS = ("delta", "parquet", "csv", "json", "table", "builtin")
TEXT_FORMATS = ("csv", "json")

#: The key column's name when the spec has no key: a stable id derived from the row.
DERIVED_KEY = Columns.KEY
#: The label column every table below ingest holds (0/1, class index or target value).
LABEL = Columns.LABEL
#: Columns the pipeline creates; a source column may not take these names.
RESERVED = ("label", "features", "sample_weight", "prediction", "probability", "rawPrediction",
            "assembled", "varying", "informative", "selected", "numeric", "numeric_scaled", "reason",
            "raw_record", "_corrupt_record")
#: Suffixes of the columns the stages derive from a source column (index, one-hot, imputed,
#: quantile bin) and of the baselines' outputs (``<model>__prediction`` ...).
RESERVED_SUFFIXES = ("__idx", "__ohe", "__imp", "__bin", "__prediction", "__probability", "__raw")


def reserved(column: str) -> bool:
    """Whether ``column`` is a name the pipeline creates itself (a source column may not take
    it), in any case: Spark resolves column names case-insensitively, so ``Numeric`` would
    be ambiguous beside the pipeline's ``numeric``."""
    name = column.lower()
    return name in {r.lower() for r in RESERVED} or name.endswith(tuple(s.lower() for s in RESERVED_SUFFIXES))
#: Builtin loaders must live in this package: a spec names code only the project ships.
BUILTIN_PREFIX = "sparkdeep."


class SpecError(ConfigError):
    """A dataset spec is invalid; the message names the key and the file."""


@dataclass(frozen=True)
class SourceSpec:
    format: str
    path: str = ""
    table: str = ""
    loader: str = ""
    options: Mapping[str, str] = field(default_factory=dict)
    version: int | None = None


@dataclass(frozen=True)
class LabelSpec:
    column: str
    task: str
    positive: tuple[str, ...] = ()
    negative: tuple[str, ...] = ()
    threshold: float | None = None
    classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class FeatureSpec:
    categorical: tuple[str, ...] | None = None
    numeric: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    max_categories: int = 1000


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    source: SourceSpec
    label: LabelSpec
    schema: str = ""
    key: str = ""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    filter: str = ""
    file: str = ""  # where the spec was read from, for messages

    @property
    def task(self) -> str:
        return self.label.task

    @property
    def key_column(self) -> str:
        """The key's column in every table below ingest: its internal name (``sparkdeep.names``)."""
        from sparkdeep.names import internal_name
        return internal_name(self.key) if self.key else DERIVED_KEY

    @property
    def table(self) -> str:
        """The Delta table of usable rows (under ``<output>/tables``)."""
        return self.name

    @property
    def rejected_table(self) -> str:
        return f"{self.name}_rejected"

    def declared_columns(self) -> list[str]:
        """Source columns the spec names explicitly (all must exist at ingest)."""
        cols = [self.label.column] + ([self.key] if self.key else [])
        cols += list(self.features.categorical or ()) + list(self.features.numeric or ())
        return list(dict.fromkeys(cols))

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["source"]["options"] = dict(self.source.options)
        return out


# -- loading -----------------------------------------------------------------------------------

def spec_path(ref: str, conf_dir: str | Path) -> Path:
    """``ref`` is a file path (it has a ``/`` or ends in .yaml/.yml) or a name under
    ``<conf_dir>/datasets/``."""
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        return Path(ref)
    if not re.fullmatch(r"[A-Za-z0-9_]+", ref):
        raise SpecError(f"data.dataset {ref!r} is neither a spec name (letters, digits, _) nor a .yaml path")
    return Path(conf_dir) / "datasets" / f"{ref}.yaml"


def available(conf_dir: str | Path) -> list[str]:
    return sorted(p.stem for p in (Path(conf_dir) / "datasets").glob("*.yaml"))


def load_spec(ref: str, conf_dir: str | Path = "conf", overrides: dict[str, Any] | None = None) -> DatasetSpec:
    """Read, override and validate the spec ``ref``; errors name the key and the file."""
    path = spec_path(ref, conf_dir)
    if not path.is_file():
        known = available(conf_dir)
        raise SpecError(f"dataset spec {str(path)!r} does not exist (data.dataset={ref!r}; specs in "
                        f"{Path(conf_dir) / 'datasets'}: {', '.join(known) or 'none'})")
    tree = read_mapping(path, "dataset spec", SpecError)
    for key, value in (overrides or {}).items():
        try:
            put_dotted(tree, key.split("."), value)
        except ValueError as exc:
            raise SpecError(f"--set dataset.{key}: dataset.{exc} is not a mapping in {str(path)!r}") from None
    spec = _build(DatasetSpec, tree, "", str(path))
    spec = dataclasses.replace(spec, file=str(path))
    validate(spec)
    return spec


#: The specs' wording of the shared YAML-to-dataclass rules (sparkdeep.typed_yaml.Fields), lenient:
#: an empty string, list or mapping may be left null, one value stands for a list of one.
_FIELDS = Fields(
    error=SpecError,
    where=lambda key, file: f"key {key!r} in dataset spec {file!r}",
    unknown=lambda key, file, known: f"unknown key {key!r} in dataset spec {file!r} (known here: {known})",
    missing=lambda key, file: f"dataset spec {file!r} lacks the required key {key!r}",
    lenient=True, skip=("file",))


def _build(cls: type, tree: Mapping, prefix: str, file: str):
    return _FIELDS.build(cls, tree, prefix, lambda dotted: file)


#: The first word of every Spark SQL data type a DDL column may have (case ignored).
_DDL_TYPES = frozenset("""boolean tinyint byte smallint short int integer bigint long float real double decimal dec
numeric date time timestamp timestamp_ntz timestamp_ltz string varchar char character binary array map struct
interval void variant geometry geography""".split())
#: A whole-schema ``STRUCT<...>``, which Spark's DDL reader also takes.
_DDL_STRUCT = re.compile(r"\s*struct\s*<(.*)>\s*", re.IGNORECASE | re.DOTALL)
_DDL_NAME = re.compile(r"\s*(`(?:[^`]|``)+`|[A-Za-z0-9_]+)\s*:?\s*([A-Za-z_]+)?")


def ddl_problem(schema: str) -> str | None:
    """What makes ``schema`` not a list of ``name TYPE`` column definitions, or None.

    The shape only (names, commas, a known type word, balanced brackets and quotes), in
    Python, so a spec is refused before a run writes anything; Spark's parser reads the
    types themselves at ingest (``pipelines.ingest.parse_ddl``).

    >>> ddl_problem("id BIGINT, `price (usd)` DECIMAL(10, 2), tags ARRAY<STRING>") is None
    True
    >>> ddl_problem("id BIGINT, income usd DOUBLE")
    "column 2 ('income usd DOUBLE'): 'usd' is not a Spark SQL type"
    """
    if not schema.strip():
        return None
    whole = _DDL_STRUCT.fullmatch(schema)
    if whole:
        schema = whole.group(1)
    # One pass: split at top-level commas, with -- comments left out of each column's text.
    parts, current, depth, quote, escaped, comment = [], [], 0, "", False, False
    for i, ch in enumerate(schema):
        if comment:  # a -- comment runs to the end of its line
            comment = ch != "\n"
            continue
        if escaped:
            escaped = False
        elif quote:
            escaped = ch == "\\" and quote != "`"
            quote = "" if ch == quote and not escaped else quote
        elif ch in "`'\"":
            quote = ch
        elif ch == "-" and schema[i + 1:i + 2] == "-":
            comment = True
            continue
        elif ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
            if depth < 0:
                return f"an unmatched {ch!r} at character {i + 1}"
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if quote or depth:
        return f"an unclosed {quote}" if quote else "an unclosed '<' or '('"
    parts.append("".join(current))
    for n, part in enumerate(parts, 1):
        if not part.strip():
            return f"column {n} is empty (two commas in a row, or one at an end)"
        m = _DDL_NAME.match(part)
        word = m.group(2) if m else None
        if not m or not word:
            return f"column {n} ({part.strip()!r}) is not a name followed by a type"
        if word.lower() not in _DDL_TYPES:
            return f"column {n} ({part.strip()!r}): {word!r} is not a Spark SQL type"
    return None


def validate(spec: DatasetSpec) -> None:
    """Checks that need no data; each error names the key and the file."""
    f = spec.file

    def bad(key: str, why: str):
        raise SpecError(f"dataset spec {f!r}, key {key!r}: {why}")

    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", spec.name):
        bad("name", f"{spec.name!r} must start with a letter and hold only letters, digits and _ "
                    "(it names the Delta tables)")
    taken = {t.lower() for t in (*Tables.ALL, Tables.RUNS)}
    for own in (spec.table, spec.rejected_table):
        if own.lower() in taken:
            bad("name", f"{spec.name!r} would name the table {own!r}, which a step writes under that name "
                        f"beside it ({', '.join(sorted(taken))}); choose another name")
    s = spec.source
    if s.format not in FORMATS:
        bad("source.format", f"{s.format!r} is not one of {', '.join(FORMATS)}")
    if s.format in ("delta", "parquet", "csv", "json") and not s.path:
        bad("source.path", f"format {s.format!r} needs a path")
    if s.format == "table" and not s.table:
        bad("source.table", "format 'table' needs a catalog table name")
    if s.format == "builtin":
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", s.loader or ""):
            bad("source.loader", f"{s.loader!r} must look like 'module:function'")
        if not s.loader.startswith(BUILTIN_PREFIX):
            bad("source.loader", f"{s.loader!r}: builtin loaders are the project's own "
                                 f"({BUILTIN_PREFIX}...); read your data with format csv, json, parquet, "
                                 "delta or table instead")
    elif s.loader:
        bad("source.loader", f"only format 'builtin' takes a loader (format is {s.format!r})")
    if s.version is not None and (s.format != "delta" or s.version < 0):
        bad("source.version", "a pinned version is for format 'delta' only, and is >= 0")
    if s.format in TEXT_FORMATS and not spec.schema.strip():
        bad("schema", f"format {s.format!r} needs a DDL schema (e.g. \"id BIGINT, price DOUBLE, cut STRING\"): "
                      "text has no types of its own")
    problem = ddl_problem(spec.schema)
    if problem:
        bad("schema", f"not a valid DDL schema ({spec.schema!r}): {problem}; a column name with a space, dot or "
                      "other character outside letters, digits and _ goes in backticks (`income.usd` DOUBLE)")
    lab = spec.label
    if lab.task not in tasks.TASKS:
        bad("label.task", f"{lab.task!r} is not one of {', '.join(tasks.TASKS)}")
    if not lab.column:
        bad("label.column", "names the label column; it may not be empty")
    if lab.task == "binary" and lab.positive and lab.threshold is not None:
        bad("label", "give positive or threshold for a binary label, not both")
    if lab.task != "binary" and (lab.positive or lab.threshold is not None):
        bad("label.positive" if lab.positive else "label.threshold", f"is for task 'binary', not {lab.task!r}")
    if lab.negative and not lab.positive:
        bad("label.negative", "needs label.positive (the class-1 values) beside it")
    if set(lab.negative) & set(lab.positive):
        bad("label.negative", f"shares values with label.positive: {sorted(set(lab.negative) & set(lab.positive))}")
    if lab.task != "multiclass" and lab.classes:
        bad("label.classes", f"is for task 'multiclass', not {lab.task!r}")
    if len(set(lab.classes)) != len(lab.classes):
        bad("label.classes", f"names a class twice: {list(lab.classes)}")
    if lab.task == "multiclass" and len(lab.classes) == 1:
        bad("label.classes", "a multiclass label needs at least 2 classes")
    feats = spec.features
    if feats.max_categories < 2:
        bad("features.max_categories", f"must be >= 2, got {feats.max_categories}")
    cat, num = list(feats.categorical or ()), list(feats.numeric or ())
    for key, cols in (("features.categorical", cat), ("features.numeric", num), ("features.exclude",
                                                                                  list(feats.exclude))):
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            bad(key, f"lists {dup} twice")
        for c in cols:
            if c in (lab.column, spec.key):
                bad(key, f"lists {c!r}, which is the {'label' if c == lab.column else 'key'} column")
            if reserved(c) and key != "features.exclude":  # an excluded column never reaches the stages
                bad(key, f"column {c!r} has a name the pipeline uses itself; rename it in the source or a view")
    both = sorted(set(cat) & set(num))
    if both:
        bad("features", f"{both} are both categorical and numeric")
    excluded_declared = sorted(set(feats.exclude) & (set(cat) | set(num)))
    if excluded_declared:
        bad("features.exclude", f"{excluded_declared} are declared features too")
    if spec.key != "" and reserved(spec.key):
        bad("key", f"{spec.key!r} is a name the pipeline uses itself")
    if spec.key == lab.column:
        bad("key", "the key column cannot be the label column")


__all__ = ["DatasetSpec", "SourceSpec", "LabelSpec", "FeatureSpec", "SpecError", "load_spec", "spec_path",
           "available", "validate", "reserved", "DERIVED_KEY", "LABEL", "FORMATS", "RESERVED",
           "RESERVED_SUFFIXES"]
