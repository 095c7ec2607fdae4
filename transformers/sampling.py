"""Class rebalancing by downsampling, as an MLlib Estimator that never drops rows to score.

``ClassBalanceSampler.fit(df)`` counts the classes and decides, per class, the fraction
of rows to keep so that each majority class has at most ``majorityRatio`` rows per
minority row. Its :class:`ClassBalanceSamplerModel` adds a weight column restoring the
original class prior (mean weight 1), so weighted training and metrics stay unbiased.

Sampling is for training only. The fitted model samples in exactly two cases:
``model.sample(df)`` (explicit), and the one ``transform`` call that ``Pipeline.fit``
makes on the very DataFrame the sampler was fitted on, so the stages after it are fitted
on the sample. Every other ``transform`` - a loaded model, a ``PipelineModel`` scoring
new or old data - passes every row through unchanged.

Row membership is decided by a hash of the row's values and the seed, not by a random
stream, so the sample is the same for a given seed and input whatever the partitioning.
"""
from __future__ import annotations

import json
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasHandleInvalid, HasLabelCol, HasSeed, HasWeightCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

_HASH_BUCKETS = 1 << 30


def row_uniform(columns: list[str], seed: int) -> Column:
    """A deterministic value in [0, 1) per row from its values and ``seed``."""
    h = F.xxhash64(F.lit(int(seed)), *[F.col(c) for c in columns])
    return F.pmod(h, F.lit(_HASH_BUCKETS)).cast("double") / float(_HASH_BUCKETS)


def hashable_columns(schema: T.StructType) -> list[str]:
    """Columns whose values can feed the row hash (user-defined types cannot)."""
    return [f.name for f in schema.fields if not isinstance(f.dataType, T.UserDefinedType)]


class _ClassBalanceParams(HasLabelCol, HasWeightCol, HasSeed, HasHandleInvalid):
    majorityRatio = Param(Params._dummy(), "majorityRatio",
                          "rows kept in each majority class per minority-class row (> 0)",
                          typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(majorityRatio=1.0, weightCol="sample_weight", seed=42,
                         handleInvalid="error")

    def getMajorityRatio(self) -> float:
        return self.getOrDefault(self.majorityRatio)


class ClassBalanceSampler(Estimator, _ClassBalanceParams, DefaultParamsReadable, DefaultParamsWritable):
    """Downsample majority classes to ``majorityRatio`` x the minority class.

    ``handleInvalid``: rows with a null label raise (``'error'``) or are skipped and
    counted in the model's ``summary`` (``'skip'``).

    Examples
    --------
    >>> sampler = ClassBalanceSampler(labelCol="label", majorityRatio=1.0)  # doctest: +SKIP
    >>> model = sampler.fit(train)                                          # doctest: +SKIP
    >>> balanced = model.sample(train)   # explicit; transform() passes rows through
    """

    @keyword_only
    def __init__(self, *, labelCol: str = "label", weightCol: str = "sample_weight",
                 majorityRatio: float = 1.0, seed: int = 42, handleInvalid: str = "error"):
        super().__init__()
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> "ClassBalanceSampler":
        return self._set(**kwargs)

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

        counts = {r[0]: int(r[1]) for r in dataset.groupBy(label).count().collect()}
        nulls = counts.pop(None, 0)
        if nulls and mode == "error":
            raise ValueError(f"labelCol {label!r} has {nulls} null values; "
                             "set handleInvalid='skip' to drop and count them")
        if len(counts) < 2:
            raise ValueError(f"labelCol {label!r} has {len(counts)} class(es); rebalancing needs two or more")
        minority = min(counts.values())
        fractions = {c: min(1.0, ratio * minority / n) for c, n in counts.items()}

        hash_cols = hashable_columns(dataset.schema)
        u = row_uniform(hash_cols, self.getSeed())
        keep = _keep_condition(label, fractions, u)
        kept = {r[0]: int(r[1]) for r in dataset.where(keep).groupBy(label).count().collect()}
        n_in, n_out = sum(counts.values()), sum(kept.values())
        stats = [{"label": c, "rows_in": counts[c], "fraction": fractions[c],
                  "rows_out": kept.get(c, 0),
                  "weight": (counts[c] / kept[c]) * (n_out / n_in) if kept.get(c) else 0.0}
                 for c in sorted(counts, key=str)]
        model = ClassBalanceSamplerModel(classStats=json.dumps(stats),
                                         hashCols=hash_cols, skippedRows=nulls)
        self._copyValues(model)
        model._arm(dataset)
        return model


def _keep_condition(label: str, fractions: dict, u: Column) -> Column:
    expr = None
    for c, frac in fractions.items():
        cond = (F.col(label) == F.lit(c)) & (u < F.lit(frac))
        expr = cond if expr is None else expr | cond
    return expr


class ClassBalanceSamplerModel(Model, _ClassBalanceParams, DefaultParamsReadable, DefaultParamsWritable):
    """The fitted sampler: class fractions and weights; passes rows through on transform."""

    classStats = Param(Params._dummy(), "classStats", "JSON list of per-class counts, fraction, weight",
                       typeConverter=TypeConverters.toString)
    hashCols = Param(Params._dummy(), "hashCols", "columns whose values decide row membership",
                     typeConverter=TypeConverters.toListString)
    skippedRows = Param(Params._dummy(), "skippedRows", "rows skipped at fit for a null label",
                        typeConverter=TypeConverters.toInt)

    @keyword_only
    def __init__(self, *, classStats: str = "[]", hashCols: list[str] | None = None,
                 skippedRows: int = 0):
        super().__init__()
        self._armed_for: DataFrame | None = None
        kwargs = {k: v for k, v in self._input_kwargs.items() if v is not None}
        self._set(**kwargs)

    @property
    def summary(self) -> dict:
        """Counts in and out per class, weights, and rows skipped for a null label."""
        stats = json.loads(self.getOrDefault(self.classStats))
        return {"classes": stats, "rows_in": sum(s["rows_in"] for s in stats),
                "rows_out": sum(s["rows_out"] for s in stats),
                "skipped_null_label": self.getOrDefault(self.skippedRows)}

    def _arm(self, dataset: DataFrame) -> None:
        self._armed_for = dataset

    def sample(self, dataset: DataFrame) -> DataFrame:
        """The training sample of ``dataset`` with the prior-restoring weight column."""
        label, wcol = self.getLabelCol(), self.getWeightCol()
        if label not in dataset.columns:
            raise ValueError(f"labelCol {label!r} is not a column of the input")
        if wcol in dataset.columns:
            raise ValueError(f"weightCol {wcol!r} already exists in the input; choose another name")
        hash_cols = self.getOrDefault(self.hashCols)
        missing = [c for c in hash_cols if c not in dataset.columns]
        if missing:
            raise ValueError(f"columns {missing} that decided the sample at fit are missing")
        stats = json.loads(self.getOrDefault(self.classStats))
        u = row_uniform(hash_cols, self.getSeed())
        keep = _keep_condition(label, {s["label"]: s["fraction"] for s in stats}, u)
        weight = F.lit(0.0)
        for s in stats:
            weight = F.when(F.col(label) == F.lit(s["label"]), F.lit(float(s["weight"]))).otherwise(weight)
        return dataset.where(keep).withColumn(wcol, weight)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        armed, self._armed_for = self._armed_for, None
        if armed is not None and dataset is armed:
            return self.sample(dataset)
        return dataset
