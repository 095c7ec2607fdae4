"""Seeded tables of the shapes real exports have, generated on Spark, each knowing how well
its label can be predicted.

A :class:`Shape` says what a table holds: rows, numbers, categories of any level count
(Zipf-skewed), rows repeated (few distinct feature rows, each label drawn per copy), nulls,
constant columns, outliers, dates, timestamps, booleans, integer codes, class imbalance and
odd column names. :func:`generate` makes it with ``spark.range`` and hash expressions (no
driver-side data, a fixed partitioning, so the same seed gives the same rows);
:func:`reachable` measures on it what the generator knows: the metric of the true
probabilities (binary AUC, multiclass accuracy) or of the true signal (regression R^2).

Every feature is a function of the row's *source*: its own id, or, with ``distinct``, one
of ``distinct`` feature rows drawn Zipf-like, so copies repeat exactly; the label is drawn
per row from the source's true probability, so identical feature rows carry both labels.
Nulls are drawn per row and a null value adds nothing to the label's signal, so the label
depends on what the table shows and the truth is reachable from it.

A dataset spec reads one through the builtin loader :func:`sparkdeep.pipelines.examples.generated`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

#: Hidden columns :func:`generate` adds with ``truth=True`` (dropped for the pipeline).
TRUTH, SIGNAL = "__truth", "__signal"
_BUCKETS = 1 << 30
_TASKS = ("binary", "multiclass", "regression")


@dataclass(frozen=True)
class Shape:
    """What a generated table holds (see the module's docstring)."""
    rows: int = 1_000
    task: str = "binary"
    numeric: int = 3
    levels: tuple[int, ...] = (5,)      # one categorical (string) column per entry, with this many levels
    skew: float = 1.0                   # 0 = uniform levels; higher = a few levels hold most rows
    distinct: int = 0                   # > 0: this many distinct feature rows, repeated
    null_rate: float = 0.0              # share of nulls in every feature column
    constant: int = 0                   # constant columns
    outliers: float = 0.0               # share of numbers multiplied by 1,000
    dates: int = 0
    timestamps: int = 0
    booleans: int = 0
    codes: tuple[int, ...] = ()         # integer-coded categories (declare them categorical)
    positive: float = 0.5               # binary: share of class 1 (0.001 = 1:1000)
    classes: int = 3                    # multiclass
    strength: float = 1.5               # how much the features decide the label
    odd_names: bool = False             # dots, spaces and non-ASCII in the names
    seed: int = 0

    def __post_init__(self):
        if self.task not in _TASKS:
            raise ValueError(f"Shape.task must be one of {_TASKS}, got {self.task!r}")
        if self.rows < 1 or any(n < 1 for n in (*self.levels, *self.codes)):
            raise ValueError("Shape needs rows >= 1 and every level count >= 1")
        if not 0 <= self.null_rate < 1 or not 0 < self.positive < 1:
            raise ValueError("Shape needs 0 <= null_rate < 1 and 0 < positive < 1")

    @classmethod
    def from_options(cls, options: dict) -> "Shape":
        """A shape from a spec's ``source.options`` (values as text, lists comma-separated)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ValueError(f"unknown generated-table options {unknown}; known: {sorted(fields)}")
        out = {}
        for name, value in options.items():
            default = fields[name].default
            if isinstance(default, tuple):
                text = str(value).strip("[]() ")
                out[name] = tuple(int(v) for v in text.split(",") if v.strip())
            elif isinstance(default, bool):
                out[name] = str(value).lower() in ("1", "true", "yes")
            else:
                out[name] = type(default)(value)
        return cls(**out)

    def names(self) -> dict[str, list[str]]:
        """The feature columns by kind, and the label's name."""
        def name(kind: str, i: int) -> str:
            if not self.odd_names:
                return f"{kind}{i}"
            return (f"{kind}.{i}", f"{kind} {i}", f"größe_{kind}{i}")[i % 3]
        return {"numeric": [name("num", i) for i in range(self.numeric)],
                "categorical": [name("cat", i) for i in range(len(self.levels))],
                "codes": [name("code", i) for i in range(len(self.codes))],
                "constant": [name("const", i) for i in range(self.constant)],
                "dates": [name("date", i) for i in range(self.dates)],
                "timestamps": [name("ts", i) for i in range(self.timestamps)],
                "booleans": [name("flag", i) for i in range(self.booleans)],
                "label": ["label"]}


def _uniform(*parts) -> Column:
    """A number in [0, 1) from a hash of ``parts`` (Columns or ints)."""
    cols = [p if isinstance(p, Column) else F.lit(p) for p in parts]
    return F.pmod(F.xxhash64(*cols), F.lit(_BUCKETS)).cast("double") / float(_BUCKETS)


def _normal(seed: int, salt: int, source: Column) -> Column:
    """A standard normal number from two hashes (Box-Muller)."""
    u1 = F.greatest(_uniform(seed, salt, 1, source), F.lit(1e-12))
    return F.sqrt(-2.0 * F.log(u1)) * F.cos(2.0 * math.pi * _uniform(seed, salt, 2, source))


def _level(seed: int, salt: int, source: Column, levels: int, skew: float) -> Column:
    """A level index in 0..levels-1, Zipf-like: ``skew`` 0 uniform."""
    u = _uniform(seed, salt, 3, source)
    return F.least(F.floor(F.pow(u, F.lit(1.0 + float(skew))) * levels), F.lit(levels - 1)).cast("long")


def _effect(seed: int, salt: int, value: Column) -> Column:
    """A fixed effect in [-1, 1) of one value of one column."""
    return 2.0 * _uniform(seed, 7919, salt, value) - 1.0


def generate(spark: SparkSession, shape: Shape, truth: bool = False) -> DataFrame:
    """The table of ``shape``: an ``id`` column, the features and ``label``; with ``truth``,
    also :data:`TRUTH` (binary: P(label = 1); multiclass: the most likely class's index;
    regression: the noiseless target) and :data:`SIGNAL` (the score behind it)."""
    s, seed = shape, int(shape.seed)
    parts = max(1, min(64, shape.rows // 50_000 + 1))
    base = spark.range(0, shape.rows, 1, parts)
    row = F.col("id")
    source = (_level(seed, 1, row, s.distinct, 1.0) if s.distinct else row).alias("__source")
    df = base.select("id", source)
    src = F.col("__source")
    n = s.names()
    cols = []  # (name, value, its term of the signal or None)
    # Each column's share of the signal, so its spread stays about `strength` at any width.
    w = s.strength / math.sqrt(max(1, s.numeric + len(s.levels) + len(s.codes) + s.dates + s.timestamps + s.booleans))
    for i, name in enumerate(n["numeric"]):
        x = _normal(seed, 100 + i, src)
        term = w * x * (1.0 if i % 2 == 0 else -0.7)
        if s.outliers:
            x = F.when(_uniform(seed, 150 + i, src) < s.outliers, x * 1000.0).otherwise(x)
        cols.append((name, x, term))
    for i, (name, levels) in enumerate(zip(n["categorical"], s.levels)):
        lv = _level(seed, 200 + i, src, levels, s.skew)
        cols.append((name, F.concat(F.lit(f"c{i}_"), lv.cast("string")), w * 1.5 * _effect(seed, 200 + i, lv)))
    for i, (name, levels) in enumerate(zip(n["codes"], s.codes)):
        lv = _level(seed, 300 + i, src, levels, s.skew)
        cols.append((name, lv.cast("int"), w * 1.5 * _effect(seed, 300 + i, lv)))
    for name in n["constant"]:
        cols.append((name, F.lit(1.0), None))
    for i, name in enumerate(n["dates"]):
        d = F.date_add(F.lit("2020-01-01").cast("date"), F.floor(_uniform(seed, 400 + i, src) * 1500).cast("int"))
        cols.append((name, d, w * _effect(seed, 400 + i, F.month(d))))
    for i, name in enumerate(n["timestamps"]):
        secs = F.floor(_uniform(seed, 500 + i, src) * 1500 * 86400).cast("long")
        t = F.timestamp_seconds(F.lit(1577836800) + secs)
        cols.append((name, t, w * _effect(seed, 500 + i, F.hour(t))))
    for i, name in enumerate(n["booleans"]):
        b = _uniform(seed, 600 + i, src) < 0.5
        cols.append((name, b, w * 0.8 * F.when(b, 1.0).otherwise(-1.0)))
    # Nulls per row (copies of a source row differ), drawn before the label: a null value
    # adds nothing to the signal, so the label depends on what the table shows and the
    # truth stays reachable from it.
    present = [_uniform(seed, 9400 + i, F.col("id")) >= s.null_rate if s.null_rate else None
               for i in range(len(cols))]
    terms = [t if ok is None else F.when(ok, t).otherwise(0.0)
             for (_, _, t), ok in zip(cols, present) if t is not None]
    # One flat sum over an array: no expression nested once per column.
    signal = F.aggregate(F.array(*terms), F.lit(0.0), lambda acc, t: acc + t) if terms else F.lit(0.0)
    df = df.select("id", src, signal.alias(SIGNAL),
                   *[(v if ok is None else F.when(ok, v)).alias(name) for (name, v, _), ok in zip(cols, present)])
    per_row = _uniform(seed, 9001, F.col("id"))  # the label's draw: per row, not per source
    if s.task == "binary":
        bias = math.log(s.positive / (1.0 - s.positive))
        p = 1.0 / (1.0 + F.exp(-(F.col(SIGNAL) + F.lit(bias))))
        df = df.withColumn(TRUTH, p).withColumn("label", (per_row < F.col(TRUTH)).cast("int"))
    elif s.task == "multiclass":
        # Class c's score: the signal shifted by a class-specific amount times a second
        # signal; label = argmax(score + Gumbel noise), the truth = argmax(score).
        second = _normal(seed, 9100, src) * s.strength
        scores = [F.col(SIGNAL) * math.cos(2 * math.pi * c / s.classes) + second *
                  math.sin(2 * math.pi * c / s.classes) for c in range(s.classes)]
        noisy = [sc - F.log(-F.log(F.greatest(_uniform(seed, 9200 + c, F.col("id")), F.lit(1e-12))))
                 for c, sc in enumerate(scores)]
        df = df.withColumn(TRUTH, F.array_position(F.array(*scores), F.greatest(*scores)) - 1)
        df = df.withColumn("label", F.concat(F.lit("k"), (F.array_position(F.array(*noisy), F.greatest(*noisy)) - 1)
                                             .cast("string")))
    else:
        df = df.withColumn(TRUTH, 10.0 * F.col(SIGNAL) + 50.0)
        df = df.withColumn("label", F.col(TRUTH) + 10.0 * _normal(seed, 9300, F.col("id")))
    keep = ["id", *[name for name, _, _ in cols], "label"] + ([TRUTH, SIGNAL] if truth else [])
    return df.select(*[F.col(f"`{c}`") for c in keep])


def reachable(spark: SparkSession, shape: Shape) -> dict:
    """What the generator knows is reachable on its rows: binary AUC and log loss of the true
    probabilities, multiclass accuracy of the most likely class, regression R^2 of the
    noiseless target."""
    df = generate(spark, shape, truth=True)
    if shape.task == "binary":
        from pyspark.ml.evaluation import BinaryClassificationEvaluator
        scored = df.select(F.col("label").cast("double").alias("label"), F.col(TRUTH).alias("p"))
        auc = BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)
        return {"auc": auc}
    if shape.task == "multiclass":
        hit = (F.concat(F.lit("k"), F.col(TRUTH).cast("string")) == F.col("label")).cast("double")
        return {"accuracy": df.select(F.avg(hit)).first()[0]}
    row = df.select(F.avg((F.col("label") - F.col(TRUTH)) ** 2).alias("mse"),
                    F.variance("label").alias("var")).first()
    return {"r2": 1.0 - row["mse"] / row["var"]}
