"""The example transforms (spark_apps.transforms.orders / .revenue) on a local Spark, no Kafka.

Inputs are built with the exact schema of Spark's Kafka source, so the transforms see what they
see in production; expected outputs are literal values, never recomputed with the code under test.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from spark_apps.transforms.orders import enrich, parse_orders
from spark_apps.transforms.revenue import revenue_per_minute

#: What Spark's Kafka connector returns (``df.printSchema()`` of a ``format("kafka")`` read).
KAFKA_SCHEMA = T.StructType([
    T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()),
    T.StructField("headers", T.ArrayType(T.StructType([
        T.StructField("key", T.StringType()),
        T.StructField("value", T.BinaryType()),
    ]))),
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
    T.StructField("timestamp", T.TimestampType()),
])

ENRICH_SCHEMA = T.StructType([
    T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()),
    KAFKA_SCHEMA["headers"],
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
    T.StructField("dlq_reason", T.StringType()),
])

RESULTS_SCHEMA = T.StructType([
    T.StructField("minute", T.TimestampType()),
    T.StructField("category", T.StringType()),
    T.StructField("revenue_eur", T.DecimalType(18, 2)),
    T.StructField("order_count", T.LongType()),
])

DEAD_LETTERS_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
    T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()),
    T.StructField("dlq_reason", T.StringType()),
])

PRODUCED_AT = datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc)
_DROP = object()


def order(**fields) -> bytes:
    """A valid order's JSON bytes; keyword arguments replace fields (``_DROP`` removes one)."""
    doc = {"order_id": "o-1", "customer_id": "c-7", "amount": "12.50", "currency": "EUR",
           "category": "books", "ts": "2026-11-22T10:00:03Z"}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not _DROP}).encode()


def headers(offset: int) -> list[tuple[str, bytes]]:
    return [("trace-id", f"t-{offset}".encode()), ("source", b"shop")]


def kafka_rows(values, topic="orders", partition=0, first_offset=0) -> list[tuple]:
    """Source rows for ``values`` (bytes or None), keys ``k-<offset>``, consecutive offsets."""
    return [(f"k-{first_offset + i}".encode(), value, headers(first_offset + i), topic, partition,
             first_offset + i, PRODUCED_AT)
            for i, value in enumerate(values)]


def kafka_df(spark, rows):
    return spark.createDataFrame(rows, KAFKA_SCHEMA)


def executed_plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


# --- orders_enriched ------------------------------------------------------------------------

def test_enrich_valid_orders_exact_output(spark):
    source = kafka_df(spark, kafka_rows([
        order(order_id="o-1", amount="100", currency="USD"),
        order(order_id="o-2", amount=12.5, category="games", ts="2026-11-22T10:00:59.250+01:00"),
    ], partition=3, first_offset=40))

    out = enrich(source)

    assertSchemaEqual(out.schema, ENRICH_SCHEMA)
    assertDataFrameEqual(out, spark.createDataFrame([
        (b"k-40",
         b'{"order_id":"o-1","customer_id":"c-7","amount":100.00,"currency":"USD",'
         b'"category":"books","ts":"2026-11-22T10:00:03Z","amount_eur":92.00,"size":"medium"}',
         headers(40), "orders", 3, 40, None),
        (b"k-41",
         b'{"order_id":"o-2","customer_id":"c-7","amount":12.50,"currency":"EUR",'
         b'"category":"games","ts":"2026-11-22T10:00:59.250+01:00","amount_eur":12.50,'
         b'"size":"small"}',
         headers(41), "orders", 3, 41, None),
    ], ENRICH_SCHEMA))


@pytest.mark.parametrize("amount, currency, amount_eur, size", [
    ("100", "USD", "92.00", "medium"),
    ("12.50", "EUR", "12.50", "small"),
    (12.5, "EUR", "12.50", "small"),           # a JSON number works like a string
    ("19.99", "EUR", "19.99", "small"),
    ("20", "EUR", "20.00", "medium"),          # bucket bounds are exclusive upper bounds
    ("199.99", "EUR", "199.99", "medium"),
    ("200", "EUR", "200.00", "large"),
    ("150", "GBP", "175.50", "medium"),
    ("1000", "JPY", "6.10", "small"),
    ("250", "JPY", "1.53", "small"),           # 1.525 rounds half up
    ("0.01", "CHF", "0.01", "small"),
    ("1e3", "CHF", "1040.00", "large"),
])
def test_enrich_converts_to_eur_and_buckets(spark, amount, currency, amount_eur, size):
    source = kafka_df(spark, kafka_rows([order(amount=amount, currency=currency)]))

    [row] = enrich(source).collect()

    assert row.dlq_reason is None
    enriched = json.loads(row.value, parse_float=Decimal)
    assert enriched["amount_eur"] == Decimal(amount_eur)
    assert enriched["size"] == size
    assert enriched["currency"] == currency


