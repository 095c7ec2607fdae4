"""PCA that centres (and optionally scales) at fit and at transform, with k chosen by
explained variance if asked.

MLlib's ``PCA`` learns centred components but projects *uncentred* vectors, so its
output is shifted by ``mean @ components``, and it needs ``k`` up front.
:class:`CenteredPCA` builds the centred covariance in one pass (numpy per Arrow batch on
the executors, see :func:`centred_scatter`), decomposes it on the driver, keeps the mean
(and standard deviations with ``scale=True``), chooses ``k`` as given or as the smallest
reaching ``varianceTarget``, and transforms on the JVM with MLlib's own
``StandardScalerModel`` (centring) followed by ``PCAModel``: no Python over rows.

Two solvers (``solver``):

- ``exact``: the driver holds about three p x p float64 matrices (running scatter, one
  partition's, the eigenvectors): ``3 * 8 * p^2`` bytes (p = 2,000: ~96 MB; p = 10,000:
  ~2.4 GB); each task holds one (p = 2,000: 32 MB) plus its Arrow batch. It refuses a p
  whose matrices would exceed ``maxCovarianceBytes`` (default 2 GiB), or above 65,535,
  with a message that says what to do.
- ``randomized``: subspace iteration on the covariance *operator* (Halko, Martinsson and
  Tropp's randomized range finder with ``powerIterations`` passes): each pass sends a
  p x l block (l = k + ``oversampling``) to the tasks, which return ``X_c^T (X_c Z)`` for
  their rows from sparse or dense vectors (scipy CSR per Arrow batch: a one-hot or hashed
  vector is never densified), and the driver orthonormalises it. No p x p matrix exists
  anywhere: the driver holds a few p x l blocks (p = 100,000, k = 50: ~200 MB), so it
  works beyond MLlib's 65,535-column limit. It needs ``k`` (the explained variance of
  components it did not compute is unknown; the ratios are of the total variance, which
  it does know exactly), and ``2 + powerIterations`` passes over the data. Its model
  projects without centring the input first (``x . W - mean . W``), so sparse vectors
  stay sparse at transform too.
- ``auto`` (default): randomized above ``AUTO_EXACT_MAX`` features when ``k`` is given,
  exact otherwise.
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
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsReader, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ._persist import ParamsWritable, save_metadata
from ._vectors import (BatchMatrices, feature_names, guard_input, numeric_attrs_metadata, require_new,
                       require_one_length, require_vector, vector_size)

#: ``solver='auto'``: the exact solver up to this many features, randomized above (with k).
AUTO_EXACT_MAX = 2048
SOLVERS = ("auto", "exact", "randomized")


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
                               "exact solver: refuse inputs whose p x p matrices need more driver memory than this",
                               typeConverter=TypeConverters.toInt)
    solver = Param(Params._dummy(), "solver",
                   "auto (exact up to AUTO_EXACT_MAX features or without k, else randomized), exact or randomized",
                   typeConverter=TypeConverters.toString)
    powerIterations = Param(Params._dummy(), "powerIterations",
                            "randomized solver: subspace iterations (each one pass over the data)",
                            typeConverter=TypeConverters.toInt)
    oversampling = Param(Params._dummy(), "oversampling",
                         "randomized solver: extra directions beyond k in the random block",
                         typeConverter=TypeConverters.toInt)
    seed = Param(Params._dummy(), "seed", "randomized solver: seed of the random starting block",
                 typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="features", outputCol="pca", k=0, varianceTarget=0.95, scale=False,
                         kAtMost=False, maxCovarianceBytes=2 << 30, handleInvalid="error", solver="auto",
                         powerIterations=4, oversampling=10, seed=0)

    def setHandleInvalid(self, value: str):
        return self._set(handleInvalid=value)


class CenteredPCA(Estimator, _CenteredPCAParams, DefaultParamsReadable, ParamsWritable):
    """Principal components of centred (optionally standardised) vectors.

    Examples
    --------
    >>> pca = CenteredPCA(inputCol="features", outputCol="pcs", varianceTarget=0.9)  # doctest: +SKIP
    >>> model = pca.fit(df); model.k, model.explainedVarianceRatio[:3]              # doctest: +SKIP
    """

    @keyword_only
    def __init__(self, *, inputCol: str = "features", outputCol: str = "pca", k: int = 0,
                 varianceTarget: float = 0.95, scale: bool = False, maxCovarianceBytes: int = 2 << 30,
                 handleInvalid: str = "error", kAtMost: bool = False, solver: str = "auto",
                 powerIterations: int = 4, oversampling: int = 10, seed: int = 0):
        super().__init__()
        self._set(**self._input_kwargs)

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
        if k > p and self.getOrDefault(self.kAtMost):
            k = p
        if k > p:
            raise ValueError(f"k={k} is larger than the {p} features of inputCol {col!r}")
        mode = self.getHandleInvalid()
        if mode not in ("error", "skip"):
            raise ValueError(f"handleInvalid must be 'error' or 'skip' for CenteredPCA "
                             f"(a NaN has no projection), got {mode!r}")
        solver = self.getOrDefault(self.solver)
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
        if solver == "auto":
            solver = "randomized" if k and p > AUTO_EXACT_MAX else "exact"
        if solver == "randomized":
            return self._fit_randomized(dataset, col, p, k, mode)
        need = 3 * 8 * p * p
        limit = self.getOrDefault(self.maxCovarianceBytes)
        if p > 65535 or need > limit:
            raise ValueError(
                f"CenteredPCA's exact solver over {p} features needs about {need / 2**30:.1f} GiB of driver "
                f"memory for the {p} x {p} covariance (limit maxCovarianceBytes={limit / 2**30:.1f} GiB, and at "
                "most 65,535 features). Give k with solver='randomized' (or 'auto'), which never forms that "
                "matrix; or reduce features first (VarianceSelector, UnivariateSelector, CorrelationSelector); "
                "or raise maxCovarianceBytes with spark.driver.memory")
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
            constant = [names[i] for i in np.flatnonzero(_constant(std, mean))]
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

    def _fit_randomized(self, dataset: DataFrame, col: str, p: int, k: int, mode: str) -> "CenteredPCAModel":
        if not k:
            raise ValueError(f"CenteredPCA's randomized solver needs k (inputCol {col!r} has {p} features): the "
                             "variance of components it does not compute is unknown, so varianceTarget cannot "
                             "choose k; give k, or use solver='exact' where p x p fits the driver")
        iterations, extra = self.getOrDefault(self.powerIterations), self.getOrDefault(self.oversampling)
        if iterations < 0 or extra < 0:
            raise ValueError(f"powerIterations and oversampling must be >= 0, got {iterations} and {extra}")
        stats = _SparseMoments(dataset, col, p)
        if stats.bad and mode == "error":
            raise ValueError(f"inputCol {col!r} has {stats.bad} rows with null, NaN or infinite values; "
                             "set handleInvalid='skip' to drop and count them")
        if stats.n < 2:
            raise ValueError(f"inputCol {col!r} needs at least 2 valid rows, got {stats.n}")
        names = feature_names(dataset.schema, col, p)
        scale = self.getOrDefault(self.scale)
        std = np.sqrt(stats.variance)
        if scale:
            constant = [names[i] for i in np.flatnonzero(_constant(std, stats.mean))]
            if constant:
                raise ValueError(f"inputCol {col!r} has constant features {constant[:10]}: they cannot be "
                                 "scaled to unit variance; drop them first (VarianceSelector)")
        inv = 1.0 / std if scale else np.ones(p)
        total = float(p) if scale else float(stats.variance.sum())
        if not np.isfinite(total) or total <= 0:
            raise ValueError(f"inputCol {col!r} has zero (or non-finite) variance in every feature")
        width = min(p, k + extra)
        rng = np.random.default_rng(self.getOrDefault(self.seed))
        basis, _ = np.linalg.qr(rng.standard_normal((p, width)))
        for _ in range(iterations):
            basis, _ = np.linalg.qr(stats.covariance_times(basis, inv))
        image = stats.covariance_times(basis, inv)
        eigval, eigvec = np.linalg.eigh(basis.T @ image)
        order = np.argsort(eigval)[::-1]
        eigval, components = np.clip(eigval[order], 0, None), basis @ eigvec[:, order]
        signs = np.sign(components[np.abs(components).argmax(axis=0), np.arange(width)])
        signs[signs == 0] = 1.0
        components = components * signs
        model = CenteredPCAModel(mean=stats.mean, std=std if scale else None, components=components[:, :k],
                                 explainedVarianceRatio=eigval / total, inputNames=names,
                                 skippedRows=stats.bad)
        self._copyValues(model)
        model._set(k=k, solver="randomized")
        return model


def _constant(std: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Features whose spread is rounding noise: at most 64 ulps of their mean (a column of
    0.1 everywhere has a computed standard deviation near 1e-17, not 0, and which value
    depends on the partitioning). Dividing by such a spread would amplify noise."""
    return std <= 64 * np.finfo(float).eps * np.abs(mean)


