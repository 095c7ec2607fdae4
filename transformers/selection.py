"""Feature selection stages over a vector column, keeping the selected features' names.

Every selector is an Estimator whose model keeps ``selectedFeatures`` (indices into the
input vector), the input's feature names, and one score per feature, and slices the
vector with MLlib's ``VectorSlicer`` (which carries the selected features' ML
attributes, so reports show names, not indices).

- :class:`VarianceSelector`: drop features whose variance is at most a threshold.
- :class:`MissingRateSelector`: drop features whose share of NaN is above a threshold.
- :class:`UnivariateSelector`: chi-squared / ANOVA F / F-regression tests (MLlib's
  ``ChiSquareTest``, ``ANOVATest``, ``FValueTest``) with numTopFeatures, percentile, fpr,
  fdr and fwe modes, selecting exactly as MLlib's ``UnivariateFeatureSelector`` does.
- :class:`CorrelationSelector`: of each pair with |Pearson r| above a threshold, keep
  the one more correlated with the label.
- :class:`ModelImportanceSelector`: top features by random-forest or GBT importance or
  by |L1-regularised linear weights|.

``handleInvalid``: rows whose features are null, NaN or infinite raise ('error'),
are dropped and counted in the model's ``skippedRows`` ('skip'), or are kept ('keep':
NaN counts as missing where that makes sense).
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.feature import VectorSlicer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasHandleInvalid, HasLabelCol, HasOutputCol, HasSeed
from pyspark.ml.stat import Summarizer
from pyspark.ml.util import DefaultParamsReadable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ._persist import ParamsWritable
from ._vectors import (BatchMatrices, class_index_or_fail, feature_names, guard_input, handle_invalid_rows,
                       invalid_row, label_summary, require_categorical_label, require_new, require_numeric,
                       require_one_length, require_vector, vector_size)


# -- the shared fitted model ---------------------------------------------------------------

class _SelectorParams(HasFeaturesCol, HasOutputCol, HasHandleInvalid):
    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(featuresCol="features", outputCol="selected", handleInvalid="error")

    def setHandleInvalid(self, value: str):
        return self._set(handleInvalid=value)

    def setFeaturesCol(self, value: str):
        return self._set(featuresCol=value)

    def setOutputCol(self, value: str):
        return self._set(outputCol=value)

    def _check_io(self, df: DataFrame) -> None:
        require_vector(df.schema, self.getFeaturesCol())
        require_new(df.schema, self.getOutputCol())


class SelectorModel(Model, _SelectorParams, DefaultParamsReadable, ParamsWritable):
    """Slices the selected features; shared by every selector in this module."""

    selectedFeatures = Param(Params._dummy(), "selectedFeatures", "indices of the kept features",
                             typeConverter=TypeConverters.toListInt)
    featureNames = Param(Params._dummy(), "featureNames", "names of all input features",
                         typeConverter=TypeConverters.toListString)
    scores = Param(Params._dummy(), "scores", "JSON list: one score per input feature (null if none)",
                   typeConverter=TypeConverters.toString)
    skippedRows = Param(Params._dummy(), "skippedRows", "invalid rows skipped at fit",
                        typeConverter=TypeConverters.toInt)

    def __init__(self, selectedFeatures: list[int] | None = None, featureNames: list[str] | None = None,
                 scores: list | None = None, skippedRows: int = 0):
        super().__init__()
        self._setDefault(selectedFeatures=[], featureNames=[], scores="[]", skippedRows=0)
        kwargs: dict = {"skippedRows": int(skippedRows)}
        if selectedFeatures is not None:
            kwargs["selectedFeatures"] = [int(i) for i in selectedFeatures]
        if featureNames is not None:
            kwargs["featureNames"] = list(featureNames)
        if scores is not None:
            kwargs["scores"] = json.dumps([_finite_or_none(s) for s in scores])
        self._set(**kwargs)

    @property
    def selected(self) -> list[int]:
        return list(self.getOrDefault(self.selectedFeatures))

    @property
    def selectedFeatureNames(self) -> list[str]:
        names = self.getOrDefault(self.featureNames)
        return [names[i] for i in self.selected]

    @property
    def featureScores(self) -> dict[str, float | None]:
        """Each input feature's score by name (what the report plots)."""
        return dict(zip(self.getOrDefault(self.featureNames), json.loads(self.getOrDefault(self.scores))))

    @property
    def summary(self) -> dict:
        return {"stage": type(self).__name__, "input_features": len(self.getOrDefault(self.featureNames)),
                "selected": len(self.selected), "selected_names": self.selectedFeatureNames,
                "skipped_rows": self.getOrDefault(self.skippedRows)}

    def _transform(self, dataset: DataFrame) -> DataFrame:
        self._check_io(dataset)
        if not self.selected:
            raise ValueError(f"{type(self).__name__} selected no features; loosen its threshold")
        col, out = self.getFeaturesCol(), self.getOutputCol()
        size = len(self.getOrDefault(self.featureNames))
        # NaN passes through a slice unchanged (it invents no number), so only null rows and
        # vectors of another length than at fit are invalid here.
        guarded, checked, finish = guard_input(dataset, col, size, finite=False, mode=self.getHandleInvalid(),
                                               stage=type(self).__name__, param="featuresCol")
        slicer = VectorSlicer(inputCol=checked, outputCol=out, indices=self.selected)
        sliced = slicer.transform(guarded)
        attrs = sliced.schema[out].metadata
        return (sliced.withColumn(out, finish(F.col(out)).alias(out, metadata=attrs))
                .drop(*[c for c in sliced.columns if c.startswith(f"__{type(self).__name__}_")]))


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class _SelectorBase(Estimator, _SelectorParams):
    """Validation, invalid-row handling and model assembly shared by the selectors."""

    _model_class: type = SelectorModel

    def _names(self, dataset: DataFrame, size: int | None = None) -> list[str]:
        """Input feature names; pass ``size`` when a statistic already told it, which saves
        a job when the column carries no ML attributes."""
        self._check_io(dataset)
        col = self.getFeaturesCol()
        return feature_names(dataset.schema, col, size if size is not None else vector_size(dataset, col))

    def _label(self) -> str | None:
        return self.getLabelCol() if self.hasParam("labelCol") else None

    def _compute(self, dataset: DataFrame, fn) -> tuple[Any, int]:
        """Run ``fn(df) -> (result, finite)`` once; look for invalid rows only if the result
        shows some (non-finite) or MLlib failed on them (null vectors), so clean data
        costs no extra pass. Rows with a null or non-finite label are invalid too.
        Returns the result and the number of rows skipped."""
        col, mode = self.getFeaturesCol(), self.getHandleInvalid()
        failure = None
        try:
            result, finite = fn(dataset)
            if finite:
                return result, 0
            self._diagnose(dataset)
            if mode == "keep":
                return result, 0
        except ValueError:
            raise  # our own checks (e.g. vectors of different lengths)
        except Exception as exc:  # noqa: BLE001 - MLlib aggregators fail on null vectors / no rows
            if dataset.isEmpty():
                raise ValueError(f"{type(self).__name__}: the input has no rows") from None
            self._diagnose(dataset)
            self._require_one_length(dataset)
            if mode == "keep":
                raise
            failure = exc
        clean, skipped = handle_invalid_rows(dataset, col, mode, self._label())  # raises for 'error'
        if not skipped:
            if failure is not None:
                raise failure
            return result, 0
        if clean.isEmpty():
            raise ValueError(f"{type(self).__name__}: all {skipped} rows of the input are invalid")
        return fn(clean)[0], skipped

    def _diagnose(self, dataset: DataFrame) -> None:
        """Called only when the statistic failed or came out non-finite: raise a clear error
        if the label (not the rows) is the cause. Clean data never pays for it."""

    def _require_one_length(self, dataset: DataFrame) -> None:
        """After MLlib failed: was it vectors of different lengths? Name the column if so."""
        from pyspark.ml.functions import vector_to_array
        col = self.getFeaturesCol()
        n = F.size(vector_to_array(F.col(col)))
        row = dataset.where(F.col(col).isNotNull()).select(F.min(n).alias("lo"), F.max(n).alias("hi")).first()
        if row["lo"] is not None and row["lo"] != row["hi"]:
            raise ValueError(f"{type(self).__name__}: featuresCol {col!r} holds vectors of different lengths "
                             f"(from {row['lo']} to {row['hi']})") from None

    def _make(self, selected, names, scores, skipped) -> SelectorModel:
        model = self._model_class(selectedFeatures=sorted(int(i) for i in selected),
                                  featureNames=names, scores=list(scores), skippedRows=skipped)
        self._copyValues(model)
        return model


