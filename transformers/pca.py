"""PCA that centres (and optionally scales) at fit and at transform, with k chosen by
explained variance if asked.

MLlib's ``PCA`` learns centred components but projects *uncentred* vectors, so its
output is shifted by ``mean @ components``, and it needs ``k`` up front.
:class:`CenteredPCA` builds the centred covariance in one pass (numpy per Arrow batch on
the executors, see :func:`centred_scatter`), decomposes it on the driver, keeps the mean
(and standard deviations with ``scale=True``), chooses ``k`` as given or as the smallest
reaching ``varianceTarget``, and transforms on the JVM with MLlib's own
``StandardScalerModel`` (centring) followed by ``PCAModel``: no Python over rows.

Memory: the driver holds about three p x p float64 matrices (running scatter, one
partition's, the eigenvectors): ``3 * 8 * p^2`` bytes (p = 2,000: ~96 MB; p = 10,000:
~2.4 GB); each task holds one (p = 2,000: 32 MB) plus its Arrow batch. The stage refuses
a p whose matrices would exceed ``maxCovarianceBytes`` (default 2 GiB), or above 65,535
(MLlib's ``PCAModel`` limit), with a message that says what to do.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.common import _py2java
from pyspark.ml.feature import PCAModel, StandardScalerModel
from pyspark.ml.linalg import DenseMatrix, DenseVector
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasHandleInvalid, HasInputCol, HasOutputCol
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter, DefaultParamsReader, DefaultParamsWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._vectors import (BatchMatrices, feature_names, guard_input, numeric_attrs_metadata, require_new,
                       require_one_length, require_vector, vector_size)


class _CenteredPCAParams(HasInputCol, HasOutputCol, HasHandleInvalid):
    k = Param(Params._dummy(), "k", "number of components (0 = choose by varianceTarget)",
              typeConverter=TypeConverters.toInt)
    varianceTarget = Param(Params._dummy(), "varianceTarget",
                           "with k=0: smallest k whose explained variance ratio reaches this, in (0, 1]",
                           typeConverter=TypeConverters.toFloat)
    scale = Param(Params._dummy(), "scale", "divide by the standard deviation as well as centring",
                  typeConverter=TypeConverters.toBoolean)
    kAtMost = Param(Params._dummy(), "kAtMost",
                    "treat k as an upper bound: an input with fewer features keeps them all (as components)",
                    typeConverter=TypeConverters.toBoolean)
    maxCovarianceBytes = Param(Params._dummy(), "maxCovarianceBytes",
                               "refuse inputs whose p x p matrices need more driver memory than this",
                               typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="features", outputCol="pca", k=0, varianceTarget=0.95, scale=False,
                         kAtMost=False, maxCovarianceBytes=2 << 30, handleInvalid="error")

    def setHandleInvalid(self, value: str):
        return self._set(handleInvalid=value)


class CenteredPCA(Estimator, _CenteredPCAParams, MLReadable, MLWritable):
    """Principal components of centred (optionally standardised) vectors.

    Examples
    --------
    >>> pca = CenteredPCA(inputCol="features", outputCol="pcs", varianceTarget=0.9)  # doctest: +SKIP
    >>> model = pca.fit(df); model.k, model.explainedVarianceRatio[:3]              # doctest: +SKIP
    """

    @keyword_only
    def __init__(self, *, inputCol: str = "features", outputCol: str = "pca", k: int = 0,
                 varianceTarget: float = 0.95, scale: bool = False, maxCovarianceBytes: int = 2 << 30,
                 handleInvalid: str = "error", kAtMost: bool = False):
        super().__init__()
        self._set(**self._input_kwargs)

    def write(self) -> MLWriter:
        return DefaultParamsWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return DefaultParamsReader(cls)

    def _fit(self, dataset: DataFrame) -> "CenteredPCAModel":
        col = self.getInputCol()
        require_vector(dataset.schema, col, "inputCol")
        require_new(dataset.schema, self.getOutputCol())
        k, target = self.getOrDefault(self.k), self.getOrDefault(self.varianceTarget)
        if k < 0:
            raise ValueError(f"k must be >= 0 (0 = choose by varianceTarget), got {k}")
        if k == 0 and not 0 < target <= 1:
            raise ValueError(f"varianceTarget must be in (0, 1], got {target}")
        p = vector_size(dataset, col)
        need = 3 * 8 * p * p
        limit = self.getOrDefault(self.maxCovarianceBytes)
        if p > 65535 or need > limit:
            raise ValueError(
                f"CenteredPCA over {p} features needs about {need / 2**30:.1f} GiB of driver memory for "
                f"the {p} x {p} covariance (limit maxCovarianceBytes={limit / 2**30:.1f} GiB; MLlib's hard "
                "limit is 65,535 features). Reduce features first (VarianceSelector, UnivariateSelector, "
                "CorrelationSelector) or raise maxCovarianceBytes with spark.driver.memory")
        if k > p and self.getOrDefault(self.kAtMost):
            k = p
        if k > p:
            raise ValueError(f"k={k} is larger than the {p} features of inputCol {col!r}")

        mode = self.getHandleInvalid()
        if mode not in ("error", "skip"):
            raise ValueError(f"handleInvalid must be 'error' or 'skip' for CenteredPCA "
                             f"(a NaN has no projection), got {mode!r}")
        n, mean, scatter, bad = centred_scatter(dataset, col, p)
        if bad and mode == "error":
            raise ValueError(f"inputCol {col!r} has {bad} rows with null, NaN or infinite values; "
                             "set handleInvalid='skip' to drop and count them")
        if n < 2:
            raise ValueError(f"inputCol {col!r} needs at least 2 valid rows, got {n}")
        names = feature_names(dataset.schema, col, p)
        if not np.isfinite(scatter).all():
            raise ValueError(f"inputCol {col!r}: the covariance overflows float64 (a feature spreads over more "
                             "than about 1e154); rescale the features first")
        cov = scatter / (n - 1)
        std = np.sqrt(np.clip(np.diag(cov), 0, None))
        scale = self.getOrDefault(self.scale)
        if scale:
            constant = [names[i] for i in np.flatnonzero(std == 0)]
            if constant:
                raise ValueError(f"inputCol {col!r} has constant features {constant[:10]}: they cannot be "
                                 "scaled to unit variance; drop them first (VarianceSelector)")
            cov = cov / np.outer(std, std)
        if not np.isfinite(cov).all():
            raise ValueError(f"inputCol {col!r}: the covariance is not finite; rescale the features first")
        eigval, eigvec = np.linalg.eigh(cov)
        order = np.argsort(eigval)[::-1]
        eigval, components = np.clip(eigval[order], 0, None), eigvec[:, order]
        total = eigval.sum()
        if total <= 0:
            raise ValueError(f"inputCol {col!r} has zero variance in every feature")
        ratio = eigval / total
        if k == 0:
            k = min(int(np.searchsorted(np.cumsum(ratio), target - 1e-12) + 1), p)
        # Eigenvectors are defined up to sign; make each one's largest |loading| positive
        # so refits and reference implementations agree.
        signs = np.sign(components[np.abs(components).argmax(axis=0), np.arange(p)])
        signs[signs == 0] = 1.0
        components = components * signs
        skipped = bad
        model = CenteredPCAModel(mean=mean, std=std if scale else None, components=components[:, :k],
                                 explainedVarianceRatio=ratio, inputNames=names, skippedRows=skipped)
        self._copyValues(model)
        model._set(k=k)  # the chosen k, also when varianceTarget chose it
        return model


def centred_scatter(df: DataFrame, col: str, p: int, values=None,
                    appended: int = 0) -> tuple[int, np.ndarray, np.ndarray, int]:
    """One pass over rows of ``p`` values: (valid rows, mean, centred scatter matrix,
    invalid rows). A row of another length is an error naming ``col`` (``values`` may
    append ``appended`` columns, e.g. the label, to the vector's).

    Each partition reduces its Arrow batches with numpy (BLAS matrix products, no
    per-row Python) into (n, mean, scatter), merged with the pairwise update of Chan et
    al., which stays accurate when means are large next to the spread. Partitions are
    merged on the driver one at a time, so it holds two p x p matrices, not one per
    partition. Rows that are null or hold NaN/infinity are left out and counted.
    """
    import pyarrow as pa
    from pyspark.ml.functions import vector_to_array

    def per_partition(batches):
        n, bad, mean, scatter = 0, 0, None, None
        matrices = BatchMatrices(batches, p)
        for x in matrices:
            ok = np.isfinite(x).all(axis=1)
            if not ok.all():
                bad += int((~ok).sum())
                x = x[ok]
            if not len(x):
                continue
            n, mean, scatter = _merge(n, mean, scatter, *_moments(x))
        yield pa.RecordBatch.from_pydict({
            "n": [n], "bad": [bad + matrices.nulls], **matrices.length_columns(),
            "mean": [[] if mean is None else mean.tolist()],
            "scatter": [[] if scatter is None else scatter.ravel().tolist()]})

    if values is None:
        values = F.when(F.col(col).isNotNull(), vector_to_array(F.col(col)))
    parts = (df.select(values.alias("v"))
             .mapInArrow(per_partition, "n long, bad long, len_lo long, len_hi long, mean array<double>, "
                                        "scatter array<double>"))
    n, bad, mean, scatter = 0, 0, None, None
    for row in parts.toLocalIterator():
        if row["len_lo"] is not None:
            require_one_length([{"len_lo": row["len_lo"] - appended, "len_hi": row["len_hi"] - appended}],
                               col, p - appended)
        bad += row["bad"]
        if row["n"]:
            m = np.asarray(row["mean"])
            n, mean, scatter = _merge(n, mean, scatter, row["n"], m,
                                      np.asarray(row["scatter"]).reshape(len(m), len(m)))
    if mean is None:
        mean, scatter = np.zeros(p), np.zeros((p, p))
    return n, mean, scatter, bad


def _moments(x: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    m = x.mean(axis=0)
    xc = x - m
    return len(x), m, xc.T @ xc


def _merge(n1, m1, s1, n2, m2, s2):
    if n1 == 0:
        return n2, m2, s2
    n = n1 + n2
    delta = m2 - m1
    return n, m1 + delta * (n2 / n), s1 + s2 + np.outer(delta, delta) * (n1 * n2 / n)


def _java_scaler(df: DataFrame, mean, std, input_col: str, output_col: str) -> StandardScalerModel:
    sc = df.sparkSession.sparkContext
    jmodel = sc._jvm.org.apache.spark.ml.feature.StandardScalerModel(
        "centeredpca_scaler", _py2java(sc, DenseVector(np.where(std > 0, std, 1.0))), _py2java(sc, DenseVector(mean)))
    model = StandardScalerModel(jmodel)
    model._transfer_params_from_java()
    return model.setInputCol(input_col).setOutputCol(output_col)._set(withMean=True, withStd=std is not None)


class CenteredPCAModel(Model, _CenteredPCAParams, MLReadable, MLWritable):
    """Fitted :class:`CenteredPCA`: ``numComponents`` (also its ``k`` param), ``mean``, ``components`` (p x k),
    ``explainedVarianceRatio`` (all p, descending) and ``explainedVariance`` (first k)."""

    def __init__(self, mean=None, std=None, components=None, explainedVarianceRatio=None,
                 inputNames=None, skippedRows: int = 0):
        super().__init__()
        self.mean = None if mean is None else np.asarray(mean, dtype=float)
        self.std = None if std is None else np.asarray(std, dtype=float)
        self.components = None if components is None else np.asarray(components, dtype=float)
        self.explainedVarianceRatio = (None if explainedVarianceRatio is None
                                       else np.asarray(explainedVarianceRatio, dtype=float))
        self.inputNames = list(inputNames or [])
        self.skippedRows = int(skippedRows)

    @property
    def numComponents(self) -> int:
        return int(self.components.shape[1])

    @property
    def explainedVariance(self) -> np.ndarray:
        return self.explainedVarianceRatio[: self.numComponents]

    @property
    def summary(self) -> dict:
        return {"stage": "CenteredPCA", "input_features": len(self.inputNames), "k": self.numComponents,
                "explained_variance": [round(float(v), 6) for v in self.explainedVariance],
                "explained_variance_total": round(float(self.explainedVariance.sum()), 6),
                "skipped_rows": self.skippedRows}

    def _transform(self, dataset: DataFrame) -> DataFrame:
        col, out = self.getInputCol(), self.getOutputCol()
        require_vector(dataset.schema, col, "inputCol")
        require_new(dataset.schema, out)
        p = len(self.mean)
        sc = dataset.sparkSession.sparkContext
        # The fit refused null, NaN and infinite rows; transform follows the same handleInvalid:
        # 'error' fails naming the column, 'skip' gives such a row a null output (the row is
        # kept: scoring never loses rows). A vector of another length is always an error.
        mode = self.getHandleInvalid()
        dataset, checked, finish = guard_input(dataset, col, p, finite=True, mode=mode,
                                               stage="CenteredPCAModel", param="inputCol")
        scaler = _java_scaler(dataset, self.mean, self.std if self.std is not None else np.ones(p),
                              checked, "__centred")
        scaler._set(withStd=self.std is not None)
        pc = DenseMatrix(p, self.numComponents, self.components.flatten(order="F").tolist(), isTransposed=False)
        jpca = sc._jvm.org.apache.spark.ml.feature.PCAModel(
            "centeredpca_projection", _py2java(sc, pc), _py2java(sc, DenseVector(self.explainedVariance)))
        projector = PCAModel(jpca)
        projector._transfer_params_from_java()
        projector = projector.setInputCol("__centred").setOutputCol(out)._set(k=self.numComponents)
        projected = projector.transform(scaler.transform(dataset)).drop("__centred")
        names = [f"pc{i + 1}" for i in range(self.numComponents)]
        return (projected.withColumn(out, finish(F.col(out)).alias(out, metadata=numeric_attrs_metadata(names)))
                .drop(*[c for c in projected.columns if c.startswith("__CenteredPCAModel_")]))

    # -- persistence: params as JSON metadata, arrays as one Parquet row under data/ --
    def write(self) -> MLWriter:
        return _PCAModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _PCAModelReader(cls)


class _PCAModelWriter(MLWriter):
    def __init__(self, instance: CenteredPCAModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        m = self.instance
        DefaultParamsWriter.saveMetadata(m, path, self.sparkSession,
                                         extraMetadata={"k": m.numComponents, "inputNames": m.inputNames,
                                                        "skippedRows": m.skippedRows})
        schema = T.StructType([T.StructField("mean", T.ArrayType(T.DoubleType())),
                               T.StructField("std", T.ArrayType(T.DoubleType())),
                               T.StructField("components", T.ArrayType(T.DoubleType())),
                               T.StructField("ratio", T.ArrayType(T.DoubleType()))])
        row = (m.mean.tolist(), None if m.std is None else m.std.tolist(),
               m.components.flatten().tolist(), m.explainedVarianceRatio.tolist())
        self.sparkSession.createDataFrame([row], schema).write.parquet(f"{path.rstrip('/')}/data")


class _PCAModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> CenteredPCAModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        row = self.sparkSession.read.parquet(f"{path.rstrip('/')}/data").first()
        p, k = len(row["mean"]), int(metadata["k"])
        model = CenteredPCAModel(mean=row["mean"], std=row["std"],
                                 components=np.asarray(row["components"]).reshape(p, k),
                                 explainedVarianceRatio=row["ratio"], inputNames=metadata["inputNames"],
                                 skippedRows=metadata.get("skippedRows", 0))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model


__all__ = ["CenteredPCA", "CenteredPCAModel", "centred_scatter"]
