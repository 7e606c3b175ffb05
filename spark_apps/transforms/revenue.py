"""The ``revenue_per_minute`` transform: EUR revenue and order count per minute and category.

For a SQL sink with ``commit: atomic`` and ``merge: add``: the sink adds each batch's rows to
the stored ones on conflict of (minute, category), so every source record counts exactly once
across batches. Validation is :func:`spark_apps.transforms.orders.parse_orders`'s.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_eos.transforms import DLQ_REASON, SOURCE_COLUMNS

from .orders import parse_orders

#: ``revenue_eur`` is exact money: decimal(18,2), not double, so sums merged across batches
#: add up to the cent. 16 integer digits; an overflowing sum fails the batch under ANSI mode
#: (Spark 4's default) rather than being stored wrong.
REVENUE = T.DecimalType(18, 2)
#: The upsert key of the results table.
KEY_COLUMNS = ("minute", "category")


def revenue_per_minute(df: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Aggregate valid orders per (minute of ``ts``, category); separate the dead letters.

    :param df: rows with the Kafka source schema. It is read twice (results and dead
        letters); the caller may cache it.
    :return: ``(results, dead_letters)``. ``results``: ``minute`` (timestamp: the order's
        ``ts`` truncated to the minute), ``category`` (string), ``revenue_eur``
        (decimal(18,2)), ``order_count`` (long). ``dead_letters``: ``topic``, ``partition``,
        ``offset``, ``key``, ``value`` (source key and value unchanged), ``dlq_reason``.
        ``sum(order_count) + count(dead_letters) == count(df)``.
    """
    parsed = parse_orders(df)
    valid = parsed.where(F.col(DLQ_REASON).isNull())
    results = valid.groupBy(
        F.date_trunc("minute", F.col("event_time")).alias("minute"),
        F.col("category"),
    ).agg(
        F.sum("amount_eur").cast(REVENUE).alias("revenue_eur"),
        F.count(F.lit(1)).alias("order_count"),
    )
    dead_letters = parsed.where(F.col(DLQ_REASON).isNotNull()).select(
        *SOURCE_COLUMNS, "key", "value", DLQ_REASON)
    return results, dead_letters