# -- variance ------------------------------------------------------------------------------

class VarianceSelectorModel(SelectorModel):
    """Fitted :class:`VarianceSelector`; ``featureScores`` are the sample variances."""


class VarianceSelector(_SelectorBase, DefaultParamsReadable, ParamsWritable):
    """Keep features whose sample variance is above ``varianceThreshold``.

    Constant features (variance 0) go with the default threshold 0.0.
    """

    varianceThreshold = Param(Params._dummy(), "varianceThreshold", "keep variance > this (>= 0)",
                              typeConverter=TypeConverters.toFloat)
    _model_class = VarianceSelectorModel

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", outputCol: str = "selected",
                 varianceThreshold: float = 0.0, handleInvalid: str = "error"):
        super().__init__()
        self._setDefault(varianceThreshold=0.0)
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> VarianceSelectorModel:
        t = self.getOrDefault(self.varianceThreshold)
        if t < 0:
            raise ValueError(f"varianceThreshold must be >= 0, got {t}")
        self._check_io(dataset)
        col = self.getFeaturesCol()
        size = vector_size(dataset, col)

        def variances(df):
            var = df.select(Summarizer.metrics("variance").summary(F.col(col)).alias("s")).first()["s"]["variance"]
            var = var.toArray()
            if len(var) != size:
                raise ValueError(f"featuresCol {col!r} holds vectors of different lengths "
                                 f"({len(var)} and {size})")
            return var, bool(np.isfinite(var).all())

        var, skipped = self._compute(dataset, variances)
        names = self._names(dataset, size)
        unknown = [names[i] for i in np.flatnonzero(~np.isfinite(var))]
        if unknown:  # handleInvalid='keep': a NaN makes the variance unknown, not small
            raise ValueError(f"VarianceSelector: features {unknown[:10]} of {col!r} hold NaN or infinite values, so "
                             "their variance is unknown; impute them first, or use handleInvalid='error' or 'skip'")
        return self._make(np.flatnonzero(var > t), names, var, skipped)


