"""Dataset specs and the generic ingest: any source, counted rows, drift stops the step.

Small generated tables written as CSV (with malformed lines and unparseable values),
Parquet and Delta; each test runs the real ingest step in the shared Spark session.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from pyspark.sql import functions as F

from sparkdeep import delta_io
from sparkdeep.config import ConfigError, default_conf_dir, load_config
from sparkdeep.dataset import SpecError, load_spec
from sparkdeep.jobs import ingest
from sparkdeep.jobs._common import run_step
from sparkdeep.paths import Paths
from sparkdeep.pipelines.ingest import SourceError, classes_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONF = os.path.join(REPO, "conf")


def table(n: int = 300, seed: int = 0):
    """A pandas frame: two numeric features, a colour, a whole-number count, and three labels."""
    import pandas as pd
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    z = 1.5 * x1 - x2 + (colour == "red") + rng.normal(scale=0.3, size=n)
    return pd.DataFrame({
        "id": np.arange(n, dtype="int64"), "x1": x1, "x2": x2, "colour": colour,
        "count": rng.integers(0, 50, size=n).astype("int64"),
        "churned": np.where(z > 0, "yes", "no"),
        "band": np.array(["low", "mid", "high"])[np.digitize(z, [-1.0, 1.0])],
        "amount": 100 + 20 * z,
    })


def write_spec(tmp_path, name: str, body: dict) -> str:
    import yaml
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **body}, sort_keys=False))
    return str(path)


def config(spec: str, out, *extra: str):
    return load_config(CONF, env="ci", overrides=[f"data.dataset={spec}", "data.sample_fraction=1.0",
                                                   f"output_dir={out}", "tracking.enabled=false", *extra])


def run_ingest(spark, cfg):
    return run_step("ingest", ingest.step, spark, cfg, Paths.under(cfg.output_dir))


SCHEMA = "id BIGINT, x1 DOUBLE, x2 DOUBLE, colour STRING, count INT, churned STRING, band STRING, amount DOUBLE"


# -- the spec alone ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, match", [
    ({"source": {"format": "csv", "path": "x.csv"}, "label": {"column": "y", "task": "binary"}},
     r"key 'schema': format 'csv' needs a DDL schema"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "ordinal"}},
     r"key 'label.task': 'ordinal' is not one of binary, multiclass, regression"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "binary", "threshold": 1,
                                                              "positive": ["a"]}},
     r"key 'label': give positive or threshold"),
    ({"source": {"format": "builtin", "loader": "os:system"}, "label": {"column": "y", "task": "binary"}},
     r"key 'source.loader': 'os:system': builtin loaders are the project's own"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "regression"},
      "features": {"numeric": ["a"], "exclude": ["a"]}}, r"key 'features.exclude': \['a'\] are declared"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "regression"},
      "features": {"numeric": ["features"]}}, r"column 'features' has a name the pipeline uses itself"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "regression"},
      "features": {"numeric": ["numeric_scaled"]}}, r"column 'numeric_scaled' has a name the pipeline uses itself"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "regression"},
      "features": {"categorical": ["gbt__prediction"]}}, r"column 'gbt__prediction' has a name the pipeline"),
    ({"source": {"format": "parquet", "path": "p", "version": 3}, "label": {"column": "y", "task": "regression"}},
     r"key 'source.version': a pinned version is for format 'delta' only"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "binary", "negative": ["n"]}},
     r"key 'label.negative': needs label.positive"),
    ({"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "binary", "positive": ["a"],
                                                              "negative": ["a", "b"]}},
     r"key 'label.negative': shares values with label.positive: \['a'\]"),
])
def test_a_bad_spec_names_the_key_and_the_file(tmp_path, body, match):
    path = write_spec(tmp_path, "bad", body)
    with pytest.raises(SpecError, match=match) as err:
        load_spec(path)
    assert path in str(err.value)


@pytest.mark.parametrize("name", ["train", "Holdout", "runs", "predictions"])
def test_a_data_set_named_like_a_steps_table_is_refused(tmp_path, name):
    """Its table would be the step's: prepare's split would overwrite the source rows."""
    body = {"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "binary"}}
    with pytest.raises(SpecError, match=rf"key 'name': '{name}' would name the table '{name}'"):
        load_spec(write_spec(tmp_path, name, body))


def test_an_unknown_key_is_named_and_dataset_overrides_apply(tmp_path):
    path = write_spec(tmp_path, "d", {"source": {"format": "parquet", "path": "p"}, "lable": {}})
    with pytest.raises(SpecError, match=rf"unknown key 'lable' in dataset spec '{path}'"):
        load_spec(path)
    cfg = load_config(CONF, overrides=["dataset.label.threshold=30"])
    assert cfg.dataset.label.threshold == 30.0 and cfg.dataset.task == "binary"
    with pytest.raises(ConfigError, match="unknown key 'label.treshold'"):
        load_config(CONF, overrides=["dataset.label.treshold=30"])
    with pytest.raises(ConfigError, match="'train.metrics'.*regression metric names"):
        load_config(CONF, overrides=["data.dataset=diamonds_price", "train.metrics=[auc]"])


SHIPPED = ("nycflights13", "diamonds_cut", "diamonds_price", "hmda", "caravan", "generated_ratings", "generated_repeated")


def test_every_shipped_spec_loads():
    assert sorted(SHIPPED) == sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "datasets")) if f.endswith(".yaml"))
    for name in SHIPPED:
        spec = load_config(CONF, overrides=[f"data.dataset={name}"]).dataset
        assert spec.file.endswith(f"{name}.yaml")
    assert {load_spec(n, CONF).task for n in SHIPPED} == {"binary", "multiclass", "regression"}


# -- CSV: malformed lines and unparseable values are rejected with the raw line --------------------

@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_csv_rows_reconcile_and_bad_lines_keep_their_text(spark, tmp_path):
    pdf = table(200)
    path = tmp_path / "data.csv"
    pdf.to_csv(path, index=False)
    bad = ["9001,0.5,oops,red,3,yes,low,101.0",          # x2 does not parse as DOUBLE
           "9002,0.5,0.1,red",                            # too few fields
           "9003,0.5,0.1,blue,3,yes,low,101.0,surplus",   # too many fields
           "9004,0.5,0.1,blue,3,,low,101.0",              # no label
           "9005,NaN,0.1,blue,3,no,low,99.0"]             # a non-finite feature
    with open(path, "a") as fh:
        fh.write("\n".join(bad) + "\n")
    spec = write_spec(tmp_path, "churn", {
        "source": {"format": "csv", "path": str(path)}, "schema": SCHEMA, "key": "id",
        "label": {"column": "churned", "task": "binary", "positive": ["yes"]},
        "features": {"exclude": ["band", "amount"]}})
    report = run_ingest(spark, config(spec, tmp_path / "out"))
    assert report["rows_in"] == 205
    assert report["rows_usable"] == 200 and report["rows_rejected"] == 5 and report["accounted"]
    assert report["features"]["categorical"] == ["colour"]
    assert report["features"]["numeric"] == ["x1", "x2", "count"]
    paths = Paths.under(str(tmp_path / "out"))
    rejected = {r["id"]: r for r in delta_io.read(spark, paths.table("churn_rejected")).collect()}
    assert rejected["9001"]["raw_record"] == bad[0] and "does not parse" in rejected["9001"]["reason"]
    assert rejected["9002"]["raw_record"] == bad[1]
    assert rejected["9003"]["raw_record"] == bad[2]
    assert rejected["9004"]["reason"] == "label 'churned' is null"
    assert rejected["9005"]["reason"] == "numeric feature 'x1' is NaN or infinite"
    usable = delta_io.read(spark, paths.table("churn"))
    assert usable.columns == ["id", "colour", "x1", "x2", "count", "label"]
    want = int((pdf["churned"] == "yes").sum())
    assert usable.agg(F.sum("label")).first()[0] == want == report["positives"]


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_csv_header_in_another_order_is_read_by_name_and_new_columns_listed(spark, tmp_path):
    pdf = table(60)
    pdf["extra"] = "e"
    path = tmp_path / "data.csv"
    pdf[["amount", "extra", "colour", "id", "x2", "x1", "count", "churned", "band"]].to_csv(path, index=False)
    spec = write_spec(tmp_path, "t", {
        "source": {"format": "csv", "path": str(path)}, "schema": SCHEMA, "key": "id",
        "label": {"column": "amount", "task": "regression"}, "features": {"exclude": ["churned", "band"]}})
    report = run_ingest(spark, config(spec, tmp_path / "out"))
    assert report["new_columns_ignored"] == ["extra"] and report["rows_usable"] == 60
    got = delta_io.read(spark, Paths.under(str(tmp_path / "out")).table("t")).orderBy("id").toPandas()
    np.testing.assert_allclose(got["label"], pdf["amount"])
    np.testing.assert_allclose(got["x1"], pdf["x1"])


# -- Parquet: inferred features, string classes, drift -------------------------------------------

@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_parquet_multiclass_classes_are_kept_in_order(spark, tmp_path):
    pdf = table(150)
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    spec = write_spec(tmp_path, "bands", {
        "source": {"format": "parquet", "path": src}, "key": "id",
        "label": {"column": "band", "task": "multiclass", "classes": ["low", "mid", "high"]},
        "features": {"exclude": ["churned", "amount"]}})
    report = run_ingest(spark, config(spec, tmp_path / "out"))
    assert report["classes"] == ["low", "mid", "high"]
    assert report["class_counts"] == {c: int((pdf["band"] == c).sum()) for c in ("low", "mid", "high")}
    usable = delta_io.read(spark, Paths.under(str(tmp_path / "out")).table("bands"))
    assert classes_of(usable) == ["low", "mid", "high"]
    got = dict(usable.select("id", "label").collect())
    assert all(["low", "mid", "high"][int(got[i])] == b for i, b in zip(pdf["id"], pdf["band"]))


@pytest.mark.parametrize("change, match", [
    (lambda df: df.drop("x2"), r"column 'x2' \(double, declared in the spec's schema .*\) is missing"),
    (lambda df: df.withColumn("count", F.col("count").cast("string")),
     r"column 'count' was int in the spec's schema .* now has it as string"),
])
@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_missing_or_retyped_column_stops_before_writing(spark, tmp_path, change, match):
    pdf = table(40)
    src = str(tmp_path / "src.parquet")
    change(spark.createDataFrame(pdf).withColumn("count", F.col("count").cast("int"))).write.parquet(src)
    spec = write_spec(tmp_path, "p", {
        "source": {"format": "parquet", "path": src}, "schema": SCHEMA, "key": "id",
        "label": {"column": "amount", "task": "regression"}})
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=match):
        run_ingest(spark, config(spec, out))
    assert not os.path.exists(out / "tables")


# -- Delta: pinned version, drift between runs, derived keys ----------------------------------------

@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_delta_source_version_is_recorded_and_drift_between_runs_is_named(spark, tmp_path):
    pdf = table(80)
    src = str(tmp_path / "src_delta")
    delta_io.write(spark.createDataFrame(pdf), src)
    spec = write_spec(tmp_path, "d", {
        "source": {"format": "delta", "path": src}, "key": "",
        "label": {"column": "amount", "task": "regression"}, "features": {"exclude": ["churned", "band"]}})
    out = tmp_path / "out"
    first = run_ingest(spark, config(spec, out))
    assert first["source"]["version"] == 0 and first["rows_usable"] == 80
    ids = delta_io.read(spark, Paths.under(str(out)).table("d")).select("row_id").collect()
    assert len({r[0] for r in ids}) == 80

    # A new column is ignored and listed; the derived ids stay the same.
    delta_io.write(spark.createDataFrame(pdf).withColumn("note", F.lit("n")), src)
    second = run_ingest(spark, config(spec, out))
    assert second["new_columns_ignored"] == ["note"] and second["source"]["version"] == 1
    again = delta_io.read(spark, Paths.under(str(out)).table("d")).select("row_id").collect()
    assert {r[0] for r in again} == {r[0] for r in ids}

    # A retyped column that the previous ingest recorded stops the step, naming it.
    version_before = delta_io.version_of(spark, Paths.under(str(out)).table("d"))
    delta_io.write(spark.createDataFrame(pdf).withColumn("x1", F.col("x1").cast("string")), src)
    with pytest.raises(SourceError, match=r"column 'x1' was double in the previous ingest .* now has it as string"
                                          rf".*\(dataset spec {spec}\)"):
        run_ingest(spark, config(spec, out))
    assert delta_io.version_of(spark, Paths.under(str(out)).table("d")) == version_before

    # Pinning the version reads the old rows, and the run says which.
    pinned = write_spec(tmp_path, "d", {
        "source": {"format": "delta", "path": src, "version": 1}, "key": "",
        "label": {"column": "amount", "task": "regression"}, "features": {"exclude": ["churned", "band"]}})
    assert run_ingest(spark, config(pinned, out))["source"]["version"] == 1


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_identical_rows_get_distinct_stable_ids(spark, tmp_path):
    pdf = table(30)
    dup = pdf.iloc[[0, 0, 0, 5]].copy()
    import pandas as pd
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pd.concat([pdf, dup])).repartition(3).write.parquet(src)
    spec = write_spec(tmp_path, "dups", {
        "source": {"format": "parquet", "path": src},
        "label": {"column": "churned", "task": "binary", "positive": ["yes"]}})
    out = tmp_path / "out"
    report = run_ingest(spark, config(spec, out))
    ids = [r[0] for r in delta_io.read(spark, Paths.under(str(out)).table("dups")).select("row_id").collect()]
    assert report["rows_usable"] == 34 and len(set(ids)) == 34


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_duplicated_key_and_another_data_set_in_the_output_are_errors(spark, tmp_path):
    import pandas as pd
    pdf = table(20)
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pd.concat([pdf, pdf.iloc[[3]]])).write.parquet(src)
    spec = write_spec(tmp_path, "k", {
        "source": {"format": "parquet", "path": src}, "key": "id",
        "label": {"column": "amount", "task": "regression"}})
    with pytest.raises(SourceError, match=r"key column 'id' is not unique: 1 values occur more than once \(e.g. 3\)"):
        run_ingest(spark, config(spec, tmp_path / "out"))
    ok = write_spec(tmp_path, "k2", {"source": {"format": "parquet", "path": src},
                                     "label": {"column": "amount", "task": "regression"}})
    run_ingest(spark, config(ok, tmp_path / "out2"))
    other = write_spec(tmp_path, "k3", {"source": {"format": "parquet", "path": src},
                                        "label": {"column": "amount", "task": "regression"}})
    with pytest.raises(SourceError, match=r"holds data set 'k2'.*needs its own: pass --output-dir"):
        run_ingest(spark, config(other, tmp_path / "out2"))
    assert json.load(open(tmp_path / "out2" / "dataset.json"))["name"] == "k2"


def test_a_binary_label_without_a_rule_must_be_zero_one(spark, tmp_path):
    pdf = table(20)
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    spec = write_spec(tmp_path, "b", {"source": {"format": "parquet", "path": src},
                                      "label": {"column": "churned", "task": "binary"}})
    with pytest.raises(SourceError, match=r"binary label column 'churned' holds no 0/1 value \(e.g. '(yes|no)' "
                                          r"\(\d+ rows\), '(yes|no)' \(\d+ rows\)\): set label.positive"):
        run_ingest(spark, config(spec, tmp_path / "out"))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_zero_one_label_with_a_few_other_values_rejects_those_rows(spark, tmp_path):
    """More odd values than the old 3-value sample looked at: each such row is rejected with its
    value, the 0/1 rows are ingested; the decision counts every row."""
    pdf = table(40)
    pdf["y"] = (pdf["x1"] > 0).astype(int).astype(str)
    pdf.loc[[0, 1], "y"] = "2"
    pdf.loc[2, "y"] = "maybe"
    pdf.loc[3, "y"] = "-1"
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    spec = write_spec(tmp_path, "z", {"source": {"format": "parquet", "path": src}, "key": "id",
                                      "label": {"column": "y", "task": "binary"},
                                      "features": {"exclude": ["churned", "band", "amount"]}})
    report = run_ingest(spark, config(spec, tmp_path / "out"))
    assert report["rows_usable"] == 36 and report["rows_rejected"] == 4 and report["accounted"]
    assert report["rejected_by_reason"] == {"label 'y' value '2' is not 0/1": 2, "label 'y' value 'maybe' is not 0/1": 1,
                                            "label 'y' value '-1' is not 0/1": 1}
    assert report["positives"] == int((pdf["y"] == "1").sum())


@pytest.mark.parametrize("label, filter_, match", [
    ({"column": "amount", "task": "binary", "threshold": 1e9}, "",
     r"label 'amount': every usable row is class 0 \('amount' >= 1000000000.0\): 30 rows, none of class 1; "
     r"a binary label needs both"),
    ({"column": "churned", "task": "binary", "positive": ["yes"]}, "churned = 'yes'",
     r"label 'churned': every usable row is class 1 \('churned' in \['yes'\]; every other value 0\): \d+ rows, none "
     r"of class 0; .*left out by the filter: \d+\)"),
    ({"column": "band", "task": "multiclass", "classes": ["low", "mid", "high"]}, "band = 'mid'",
     r"label 'band': every usable row is class 'mid': \d+ rows, none of \['low', 'high'\]; a multiclass label needs"),
])
@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_label_with_one_class_in_the_usable_rows_stops_before_writing(spark, tmp_path, label, filter_, match):
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(30)).write.parquet(src)
    spec = write_spec(tmp_path, "one", {"source": {"format": "parquet", "path": src}, "key": "id", "label": label,
                                        "features": {"exclude": ["x2"]}, "filter": filter_})
    with pytest.raises(SourceError, match=match) as err:
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert spec in str(err.value)
    assert not os.path.exists(tmp_path / "out" / "tables" / "one")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_positive_or_negative_value_matching_no_row_is_named_with_the_yaml_hint(spark, tmp_path):
    """``positive: [Yes]`` unquoted is YAML's boolean true, which the spec reads as 'true': it used to
    ingest with no positives at all."""
    pdf = table(30)
    pdf["churned"] = np.where(pdf["churned"] == "yes", "Yes", "No")
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    body = {"source": {"format": "parquet", "path": src}, "key": "id",
            "label": {"column": "churned", "task": "binary", "positive": ["PLACEHOLDER"]},
            "features": {"exclude": ["band", "amount"]}}
    spec = write_spec(tmp_path, "y", body)
    with open(spec) as fh:
        text = fh.read()
    assert "PLACEHOLDER" in text
    with open(spec, "w") as fh:
        fh.write(text.replace("PLACEHOLDER", "Yes"))   # unquoted, as a user writes it
    assert load_spec(spec).label.positive == ("true",)
    with pytest.raises(SourceError, match=r"key 'label.positive': 'true' matches no row of the label column 'churned' "
                                          r"\(most common values: .*'Yes'.*\); YAML read the unquoted Yes as a "
                                          r"boolean; quote it: positive: \['Yes'\]"):
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "tables")
    typo = write_spec(tmp_path, "t", {**body, "label": {"column": "churned", "task": "binary", "positive": ["Yes"],
                                                        "negative": ["Np"]}})
    with pytest.raises(SourceError, match=r"key 'label.negative': 'Np' matches no row of the label column 'churned' "
                                          r"\(most common values: '(Yes|No)' \(\d+\), '(Yes|No)' \(\d+\)\)$"):
        run_ingest(spark, config(typo, tmp_path / "out_t"))
    quoted = write_spec(tmp_path, "q", {**body, "label": {"column": "churned", "task": "binary", "positive": ["Yes"]}})
    report = run_ingest(spark, config(quoted, tmp_path / "out_q"))
    assert report["positives"] == int((pdf["churned"] == "Yes").sum()) > 0


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_positive_values_list_what_became_class_0_and_negative_rejects_the_rest(spark, tmp_path):
    pdf = table(40)
    pdf.loc[[1, 2], "churned"] = "Yes"  # typos of the positive value
    pdf.loc[3, "churned"] = "yse"
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    body = {"source": {"format": "parquet", "path": src}, "key": "id",
            "label": {"column": "churned", "task": "binary", "positive": ["yes"]},
            "features": {"exclude": ["band", "amount"]}}
    report = run_ingest(spark, config(write_spec(tmp_path, "p", body), tmp_path / "out"))
    no = int((pdf["churned"] == "no").sum())
    assert report["label"]["class_0_values"] == {"no": no, "Yes": 2, "yse": 1}
    assert report["rows_usable"] == 40
    body["label"]["negative"] = ["no"]
    report = run_ingest(spark, config(write_spec(tmp_path, "n", body), tmp_path / "out_n"))
    assert report["rows_usable"] == 37 and report["rows_rejected"] == 3
    assert report["rejected_by_reason"] == {
        "label 'churned' value 'Yes' is neither positive ['yes'] nor negative ['no']": 2,
        "label 'churned' value 'yse' is neither positive ['yes'] nor negative ['no']": 1}


def test_a_filter_leaving_no_rows_fails_before_writing(spark, tmp_path):
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(30)).write.parquet(src)
    spec = write_spec(tmp_path, "f", {"source": {"format": "parquet", "path": src}, "key": "id",
                                      "label": {"column": "amount", "task": "regression"}, "filter": "x1 > 100"})
    with pytest.raises(ValueError, match=r"no usable rows .*f\.yaml\): 30 rows read, 30 left out by the filter "
                                         r"'x1 > 100', rejected: none"):
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "tables" / "f")
    assert not os.path.exists(tmp_path / "out" / "tables" / "f_rejected")


@pytest.mark.parametrize("schema, key, label, extra, match", [
    ("myId INT, x DOUBLE, y DOUBLE", "myid", "y", {},
     r"key 'key': 'myid' is not a column of the source; did you mean 'myId'"),
    ("id INT, x DOUBLE, y DOUBLE", "id", "yy", {}, r"key 'label.column': 'yy' is not a column of the source \(columns: id, x, y\)"),
    ("id INT, `x.one` DOUBLE, x_one DOUBLE, y DOUBLE", "id", "y", {},
     r"source columns 'x.one' and 'x_one' .*n.yaml\) both become the internal name 'x_one'"),
    ("`my id` INT, My_id DOUBLE, y DOUBLE", "my id", "y", {}, r"source columns 'my id' and 'My_id' .* both become"),
    ("id INT, x DOUBLE, X DOUBLE, y DOUBLE", "id", "y", {}, r"columns 'x' and 'X' \(declared in the schema of .*n.yaml\) differ only in case"),
    ("id INT, x DOUBLE, y DOUBLE", "id", "y", {"filter": "x >> AND ("},
     r"key 'filter': 'x >> AND \(' is not a valid SQL condition on the source: \S+"),
    ("id INT, x DOUBLE, y DOUBLE", "id", "y", {"filter": "nosuch = 1"},
     r"key 'filter': 'nosuch = 1' is not a valid SQL condition on the source: .*nosuch"),
    ("id INT, x DOUBLE, y DOUBLE", "id", "y", {"filter": "x + 1"}, r"key 'filter': 'x \+ 1' is double, not a true/false"),
])
def test_names_the_ddl_and_the_filter_are_checked_before_writing(spark, tmp_path, schema, key, label, extra, match):
    header = [c.strip().split(" ")[0].strip("`") for c in schema.replace("`my id`", "`my_id`").split(",") if c.strip()]
    header = ["my id" if c == "my_id" else c for c in header]
    csv = tmp_path / "t.csv"
    csv.write_text(",".join(header) + "\n" + "\n".join(",".join(str(i + j) for j in range(len(header)))
                                                       for i in range(10)) + "\n")
    spec = write_spec(tmp_path, "n", {"source": {"format": "csv", "path": str(csv)}, "schema": schema, "key": key,
                                      "label": {"column": label, "task": "regression"}, **extra})
    with pytest.raises(SourceError, match=match):
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "tables")


@pytest.mark.parametrize("schema", [
    "id BIGINT, `price (usd)` DECIMAL(10, 2), tags ARRAY<STRING>, m MAP<STRING, INT>, s STRUCT<x: INT, y: STRING>",
    "a CHARACTER(10), b VARCHAR(3), c CHAR(2)", "a INT NOT NULL COMMENT 'it\\'s, <odd>('", "struct<a: INT, b: STRING>",
    "a INT, -- a note, with a comma\n b DOUBLE", "`a``b` INT, `x.y z` DATE, 1st TIMESTAMP, d INTERVAL DAY TO SECOND",
    "a: int, b: string",
])
def test_valid_ddl_passes_the_driver_check_as_spark_parses_it(spark, schema):
    from pyspark.sql import types as T

    from sparkdeep.dataset import ddl_problem
    assert ddl_problem(schema) is None
    assert isinstance(T._parse_datatype_string(schema), T.StructType)


@pytest.mark.parametrize("schema, why", [
    ("id INT, y DUBBLE,, x", r"column 2 \('y DUBBLE'\): 'DUBBLE' is not a Spark SQL type"),
    ("id INT, income usd DOUBLE", r"'usd' is not a Spark SQL type.*backticks \(`income.usd` DOUBLE\)"),
    ("id INT, y DOUBLE,", r"column 3 is empty"),
    ("id INT, y DECIMAL(10, 2", r"an unclosed '<' or '\('"),
])
def test_a_schema_that_is_not_ddl_is_a_config_error_before_the_run_writes_anything(tmp_path, schema, why):
    """Checked in Python when the spec loads: the job exits 2 with no lock, manifest or
    table written (Spark's parser still reads the types themselves at ingest)."""
    spec = write_spec(tmp_path, "n", {"source": {"format": "csv", "path": str(tmp_path / "t.csv")}, "schema": schema,
                                      "key": "id", "label": {"column": "y", "task": "regression"}})
    with pytest.raises(SpecError, match=r"n\.yaml', key 'schema': not a valid DDL schema .*" + why):
        config(spec, tmp_path / "out")
    assert ingest.main(["--env", "ci", "--dataset", spec, "--output-dir", str(tmp_path / "out"),
                            "--run-id", "r"]) == 2
    assert not os.path.exists(tmp_path / "out")


# -- the filter is data, not code ------------------------------------------------------------------

@pytest.fixture
def session_udfs(spark):
    """A UDF under a name of its own and one under a builtin's name (soundex), restored after."""
    jvm, registry = spark._jvm, spark._jsparkSession.sessionState().functionRegistry()
    fid = jvm.org.apache.spark.sql.catalyst.FunctionIdentifier.apply("soundex")
    builtin = jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin()
    spark.udf.register("sparkdeep_test_udf", lambda s: "x", "string")
    spark.udf.register("soundex", lambda s: "x", "string")
    yield
    registry.registerFunction(fid, builtin.lookupFunction(fid).get(), builtin.lookupFunctionBuilder(fid).get())
    spark.sql("DROP TEMPORARY FUNCTION IF EXISTS sparkdeep_test_udf")
    assert spark.sql("SELECT soundex('Robert')").first()[0] == "R163"


@pytest.mark.parametrize("filter_, match", [
    ("reflect('java.lang.System', 'getProperty', 'user.home') = '/root'", r"calls reflect\(\): it calls a Java method"),
    ("java_method('java.lang.System', 'exit', 7) IS NULL", r"calls java_method\(\): it calls a Java method"),
    ("try_reflect('java.lang.System', 'exit', 7) IS NULL", r"calls try_reflect\(\): it calls a Java method"),
    ("x1 > 0 AND upper(REFLECT('java.lang.System', 'getenv', 'HOME')) <> ''", r"calls REFLECT\(\): it calls a Java"),
    ("sparkdeep_test_udf(colour) = 'x'", r"calls sparkdeep_test_udf\(\): not a Spark builtin function \(a UDF"),
    ("no_such_function(colour) = 'x'", r"calls no_such_function\(\): not a Spark builtin function"),
    ("soundex(colour) = 'x'", r"calls soundex\(\): a function registered in this session under a builtin's name"),
    ("default.fn(colour) = 'x'", r"calls default.fn\(\): a qualified name"),
    ("identifier('java_method')('java.lang.System', 'exit', 7) IS NULL", r"holds IDENTIFIER\(\)"),
    ("id IN (SELECT id FROM other)", r"holds a subquery \(IN \(SELECT \.\.\.\)\)"),
    ("EXISTS (SELECT 1 FROM other WHERE other.id = id)", r"holds a subquery \(EXISTS\)"),
    ("x1 > (SELECT max(x1) FROM other)", r"holds a subquery \(SELECT\)"),
    ("input_file_name() LIKE '%part-0%'", r"calls input_file_name\(\): it depends on the files' layout"),
    ("rand() < 0.5", r"calls rand\(\): it is random"),
    ("current_user = 'me'", r"calls current_user\(\): it reads the session"),
    ("max(x1) OVER () > 1", r"holds a window \(OVER\)"),
    ("sum(x1) > 1", r"calls sum\(\): it is an aggregate"),
])
def test_a_filter_that_reaches_beyond_the_row_is_refused_before_spark_runs_it(spark, tmp_path, session_udfs,
                                                                              filter_, match):
    """A spec is data: its filter may compute from the row and nothing else. Nothing is
    read or written, no Spark job runs, and the JVM is still there (java_method's
    System.exit(7) used to kill it mid-ingest)."""
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(20)).write.parquet(src)
    spec = write_spec(tmp_path, "fx", {"source": {"format": "parquet", "path": src}, "key": "id",
                                       "label": {"column": "amount", "task": "regression"}, "filter": filter_})
    sc, group = spark.sparkContext, f"filter-check-{tmp_path.name}"
    sc.setJobGroup(group, "the refused filter's ingest")
    try:
        with pytest.raises(SourceError, match=rf"dataset spec '{spec}', key 'filter': .*{match}") as err:
            run_ingest(spark, config(spec, tmp_path / "out"))
        jobs = sc.statusTracker().getJobIdsForGroup(group)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    assert "before reading any row" in str(err.value)
    assert not os.path.exists(tmp_path / "out" / "tables")
    if filter_ != "current_user = 'me'":  # a bare name is a call only when no column has it: known after the read
        assert jobs == [], f"Spark ran {len(jobs)} job(s) before refusing the filter"
    assert spark.range(5).count() == 5  # the JVM lives


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_a_filter_of_plain_builtins_still_selects_rows(spark, tmp_path):
    pdf = table(200)
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    cond = ("lower(colour) = 'red' AND abs(x1) > 0.2 AND coalesce(count, 0) < 40 AND colour LIKE 'r%' "
            "AND CAST(count AS DOUBLE) BETWEEN 0 AND 100 AND (x2 IS NOT NULL OR x1 IN (1, 2)) "
            "AND CASE WHEN x2 > 0 THEN true ELSE round(x2, 1) <= 0 END AND exists(array(x1, x2), v -> v < 10)")
    spec = write_spec(tmp_path, "ok", {"source": {"format": "parquet", "path": src}, "key": "id",
                                       "label": {"column": "amount", "task": "regression"}, "filter": cond})
    report = run_ingest(spark, config(spec, tmp_path / "out"))
    kept = int(((pdf["colour"] == "red") & (pdf["x1"].abs() > 0.2) & (pdf["count"] < 40)).sum())
    assert report["rows_usable"] == kept > 0 and report["rows_filtered"] == 200 - kept


