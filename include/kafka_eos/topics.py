"""The topics a pipeline needs, with their settings; ``kafka-eos topics create`` and ``validate``.

Roles and settings (replication: the cluster's brokers, at most 3; with 3, ``min.insync.replicas``
2 so an acknowledged write survives the loss of one broker):

- ``source``: created only when missing (normally another team's topic), with ``--partitions``;
- ``sink``: as many partitions as the (first) source, so per_partition commits keep the spread;
- ``dead letters``, ``backfill``, ``backfill dead letters``: as many partitions as the sink;
- ``manifest``: the run manifest, one partition, compacted (``compact,delete``, 30 days, hourly
  segments), as kafka-eos creates it itself on first use;
- ``audit``: ``kafka-eos.audit``, one partition, compacted, a year.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_RETENTION_MS, AUDIT_TOPIC
from kafka_eos.manifest import MANIFEST_RETENTION_MS, MANIFEST_SEGMENT_MS
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

#: Partitions of a missing source topic when none is given.
DEFAULT_PARTITIONS = 3


@dataclass(frozen=True)
class TopicPlan:
    """One topic a pipeline uses: what it is for, and what it has or would get."""

    name: str
    role: str
    partitions: int
    replication: int
    config: dict[str, str] = field(default_factory=dict)
    #: Partitions it has now; None: missing.
    existing: int | None = None

    @property
    def missing(self) -> bool:
        return self.existing is None


def pipeline_topics(spec: PipelineSpec, settings: KafkaSettings,
                    partitions: int | None = None) -> list[TopicPlan]:
    """Every topic of ``spec``, read against the cluster: which exist (and with how many
    partitions), and what a missing one would be created with."""
    sink = spec.sink
    names = [*spec.source.topics, sink.topic, sink.dlq_topic, sink.backfill_topic, sink.backfill_dlq_topic,
             spec.manifest_topic, AUDIT_TOPIC]
    existing = kafka_admin.topics_metadata(settings, [t for t in names if t]).partitions
    replication = kafka_admin.default_replication(kafka_admin.broker_count(settings))
    durable = {"min.insync.replicas": "2"} if replication >= 3 else {}
    source_partitions = existing.get(spec.source.topics[0]) or partitions or DEFAULT_PARTITIONS
    roles: list[tuple[str, str, int, dict[str, str]]] = [
        (t, "source", existing.get(t) or partitions or DEFAULT_PARTITIONS, durable) for t in spec.source.topics]
    data = [(sink.topic, "sink"), (sink.dlq_topic, "dead letters"), (sink.backfill_topic, "backfill"),
            (sink.backfill_dlq_topic, "backfill dead letters")]
    roles += [(t, role, source_partitions, durable) for t, role in data if t]
    roles.append((spec.manifest_topic, "manifest", 1,
                  {**durable, **kafka_admin.compacted_config(MANIFEST_RETENTION_MS, MANIFEST_SEGMENT_MS)}))
    roles.append((AUDIT_TOPIC, "audit", 1, {**durable, **kafka_admin.compacted_config(AUDIT_RETENTION_MS)}))
    seen: set[str] = set()
    plans = []
    for name, role, count, config in roles:
        if name in seen:
            continue
        seen.add(name)
        plans.append(TopicPlan(name, role, existing.get(name, count), replication, dict(config), existing.get(name)))
    return plans


def create_missing(settings: KafkaSettings, plans: list[TopicPlan]) -> list[TopicPlan]:
    """Create the missing topics of ``plans`` (existing ones are left as they are); returns those
    created, once each partition has a leader."""
    missing = [p for p in plans if p.missing]
    for plan in missing:
        kafka_admin.create_topic(settings, plan.name, plan.partitions, plan.replication, plan.config)
    return missing