# -- missing rate --------------------------------------------------------------------------

class MissingRateSelectorModel(SelectorModel):
    """Fitted :class:`MissingRateSelector`; ``featureScores`` are the NaN rates."""


class MissingRateSelector(_SelectorBase, DefaultParamsReadable, ParamsWritable):
    """Keep features whose share of missing values (NaN) is at most ``maxMissingRate``.

    Nulls in raw columns become NaN in the vector when ``VectorAssembler`` runs with
    ``handleInvalid='keep'``; this stage therefore always treats NaN as missing, and
    ``handleInvalid`` applies to null vectors and infinities only.
    """

    maxMissingRate = Param(Params._dummy(), "maxMissingRate", "keep NaN rate <= this, in [0, 1]",
                           typeConverter=TypeConverters.toFloat)
    _model_class = MissingRateSelectorModel

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", outputCol: str = "selected",
                 maxMissingRate: float = 0.5, handleInvalid: str = "error"):
        super().__init__()
        self._setDefault(maxMissingRate=0.5)
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> MissingRateSelectorModel:
        limit = self.getOrDefault(self.maxMissingRate)
        if not 0 <= limit <= 1:
            raise ValueError(f"maxMissingRate must be in [0, 1], got {limit}")
        names = self._names(dataset)
        col = self.getFeaturesCol()

        def rates_of(df):
            row = nan_counts(df, col, len(names))
            if row[0] == 0:
                raise ValueError(f"MissingRateSelector: the input has no rows")
            rates = row[1] / row[0]
            return rates, bool(row[2] == 0)

        rates, skipped = self._compute(dataset, rates_of)
        return self._make(np.flatnonzero(rates <= limit), names, rates, skipped)


