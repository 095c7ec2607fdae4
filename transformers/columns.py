"""Column stages of the saved model: the first (rows under the source's column names in,
internal names out) and the assembler of many columns into one vector.

Ingest stores a column whose name Delta or MLlib cannot take (``x.GENE1``, ``Price (USD)``)
under an internal name (``sparkdeep.names``). A fitted pipeline that starts with
:class:`ColumnRenamer` scores both: the ingested tables (internal names, passed through)
and raw rows a user brings with the original names (renamed, in one ``select``: the plan
does not deepen with the number of columns).
"""
from __future__ import annotations

import contextlib
import threading

from pyspark import keyword_only
from pyspark.ml import Transformer
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasHandleInvalid, HasInputCols, HasOutputCol
from pyspark.ml.util import DefaultParamsReadable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep.names import ORIGINAL_NAME, quoted

from ._persist import ParamsWritable


class ColumnRenamer(Transformer, DefaultParamsReadable, ParamsWritable):
    """Rename source columns to internal names; columns already internal pass through.
    Categorical columns (``stringCols``) of another type are cast to strings as ingest
    casts them (a boolean reads ``true``/``false``), so raw rows score as ingested ones.

    Parameters
    ----------
    originals : list of str
        The source names, in order.
    internals : list of str
        The internal name of each (same length).

    Examples
    --------
    >>> r = ColumnRenamer(originals=["x.a", "price (USD)"], internals=["x_a", "price_USD_"])
    >>> r.transform(spark.createDataFrame([(1.0, 2.0)], ["x.a", "price (USD)"])).columns
    ['x_a', 'price_USD_']
    """

    originals = Param(Params._dummy(), "originals", "the source column names", typeConverter=TypeConverters.toListString)
    internals = Param(Params._dummy(), "internals", "the internal name of each source column",
                      typeConverter=TypeConverters.toListString)
    optionalCols = Param(Params._dummy(), "optionalCols",
                         "internal names the input may lack (the key: scoring needs no key)",
                         typeConverter=TypeConverters.toListString)
    stringCols = Param(Params._dummy(), "stringCols",
                       "internal names of categorical columns, cast to strings as ingest does (booleans as "
                       "true/false) when the input holds another type", typeConverter=TypeConverters.toListString)

    @keyword_only
    def __init__(self, *, originals=None, internals=None, optionalCols=None, stringCols=None):
        super().__init__()
        self._setDefault(originals=[], internals=[], optionalCols=[], stringCols=[])
        self._set(**self._input_kwargs)
        self._check_lengths()

    @keyword_only
    def setParams(self, *, originals=None, internals=None, optionalCols=None, stringCols=None) -> "ColumnRenamer":
        self._set(**self._input_kwargs)
        self._check_lengths()
        return self

    def _check_lengths(self) -> None:
        o, i = self.getOrDefault("originals"), self.getOrDefault("internals")
        if len(o) != len(i):
            raise ValueError(f"ColumnRenamer: {len(o)} originals but {len(i)} internals; give one internal name each")
        if len(set(i)) != len(i):
            raise ValueError("ColumnRenamer: internal names must be distinct")

    def pairs(self) -> list[tuple[str, str]]:
        return list(zip(self.getOrDefault("originals"), self.getOrDefault("internals")))

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.sql import types as T
        pairs = self.pairs()
        optional = set(self.getOrDefault("optionalCols"))
        present = set(dataset.columns)
        rename = {}
        for orig, internal in pairs:
            if internal in present:
                continue
            if orig not in present:
                if internal in optional:
                    continue
                raise ValueError(f"ColumnRenamer: the input has neither the column {orig!r} nor its internal name "
                                 f"{internal!r}; the model needs it")
            rename[orig] = internal
        clash = [internal for internal in rename.values() if internal in present]
        if clash:
            raise ValueError(f"ColumnRenamer: the input already has a column {clash[0]!r}")
        strings = set(self.getOrDefault("stringCols"))
        recast = {f.name for f in dataset.schema.fields
                  if rename.get(f.name, f.name) in strings and not isinstance(f.dataType, T.StringType)}
        if not rename and not recast:
            return dataset
        out = []
        for f in dataset.schema.fields:
            col = F.col(quoted(f.name))
            if f.name in recast:
                col = col.cast("string")
                if isinstance(f.dataType, T.BooleanType):
                    col = F.lower(col)
            if f.name in rename:
                out.append(col.alias(rename[f.name], metadata={**(f.metadata or {}), ORIGINAL_NAME: f.name}))
            elif f.name in recast:
                out.append(col.alias(f.name, metadata=f.metadata or {}))
            else:
                out.append(col)
        return dataset.select(*out)


