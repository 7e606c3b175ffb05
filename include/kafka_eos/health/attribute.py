"""Who holds a stalled partition: Kafka's transaction admin API (KIP-664) through kafka-python's
``KafkaAdminClient`` (confluent-kafka has none of these calls).

Per partition, ``describe_producers`` gives the open transactions (producer id, epoch, first
offset, last write); ``list_transactions`` maps the producer id to its transactional.id and
``describe_transactions`` gives the coordinator's view. The verdict follows Kafka's own
``kafka-transactions.sh find-hanging``: *hanging* when the coordinator no longer tracks this
producer's transaction on this partition (nothing will ever end it but an abort), else
*long-running* (the coordinator will abort it at its timeout, if nobody commits it first).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Iterable

from kafka_eos.health.detect import Stall
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

log = logging.getLogger(__name__)

HANGING, LONG_RUNNING = "hanging", "long-running"
#: Coordinator states of a transaction still in progress.
_ACTIVE = {"Ongoing", "PrepareCommit", "PrepareAbort"}


def admin(settings: KafkaSettings):
    """A kafka-python admin client for ``settings`` (close it after use)."""
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**settings.kafka_python_config(), client_id="kafka-eos-health")


def pipeline_of(transactional_id: str | None, specs: Iterable[PipelineSpec]) -> str | None:
    """The pipeline whose transactions use ``transactional_id`` (its group id, or the group id
    and ``|topic|partition`` in per_partition scope), or None for a stranger."""
    if not transactional_id:
        return None
    for spec in specs:
        base = spec.transactional_id()
        if transactional_id == base or transactional_id.startswith(base + "|"):
            return spec.name
    return None


def open_transactions(client, topic: str, partition: int) -> list[dict]:
    """The open transactions on one partition, oldest first, as Kafka's producer state sees them."""
    from kafka.structs import TopicPartition

    states = client.describe_producers([TopicPartition(topic, partition)])
    found = []
    for state in states.values():
        for p in state.active_producers:
            if p.current_transaction_start_offset >= 0:
                found.append({"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                              "coordinator_epoch": p.coordinator_epoch,
                              "start_offset": p.current_transaction_start_offset,
                              "last_write": _iso(p.last_timestamp)})
    return sorted(found, key=lambda t: t["start_offset"])


def describe(client, topic: str, partition: int, txn: dict, specs: Iterable[PipelineSpec]) -> dict:
    """``txn`` (from :func:`open_transactions`) with its transactional.id, the coordinator's view,
    the owning pipeline and the verdict."""
    pid = txn["producer_id"]
    listed = [t for ts in client.list_transactions(producer_id_filters=[pid]).values() for t in ts
              if t.producer_id == pid]
    out = {**txn, "transactional_id": None, "coordinator_state": None, "transaction_timeout_s": None,
           "transaction_started": None, "pipeline": None, "verdict": HANGING}
    if not listed:
        return out  # the coordinator knows no transaction of this producer: nothing will end it
    txid = listed[0].transactional_id
    out.update(transactional_id=txid, pipeline=pipeline_of(txid, specs))
    desc = client.describe_transactions([txid]).get(txid)
    if desc is None:
        return out
    state = getattr(desc.state, "value", str(desc.state))
    out.update(coordinator_state=state, transaction_timeout_s=desc.transaction_timeout_ms / 1000,
               transaction_started=_iso(desc.transaction_start_time_ms))
    tracked = {(tp.topic, tp.partition) for tp in desc.topic_partitions}
    if state in _ACTIVE and desc.producer_id == pid and (topic, partition) in tracked:
        out["verdict"] = LONG_RUNNING
    return out


def attribute(settings: KafkaSettings, stalls: list[Stall], specs: Iterable[PipelineSpec] = ()) -> list[Stall]:
    """Fill in each stall's ``culprit`` (the open transaction that starts at its LSO), or its
    ``attribution_error`` when the admin API is unavailable or not permitted."""
    if not stalls:
        return stalls
    specs = list(specs)
    try:
        client = admin(settings)
    except Exception as exc:  # noqa: BLE001 - any failure: the stall is still reported
        for s in stalls:
            s.attribution_error = _why(exc)
        return stalls
    try:
        for s in stalls:
            try:
                txns = open_transactions(client, s.topic, s.partition)
                pinning = [t for t in txns if t["start_offset"] == s.lso] or txns[:1]
                if not pinning:
                    s.attribution_error = "no open transaction found on the partition (it may just have ended)"
                    continue
                s.culprit = describe(client, s.topic, s.partition, pinning[0], specs)
            except Exception as exc:  # noqa: BLE001 - one partition's failure spoils no other
                log.info("attribution of %s-%s failed", s.topic, s.partition, exc_info=True)
                s.attribution_error = _why(exc)
    finally:
        client.close()
    return stalls


def _why(exc: BaseException) -> str:
    name = type(exc).__name__
    if "Authorization" in name or "authoriz" in str(exc).lower():
        return f"not permitted ({name}): the client needs DESCRIBE on the cluster and the topic"
    return f"transaction admin API unavailable ({name}: {str(exc).splitlines()[0] if str(exc) else ''})"


def _iso(ms: int | None) -> str | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")