class _SparseMoments:
    """The randomized solver's passes over a vector column, sparse or dense rows alike.

    The first pass (here) counts valid rows and gives each feature's mean and variance
    (Chan et al.'s pairwise moments: exact for a mean large next to the spread, where a
    raw sum of squares is not); :meth:`covariance_times` is one more pass computing
    ``C @ Z`` for a p x l block ``Z``, with ``C`` the covariance of the centred (and, with
    ``inv``, scaled) rows: each task multiplies its rows' CSR matrix by ``Z``
    (:func:`_product_pass`), so nothing p x p is formed."""

    def __init__(self, df: DataFrame, col: str, p: int):
        self.df, self.col, self.p = df.select(F.col(col).alias("v")), col, p
        self.n, self.bad, mean, m2 = 0, 0, np.zeros(p), np.zeros(p)
        for row in self._run(_moment_pass, None):
            self.bad += row["bad"]
            if row["n"]:
                self.n, mean, m2 = _merge_moments(self.n, mean, m2, row["n"], _floats(row["a"]), _floats(row["b"]))
        self.mean = mean
        self.variance = np.clip(m2 / max(self.n - 1, 1), 0, None)

    def _run(self, fn, block):
        sc = self.df.sparkSession.sparkContext
        shared = sc.broadcast(block) if block is not None else None
        p = self.p

        def per_partition(batches):
            yield from fn(batches, p, shared.value if shared is not None else None)
        try:
            parts = self.df.mapInArrow(per_partition, "n long, bad long, len_lo long, len_hi long, "
                                                      "a binary, b binary")
            for row in parts.toLocalIterator():
                if row["len_lo"] is not None:
                    require_one_length([row], self.col, p)
                yield row
        finally:
            if shared is not None:
                shared.unpersist()

    def covariance_times(self, block: np.ndarray, inv: np.ndarray) -> np.ndarray:
        """``C @ block`` for the scaled covariance ``C = D (X_c^T X_c) D / (n - 1)``, ``D = diag(inv)``."""
        acc = np.zeros_like(block)
        for row in self._run(_product_pass, (block * inv[:, None], self.mean)):
            if row["n"]:
                acc += _floats(row["a"]).reshape(block.shape)
        return inv[:, None] * acc / (self.n - 1)