def test_the_filter_allow_list_names_only_spark_builtins(spark):
    """Every name on the list is a Spark builtin (a misspelt entry would allow nothing, or a UDF
    of that name), and none of the functions that reach the JVM, files or the session is on it."""
    from sparkdeep.pipelines.ingest import FILTER_FUNCTIONS
    jvm = spark._jvm
    builtin = jvm.org.apache.spark.sql.catalyst.analysis.FunctionRegistry.builtin()
    fid = jvm.org.apache.spark.sql.catalyst.FunctionIdentifier
    assert [n for n in sorted(FILTER_FUNCTIONS) if not builtin.lookupFunction(fid.apply(n)).isDefined()] == []
    groups = {n: str(builtin.lookupFunction(fid.apply(n)).get().getGroup()) for n in FILTER_FUNCTIONS}
    assert not {n for n, g in groups.items() if g in ("agg_funcs", "window_funcs", "generator_funcs")}
    assert not FILTER_FUNCTIONS & {"reflect", "java_method", "try_reflect", "from_protobuf", "to_protobuf",
                                   "from_avro", "to_avro", "input_file_name", "current_user", "user", "session_user",
                                   "current_database", "current_catalog", "version", "rand", "uuid", "raise_error",
                                   "spark_partition_id", "monotonically_increasing_id", "xpath", "from_xml"}


