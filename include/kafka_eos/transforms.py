"""The transform contract, and kafka-eos's own ``identity`` transform.

A transform is ``f(df) -> DataFrame`` or ``f(df) -> (results, dead_letters)``.

Its input is what Spark's Kafka connector reads, one row per committed source record:
``key`` (binary), ``value`` (binary), ``headers`` (array<struct<key:string,value:binary>>),
``topic``, ``partition``, ``offset``, ``timestamp``.

Kafka sinks (row-wise transforms; required for ``commit: per_partition``) return ONE DataFrame:
  - ``key``, ``value`` (string or binary) and optionally ``headers``: the record to write;
  - ``topic``, ``partition``, ``offset``: the source coordinates, carried through unchanged;
  - ``dlq_reason`` (string): null for a result, else the reason the source record is a dead
    letter; a dead-letter row carries the *source* key and value.
SQL sinks may aggregate and return ``(results, dead_letters)``: ``results`` has the table's
columns; ``dead_letters`` has ``topic``, ``partition``, ``offset``, ``key``, ``value``,
``dlq_reason``. Either form keeps ``in = out + dead letters`` countable per source record.

A transform should be deterministic: the same records give the same rows each time it is computed.
One attempt of a run computes a one-frame transform once (a SQL or Iceberg sink persists its output
for its two jobs), but a retried attempt, or Spark recomputing a lost task, computes it again, and a
``(results, dead_letters)`` transform's two frames are two computations of its own: a rule on
``current_timestamp()`` or an outside service may then answer otherwise for a record near its
boundary. Take such a value from the record (``timestamp``, a field) instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: Column a transform sets to mark a row as a dead letter (null = a result).
DLQ_REASON = "dlq_reason"
#: The source coordinates every row of a Kafka-sink transform carries.
SOURCE_COLUMNS = ("topic", "partition", "offset")


def identity(df: "DataFrame") -> "DataFrame":
    """Copy key, value and headers unchanged; nothing is a dead letter."""
    from pyspark.sql import functions as F

    return df.select("key", "value", "headers", *SOURCE_COLUMNS,
                     F.lit(None).cast("string").alias(DLQ_REASON))
