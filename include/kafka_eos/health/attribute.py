"""Who holds a stalled partition: Kafka's transaction admin API (KIP-664) through kafka-python's
``KafkaAdminClient`` (confluent-kafka has none of these calls).

Per partition, ``describe_producers`` gives the open transactions (producer id, epoch, first
offset, last write); ``list_transactions`` maps the producer id to its transactional.id and
``describe_transactions`` gives the coordinator's view. The verdict follows Kafka's own
``kafka-transactions.sh find-hanging``: *long-running* when the coordinator tracks this
producer's transaction on this partition (it aborts it at its timeout, if nobody commits it
first); *hanging* when the coordinator lists the producer's transactional.id but no longer tracks
this transaction on this partition (nothing will ever end it but an abort marker); *unlisted*
when ``list_transactions`` names no transactional.id for the producer at all. Unlisted is not
proof of a hanging transaction: the broker lists only the ids the client may DESCRIBE, so a
healthy transaction under an id the principal may not see is unlisted too.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Iterable

from kafka_eos.health.stall import Stall
from kafka_eos.kafka_admin import transaction_admin as admin  # kafka-python's: it lists and describes transactions
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

log = logging.getLogger(__name__)

HANGING, LONG_RUNNING, UNLISTED = "hanging", "long-running", "unlisted"
#: Coordinator states of a transaction still in progress.
_ACTIVE = {"Ongoing", "PrepareCommit", "PrepareAbort"}


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
                              "last_write": _iso(p.last_timestamp),
                              "last_write_ms": p.last_timestamp if p.last_timestamp >= 0 else None})
    return sorted(found, key=lambda t: t["start_offset"])


def describe(client, topic: str, partition: int, txn: dict, specs: Iterable[PipelineSpec]) -> dict:
    """``txn`` (from :func:`open_transactions`) with its transactional.id, the coordinator's view,
    the owning pipeline and the verdict."""
    pid = txn["producer_id"]
    listed = [t for ts in client.list_transactions(producer_id_filters=[pid]).values() for t in ts
              if t.producer_id == pid]
    out = {**txn, "transactional_id": None, "coordinator_state": None, "transaction_timeout_s": None,
           "transaction_started": None, "transaction_started_ms": None, "pipeline": None, "verdict": UNLISTED,
           "coordinator_id": None, "partitions": [f"{topic}-{partition}"]}
    if not listed:
        # No coordinator lists this producer: it forgot it (hanging), or the id is one this client
        # may not DESCRIBE (list_transactions leaves those out). Which one, nobody here can tell.
        return out
    txid = listed[0].transactional_id
    out.update(transactional_id=txid, pipeline=pipeline_of(txid, specs))
    desc = client.describe_transactions([txid]).get(txid)
    if desc is None:
        return out  # listed, but its coordinator's view could not be read: still unknown
    state = getattr(desc.state, "value", str(desc.state))
    started = desc.transaction_start_time_ms if desc.transaction_start_time_ms is not None and \
        desc.transaction_start_time_ms >= 0 else None
    tracked = {(tp.topic, tp.partition) for tp in desc.topic_partitions}
    out.update(coordinator_state=state, transaction_timeout_s=desc.transaction_timeout_ms / 1000,
               transaction_started=_iso(started), transaction_started_ms=started, verdict=HANGING,
               coordinator_id=getattr(desc, "coordinator_id", None),
               partitions=sorted(f"{t}-{p}" for t, p in tracked))
    if state in _ACTIVE and desc.producer_id == pid and (topic, partition) in tracked:
        out["verdict"] = LONG_RUNNING
    return out


def attribute(settings: KafkaSettings, stalls: list[Stall], specs: Iterable[PipelineSpec] = ()) -> list[Stall]:
    """Fill in each stall's ``culprit`` (the open transaction that starts at its LSO), or its
    ``attribution_error`` when the admin API is unavailable or not permitted. A stall attributed
    already (by :func:`kafka_eos.health.detect.observe`) only gets its pipeline named."""
    specs = list(specs)
    for s in stalls:
        if s.culprit is not None:
            s.culprit["pipeline"] = pipeline_of(s.culprit.get("transactional_id"), specs)
    stalls_left = [s for s in stalls if s.culprit is None and s.attribution_error is None]
    _attribute(settings, stalls_left, specs)
    return stalls


def _attribute(settings: KafkaSettings, stalls: list[Stall], specs: list[PipelineSpec]) -> None:
    if not stalls:
        return
    try:
        client = admin(settings)
    except Exception as exc:  # noqa: BLE001 - any failure: the stall is still reported
        for s in stalls:
            s.attribution_error = _why(exc)
        return
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


def _why(exc: BaseException) -> str:
    name = type(exc).__name__
    if "Authorization" in name or "authoriz" in str(exc).lower():
        return f"not permitted ({name}): the client needs DESCRIBE on the cluster and the topic"
    return f"transaction admin API unavailable ({name}: {str(exc).splitlines()[0] if str(exc) else ''})"


def _iso(ms: int | None) -> str | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")

