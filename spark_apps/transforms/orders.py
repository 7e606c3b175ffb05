"""Orders: parse and validate order events, and the ``orders_enriched`` transform.

Input rows are what Spark's Kafka connector reads (see :mod:`kafka_eos.transforms`); ``value``
is a UTF-8 JSON order such as::

    {"order_id": "o-1", "customer_id": "c-7", "amount": "12.50", "currency": "EUR",
     "category": "books", "ts": "2026-11-22T10:00:03Z"}

Everything here is built from Spark SQL built-in functions, never Python UDFs, so executors
run it on the JVM and never need to import this module.

Validation rules (the first that applies is the record's ``dlq_reason``):

1. ``malformed JSON`` - a null/empty value, or text that is not one JSON object.
2. ``missing field: <f>[, <f>...]`` - a required field is absent, JSON null or blank.
3. ``bad amount: <raw>`` - not a number, ``<= 0``, more than 2 decimals (amounts are exact
   ``decimal(18,2)``; silently rounding money would be worse than rejecting it), or too large.
4. ``bad currency: <raw>`` - not a key of :data:`EUR_RATES` (ISO 4217 codes, upper case).
5. ``bad ts: <raw>`` - not an RFC 3339 timestamp *with* a zone (``Z`` or ``+hh:mm``): a
   zoneless time would depend on the session time zone, and a replayed range must give the
   same answer on any cluster.
"""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kafka_eos.transforms import DLQ_REASON, SOURCE_COLUMNS

#: Fields every order must carry (absent, JSON null or blank -> ``missing field``).
REQUIRED_FIELDS = ("order_id", "customer_id", "amount", "currency", "category", "ts")

#: Exchange rates to the base currency, EUR (fixed example rates, not market data). Decimals,
#: not floats, so ``amount_eur`` is exact before its single rounding step.
EUR_RATES: dict[str, Decimal] = {
    "EUR": Decimal("1.0"),
    "USD": Decimal("0.92"),
    "GBP": Decimal("1.17"),
    "CHF": Decimal("1.04"),
    "JPY": Decimal("0.0061"),
    "SEK": Decimal("0.087"),
}

#: Money type of ``amount`` and ``amount_eur``: exact cents; 16 integer digits.
MONEY = T.DecimalType(18, 2)
#: Rate type: 6 decimals hold every rate above exactly (JPY needs 4).
RATE = T.DecimalType(10, 6)
#: Wide enough to tell ``12.345`` (rejected: more than 2 decimals) from ``12.35``.
_EXACT = T.DecimalType(38, 18)

#: Size buckets of an order by ``amount_eur``: below 20 is small, below 200 medium, else large.
SMALL_BELOW_EUR = Decimal("20")
MEDIUM_BELOW_EUR = Decimal("200")

#: RFC 3339 date-time with a mandatory zone designator.
_TS_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
#: from_json puts the text of a record that is not a JSON object here (PERMISSIVE mode).
_CORRUPT = "_corrupt_record"

#: The JSON schema: every field as a string, so ``12.5`` and ``"12.50"`` both arrive as text
#: and a wrong type is reported with the raw value instead of silently becoming null.
ORDER_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in REQUIRED_FIELDS]
    + [T.StructField(_CORRUPT, T.StringType())]
)

#: The order fields written to ``orders.enriched`` (the original fields, then the enrichment).
ENRICHED_FIELDS = REQUIRED_FIELDS + ("amount_eur", "size")


def _rates_map() -> Column:
    """:data:`EUR_RATES` as a Spark map literal (currency -> decimal rate)."""
    entries = []
    for currency, rate in EUR_RATES.items():
        entries += [F.lit(currency), F.lit(str(rate)).cast(RATE)]
    return F.create_map(*entries)


def _blank(column: Column) -> Column:
    return column.isNull() | (F.trim(column) == "")


