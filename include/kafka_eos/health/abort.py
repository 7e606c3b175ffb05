"""Abort one named open transaction: the operator names the partition and the offset where the
transaction starts there, and nothing else is touched.

Guards first (:func:`check_abort`), because the command can reach any transaction on any topic:

- **Age.** A transaction younger than its threshold is refused unless forced. The default
  threshold is the larger of the brokers' ``transaction.max.timeout.ms`` and the owning
  pipeline's ``sink.transaction_timeout_s``: until then, a healthy producer may still commit, and
  its coordinator will abort it at its own timeout anyway. The age is the broker's: the
  coordinator's start time of the transaction; only for a transaction no coordinator describes
  is it the producer's last write (its own clock), the one clock left.
- **Whose it is.** A transaction its coordinator tracks is ended through the coordinator:
  ``init_transactions()`` under its transactional.id fences the producer and the coordinator
  aborts the whole transaction, on every partition it wrote to. If fencing fails, the abort
  fails; it never falls back to a marker, which would end the transaction on one partition and
  leave the rest of it to commit. A partition's abort marker (KIP-664 ``WriteTxnMarkers``, as
  ``kafka-transactions.sh abort`` writes it) is for a producer the coordinator no longer tracks
  on that partition (*hanging*). A producer that ``list_transactions`` does not list at all may
  be one (a coordinator forgot it) or a healthy transaction under an id this client may not
  DESCRIBE; it gets a marker only once it is older than any coordinator would let a transaction
  live (``transaction.max.timeout.ms`` and :data:`UNLISTED_MARGIN_S`), and ``--force`` does not
  lift that.

Done means this producer's transaction is no longer open on the partition. When an older open
transaction sits before it, the LSO stays where that one starts: the abort succeeded and says so.
Every attempt that is not a dry run, refused, failed or done, writes its audit record
(:func:`attempt_abort`).
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

from confluent_kafka import KafkaException, Producer

from kafka_eos.audit import write_audit
from kafka_eos.errors import AbortFailed, AbortRefused, KafkaEosError, NoOpenTransaction
from kafka_eos.health.attribute import HANGING, LONG_RUNNING, UNLISTED, admin, describe, open_transactions
from kafka_eos.kafka_admin import partition_offsets, transaction_max_timeout_ms
from kafka_eos.manifest import now_iso
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

log = logging.getLogger(__name__)


#: How long an abort may take to end the transaction: markers are written within milliseconds on
#: a healthy cluster; a coordinator busy with a load may take seconds.
ABORT_WAIT_S = 30.0
#: How much longer than ``transaction.max.timeout.ms`` an unlisted producer's transaction must be
#: open before a marker may end it: the coordinator's abort of an expired transaction runs on a
#: timer (``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default) and
#: its markers take a moment more.
UNLISTED_MARGIN_S = 60.0


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


def transaction_age(txn: dict, now_ms: int | None = None) -> tuple[float | None, str]:
    """How long ``txn`` has been open (seconds, or None when nothing says) and by whose clock."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if txn["verdict"] == LONG_RUNNING and txn.get("transaction_started_ms") is not None:
        return max(0.0, (now_ms - txn["transaction_started_ms"]) / 1000), "its coordinator's start time"
    if txn.get("last_write_ms") is not None:
        return max(0.0, (now_ms - txn["last_write_ms"]) / 1000), "the producer's last write (its own clock)"
    return None, "nothing (no start time, no last write)"


