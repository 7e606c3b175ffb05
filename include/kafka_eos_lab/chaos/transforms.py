"""The fault matrix's SQL transform: one row per source record, keyed by its order id, counting
how often it was written (``times``; the sink adds on conflict, so a duplicate shows as 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_eos.transforms import DLQ_REASON, SOURCE_COLUMNS

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


def times_per_id(df: "DataFrame") -> tuple["DataFrame", "DataFrame"]:
    """``(order_id, times=1)`` per record; a record whose value has no ``order_id`` is a dead letter."""
    from pyspark.sql import functions as F

    order_id = F.get_json_object(F.col("value").cast("string"), "$.order_id")
    results = df.where(order_id.isNotNull()).select(order_id.alias("order_id"), F.lit(1).alias("times"))
    dead = df.where(order_id.isNull()).select(*SOURCE_COLUMNS, "key", "value",
                                              F.lit("no order_id").alias(DLQ_REASON))
    return results, dead
