"""Downsampling stages: uniform, stratified (exact counts) and class rebalancing.

Every sampler is an Estimator. Fitting decides which rows a sample keeps; the fitted
model applies it. **Sampling is for training only, and always asked for by name**:
``model.sample(df)`` samples; ``model.transform(df)`` passes every row through
unchanged, always (a sampler fitted on its own, a loaded model, a ``PipelineModel``
scoring new or old data), so a user cannot lose rows to score by accident. To fit the
stages after a sampler on its sample, fit them with :class:`SamplingPipeline`: it fits
the sampler, calls its ``sample`` for the next stage, and returns a plain
``PipelineModel`` (which then scores every row). MLlib's ``Pipeline`` fits the later
stages on every row, as it would with any transformer.

Membership is decided by a 64-bit hash of the row's values and the seed, never by a
random stream: the same seed and input give the same sample whatever the partitioning.
The hash covers every column (``keyCols`` narrows it to columns that identify a row):
vectors by their values (a sparse and a dense vector with the same values hash alike),
arrays, structs and maps (by their sorted entries) recursively; a column of another
user-defined type is refused with its name. Exact counts come from per-stratum hash
thresholds, which a fit finds with one pass over the hashes (see :func:`exact_thresholds`);
sampling is a second. Hashing is what they cost: the 100 values of a vector take far longer
to hash than the scan of a cached table (``keyCols`` naming an id column avoids it).

Exact duplicate rows hash alike. Counts stay exact all the same: where the n-th row's
hash is shared by more rows than are still needed, the sample takes just the number
needed of those identical rows (which copies is immaterial: they are equal). With
``fraction`` (Bernoulli, approximate by nature) and no ``keyCols`` each copy of a repeated
row is kept or dropped on its own draw (:func:`with_row_draw`, one shuffle to number the
copies); with ``keyCols``, rows sharing their key values go together.
"""
from __future__ import annotations

import json
import math
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model, Pipeline, PipelineModel, Transformer
from pyspark.ml.pipeline import PipelineSharedReadWrite, PipelineWriter
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasHandleInvalid, HasLabelCol, HasSeed, HasWeightCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsReader, MLReader, MLWriter
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._persist import ParamsWritable

_HASH_BUCKETS = 1 << 30
_ALL = "__all__"


def row_hash(columns: list[str], seed: int, schema: T.StructType | None = None) -> Column:
    """A deterministic 64-bit hash of the row's values and ``seed``.

    With ``schema``, columns Spark cannot hash (vectors, maps, nested ones) are first made
    hashable by :func:`hashable`; without it, the columns must be hashable as they are.
    """
    cols = [hashable(F.col(c), schema[c].dataType, c) if schema is not None else F.col(c) for c in columns]
    return F.xxhash64(F.lit(int(seed)), *cols)


