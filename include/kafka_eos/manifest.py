"""The run manifest: one single-partition topic per pipeline (``kafka-eos.manifest.<pipeline>``),
``compact,delete``, of JSON records. It is the pipeline's audit trail and its memory:

- ``<pipeline>:<run id>``: the run's plan (status ``planned``, written before anything runs, outside
  any transaction), then its summary (``committed`` / ``noop``). Every run record carries the plan.
- ``<pipeline>:<run id>:<topic>-<p>``: per_partition scope, one per source partition, written
  inside that partition's transaction.
- ``<pipeline>:checkpoint:<topic>-<p>``: the last checkpoint kafka-eos committed for a source
  partition, written inside the transaction that commits it (Kafka sinks).
- ``<pipeline>:starts``: where the pipeline's first plan started each partition.
- ``<pipeline>:hold``: a range a run found committed short (``held``), until an operator
  acknowledges it (the same record, ``held`` false, with who and when): while held, nothing plans.
- ``<pipeline>:state``: a snapshot of the memory above (checkpoints, starts, the hold) as read up
  to offset ``read_upto``; a ``reset`` snapshot forgets the checkpoints and starts before it (not
  the hold).

Every lookup walks the topic backwards from its end and stops at the first record that settles
it (the newest plan, the newest run record, the newest snapshot's ``read_upto``), so its cost does
not grow with the number of runs; a state lookup that had to read far writes a new snapshot. A
topic per pipeline means no other pipeline's open transaction pins its LSO; plans are looked up
read_uncommitted (they are never written in a transaction), so not even the pipeline's own
killed attempt hides them, nor one of its side runs (replays, backfills: their partition records
are written in their transactions); a hold is looked for above the LSO the same way.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterator

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_eos.errors import BrokerError, PlanError
from kafka_eos.kafka_admin import (ADMIN_TIMEOUT_S, TP, PartitionOffsets, admin_client, ensure_compacted_topic,
                                  partition_offsets, reader_group, set_topic_config)
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from kafka_eos.spec import PipelineSpec

PLANNED, COMMITTED, NOOP = "planned", "committed", "noop"

#: Records read by the first step of a backwards walk; each further step reads twice as many,
#: up to MAX_TAIL_STEP. Lookups settle within a few records of the end (a run writes a plan, a
#: summary and a few records per partition), so the first step is usually all.
TAIL_STEP = 16
MAX_TAIL_STEP = 1024
#: A state lookup that read more records than this writes a fresh snapshot, so the next one
#: stops sooner: lookups cost the same after 100,000 runs as after 10.
SNAPSHOT_AFTER = 200
#: How long manifest records are kept (``compact,delete``): the audit trail of 30 days of runs.
MANIFEST_RETENTION_MS = 30 * 24 * 3600 * 1000
#: Segments of a manifest roll at least this often: compaction leaves the active segment alone, and
#: a stream writes its progress and checkpoint records once per batch under the same few keys.
MANIFEST_SEGMENT_MS = 3600 * 1000
#: A snapshot older than this is written again, however short the lookups, so retention never
#: deletes the newest snapshot of a pipeline that plans at least this often.
SNAPSHOT_MAX_AGE_S = MANIFEST_RETENTION_MS / 1000 / 4


#: The run id of every batch of a stream (:mod:`kafka_eos.stream.loop`): its records replace each other.
STREAM_RUN_ID = "stream"
#: Run ids a batch run may not take, nor begin with followed by ``:``: the keys of the pipeline's
#: own records (``checkpoint``, ``starts``, ``state``, ``hold``, a side run's ``side``) and the
#: stream's run id.
RESERVED_RUN_IDS = frozenset({"checkpoint", "starts", "state", "hold", "side", STREAM_RUN_ID})


def reserved_run_id(run_id: str) -> bool:
    """Whether a run of this id would write under a key of the pipeline's own records."""
    return run_id.split(":", 1)[0] in RESERVED_RUN_IDS


def run_key(pipeline: str, run_id: str) -> str:
    return f"{pipeline}:{run_id}"


def partition_key(pipeline: str, run_id: str, topic: str, partition: int) -> str:
    return f"{pipeline}:{run_id}:{topic}-{partition}"


def checkpoint_key(pipeline: str, topic: str, partition: int) -> str:
    """Key of the last checkpoint kafka-eos committed for one source partition."""
    return f"{pipeline}:checkpoint:{topic}-{partition}"


