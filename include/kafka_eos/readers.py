"""Read what a pipeline produced, the way its consumers will: read_committed, to the LSO."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, partition_offsets, partitions_of
from kafka_eos.settings import KafkaSettings


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_committed(settings: KafkaSettings, topic: str) -> list[Message]:
    """Every committed record of ``topic``, partition by partition, up to each LSO now."""
    n = partitions_of(settings, [topic])[topic]
    ends = partition_offsets(settings, [(topic, p) for p in range(n)])
    consumer = Consumer(settings.client_config(**{
        "group.id": f"kafka-eos.reader.{uuid.uuid4()}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    out: list[Message] = []
    try:
        todo = {p for p in range(n) if ends[(topic, p)].lso > ends[(topic, p)].log_start}
        consumer.assign([TopicPartition(topic, p, ends[(topic, p)].log_start) for p in todo])
        while todo:
            msg = consumer.poll(ADMIN_TIMEOUT_S)
            if msg is None:
                raise TimeoutError(f"{topic}: no record within {ADMIN_TIMEOUT_S}s before the LSO")
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise RuntimeError(f"{topic}-{msg.partition()}: {msg.error().str()}")
            out.append(Message(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                               dict(msg.headers() or [])))
            if msg.offset() + 1 >= ends[(topic, msg.partition())].lso:
                todo.discard(msg.partition())
    finally:
        consumer.close()
    return out