def check_abort(settings: KafkaSettings, topic: str, partition: int, txn: dict, *, older_than_s: float | None = None,
                force: bool = False, specs: Iterable[PipelineSpec] = (), now_ms: int | None = None) -> dict:
    """The guards of an abort (see the module's text).

    :param older_than_s: the age threshold; default the larger of the brokers'
        ``transaction.max.timeout.ms`` and the owning pipeline's ``transaction_timeout_s``.
    :param force: abort a transaction younger than the threshold.
    :returns: ``method`` (``fence`` or ``marker``), ``age_s``, ``age_from``, ``threshold_s``,
        ``forced``.
    :raises AbortRefused: one line naming the partition, the offset and what would lift the refusal.
    """
    where = f"{topic}-{partition}: the transaction at offset {txn['start_offset']}"
    max_timeout_s = transaction_max_timeout_ms(settings) / 1000
    if older_than_s is None:
        timeouts = [s.sink.transaction_timeout_s for s in specs if s.name == txn.get("pipeline")]
        older_than_s = max([max_timeout_s, *timeouts])
    age, age_from = transaction_age(txn, now_ms)
    method = "fence" if txn["verdict"] == LONG_RUNNING else "marker"
    if txn["verdict"] == LONG_RUNNING and not txn.get("transactional_id"):
        raise AbortRefused(f"{where} is tracked by its coordinator, but its transactional.id is unknown: it "
                           f"cannot be fenced, and a marker would end it on this partition only")
    if txn["verdict"] == UNLISTED:
        needed = max_timeout_s + UNLISTED_MARGIN_S
        if age is None or age < needed:
            raise AbortRefused(
                f"{where} (producer {txn['producer_id']}) is listed by no coordinator, yet open for only "
                f"{_secs(age)}: its coordinator may track it under a transactional.id this client may not "
                f"DESCRIBE, and a marker would end it on this partition only; grant DESCRIBE on transactional "
                f"ids (it is then fenced through its coordinator), or wait until it is older than {needed:g}s "
                f"(the brokers' transaction.max.timeout.ms and {UNLISTED_MARGIN_S:g}s); --force does not lift this")
    if not force and (age is None or age < older_than_s):
        raise AbortRefused(
            f"{where} has been open for only {_secs(age)} (by {age_from}), under the abort threshold of "
            f"{older_than_s:g}s (the larger of the brokers' transaction.max.timeout.ms and the pipeline's "
            f"transaction_timeout_s): a healthy producer may still commit it, and its coordinator aborts it at "
            f"its timeout; wait, or abort it anyway with --force (the runbook's force)")
    return {"method": method, "age_s": age, "age_from": age_from, "threshold_s": older_than_s,
            "forced": bool(force and (age is None or age < older_than_s))}


def abort_transaction(settings: KafkaSettings, topic: str, partition: int, txn: dict) -> dict:
    """End ``txn`` (from :func:`find_open_transaction`, passed by :func:`check_abort`): fence a
    tracked one's transactional.id, else write the partition's abort marker; then wait until it is
    no longer open on the partition.

    :returns: what was done: ``method``, ``lso_before``, ``lso_after``, ``high_watermark`` and, when
        an older open transaction still holds the LSO, ``held_by_older`` (its start and producer).
    :raises AbortFailed: fencing failed (no marker is written then), or the transaction is still open.
    """
    tp = (topic, partition)
    before = partition_offsets(settings, [tp])[tp].lso
    if txn["verdict"] == LONG_RUNNING:
        txid = txn["transactional_id"]
        # The coordinator owns it: fencing its id makes the coordinator abort it everywhere.
        producer = Producer(settings.client_config(**{"transactional.id": txid}))
        try:
            producer.init_transactions(ABORT_WAIT_S)
        except KafkaException as exc:
            raise AbortFailed(f"{topic}-{partition}: fencing transactional.id {txid!r} failed "
                              f"({exc.args[0].str()}); no abort marker was written, as the coordinator tracks this "
                              f"transaction and a marker would end it on this partition only") from exc
        method = f"fenced transactional.id {txid!r}: the coordinator aborted it"
    elif txn["verdict"] in (HANGING, UNLISTED):
        from kafka.admin import AbortTransactionSpec
        from kafka.structs import TopicPartition

        client = admin(settings)
        try:
            client.abort_transaction(AbortTransactionSpec(TopicPartition(topic, partition), txn["producer_id"],
                                                          txn["producer_epoch"], txn.get("coordinator_epoch", -1)))
        finally:
            client.close()
        method = f"abort marker for producer {txn['producer_id']} epoch {txn['producer_epoch']}"
    else:  # pragma: no cover - describe() gives one of the three
        raise AbortFailed(f"{topic}-{partition}: unknown verdict {txn['verdict']!r}; nothing was changed")
    ended = _wait_ended(settings, topic, partition, txn)
    if ended is None:
        raise AbortFailed(f"{topic}-{partition}: the transaction at offset {txn['start_offset']} (producer "
                          f"{txn['producer_id']}) is still open {ABORT_WAIT_S:g}s after: {method}")
    return {"method": method, "lso_before": before, **ended}


def _wait_ended(settings: KafkaSettings, topic: str, partition: int, txn: dict) -> dict | None:
    """Wait until ``txn`` is no longer open on the partition; then its offsets and any older open
    transaction that still holds the LSO."""
    tp = (topic, partition)
    deadline = time.monotonic() + ABORT_WAIT_S
    client = admin(settings)
    try:
        while True:
            still = open_transactions(client, topic, partition)
            if not any(t["producer_id"] == txn["producer_id"] and t["start_offset"] == txn["start_offset"]
                       for t in still):
                o = partition_offsets(settings, [tp])[tp]
                older = [t for t in still if t["start_offset"] < txn["start_offset"]]
                out = {"lso_after": o.lso, "high_watermark": o.high_watermark, "held_by_older": None}
                if older and o.lso <= older[0]["start_offset"]:
                    out["held_by_older"] = {"start_offset": older[0]["start_offset"],
                                            "producer_id": older[0]["producer_id"]}
                return out
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
    finally:
        client.close()


