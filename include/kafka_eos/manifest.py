"""The run manifest: a compacted topic of JSON records keyed ``<pipeline>:<run id>`` (the run's
plan and summary) and ``<pipeline>:<run id>:<topic>-<p>`` (one per source partition, written
inside that partition's transaction in per_partition scope). It is the audit trail.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from kafka_eos.errors import PlanError
from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, ensure_compacted_topic, partition_offsets
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings

PLANNED, COMMITTED, NOOP = "planned", "committed", "noop"


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


def checkpoint_record(run_id: str, group_id: str, topic: str, partition: int, offset: int) -> dict:
    """The manifest's memory of a checkpoint, written inside the transaction that commits it:
    a checkpoint the broker later expires is recognised as lost, never as a new partition."""
    return {"checkpoint": True, "group_id": group_id, "topic": topic, "partition": partition,
            "offset": offset, "run_id": run_id, "committed_at": now_iso()}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def _record_time(record: dict) -> str:
    return record.get("committed_at") or record.get("updated_at") or record.get("started_at") or ""


class ManifestStore:
    """Reads and writes run manifest records.

    Writes outside a transaction use an idempotent producer; records that belong to a commit are
    produced by the commit protocol on its transactional producer (see :mod:`kafka_eos.txn`).
    """

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic

    def ensure_topic(self) -> None:
        ensure_compacted_topic(self.settings, self.topic)

    def put(self, key: str, record: dict) -> None:
        producer = Producer(self.settings.client_config(**{"enable.idempotence": True}))
        producer.produce(self.topic, key=key.encode(), value=json.dumps(record, sort_keys=True).encode())
        if producer.flush(ADMIN_TIMEOUT_S) != 0:
            raise TimeoutError(f"manifest record {key!r} not delivered to {self.topic!r}")

    def put_plan(self, plan: Plan) -> None:
        self.put(run_key(plan.pipeline, plan.run_id),
                 {"status": PLANNED, "plan": json.loads(plan.to_json()), "updated_at": now_iso()})

    def scan(self, prefix: str = "", tombstones: bool = False) -> Iterator[tuple[str, dict | None]]:
        """Every committed record whose key starts with ``prefix``, oldest first (read_committed);
        with ``tombstones``, deletions too (as None)."""
        consumer = Consumer(self.settings.client_config(**{
            # A throwaway group id: the consumer never joins or commits (assign, not subscribe).
            "group.id": f"kafka-eos.manifest-reader.{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }))
        try:
            md = consumer.list_topics(self.topic, timeout=ADMIN_TIMEOUT_S).topics.get(self.topic)
            if md is None or md.error is not None:
                return
            offsets = partition_offsets(self.settings, [(self.topic, p) for p in md.partitions])
            ends = {p: o.high_watermark for (_t, p), o in offsets.items()}
            todo = {p for p, high in ends.items() if high > 0}
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in todo])
            while todo:
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                        continue
                    raise RuntimeError(f"reading manifest {self.topic!r}: {msg.error().str()}")
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
                key = (msg.key() or b"").decode()
                if key.startswith(prefix) and (msg.value() is not None or tombstones):
                    yield key, None if msg.value() is None else json.loads(msg.value())
        finally:
            consumer.close()

    def stored_plan(self, pipeline: str, run_id: str) -> Plan | None:
        """The plan stored for run ``run_id`` (every run record carries it), or None.

        :raises PlanError: the stored plan is malformed or belongs to another pipeline.
        """
        key = run_key(pipeline, run_id)
        record = self.latest(key)
        if record is None or "plan" not in record:
            return None
        plan = Plan.from_json(json.dumps(record["plan"]), f"manifest {self.topic!r} key {key!r}")
        if plan.pipeline != pipeline:
            raise PlanError(f"manifest {self.topic!r} key {key!r}: plan of pipeline {plan.pipeline!r}")
        return plan

    def partition_records(self, pipeline: str, run_id: str) -> dict[str, dict]:
        """The newest per-partition record of a run, by ``<topic>-<p>``."""
        prefix = run_key(pipeline, run_id) + ":"
        return {key[len(prefix):]: rec for key, rec in self.scan(prefix)}

    def last_runs(self) -> dict[str, dict]:
        """The newest run record (planned, committed or noop) of every pipeline, by pipeline name."""
        last: dict[str, dict] = {}
        for _key, rec in self.scan():
            plan = rec.get("plan")
            if not isinstance(plan, dict) or "pipeline" not in plan:
                continue  # a per-partition record
            name = plan["pipeline"]
            if name not in last or _record_time(rec) >= _record_time(last[name]):
                last[name] = rec
        for name, rec in last.items():
            # An empty plan is stored, then skipped: its run record stays "planned".
            if rec.get("status") == PLANNED and Plan.from_json(json.dumps(rec["plan"])).is_empty:
                last[name] = {**rec, "status": "empty"}
        return last

    def checkpoint_history(self, pipeline: str) -> dict[tuple[str, int], dict]:
        """The last checkpoint kafka-eos committed for each source partition of ``pipeline``."""
        found: dict[str, dict | None] = {}
        for key, rec in self.scan(f"{pipeline}:checkpoint:", tombstones=True):
            found[key] = rec
        return {(r["topic"], r["partition"]): r for r in found.values() if r is not None}

    def put_starts(self, plan: Plan) -> None:
        """Remember where a pipeline's first plan started each partition."""
        self.put(starts_key(plan.pipeline), {"run_id": plan.run_id, "created_at": now_iso(),
                                             "starts": [[r.topic, r.partition, r.from_offset] for r in plan.ranges]})

    def starts(self, pipeline: str) -> dict[tuple[str, int], int]:
        """Where the pipeline's first plan started each partition; empty before a first plan."""
        record = self.latest(starts_key(pipeline))
        return {} if record is None else {(t, p): o for t, p, o in record["starts"]}

    def forget_checkpoints(self, pipeline: str) -> None:
        """Delete the manifest's memory of ``pipeline``'s checkpoints and first starts (a
        deliberate fresh start, together with the group's offsets)."""
        producer = Producer(self.settings.client_config(**{"enable.idempotence": True}))
        producer.produce(self.topic, key=starts_key(pipeline).encode(), value=None)
        for topic, partition in self.checkpoint_history(pipeline):
            producer.produce(self.topic, key=checkpoint_key(pipeline, topic, partition).encode(), value=None)
        if producer.flush(ADMIN_TIMEOUT_S) != 0:
            raise TimeoutError(f"tombstones of {pipeline!r}'s checkpoints not delivered to {self.topic!r}")

    def latest(self, key: str) -> dict | None:
        """The newest record under exactly ``key``, or None (none, or deleted by a tombstone)."""
        found = None
        for k, rec in self.scan(key, tombstones=True):
            if k == key:
                found = rec
        return found