def nan_counts(df: DataFrame, col: str, size: int) -> tuple[int, np.ndarray, int]:
    """(rows, NaN count per feature, rows that are null or hold infinities), vectorised per
    Arrow batch and summed over one small row per partition."""
    import pyarrow as pa
    from pyspark.ml.functions import vector_to_array

    def per_partition(batches):
        bad, counts = 0, np.zeros(size, dtype=np.int64)
        matrices = BatchMatrices(batches, size)
        for m in matrices:
            counts += np.isnan(m).sum(axis=0)
            bad += int(np.isinf(m).any(axis=1).sum())
        yield pa.RecordBatch.from_pydict({"rows": [matrices.rows], "bad": [bad + matrices.nulls],
                                          **matrices.length_columns(), "nan": [counts.tolist()]})

    parts = (df.select(F.when(F.col(col).isNotNull(), vector_to_array(F.col(col))).alias("v"))
             .mapInArrow(per_partition, "rows long, bad long, len_lo long, len_hi long, nan array<long>").collect())
    require_one_length(parts, col, size)
    total = sum(r["rows"] for r in parts)
    nan = np.sum([r["nan"] for r in parts], axis=0) if parts else np.zeros(size)
    return total, np.asarray(nan, dtype=float), sum(r["bad"] for r in parts)


# -- univariate tests ------------------------------------------------------------------------

_TESTS = {("categorical", "categorical"): "chi2", ("continuous", "categorical"): "anova",
          ("continuous", "continuous"): "fvalue"}


class UnivariateSelectorModel(SelectorModel):
    """Fitted :class:`UnivariateSelector`; ``featureScores`` are the test statistics."""

    pValues = Param(Params._dummy(), "pValues", "JSON list of p-values per input feature",
                    typeConverter=TypeConverters.toString)

    def __init__(self, **kwargs: Any):
        p_values = kwargs.pop("pValues", None)
        super().__init__(**kwargs)
        self._setDefault(pValues="[]")
        if p_values is not None:
            self._set(pValues=json.dumps([_finite_or_none(p) for p in p_values]))


