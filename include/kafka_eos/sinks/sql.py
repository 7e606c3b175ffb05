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
   :meth:`MirroredSink.checkpoints`, :meth:`MirroredSink.repair`), then the run's manifest record.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from kafka_eos.probes import point
from kafka_eos.formats import dead_letter_bytes
from kafka_eos.kafka_admin import TP
from kafka_eos.plan import Plan
from kafka_eos.sinks.base import MirroredSink, Outcome, Output, results_apart
from kafka_eos.sinks.batches import fetched
from kafka_eos.sinks.sql_store import ArrowSpool, SqlStore, Spool, as_bytes
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class SqlSink(MirroredSink):
    """A SQL sink (the module's steps)."""

    store_type = SqlStore
    store: SqlStore

    def _start(self) -> None:
        """1. The offsets and dead-letter tables (and a SQLite file's folder)."""
        self.store.create_tables()

    def prepare(self, output: Output) -> Output:
        """2. Results and dead letters apart; a side run's range and generation as columns."""
        # pyspark: not at the top, where every process that plans (a DAG processor too) would load it.
        from pyspark.sql import functions as F

        output = results_apart(output)
        results = output.results
        if results is not None:
            for name, value in self.spec.sink.columns:  # a side run's range and generation
                results = results.withColumn(name, F.lit(value))
        return output._replace(results=results)

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 3–5."""
        counting = time.monotonic()
        with self.counted(output) as records_in:
            log.info("SQL sink %s: source read and counted in %.2f s", self.spec.sink.table, time.monotonic() - counting)
            status, out, dead = self._commit(plan, output)
        point("after_sql_commit")
        # 5. The mirror, then the run's manifest record.
        return self.finish(plan, record, Outcome(status, records_in, out, dead))

    def _commit(self, plan: Plan, output: Output) -> tuple[str, int, int]:
        """Steps 3 (the spools) and 4 (the database transaction)."""
        store = self.store
        table = store.results_table(output.results) if output.results is not None else None
        began = time.monotonic()
        dead_spool = Spool(dead_letter_rows(self.spec, plan, output.dead_letters, output.undecodable))
        spooled = time.monotonic()
        # merge: replace keeps a key's last row (row by row, in order, where a key comes twice):
        # in the order of the source partition's offsets, not of the tasks' ends.
        result_spool = fetched(output.results, ArrowSpool, ordered=self.spec.sink.merge == "replace") \
            if output.results is not None else None
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

    @property
    def place(self) -> str:
        return f"SQL sink {self.spec.sink.table!r}"

    def own_checkpoints(self, tps: list[TP]) -> dict[TP, int | None]:
        """The sink's offsets table: the truth."""
        return self.store.checkpoints(tps)

    def publish(self, tps: list[TP], planned_ms: int | None = None) -> dict:
        """Read and published while the offsets rows are locked (see :meth:`SqlStore.publish_checkpoints`)."""
        return self.store.publish_checkpoints(self.settings, tps, planned_ms)

    def move(self, plan: Plan) -> None:
        """The offsets rows moved in a database transaction of no rows."""
        self.store.create_tables()
        self.store.commit(plan, None, None, iter(()))

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
