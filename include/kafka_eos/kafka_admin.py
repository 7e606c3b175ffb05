"""Reads of cluster state the planner and the commit protocol need, through confluent-kafka's
AdminClient: partitions of topics, offsets (log start, LSO, high watermark) and group offsets.

Isolation is always explicit (DESIGN.md §2): librdkafka's ``list_offsets`` defaults to
READ_UNCOMMITTED, which is the high watermark, not the last stable offset.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kafka_eos.errors import BrokerError, TopicMissing
from kafka_eos.settings import KafkaSettings

#: Admin calls on a healthy cluster answer in well under a second; 30 s covers a coordinator move.
ADMIN_TIMEOUT_S = 30.0

TP = tuple[str, int]

#: Errors that clear by themselves: a coordinator loading or moving, a leader being elected, a
#: pending transactional offset commit (require_stable). Some arrive with retriable() False.
_TRANSIENT = frozenset({
    "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
    "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_TOPIC_OR_PART",
    "UNSTABLE_OFFSET_COMMIT", "REQUEST_TIMED_OUT", "_TIMED_OUT",
})


@dataclass(frozen=True)
class PartitionOffsets:
    """Offsets of one partition, read at one moment."""

    log_start: int
    lso: int  # last stable offset (READ_COMMITTED latest)
    high_watermark: int  # READ_UNCOMMITTED latest


def admin_client(settings: KafkaSettings) -> AdminClient:
    return AdminClient(settings.client_config())


def _result(future, what: str):
    try:
        return future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        err = exc.args[0]
        raise BrokerError(f"{what}: {err.name()} ({err.str()})") from exc


def _retrying(call):
    """Run ``call`` again while it fails with a retriable Kafka error (a leader moving, a topic
    just created), for up to :data:`ADMIN_TIMEOUT_S`."""
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        try:
            return call()
        except BrokerError as exc:
            cause = exc.__cause__
            retriable = isinstance(cause, KafkaException) and (
                cause.args[0].retriable() or cause.args[0].name() in _TRANSIENT)
            if not retriable or time.monotonic() > deadline:
                raise
            # Leader elections on a healthy cluster take tens of milliseconds.
            time.sleep(0.2)


def partitions_of(admin: AdminClient, topics: Iterable[str], role: str = "topic") -> dict[str, int]:
    """Number of partitions per topic.

    :raises TopicMissing: naming the first topic that does not exist and its role.
    """
    md = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    out = {}
    for topic in topics:
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None:
            raise TopicMissing(f"{role} topic {topic!r} does not exist on {admin_brokers(md)}")
        out[topic] = len(tmd.partitions)
    return out


def admin_brokers(md) -> str:
    return ",".join(f"{b.host}:{b.port}" for b in md.brokers.values()) or "the cluster"


def ensure_compacted_topic(admin: AdminClient, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` compacted when it is missing (the run manifest topic)."""
    md = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    if topic in md.topics and md.topics[topic].error is None:
        return
    replication = min(3, len(md.brokers)) or 1
    fut = admin.create_topics([NewTopic(topic, partitions, replication,
                                        config={"cleanup.policy": "compact"})])[topic]
    try:
        fut.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise BrokerError(f"creating manifest topic {topic!r}: {exc.args[0].str()}") from None


def create_topics(admin: AdminClient, topics: Mapping[str, int], config: Mapping[str, str] | None = None) -> None:
    """Create topics (name -> partitions) with replication 1 when missing; existing ones are kept."""
    md = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    new = [NewTopic(t, n, 1, config=dict(config or {})) for t, n in topics.items() if t not in md.topics]
    if not new:
        return
    for topic, fut in admin.create_topics(new).items():
        try:
            fut.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise BrokerError(f"creating topic {topic!r}: {exc.args[0].str()}") from None


def partition_offsets(admin: AdminClient, tps: Iterable[TP]) -> dict[TP, PartitionOffsets]:
    """Log start, LSO and high watermark of each partition."""
    tps = list(tps)
    if not tps:
        return {}

    def query(spec: OffsetSpec, isolation: IsolationLevel) -> dict[TP, int]:
        def once() -> dict[TP, int]:
            futs = admin.list_offsets({TopicPartition(t, p): spec for t, p in tps},
                                      isolation_level=isolation, request_timeout=ADMIN_TIMEOUT_S)
            return {(tp.topic, tp.partition): _result(f, f"list_offsets {tp.topic}-{tp.partition}").offset
                    for tp, f in futs.items()}

        return _retrying(once)

    start = query(OffsetSpec.earliest(), IsolationLevel.READ_COMMITTED)
    lso = query(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    hw = query(OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    return {tp: PartitionOffsets(start[tp], lso[tp], hw[tp]) for tp in tps}


def _group_client(settings: KafkaSettings, group_id: str) -> Consumer:
    """A consumer of ``group_id`` that never joins it (no subscribe): it only fetches and commits
    offsets. Group offsets go through a consumer rather than the AdminClient: librdkafka 2.16's
    admin OffsetFetch/OffsetCommit path dereferences a missing consumer-group handle on
    coordinator errors (a segfault seen while __consumer_offsets was still loading)."""
    return Consumer(settings.client_config(**{
        "group.id": group_id, "enable.auto.commit": False,
        # read_committed makes librdkafka ask for stable offsets (KIP-447 require_stable):
        # a pending transactional offset commit is waited out, never read half-done.
        "isolation.level": "read_committed",
    }))


def committed_offsets(settings: KafkaSettings, group_id: str, tps: Iterable[TP]) -> dict[TP, int | None]:
    """The group's committed offsets (stable: pending transactional commits are waited out).

    :returns: tp -> next offset to read, or None where the group has no offset.
    """
    tps = list(tps)
    if not tps:
        return {}
    consumer = _group_client(settings, group_id)
    try:
        def once():
            try:
                res = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                raise BrokerError(f"committed offsets of group {group_id!r}: {exc.args[0].str()}") from exc
            _raise_partition_errors(res, f"committed offset in group {group_id!r}")
            return res

        res = _retrying(once)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in res}


def _raise_partition_errors(tps, what: str) -> None:
    for tp in tps:
        if tp.error is not None:
            raise BrokerError(f"{what}, {tp.topic}-{tp.partition}: {tp.error.name()} ({tp.error.str()})") \
                from KafkaException(tp.error)


def alter_group_offsets(settings: KafkaSettings, group_id: str, offsets: Mapping[TP, int]) -> None:
    """Set the group's offsets (the Kafka mirror of a SQL sink's checkpoint; the group has no
    members, so a plain offset commit outside any generation is accepted)."""
    if not offsets:
        return
    consumer = _group_client(settings, group_id)
    try:
        def once():
            try:
                res = consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                      asynchronous=False)
            except KafkaException as exc:
                raise BrokerError(f"mirroring checkpoint to group {group_id!r}: {exc.args[0].str()}") from exc
            _raise_partition_errors(res or [], f"mirroring checkpoint to group {group_id!r}")

        _retrying(once)
    finally:
        consumer.close()
