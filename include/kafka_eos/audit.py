"""The audit trail: every change a person asks for outside a pipeline's own runs (aborting a
transaction, resetting a checkpoint) is recorded in one compacted topic, a record per change:
who, via what, when, what it was before and after."""

from __future__ import annotations

from kafka_eos.kafka_admin import ensure_compacted_topic
from kafka_eos.manifest import produce_json
from kafka_eos.settings import KafkaSettings

AUDIT_TOPIC = "kafka-eos.audit"
#: Kept a year: long enough to answer "who moved this and when" in a postmortem.
AUDIT_RETENTION_MS = 365 * 24 * 3600 * 1000


def write_audit(settings: KafkaSettings, key: str, record: dict) -> dict:
    """Write ``record`` under ``key`` (unique per change: compaction never folds two changes
    into one) to :data:`AUDIT_TOPIC`, creating the topic when missing; returns the record."""
    ensure_compacted_topic(settings, AUDIT_TOPIC, retention_ms=AUDIT_RETENTION_MS)
    produce_json(settings, AUDIT_TOPIC, [(key, record)])
    return record