def csr_rows(batches, p: int):
    """A partition's Arrow batches of one ``VectorUDT`` column (its storage struct: type,
    size, indices, values) as scipy CSR matrices of the valid rows, sparse and dense
    vectors alike, without a Python loop over rows. Yields ``(matrix, invalid_rows, lo,
    hi)``: null rows and rows holding NaN or infinity are left out and counted; a batch
    with a row of another length than ``p`` yields no matrix but its lengths (lo, hi)."""
    import pyarrow.compute as pc
    from scipy import sparse
    for batch in batches:
        arr = batch.column(0)
        nulls = arr.null_count
        if nulls:
            arr = pc.drop_null(arr)
        if not len(arr):
            yield None, nulls, None, None
            continue
        kind, size, indices, values = arr.flatten()
        dense = kind.to_numpy(zero_copy_only=False) == 1
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
        widths = np.where(dense, lengths, size.fill_null(0).to_numpy(zero_copy_only=False))
        lo, hi = int(widths.min()), int(widths.max())
        if lo != p or hi != p:
            yield None, nulls, lo, hi
            continue
        flat = values.flatten().to_numpy(zero_copy_only=False)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        cols = np.empty(len(flat), dtype=np.int64)
        dense_elem = np.repeat(dense, lengths)
        cols[dense_elem] = (np.arange(len(flat)) - np.repeat(starts[:-1], lengths))[dense_elem]
        if (~dense_elem).any():
            cols[~dense_elem] = indices.flatten().to_numpy(zero_copy_only=False)
        rows = len(lengths)
        matrix = sparse.csr_matrix((flat, cols, starts), shape=(rows, p))
        bad_elem = ~np.isfinite(flat)
        if bad_elem.any():
            ok = np.bincount(np.repeat(np.arange(rows), lengths)[bad_elem], minlength=rows) == 0
            matrix, bad = matrix[ok], int((~ok).sum())
            matrix.data = np.nan_to_num(matrix.data)  # rows kept are finite; this only guards the type
        else:
            bad = 0
        yield matrix, nulls + bad, lo, hi


