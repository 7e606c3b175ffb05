"""Sample orders for the demo and the tests, produced by a transactional producer with some
transactions aborted and some orders malformed, so exactly-once can be judged against a known
ground truth: which orders were committed, which were aborted, which are poison."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from confluent_kafka import Producer

from kafka_eos.formats.registry import Registry
from kafka_eos.readers import settle
from kafka_eos.settings import KafkaSettings

CURRENCIES = ("EUR", "USD", "GBP", "CHF", "JPY")
CATEGORIES = ("books", "games", "garden", "music", "tools")
#: Poison records of each kind the orders transform must dead-letter.
MALFORMED = (
    b"{not json",
    json.dumps({"order_id": "x", "customer_id": "c-1", "currency": "EUR", "category": "books",
                "ts": "2026-11-22T10:00:00Z"}).encode(),  # missing amount
    None,  # filled per order: a negative amount
    None,  # filled per order: an unknown currency
)


@dataclass
class Produced:
    """Ground truth of what a :func:`produce_orders` call wrote."""

    committed: list[dict] = field(default_factory=list)  # valid orders in committed transactions
    malformed: int = 0  # poison records in committed transactions
    aborted: list[str] = field(default_factory=list)  # order ids (valid or not) in aborted ones


def make_order(seq: int, rng: random.Random, start: datetime) -> dict:
    return {
        "order_id": f"o-{seq}",
        "customer_id": f"c-{rng.randrange(1, 500)}",
        "amount": f"{rng.uniform(1, 400):.2f}",
        "currency": rng.choice(CURRENCIES),
        "category": rng.choice(CATEGORIES),
        "ts": (start + timedelta(seconds=seq % 600)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _poison(kind: int, order: dict) -> bytes:
    if kind == 2:
        return json.dumps({**order, "amount": "-5.00"}).encode()
    if kind == 3:
        return json.dumps({**order, "currency": "XXX"}).encode()
    return MALFORMED[kind]


def order_record(seq: int, rng: random.Random, start: datetime, malformed_every: int = 17) -> tuple[dict, bytes | None, bool]:
    """The ``seq``-th sample order: ``(order, value, poison)``. Every ``malformed_every``-th is poison
    (a value the orders transform dead-letters, in turn each kind of :data:`MALFORMED`)."""
    order = make_order(seq, rng, start)
    if malformed_every and seq % malformed_every == malformed_every - 1:
        return order, _poison(seq % len(MALFORMED), order), True
    return order, json.dumps(order).encode(), False


def produce_orders(settings: KafkaSettings, topic: str, count: int, *, first_seq: int = 0,
                   per_transaction: int = 50, abort_every: int = 4, malformed_every: int = 17,
                   seed: int = 7, transactional_id: str | None = None) -> Produced:
    """Produce ``count`` records to ``topic`` in transactions of ``per_transaction``.

    Every ``abort_every``-th transaction is aborted; every ``malformed_every``-th record is
    poison. Keys are customer ids, so one customer's orders stay in one partition. Returns once
    the transactions' markers are on the partitions (a producer's commit returns before): a plan
    made next sees every committed record.
    """
    rng = random.Random(seed + first_seq)
    start = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    producer = Producer(settings.client_config(**{
        "transactional.id": transactional_id or f"kafka-eos.sample.{topic}",
        "partitioner": "murmur2_random", "linger.ms": 5}))
    producer.init_transactions(30)
    truth = Produced()
    seq, txn = first_seq, 0
    while seq < first_seq + count:
        txn += 1
        abort = abort_every > 0 and txn % abort_every == 0
        producer.begin_transaction()
        batch_valid, batch_malformed, batch_ids = [], 0, []
        for _ in range(min(per_transaction, first_seq + count - seq)):
            order, value, poison = order_record(seq, rng, start, malformed_every)
            if poison:
                batch_malformed += 1
            else:
                batch_valid.append(order)
            batch_ids.append(order["order_id"])
            producer.produce(topic, key=order["customer_id"].encode(), value=value)
            seq += 1
        if abort:
            # Flush first: librdkafka can fail an abort with INVALID_TXN_STATE while the
            # transaction's partitions are still being added (librdkafka issue #4849).
            producer.flush(30)
            producer.abort_transaction(30)
            truth.aborted.extend(batch_ids)
        else:
            producer.commit_transaction(30)
            truth.committed.extend(batch_valid)
            truth.malformed += batch_malformed
    settle(settings, topic)
    return truth


#: The Avro orders of the Avro example pipeline: version 1, then version 2 (a producer evolved its
#: schema: a ``channel`` field with a default, a BACKWARD-compatible change).
ORDER_AVRO_V1 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "customer_id", "type": "string"},
               {"name": "amount", "type": "double"}, {"name": "currency", "type": "string"},
               {"name": "category", "type": "string"},
               {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
ORDER_AVRO_V2 = {**ORDER_AVRO_V1, "fields": [*ORDER_AVRO_V1["fields"],
                                             {"name": "channel", "type": "string", "default": "web"}]}


def avro_order(seq: int, rng: random.Random, start: datetime, evolved: bool) -> dict:
    """The ``seq``-th sample order as an Avro record of :data:`ORDER_AVRO_V1` (``evolved``: V2)."""
    order = make_order(seq, rng, start)
    record = {**order, "amount": float(order["amount"]),
              "ts": datetime.strptime(order["ts"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)}
    if seq % 23 == 22:
        record["currency"] = "XXX"  # the transform dead-letters an unknown currency
    if evolved:
        record["channel"] = ("web", "app", "store")[seq % 3]
    return record


def produce_avro_orders(settings: KafkaSettings, topic: str, count: int, *, evolve_at: int | None = None,
                        seed: int = 7, per_transaction: int = 500, first_seq: int = 0) -> list[dict]:
    """Produce ``count`` Avro orders to ``topic`` with confluent-kafka's ``AvroSerializer`` (the
    schema registered under ``{topic}-value``): :data:`ORDER_AVRO_V1` until ``evolve_at``, then
    :data:`ORDER_AVRO_V2`. Keys are customer ids as text. Returns the records produced, once they
    are readable (as :func:`produce_orders`).

    :raises KafkaEosError: no Schema Registry in ``settings``.
    """
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = Registry.of(settings, f"producing Avro orders to {topic}").client
    serializers = [AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})
                   for schema in (ORDER_AVRO_V1, ORDER_AVRO_V2)]
    ctx = SerializationContext(topic, MessageField.VALUE)
    rng = random.Random(seed)
    start = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    producer = Producer(settings.client_config(**{
        "transactional.id": f"kafka-eos.sample-avro.{topic}.{first_seq}", "partitioner": "murmur2_random", "linger.ms": 5}))
    producer.init_transactions(30)
    produced = []
    for first in range(first_seq, first_seq + count, per_transaction):
        producer.begin_transaction()
        for seq in range(first, min(first_seq + count, first + per_transaction)):
            evolved = evolve_at is not None and seq >= evolve_at
            record = avro_order(seq, rng, start, evolved)
            producer.produce(topic, key=record["customer_id"].encode(), value=serializers[evolved](record, ctx))
            produced.append(record)
        producer.commit_transaction(30)
    settle(settings, topic)
    return produced