def parse_orders(df: DataFrame) -> DataFrame:
    """Parse and validate order JSON, row by row (no shuffle).

    :param df: rows with the Kafka source schema (at least ``value``; every column is kept).
    :return: ``df``'s columns, then ``order_id``, ``customer_id`` (string), ``amount``
        (decimal(18,2)), ``currency``, ``category``, ``ts`` (the raw string), ``event_time``
        (timestamp parsed from ``ts``), ``amount_eur`` (decimal(18,2), rounded half-up to
        cents) and ``dlq_reason`` (string; null for a valid order). The typed columns are only
        meaningful where ``dlq_reason`` is null.
    """
    order = F.from_json(F.col("value").cast("string"), ORDER_SCHEMA,
                        {"columnNameOfCorruptRecord": _CORRUPT})
    parsed = df.withColumn("_order", order)
    field = {name: F.col(f"_order.{name}") for name in REQUIRED_FIELDS}

    malformed = F.col("_order").isNull() | F.col(f"_order.{_CORRUPT}").isNotNull()
    # concat_ws skips nulls: the names of all missing fields, or "".
    missing = F.concat_ws(", ", *[F.when(_blank(field[n]), F.lit(n)) for n in REQUIRED_FIELDS])

    # try_cast / try_element_at: under ANSI mode (Spark 4's default) plain casts and map
    # lookups raise on bad input; a poison record must become a dead letter, not fail the job.
    amount = field["amount"].try_cast(MONEY)
    amount_exact = field["amount"].try_cast(_EXACT)
    rate = F.try_element_at(_rates_map(), field["currency"])
    amount_eur = F.round(amount * rate, 2).try_cast(MONEY)
    event_time = F.when(field["ts"].rlike(_TS_PATTERN), field["ts"].try_cast(T.TimestampType()))
    bad_amount = (amount.isNull() | (amount <= 0) | (amount_exact != amount)
                  | (rate.isNotNull() & amount_eur.isNull()))  # converts beyond decimal(18,2)

    reason = (
        F.when(malformed, F.lit("malformed JSON"))
        .when(missing != "", F.concat(F.lit("missing field: "), missing))
        .when(bad_amount, F.concat(F.lit("bad amount: "), field["amount"]))
        .when(rate.isNull(), F.concat(F.lit("bad currency: "), field["currency"]))
        .when(event_time.isNull(), F.concat(F.lit("bad ts: "), field["ts"]))
    )
    return parsed.select(
        *[F.col(c) for c in df.columns],
        field["order_id"].alias("order_id"),
        field["customer_id"].alias("customer_id"),
        amount.alias("amount"),
        field["currency"].alias("currency"),
        field["category"].alias("category"),
        field["ts"].alias("ts"),
        event_time.alias("event_time"),
        amount_eur.alias("amount_eur"),
        reason.cast("string").alias(DLQ_REASON),
    )


def size_bucket(amount_eur: Column) -> Column:
    """``small`` (< 20 EUR), ``medium`` (< 200 EUR) or ``large``."""
    return (F.when(amount_eur < F.lit(SMALL_BELOW_EUR), F.lit("small"))
            .when(amount_eur < F.lit(MEDIUM_BELOW_EUR), F.lit("medium"))
            .otherwise(F.lit("large")))


def enrich(df: DataFrame) -> DataFrame:
    """The ``orders_enriched`` transform (Kafka sink, ``commit: per_partition``).

    Row-wise (select/when only, no Exchange), so each source partition's rows stay in one task.

    :param df: rows with the Kafka source schema.
    :return: ``key`` (binary, the source key), ``value`` (binary: UTF-8 JSON of the enriched
        order, i.e. :data:`ENRICHED_FIELDS` with ``amount``/``amount_eur`` as JSON numbers with
        2 decimals; for a dead letter, the source value byte for byte), ``headers`` (the source
        headers), ``topic``, ``partition``, ``offset`` (source coordinates) and ``dlq_reason``.
    """
    parsed = parse_orders(df)
    enriched = F.to_json(F.struct(
        *[F.col(name) for name in REQUIRED_FIELDS],
        F.col("amount_eur"),
        size_bucket(F.col("amount_eur")).alias("size"),
    ))
    # value stays binary: a dead letter must carry the source bytes unchanged, even non-UTF-8.
    value = F.when(F.col(DLQ_REASON).isNull(), F.encode(enriched, "UTF-8")).otherwise(F.col("value"))
    return parsed.select("key", value.alias("value"), "headers", *SOURCE_COLUMNS, DLQ_REASON)


def as_rows(df: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The orders as table rows (a SQL sink, one row per order, keyed by its source coordinates):
    ``(results, dead_letters)``. ``results``: ``topic``, ``partition``, ``offset``, ``order_id``,
    ``customer_id``, ``amount``, ``currency``, ``category``, ``event_time`` (timestamp),
    ``amount_eur`` and ``size``; ``dead_letters`` as :func:`spark_apps.transforms.revenue.revenue_per_minute`'s.
    Row-wise, like :func:`enrich`."""
    parsed = parse_orders(df)
    results = parsed.where(F.col(DLQ_REASON).isNull()).select(
        *SOURCE_COLUMNS, "order_id", "customer_id", "amount", "currency", "category", "event_time", "amount_eur",
        size_bucket(F.col("amount_eur")).alias("size"))
    dead_letters = parsed.where(F.col(DLQ_REASON).isNotNull()).select(*SOURCE_COLUMNS, "key", "value", DLQ_REASON)
    return results, dead_letters