class UnivariateSelector(_SelectorBase, HasLabelCol, DefaultParamsReadable, ParamsWritable):
    """Univariate statistical tests against the label, then a selection rule.

    ``featureType``/``labelType`` pick the test as MLlib does: categorical/categorical ->
    chi-squared, continuous/categorical -> ANOVA F, continuous/continuous -> F-regression.
    ``selectionMode``: numTopFeatures (threshold = k), percentile (fraction of features),
    fpr (p < threshold), fdr (Benjamini-Hochberg at threshold), fwe (p < threshold / n).
    """

    featureType = Param(Params._dummy(), "featureType", "categorical or continuous",
                        typeConverter=TypeConverters.toString)
    labelType = Param(Params._dummy(), "labelType", "categorical or continuous",
                      typeConverter=TypeConverters.toString)
    selectionMode = Param(Params._dummy(), "selectionMode", "numTopFeatures, percentile, fpr, fdr or fwe",
                          typeConverter=TypeConverters.toString)
    selectionThreshold = Param(Params._dummy(), "selectionThreshold",
                               "k, fraction or p-value limit, by selectionMode",
                               typeConverter=TypeConverters.toFloat)
    maxClasses = Param(Params._dummy(), "maxClasses",
                       "labelType='categorical': refuse a label with more distinct values than this (it is "
                       "probably continuous)", typeConverter=TypeConverters.toInt)
    _model_class = UnivariateSelectorModel

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", outputCol: str = "selected",
                 labelCol: str = "label", featureType: str = "continuous", labelType: str = "categorical",
                 selectionMode: str = "numTopFeatures", selectionThreshold: float | None = None,
                 handleInvalid: str = "error", maxClasses: int | None = None):
        super().__init__()
        self._setDefault(featureType="continuous", labelType="categorical", selectionMode="numTopFeatures",
                         maxClasses=100)
        self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def _threshold(self) -> float:
        """The threshold for the mode, checked: k a whole number >= 1; a percentile or a
        p-value limit in (0, 1]."""
        mode = self.getOrDefault(self.selectionMode)
        if not self.isSet(self.selectionThreshold):
            return {"numTopFeatures": 50, "percentile": 0.1}.get(mode, 0.05)
        t = self.getOrDefault(self.selectionThreshold)
        if mode == "numTopFeatures":
            if not (t >= 1 and float(t).is_integer()):
                raise ValueError(f"selectionThreshold for selectionMode='numTopFeatures' is a number of "
                                 f"features (a whole number >= 1), got {t}")
        elif not 0 < t <= 1:
            what = "a fraction of the features" if mode == "percentile" else "a p-value limit"
            raise ValueError(f"selectionThreshold for selectionMode={mode!r} is {what}, in (0, 1]; got {t}")
        return t

    def _diagnose(self, dataset: DataFrame) -> None:
        label = self.getLabelCol()
        if self.getOrDefault(self.labelType) == "categorical":
            require_categorical_label(dataset, label, "UnivariateSelector",
                                      "For a continuous label set labelType='continuous' (F-regression).",
                                      self.getOrDefault(self.maxClasses))
            return
        stats = label_summary(dataset, label)
        if stats["rows"] == 0:
            raise ValueError("UnivariateSelector: the input has no rows")
        if stats["valid"] and stats["min"] == stats["max"]:
            raise ValueError(f"UnivariateSelector: labelCol {label!r} is constant ({stats['min']}): "
                             "F-regression against it is undefined")

    def _fit(self, dataset: DataFrame) -> UnivariateSelectorModel:
        kind = (self.getOrDefault(self.featureType), self.getOrDefault(self.labelType))
        if kind not in _TESTS:
            raise ValueError(f"featureType={kind[0]!r} with labelType={kind[1]!r} has no test; "
                             f"supported: {sorted(_TESTS)}")
        mode = self.getOrDefault(self.selectionMode)
        if mode not in ("numTopFeatures", "percentile", "fpr", "fdr", "fwe"):
            raise ValueError(f"selectionMode {mode!r} is not one of numTopFeatures, percentile, fpr, fdr, fwe")
        threshold = self._threshold()
        require_numeric(dataset.schema, self.getLabelCol())
        self._check_io(dataset)
        label = self.getLabelCol()
        max_classes = self.getOrDefault(self.maxClasses)
        if max_classes < 2:
            raise ValueError(f"maxClasses must be at least 2, got {max_classes}")

        def run(df):
            # The label is checked inside MLlib's own pass (no extra job on clean data): a
            # class label must be a class index, a whole number in [0, maxClasses), as MLlib's
            # classifiers require. Anything else stops the job; _diagnose names the problem.
            if kind[1] == "categorical":
                df = df.withColumn(label, class_index_or_fail(label, max_classes))
            stats, p, dof = univariate_test(df, self.getFeaturesCol(), label, _TESTS[kind])
            # A constant label: ANOVA fails, F-regression gives NaN, chi-squared 0 degrees of freedom.
            return (stats, p), bool(np.isfinite(stats).all()) and bool(np.any(dof != 0))

        (stats, p_values), skipped = self._compute(dataset, run)
        names = self._names(dataset, len(stats))
        if mode == "numTopFeatures" and threshold > len(names):
            raise ValueError(f"selectionThreshold (numTopFeatures) = {int(threshold)} is larger than the "
                             f"{len(names)} features of {self.getFeaturesCol()!r}")
        selected = select_by_pvalue(p_values, stats, mode, threshold)
        if not selected:
            raise ValueError(f"UnivariateSelector selected none of the {len(names)} features of "
                             f"{self.getFeaturesCol()!r} with selectionMode={mode!r} and selectionThreshold="
                             f"{threshold}; loosen the threshold")
        model = self._make(selected, names, stats, skipped)
        model._set(pValues=json.dumps([_finite_or_none(p) for p in p_values]))
        return model


