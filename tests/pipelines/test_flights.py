import pytest
from pyspark.sql import functions as F

from sparkdeep.pipelines import flights as fl


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


def test_every_row_is_usable_or_rejected_with_a_reason(raw):
    usable, rejected, dups = fl.build_flights(raw, delay_threshold_min=15)
    report = fl.ingest_report(4, usable, rejected, dups)
    assert report["rows_usable"] == 3 and report["rows_rejected"] == 1 and report["accounted"]
    assert [r["flight_id"] for r in rejected.collect()] == [3]
    assert "cancelled" in rejected.first()["reason"]
    assert report["usable_without_weather"] == 1 and report["usable_without_plane"] == 1


def test_label_threshold_and_duplicate_weather_averaged(raw):
    usable, _, dups = fl.build_flights(raw, delay_threshold_min=15)
    rows = {r["flight_id"]: r for r in usable.collect()}
    assert len(rows) == 3  # the duplicated weather hour did not duplicate flights
    assert (rows[1]["label"], rows[2]["label"], rows[4]["label"]) == (1, 0, 1)  # >= 15 min is delayed
    assert rows[1]["temp"] == pytest.approx(35.0)
    assert dups.count() == 1


def test_real_data_schema_and_counts(spark):
    """The shipped nycflights13 tables load with the explicit schemas."""
    raw = fl.load_raw(spark)
    assert raw.flights.count() == 336776
    assert raw.flights.where(F.col("arr_delay").isNull()).count() == 9430
    assert raw.planes.schema == fl.PLANES_SCHEMA