def _pass_row(n, bad, lo, hi, a: np.ndarray, b: np.ndarray):
    """One partition's result; the arrays travel as raw float64 bytes (a p x l block is
    millions of values: no per-value conversion on either side)."""
    import pyarrow as pa
    return pa.RecordBatch.from_pydict({
        "n": pa.array([n], pa.int64()), "bad": pa.array([bad], pa.int64()),
        "len_lo": pa.array([lo], pa.int64()), "len_hi": pa.array([hi], pa.int64()),
        "a": pa.array([_f8_bytes(a)], pa.binary()), "b": pa.array([_f8_bytes(b)], pa.binary())})


def _f8_bytes(a) -> bytes:
    return np.ascontiguousarray(a, dtype="<f8").tobytes()


def _floats(data) -> np.ndarray:
    return np.frombuffer(data, dtype="<f8")


def _merge_moments(n1, mean1, m2_1, n2, mean2, m2_2):
    """Chan et al.'s pairwise update of (count, mean, sum of squared deviations) per feature:
    accurate when a mean is large next to the spread (a raw sum of squares is not)."""
    if n1 == 0:
        return n2, mean2, m2_2
    n = n1 + n2
    delta = mean2 - mean1
    return n, mean1 + delta * (n2 / n), m2_1 + m2_2 + delta ** 2 * (n1 * n2 / n)


def _batch_moments(matrix):
    """(rows, mean, sum of squared deviations) per feature of a CSR batch: deviations of the
    stored values from the batch's mean, plus the implicit zeros' (``-mean`` each)."""
    rows = matrix.shape[0]
    mean = np.asarray(matrix.sum(axis=0)).ravel() / rows
    cols = matrix.indices
    stored = np.bincount(cols, minlength=matrix.shape[1])
    m2 = np.bincount(cols, weights=(matrix.data - mean[cols]) ** 2, minlength=matrix.shape[1])
    return rows, mean, m2 + (rows - stored) * mean ** 2


def _moment_pass(batches, p, _):
    n, bad, lo, hi = 0, 0, None, None
    mean, m2 = np.zeros(p), np.zeros(p)
    for matrix, invalid, a, b in csr_rows(batches, p):
        bad += invalid
        if a is not None:
            lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
        if matrix is None or not matrix.shape[0]:
            continue
        n, mean, m2 = _merge_moments(n, mean, m2, *_batch_moments(matrix))
    yield _pass_row(n, bad, lo, hi, mean, m2)


