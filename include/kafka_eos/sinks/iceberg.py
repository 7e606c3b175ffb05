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
4. Dead letters first, to the table ``<table>_dead_letters``, in a snapshot of their own: only those
   it does not hold yet (this pipeline's, by topic, partition and offset: a crash between step 4 and
   step 5, or a replay after a reset, wrote the others), committed only onto the snapshot that was
   read for that. Skipped when the run has none.
5. The results written as data files (a bounded chunk at a time: the driver never holds the run;
   a field the table lacks, or a type it cannot take, fails the run), then one snapshot that adds
   them all (``merge: upsert``: and replaces the files holding rows of the run's keys by files
   without those rows, copy-on-write), its summary holding the plan's offsets: committed only onto the snapshot whose
   offsets were checked (the catalog's compare-and-set; after another commit that left this
   pipeline's offsets alone, a compaction, checked again and tried again). This commit is the
   run's transaction.
6. The checkpoints mirrored to the Kafka group offsets (the planner repairs a mirror left behind:
   :meth:`MirroredSink.checkpoints`, :meth:`MirroredSink.repair`), then the run's manifest record.
"""

from __future__ import annotations

import logging
import time

from kafka_eos.errors import SpecError
from kafka_eos.kafka_admin import TP, alter_group_offsets
from kafka_eos.manifest import COMMITTED, NOOP
from kafka_eos.plan import Plan
from kafka_eos.probes import point
from kafka_eos.sinks.base import MirroredSink, Outcome, Output, results_apart
from kafka_eos.sinks.batches import fetched
from kafka_eos.sinks.iceberg_store import IcebergStore, dead_letter_batches
from kafka_eos.sinks.sql import dead_letter_rows

log = logging.getLogger(__name__)


class IcebergSink(MirroredSink):
    """An Iceberg table sink (the module's steps)."""

    store_type = IcebergStore
    store: IcebergStore
    # A first run with nothing to read (starting_offsets: latest) creates the table for its offsets.
    needs_output_schema = True

    def prepare(self, output: Output) -> Output:
        """2. Results and dead letters apart."""
        if output.results is None:
            raise SpecError(f"{self.spec.path}: the transform gives no results for the Iceberg table")
        return results_apart(output)

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 3–6."""
        store = self.store
        table = store.results_table(output.results.schema)
        # 3. The table's checkpoints: nothing is computed for a plan committed already.
        if not store.check(table, plan, "table"):
            log.info("Iceberg sink %s: run %s committed already (a no-op)", self.spec.sink.table, plan.run_id)
            status, records_in, out, dead = NOOP, 0, 0, 0
        else:
            with self.counted(output) as records_in:
                dead = self._dead_letters(plan, output)
                point("before_iceberg_commit")
                status, out = self._results(table, plan, output)
        point("after_iceberg_commit")
        # 6. The mirror, then the run's manifest record.
        return self.finish(plan, record, Outcome(status, records_in, out, dead))

    def _dead_letters(self, plan: Plan, output: Output) -> int:
        """4. The run's dead letters that the dead-letter table does not hold yet, in a snapshot of
        their own. Returns the run's dead letters, those an earlier attempt of its ranges wrote
        included (its records are this run's too: ``in = out + dead letters``)."""
        if output.dead_letters is None and output.undecodable is None:
            return 0
        store = self.store
        table = store.dead_letters_table()
        computed = 0

        def counted(rows):
            nonlocal computed
            for row in rows:
                computed += 1
                yield row

        rows = store.new_dead_letters(table, plan, counted(dead_letter_rows(self.spec, plan, output.dead_letters,
                                                                            output.undecodable)))
        files, count = store.write_files(table, dead_letter_batches(rows))
        if count:
            store.commit_dead_letters(table, plan, files)
        if computed != count:
            log.info("Iceberg sink %s: %d of run %s's %d dead letter(s) were written by an earlier attempt",
                     self.spec.sink.table, computed - count, plan.run_id, computed)
        return computed

    def _results(self, table, plan: Plan, output: Output) -> tuple[str, int]:
        """5. The results as data files, then the one snapshot that commits them with the offsets."""
        began = time.monotonic()
        upsert = self.spec.sink.merge == "upsert"

        def write(batches):
            keys: list | None = [] if upsert else None  # a refused first try of fetched() starts over
            return (*self.store.write_files(table, batches, keys), keys)

        files, rows, keys = fetched(output.results, write)
        written = time.monotonic()
        committed = self.store.commit_files(table, plan, files, self.store.upsert_keys(keys) if upsert else None)
        log.info("Iceberg sink %s: %d row(s) in %d file(s) written in %.2f s; snapshot committed in %.2f s",
                 self.spec.sink.table, rows, len(files), written - began, time.monotonic() - written)
        return (COMMITTED, rows) if committed else (NOOP, 0)

    @property
    def place(self) -> str:
        return f"Iceberg table {self.spec.sink.table!r}"

    def own_checkpoints(self, tps: list[TP]) -> dict[TP, int | None]:
        """The table's snapshot offsets: the truth."""
        return self.store.checkpoints(tps)

    def publish(self, tps: list[TP], planned_ms: int | None = None) -> dict:
        """The table's checkpoints of ``tps`` as they are now, to the Kafka group; read again after,
        and published again where a run committed meanwhile (a value read before a run's commit
        must not stay behind that run's own mirror)."""
        published: dict = {}
        for _ in range(3):
            current = {tp: o for tp, o in self.store.checkpoints(tps).items() if o is not None}
            if current == published:
                break
            alter_group_offsets(self.settings, self.spec.source.group_id, current, planned_ms)
            published = current
        return published

    def keep_checkpoints(self) -> None:
        """Where a compaction committed after this pipeline's last snapshot, a snapshot of no files
        carries its offsets again (so that expiring old snapshots keeps them)."""
        table = self.store.table(self.spec.sink.table)
        if table is not None and self.store.carry(table):
            log.info("Iceberg table %s: pipeline %s's offsets carried into a new snapshot", self.spec.sink.table,
                     self.spec.name)

    def move(self, plan: Plan) -> None:
        """The offsets moved by a snapshot of no files."""
        table = self.store.table(self.spec.sink.table)
        if table is None:
            raise SpecError(f"{self.spec.path}: Iceberg table {self.spec.sink.table!r} does not exist yet: nothing to "
                            "reset (its first run creates it)")
        if self.store.check(table, plan, "table"):
            self.store.commit_files(table, plan, [], reset=True)