@pytest.mark.parametrize("column", ["numeric", "numeric_scaled", "x__bin", "gbt__probability", "Numeric",
                                    "CITY__Idx", "Features"])
def test_an_inferred_feature_with_a_name_the_pipeline_makes_stops_ingest_and_can_be_excluded(spark, tmp_path,
                                                                                              column):
    """In any case: Spark matches names case-insensitively, so 'Numeric' would be ambiguous
    beside the pipeline's 'numeric'. The error's advice (exclude it) then works."""
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(20)).withColumnRenamed("x2", column).write.parquet(src)
    body = {"source": {"format": "parquet", "path": src}, "key": "id",
            "label": {"column": "amount", "task": "regression"}}
    spec = write_spec(tmp_path, "r", body)
    with pytest.raises(SourceError, match=rf"source column '{column}' has a name the pipeline uses itself; add it "
                                          r"to features.exclude in .*r\.yaml"):
        run_ingest(spark, config(spec, tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "tables")
    excluded = write_spec(tmp_path, "r2", {**body, "features": {"exclude": [column]}})
    report = run_ingest(spark, config(excluded, tmp_path / "out2"))
    assert report["rows_usable"] == 20
    assert column not in delta_io.read(spark, str(tmp_path / "out2" / "tables" / "r2")).columns


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_an_empty_holdout_stops_prepare_before_it_writes(spark, tmp_path):
    from sparkdeep.jobs import prepare
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(3)).write.parquet(src)
    spec = write_spec(tmp_path, "h", {"source": {"format": "parquet", "path": src}, "key": "id",
                                      "label": {"column": "amount", "task": "regression"}})
    cfg = config(spec, tmp_path / "out", "prepare.holdout_fraction=0.01")
    run_ingest(spark, cfg)
    with pytest.raises(ValueError, match=r"the holdout is empty: 3 usable rows in 'h' and prepare.holdout_fraction "
                                         r"0.01; .*data.sample_fraction 1.0"):
        run_step("prepare", prepare.step, spark, cfg, Paths.under(cfg.output_dir))
    assert not os.path.exists(tmp_path / "out" / "tables" / "train")