def starts_key(pipeline: str) -> str:
    """Key of the starting offsets the pipeline's first plan chose."""
    return f"{pipeline}:starts"


def state_key(pipeline: str) -> str:
    """Key of the pipeline's memory snapshots."""
    return f"{pipeline}:state"


def hold_key(pipeline: str) -> str:
    """Key of the pipeline's hold: a range committed short, held until acknowledged."""
    return f"{pipeline}:hold"


def hold_record(run_id: str, mismatch: str) -> dict:
    """A run's finding that holds the pipeline (:class:`kafka_eos.errors.RangeMismatch`'s line)."""
    return {"held": True, "run_id": run_id, "mismatch": mismatch, "found_at": now_iso()}


def checkpoint_record(run_id: str, group_id: str, topic: str, partition: int, offset: int) -> dict:
    """The manifest's memory of a checkpoint, written inside the transaction that commits it:
    a checkpoint the broker later expires is recognised as lost, never as a new partition."""
    return {"checkpoint": True, "group_id": group_id, "topic": topic, "partition": partition,
            "offset": offset, "run_id": run_id, "committed_at": now_iso()}


def plan_record(plan: Plan) -> dict:
    return {"status": PLANNED, "plan": plan.as_dict(), "updated_at": now_iso()}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _record_time(record: dict) -> str:
    return record.get("committed_at") or record.get("updated_at") or record.get("started_at") or ""


def _is_run(record: dict | None) -> bool:
    return record is not None and isinstance(record.get("plan"), dict)


def _is_run_of(pipeline: str, key: str, record: dict | None) -> bool:
    """A run record of ``pipeline`` itself. The manifest also holds the records of the pipeline's
    side runs (replays, backfills: ``<pipeline>.<kind>.<key>.g<n>:<run id>``), which are never the
    live pipeline's runs: told apart by key and by the plan's pipeline."""
    return _is_run(record) and key.startswith(pipeline + ":") and record["plan"].get("pipeline") == pipeline


def produce_json(settings: KafkaSettings, topic: str, records: list[tuple[str, dict | None]]) -> None:
    """Write ``(key, record)`` pairs as JSON (None: a tombstone), in order, outside any transaction.

    :raises TimeoutError: not every record was acknowledged in time.
    """
    # Not idempotent: librdkafka's idempotent producer spends 0.5-1 s acquiring a producer id
    # before its first send, on every plan. A record written twice is harmless here (lookups
    # take the newest, compaction drops the other); one request in flight keeps the order.
    producer = Producer(settings.client_config(**{
        "enable.idempotence": False, "acks": "all", "max.in.flight.requests.per.connection": 1}))
    for key, record in records:
        value = None if record is None else json.dumps(record, sort_keys=True).encode()
        producer.produce(topic, key=key.encode(), value=value)
    if producer.flush(ADMIN_TIMEOUT_S) != 0:
        raise TimeoutError(f"records {records[0][0]!r}… not delivered to {topic!r}")


@dataclass
class ManifestState:
    """What the manifest remembers of a pipeline: the last checkpoint kafka-eos committed per
    source partition, and where its first plan started each partition (empty before one)."""

    checkpoints: dict[TP, dict] = field(default_factory=dict)
    starts: dict[TP, int] | None = None
    #: The LSO the lookup started from: everything below it is accounted for.
    read_upto: int = 0
    records_read: int = 0
    #: When the newest snapshot was written (epoch seconds), None when the walk found none.
    snapshot_at: float | None = None
    #: False when retention deleted records and no snapshot was found (or the newest snapshot was
    #: written from such a memory): the memory of a partition's checkpoint may be gone.
    complete: bool = True
    #: The newest hold record (:func:`hold_record`, or one acknowledged since), None when none.
    hold: dict | None = None

    @property
    def held(self) -> dict | None:
        """The finding that holds the pipeline, while no operator has acknowledged it."""
        return self.hold if self.hold is not None and self.hold.get("held") else None

    def remember(self, rec: dict) -> None:
        """Take a checkpoint record, keeping the highest offset per partition (checkpoints only
        move forward between resets)."""
        tp = (rec["topic"], rec["partition"])
        if tp not in self.checkpoints or rec["offset"] > self.checkpoints[tp]["offset"]:
            self.checkpoints[tp] = rec


