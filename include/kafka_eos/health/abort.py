"""Abort one named open transaction: the operator names the partition and the offset where the
transaction starts there, and nothing else is touched.

Two ways, best first. When the coordinator still tracks the transaction and its
transactional.id is known, ``init_transactions()`` under that id fences the producer and the
coordinator aborts the whole transaction cleanly, on every partition it wrote to. Otherwise
(a *hanging* transaction the coordinator no longer tracks) the partition leader is told to write
an abort marker for that producer (KIP-664 ``WriteTxnMarkers``, as ``kafka-transactions.sh
abort`` does). Either way the LSO must move past the start offset, or the abort failed.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

from confluent_kafka import KafkaException, Producer

from kafka_eos.errors import AbortFailed, NoOpenTransaction
from kafka_eos.health.attribute import LONG_RUNNING, admin, describe, open_transactions
from kafka_eos.audit import write_audit
from kafka_eos.kafka_admin import partition_offsets
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

log = logging.getLogger(__name__)


#: How long an abort may take to move the LSO: markers are written within milliseconds on a
#: healthy cluster; a coordinator busy with a load may take seconds.
ABORT_WAIT_S = 30.0


def find_open_transaction(settings: KafkaSettings, topic: str, partition: int, start_offset: int,
                          specs: Iterable[PipelineSpec] = ()) -> dict:
    """The open transaction that starts at ``start_offset`` on ``topic``-``partition``, described.

    :raises NoOpenTransaction: naming the partition, the offset and where the open ones start.
    """
    client = admin(settings)
    try:
        txns = open_transactions(client, topic, partition)
        match = [t for t in txns if t["start_offset"] == start_offset]
        if not match:
            starts = ", ".join(str(t["start_offset"]) for t in txns) or "none is open"
            raise NoOpenTransaction(f"{topic}-{partition}: no open transaction starts at offset {start_offset} "
                                    f"(open transactions start at: {starts})")
        return describe(client, topic, partition, match[0], specs)
    finally:
        client.close()


def abort_transaction(settings: KafkaSettings, topic: str, partition: int, txn: dict) -> dict:
    """Abort ``txn`` (from :func:`find_open_transaction`) and wait until the partition's LSO has
    moved past its start.

    :returns: what was done: ``method``, ``lso_before``, ``lso_after``, ``high_watermark``.
    :raises AbortFailed: the LSO is still at the transaction's start afterwards.
    """
    tp = (topic, partition)
    before = partition_offsets(settings, [tp])[tp].lso
    if txn["transactional_id"] and txn["verdict"] == LONG_RUNNING:
        # The coordinator owns it: fencing its id makes the coordinator abort it everywhere.
        producer = Producer(settings.client_config(**{"transactional.id": txn["transactional_id"]}))
        try:
            producer.init_transactions(ABORT_WAIT_S)
        except KafkaException as exc:
            log.warning("fencing %r failed (%s): writing an abort marker instead", txn["transactional_id"],
                        exc.args[0].str())
        else:
            moved = _wait_moved(settings, tp, txn["start_offset"])
            if moved is not None:
                return {"method": f"fenced transactional.id {txn['transactional_id']!r}: the coordinator "
                                  "aborted it", "lso_before": before, **moved}
    from kafka.admin import AbortTransactionSpec
    from kafka.structs import TopicPartition

    client = admin(settings)
    try:
        client.abort_transaction(AbortTransactionSpec(TopicPartition(topic, partition), txn["producer_id"],
                                                      txn["producer_epoch"], txn.get("coordinator_epoch", -1)))
    finally:
        client.close()
    moved = _wait_moved(settings, tp, txn["start_offset"])
    if moved is None:
        raise AbortFailed(f"{topic}-{partition}: the LSO is still at {txn['start_offset']} {ABORT_WAIT_S:g}s after "
                          f"aborting producer {txn['producer_id']} (epoch {txn['producer_epoch']})")
    return {"method": f"abort marker for producer {txn['producer_id']} epoch {txn['producer_epoch']}",
            "lso_before": before, **moved}


def _wait_moved(settings: KafkaSettings, tp, start_offset: int) -> dict | None:
    deadline = time.monotonic() + ABORT_WAIT_S
    while True:
        o = partition_offsets(settings, [tp])[tp]
        if o.lso > start_offset:
            return {"lso_after": o.lso, "high_watermark": o.high_watermark}
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def record_abort(settings: KafkaSettings, topic: str, partition: int, txn: dict, done: dict, who: str,
                 via: str) -> dict:
    """Write the audit record of an abort to the audit topic (:data:`kafka_eos.audit.AUDIT_TOPIC`) and return it."""
    from kafka_eos.manifest import now_iso

    record = {"action": "abort_transaction", "topic": topic, "partition": partition,
              "start_offset": txn["start_offset"], "transaction": txn, "who": who, "via": via, "at": now_iso(),
              "method": done["method"], "before": {"lso": done["lso_before"]},
              "after": {"lso": done["lso_after"], "high_watermark": done["high_watermark"]}}
    return write_audit(settings, f"abort:{topic}-{partition}@{txn['start_offset']}:{record['at']}", record)