BAD_INPUTS = [
    # (source value, expected dlq_reason)
    (b"{not json", "malformed JSON"),
    (b"\xff\xfe\x00\x01", "malformed JSON"),                       # not even UTF-8
    (None, "malformed JSON"),                                      # a tombstone
    (b"", "malformed JSON"),
    (b"[1, 2]", "malformed JSON"),
    (b'"an order"', "malformed JSON"),
    (b"null", "malformed JSON"),
    (order(amount=_DROP), "missing field: amount"),
    (order(ts=None), "missing field: ts"),
    (order(order_id="  ", currency=None, category=_DROP), "missing field: order_id, currency, category"),
    (order(amount="abc"), "bad amount: abc"),
    (order(amount=-5), "bad amount: -5"),
    (order(amount="0"), "bad amount: 0"),
    (order(amount="12.345"), "bad amount: 12.345"),                # finer than a cent
    (order(amount="1e30"), "bad amount: 1e30"),
    (order(amount=True), "bad amount: true"),
    (order(amount={"value": 1}), 'bad amount: {"value":1}'),
    (order(amount="0", currency="XYZ"), "bad amount: 0"),          # first failing rule wins
    (order(currency="XYZ"), "bad currency: XYZ"),
    (order(currency="usd"), "bad currency: usd"),
    (order(ts="yesterday"), "bad ts: yesterday"),
    (order(ts="2026-11-22 10:00:03"), "bad ts: 2026-11-22 10:00:03"),  # no zone
    (order(ts="2026-13-40T10:00:00Z"), "bad ts: 2026-13-40T10:00:00Z"),
]


def test_enrich_dead_letters_keep_source_record(spark):
    values = [value for value, _ in BAD_INPUTS]
    source = kafka_df(spark, kafka_rows(values, partition=1, first_offset=100))

    out = enrich(source)

    assertDataFrameEqual(out, spark.createDataFrame([
        (f"k-{100 + i}".encode(), value, headers(100 + i), "orders", 1, 100 + i, reason)
        for i, (value, reason) in enumerate(BAD_INPUTS)
    ], ENRICH_SCHEMA))


def test_enrich_in_equals_out_plus_dead_letters(spark):
    values = [order(order_id=f"o-{i}") for i in range(5)] + [value for value, _ in BAD_INPUTS]
    rows = kafka_rows(values[:10], partition=0) + kafka_rows(values[10:], partition=1)
    out = enrich(kafka_df(spark, rows))

    results = out.where("dlq_reason IS NULL").count()
    dead_letters = out.where("dlq_reason IS NOT NULL").count()

    assert (results, dead_letters) == (5, len(BAD_INPUTS))
    assert sorted((r.partition, r.offset) for r in out.select("partition", "offset").collect()) \
        == sorted((r[4], r[5]) for r in rows)


def test_enrich_is_row_wise_no_exchange(spark):
    source = kafka_df(spark, kafka_rows([order(), b"{bad"]))

    plan = executed_plan(enrich(source))
    aggregated_plan = executed_plan(revenue_per_minute(source)[0])

    assert "Exchange" not in plan, plan
    # The check can see a shuffle: the aggregating transform has one.
    assert "Exchange" in aggregated_plan


def test_parse_orders_keeps_source_columns_and_types(spark):
    source = kafka_df(spark, kafka_rows([order(amount="100", currency="USD")]))

    parsed = parse_orders(source)

    assert parsed.columns == KAFKA_SCHEMA.names + [
        "order_id", "customer_id", "amount", "currency", "category", "ts", "event_time",
        "amount_eur", "dlq_reason"]
    [row] = parsed.collect()
    assert (row.amount, row.amount_eur, row.dlq_reason) == (Decimal("100.00"), Decimal("92.00"), None)
    assert row.event_time == datetime(2026, 11, 22, 10, 0, 3, tzinfo=timezone.utc) \
        .astimezone().replace(tzinfo=None)  # PySpark returns naive local time


# --- revenue_per_minute ---------------------------------------------------------------------

def test_revenue_per_minute_sums_per_minute_and_category(spark):
    p0 = kafka_rows([
        order(amount="100", currency="USD", category="books", ts="2026-11-22T10:00:03Z"),
        order(amount="12.50", category="books", ts="2026-11-22T10:00:59.999Z"),
        order(amount="1000", currency="JPY", category="games", ts="2026-11-22T10:00:30Z"),
        order(amount="oops", category="books", ts="2026-11-22T10:00:10Z"),
        order(amount="10", ts="2026-11-22T10:01:00Z"),
    ], partition=0)
    p1 = kafka_rows([
        order(amount="150", currency="GBP", category="books", ts="2026-11-22T11:01:20+01:00"),
        order(amount="5", currency="XYZ", category="books", ts="2026-11-22T10:01:00Z"),
        order(amount="7", category="games", ts="not a time"),
        b"{",
        order(amount="0.01", currency="CHF", category="games", ts="2026-11-22T10:00:00Z"),
    ], partition=1, first_offset=500)
    source = kafka_df(spark, p0 + p1)

    results, dead_letters = revenue_per_minute(source)

    assertSchemaEqual(results.schema, RESULTS_SCHEMA)
    assertSchemaEqual(dead_letters.schema, DEAD_LETTERS_SCHEMA)
    minute = lambda m: datetime(2026, 11, 22, 10, m, tzinfo=timezone.utc)  # noqa: E731
    assertDataFrameEqual(results, spark.createDataFrame([
        (minute(0), "books", Decimal("104.50"), 2),   # 92.00 + 12.50
        (minute(0), "games", Decimal("6.11"), 2),     # 6.10 + 0.01
        (minute(1), "books", Decimal("185.50"), 2),   # 10.00 + 175.50 (11:01 at +01:00)
    ], RESULTS_SCHEMA))
    assertDataFrameEqual(dead_letters, spark.createDataFrame([
        ("orders", 0, 3, b"k-3", p0[3][1], "bad amount: oops"),
        ("orders", 1, 501, b"k-501", p1[1][1], "bad currency: XYZ"),
        ("orders", 1, 502, b"k-502", p1[2][1], "bad ts: not a time"),
        ("orders", 1, 503, b"k-503", b"{", "malformed JSON"),
    ], DEAD_LETTERS_SCHEMA))
    counted = sum(r.order_count for r in results.collect()) + dead_letters.count()
    assert counted == source.count() == 10
