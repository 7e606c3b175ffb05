"""The SQL sink's commit scope: one database transaction per run, on the driver, over the
pipeline's :class:`~kafka_eos.sinks.sql_store.SqlStore` (docs/architecture.md, "SQL sink").

:meth:`SqlSink.commit` takes a run through these steps:

1. Before Spark starts: the offsets and dead-letter tables exist.
2. The output split into results and dead letters (rows with ``dlq_reason``); a side run's
   columns added.
3. Spark first: the source counted (persisted, so Kafka is read once), the dead letters and the
   results computed into local spools. The database transaction never waits on Spark
   (PostgreSQL's idle-in-transaction timeout, SQLite's write lock).
4. One database transaction: the offsets rows moved by compare-and-set (none moved: an earlier
   attempt committed, a no-op), the dead letters, the results (rows the database refuses become
   dead letters too).
5. The checkpoints mirrored to the Kafka group offsets (the planner repairs a mirror left behind:
   :meth:`SqlSink.checkpoints`, :meth:`SqlSink.repair`), then the run's manifest record.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from kafka_eos.errors import CheckpointConflict
from kafka_eos.probes import point
from kafka_eos.formats import dead_letter_bytes
from kafka_eos.kafka_admin import TP, alter_group_offsets
from kafka_eos.manifest import COMMITTED, ManifestStore, now_iso, run_key
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.base import Drift, Outcome, Output, Sink
from kafka_eos.sinks.batches import fetched
from kafka_eos.sinks.sql_store import ArrowSpool, SqlStore, Spool, as_bytes, database_url
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class SqlSink(Sink):
    """A SQL sink (the module's steps)."""

    #: It reads its source more than once anyway (persisted): two passes from the start.
    decodes_in_one_pass = False

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> None:
        super().__init__(spec, settings, keep)
        self._store: SqlStore | None = None

    @property
    def store(self) -> SqlStore:
        """The pipeline's tables (an engine, built at first use)."""
        if self._store is None:
            self._store = SqlStore(self.spec, database_url(self.spec, self.settings))
        return self._store

    def _start(self) -> None:
        """1. The offsets and dead-letter tables (and a SQLite file's folder)."""
        self.store.create_tables()

    def prepare(self, output: Output) -> Output:
        """2. Results and dead letters apart; a side run's range and generation as columns."""
        # pyspark: not at the top, where every process that plans (a DAG processor too) would load it.
        from pyspark.sql import functions as F

        results, dead_letters = output.results, output.dead_letters
        if results is not None and dead_letters is None and DLQ_REASON in results.columns:
            dead_letters = results.where(F.col(DLQ_REASON).isNotNull())
            results = results.where(F.col(DLQ_REASON).isNull()).drop(DLQ_REASON)
        if results is not None:
            for name, value in self.spec.sink.columns:  # a side run's range and generation
                results = results.withColumn(name, F.lit(value))
        return output._replace(results=results, dead_letters=dead_letters)

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 3–5."""
        source = output.source
        # An aggregating transform's output says nothing of its input size: count the source.
        # Results, dead letters and the count each read it: persist it so Kafka is read once.
        if source is not None:
            source.persist()
        try:
            counting = time.monotonic()
            records_in = source.count() if source is not None else 0
            log.info("SQL sink %s: source read and counted in %.2f s", self.spec.sink.table, time.monotonic() - counting)
            status, out, dead = self._commit(plan, output)
        finally:
            if source is not None:
                source.unpersist()
        point("after_sql_commit")
        # 5. The mirror: standard lag tools see progress; the planner repairs it if this is lost.
        self.store.publish_checkpoints(self.settings, [r.tp for r in plan.active], plan.planned_ms)
        if status == COMMITTED:
            ManifestStore.of(self.spec, self.settings).put(
                run_key(self.spec.name, plan.run_id),
                {**record, "status": COMMITTED, "records_in": records_in, "records_out": out,
                 "dead_letters": dead, "committed_at": now_iso(),
                 "finished_at": datetime.now(timezone.utc).isoformat()})
        return Outcome(status, records_in, out, dead)

    def _commit(self, plan: Plan, output: Output) -> tuple[str, int, int]:
        """Steps 3 (the spools) and 4 (the database transaction)."""
        store = self.store
        table = store.results_table(output.results) if output.results is not None else None
        began = time.monotonic()
        dead_spool = Spool(dead_letter_rows(self.spec, plan, output.dead_letters, output.undecodable))
        spooled = time.monotonic()
        result_spool = fetched(output.results, ArrowSpool) if output.results is not None else None
        computed = time.monotonic()
        try:
            status, out, dead = store.commit(plan, result_spool, table, dead_spool.rows())
            log.info("SQL sink %s: dead letters computed in %.2f s, results in %.2f s; database transaction %.2f s",
                     self.spec.sink.table, spooled - began, computed - spooled, time.monotonic() - computed)
        finally:
            dead_spool.close()
            if result_spool is not None:
                result_spool.close()
        return status, out, dead

    def checkpoints(self, tps: list[TP], group: dict[TP, int | None]) -> tuple[dict[TP, int | None], list[Drift]]:
        """The sink's offsets table is the truth; its Kafka mirror (``group``) may lag behind (a
        crash between the database commit and the mirror) but never lead.

        :raises CheckpointConflict: the Kafka mirror is ahead of the sink.
        """
        sink = self.store.checkpoints(tps)
        drift = []
        for tp in tps:
            s, k = sink.get(tp), group.get(tp)
            if s == k:
                continue
            if k is not None and (s is None or k > s):
                raise CheckpointConflict(
                    f"{tp[0]}-{tp[1]}: group {self.spec.source.group_id!r} is at {k} but the SQL sink "
                    f"{self.spec.sink.table!r} is at {s}: the Kafka checkpoint is ahead of the sink; "
                    "reset the group to the sink's offsets")
            drift.append(Drift(tp[0], tp[1], s, k))
        return sink, drift

    def repair(self, drift: list[Drift]) -> None:
        """Republish the sink's checkpoints to the group, as they are now, not as the drift was
        read (see :meth:`SqlStore.publish_checkpoints`)."""
        self.store.publish_checkpoints(self.settings, [(d.topic, d.partition) for d in drift if d.sink is not None])

    def refresh(self, plan: Plan) -> None:
        """The sink's checkpoints as they are now, a run's commit held off meanwhile, to the group."""
        self.store.publish_checkpoints(self.settings, [r.tp for r in plan.ranges], plan.planned_ms)

    def reset(self, plan: Plan) -> None:
        """The offsets rows moved in a database transaction of no rows. A Kafka mirror behind the
        sink is repaired by the next plan; one ahead of it stops the pipeline. So the mirror goes
        back before the sink does, and forward after it."""
        moving = plan.active
        if not moving:
            return
        back = {r.tp: r.until for r in moving if r.expected is not None and r.until < r.expected}
        if back:
            alter_group_offsets(self.settings, self.spec.source.group_id, back)
        self.store.create_tables()
        self.store.commit(plan, None, None, iter(()))
        alter_group_offsets(self.settings, self.spec.source.group_id, {r.tp: r.until for r in moving})

    def close(self) -> None:
        if self._store is not None:
            self._store.engine.dispose()


def dead_letter_rows(spec: PipelineSpec, plan: Plan, *frames: "DataFrame | None"):
    """The dead-letter rows of ``frames`` (a transform's, then the undecodable records): the
    source record's place, key and value as bytes (a decoded one as its JSON text), the reason."""
    from pyspark.sql import functions as F

    for frame in frames:
        if frame is None:
            continue
        # A struct key or value (a decoded record) as its JSON text; a dead letter without one: null.
        frame = frame.select(*(dead_letter_bytes(c, frame.schema[c].dataType).alias(c) if c in frame.columns
                               else F.lit(None).cast("binary").alias(c) for c in ("key", "value")),
                             "topic", "partition", "offset", DLQ_REASON)
        # One job, every task at once, as Arrow (the results' way): not a job per task (unless the
        # whole is over spark.driver.maxResultSize: batches.fetched).
        spool = fetched(frame, ArrowSpool)
        try:
            for row in spool.rows():
                yield {"pipeline": spec.name, "topic": row["topic"], "partition": row["partition"],
                       "offset": row["offset"], "key": as_bytes(row["key"]), "value": as_bytes(row["value"]),
                       "reason": row[DLQ_REASON], "run_id": plan.run_id}
        finally:
            spool.close()