def _prepare(spark, cfg):
    from sparkdeep.jobs import prepare
    return run_step("prepare", prepare.step, spark, cfg, Paths.under(cfg.output_dir))


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
@pytest.mark.parametrize("column, cast", [("colour", "string"), ("x2", "double")])
def test_a_feature_null_in_every_training_row_is_named_before_prepare_writes(spark, tmp_path, column, cast):
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(table(40)).withColumn(column, F.lit(None).cast(cast)).write.parquet(src)
    spec = write_spec(tmp_path, "e", {"source": {"format": "parquet", "path": src}, "key": "id",
                                      "label": {"column": "churned", "task": "binary", "positive": ["yes"]},
                                      "features": {"exclude": ["band", "amount"]}})
    cfg = config(spec, tmp_path / "out")
    run_ingest(spark, cfg)
    with pytest.raises(ValueError, match=rf"feature column\(s\) \['{column}'\] are null.* in every one of the \d+ "
                                         r"training rows: nothing to learn from; add them to features.exclude in "
                                         r".*e\.yaml"):
        _prepare(spark, cfg)
    assert not os.path.exists(tmp_path / "out" / "tables" / "train")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_categories_with_only_constant_numbers_leave_the_numbers_out_and_prepare(spark, tmp_path):
    """Embedding encoding: every number constant used to leave an empty numeric block that the
    variance selector refused; now they are left out, reported, and the features are the indices."""
    src = str(tmp_path / "src.parquet")
    frame = table(60).assign(x1=2.0, x2=-1.0, count=7)
    spark.createDataFrame(frame).write.parquet(src)
    spec = write_spec(tmp_path, "c", {"source": {"format": "parquet", "path": src}, "key": "id",
                                      "label": {"column": "churned", "task": "binary", "positive": ["yes"]},
                                      "features": {"exclude": ["amount"]}})
    cfg = config(spec, tmp_path / "out")
    run_ingest(spark, cfg)
    report = _prepare(spark, cfg)
    assert set(report["left_out"]) == {"x1", "x2", "count"}
    assert "one value (2.0)" in report["left_out"]["x1"]
    assert report["embedding_layout"]["categorical"] == ["colour", "band"]
    prepared = delta_io.read(spark, str(tmp_path / "out" / "tables" / "train_prepared"))
    assert {len(r["features"]) for r in prepared.select("features").collect()} == {2}