def univariate_test(df: DataFrame, features: str, label: str, test: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Statistics, p-values and degrees of freedom per feature from MLlib's own tests (one
    pass on the JVM)."""
    # PySpark wraps only ChiSquareTest; all three live in org.apache.spark.ml.stat.
    name = {"chi2": "ChiSquareTest", "anova": "ANOVATest", "fvalue": "FValueTest"}[test]
    spark = df.sparkSession
    jtest = getattr(spark.sparkContext._jvm.org.apache.spark.ml.stat, name)
    row = DataFrame(jtest.test(df._jdf, features, label), spark).first()
    stat = row["statistics"] if "statistics" in row.asDict() else row["fValues"]
    return (np.asarray(stat.toArray()), np.asarray(row["pValues"].toArray()),
            np.asarray(row["degreesOfFreedom"], dtype=float))


def select_by_pvalue(p: np.ndarray, stat: np.ndarray, mode: str, threshold: float) -> list[int]:
    """MLlib's selection rules. Ranking is by p-value, and ties - strong features' p-values
    underflow to 0 - go to the larger statistic (MLlib keeps index order there)."""
    # A constant feature gives NaN statistics: it ranks last and passes no p-value test.
    p = np.where(np.isnan(p), 1.0, p)
    stat = np.where(np.isnan(stat), -np.inf, stat)
    n = len(p)
    order = sorted(range(n), key=lambda i: (p[i], -stat[i]))
    if mode == "numTopFeatures":
        return sorted(order[: int(threshold)])
    if mode == "percentile":
        return sorted(order[: int(n * threshold)])
    if mode == "fpr":
        return sorted(i for i in range(n) if p[i] < threshold)
    if mode == "fwe":
        return sorted(i for i in range(n) if p[i] < threshold / n)
    # fdr: Benjamini-Hochberg, the largest rank r with p_(r) <= threshold * r / n.
    ranked = sorted(range(n), key=lambda i: p[i])
    cut = -1
    for r, i in enumerate(ranked):
        if p[i] <= threshold * (r + 1) / n:
            cut = r
    return sorted(ranked[: cut + 1])


# -- correlation redundancy -----------------------------------------------------------------

class CorrelationSelectorModel(SelectorModel):
    """Fitted :class:`CorrelationSelector`; ``featureScores`` are |r| with the label."""


class CorrelationSelector(_SelectorBase, HasLabelCol, DefaultParamsReadable, ParamsWritable):
    """Drop redundant features: of each pair with |Pearson r| > ``maxCorrelation``, keep the
    one with the larger |r| to the label. Pairs are visited from the most correlated down,
    and a feature already dropped no longer removes others.
    """

    maxCorrelation = Param(Params._dummy(), "maxCorrelation", "pairs above this |r| are redundant, (0, 1]",
                           typeConverter=TypeConverters.toFloat)
    _model_class = CorrelationSelectorModel

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", outputCol: str = "selected",
                 labelCol: str = "label", maxCorrelation: float = 0.95, handleInvalid: str = "error"):
        super().__init__()
        self._setDefault(maxCorrelation=0.95)
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> CorrelationSelectorModel:
        limit = self.getOrDefault(self.maxCorrelation)
        if not 0 < limit <= 1:
            raise ValueError(f"maxCorrelation must be in (0, 1], got {limit}")
        require_numeric(dataset.schema, self.getLabelCol())
        self._check_io(dataset)
        size = vector_size(dataset, self.getFeaturesCol())

        def run(df):
            c = correlation_with_label(df, self.getFeaturesCol(), self.getLabelCol(), size)
            return c, bool(np.isfinite(c).all())

        corr, skipped = self._compute(dataset, run)
        p = corr.shape[0] - 1
        names = self._names(dataset, p)
        feat, to_label = corr[:p, :p], np.abs(corr[:p, p])
        if not np.isfinite(corr[p, :p]).any():
            raise ValueError(f"labelCol {self.getLabelCol()!r} is constant: correlation with it is undefined")
        # Spark gives NaN (not an error) for a constant column's correlations.
        constant = [names[i] for i in range(p) if not np.isfinite(corr[i, p])]
        if constant:
            raise ValueError(f"featuresCol {self.getFeaturesCol()!r} has constant features {constant[:10]}: "
                             "correlation is undefined; drop them first (VarianceSelector)")
        to_label = np.nan_to_num(to_label, nan=0.0)
        keep = np.ones(p, dtype=bool)
        first, second, strength = redundant_pairs(feat, limit)
        for idx in np.argsort(-strength, kind="stable"):
            i, j = first[idx], second[idx]
            if keep[i] and keep[j]:
                keep[j if to_label[i] >= to_label[j] else i] = False
        return self._make(np.flatnonzero(keep), names, to_label, skipped)


def redundant_pairs(corr: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i, j, |r|) of every pair i < j with |r| above ``limit``, in row-major order.

    Row by row, so memory follows the pairs found, not all p(p-1)/2 of them (at 7,000
    features the full upper triangle's indices and strengths took 1 GB on the driver)."""
    first, second, strength = [], [], []
    for i in range(corr.shape[0] - 1):
        r = np.abs(corr[i, i + 1:])
        js = np.flatnonzero(r > limit)
        if js.size:
            first.append(np.full(js.size, i))
            second.append(js + i + 1)
            strength.append(r[js])
    if not first:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate(first), np.concatenate(second), np.concatenate(strength)


