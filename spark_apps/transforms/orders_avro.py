"""The Avro orders example (``orders_avro``): orders arrive as Avro records (kafka-eos decodes them
to the subject's latest schema: ``value`` is a struct), leave enriched as Avro records (kafka-eos
registers their schema and encodes them). An order in an unknown currency is a dead letter.

Built from Spark SQL functions only: executors run it on the JVM.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kafka_eos.transforms import DLQ_REASON, SOURCE_COLUMNS
from spark_apps.transforms.orders import EUR_RATES


def enrich(df: DataFrame) -> DataFrame:
    """Each order with its amount in EUR; ``channel`` is whatever the reader schema says (orders
    written before the field existed read as its default)."""
    order = F.col("value")
    rates = F.create_map(*[x for currency, rate in EUR_RATES.items() for x in (F.lit(currency), F.lit(float(rate)))])
    rate = rates[order["currency"]]
    enriched = F.struct(*(order[f].alias(f) for f in df.schema["value"].dataType.fieldNames()),
                        F.round(order["amount"] * rate, 2).alias("amount_eur"))
    reason = F.when(order.isNull(), F.lit("no order (a tombstone)")) \
        .when(rate.isNull(), F.concat(F.lit("bad currency: "), order["currency"]))
    return df.select(F.col("key"), enriched.alias("value"), "headers", *SOURCE_COLUMNS, reason.alias(DLQ_REASON))


def as_rows(df: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The same orders as table rows (a SQL sink): ``(results, dead_letters)``."""
    out = enrich(df)
    good = out.where(F.col(DLQ_REASON).isNull()).select(
        *(F.col("value")[f].alias(f) for f in ("order_id", "customer_id", "currency", "channel", "amount_eur")))
    dead = out.where(F.col(DLQ_REASON).isNotNull()).select(*SOURCE_COLUMNS, "key", "value", DLQ_REASON)
    return good, dead


def enrich_json(df: DataFrame) -> DataFrame:
    """:func:`enrich` over the same orders as JSON text, out as JSON text (the benchmark's twin of
    the Avro pipeline: the same work, parsing and writing JSON instead of Avro)."""
    from pyspark.sql import types as T

    order = T.StructType([T.StructField(name, kind) for name, kind in (
        ("order_id", T.StringType()), ("customer_id", T.StringType()), ("amount", T.DoubleType()),
        ("currency", T.StringType()), ("category", T.StringType()), ("ts", T.TimestampType()),
        ("channel", T.StringType()))])
    parsed = df.withColumn("key", F.col("key").cast("string")).withColumn(
        "value", F.from_json(F.col("value").cast("string"), order))
    out = enrich(parsed)
    return out.withColumn("value", F.to_json("value"))
