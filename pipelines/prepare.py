"""The reduction pipeline: rebalance, encode, impute, assemble, select, scale, project.

One MLlib :class:`~pyspark.ml.Pipeline` whose fitted model is the front half of the
saved scoring pipeline. Fitting it on the training table fits every stage after the
sampler on the rebalanced sample; the fitted model passes every row through the sampler
when it scores. It reads the ingested table's own shape: string columns are categorical,
double columns numeric, ``label`` the label; the task decides rebalancing (classification
only) and the univariate test (ANOVA F for classes, F-regression for a number).
"""
from __future__ import annotations

import logging

from pyspark.ml import PipelineModel
from pyspark.ml.feature import (Bucketizer, OneHotEncoder, StandardScaler,
                                StringIndexer, StringIndexerModel, VectorAssembler)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkdeep import delta_io, names
from sparkdeep.registry import Choices, Columns, Models, Tables
from sparkdeep.transformers.columns import ColumnRenamer, WideAssembler, wide_plans
from sparkdeep.transformers.hashing import HashIndexer
from sparkdeep.transformers.pca import CenteredPCA, CenteredPCAModel
from sparkdeep.transformers.quantiles import MedianImputer, QuantileBinner
from sparkdeep.transformers.sampling import (ClassBalanceSampler, ClassBalanceSamplerModel, SamplingPipeline,
                                             hash_uniform)
from sparkdeep.transformers.selection import (CorrelationSelector, SelectorModel, UnivariateSelector,
                                              VarianceSelector)

log = logging.getLogger(__name__)

LABEL = Columns.LABEL
WEIGHT = Columns.WEIGHT
FEATURES = Columns.FEATURES
#: The assemblers a fitted prepare model may hold (models saved before WideAssembler: MLlib's).
ASSEMBLERS = (WideAssembler, VectorAssembler)


def feature_columns(df: DataFrame, key: str) -> tuple[list[str], list[str]]:
    """(categorical, numeric) of an ingested table: its string and double columns."""
    from pyspark.sql import types as T
    cat = [f.name for f in df.schema.fields if f.name not in (key, LABEL) and isinstance(f.dataType, T.StringType)]
    num = [f.name for f in df.schema.fields if f.name not in (key, LABEL) and isinstance(f.dataType, T.DoubleType)]
    return cat, num