def hashable(col: Column, dtype: T.DataType, name: str) -> Column:
    """``col`` as a value ``xxhash64`` accepts, equal for equal values: ML vectors as their
    dense values, maps as their entries sorted by key, recursively inside arrays and structs."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    if isinstance(dtype, VectorUDT):
        converted = F.when(col.isNotNull(), vector_to_array(col))  # vector_to_array fails on null
        stored = _stored_vector(col)
        return converted if stored is None else F.when(stored["type"] == 1, stored["values"]).otherwise(converted)
    if isinstance(dtype, T.UserDefinedType):
        raise TypeError(f"column {name!r} of type {dtype.simpleString()} cannot be hashed to sample rows; "
                        "set keyCols to the columns that identify a row")
    if isinstance(dtype, T.MapType):
        entries = F.transform(F.map_entries(col), lambda e: F.struct(
            hashable(e["key"], dtype.keyType, name).alias("k"), hashable(e["value"], dtype.valueType, name).alias("v")))
        return F.array_sort(entries)
    if isinstance(dtype, T.ArrayType) and _needs_conversion(dtype.elementType):
        return F.transform(col, lambda x: hashable(x, dtype.elementType, name))
    if isinstance(dtype, T.StructType) and _needs_conversion(dtype):
        return F.struct(*[hashable(col.getField(f.name), f.dataType, f"{name}.{f.name}").alias(f.name)
                          for f in dtype.fields])
    return col


def _stored_vector(col: Column) -> Column | None:
    """A vector column as Spark stores it (``struct<type, size, indices, values>``, type 1
    for dense), or None where this Spark does not say (Spark Connect, a renamed internal).

    Why: ``vector_to_array`` is a Scala UDF that builds a vector object per row and boxes
    each value: measured on 1M x 100, 0.3 of the 1.1 CPU-seconds of a pass that hashes
    every column. A dense vector's stored values are the very array
    ``vector_to_array`` returns, so :func:`hashable` reads them in place and converts only
    sparse vectors: the hash is the same either way.
    """
    try:
        from pyspark import SparkContext
        from pyspark.sql.classic.column import Column as ClassicColumn
        jvm = SparkContext._active_spark_context._jvm
        utils = getattr(jvm, "org.apache.spark.sql.classic.ExpressionUtils")
        unwrapped = jvm.org.apache.spark.sql.catalyst.expressions.UnwrapUDT(utils.expression(col._jc))
        return ClassicColumn(utils.column(unwrapped))
    except Exception:  # py4j raises its own errors, or TypeError on a class it does not find
        return None


def _needs_conversion(dtype: T.DataType) -> bool:
    if isinstance(dtype, (T.UserDefinedType, T.MapType)):
        return True
    if isinstance(dtype, T.ArrayType):
        return _needs_conversion(dtype.elementType)
    if isinstance(dtype, T.StructType):
        return any(_needs_conversion(f.dataType) for f in dtype.fields)
    return False


def hash_uniform(h: Column) -> Column:
    """Map a 64-bit hash to [0, 1): the one place a hash becomes a sampling decision."""
    return F.pmod(h, F.lit(_HASH_BUCKETS)).cast("double") / float(_HASH_BUCKETS)


def with_row_draw(df: DataFrame, name: str, seed: int, id_cols: list[str] | tuple = (), *,
                  purpose: str) -> DataFrame:
    """``df`` plus column ``name``: a number in [0, 1) for each row from a seeded hash, the
    same whatever the partitioning. Compared with a fraction it puts each *row* on one side
    of a split independently: identical rows are separate rows.

    With ``id_cols`` (columns that tell rows apart: a key) it hashes those alone. Without,
    it hashes the whole row and the row's place among rows identical to it (0, 1, ...;
    one shuffle to number them): each copy of a repeated row draws its own number, where a
    hash of the content alone would send every copy to the same side. Which copy gets
    which place is immaterial: they are equal.

    ``purpose`` (a short name: ``"validation"``, ``"sample"``) is hashed in too, so that two
    decisions over the same rows with the same seed draw independent numbers. Without it a
    validation split by the key repeated the draw of an earlier sample by that key with the
    same seed: every row the sample kept had drawn under the sample's fraction, and under a
    larger validation fraction every training row became a validation row."""
    from pyspark.sql import Window
    if not purpose:
        raise ValueError("with_row_draw needs a purpose: draws for different decisions must differ")
    salt = F.lit(purpose)
    if id_cols:
        cols = hash_columns(df.schema, list(id_cols))
        keyed = [hashable(F.col(c), df.schema[c].dataType, c) for c in cols]
        return df.withColumn(name, hash_uniform(F.xxhash64(F.lit(int(seed)), salt, *keyed)))
    whole = [f.name for f in df.schema.fields]
    content = [hashable(F.col(c), df.schema[c].dataType, c) for c in whole]
    h = F.xxhash64(F.lit(int(seed)), *content)
    # Partitioned by the hash and the values themselves: rows sharing a hash but not their
    # values are numbered apart.
    place = F.row_number().over(Window.partitionBy(h, *content).orderBy(F.lit(0)))
    return df.withColumn(name, hash_uniform(F.xxhash64(F.lit(int(seed)), salt, h, place)))


def hash_columns(schema: T.StructType, key_cols: list[str]) -> list[str]:
    """The columns that decide membership: ``key_cols`` when given, else every column.
    Checked here, on the driver: each exists and can be hashed."""
    names = schema.fieldNames()
    cols = list(key_cols) or names
    missing = [c for c in cols if c not in names]
    if missing:
        raise ValueError(f"keyCols {missing} are not columns of the input (columns: {', '.join(names)})")
    if not cols:
        raise ValueError("the input has no columns to sample by")
    for c in cols:
        hashable(F.col(c), schema[c].dataType, c)  # raises for a type that cannot be hashed
    return cols


_MIN_HASH, _MAX_HASH = -(1 << 63), (1 << 63) - 1
# The first pass over the hashes only looks at a window this many standard deviations either
# side of where the stratum's target-th hash is expected (hashes are uniform): a miss is
# about as likely as a 7-sigma event, and costs further passes, never a wrong count.
_WINDOW_SIGMAS = 7.0
# A pass reads every hash of a range exactly when it expects at most this many rows there,
# else counts them in at most 2**_BUCKET_BITS buckets and narrows the range to one bucket.
_EXACT_ROWS = 1 << 16
_BUCKET_BITS = 12
# The window, then 64 bits narrowed 12 at a time: more passes mean the input changed.
_MAX_PASSES = 2 + math.ceil(64 / _BUCKET_BITS)


def exact_thresholds(df: DataFrame, h: Column, stratum: Column, targets) -> tuple[dict, dict, dict]:
    """Per stratum, the hash ``t`` of the target-th row in hash order, and how many rows of
    hash ``t`` to take.

    ``targets`` is a dict stratum -> rows wanted, or a function of the stratum sizes
    returning one. 0 keeps none; a target at or above the stratum's size keeps all.
    Returns (stratum -> threshold or None, sizes, ties), where ``ties[key(s)] = k`` means:
    rows with ``h < t`` plus exactly ``k`` of the (identical, duplicate) rows with
    ``h == t``; strata without an entry keep ``h <= t``.

    Two Spark queries in the usual case. The stratum sizes first: a count that reads only the
    stratum column, not the (possibly wide) hashed columns. Then one pass over the hashes:
    as they are uniform, the target-th of ``n`` lies within a few ``sqrt(n)`` rows of
    ``target/n`` of the hash range, so the pass counts the rows below that window and
    returns the hashes inside it (grouped, so duplicates come back as one hash and a count),
    a few thousand per stratum. Where the target-th row is not in the window (heavy
    duplicates, a tiny stratum), further passes narrow the range down to it.
    """
    sizes = {canonical(r["s"]): r["count"] for r in df.groupBy(stratum.alias("s")).count().collect()}
    if callable(targets):
        targets = targets(sizes)
    out: dict = {}
    ranges: dict = {}  # stratum -> (rows wanted, lowest and highest hash it can be)
    for s, want in targets.items():
        total = sizes.get(s, 0)
        if want <= 0:
            out[s] = None
        elif want >= total:
            out[s] = _MAX_HASH
        else:
            ranges[s] = (want, *_expected_window(want, total))
    keyed = df.select(stratum.alias("s"), h.alias("h"))
    ties: dict = {}
    for _ in range(_MAX_PASSES):
        if not ranges:
            return out, sizes, ties
        ranges = _narrow(keyed, ranges, sizes, out, ties)
    raise _input_changed(ranges)


def _expected_window(want: int, total: int) -> tuple[int, int]:
    """The hashes between which the want-th smallest of ``total`` uniform hashes almost surely lies."""
    p = want / total
    half = _WINDOW_SIGMAS * math.sqrt(p * (1 - p) / total) + 1 / total
    return _to_hash(p - half), _to_hash(p + half)


def _to_hash(u: float) -> int:
    """The signed 64-bit hash at position ``u`` of the range (0 its lowest, 1 its highest)."""
    return max(_MIN_HASH, min(_MAX_HASH, _MIN_HASH + int(u * 2.0 ** 64)))


def _narrow(keyed: DataFrame, ranges: dict, sizes: dict, out: dict, ties: dict) -> dict:
    """One pass: per stratum, the rows below its range and the hashes (or buckets) in it.
    Fills ``out``/``ties`` for the strata it settles; returns the narrower ranges of the rest."""
    expected = max(sizes[s] * ((hi - lo + 1) / 2.0 ** 64) for s, (_, lo, hi) in ranges.items())
    widest = max(hi - lo for _, lo, hi in ranges.values())
    shift = 0 if expected <= _EXACT_ROWS else max(0, widest.bit_length() - _BUCKET_BITS)
    s, h = F.col("s"), F.col("h")
    lo, hi = (_by_stratum(s, {k: r[i] for k, r in ranges.items()}) for i in (1, 2))
    zone = F.when(h < lo, -1).when(h <= hi, 0).otherwise(1)
    counted = keyed.groupBy("s", zone.alias("zone"), F.when(zone == 0, F.shiftright(h, shift)).alias("b")).count()
    below: dict = {}
    inside: dict = {}
    # No filter on the result in Spark: pushed below the grouping, it would hash every row twice.
    for r in counted.collect():
        key = canonical(r["s"])
        if r["zone"] < 0:
            below[key] = r["count"]
        elif r["zone"] == 0:
            inside.setdefault(key, []).append((r["b"], r["count"]))
    narrower = {}
    for key, (want, lo_s, hi_s) in ranges.items():
        seen = below.get(key, 0)
        if seen >= want:  # the target-th row lies below the window
            narrower[key] = (want, _MIN_HASH, lo_s - 1)
            continue
        for b, c in sorted(inside.get(key, [])):
            if seen + c >= want:
                if shift == 0:
                    out[key] = b
                    if seen + c > want:  # duplicates of the boundary row: take only as many as needed
                        ties[_key(key)] = want - seen
                else:
                    narrower[key] = (want, max(lo_s, b << shift), min(hi_s, ((b + 1) << shift) - 1))
                break
            seen += c
        else:  # above the window
            narrower[key] = (want, hi_s + 1, _MAX_HASH)
    if any(lo_s > hi_s for _, lo_s, hi_s in narrower.values()):
        raise _input_changed(narrower)
    return narrower


def _input_changed(strata) -> RuntimeError:
    return RuntimeError(f"the rows changed between the passes of the fit (strata {sorted(map(as_text, strata))} "
                        "never held their target-th row); cache or checkpoint an input computed with rand()")


def _by_stratum(stratum: Column, values: dict) -> Column:
    """A per-stratum value: ``values[s]`` on the rows of stratum ``s``, null on the others."""
    expr = None
    for s, v in values.items():
        cond, val = stratum.eqNullSafe(F.lit(s)), F.lit(v).cast("long")
        expr = F.when(cond, val) if expr is None else expr.when(cond, val)
    return expr


NAN = float("nan")


def canonical(stratum):
    """One dict key for every NaN: NaN != NaN, so each NaN row collected to the driver
    would otherwise open a stratum of its own (Spark itself groups NaN as one value)."""
    return NAN if isinstance(stratum, float) and math.isnan(stratum) else stratum


def as_text(value) -> str:
    """A stratum value as the text keys of ``fractions``/``targetCounts`` are matched by."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def threshold_condition(h: Column, stratum: Column, thresholds: dict, ties: dict | None = None) -> Column:
    """Rows to keep: the row's hash is at or below its stratum's threshold (strictly below
    where ``ties`` names the stratum: its boundary rows are added by :func:`take_ties`)."""
    cond = F.lit(False)
    ties = ties or {}
    for s, t in thresholds.items():
        if t is not None:
            below = (h < F.lit(t)) if _key(s) in ties else (h <= F.lit(t))
            cond = cond | (stratum.eqNullSafe(F.lit(s)) & below)
    return cond