def _product_pass(batches, p, shared):
    """One partition's ``sum over rows of (x - mean) ((x - mean) . scaled)``, centring without
    densifying: stored values are centred in place; a feature's implicit zeros (only in
    columns that have some in the batch) contribute ``-mean``, added by two sparse products.
    A column stored in every row (a dense number, possibly with a large mean) is centred
    exactly and never enters a large sum that must cancel."""
    scaled, mean = shared
    n, acc = 0, np.zeros_like(scaled)
    for matrix, _, _, _ in csr_rows(batches, p):
        if matrix is None or not matrix.shape[0]:
            continue
        rows, cols = matrix.shape[0], matrix.indices
        n += rows
        holes = np.bincount(cols, minlength=p) < rows  # columns with implicit zeros in this batch
        hole_mean = np.where(holes, mean, 0.0)
        centred = matrix.copy()
        centred.data = matrix.data - mean[cols]
        stored_mean = matrix.copy()
        stored_mean.data = hole_mean[cols]
        # y = (x - mean) . scaled = centred . scaled - (sum of mean_j scaled_j over the row's zeros)
        y = centred @ scaled - (hole_mean @ scaled - stored_mean @ scaled)
        pattern = matrix.copy()
        pattern.data = np.ones_like(matrix.data)
        acc += centred.T @ y - hole_mean[:, None] * (y.sum(axis=0)[None, :] - pattern.T @ y)
    yield _pass_row(n, 0, None, None, acc, np.zeros(0))


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

    A partition's matrix travels as raw float64 bytes in rows of at most
    :data:`SCATTER_CHUNK` values (a Python list of p x p floats cost 1.5 GB in the worker
    and again on the driver at 7,000 features; Arrow's binary values stay under 2 GB each).
    """
    import pyarrow as pa
    from pyspark.ml.functions import vector_to_array
    chunk = int(SCATTER_CHUNK)

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
        flat = np.zeros(0) if scatter is None else np.ravel(scatter)
        pieces = [flat[i:i + chunk] for i in range(0, len(flat), chunk)] or [flat]
        schema = _scatter_arrow_schema()
        for k, piece in enumerate(pieces):
            first = k == 0
            yield pa.RecordBatch.from_pydict({
                "piece": [k], "pieces": [len(pieces)],
                "n": [n if first else 0], "bad": [bad + matrices.nulls if first else 0],
                **(matrices.length_columns() if first else {"len_lo": [None], "len_hi": [None]}),
                "mean": [b"" if mean is None or not first else _f8_bytes(mean)],
                "scatter": [_f8_bytes(piece)]},
                schema=schema)

    if values is None:
        values = F.when(F.col(col).isNotNull(), vector_to_array(F.col(col)))
    parts = (df.select(values.alias("v"))
             .mapInArrow(per_partition, "piece int, pieces int, n long, bad long, len_lo long, "
                                        "len_hi long, mean binary, scatter binary"))
    n, bad, mean, scatter = 0, 0, None, None
    head, pieces = None, []
    for row in parts.toLocalIterator():  # a partition's rows arrive together, in order
        if row["piece"] == 0:
            head, pieces = row, []
            if row["len_lo"] is not None:
                require_one_length([{"len_lo": row["len_lo"] - appended, "len_hi": row["len_hi"] - appended}],
                                   col, p - appended)
            bad += row["bad"]
        pieces.append(_floats(row["scatter"]))
        if len(pieces) == row["pieces"] and head["n"]:
            m = _floats(head["mean"]).copy()
            s = pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces)
            pieces = []
            n, mean, scatter = _merge(n, mean, scatter, head["n"], m, s.reshape(len(m), len(m)))
    if mean is None:
        mean, scatter = np.zeros(p), np.zeros((p, p))
    return n, mean, scatter, bad


#: At most this many float64 values of a scatter matrix in one row on their way to the driver.
SCATTER_CHUNK = 1 << 24


def _scatter_arrow_schema():
    import pyarrow as pa
    return pa.schema([("piece", pa.int32()), ("pieces", pa.int32()), ("n", pa.int64()),
                      ("bad", pa.int64()), ("len_lo", pa.int64()), ("len_hi", pa.int64()),
                      ("mean", pa.binary()), ("scatter", pa.binary())])


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
        def projector(components, input_col):
            pc = DenseMatrix(p, self.numComponents, components.flatten(order="F").tolist(), isTransposed=False)
            jpca = sc._jvm.org.apache.spark.ml.feature.PCAModel(
                "centeredpca_projection", _py2java(sc, pc), _py2java(sc, DenseVector(self.explainedVariance)))
            model = PCAModel(jpca)
            model._transfer_params_from_java()
            return model.setInputCol(input_col).setOutputCol(out)._set(k=self.numComponents)

        if self.getOrDefault(self.solver) == "randomized":
            # Wide (often sparse) input: project x itself, then subtract mean . W, so a sparse
            # vector is never centred into a dense one. (The exact solver's models centre
            # first, which keeps full accuracy where means are large next to the spread.)
            from pyspark.ml.functions import array_to_vector, vector_to_array
            folded = self.components / self.std[:, None] if self.std is not None else self.components
            offset = F.array(*[F.lit(float(v)) for v in self.mean @ folded])
            projected = projector(folded, checked).transform(dataset)
            projected = projected.withColumn(out, array_to_vector(F.transform(
                vector_to_array(F.col(out)), lambda x, i: x - F.get(offset, i))))
        else:
            scaler = _java_scaler(dataset, self.mean, self.std if self.std is not None else np.ones(p),
                                  checked, "__centred")
            scaler._set(withStd=self.std is not None)
            projected = projector(self.components, "__centred").transform(scaler.transform(dataset)) \
                .drop("__centred")
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
        save_metadata(m, path, self.sparkSession,
                      extra={"k": m.numComponents, "inputNames": m.inputNames, "skippedRows": m.skippedRows})
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
