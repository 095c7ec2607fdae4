"""The saved model's first stage: rows under the source's column names in, internal names out.

Ingest stores a column whose name Delta or MLlib cannot take (``x.GENE1``, ``Price (USD)``)
under an internal name (``sparkdeep.names``). A fitted pipeline that starts with
:class:`ColumnRenamer` scores both: the ingested tables (internal names, passed through)
and raw rows a user brings with the original names (renamed, in one ``select``: the plan
does not deepen with the number of columns).
"""
from __future__ import annotations

from pyspark import keyword_only
from pyspark.ml import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep.names import ORIGINAL_NAME, quoted


class ColumnRenamer(Transformer, DefaultParamsReadable, DefaultParamsWritable):
    """Rename source columns to internal names; columns already internal pass through.

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

    @keyword_only
    def __init__(self, *, originals=None, internals=None):
        super().__init__()
        self._setDefault(originals=[], internals=[])
        self._set(**self._input_kwargs)
        self._check_lengths()

    @keyword_only
    def setParams(self, *, originals=None, internals=None) -> "ColumnRenamer":
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
        pairs = self.pairs()
        if not pairs:
            return dataset
        present = set(dataset.columns)
        rename = {}
        for orig, internal in pairs:
            if internal in present:
                continue
            if orig not in present:
                raise ValueError(f"ColumnRenamer: the input has neither the column {orig!r} nor its internal name "
                                 f"{internal!r}; the model needs it")
            rename[orig] = internal
        if not rename:
            return dataset
        clash = [internal for internal in rename.values() if internal in present]
        if clash:
            raise ValueError(f"ColumnRenamer: the input already has a column {clash[0]!r}")
        return dataset.select(*[
            F.col(quoted(f.name)).alias(rename[f.name], metadata={**(f.metadata or {}), ORIGINAL_NAME: f.name})
            if f.name in rename else F.col(quoted(f.name))
            for f in dataset.schema.fields])
