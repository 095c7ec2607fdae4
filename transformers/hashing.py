"""Categories as hash buckets: an index for a column of any level count, with no vocabulary.

:class:`HashIndexer` puts each value of a categorical column in one of ``numBuckets``
buckets by FarmHash's ``Fingerprint64`` of its UTF-8 bytes, modulo ``numBuckets`` (the hash
Keras' ``Hashing`` layer and TensorFlow's ``to_hash_bucket_fast`` compute, so the export
scores as Spark does; the one exception is a raw value equal to the export's null token,
``[sparkdeep:null]``, which scores as a null); a null gets index ``numBuckets``, a bucket of
its own. Strings, integers, booleans and dates only: a number's text form is Spark's own. Nothing is
fitted and nothing is held: a column of 10^7 levels costs what one of 10 does, a level
never seen in training lands in some bucket, and distinct levels may share one (about
``levels / numBuckets`` each). The prepare step hashes the columns with more levels than
``prepare.hash_buckets`` (counted approximately, on the executors) and gives the others a
vocabulary (``StringIndexer``).
"""
from __future__ import annotations

import farmhash
import numpy as np
import pandas as pd
from pyspark import keyword_only
from pyspark.ml import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCols, HasOutputCols
from pyspark.ml.util import DefaultParamsReadable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep.names import quoted
from sparkdeep.registry import Choices

from ._persist import ParamsWritable


def bucket_of(value: str | None, buckets: int) -> int:
    """The index :class:`HashIndexer` gives ``value``: its FarmHash ``Fingerprint64`` modulo
    ``buckets``; ``buckets`` for a null.

    Examples
    --------
    >>> bucket_of(None, 1000), 0 <= bucket_of("user 7", 1000) < 1000
    (1000, True)
    """
    if value is None:
        return int(buckets)
    return farmhash.fingerprint64(str(value)) % int(buckets)


def _buckets_udf(buckets: int):
    """A pandas UDF: a string column's buckets (null: ``buckets``), as doubles (StringIndexer's type)."""

    @F.pandas_udf("double")
    def buckets_of(values: pd.Series) -> pd.Series:
        out = np.full(len(values), float(buckets))
        present = values.notna().to_numpy()
        n = int(buckets)
        out[present] = [farmhash.fingerprint64(v) % n for v in values[present]]
        return pd.Series(out)
    return buckets_of


class HashIndexer(Transformer, HasInputCols, HasOutputCols, DefaultParamsReadable, ParamsWritable):
    """Each categorical column's value as one of ``numBuckets`` hash buckets (a double
    index, ``numBuckets`` for a null), in one projection whatever the column count.

    Parameters
    ----------
    inputCols, outputCols : list of str
        The columns and their indices: strings, or integers, booleans or dates (cast to
        strings, as ingest stores categories). A floating-point or decimal column is
        refused: its text form (``1.0E7``, ``NaN``, ``3.00``) is Spark's own, and no
        scorer outside Spark would hash it the same.
    numBuckets : int
        Buckets per column (2 to 2^30); the embedding table gets ``numBuckets + 1`` rows.

    Examples
    --------
    >>> h = HashIndexer(inputCols=["user"], outputCols=["user_i"], numBuckets=8)
    >>> [r.user_i for r in h.transform(spark.createDataFrame([("a",), (None,)], "user string")).collect()]
    [3.0, 8.0]
    """

    numBuckets = Param(Params._dummy(), "numBuckets", "hash buckets per column (2 to 2^30); a null gets index "
                       "numBuckets", typeConverter=TypeConverters.toInt)

    @keyword_only
    def __init__(self, *, inputCols=None, outputCols=None, numBuckets=None):
        super().__init__()
        self._setDefault(numBuckets=1 << 18)
        self._set(**self._input_kwargs)
        self._check()

    @keyword_only
    def setParams(self, *, inputCols=None, outputCols=None, numBuckets=None) -> "HashIndexer":
        self._set(**self._input_kwargs)
        self._check()
        return self

    def _check(self) -> None:
        n = self.getOrDefault(self.numBuckets)
        if not 2 <= n <= Choices.MAX_HASH_BUCKETS:
            raise ValueError(f"HashIndexer: numBuckets must be between 2 and 2^30, got {n}")
        if self.isSet(self.inputCols) and self.isSet(self.outputCols):
            if len(self.getInputCols()) != len(self.getOutputCols()):
                raise ValueError(f"HashIndexer: {len(self.getInputCols())} inputCols but "
                                 f"{len(self.getOutputCols())} outputCols; give one output each")
            twice = sorted({c for c in self.getOutputCols() if self.getOutputCols().count(c) > 1})
            if twice:
                raise ValueError(f"HashIndexer: outputCols name {twice[0]!r} more than once")

    def getNumBuckets(self) -> int:
        return self.getOrDefault(self.numBuckets)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        if not (self.isSet(self.inputCols) and self.isSet(self.outputCols)):
            raise ValueError("HashIndexer: set inputCols and outputCols (one index column per input)")
        self._check()
        missing = [c for c in self.getInputCols() if c not in dataset.columns]
        if missing:
            raise ValueError(f"HashIndexer: the input has no column {missing[0]!r} (columns: "
                             f"{', '.join(dataset.columns[:20])}{' ...' if len(dataset.columns) > 20 else ''})")
        kinds = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType, T.DateType)
        other = [f for f in dataset.schema.fields if f.name in self.getInputCols() and not isinstance(f.dataType, kinds)]
        if other:
            raise ValueError(f"HashIndexer: column {other[0].name!r} is {other[0].dataType.simpleString()}; hash "
                             "strings, integers, booleans or dates (cast a number that names a category to a "
                             "string or an integer first)")
        clash = [c for c in self.getOutputCols() if c in dataset.columns]
        if clash:
            raise ValueError(f"HashIndexer: the input already has a column {clash[0]!r}")
        fn = _buckets_udf(self.getNumBuckets())
        made = [fn(F.col(quoted(c)).cast("string")).alias(o) for c, o in zip(self.getInputCols(), self.getOutputCols())]
        return dataset.select("*", *made)