@pytest.mark.parametrize("value, word", [("lots", "expected a whole number, got 'lots'"),
                                         (2.5, "expected a whole number, got 2.5"),
                                         (True, "expected a whole number, got True")])
def test_the_config_and_a_spec_word_a_wrong_value_alike(tmp_path, value, word):
    body = {"source": {"format": "parquet", "path": "p"}, "label": {"column": "y", "task": "regression"},
            "features": {"max_categories": value}}
    with pytest.raises(SpecError, match=f"key 'features.max_categories' in dataset spec .*: {word}"):
        load_spec(write_spec(tmp_path, "typed", body))
    with pytest.raises(ConfigError, match=f"config key 'train.epochs' .*: {word}"):
        load_config(default_conf_dir(), overrides=[f"train.epochs={value}"])


def test_ingest_reports_every_categorical_column_s_levels_and_says_why_a_column_is_left_out(spark, tmp_path, caplog,
                                                                                         monkeypatch):
    """An ID-like string column over features.max_categories is left out with a console line
    naming it and its level count; every categorical column's level count is in the report."""
    import logging
    pdf = table(300)
    pdf["user"] = [f"u{i}" for i in range(300)]  # an ID: one level per row
    src = str(tmp_path / "src.parquet")
    spark.createDataFrame(pdf).write.parquet(src)
    spec = write_spec(tmp_path, "ids", {"source": {"format": "parquet", "path": src}, "key": "id",
                                        "label": {"column": "amount", "task": "regression"},
                                        "features": {"max_categories": 100}})
    monkeypatch.setattr(logging.getLogger("sparkdeep"), "propagate", True)  # to caplog's handler
    with caplog.at_level(logging.INFO, logger="sparkdeep"):
        report = run_ingest(spark, config(spec, tmp_path / "out"))
    features = report["features"]
    assert "user" in features["left_out"] and "max_categories=100" in features["left_out"]["user"]
    assert set(features["levels"]) == set(features["categorical"]) and 2 <= features["levels"]["colour"] <= 4
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("[ingest] left out 'user': about") and "max_categories=100" in line for line in lines)
    assert any(line.startswith("[ingest] categorical 'colour': about") for line in lines)