class _Holds:
    """The newest hold of a pipeline, from a walk newest first (:meth:`see` each record): the first
    hold record, unless it lies below the newest snapshot's ``read_upto`` (the snapshot knew it,
    or a newer one); else that snapshot's. A snapshot is read at one offset and written at a later
    one, so a hold record can come between the two: newer than what the snapshot holds."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.record: tuple[int, dict] | None = None
        self.snapshot: dict | None = None

    def see(self, offset: int, key: str, rec: dict | None) -> None:
        if rec is None:
            return
        if key == hold_key(self.pipeline) and self.record is None:
            self.record = (offset, rec)
        elif key == state_key(self.pipeline) and rec.get("snapshot") is True and self.snapshot is None:
            self.snapshot = rec

    def newest(self) -> dict | None:
        # A snapshot without the field (written by a version before holds) knows no hold.
        if self.record is not None and (self.snapshot is None or "hold" not in self.snapshot
                                        or self.record[0] >= self.snapshot["read_upto"]):
            return self.record[1]
        return self.snapshot.get("hold") if self.snapshot is not None else None


class ManifestStore:
    """Reads and writes one pipeline's run manifest.

    Writes outside a transaction use a plain producer (acks=all, in order); records that belong
    to a commit are produced by the commit protocol on its transactional producer (see
    :mod:`kafka_eos.txn`).
    ``records_read`` counts the records this store's lookups have read (the cost of a lookup).
    """

    def __init__(self, settings: KafkaSettings, topic: str, pipeline: str) -> None:
        self.settings = settings
        self.topic = topic
        self.pipeline = pipeline
        self.records_read = 0

    @classmethod
    def of(cls, spec: "PipelineSpec", settings: KafkaSettings) -> "ManifestStore":
        """The manifest of pipeline ``spec``."""
        return cls(settings, spec.manifest_topic, spec.name)

    def ensure_topic(self) -> None:
        ensure_compacted_topic(self.settings, self.topic, retention_ms=MANIFEST_RETENTION_MS,
                               segment_ms=MANIFEST_SEGMENT_MS)

    def ensure_compaction(self) -> None:
        """Before a stream writes a record per batch: the topic exists and its segments roll
        hourly (a manifest created before that setting keeps Kafka's 7 days otherwise)."""
        self.ensure_topic()
        try:
            set_topic_config(self.settings, self.topic, {"segment.ms": str(MANIFEST_SEGMENT_MS)})
        except BrokerError as exc:
            if "AUTHORIZATION_FAILED" not in str(exc):
                raise
            # A least-privilege principal may not alter topics; `kafka-eos topics create` made the
            # manifest with this setting already.
            log.warning("cannot set segment.ms of the manifest %s (%s): leaving it as it is", self.topic, exc)

    # -- writes -----------------------------------------------------------------------------
    def put(self, key: str, record: dict | None) -> None:
        produce_json(self.settings, self.topic, [(key, record)])

    def put_plan(self, plan: Plan) -> None:
        self.put(run_key(plan.pipeline, plan.run_id), plan_record(plan))

    def put_starts(self, plan: Plan) -> None:
        """Remember where a pipeline's first plan started each partition."""
        self.put(starts_key(plan.pipeline), {"run_id": plan.run_id, "created_at": now_iso(),
                                             "starts": [[r.topic, r.partition, r.from_offset] for r in plan.ranges]})

    def put_snapshot(self, state: ManifestState, reset: bool = False) -> None:
        self.put(state_key(self.pipeline), {
            "snapshot": True, "reset": reset, "read_upto": state.read_upto, "written_at": now_iso(),
            "checkpoints": [rec for _tp, rec in sorted(state.checkpoints.items())],
            "starts": None if state.starts is None else [[t, p, o] for (t, p), o in sorted(state.starts.items())],
            "hold": state.hold, "complete": state.complete})

    def acknowledge(self, hold: dict, read_upto: int, who: str, at: str,
                    note: str | None = None) -> tuple[dict, dict | None]:
        """Release the pipeline from ``hold`` (:attr:`ManifestState.held` of a state read up to
        ``read_upto``): the same finding, ``held`` false, with who acknowledged it, when (``at``,
        ISO), and why. Returns that record, and a newer finding the acknowledgement would hide
        (another run's, written after ``hold`` was read and before the acknowledgement): written
        again, after it, so that the pipeline stays held for it; else None."""
        record = {**hold, "held": False, "acknowledged_by": who, "acknowledged_at": at, "note": note}
        self.put(hold_key(self.pipeline), record)
        newer = self._finding_behind(record, read_upto)
        if newer is not None:
            self.put(hold_key(self.pipeline), newer)
        return record, newer

    def _finding_behind(self, ack: dict, read_upto: int) -> dict | None:
        """The newest finding written between the one ``ack`` acknowledges and ``ack`` itself, down
        to offset ``read_upto`` at most (what the acknowledging read had seen), that no record
        after it acknowledges; None if none, or if a finding newer than ``ack`` holds the pipeline
        already."""
        key = hold_key(self.pipeline)
        passed = False  # the walk has passed ``ack``
        acknowledged = set()  # the findings an acknowledgement seen so far (a newer one) names
        with closing(self._tail(committed=False)) as records:
            for offset, _ts, found, rec in records:
                if offset < read_upto:
                    break
                if found != key or rec is None:
                    continue
                finding = (rec.get("run_id"), rec.get("found_at"))
                if not passed:
                    if rec.get("held") is True and finding not in acknowledged:
                        return None  # a newer finding, above ``ack``: the pipeline is held by it
                    passed = rec == ack
                if rec.get("held") is not True:
                    acknowledged.add(finding)
                elif finding == (ack["run_id"], ack["found_at"]):
                    break  # the finding acknowledged: what lies below it, the acknowledging read saw
                elif passed and finding not in acknowledged:
                    return rec
        return None

    def forget_checkpoints(self) -> None:
        """Forget the pipeline's checkpoints and first starts (a deliberate fresh start, together
        with the group's offsets): a ``reset`` snapshot that lookups do not walk past. A hold is
        kept: a fresh start does not bring back what a range committed short lost."""
        if self._offsets() is not None:
            now = self.state()  # its hold, and the offset it read up to: a later walk reads no further back
            self.put_snapshot(ManifestState(hold=now.hold, read_upto=now.read_upto), reset=True)

    # -- lookups ----------------------------------------------------------------------------
    def stored_plan(self, run_id: str) -> Plan | None:
        """The plan stored for run ``run_id`` while it is the pipeline's newest plan, else None.

        Read uncommitted (plans are never written in a transaction, so nothing of an aborted one
        is taken): an open transaction, even of this pipeline's own killed attempt, hides nothing.
        An older run's plan is not looked for: a later run's plan starts from the same or a
        later checkpoint, so that run re-plans (and its commit check keeps it exactly-once).

        :raises PlanError: the stored plan is malformed or belongs to another pipeline.
        """
        key = run_key(self.pipeline, run_id)
        with closing(self._tail(committed=False)) as records:
            for _offset, _ts, found, rec in records:
                # A side run's plan (replays, backfills run beside the live runs) is not newer work.
                if not _is_run_of(self.pipeline, found, rec) or rec.get("status") != PLANNED:
                    continue
                if found != key:
                    return None
                plan = Plan.from_json(json.dumps(rec["plan"]), f"manifest {self.topic!r} key {key!r}")
                if plan.pipeline != self.pipeline:
                    raise PlanError(f"manifest {self.topic!r} key {key!r}: plan of pipeline {plan.pipeline!r}")
                return plan
        return None

    def run_records(self, run_id: str, side: bool = False,
                    older: bool = False) -> tuple[dict | None, dict[str, dict]]:
        """Run ``run_id``'s newest committed run record (its summary, else its plan) and, in
        per_partition scope, the newest record of each source partition (``<topic>-<p>``).
        The walk stops at the run's plan, or at another run's plan (an older run: the pipeline's
        own runs follow one another, and compaction keeps only a run's newest record). A run's
        own attempt looks for the run's records as they are now: a newer run's plan means none.
        With ``older`` (an audit of past runs) the walk passes newer runs' plans until it has the
        run's record. A ``side`` run (a backfill interval, a replay) runs beside the live runs
        and beside other side runs, so a live run's plan newer than its summary is common: its
        walk stops only at its own records or the log start."""
        key = run_key(self.pipeline, run_id)
        record, parts = None, {}
        with closing(self._tail(committed=True)) as records:
            for _offset, _ts, found, rec in records:
                if rec is None:
                    continue
                if _is_run(rec):
                    if found != key:
                        if (record is not None or not older) and rec.get("status") == PLANNED and not side \
                                and _is_run_of(self.pipeline, found, rec):
                            break
                        continue
                    record = record or rec
                    if rec.get("status") == PLANNED:
                        break
                elif found.startswith(key + ":"):
                    parts.setdefault(found[len(key) + 1:], rec)
        return record, parts

    def last_run(self) -> dict | None:
        """The pipeline's newest run record (planned, committed or noop; an empty plan that was
        stored and then skipped reads ``empty``), or None. Side runs are not the pipeline's runs."""
        with closing(self._tail(committed=True)) as records:
            for _offset, _ts, key, rec in records:
                if _is_run_of(self.pipeline, key, rec):
                    if rec.get("status") == PLANNED and Plan.from_json(json.dumps(rec["plan"])).is_empty:
                        return {**rec, "status": "empty"}
                    return rec
        return None

    def last_runs(self, n: int, offsets: PartitionOffsets | None = None) -> list[dict]:
        """The newest record of each of the pipeline's last ``n`` runs, newest first.

        :param offsets: the manifest partition's offsets, when the caller has them (one query for
            many pipelines' manifests); else they are looked up."""
        return self.last_runs_and_hold(n, offsets)[0]

    def last_runs_and_hold(self, n: int, offsets: PartitionOffsets | None = None) -> tuple[list[dict], dict | None]:
        """:meth:`last_runs`, and the finding that holds the pipeline (:attr:`ManifestState.held`)
        or None, from the same walk: a hold is newer than every run record (nothing plans while
        held), so a walk over the last runs passes it; a snapshot's hold counts where no hold
        record above the snapshot's ``read_upto`` settles it (as :meth:`state` reads it)."""
        found: dict[str, dict] = {}
        offsets = offsets or self._offsets()
        holds = self._holds_above_lso(offsets)
        with closing(self._tail(committed=True, offsets=offsets)) as records:
            for offset, _ts, key, rec in records:
                holds.see(offset, key, rec)
                if _is_run_of(self.pipeline, key, rec):
                    found.setdefault(key, rec)
                    if len(found) == n:
                        break
        hold = holds.newest()
        return sorted(found.values(), key=_record_time, reverse=True), hold if hold and hold.get("held") else None

    def runs_since(self, since: str) -> list[dict]:
        """The newest record of each run whose records are newer than ``since`` (ISO time),
        oldest first."""
        found: dict[str, dict] = {}
        with closing(self._tail(committed=True)) as records:
            for _offset, _ts, key, rec in records:
                if not _is_run_of(self.pipeline, key, rec):
                    continue
                if _record_time(rec) < since:
                    break
                found.setdefault(key, rec)
        return sorted(found.values(), key=_record_time)

    def find(self, key: str) -> dict | None:
        """The newest record under ``key`` of the records written outside transactions, or None:
        a walk back to the log start when the key is not there (for records looked up by key,
        seldom: a backfill's interval). Read uncommitted, like plans: an open transaction of the
        pipeline's killed attempt hides nothing written after it."""
        with closing(self._tail(committed=False)) as records:
            for _offset, _ts, found, rec in records:
                if found == key:
                    return rec
        return None

    def state(self) -> ManifestState:
        """The pipeline's memory: its newest snapshot, with every checkpoint, starts and hold record
        written since the offset that snapshot had read up to."""
        offsets = self._offsets()
        if offsets is None:
            return ManifestState()
        state = ManifestState(read_upto=offsets.lso)
        start_read, stop = self.records_read, None
        snapshot_complete = True  # the newest snapshot's word: written from a whole memory
        holds = self._holds_above_lso(offsets)
        forgotten = False  # past a reset snapshot: only a hold record is still taken, down to its read_upto
        with closing(self._tail(committed=True, offsets=offsets)) as records:
            for offset, ts, key, rec in records:
                if stop is not None and offset < stop:
                    break
                holds.see(offset, key, rec)
                if rec is None or forgotten:
                    continue
                if rec.get("snapshot") is True and key == state_key(self.pipeline):
                    if state.snapshot_at is None:
                        state.snapshot_at, stop = ts, rec["read_upto"]
                        snapshot_complete = rec.get("complete") is not False
                    for ck in rec["checkpoints"]:
                        state.remember(ck)
                    if state.starts is None and rec["starts"] is not None:
                        state.starts = {(t, p): o for t, p, o in rec["starts"]}
                    forgotten = rec["reset"]
                elif rec.get("checkpoint") is True and \
                        key == checkpoint_key(self.pipeline, rec["topic"], rec["partition"]):
                    # Only the pipeline's own: a side run's checkpoints (its own group, its own
                    # keys) are never the live pipeline's memory.
                    state.remember(rec)
                elif key == starts_key(self.pipeline) and state.starts is None:
                    state.starts = {(t, p): o for t, p, o in rec["starts"]}
        state.records_read = self.records_read - start_read
        # Retention deleted records and no snapshot holds what they said; or the newest snapshot was
        # written from such a memory (a later plan must not take a lost checkpoint for a new
        # partition): incomplete until every partition has a checkpoint again (see
        # kafka_eos.pipeline._first_plan_remembered) or a reset forgets it deliberately.
        state.complete = offsets.log_start == 0 or (state.snapshot_at is not None and snapshot_complete)
        state.hold = holds.newest()
        return state

    def refresh_state(self) -> ManifestState:
        """:meth:`state`, and a new snapshot when that lookup read far or found none (or an old
        one): the next lookup stops at it. Called by every plan."""
        state = self.state()
        if state.snapshot_at is None or state.records_read > SNAPSHOT_AFTER \
                or time.time() - state.snapshot_at > SNAPSHOT_MAX_AGE_S:
            if state.read_upto > 0:
                self.put_snapshot(state)
        return state

    def _holds_above_lso(self, offsets: PartitionOffsets | None) -> "_Holds":
        """A hold search begun with the records above the LSO, read uncommitted: an open
        transaction on the manifest (a side run's, a killed attempt's) pins the LSO, and a hold
        written after it (outside any transaction, as are snapshots) must not wait for it."""
        holds = _Holds(self.pipeline)
        if offsets is not None and offsets.high_watermark > offsets.lso:
            with closing(self._tail(committed=False, offsets=offsets)) as records:
                for offset, _ts, key, rec in records:
                    if offset < offsets.lso:
                        break
                    holds.see(offset, key, rec)
        return holds

    # -- the backwards walk -----------------------------------------------------------------
    def _offsets(self) -> PartitionOffsets | None:
        """The manifest partition's offsets; None when the topic does not exist (yet)."""
        admin = admin_client(self.settings)  # kept alive while its answer is read
        md = admin.list_topics(self.topic, timeout=ADMIN_TIMEOUT_S).topics.get(self.topic)
        if md is None or md.error is not None:
            return None
        # The same client first: it is connected now. A new client's first ListOffsets can find no
        # usable broker yet (the bootstrap connection handing over to the broker's own) and wait
        # a leader query of librdkafka's, 1-3 s.
        return partition_offsets(self.settings, [(self.topic, 0)], admin=admin)[(self.topic, 0)]

    def _tail(self, committed: bool, offsets=None) -> Iterator[tuple[int, float, str, dict | None]]:
        """The manifest's records newest first, as ``(offset, timestamp s, key, record or None)``,
        read in growing steps from the end (the LSO when ``committed``, else the high
        watermark) back to the log start; the caller stops when it has what it needs."""
        offsets = offsets or self._offsets()
        if offsets is None:
            return
        high, step = (offsets.lso if committed else offsets.high_watermark), TAIL_STEP
        consumer = Consumer(self.settings.client_config(**{
            # A throwaway group id: the consumer never joins or commits (assign, not subscribe).
            "group.id": reader_group("manifest"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": True,
            # A walk reads what is there: no waiting at the end of the log for more to arrive.
            "fetch.wait.max.ms": 10,
        }))
        try:
            while high > offsets.log_start:
                low = max(offsets.log_start, high - step)
                yield from reversed(self._read(consumer, low, high))
                high, step = low, min(2 * step, MAX_TAIL_STEP)
        finally:
            consumer.close()

    def _read(self, consumer: Consumer, low: int, high: int) -> list[tuple[int, float, str, dict | None]]:
        """The records at offsets ``[low, high)`` (compaction and transaction markers leave gaps)."""
        consumer.assign([TopicPartition(self.topic, 0, low)])
        found = []
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return found
                raise BrokerError(f"reading manifest {self.topic!r}: {msg.error().str()}")
            if msg.offset() >= high:
                return found
            self.records_read += 1
            value = msg.value()
            found.append((msg.offset(), msg.timestamp()[1] / 1000, (msg.key() or b"").decode(),
                          None if value is None else json.loads(value)))
            if msg.offset() == high - 1:
                return found
        raise BrokerError(f"reading manifest {self.topic!r} offsets [{low}, {high}): no answer in "
                          f"{ADMIN_TIMEOUT_S:g}s")