def column_profile(train: DataFrame, categorical, numeric) -> dict:
    """``rows``, and per feature column ``values`` (non-null, non-NaN) plus, for a number,
    its ``min`` and ``max``, over the training rows.

    Counted over Arrow batches (one ``mapInArrow``, one small row per batch): the plan is
    one node whatever the width. Three aggregates per column made a query that grew with
    the columns, and a (column, value) unpivot hit Catalyst's constraint propagation,
    quadratic in the columns (over 14 minutes to plan at 7,000 numeric columns)."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import types as T
    cols = [*categorical, *numeric]
    n_cat = len(categorical)
    out = {"rows": 0, "columns": {c: {"values": 0} for c in cols}}
    for c in numeric:
        out["columns"][c].update(min=None, max=None)
    schema = T.StructType([T.StructField("rows", T.LongType()), T.StructField("n", T.ArrayType(T.LongType())),
                           T.StructField("lo", T.ArrayType(T.DoubleType())),
                           T.StructField("hi", T.ArrayType(T.DoubleType()))])

    def profile(batches):
        rows, n = 0, np.zeros(len(cols), dtype="int64")
        lo = np.full(len(numeric), np.inf)
        hi = np.full(len(numeric), -np.inf)
        for b in batches:
            rows += b.num_rows
            for j in range(n_cat):
                n[j] += b.num_rows - b.column(j).null_count
            for j in range(len(numeric)):
                v = b.column(n_cat + j).to_numpy(zero_copy_only=False).astype("float64", copy=False)
                v = v[~np.isnan(v)]  # nulls arrive as NaN
                n[n_cat + j] += v.size
                if v.size:
                    lo[j], hi[j] = min(lo[j], v.min()), max(hi[j], v.max())
        yield pa.RecordBatch.from_pydict({"rows": [rows], "n": [n.tolist()], "lo": [lo.tolist()], "hi": [hi.tolist()]},
                                         schema=pa.schema([("rows", pa.int64()), ("n", pa.list_(pa.int64())),
                                                           ("lo", pa.list_(pa.float64())),
                                                           ("hi", pa.list_(pa.float64()))]))

    q = names.quoted
    parts = train.selectExpr(*[q(c) for c in cols]).mapInArrow(profile, schema).collect()
    n = np.zeros(len(cols), dtype="int64")
    lo, hi = np.full(len(numeric), np.inf), np.full(len(numeric), -np.inf)
    for p in parts:
        out["rows"] += int(p["rows"])
        n += np.asarray(p["n"], dtype="int64")
        lo, hi = np.minimum(lo, np.asarray(p["lo"])), np.maximum(hi, np.asarray(p["hi"]))
    for j, c in enumerate(cols):
        out["columns"][c]["values"] = int(n[j])
    for j, c in enumerate(numeric):
        if n[n_cat + j]:
            out["columns"][c].update(min=float(lo[j]), max=float(hi[j]))
    return out


def hashed_columns(train: DataFrame, categorical, buckets: int) -> dict[str, int]:
    """``{column: its approximate level count}`` of the categorical columns with more levels
    than ``buckets`` in ``train`` (HyperLogLog++ on the executors, 1% error: the driver
    never sees a level); none when ``buckets`` is 0."""
    if not buckets or not categorical:
        return {}
    q = names.quoted
    row = train.select(*[F.approx_count_distinct(F.col(q(c)), 0.01).alias(f"n{i}")
                         for i, c in enumerate(categorical)]).first()
    return {c: int(row[f"n{i}"]) for i, c in enumerate(categorical) if int(row[f"n{i}"]) > int(buckets)}


def usable_features(profile: dict, categorical, numeric, where: str = "") -> tuple[list[str], list[str], dict]:
    """(categorical, numeric, left_out) for the prepare pipeline from :func:`column_profile`.

    A column null (or NaN) in every training row is an error naming it: no stage can learn
    anything from it (the imputer has no median, the indexer no category). A number with
    one value in every training row is left out, with the reason: it carries nothing, and
    left in it would give the embedding encoding an empty numeric block when every number
    is constant."""
    rows, cols = profile["rows"], profile["columns"]
    empty = [c for c in (*categorical, *numeric) if cols[c]["values"] == 0]
    if empty:
        raise ValueError(f"feature column(s) {empty} are null{' or NaN' if set(empty) & set(numeric) else ''} in "
                         f"every one of the {rows} training rows: nothing to learn from; add them to "
                         f"features.exclude{f' in {where}' if where else ''}")
    left_out = {c: f"one value ({cols[c]['min']!r}) in every non-null training row" for c in numeric
                if cols[c]["min"] == cols[c]["max"]}
    return list(categorical), [c for c in numeric if c not in left_out], left_out


ENCODINGS = Choices.ENCODINGS
#: The embedding layout's standardised numeric block (then the category indices).
NUMERIC = Columns.NUMERIC


def reduction_stages(source: str, last: str, *, label: str, classify: bool, selector_top_fraction: float,
                     max_correlation: float, pca: bool, pca_k: int, pca_variance_target: float) -> list:
    """The selectors on vector column ``source`` (variance, univariate test, correlation
    redundancy), then ``CenteredPCA`` (``pca``) or standardisation, writing ``last``."""
    out = [
        VarianceSelector(featuresCol=source, outputCol="varying", varianceThreshold=0.0),
        UnivariateSelector(featuresCol="varying", outputCol="informative", labelCol=label,
                           featureType="continuous", labelType="categorical" if classify else "continuous",
                           selectionMode="percentile", selectionThreshold=selector_top_fraction),
        CorrelationSelector(featuresCol="informative", outputCol="selected", labelCol=label,
                            maxCorrelation=max_correlation),
    ]
    if pca:
        # pca_k is a maximum: a table with fewer features after selection keeps them all.
        out.append(CenteredPCA(inputCol="selected", outputCol=last, k=pca_k, varianceTarget=pca_variance_target,
                               scale=True, kAtMost=True))
    else:
        # A network needs standardised inputs: raw numbers (a year, a pressure in hPa)
        # next to 0/1 columns stall training (measured: AUC 0.51; bench/RESULTS.md).
        out.append(StandardScaler(inputCol="selected", outputCol=last, withMean=True, withStd=True))
    return out


def build_prepare_pipeline(*, task: str, categorical, numeric, key: str, majority_ratio: float,
                           selector_top_fraction: float, pca_k: int, seed: int, max_correlation: float = 0.95,
                           pca_variance_target: float = 0.9, label: str = LABEL, encoding: str = "onehot",
                           pca: bool = True, numeric_buckets: int = 0,
                           originals: dict[str, str] | None = None, hashed=(),
                           hash_buckets: int = 0) -> SamplingPipeline:
    """``pca_k=0`` lets PCA choose the smallest k reaching ``pca_variance_target``.
    ``majority_ratio=0`` keeps every row (no class-balance sampler). The sampler decides membership by the row ``key`` alone, so a column added to the source
    later does not change the sample.

    ``originals`` (``{internal name: source name}``, :func:`sparkdeep.names.originals` of the
    table) starts the pipeline with a :class:`ColumnRenamer`, so the fitted model also scores
    rows under the source's column names.

    ``encoding='onehot'``: categories one-hot, assembled with the imputed numbers, the
    selectors on the whole vector, then PCA (``pca``) or standardisation: ``features`` is
    dense.

    ``encoding='embedding'`` (for the tabular network): the selectors (and ``pca``) act on
    the numeric block only, which is then standardised; ``features`` is ``[numbers...,
    one category index per categorical column]`` for the network's embedding layers. An
    unseen or null category gets index = its column's number of values (StringIndexer's
    ``'keep'`` bucket). ``numeric_buckets > 0`` adds, per numeric column, its quantile bin
    (``QuantileBinner``: MLlib's ``QuantileDiscretizer`` in one pass) as one more index for an embedding: a step function of each
    number the network can learn directly, as trees do. :func:`embedding_layout` reads the
    layout back from the fitted model.

    ``hashed`` (embedding only): categorical columns indexed by :class:`HashIndexer` into
    ``hash_buckets`` buckets (no vocabulary) instead of ``StringIndexer``.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    categorical, numeric, hashed = list(categorical), list(numeric), set(hashed)
    if hashed and (encoding != "embedding" or not hash_buckets or not hashed <= set(categorical)):
        raise ValueError(f"hashed columns need encoding='embedding', hash_buckets > 0 and categorical columns; got "
                         f"encoding={encoding!r}, hash_buckets={hash_buckets!r}, hashed={sorted(hashed)}")
    if not categorical and not numeric:
        raise ValueError("no feature columns: the prepare pipeline needs at least one categorical or numeric column")
    idx = [f"{c}__idx" for c in categorical]
    ohe = [f"{c}__ohe" for c in categorical]
    imp = [f"{c}__imp" for c in numeric]
    classify = task != "regression"
    stages = []
    if originals or categorical:
        # First stage: rows a user brings under the source's names (and types: a boolean
        # category) become what ingest wrote; the ingested tables pass through.
        originals = dict(originals or {})
        stages.append(ColumnRenamer(originals=list(originals.values()), internals=list(originals),
                                    optionalCols=[key], stringCols=list(categorical)))
    if classify and majority_ratio:  # 0: no rebalancing, every row with weight 1
        stages.append(ClassBalanceSampler(labelCol=label, weightCol=WEIGHT, majorityRatio=majority_ratio,
                                          seed=seed, keyCols=[key]))
    if categorical:
        vocab = [(c, i) for c, i in zip(categorical, idx) if c not in hashed]
        if vocab:
            # 'keep': unseen categories and nulls get their own index instead of failing scoring.
            stages.append(StringIndexer(inputCols=[c for c, _ in vocab], outputCols=[i for _, i in vocab],
                                        handleInvalid="keep", stringOrderType="frequencyDesc"))
        if hashed:
            pairs = [(c, i) for c, i in zip(categorical, idx) if c in hashed]
            stages.append(HashIndexer(inputCols=[c for c, _ in pairs], outputCols=[i for _, i in pairs],
                                      numBuckets=int(hash_buckets)))
        if encoding == "onehot":
            stages.append(OneHotEncoder(inputCols=idx, outputCols=ohe, dropLast=True))
    if numeric:
        # MLlib's ImputerModel, fitted in one pass over every column (transformers/quantiles).
        stages.append(MedianImputer(inputCols=numeric, outputCols=imp))

    def reduce(source: str, last: str) -> list:
        return reduction_stages(source, last, label=label, classify=classify,
                                selector_top_fraction=selector_top_fraction, max_correlation=max_correlation,
                                pca=pca, pca_k=pca_k, pca_variance_target=pca_variance_target)

    if encoding == "onehot":
        stages.append(WideAssembler(inputCols=imp + ohe, outputCol="assembled", handleInvalid="error"))
        stages += reduce("assembled", FEATURES)
        return SamplingPipeline(stages=stages)
    inputs = []
    if numeric:
        stages.append(WideAssembler(inputCols=imp, outputCol="numeric", handleInvalid="error"))
        stages += reduce("numeric", NUMERIC)
        inputs.append(NUMERIC)
    bins = []
    if numeric and numeric_buckets:
        bins = [f"{c}__bin" for c in numeric]
        stages.append(QuantileBinner(inputCols=imp, outputCols=bins, numBuckets=int(numeric_buckets),
                                     handleInvalid="keep"))
    stages.append(WideAssembler(inputCols=inputs + idx + bins, outputCol=FEATURES, handleInvalid="error"))
    return SamplingPipeline(stages=stages)


def drop_rare_levels(model: PipelineModel, train: DataFrame, min_count: int) -> tuple[PipelineModel, dict]:
    """``model`` with each fitted ``StringIndexerModel`` keeping only the levels seen at least
    ``min_count`` times in the rows it was fitted on (``train``, sampled as the fit sampled
    it); the rarer ones then share the unseen/null index (``handleInvalid='keep'``), so an ID
    seen once gets no embedding row of its own. Its labels are in ``frequencyDesc`` order,
    so the kept ones are a prefix: one grouped count of (column, value) pairs, whatever the
    width, gives each column's prefix length. For the embedding encoding, where nothing
    after the indexer was fitted on its indices. Returns the model and {column: levels dropped}."""
    if min_count <= 1:
        return model, {}
    indexers = [(i, s) for i, s in enumerate(model.stages) if isinstance(s, StringIndexerModel)]
    if not indexers:
        return model, {}
    sampler = sampler_of(model)
    rows = sampler.sample(train) if sampler is not None else train
    stages, dropped = list(model.stages), {}
    for at, stage in indexers:
        cols = list(stage.getInputCols())
        pairs = ", ".join(f"named_struct('i', {i}, 'v', CAST({names.quoted(c)} AS STRING))" for i, c in enumerate(cols))
        kept = {int(r["i"]): int(r["count"]) for r in
                rows.selectExpr(f"explode(array({pairs})) AS p").select("p.i", "p.v").where("v IS NOT NULL")
                .groupBy("i", "v").count().where(F.col("count") >= int(min_count)).groupBy("i").count().collect()}
        sizes = [len(ls) for ls in stage.labelsArray]
        dropped.update({c: n - kept.get(i, 0) for i, (c, n) in enumerate(zip(cols, sizes)) if kept.get(i, 0) < n})
        stages[at] = _label_prefixes(stage, [kept.get(i, 0) for i in range(len(cols))])
    return PipelineModel(stages), dropped


def _label_prefixes(stage: StringIndexerModel, lengths: list[int]) -> StringIndexerModel:
    """A copy of ``stage`` keeping the first ``lengths[i]`` labels of column ``i``. Built on
    the JVM from the fitted labels (a few calls a column, whatever its level count): PySpark's
    ``from_arrays_of_labels`` pads columns of unequal lengths to one (its unseen index is then
    the longest column's count) and sends every label over Py4J one call each."""
    from pyspark.core.context import SparkContext
    sc = SparkContext._active_spark_context
    jvm = sc._jvm
    fitted = stage._java_obj.labelsArray()
    arrays = jvm.java.lang.reflect.Array.newInstance(jvm.java.lang.Class.forName("[Ljava.lang.String;"), len(lengths))
    for i, n in enumerate(lengths):
        prefix = sc._gateway.new_array(jvm.java.lang.String, int(n))
        jvm.java.lang.System.arraycopy(fitted[i], 0, prefix, 0, int(n))
        jvm.java.lang.reflect.Array.set(arrays, i, prefix)
    return _jvm_indexer(arrays, stage.getInputCols(), stage.getOutputCols(), stage.getHandleInvalid())


def _jvm_indexer(arrays, inputs, outputs, handle_invalid: str) -> StringIndexerModel:
    """A ``StringIndexerModel`` over a JVM ``String[][]`` of labels (one array per column)."""
    model = StringIndexerModel._create_from_java_class("org.apache.spark.ml.feature.StringIndexerModel", arrays)
    model.setInputCols(list(inputs))
    model.setOutputCols(list(outputs))
    model.setHandleInvalid(handle_invalid)
    return model


def top_levels_indexer(rows: DataFrame, inputs, outputs, k: int) -> StringIndexerModel:
    """A ``StringIndexerModel`` (``handleInvalid='keep'``) knowing each of ``inputs``' ``k``
    most frequent levels in ``rows`` (ties by value), most frequent first as
    ``frequencyDesc`` numbers them; the rest share the unseen/null index. Counted on the
    executors (one grouped count of (column, value) pairs, whatever the width): at most ``k``
    levels of a column reach the driver, whatever its level count."""
    from pyspark.core.context import SparkContext
    from pyspark.sql import Window
    inputs = list(inputs)
    pairs = ", ".join(f"named_struct('i', {i}, 'v', CAST({names.quoted(c)} AS STRING))" for i, c in enumerate(inputs))
    counted = (rows.selectExpr(f"explode(array({pairs})) AS p").select("p.i", "p.v").where("v IS NOT NULL")
               .groupBy("i", "v").count())
    order = Window.partitionBy("i").orderBy(F.desc("count"), F.asc("v"))
    top = counted.withColumn("r", F.row_number().over(order)).where(F.col("r") <= int(k)).select("i", "r", "v")
    labels: list[list[str]] = [[] for _ in inputs]
    for row in sorted(top.collect(), key=lambda r: (r["i"], r["r"])):
        labels[int(row["i"])].append(row["v"])
    sc = SparkContext._active_spark_context
    jvm = sc._jvm
    arrays = jvm.java.lang.reflect.Array.newInstance(jvm.java.lang.Class.forName("[Ljava.lang.String;"), len(inputs))
    for i, ls in enumerate(labels):
        column = sc._gateway.new_array(jvm.java.lang.String, len(ls))
        for j, v in enumerate(ls):
            column[j] = v
        jvm.java.lang.reflect.Array.set(arrays, i, column)
    return _jvm_indexer(arrays, inputs, outputs, "keep")


def embedding_layout(model: PipelineModel) -> dict | None:
    """The network's input layout of a fitted embedding-encoded prepare model (None for a
    one-hot one): ``categorical`` (column names), ``cardinalities`` (values + 1 for the
    unseen/null bucket, per column); :func:`network_layout` adds ``numeric_dim``."""
    assembler = next((s for s in model.stages if isinstance(s, ASSEMBLERS) and s.getOutputCol() == FEATURES),
                     None)
    if assembler is None:
        return None
    cards = {}
    for stage in model.stages:
        if isinstance(stage, StringIndexerModel):
            for col, out, labels in zip(stage.getInputCols(), stage.getOutputCols(), stage.labelsArray):
                cards[out] = (col, len(labels) + 1)
        elif isinstance(stage, HashIndexer):  # the buckets, then the null's index
            for col, out in zip(stage.getInputCols(), stage.getOutputCols()):
                cards[out] = (col, stage.getNumBuckets() + 1)
        elif isinstance(stage, Bucketizer) and stage.isSet("splitsArray"):
            # Quantile bins of the imputed numbers (+1: 'keep' puts NaN in a bucket of its own).
            for col, out, splits in zip(stage.getInputCols(), stage.getOutputCols(), stage.getSplitsArray()):
                cards[out] = (f"{col.removesuffix('__imp')} (bins)", len(splits))
    used = [c for c in assembler.getInputCols() if c in cards]
    return {"categorical": [cards[c][0] for c in used], "cardinalities": [cards[c][1] for c in used]}


def network_layout(model: PipelineModel, prepared: DataFrame) -> dict | None:
    """:func:`embedding_layout` with ``numeric_dim`` read from the width of ``prepared``'s
    feature vectors (None for a one-hot prepare model: the plain MLP)."""
    layout = embedding_layout(model)
    if layout is None:
        return None
    first = prepared.select(FEATURES).first()
    if first is None:
        raise ValueError("the prepared training table is empty: nothing to train on")
    layout["numeric_dim"] = len(first[0]) - len(layout["cardinalities"])
    return layout


def sampler_of(model: PipelineModel) -> ClassBalanceSamplerModel | None:
    """The fitted class-balance sampler (None when not rebalanced: regression, or majority_ratio 0)."""
    for stage in model.stages:
        if isinstance(stage, ClassBalanceSamplerModel):
            return stage
    return None


def prepared_training_data(model: PipelineModel, train: DataFrame, key: str) -> DataFrame:
    """The rebalanced, weighted training sample run through the fitted feature stages
    (regression: every row, weight 1)."""
    sampler = sampler_of(model)
    if sampler is None:
        return model.transform(train.withColumn(WEIGHT, F.lit(1.0))).select(key, FEATURES, LABEL, WEIGHT)
    rest = PipelineModel([s for s in model.stages if s is not sampler])
    return rest.transform(sampler.sample(train)).select(key, FEATURES, LABEL, WEIGHT)


def split_train_holdout(table: DataFrame, holdout_fraction: float, seed: int,
                        key: str) -> tuple[DataFrame, DataFrame]:
    """A deterministic split by a hash of the key: the same rows whatever the partitioning."""
    u = hash_uniform(F.xxhash64(F.lit(seed + 1), F.col(key)))
    return table.where(u >= holdout_fraction), table.where(u < holdout_fraction)


def prepare_report(model: PipelineModel, rows_train: int | None = None,
                   originals: dict[str, str] | None = None) -> dict:
    """What the reduction did: class counts, features kept by each selector (by name, the
    source's names where ingest renamed a column: ``originals``), PCA's explained variance."""
    originals = originals or {}
    sampler = sampler_of(model)
    summary = sampler.summary if sampler is not None else {
        "stage": None, "rows_in": rows_train, "rows_out": rows_train, "note": "not rebalanced (regression, or prepare.majority_ratio 0)"}
    out: dict = {"sampler": summary, "selection": []}
    for stage in model.stages:
        if isinstance(stage, SelectorModel):
            summary = stage.summary
            scores = stage.featureScores
            summary["scores"] = {names.display(n, originals): scores[n] for n in summary["selected_names"]}
            summary["selected_names"] = names.display_all(summary["selected_names"], originals)
            out["selection"].append(summary)
        if isinstance(stage, CenteredPCAModel):
            out["pca"] = stage.summary
    if out["selection"]:
        out["selected_features"] = out["selection"][-1]["selected_names"]
    if "pca" in out:
        out["pca_k"] = out["pca"]["k"]
        out["pca_explained_variance"] = out["pca"]["explained_variance"]
        out["pca_explained_variance_total"] = out["pca"]["explained_variance_total"]
    return out


# -- the step (jobs/prepare.py runs it) ----------------------------------------

#: How many per-column lines the console shows (the report has them all).
LISTED = 20


def prepare_step(spark, cfg, paths, run) -> dict:
    spec = cfg.dataset
    key = spec.key_column
    table = run.read(spark, spec.table)
    categorical, numeric = feature_columns(table, key)
    originals = names.originals(table.schema)  # {internal: source name} of renamed columns
    shown = {c: originals.get(c, c) for c in table.columns}  # every column, for names.display
    train, holdout = split_train_holdout(table, cfg.prepare.holdout_fraction, cfg.seed, key)
    # Before any write or fit: an empty split, or a column no stage can learn from, is named
    # here, not minutes later deep in a fit or in evaluate.
    profile = column_profile(train, categorical, numeric)
    for part, empty in ((Tables.HOLDOUT, holdout.limit(1).count() == 0), ("training split", profile["rows"] == 0)):
        if empty:
            raise ValueError(f"the {part} is empty: {table.count()} usable rows in {spec.table!r} and "
                             f"prepare.holdout_fraction {cfg.prepare.holdout_fraction}; use more rows (is "
                             f"data.sample_fraction {cfg.data.sample_fraction} too small for this table?) or "
                             "another holdout_fraction")
    categorical, numeric, left_out = usable_features(profile, categorical, numeric, where=spec.file)
    for c, why in list(left_out.items())[:LISTED]:
        log.info("[prepare] left out %r: %s", names.display(c, shown), why)
    if len(left_out) > LISTED:
        log.info("[prepare] ... and %s more columns left out (all in the prepare report)", len(left_out) - LISTED)
    if not categorical and not numeric:
        raise ValueError(f"no usable feature column in {spec.table!r}: every one is left out ({left_out})")
    train_ref = run.write(train, Tables.TRAIN)
    holdout_ref = run.write(holdout, Tables.HOLDOUT)
    train = delta_io.read(spark, train_ref.path, train_ref.version).cache()
    hashed = hashed_columns(train, categorical, cfg.prepare.hash_buckets)
    for c, n in sorted(hashed.items(), key=lambda kv: -kv[1])[:LISTED]:
        log.info("[prepare] %r: about %d levels, hashed into prepare.hash_buckets=%d buckets (no vocabulary)",
                 names.display(c, shown), n, cfg.prepare.hash_buckets)

    pipeline = build_prepare_pipeline(
        task=spec.task, categorical=categorical, numeric=numeric, key=key,
        majority_ratio=cfg.prepare.majority_ratio,
        selector_top_fraction=cfg.prepare.selector_top_fraction,
        max_correlation=cfg.prepare.max_correlation, pca_k=cfg.prepare.pca_k,
        pca_variance_target=cfg.prepare.pca_variance_target, seed=cfg.seed,
        encoding=cfg.prepare.encoding, pca=cfg.prepare.pca, numeric_buckets=cfg.prepare.numeric_buckets,
        originals=originals, hashed=list(hashed), hash_buckets=cfg.prepare.hash_buckets)
    with wide_plans(spark):  # MLlib's per-column stages plan in linear time at width
        model = pipeline.fit(train)
        model, rare = drop_rare_levels(model, train, cfg.prepare.min_category_count)
        prepared = prepared_training_data(model, train, key)
    for c, n in sorted(rare.items(), key=lambda kv: -kv[1])[:LISTED]:
        log.info("[prepare] %r: %d levels seen fewer than prepare.min_category_count=%d times share the "
                 "unseen/null index", names.display(c, shown), n, cfg.prepare.min_category_count)
    run.save_model(model, Models.PREPARE)
    prepared_ref = run.write(prepared.repartition(4), Tables.TRAIN_PREPARED)
    rows_train = profile["rows"] if sampler_of(model) is None else None
    train.unpersist()

    report = prepare_report(model, rows_train, shown)
    s = report["sampler"]
    report.update({
        "rare_levels_shared": rare,
        "hashed_columns": {shown.get(c, c): n for c, n in hashed.items()},
        "rows_train": s["rows_in"], "rows_train_prepared": s["rows_out"],
        "rows_holdout": delta_io.read(spark, holdout_ref.path, holdout_ref.version).count(),
        "dataset": spec.name, "task": spec.task,
        "tables": {spec.table: run.inputs[spec.table],
                   Tables.TRAIN: train_ref.as_dict(), Tables.HOLDOUT: holdout_ref.as_dict(),
                   Tables.TRAIN_PREPARED: prepared_ref.as_dict()},
    })
    how = "after rebalancing" if s.get("stage") else "(not rebalanced)"
    log.info("[prepare] train %s rows -> %s %s; holdout %s", s['rows_in'], s['rows_out'], how, report['rows_holdout'])
    for sel in report["selection"]:
        kept = sel["selected_names"]
        log.info("[prepare] %s: %s -> %s features (%s%s)",
                 sel['stage'], sel['input_features'], sel['selected'], ', '.join(kept[:8]),
                 ', ...' if len(kept) > 8 else '')
    report["encoding"] = cfg.prepare.encoding
    report["left_out"] = {names.display(c, shown): why for c, why in left_out.items()}
    layout = embedding_layout(model)
    if layout:
        report["embedding_layout"] = _embedding_layout(layout, shown)
    if "pca_k" in report:
        total = report["pca_explained_variance_total"]
        log.info("[prepare] CenteredPCA k=%s explains %s of the variance: %s",
                 report['pca_k'], total, report.get('pca_explained_variance'))
        target = cfg.prepare.pca_variance_target
        if total is not None and total < target:
            report["warnings"] = [f"PCA keeps {total:.3f} of the variance, below prepare.pca_variance_target "
                                  f"{target}: raise prepare.pca_k (0 = the smallest k reaching the target) or "
                                  "turn PCA off (prepare.pca=false); bench/RESULTS.md has what it cost here"]
            log.warning("[prepare] %s", report['warnings'][0])
    return report


def _embedding_layout(layout: dict, shown: dict) -> dict:
    """The layout under the source's names, printed with at most LISTED columns."""
    labels = names.display_all(layout["categorical"], shown)
    bins = sum(c.endswith(" (bins)") for c in layout["categorical"])
    pairs = ", ".join(f"{c} {n}" for c, n in zip(labels[:LISTED], layout["cardinalities"][:LISTED]))
    log.info("[prepare] embeddings for %s categorical columns and %s numbers' quantile bins; "
             "indices (values + 1 for unseen/null): %s%s", len(labels) - bins, bins, pairs,
             f", ... ({len(labels) - LISTED} more, in the prepare report)" if len(labels) > LISTED else "")
    return {**layout, "categorical": labels}
