"""The Iceberg sink's commit scope: one snapshot per run, its offsets in the snapshot's summary,
on the driver, over the pipeline's :class:`~kafka_eos.sinks.iceberg_store.IcebergStore`
(docs/iceberg.md).

:meth:`IcebergSink.commit` takes a run through these steps:

1. Before Spark starts: nothing (the catalog and tables are made at the first commit, from the
   transform's output schema).
2. The output split into results and dead letters (rows with ``dlq_reason``).
3. The table's checkpoints read: every active range at its ``expected`` offset goes on; every one at
   its end already is a no-op (an earlier attempt committed: nothing is computed); anything else
   fails, naming the partition.
4. Dead letters first, to the table ``<table>_dead_letters``, in a snapshot of its own carrying its
   own offsets: only those at or past the offsets it already holds (a crash between step 4 and
   step 5 leaves them there; the retry, whatever its plan, writes none twice). Skipped when the run
   has none.
5. The results written as data files (a bounded chunk at a time: the driver never holds the run),
   then one snapshot that adds them all, its summary holding the plan's offsets: committed only if
   the table is still at the snapshot step 3 read (the catalog's compare-and-set). This commit is
   the run's transaction.
6. The checkpoints mirrored to the Kafka group offsets (the planner repairs a mirror left behind:
   :meth:`IcebergSink.checkpoints`, :meth:`IcebergSink.repair`), then the run's manifest record.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

from kafka_eos.errors import CheckpointConflict, SpecError
from kafka_eos.kafka_admin import TP, alter_group_offsets
from kafka_eos.manifest import COMMITTED, NOOP, ManifestStore, now_iso, run_key
from kafka_eos.plan import Plan
from kafka_eos.probes import point
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.base import Drift, Outcome, Output, Sink
from kafka_eos.sinks.batches import fetched
from kafka_eos.sinks.iceberg_store import IcebergStore, dead_letter_batches
from kafka_eos.sinks.sql import dead_letter_rows
from kafka_eos.sinks.sql_store import database_url
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON

log = logging.getLogger(__name__)


class IcebergSink(Sink):
    """An Iceberg table sink (the module's steps)."""

    #: It reads its source more than once anyway (persisted): two passes from the start.
    decodes_in_one_pass = False

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> None:
        super().__init__(spec, settings, keep)
        self._store: IcebergStore | None = None

    @property
    def store(self) -> IcebergStore:
        """The pipeline's catalog (opened at first use)."""
        if self._store is None:
            self._store = IcebergStore(self.spec, database_url(self.spec, self.settings))
        return self._store

    def prepare(self, output: Output) -> Output:
        """2. Results and dead letters apart."""
        from pyspark.sql import functions as F

        results, dead_letters = output.results, output.dead_letters
        if results is None:
            raise SpecError(f"{self.spec.path}: the transform gives no results for the Iceberg table")
        if dead_letters is None and DLQ_REASON in results.columns:
            dead_letters = results.where(F.col(DLQ_REASON).isNotNull())
            results = results.where(F.col(DLQ_REASON).isNull()).drop(DLQ_REASON)
        return output._replace(results=results, dead_letters=dead_letters)

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 3–6."""
        store = self.store
        table = store.results_table(output.results.schema)
        # 3. The table's checkpoints: nothing is computed for a plan committed already.
        if not store.check(table, plan, "table"):
            log.info("Iceberg sink %s: run %s committed already (a no-op)", self.spec.sink.table, plan.run_id)
            status, records_in, out, dead = NOOP, 0, 0, 0
        else:
            source = output.source
            # Results, dead letters and the count each read the source: persisted, Kafka is read once.
            if source is not None:
                source.persist()
            try:
                records_in = source.count() if source is not None else 0
                dead = self._dead_letters(plan, output)
                point("before_iceberg_commit")
                status, out = self._results(table, plan, output)
            finally:
                if source is not None:
                    source.unpersist()
        point("after_iceberg_commit")
        # 6. The mirror: standard lag tools see progress; the planner repairs it if this is lost.
        self._publish([r.tp for r in plan.active], plan.planned_ms)
        if status == COMMITTED:
            ManifestStore.of(self.spec, self.settings).put(
                run_key(self.spec.name, plan.run_id),
                {**record, "status": COMMITTED, "records_in": records_in, "records_out": out,
                 "dead_letters": dead, "committed_at": now_iso(),
                 "finished_at": datetime.now(timezone.utc).isoformat()})
        return Outcome(status, records_in, out, dead)

    def _dead_letters(self, plan: Plan, output: Output) -> int:
        """4. The run's dead letters not in the dead-letter table yet, in a snapshot of their own."""
        if output.dead_letters is None and output.undecodable is None:
            return 0
        store = self.store
        table = store.dead_letters_table()
        held = store.offsets(table)
        # From where the table's own offsets are (an earlier attempt's), never before the run's start.
        start = {r.tp: max(held.get(r.tp, -1), r.expected if r.expected is not None else -1) for r in plan.active}
        for r in plan.active:
            if held.get(r.tp) is not None and held[r.tp] > r.until:
                raise CheckpointConflict(f"{r.topic}-{r.partition}: Iceberg dead-letter table "
                                         f"{self.spec.sink.dead_letters_table!r} is at {held[r.tp]}, past the plan of "
                                         f"run {plan.run_id!r} (ends at {r.until})")
        rows = (row for row in dead_letter_rows(self.spec, plan, output.dead_letters, output.undecodable)
                if row["offset"] >= start.get((row["topic"], row["partition"]), -1))
        files, count = store.write_files(table, dead_letter_batches(rows))
        if count:
            store.commit_files(table, plan, files, "dead-letter table")
        return count

    def _results(self, table, plan: Plan, output: Output) -> tuple[str, int]:
        """5. The results as data files, then the one snapshot that commits them with the offsets."""
        began = time.monotonic()
        files, rows = fetched(output.results, lambda batches: self.store.write_files(table, batches))
        written = time.monotonic()
        committed = self.store.commit_files(table, plan, files, "table")
        log.info("Iceberg sink %s: %d row(s) in %d file(s) written in %.2f s; snapshot committed in %.2f s",
                 self.spec.sink.table, rows, len(files), written - began, time.monotonic() - written)
        return (COMMITTED, rows) if committed else (NOOP, 0)

    def _publish(self, tps: list[TP], planned_ms: int | None = None) -> dict:
        """The table's checkpoints of ``tps`` as they are now, to the Kafka group."""
        current = {tp: o for tp, o in self.store.checkpoints(tps).items() if o is not None}
        if current:
            alter_group_offsets(self.settings, self.spec.source.group_id, current, planned_ms)
        return current

    def checkpoints(self, tps: list[TP], group: dict[TP, int | None]) -> tuple[dict[TP, int | None], list[Drift]]:
        """The table's snapshot offsets are the truth; their Kafka mirror (``group``) may lag behind
        (a crash between the catalog commit and the mirror) but never lead.

        :raises CheckpointConflict: the Kafka mirror is ahead of the table.
        """
        sink = self.store.checkpoints(tps)
        drift = []
        for tp in tps:
            s, k = sink.get(tp), group.get(tp)
            if s == k:
                continue
            if k is not None and (s is None or k > s):
                raise CheckpointConflict(
                    f"{tp[0]}-{tp[1]}: group {self.spec.source.group_id!r} is at {k} but the Iceberg table "
                    f"{self.spec.sink.table!r} is at {s}: the Kafka checkpoint is ahead of the table; "
                    "reset the group to the table's offsets")
            drift.append(Drift(tp[0], tp[1], s, k))
        return sink, drift

    def repair(self, drift: list[Drift]) -> None:
        """Republish the table's checkpoints to the group, as they are now."""
        self._publish([(d.topic, d.partition) for d in drift if d.sink is not None])

    def refresh(self, plan: Plan) -> None:
        """The table's checkpoints, as they are now, to the group."""
        self._publish([r.tp for r in plan.ranges], plan.planned_ms)

    def reset(self, plan: Plan) -> None:
        """The offsets moved by a snapshot of no files. A Kafka mirror behind the table is repaired
        by the next plan; one ahead of it stops the pipeline: so the mirror goes back before the
        table does, and forward after it."""
        moving = plan.active
        if not moving:
            return
        back = {r.tp: r.until for r in moving if r.expected is not None and r.until < r.expected}
        if back:
            alter_group_offsets(self.settings, self.spec.source.group_id, back)
        table = self.store.table(self.spec.sink.table)
        if table is None:
            raise SpecError(f"{self.spec.path}: Iceberg table {self.spec.sink.table!r} does not exist yet: nothing to "
                            "reset (its first run creates it)")
        if self.store.check(table, plan, "table"):
            self.store.commit_files(table, plan, [], "table")
        alter_group_offsets(self.settings, self.spec.source.group_id, {r.tp: r.until for r in moving})