def correlation_with_label(df: DataFrame, features: str, label: str, size: int) -> np.ndarray:
    """The (p+1) x (p+1) Pearson matrix of the ``size`` features and the label, from one
    pass of :func:`~sparkdeep.transformers.pca.centred_scatter` (numpy per Arrow batch).
    NaN where a column is constant; rows with a null vector or label, or non-finite
    values, are left out and signalled by a NaN at [0, 0]."""
    from pyspark.ml.functions import vector_to_array

    from .pca import centred_scatter
    values = F.when(F.col(features).isNotNull() & F.col(label).isNotNull(),
                    F.concat(vector_to_array(F.col(features)), F.array(F.col(label).cast("double"))))
    n, _, scatter, bad = centred_scatter(df, features, size + 1, values=values, appended=1)
    if n == 0 and not bad:
        raise ValueError(f"CorrelationSelector: the input has no rows")
    std = np.sqrt(np.diag(scatter))
    corr = scatter  # a fresh matrix: divided in place, a row at a time (no second p x p matrix)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(len(std)):
            corr[i] /= std[i] * std
    corr[std == 0, :] = np.nan
    corr[:, std == 0] = np.nan
    np.fill_diagonal(corr, 1.0)
    if bad:  # signal invalid rows to the caller, which handles them per handleInvalid
        corr = corr.copy()
        corr[0, 0] = np.nan
    return corr


# -- model importance ------------------------------------------------------------------------

class ModelImportanceSelectorModel(SelectorModel):
    """Fitted :class:`ModelImportanceSelector`; ``featureScores`` are the importances."""