#: Spark's self-join check: with it on, ``Dataset.col`` tags each column it returns with
#: the frame's id and the column's position, found by a scan of the plan's output.
SELF_JOIN_CHECK = "spark.sql.analyzer.failAmbiguousSelfJoin"
_SELF_JOIN_LOCK = threading.RLock()


@contextlib.contextmanager
def wide_plans(spark):
    """Build plans over many columns at a cost linear in them: Spark's self-join check off
    for the session inside the block, put back as it was after (unset if it was unset).

    MLlib's multi-column stages (``StringIndexerModel``, ``ImputerModel``, ``Bucketizer``,
    ``VectorAssembler``) resolve each input with ``dataset(c)``; with the check on, each of
    those scans the plan's output to tag the column, so n columns over a plan of m cost
    n x m: at 10,000 columns minutes of driver time before a row is read. Only plan
    building is affected: a plan built inside runs the same outside. The blocks of a
    process run one at a time (a re-entrant lock: a stage inside a block may open its
    own), so concurrent ones cannot leave the check off. What the block gives up: an
    ambiguous self-join of a frame built inside goes undetected (and so does one another
    thread analyses meanwhile). Where the session refuses the setting, the block runs
    with the check as it is (slow at width, the same result).

    Examples
    --------
    >>> with wide_plans(spark):
    ...     scored = model.transform(rows)   # doctest: +SKIP
    """
    conf = spark.conf
    with _SELF_JOIN_LOCK:
        before = conf.get(SELF_JOIN_CHECK, None)
        try:
            conf.set(SELF_JOIN_CHECK, "false")
        except Exception:  # a session that refuses the setting: plans built as they are
            yield
            return
        try:
            yield
        finally:
            if before is None:
                conf.unset(SELF_JOIN_CHECK)
            else:
                conf.set(SELF_JOIN_CHECK, before)


class WideAssembler(Transformer, HasInputCols, HasOutputCol, HasHandleInvalid, DefaultParamsReadable,
                    ParamsWritable):
    """MLlib's ``VectorAssembler`` (the same vector, ML attributes and ``handleInvalid``),
    at a cost linear in the number of columns.

    MLlib's assembler resolves each input with ``dataset(c)``; with Spark's self-join check
    on, each of those scans the plan's output to tag the column with its position, so
    assembling n columns costs n x n: at 10,000 columns 83 s of driver time before any row
    is read, against 12 s with the check off (``bench/RESULTS.md``). This stage runs MLlib's
    own transform inside :func:`wide_plans` (what that gives up is said there), so a saved
    pipeline assembles fast at width wherever it is loaded.

    Examples
    --------
    >>> df = spark.createDataFrame([(1.0, 2.0)], ["a", "b"])
    >>> WideAssembler(inputCols=["a", "b"], outputCol="v").transform(df).first().v
    DenseVector([1.0, 2.0])
    """

    @keyword_only
    def __init__(self, *, inputCols=None, outputCol=None, handleInvalid="error"):
        super().__init__()
        self._setDefault(handleInvalid="error")
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, inputCols=None, outputCol=None, handleInvalid="error") -> "WideAssembler":
        return self._set(**self._input_kwargs)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        assembler = VectorAssembler(inputCols=self.getInputCols(), outputCol=self.getOutputCol(),
                                    handleInvalid=self.getHandleInvalid())
        with wide_plans(dataset.sparkSession):
            return assembler.transform(dataset)
