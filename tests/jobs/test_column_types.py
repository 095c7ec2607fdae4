"""Column types at ingest: dates and timestamps become numbers (the value and its parts),
decimals numbers, integers declared categorical their text; a declared column of any other
type is a one-line error naming it and its type, before any row is read."""
from __future__ import annotations

import datetime as dt
import decimal

import pytest
from pyspark.sql import types as T

from sparkdeep import delta_io, names
from sparkdeep.paths import Paths
from sparkdeep.pipelines.ingest import SourceError

from .test_datasets import config, run_ingest, write_spec

SCHEMA = T.StructType([
    T.StructField("id", T.LongType()), T.StructField("signed up", T.DateType()),
    T.StructField("seen", T.TimestampType()), T.StructField("price", T.DecimalType(10, 2)),
    T.StructField("zip", T.IntegerType()), T.StructField("tags", T.ArrayType(T.StringType())),
    T.StructField("y", T.StringType())])


@pytest.fixture(scope="module")
def source(spark, tmp_path_factory):
    rows = [(i, dt.date(2024, 1 + i % 12, 1 + i % 28) if i % 10 else None,
             dt.datetime(2024, 3, 1, i % 24, 30), decimal.Decimal(f"{i}.25"), 10_000 + i % 7, ["a"],
             "yes" if i % 3 else "no") for i in range(60)]
    path = str(tmp_path_factory.mktemp("types") / "t.parquet")
    spark.createDataFrame(rows, SCHEMA).write.parquet(path)
    return path


def _spec(tmp_path, source, features: dict) -> str:
    return write_spec(tmp_path, "typed", {"source": {"format": "parquet", "path": source}, "key": "id",
                                          "label": {"column": "y", "task": "binary", "positive": ["yes"]},
                                          "features": features})


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_dates_timestamps_decimals_and_integer_codes_become_features(spark, tmp_path, source):
    cfg = config(_spec(tmp_path, source, {"categorical": ["zip"],
                                          "numeric": ["signed up", "seen", "price"]}), tmp_path / "o")
    report = run_ingest(spark, cfg)
    numeric = report["features"]["numeric"]
    assert numeric == ["signed up", "signed up_year", "signed up_month", "signed up_day", "signed up_day_of_week",
                       "seen", "seen_year", "seen_month", "seen_day", "seen_day_of_week", "seen_hour", "price"]
    paths = Paths.under(cfg.output_dir)
    out = delta_io.read(spark, paths.table(cfg.dataset.table))
    original = {f.metadata.get(names.ORIGINAL_NAME, f.name): f.name for f in out.schema.fields}
    rows = {r["id"]: r for r in out.collect()}
    r = rows[13]  # 2024-02-14, a Wednesday; seen at 13:30
    assert r[original["signed up"]] == (dt.date(2024, 2, 14) - dt.date(1970, 1, 1)).days
    assert (r[original["signed up_year"]], r[original["signed up_month"]], r[original["signed up_day"]],
            r[original["signed up_day_of_week"]]) == (2024, 2, 14, 4)
    assert r[original["seen_hour"]] == 13 and r[original["seen_day"]] == 1
    assert r[original["price"]] == pytest.approx(13.25)
    assert r[original["zip"]] == "10006"  # an integer code as its text
    assert rows[10][original["signed up"]] is None and rows[10][original["signed up_month"]] is None
    assert report["rows_usable"] == 60  # a null date is a missing number, not a rejected row


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_inferred_features_take_dates_and_leave_an_array_out_with_the_reason(spark, tmp_path, source):
    report = run_ingest(spark, config(_spec(tmp_path, source, {}), tmp_path / "o"))
    f = report["features"]
    assert "seen_hour" in f["numeric"] and "signed up_day_of_week" in f["numeric"]
    assert "array<string>" in f["left_out"]["tags"]


@pytest.mark.parametrize("features, match", [
    ({"categorical": ["tags"]}, r"features.categorical lists 'tags', a array<string> column"),
    ({"numeric": ["tags"]}, r"features.numeric lists 'tags', a array<string> column"),
])
def test_a_declared_column_of_a_type_no_list_takes_is_named(spark, tmp_path, source, features, match):
    with pytest.raises(SourceError, match=match):
        run_ingest(spark, config(_spec(tmp_path, source, features), tmp_path / "o"))


def test_a_date_part_that_is_already_a_source_column_is_named(spark, tmp_path):
    path = str(tmp_path / "clash.parquet")
    spark.createDataFrame([(1, dt.date(2024, 1, 1), 3.0, "yes"), (2, dt.date(2024, 1, 2), 4.0, "no")],
                          "id BIGINT, d DATE, d_year DOUBLE, y STRING").write.parquet(path)
    spec = write_spec(tmp_path, "clash", {"source": {"format": "parquet", "path": path}, "key": "id",
                                          "label": {"column": "y", "task": "binary", "positive": ["yes"]}})
    with pytest.raises(SourceError, match=r"feature 'd' adds the number 'd_year', which is already a source column"):
        run_ingest(spark, config(spec, tmp_path / "o"))
