"""Wide tables: hundreds of columns with the names exported data has, through every step.

A CSV of a few hundred rows and 1,000 generated columns (numbers and categories, nulls,
names with dots, spaces, parentheses, ``=`` and non-ASCII letters) runs ingest, prepare,
train (Horovod ranks), score and evaluate; the source's names come back in the reports,
and the saved pipeline, loaded in a new process, scores the raw CSV rows under their
source names exactly as the score step did. The plan tests run without the slow mark:
ingest's and prepare's plans must not deepen with the column count.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from sparkdeep import delta_io, names
from sparkdeep.jobs._common import run_step
from sparkdeep.paths import Paths

from .test_datasets import REPO, config, write_spec
from tests import _other_process

ROWS, NUMERIC, CATEGORICAL = 320, 700, 300


def wide_frame(rows: int, numeric: int, categorical: int, seed: int = 3):
    """A pandas frame with a key ``row id``, a binary label ``y (target)`` driven by a few
    columns, ``numeric`` numbers and ``categorical`` strings, 5% nulls, odd names."""
    import pandas as pd
    rng = np.random.default_rng(seed)
    styles = ["x.GENE{}", "weight kg {}", "Price (USD) {}", "größe_{}", "a=b{}", "plain_{}"]
    cols = {"row id": np.arange(rows, dtype="int64")}
    num_names = [styles[i % len(styles)].format(i) for i in range(numeric)]
    cat_names = [f"cat.{i} (code)" if i % 2 else f"Kategorie é{i}" for i in range(categorical)]
    x = rng.normal(size=(rows, numeric))
    for j, n in enumerate(num_names):
        v = x[:, j].copy()
        v[rng.random(rows) < 0.05] = np.nan
        cols[n] = v
    for j, n in enumerate(cat_names):
        v = rng.choice(["a", "b", "c", "d"], size=rows).astype(object)
        v[rng.random(rows) < 0.05] = None
        cols[n] = v
    z = 1.5 * x[:, 0] - x[:, 1] + (np.asarray(cols[cat_names[0]]) == "a") + rng.normal(scale=0.3, size=rows)
    cols["y (target)"] = np.where(z > 0, 1, 0)
    return pd.DataFrame(cols), num_names, cat_names


def ddl(pdf) -> str:
    def kind(c):
        return {"i": "BIGINT", "f": "DOUBLE"}.get(pdf[c].dtype.kind, "STRING")
    return ", ".join(f"{names.quoted(c)} {kind(c)}" for c in pdf.columns)


def _depth(plan: str) -> int:
    """How deep parentheses nest in a plan's text: an expression nested once per column
    (``coalesce(coalesce(...))``) shows as a depth that grows with the columns."""
    deepest = level = 0
    for ch in plan:
        if ch == "(":
            level += 1
            deepest = max(deepest, level)
        elif ch == ")":
            level -= 1
    return deepest


def _ingest_plan(spark, tmp_path, numeric: int):
    from sparkdeep.pipelines import ingest as ing
    pdf, _, _ = wide_frame(40, numeric, 10)
    path = tmp_path / f"w{numeric}.csv"
    pdf.to_csv(path, index=False)
    spec_path = write_spec(tmp_path, f"w{numeric}", {
        "source": {"format": "csv", "path": str(path)}, "schema": ddl(pdf), "key": "row id",
        "label": {"column": "y (target)", "task": "binary"}, "filter": "`weight kg 1` > -10"})
    cfg = config(spec_path, tmp_path / f"o{numeric}")
    spec = cfg.dataset
    source = ing.read_source(spark, spec, None)
    cat, num, _ = ing.resolve_features(spec, source)
    plan = ing.label_plan(spec, source, ing.F.col(ing.CORRUPT).isNull())
    df = ing.classify_rows(spec, source, cat, num, plan, renamed=ing.internal_names(spec, cat, num))
    return df._jdf.queryExecution().analyzed().toString(), df


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_ingests_plan_does_not_deepen_with_the_column_count(spark, tmp_path):
    narrow, _ = _ingest_plan(spark, tmp_path, 20)
    wide, df = _ingest_plan(spark, tmp_path, 400)
    assert _depth(wide) == _depth(narrow), (_depth(narrow), _depth(wide))
    assert _depth(wide) < 40
    # Internal names, with each source name in the column's metadata.
    assert "x_GENE0" in df.columns and "weight_kg_1" in df.columns and "größe_3" in df.columns
    assert names.originals(df.schema)["Price_USD_2"] == "Price (USD) 2"


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_prepares_plan_does_not_deepen_with_the_column_count(spark):
    from sparkdeep.pipelines import prepare as prep

    def plan(numeric: int, categorical: int):
        pdf, num, cat = wide_frame(60, numeric, categorical)
        pdf = pdf.rename(columns=names.internal_name).rename(columns={"y_target_": "label", "row_id": "id"})
        df = spark.createDataFrame(pdf.astype({c: "float64" for c in pdf.columns if pdf[c].dtype.kind == "f"}))
        c_, n_ = prep.feature_columns(df, "id")
        model = prep.build_prepare_pipeline(task="binary", categorical=c_, numeric=n_, key="id", majority_ratio=0,
                                            selector_top_fraction=1.0, pca_k=0, seed=1, pca=False,
                                            encoding="embedding", numeric_buckets=4).fit(df)
        out = model.transform(df)
        text = out._jdf.queryExecution().analyzed().toString()
        return text, len(out._jdf.queryExecution().analyzed().treeString().splitlines())

    (narrow, n_ops), (wide, w_ops) = plan(10, 5), plan(200, 60)
    assert w_ops == n_ops, (n_ops, w_ops)  # one operator per stage, whatever the width
    assert _depth(wide) <= _depth(narrow) + 2, (_depth(narrow), _depth(wide))


def test_two_names_meeting_after_mapping_are_an_error_naming_both():
    with pytest.raises(names.NameCollision, match=r"'a\.b' and 'a_b'.*'a_b'"):
        names.mapping(["a.b", "a_b"])
    with pytest.raises(names.NameCollision, match=r"'A b' and 'a_b'"):
        names.mapping(["A b", "a_b"])
    assert names.mapping(["ok", "x.y", "p (q)", "ä"]) == {"x.y": "x_y", "p (q)": "p_q_"}
    assert names.display("x_y__imp", {"x_y": "x.y"}) == "x.y__imp"
    assert names.display("p_q_ (bins)", {"p_q_": "p (q)"}) == "p (q) (bins)"


def test_the_renamer_takes_source_or_internal_names_and_round_trips(spark, tmp_path):
    from pyspark.ml import PipelineModel

    from sparkdeep import model_store
    from sparkdeep.transformers.columns import ColumnRenamer
    r = ColumnRenamer(originals=["x.a", "p (q)"], internals=["x_a", "p_q_"])
    raw = spark.createDataFrame([(1.0, 2.0, 3)], ["x.a", "p (q)", "other"])
    assert r.transform(raw).columns == ["x_a", "p_q_", "other"]
    done = spark.createDataFrame([(1.0, 2.0)], ["x_a", "p_q_"])
    assert r.transform(done).columns == ["x_a", "p_q_"]
    with pytest.raises(ValueError, match=r"neither the column 'p \(q\)' nor its internal name 'p_q_'"):
        r.transform(spark.createDataFrame([(1.0,)], ["x.a"]))
    PipelineModel([r]).save(str(tmp_path / "m"))
    back = model_store.load_pipeline(spark, str(tmp_path / "m"))
    assert back.transform(raw).columns == ["x_a", "p_q_", "other"]


# -- the whole pipeline, 1,000 columns -------------------------------------------------------------

@pytest.fixture(scope="module")
def wide_run(spark, tmp_path_factory):
    from sparkdeep.jobs import evaluate, ingest, prepare, score, train
    tmp = tmp_path_factory.mktemp("wide")
    pdf, num, cat = wide_frame(ROWS, NUMERIC, CATEGORICAL)
    csv = tmp / "wide.csv"
    pdf.to_csv(csv, index=False)
    spec = write_spec(tmp, "wide", {"source": {"format": "csv", "path": str(csv)}, "schema": ddl(pdf),
                                    "key": "row id", "label": {"column": "y (target)", "task": "binary"}})
    # Two baselines (a linear model and trees over 1,000 columns): random forest and XGBoost
    # add time, not another path through the wide table.
    cfg = config(spec, tmp / "out", "train.epochs=2", "train.batch_size=32", "baselines.trees=5",
                 "baselines.depth=3", "baselines.models=[logistic_regression, gbt]")
    paths = Paths.under(cfg.output_dir)
    reports = {}
    for name, mod in (("ingest", ingest), ("prepare", prepare), ("train", train), ("score", score),
                      ("evaluate", evaluate)):
        reports[name] = run_step(name, mod.step, spark, cfg, paths)
    return {"cfg": cfg, "paths": paths, "reports": reports, "pdf": pdf, "num": num, "cat": cat, "csv": str(csv),
            "spec": spec, "tmp": tmp}


@pytest.mark.slow
def test_a_wide_table_runs_every_step_and_reports_the_source_names(spark, wide_run):
    r = wide_run["reports"]
    ing = r["ingest"]
    assert ing["accounted"] and ing["rows_usable"] == ROWS
    assert len(ing["features"]["numeric"]) == NUMERIC and len(ing["features"]["categorical"]) == CATEGORICAL
    renamed = ing["renamed_columns"]
    assert renamed["row id"] == "row_id" and renamed["x.GENE0"] == "x_GENE0" and "größe_3" not in renamed
    assert renamed["Price (USD) 2"] == "Price_USD_2"
    assert r["score"]["rows_out_predictions"] == r["prepare"]["rows_holdout"]
    # The report names features by their source names, and stays small at this width.
    html = open(wide_run["paths"].report("evaluate", "html"), encoding="utf-8").read()
    assert len(html) < 3_000_000
    features = html[html.index("<h2>Features</h2>"):]
    features = features[:features.index("</table>")]
    assert "x.GENE0" in features and "x_GENE0__" not in features and "more)" in features
    assert len(features) < 20_000  # lists are cut to their first names, whatever the width
    layout = r["prepare"]["embedding_layout"]["categorical"]
    assert all(" " in c or "é" in c for c in layout if not c.endswith("(bins)"))
    chosen = r["prepare"].get("selected_features") or []
    assert not any(c.startswith("x_GENE") for c in chosen)


@pytest.mark.slow
def test_the_saved_pipeline_scores_raw_rows_with_source_names_in_a_new_process(spark, wide_run, tmp_path):
    """Load the promoted pipeline in a fresh interpreter, score the raw CSV rows (source
    names, label column dropped) and compare with the score step's predictions."""
    paths = wide_run["paths"]
    model_path = paths.model("pipeline", None)
    out = tmp_path / "rescored.parquet"
    code = f"""
import json, sys
from sparkdeep.config import SparkConfig
from sparkdeep.session import builder
from sparkdeep import model_store
from sparkdeep.pipelines import ingest as ing
spark = builder(SparkConfig(master="local[2]", app_name="wide-rescore", settings={{"spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4"}})).getOrCreate()
from pyspark.sql import types as T
raw = spark.read.option("header", "true").schema(T._parse_datatype_string({_ddl_of(wide_run)!r})).csv({wide_run["csv"]!r})
raw = raw.drop("y (target)")
model = model_store.load_pipeline(spark, {model_path!r})
scored = model.transform(raw).select("row_id", "prediction", "probability")
from pyspark.ml.functions import vector_to_array
scored.select("row_id", "prediction", vector_to_array("probability")[1].alias("p1")).write.parquet({str(out)!r})
spark.stop()
"""
    proc = _other_process.run(code, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rescored = spark.read.parquet(str(out)).toPandas().set_index("row_id")
    preds = delta_io.read(spark, paths.table("predictions")).toPandas()
    assert "row id" in preds.columns and "row_id" not in preds.columns  # the key under its source name
    preds = preds.set_index("row id")
    common = preds.index.intersection(rescored.index)
    assert len(common) == len(preds)
    assert (rescored.loc[common, "prediction"].to_numpy() == preds.loc[common, "prediction"].to_numpy()).all()
    np.testing.assert_allclose(rescored.loc[common, "p1"].to_numpy(), preds.loc[common, "probability"].to_numpy(),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_the_export_scores_the_raw_rows_without_spark_as_the_score_step_did(spark, wide_run, tmp_path):
    """1,000 raw inputs under their source names (dots, spaces, ``=``, non-ASCII): the
    exported Keras model, loaded in safe mode, gives the score step's probabilities."""
    from sparkdeep import model_store
    from sparkdeep.pipelines.export import export_pipeline, load_export, raw_schema_of
    paths = wide_run["paths"]
    holdout = delta_io.read(spark, paths.table("holdout"))
    export_pipeline(model_store.load_pipeline(spark, paths.model("pipeline", None)), str(tmp_path / "export"),
                    raw_schema=raw_schema_of(holdout.schema))
    exported = load_export(str(tmp_path / "export"))
    names_in = [e["name"] for e in exported.schema["inputs"]]
    assert "x.GENE0" in names_in and "a=b4" in names_in and "größe_3" in names_in and "y (target)" not in names_in
    preds = delta_io.read(spark, wide_run["paths"].table("predictions")).toPandas().set_index("row id")
    rows = wide_run["pdf"].set_index("row id").loc[preds.index].reset_index().drop(columns=["y (target)"])
    p1 = exported.predict(rows)
    np.testing.assert_allclose(p1, preds["probability"].to_numpy(), rtol=1e-5, atol=1e-6)


def _ddl_of(run) -> str:
    return ddl(run["pdf"])


# -- found by review: names at the edges ---------------------------------------------------------

def test_a_derived_name_is_read_by_the_longest_known_column():
    shown = {"a_b": "a b", "a_b__c": "a.b__c", "a_b__d": "a_b__d"}
    assert names.display("a_b__c__imp", shown) == "a.b__c__imp"
    assert names.display("a_b__d__imp", shown) == "a_b__d__imp"  # a safe column, not 'a b' + suffix
    assert names.display("a_b__c (bins)", shown) == "a.b__c (bins)"
    assert names.display("a_b__imp", shown) == "a b__imp"


def test_the_renamer_casts_categories_as_ingest_did_and_needs_no_key(spark):
    from sparkdeep.transformers.columns import ColumnRenamer
    r = ColumnRenamer(originals=["row id", "is ok?"], internals=["row_id", "is_ok_"], optionalCols=["row_id"],
                      stringCols=["is_ok_"])
    out = r.transform(spark.createDataFrame([(True, 1.0), (False, 2.0)], ["is ok?", "x"]))
    assert out.columns == ["is_ok_", "x"]
    assert [row[0] for row in out.collect()] == ["true", "false"]
    assert dict(out.dtypes)["is_ok_"] == "string"


@pytest.mark.parametrize("header, key, match", [
    ("sample weight,z,y", "sample weight", r"'sample weight' becomes the internal name 'sample_weight', a name the "
                                           r"pipeline uses itself"),
    ("row id,z,y", "", r"source column 'row id' \(internal name 'row_id'\) takes the name of the row id ingest "
                       r"derives.*set key: 'row id'"),
    ("ROW_ID,z,y", "", r"source column 'ROW_ID' .* takes the name of the row id"),
])
def test_a_key_that_meets_a_pipeline_name_is_named_before_writing(spark, tmp_path, header, key, match):
    from sparkdeep.pipelines.ingest import SourceError

    from .test_datasets import run_ingest
    cols = header.split(",")
    csv = tmp_path / "k.csv"
    csv.write_text(header + "\n" + "\n".join(f"{i},{i * 0.5},{i % 2}" for i in range(20)) + "\n")
    spec = write_spec(tmp_path, "k", {"source": {"format": "csv", "path": str(csv)},
                                      "schema": f"{names.quoted(cols[0])} BIGINT, z DOUBLE, y INT", "key": key,
                                      "label": {"column": "y", "task": "binary"}})
    with pytest.raises(SourceError, match=match):
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "tables" / "k")


def test_a_filter_naming_a_dotted_column_without_backticks_says_to_quote_it(spark, tmp_path):
    from sparkdeep.pipelines.ingest import SourceError

    from .test_datasets import run_ingest
    csv = tmp_path / "f.csv"
    csv.write_text("id,g.GENE1,y\n" + "\n".join(f"{i},{i * 0.5},{i % 2}" for i in range(20)) + "\n")
    spec = write_spec(tmp_path, "f", {"source": {"format": "csv", "path": str(csv)},
                                      "schema": "id BIGINT, `g.GENE1` DOUBLE, y INT", "key": "id",
                                      "label": {"column": "y", "task": "binary"}, "filter": "g.GENE1 > 0"})
    with pytest.raises(SourceError, match=r"'g\.GENE1' is not a column .*backticks, e\.g\. `g\.GENE1`"):
        run_ingest(spark, config(spec, tmp_path / "out"))


def test_distinct_counts_of_oddly_named_columns_in_one_pass(spark):
    from sparkdeep.pipelines.ingest import approx_distinct
    names_ = ["x.a", "b`tick", "größe (kg)", "flag", "empty"]
    df = spark.createDataFrame([("p", "1", "a", True, None), ("q", "1", "b", False, None), ("p", None, "c", True, None)],
                               "`x.a` string, `b``tick` string, `größe (kg)` string, flag boolean, empty string")
    assert approx_distinct(df, names_) == {"x.a": 2, "b`tick": 1, "größe (kg)": 3, "flag": 2, "empty": 0}
    assert approx_distinct(df, []) == {}