def outcome_text(record: dict) -> str:
    """One line for a person, from a done abort's audit record: how it was aborted and where the
    LSO is now."""
    text = (f"{record['method']}; LSO {record['before']['lso']} -> {record['after']['lso']} (high watermark "
            f"{record['after']['high_watermark']})")
    older = record.get("held_by_older")
    if older:
        text += (f"; the LSO stays at {record['after']['lso']}: an older open transaction (producer "
                 f"{older['producer_id']}, starting at offset {older['start_offset']}) still holds the partition")
    return text


def attempt_abort(settings: KafkaSettings, topic: str, partition: int, start_offset: int, *, who: str, via: str,
                  specs: Iterable[PipelineSpec] = (), older_than_s: float | None = None,
                  force: bool = False) -> dict:
    """Find, check and abort the transaction at ``start_offset``, and write the audit record of the
    attempt whatever its outcome (``aborted``, ``refused`` or ``failed``).

    :returns: the audit record of a done abort (``done`` holds :func:`abort_transaction`'s answer).
    :raises KafkaEosError: the refusal or failure, after its audit record is written.
    """
    txn, guard = checked_abort(settings, topic, partition, start_offset, who=who, via=via, specs=specs,
                               older_than_s=older_than_s, force=force)
    try:
        done = abort_transaction(settings, topic, partition, txn)
    except Exception as exc:
        _record_unsuccessful(settings, topic, partition, start_offset, txn, guard, who, via, exc)
        raise
    return record_abort(settings, topic, partition, start_offset, txn, done, who=who, via=via, guard=guard,
                        outcome="aborted")


def checked_abort(settings: KafkaSettings, topic: str, partition: int, start_offset: int, *, who: str, via: str,
                  specs: Iterable[PipelineSpec] = (), older_than_s: float | None = None,
                  force: bool = False) -> tuple[dict, dict]:
    """Find the transaction at ``start_offset`` and pass it through the abort's guards
    (:func:`check_abort`), changing nothing: what a person is asked to approve. A refusal is audited
    as an attempt (outcome ``refused``) before it is raised.

    :returns: (the transaction, the guard's answer).
    """
    specs = list(specs)
    txn = guard = None
    try:
        txn = find_open_transaction(settings, topic, partition, start_offset, specs)
        guard = check_abort(settings, topic, partition, txn, older_than_s=older_than_s, force=force, specs=specs)
    except Exception as exc:
        _record_unsuccessful(settings, topic, partition, start_offset, txn, guard, who, via, exc)
        raise
    return txn, guard


def _record_unsuccessful(settings: KafkaSettings, topic: str, partition: int, start_offset: int, txn: dict | None,
                         guard: dict | None, who: str, via: str, exc: Exception) -> None:
    outcome = "refused" if isinstance(exc, (AbortRefused, NoOpenTransaction)) else "failed"
    error = str(exc) if isinstance(exc, KafkaEosError) else f"{type(exc).__name__}: {exc}"
    try:
        record_abort(settings, topic, partition, start_offset, txn, None, who=who, via=via, guard=guard,
                     outcome=outcome, error=error)
    except Exception:  # noqa: BLE001 - the abort's own error is the one to raise
        log.exception("%s-%s@%s: the audit record of a %s abort could not be written", topic, partition,
                      start_offset, outcome)


def record_abort(settings: KafkaSettings, topic: str, partition: int, start_offset: int, txn: dict | None,
                 done: dict | None, who: str, via: str, guard: dict | None = None, outcome: str = "aborted",
                 error: str | None = None) -> dict:
    """Write the audit record of an abort attempt to the audit topic
    (:data:`kafka_eos.audit.AUDIT_TOPIC`) and return it."""
    record = {"action": "abort_transaction", "outcome": outcome, "topic": topic, "partition": partition,
              "start_offset": start_offset, "transaction": txn, "guard": guard, "who": who, "via": via,
              "at": now_iso(), "method": None, "before": None, "after": None, "held_by_older": None,
              "error": error}
    if done is not None:
        record.update(method=done["method"], before={"lso": done["lso_before"]}, held_by_older=done["held_by_older"],
                      after={"lso": done["lso_after"], "high_watermark": done["high_watermark"]})
    return write_audit(settings, f"abort:{topic}-{partition}@{start_offset}:{record['at']}", record)


def _secs(age: float | None) -> str:
    return "an unknown time" if age is None else f"{age:.0f}s"