class ModelImportanceSelector(_SelectorBase, HasLabelCol, HasSeed, DefaultParamsReadable, ParamsWritable):
    """Keep the ``numTopFeatures`` most important features of a fitted model.

    ``method``: 'randomForest' or 'gbt' (impurity importance), or 'l1' (|weights| of an
    L1-regularised logistic or linear regression, ``regParam``; scale features first).
    ``labelType``: 'categorical' (classification) or 'continuous' (regression).
    """

    method = Param(Params._dummy(), "method", "randomForest, gbt or l1", typeConverter=TypeConverters.toString)
    labelType = Param(Params._dummy(), "labelType", "categorical or continuous",
                      typeConverter=TypeConverters.toString)
    numTopFeatures = Param(Params._dummy(), "numTopFeatures", "features to keep (>= 1)",
                           typeConverter=TypeConverters.toInt)
    regParam = Param(Params._dummy(), "regParam", "L1 strength for method='l1'", typeConverter=TypeConverters.toFloat)
    numTrees = Param(Params._dummy(), "numTrees", "trees for randomForest / iterations for gbt",
                     typeConverter=TypeConverters.toInt)
    _model_class = ModelImportanceSelectorModel

    @keyword_only
    def __init__(self, *, featuresCol: str = "features", outputCol: str = "selected", labelCol: str = "label",
                 method: str = "randomForest", labelType: str = "categorical", numTopFeatures: int = 20,
                 regParam: float = 0.01, numTrees: int = 20, seed: int = 42, handleInvalid: str = "error"):
        super().__init__()
        self._setDefault(method="randomForest", labelType="categorical", numTopFeatures=20,
                         regParam=0.01, numTrees=20, seed=42)
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> ModelImportanceSelectorModel:
        method, kind = self.getOrDefault(self.method), self.getOrDefault(self.labelType)
        k = self.getOrDefault(self.numTopFeatures)
        if method not in ("randomForest", "gbt", "l1"):
            raise ValueError(f"method must be 'randomForest', 'gbt' or 'l1', got {method!r}")
        if kind not in ("categorical", "continuous"):
            raise ValueError(f"labelType must be 'categorical' or 'continuous', got {kind!r}")
        require_numeric(dataset.schema, self.getLabelCol())
        names = self._names(dataset)
        if not 1 <= k <= len(names):
            raise ValueError(f"numTopFeatures={k} must be between 1 and the {len(names)} features")
        col, label, mode = self.getFeaturesCol(), self.getLabelCol(), self.getHandleInvalid()
        args = (method, kind, self.getOrDefault(self.numTrees), self.getOrDefault(self.regParam),
                self.getOrDefault(self.seed))
        skipped = 0
        if mode == "error":
            # Trees and L1 fits take NaN silently. With 'error' the check rides in the fit's
            # own first pass (a failing expression), so clean data pays no extra job; a
            # failure is then counted and named by handle_invalid_rows.
            # _names read the first non-null row already unless the column has ML attributes.
            probed = "num_attrs" not in dataset.schema[col].metadata.get("ml_attr", {})
            if not probed and dataset.isEmpty():
                raise ValueError("ModelImportanceSelector: the input has no usable rows")
            guarded = dataset.withColumn(col, F.when(invalid_row(col, label), F.raise_error(
                F.lit(f"ModelImportanceSelector: invalid row in {col!r} or {label!r}"))).otherwise(F.col(col))
                .alias(col, metadata=dataset.schema[col].metadata))
            try:
                importance = fit_importance(guarded, col, label, *args)
            except Exception:
                handle_invalid_rows(dataset, col, "error", label)  # raises, naming the counts
                raise
        else:
            df, skipped = handle_invalid_rows(dataset, col, mode, label)
            if df.isEmpty():
                raise ValueError("ModelImportanceSelector: the input has no usable rows")
            importance = fit_importance(df, col, label, *args)
        top = np.argsort(-importance, kind="stable")[:k]
        return self._make(top, names, importance, skipped)


def fit_importance(df, features, label, method, kind, trees, reg, seed) -> np.ndarray:
    """Each feature's importance for :class:`ModelImportanceSelector`.

    ``method`` ``randomForest`` or ``gbt``: MLlib's ``featureImportances`` of a forest or
    boosted trees of ``trees`` trees; otherwise the summed absolute weights of an L1
    (``reg``) logistic regression (``kind`` ``categorical``) or linear regression, on
    standardised features.

    Returns
    -------
    numpy.ndarray
        One importance per slot of the ``features`` vector.
    """
    from pyspark.ml import classification as C
    from pyspark.ml import regression as R
    classify = kind == "categorical"
    if method == "randomForest":
        est = (C.RandomForestClassifier if classify else R.RandomForestRegressor)(
            featuresCol=features, labelCol=label, numTrees=trees, seed=seed)
        return est.fit(df).featureImportances.toArray()
    if method == "gbt":
        est = (C.GBTClassifier if classify else R.GBTRegressor)(
            featuresCol=features, labelCol=label, maxIter=trees, seed=seed)
        return est.fit(df).featureImportances.toArray()
    if classify:
        m = C.LogisticRegression(featuresCol=features, labelCol=label, elasticNetParam=1.0,
                                 regParam=reg, standardization=True).fit(df)
        return np.abs(m.coefficientMatrix.toArray()).sum(axis=0)
    m = R.LinearRegression(featuresCol=features, labelCol=label, elasticNetParam=1.0,
                           regParam=reg, standardization=True).fit(df)
    return np.abs(m.coefficients.toArray())


__all__ = ["SelectorModel", "VarianceSelector", "VarianceSelectorModel", "MissingRateSelector",
           "MissingRateSelectorModel", "UnivariateSelector", "UnivariateSelectorModel", "CorrelationSelector",
           "CorrelationSelectorModel", "ModelImportanceSelector", "ModelImportanceSelectorModel",
           "select_by_pvalue"]
