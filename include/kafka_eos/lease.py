"""Which mode owns a pipeline. A running stream holds a *lease*: membership of the consumer group
``<group_id>.stream``, subscribed to the pipeline's one-partition manifest topic, so that exactly
one member is assigned its partition. Kafka keeps the lease alive while the stream polls and ends
it ``session.timeout.ms`` after the process dies: nothing to clean up after a SIGKILL.

A batch run (the DAG, ``kafka-eos run``) asks :func:`stream_owner` first and steps aside while a
stream owns the pipeline; a stream refuses to start while another stream owns it, or while a batch
run's plan is in flight (:func:`batch_in_flight`). The lease keeps the two modes from fencing
each other back and forth; the commit protocol's fencing keeps either one exactly-once regardless.

The lease group is not the pipeline's checkpoint group (that one must never have members); it
never commits offsets, and its one partition is paused: it fetches nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Iterable
from datetime import datetime

from confluent_kafka import Consumer, KafkaException

from kafka_eos.errors import BrokerError, PipelineBusy
from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, admin_client, is_transient, retrying
from kafka_eos.manifest import PLANNED, ManifestStore
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

#: How long Kafka keeps the lease of a stream that stopped polling (killed, frozen): a restart
#: after a SIGKILL waits up to this long. Kafka's brokers accept 6 s to 30 min by default.
SESSION_TIMEOUT_MS = 10_000
#: A batch may run this long between two polls of the lease before Kafka takes it back
#: (librdkafka's max.poll.interval.ms; a stream polls between batches).
MAX_POLL_INTERVAL_MS = 3_600_000
#: A lease taken away by a rebalance and not given back within this long is lost.
LOST_AFTER_S = 2 * SESSION_TIMEOUT_MS / 1000
#: Client id prefix of a stream's lease member: ``kafka-eos-stream:<host>:<pid>``.
CLIENT_PREFIX = "kafka-eos-stream"
#: Client id prefix of a checkpoint refresh holding the lease for its commit.
REFRESH_PREFIX = "kafka-eos-refresh"


def lease_group(spec: PipelineSpec) -> str:
    return f"{spec.source.group_id}.stream"


@dataclass(frozen=True)
class StreamOwner:
    """The member of a pipeline's lease group: a running stream (or one that died less than
    the session timeout ago)."""

    client_id: str
    host: str
    member_id: str

    def describe(self) -> str:
        return f"{self.client_id} (member {self.member_id} from {self.host})"


def stream_owner(spec: PipelineSpec, settings: KafkaSettings) -> StreamOwner | None:
    """The stream that owns ``spec``'s pipeline now, or None.

    :raises BrokerError: the group cannot be described.
    """
    found = stream_owners([spec], settings)[spec.name]
    if isinstance(found, BrokerError):
        raise found
    return found


def stream_owners(specs: Iterable[PipelineSpec], settings: KafkaSettings) -> dict[str, StreamOwner | BrokerError | None]:
    """:func:`stream_owner` of each of ``specs`` (by pipeline name), their lease groups described
    in one request; a group that could not be described has its error in its place."""
    groups = {lease_group(spec): spec.name for spec in specs}
    if not groups:
        return {}

    def once() -> dict[str, object]:
        admin = admin_client(settings)  # kept alive while its futures are read
        futures = admin.describe_consumer_groups(list(groups), request_timeout=ADMIN_TIMEOUT_S)
        out: dict[str, object] = {}
        for group, future in futures.items():
            try:
                out[group] = future.result(timeout=ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                err = exc.args[0]
                if err.name() == "GROUP_ID_NOT_FOUND":
                    out[group] = None
                    continue
                error = BrokerError(f"describing lease group {group!r}: {err.name()} {err.str()}")
                error.__cause__ = exc
                if is_transient(error):  # a cold broker loads its group metadata: all again
                    raise error
                out[group] = error
        return out

    described = retrying(once)
    return {name: _owner_of(described[group]) for group, name in groups.items()}


def _owner_of(desc) -> StreamOwner | BrokerError | None:
    if desc is None or isinstance(desc, BrokerError):
        return desc
    members = sorted(desc.members, key=lambda m: not (m.assignment and m.assignment.topic_partitions))
    if not members:
        return None
    m = members[0]
    return StreamOwner(m.client_id, m.host, m.member_id)


def refuse_if_streaming(spec: PipelineSpec, settings: KafkaSettings, what: str = "batch runs wait") -> None:
    """For a batch run (or a reset): step aside while a stream owns the pipeline.

    :param what: who steps aside, in the message.
    :raises PipelineBusy: naming the stream.
    """
    owner = stream_owner(spec, settings)
    if owner is not None:
        raise PipelineBusy(f"pipeline {spec.name} is owned by a stream, {owner.describe()}: {what} until "
                           f"it stops (SIGTERM; a killed stream lets go within {SESSION_TIMEOUT_MS / 1000:g} s)")


def batch_in_flight(spec: PipelineSpec, settings: KafkaSettings, within_s: float) -> dict | None:
    """The newest run record when it is a stored plan not yet committed and younger than
    ``within_s`` (a batch run in flight, most likely), else None."""
    record = ManifestStore.of(spec, settings).last_run()
    if record is None or record.get("status") != PLANNED:
        return None
    plan = Plan.from_json(json.dumps(record["plan"]))
    if plan.is_empty:
        return None
    try:
        age = time.time() - datetime.fromisoformat(record.get("updated_at") or plan.created_at).timestamp()
    except ValueError:
        return None
    return record if age < within_s else None


class StreamLease:
    """The lease of one stream: :meth:`acquire` once, :meth:`keep` between batches (a poll),
    :meth:`release` at the end (leaves the group at once)."""

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, holder: str = CLIENT_PREFIX) -> None:
        """:param holder: who holds it, the start of its client id: a stream, or a checkpoint
        refresh that holds it for its commit (:func:`kafka_eos.pipeline.refresh_checkpoints`)."""
        self.spec = spec
        self.settings = settings
        self.client_id = f"{holder}:{socket.gethostname()}:{os.getpid()}"
        self._consumer: Consumer | None = None
        self._assigned = False
        self._rebalanced = False
        #: When the partition was last taken away (a rebalance), while it has not come back.
        self._revoked_at: float | None = None

    def acquire(self, wait_s: float = SESSION_TIMEOUT_MS / 1000 + 5) -> None:
        """Take the lease, waiting up to ``wait_s`` for a dead stream's lease to expire.

        :raises PipelineBusy: another stream holds it.
        """
        deadline = time.monotonic() + wait_s
        owner = stream_owner(self.spec, self.settings)
        while owner is not None and time.monotonic() < deadline:
            time.sleep(1.0)
            owner = stream_owner(self.spec, self.settings)
        if owner is not None:
            raise PipelineBusy(f"pipeline {self.spec.name} is already streaming in {owner.describe()}")
        ManifestStore.of(self.spec, self.settings).ensure_topic()
        self._consumer = Consumer(self.settings.client_config(**{
            "group.id": lease_group(self.spec), "client.id": self.client_id,
            "enable.auto.commit": False, "auto.offset.reset": "latest",
            "session.timeout.ms": SESSION_TIMEOUT_MS, "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        }))
        self._consumer.subscribe([self.spec.manifest_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_revoke)
        # Two streams that start together both join; one is assigned the partition. The other
        # sees the rebalance end with nothing assigned, and lets go.
        deadline = time.monotonic() + 2 * SESSION_TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            self._consumer.poll(0.2)
            if self._assigned:
                return
            if self._consumer.assignment() == [] and self._rebalanced:
                break
        self.release()
        owner = stream_owner(self.spec, self.settings)
        raise PipelineBusy(f"pipeline {self.spec.name} is already streaming"
                           + (f" in {owner.describe()}" if owner else ""))

    def _on_assign(self, consumer: Consumer, partitions) -> None:
        self._rebalanced = True
        self._assigned = bool(partitions)
        if partitions:
            self._revoked_at = None
            consumer.pause(partitions)  # membership is the lease; nothing to fetch

    def _on_revoke(self, _consumer: Consumer, partitions) -> None:
        # An eager rebalance (a member joins or leaves) takes the partition from everyone first:
        # lost only if it does not come back.
        if self._assigned and partitions:
            self._revoked_at = time.monotonic()
        self._assigned = False

    def keep(self) -> None:
        """Poll (Kafka counts a member that stops polling as gone).

        :raises PipelineBusy: the lease went to another member and did not come back within
            :data:`LOST_AFTER_S` (the commit protocol's fencing keeps both exactly-once meanwhile).
        """
        if self._consumer is None:
            return
        self._consumer.poll(0)
        if not self._assigned and self._revoked_at is not None \
                and time.monotonic() - self._revoked_at > LOST_AFTER_S:
            owner = stream_owner(self.spec, self.settings)
            raise PipelineBusy(f"pipeline {self.spec.name}: this stream lost its lease"
                               + (f" to {owner.describe()}" if owner else "") + "; stopping")

    def release(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()  # leaves the group: a batch run may go at once
            except (KafkaException, RuntimeError):
                pass
            self._consumer = None
            self._assigned = False
