"""Read what a pipeline produced, the way its consumers will (read_committed, to the LSO), and
the first record at or after an offset (the age of a backlog or of an open transaction)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, TP, partition_offsets, partitions_of, reader_group
from kafka_eos.settings import KafkaSettings

log = logging.getLogger(__name__)


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
    return [Message(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), dict(msg.headers() or []))
            for msg in committed_messages(settings, topic)]


#: How long a reader waits for a transaction's markers: a producer's commit returns once the
#: coordinator has decided it, and the markers reach the partitions after (until then their LSO
#: is still at the transaction's first record, and a check read right after a run saw part of it).
SETTLE_S = 2.0


def settled_offsets(settings: KafkaSettings, tps: list, timeout_s: float = SETTLE_S, every_s: float = 0.05) -> dict:
    """:func:`partition_offsets` of ``tps`` once no partition has an open transaction (LSO at the
    high watermark), or as they are after ``timeout_s`` (a transaction that stays open)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ends = partition_offsets(settings, tps)
        if all(e.lso >= e.high_watermark for e in ends.values()) or time.monotonic() >= deadline:
            return ends
        time.sleep(every_s)


def settle(settings: KafkaSettings, topic: str, timeout_s: float = SETTLE_S) -> dict:
    """:func:`settled_offsets` of every partition of ``topic``: what a producer just committed or
    aborted there is what a read_committed reader (a plan) sees, once this returns."""
    n = partitions_of(settings, [topic])[topic]
    return settled_offsets(settings, [(topic, p) for p in range(n)], timeout_s)


def committed_messages(settings: KafkaSettings, topic: str) -> Iterator:
    """The committed records of ``topic`` (confluent-kafka messages), up to each partition's LSO
    once just-committed transactions are settled (:func:`settled_offsets`); a topic of millions is
    read in batches, never held whole."""
    ends = settle(settings, topic)
    yield from range_messages(settings, {tp: (e.log_start, e.lso) for tp, e in ends.items()})


def range_messages(settings: KafkaSettings, ranges: Mapping[TP, tuple[int, int]]) -> Iterator:
    """The committed records of each range ``[from, until)`` (confluent-kafka messages), read with a
    read_committed consumer in batches, up to the range's end or the partition's LSO, whichever
    comes first.

    :raises TimeoutError: no record within the admin timeout before a range's end.
    """
    todo = {tp: span for tp, span in ranges.items() if span[1] > span[0]}
    if not todo:
        return
    consumer = Consumer(settings.client_config(**{
        "group.id": reader_group("records"), "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    try:
        consumer.assign([TopicPartition(t, p, span[0]) for (t, p), span in todo.items()])
        idle_since = time.monotonic()
        while todo:
            # consume() waits for a full batch or its timeout: a short one, so a small range's
            # last records are not held back.
            batch = consumer.consume(10_000, 0.5)
            if not batch:
                if time.monotonic() - idle_since > ADMIN_TIMEOUT_S:
                    raise TimeoutError(f"{', '.join(f'{t}-{p}' for t, p in todo)}: no record within "
                                       f"{ADMIN_TIMEOUT_S}s before the range's end")
                continue
            idle_since = time.monotonic()
            for msg in batch:
                tp = (msg.topic(), msg.partition())
                if tp not in todo:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        del todo[tp]  # the LSO: nothing more to read (a range past it holds what is there)
                        continue
                    raise RuntimeError(f"{tp[0]}-{tp[1]}: {msg.error().str()}")
                if msg.offset() >= todo[tp][1]:  # past the end (the range ended in markers)
                    del todo[tp]
                    consumer.pause([TopicPartition(*tp)])
                    continue
                yield msg
                if msg.offset() + 1 >= todo[tp][1]:
                    del todo[tp]
                    consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.close()


def first_records(settings: KafkaSettings, offsets: Mapping[TP, int], committed: bool) -> dict[TP, tuple[int, int]]:
    """The first record at or after each given offset: ``{tp: (offset, timestamp ms)}``.

    :param committed: read_committed (the first committed record: aborted records are skipped,
        and nothing past the LSO is seen) or read_uncommitted (the record at the offset, open
        transactions included).
    :returns: only the partitions that have such a record and could be read in time; a
        partition the client may not read (no READ on the topic) is logged and left out.
    """
    if not offsets:
        return {}
    consumer = Consumer(settings.client_config(**{
        # A throwaway group id: the consumer never joins or commits (assign, not subscribe).
        "group.id": reader_group("records"),
        "enable.auto.commit": False,
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.partition.eof": True,
        # Answers as soon as a record is there: one record per partition is all this reads.
        "fetch.wait.max.ms": 10,
    }))
    found: dict[TP, tuple[int, int]] = {}
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        todo = set(offsets)
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            tp = (msg.topic(), msg.partition())
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    # Not permitted to read, or the record is gone: the caller says "unknown".
                    log.info("cannot read %s from offset %s: %s", msg.topic(), offsets.get(tp), msg.error().str())
                    if msg.topic() is None:
                        break
                    todo -= {t for t in todo if t[0] == msg.topic()}
                    continue
                todo.discard(tp)  # nothing at or after the offset (committed: before the LSO)
                continue
            if tp in todo:
                found[tp] = (msg.offset(), msg.timestamp()[1])
                todo.discard(tp)
                consumer.pause([TopicPartition(tp[0], tp[1])])
    finally:
        consumer.close()
    return found


def count_committed(settings: KafkaSettings, ranges: Mapping[TP, tuple[int, int]],
                    nth: Mapping[TP, int] | None = None) -> tuple[dict[TP, int], dict[TP, int]]:
    """How many committed records each range ``[from, until)`` holds now (:func:`range_messages`:
    offsets are not contiguous under transactions, so counted, never computed), and the offset of
    each range's ``nth[tp]``-th committed record (counting from 1) where it has one. A range whose
    start retention has deleted counts from the log start: the caller checks the log start first
    when that matters.

    :raises TimeoutError: no record within the admin timeout before a range's end.
    """
    counts = {tp: 0 for tp in ranges}
    marks: dict[TP, int] = {}
    nth = nth or {}
    for msg in range_messages(settings, ranges):
        tp = (msg.topic(), msg.partition())
        counts[tp] += 1
        if counts[tp] == nth.get(tp):
            marks[tp] = msg.offset()
    return counts, marks