def _key(stratum) -> str:
    """A stratum as a JSON object key (the plan is JSON: its keys are strings)."""
    return json.dumps(stratum)


def take_ties(dataset: DataFrame, kept: DataFrame, h: Column, stratum: Column, thresholds: dict,
              ties: dict) -> DataFrame:
    """``kept`` plus, per stratum in ``ties``, exactly the number of boundary rows needed.
    The tied rows are taken in the order of a hash of the whole row, so the choice does
    not depend on partitioning even when ``keyCols`` names a column that is not unique."""
    whole = [f.name for f in dataset.schema.fields if not _unhashable(f.dataType)]
    order = row_hash(whole, 0x5EED, dataset.schema)
    for s, t in thresholds.items():
        k = ties.get(_key(s))
        if k:
            extra = (dataset.where(stratum.eqNullSafe(F.lit(s)) & (h == F.lit(t)))
                     .withColumn("__tiebreak", order).orderBy("__tiebreak").limit(int(k)).drop("__tiebreak"))
            kept = kept.unionByName(extra)
    return kept


def _unhashable(dtype: T.DataType) -> bool:
    from pyspark.ml.linalg import VectorUDT
    if isinstance(dtype, T.UserDefinedType):
        return not isinstance(dtype, VectorUDT)
    if isinstance(dtype, T.ArrayType):
        return _unhashable(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return _unhashable(dtype.keyType) or _unhashable(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return any(_unhashable(f.dataType) for f in dtype.fields)
    return False


# -- the training-only contract, shared by every sampler model ----------------------------

class _SamplerModel(Model, DefaultParamsReadable, ParamsWritable):
    """Samples on ``sample``; passes every row through on ``transform``."""

    hashCols = Param(Params._dummy(), "hashCols", "columns whose values decide row membership",
                     typeConverter=TypeConverters.toListString)
    plan = Param(Params._dummy(), "plan", "JSON: what the fit decided (thresholds, counts)",
                 typeConverter=TypeConverters.toString)

    def __init__(self, hashCols: list[str] | None = None, plan: dict | None = None):
        super().__init__()
        self._setDefault(hashCols=[], plan="{}")
        kwargs: dict = {}
        if hashCols is not None:
            kwargs["hashCols"] = list(hashCols)
        if plan is not None:
            kwargs["plan"] = json.dumps(plan)
        self._set(**kwargs)

    @property
    def _plan(self) -> dict:
        return json.loads(self.getOrDefault(self.plan))

    def _hash(self, dataset: DataFrame, seed: int) -> Column:
        cols = self.getOrDefault(self.hashCols)
        missing = [c for c in cols if c not in dataset.columns]
        if missing:
            raise ValueError(f"columns {missing} that decided the sample at fit are missing from the input")
        return row_hash(cols, seed, dataset.schema)

    def _keep(self, dataset: DataFrame, stratum: Column, thresholds: dict) -> DataFrame:
        """The rows under their stratum's threshold, boundary duplicates taken exactly."""
        h = self._hash(dataset, self.getSeed())
        ties = self._plan.get("ties", {})
        kept = dataset.where(threshold_condition(h, stratum, thresholds, ties))
        return take_ties(dataset, kept, h, stratum, thresholds, ties) if ties else kept

    def sample(self, dataset: DataFrame) -> DataFrame:  # pragma: no cover - overridden
        raise NotImplementedError

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return dataset


def _finish(estimator: Estimator, model: _SamplerModel) -> _SamplerModel:
    estimator._copyValues(model)
    return model


class SamplingPipeline(Pipeline):
    """MLlib's ``Pipeline`` that fits the stages after a sampler on the sampler's sample.

    Fitting goes stage by stage as ``Pipeline.fit`` does (a transformer transforms, an
    estimator fits, its model transforms for the next stage), except that a fitted
    sampler hands the next stage ``model.sample(rows)``. The result is a plain
    ``PipelineModel``: its sampler passes every row through when it scores.

    Examples
    --------
    >>> pipe = SamplingPipeline(stages=[ClassBalanceSampler(labelCol="label"), scaler])  # doctest: +SKIP
    >>> model = pipe.fit(train)    # the scaler is fitted on the rebalanced sample  # doctest: +SKIP
    >>> model.transform(train).count() == train.count()  # doctest: +SKIP
    True
    """

    def _fit(self, dataset: DataFrame) -> PipelineModel:
        stages = self.getStages()
        for stage in stages:
            if not isinstance(stage, (Estimator, Transformer)):
                raise TypeError(f"SamplingPipeline: {stage!r} is neither an Estimator nor a Transformer")
        last = max((i for i, s in enumerate(stages) if isinstance(s, Estimator)), default=-1)
        fitted = []
        for i, stage in enumerate(stages):
            if i > last:
                fitted.append(stage)
                continue
            model = stage if isinstance(stage, Transformer) else stage.fit(dataset)
            fitted.append(model)
            if isinstance(stage, Transformer) or i < last:
                dataset = model.sample(dataset) if isinstance(model, _SamplerModel) else model.transform(dataset)
        return PipelineModel(fitted)

    def write(self) -> MLWriter:
        """Saved as itself (MLlib's writer would save a pipeline of JVM stages as a plain one)."""
        return PipelineWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _SamplingPipelineReader()


class _SamplingPipelineReader(MLReader):
    def load(self, path: str) -> SamplingPipeline:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        uid, stages = PipelineSharedReadWrite.load(metadata, self.sparkSession, path)
        return SamplingPipeline(stages=stages)._resetUid(uid)


class _HasKeyCols(Params):
    keyCols = Param(Params._dummy(), "keyCols",
                    "columns whose values identify a row and decide its membership (empty = every column)",
                    typeConverter=TypeConverters.toListString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(keyCols=[])

    def _hash_cols(self, dataset: DataFrame) -> list[str]:
        return hash_columns(dataset.schema, self.getOrDefault(self.keyCols))


# -- uniform -------------------------------------------------------------------------------

class _UniformParams(HasSeed, _HasKeyCols):
    fraction = Param(Params._dummy(), "fraction", "share of rows to keep, in (0, 1] (approximate)",
                     typeConverter=TypeConverters.toFloat)
    targetCount = Param(Params._dummy(), "targetCount", "exact number of rows to keep (>= 0)",
                        typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(seed=42)


class UniformSampler(Estimator, _UniformParams, DefaultParamsReadable, ParamsWritable):
    """Keep a ``fraction`` of rows (hash Bernoulli, like ``df.sample``) or exactly
    ``targetCount`` rows (hash thresholds). Set exactly one of the two."""

    @keyword_only
    def __init__(self, *, fraction: float | None = None, targetCount: int | None = None, seed: int = 42,
                 keyCols: list[str] | None = None):
        super().__init__()
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def _fit(self, dataset: DataFrame) -> "UniformSamplerModel":
        has_f, has_n = self.isSet(self.fraction), self.isSet(self.targetCount)
        if has_f == has_n:
            raise ValueError("set exactly one of fraction and targetCount")
        cols = self._hash_cols(dataset)
        if has_f:
            f = self.getOrDefault(self.fraction)
            if not 0 < f <= 1:
                raise ValueError(f"fraction must be in (0, 1], got {f}")
            plan = {"mode": "fraction", "fraction": f}
        else:
            n = self.getOrDefault(self.targetCount)
            if n < 0:
                raise ValueError(f"targetCount must be >= 0, got {n}")
            h = row_hash(cols, self.getSeed(), dataset.schema)
            thresholds, sizes, ties = exact_thresholds(dataset, h, F.lit(_ALL), {_ALL: n})
            rows = sizes.get(_ALL, 0)
            if n > rows:
                raise ValueError(f"targetCount={n} is more than the {rows} rows of the input")
            plan = {"mode": "count", "threshold": thresholds[_ALL], "rows_in": rows, "rows_out": n, "ties": ties}
        return _finish(self, UniformSamplerModel(hashCols=cols, plan=plan))


class UniformSamplerModel(_SamplerModel, _UniformParams):
    """Fitted :class:`UniformSampler`."""

    def sample(self, dataset: DataFrame) -> DataFrame:
        plan = self._plan
        if plan["mode"] == "fraction":
            if self.getOrDefault(self.keyCols):
                return dataset.where(hash_uniform(self._hash(dataset, self.getSeed())) < F.lit(plan["fraction"]))
            # No key: each copy of a repeated row draws apart (with_row_draw).
            draw = "__draw"
            while draw in dataset.columns:
                draw += "_"
            drawn = with_row_draw(dataset, draw, self.getSeed(), purpose="sample")
            return drawn.where(F.col(draw) < F.lit(plan["fraction"])).drop(draw)
        return self._keep(dataset, F.lit(_ALL), {_ALL: plan["threshold"]})

    @property
    def summary(self) -> dict:
        return {"stage": "UniformSampler", **self._plan}


# -- stratified ----------------------------------------------------------------------------

class _StratifiedParams(HasSeed, HasHandleInvalid, _HasKeyCols):
    stratumCol = Param(Params._dummy(), "stratumCol", "column whose values are the strata",
                       typeConverter=TypeConverters.toString)
    fractions = Param(Params._dummy(), "fractions",
                      'JSON object stratum -> share in [0, 1]; the count kept is round(share x size), exactly',
                      typeConverter=TypeConverters.toString)
    targetCounts = Param(Params._dummy(), "targetCounts", "JSON object stratum -> exact rows to keep",
                         typeConverter=TypeConverters.toString)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(seed=42, handleInvalid="error")


_MISSING = object()


def _find_stratum(key: str, by_text: dict, sizes: dict):
    """The stratum value a key names: by text, then by number (``"0"`` names 0.0)."""
    if key in by_text or key.lower() in by_text:
        return by_text.get(key, by_text.get(key.lower()))
    try:
        number = float(key)
    except ValueError:
        return _MISSING
    for v in sizes:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v) == number:
            return v
    return _MISSING


def stratum_column(schema: T.StructType, col: str) -> Column:
    """The stratum values as the plan can hold them (JSON): numbers, strings and booleans
    as they are; dates, timestamps, decimals and binary as their text."""
    dtype = schema[col].dataType
    if isinstance(dtype, (T.NumericType, T.StringType, T.BooleanType)) and not isinstance(dtype, T.DecimalType):
        return F.col(col)
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType, T.DecimalType, T.BinaryType)):
        return F.col(col).cast("string")
    raise TypeError(f"stratumCol {col!r} has type {dtype.simpleString()}; strata must be numbers, strings, "
                    "booleans, dates or timestamps")


def _as_json(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value


class StratifiedSampler(Estimator, _StratifiedParams, DefaultParamsReadable, ParamsWritable):
    """Per-stratum fractions or counts, hit exactly (``sampleBy`` is only approximate).

    Keys of ``fractions``/``targetCounts`` are compared with the stratum column's values
    as text (``"1"`` matches 1, ``"true"`` matches True, ``"null"`` a null), or as numbers
    (``"0"`` matches 0.0); dates, timestamps and decimals are matched by their text
    (``"2013-01-01"``), NaN by ``"nan"``. Strata not named keep no rows, like ``sampleBy``; their
    rows are counted in the summary. ``handleInvalid``: a stratum with fewer rows than
    its target raises ('error') or gives all its rows and records the shortfall ('keep').
    """

    @keyword_only
    def __init__(self, *, stratumCol: str | None = None, fractions: dict | str | None = None,
                 targetCounts: dict | str | None = None, seed: int = 42, handleInvalid: str = "error",
                 keyCols: list[str] | None = None):
        super().__init__()
        self._set(**{k: _as_json(v) for k, v in self._input_kwargs.items() if v is not None})

    def _fit(self, dataset: DataFrame) -> "StratifiedSamplerModel":
        if not self.isSet(self.stratumCol):
            raise ValueError("stratumCol must be set")
        col = self.getOrDefault(self.stratumCol)
        if col not in dataset.columns:
            raise ValueError(f"stratumCol {col!r} is not a column of the input (columns: {', '.join(dataset.columns)})")
        has_f, has_n = self.isSet(self.fractions), self.isSet(self.targetCounts)
        if has_f == has_n:
            raise ValueError("set exactly one of fractions and targetCounts")
        mode = self.getHandleInvalid()
        if mode not in ("error", "keep"):
            raise ValueError(f"handleInvalid must be 'error' or 'keep', got {mode!r}")
        asked = json.loads(self.getOrDefault(self.fractions if has_f else self.targetCounts))
        shortfall: dict = {}
        chosen: dict = {}

        def decide(sizes: dict) -> dict:
            by_text = {as_text(v): v for v in sizes}
            by_text.update({k.lower(): v for k, v in by_text.items()})
            found = {key: _find_stratum(key, by_text, sizes) for key in asked}
            unknown = [key for key, v in found.items() if v is _MISSING]
            if unknown:
                raise ValueError(f"strata {unknown} of {col!r} do not occur in the input "
                                 f"(it has {sorted(as_text(v) for v in sizes)[:20]})")
            for key, value in asked.items():
                s = found[key]
                if has_f:
                    if not 0 <= float(value) <= 1:
                        raise ValueError(f"fractions[{key!r}] must be in [0, 1], got {value}")
                    want = int(round(float(value) * sizes[s]))
                else:
                    want = int(value)
                    if want < 0:
                        raise ValueError(f"targetCounts[{key!r}] must be >= 0, got {want}")
                if want > sizes[s]:
                    if mode == "error":
                        raise ValueError(f"stratum {key!r} of {col!r} has {sizes[s]} rows, fewer than the "
                                         f"{want} asked; set handleInvalid='keep' to take all its rows")
                    shortfall[key] = want - sizes[s]
                    want = sizes[s]
                chosen[s] = want
            return chosen

        cols = self._hash_cols(dataset)
        h = row_hash(cols, self.getSeed(), dataset.schema)
        thresholds, sizes, ties = exact_thresholds(dataset, h, stratum_column(dataset.schema, col), decide)
        targets = chosen
        plan = {"strata": [{"stratum": s, "rows_in": sizes[s], "rows_out": targets[s],
                            "threshold": thresholds[s]} for s in targets],
                "shortfall": shortfall, "ties": ties,
                "rows_in": sum(sizes.values()),
                "rows_unlisted_strata": sum(n for s, n in sizes.items() if s not in targets)}
        return _finish(self, StratifiedSamplerModel(hashCols=cols, plan=plan))


class StratifiedSamplerModel(_SamplerModel, _StratifiedParams):
    """Fitted :class:`StratifiedSampler`."""

    def sample(self, dataset: DataFrame) -> DataFrame:
        col = self.getOrDefault(self.stratumCol)
        if col not in dataset.columns:
            raise ValueError(f"stratumCol {col!r} is not a column of the input")
        thresholds = {s["stratum"]: s["threshold"] for s in self._plan["strata"]}
        return self._keep(dataset, stratum_column(dataset.schema, col), thresholds)

    @property
    def summary(self) -> dict:
        plan = self._plan
        return {"stage": "StratifiedSampler", "rows_in": plan["rows_in"],
                "rows_out": sum(s["rows_out"] for s in plan["strata"]),
                "strata": [{k: v for k, v in s.items() if k != "threshold"} for s in plan["strata"]],
                "shortfall": plan["shortfall"], "rows_unlisted_strata": plan["rows_unlisted_strata"]}


# -- class rebalancing ----------------------------------------------------------------------

class _ClassBalanceParams(HasLabelCol, HasWeightCol, HasSeed, HasHandleInvalid, _HasKeyCols):
    majorityRatio = Param(Params._dummy(), "majorityRatio",
                          "rows kept in each majority class per minority-class row (> 0)",
                          typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(majorityRatio=1.0, weightCol="sample_weight", seed=42, handleInvalid="error")

    def getMajorityRatio(self) -> float:
        return self.getOrDefault(self.majorityRatio)


class ClassBalanceSampler(Estimator, _ClassBalanceParams, DefaultParamsReadable, ParamsWritable):
    """Downsample every class to at most ``majorityRatio`` x the smallest class, exactly,
    and add ``weightCol`` restoring the original class prior (mean weight 1).

    ``handleInvalid``: rows with a null label raise ('error') or are skipped and counted
    in the model's ``summary`` ('skip').

    Examples
    --------
    >>> train = spark.createDataFrame([(float(i % 4 == 0),) for i in range(40)], ["label"])
    >>> model = ClassBalanceSampler(labelCol="label", majorityRatio=1.0, seed=1).fit(train)
    >>> balanced = model.sample(train)   # explicit; transform() passes rows through
    >>> balanced.count() < train.count() == model.transform(train).count()
    True
    """

    @keyword_only
    def __init__(self, *, labelCol: str = "label", weightCol: str = "sample_weight",
                 majorityRatio: float = 1.0, seed: int = 42, handleInvalid: str = "error",
                 keyCols: list[str] | None = None):
        super().__init__()
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def _fit(self, dataset: DataFrame) -> "ClassBalanceSamplerModel":
        label, wcol = self.getLabelCol(), self.getWeightCol()
        ratio, mode = self.getMajorityRatio(), self.getHandleInvalid()
        if label not in dataset.columns:
            raise ValueError(f"labelCol {label!r} is not a column of the input "
                             f"(columns: {', '.join(dataset.columns)})")
        if wcol in dataset.columns:
            raise ValueError(f"weightCol {wcol!r} already exists in the input; choose another name")
        if ratio <= 0:
            raise ValueError(f"majorityRatio must be > 0, got {ratio}")
        if mode not in ("error", "skip"):
            raise ValueError(f"handleInvalid must be 'error' or 'skip', got {mode!r}")

        state: dict = {}

        def decide(sizes: dict) -> dict:
            counts = dict(sizes)
            nulls = counts.pop(None, 0) + counts.pop(NAN, 0)
            if nulls and mode == "error":
                raise ValueError(f"labelCol {label!r} has {nulls} null or NaN values; "
                                 "set handleInvalid='skip' to drop and count them")
            if len(counts) < 2:
                raise ValueError(f"labelCol {label!r} has {len(counts)} class(es); rebalancing needs two or more")
            minority = min(counts.values())
            targets = {c: min(n, int(round(ratio * minority))) for c, n in counts.items()}
            state.update(counts=counts, nulls=nulls, targets=targets)
            return targets

        cols = self._hash_cols(dataset)
        h = row_hash(cols, self.getSeed(), dataset.schema)
        thresholds, _, ties = exact_thresholds(dataset, h, F.col(label), decide)
        counts, nulls = state["counts"], state["nulls"]
        targets = state["targets"]
        n_in, n_out = sum(counts.values()), sum(targets.values())
        stats = [{"label": c, "rows_in": counts[c], "rows_out": targets[c], "threshold": thresholds[c],
                  "weight": (counts[c] / targets[c]) * (n_out / n_in) if targets[c] else 0.0}
                 for c in sorted(counts, key=str)]
        model = ClassBalanceSamplerModel(hashCols=cols, plan={"classes": stats, "skipped_null_label": nulls,
                                                              "ties": ties})
        return _finish(self, model)


class ClassBalanceSamplerModel(_SamplerModel, _ClassBalanceParams):
    """Fitted :class:`ClassBalanceSampler`: per-class thresholds and weights."""

    @property
    def summary(self) -> dict:
        """Counts in and out per class, weights, and rows skipped for a null label."""
        plan = self._plan
        classes = [{k: v for k, v in c.items() if k != "threshold"} for c in plan["classes"]]
        return {"stage": "ClassBalanceSampler", "classes": classes,
                "rows_in": sum(c["rows_in"] for c in classes), "rows_out": sum(c["rows_out"] for c in classes),
                "skipped_null_label": plan["skipped_null_label"]}

    def sample(self, dataset: DataFrame) -> DataFrame:
        label, wcol = self.getLabelCol(), self.getWeightCol()
        if label not in dataset.columns:
            raise ValueError(f"labelCol {label!r} is not a column of the input")
        if wcol in dataset.columns:
            raise ValueError(f"weightCol {wcol!r} already exists in the input; choose another name")
        classes = self._plan["classes"]
        kept = self._keep(dataset, F.col(label), {c["label"]: c["threshold"] for c in classes})
        weight = F.lit(0.0)
        for c in classes:
            weight = F.when(F.col(label) == F.lit(c["label"]), F.lit(float(c["weight"]))).otherwise(weight)
        return kept.withColumn(wcol, weight)
