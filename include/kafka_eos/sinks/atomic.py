"""The ``atomic`` commit scope of a Kafka sink: one transaction for the whole plan, on the driver,
under the pipeline's group-level transactional.id (docs/architecture.md, "Commit protocol").

:meth:`AtomicSink.commit` takes a run through these steps (1 and 2 are :class:`KafkaSink`'s):

1. Before Spark starts: the transaction timeout and the written topics' record limits.
2. The output checked and encoded; records that did not decode joined to it as dead letters.
3. The transaction opens (:class:`kafka_eos.txn.TransactionalCommit`: fence, check the checkpoint),
   and rows stream to it as Arrow batches as Spark's tasks end (**one pass**: one job computes
   every task at once, :func:`kafka_eos.sinks.batches.computed`), never collected whole. The job's
   own result, raised before its last row, is the proof that the range was read whole. (A task's
   last bytes reach the driver's Python only when the next task's result, or the job's end, pushes
   them out of Spark's socket buffer, 8 KB: with small tasks the transaction opens when the job
   is nearly done. Measured: a task done 5 s into a 22-s job was handed over at 21.7 s.)
   A batch run's one pass is produced from the JVM instead (the driver's by Py4J, a Connect
   server's through kafka-eos's plugin: :func:`kafka_eos.sinks.jvm_writer.atomic`): the job ends
   first, its tasks' rows handed to the driver whole, and only then the transaction opens and takes
   them in the same order. A stream's batches (its kept producer) take the Python producer.
4. Where one pass cannot be safe (``spark.driver.maxResultSize`` near the heap) or failed for a
   reason two passes do not meet (an output over maxResultSize; with the Python producer, the
   transaction timed out while Spark computed), **two passes**: computed and cached first, then
   streamed to a new transaction.
5. The transaction commits the rows, the dead letters, the offsets, the run's manifest record
   and each partition's checkpoint record together.

A stream keeps one producer for every batch (``keep``), fenced once over every source partition
(:meth:`AtomicSink.cover`).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Iterable

from kafka_eos.errors import TransactionTimedOut
from kafka_eos.kafka_admin import TP
from kafka_eos.manifest import NOOP, run_key
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks import batches, jvm_writer
from kafka_eos.sinks.base import Outcome, Output
from kafka_eos.sinks.kafka import KafkaSink, checkpoint_records, committed_record, with_dead_letters
from kafka_eos.sinks.limits import producer_batch_bytes
from kafka_eos.spark_io import ONE_PASS_HEAP_SHARE, result_limits
from kafka_eos.spec import PipelineSpec
from kafka_eos.txn import CommitResult, TransactionalCommit

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


class AtomicSink(KafkaSink):
    """A Kafka sink in ``atomic`` scope (the module's steps)."""

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> None:
        super().__init__(spec, settings, keep)
        #: A stream's long-lived commit (:meth:`cover`), and the partitions it fences.
        self._commit: TransactionalCommit | None = None
        self._covered: list[TP] = []

    def prepare(self, output: Output) -> Output:
        """Steps 1–2, and the records that did not decode joined to the output as dead letters
        (one transaction: written from the driver with the rest)."""
        output = super().prepare(output)
        if output.undecodable is None:
            return output
        return output._replace(results=with_dead_letters(output.results, output.undecodable), undecodable=None)

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 3–5 (:func:`write_atomic`)."""
        tally: Counter = Counter()
        commit = self._commit.use(plan.active, plan.planned_ms) if self._commit is not None else None
        res = write_atomic(output.results, self.spec, plan, self.settings, record, tally, commit)
        counts = None if res.status == NOOP else \
            {r.tp: (tally[(r.tp, "out")], tally[(r.tp, "dead")]) for r in plan.active}
        return Outcome(res.status, res.records_out + res.dead_letters, res.records_out, res.dead_letters, counts)

    def refresh(self, plan: Plan) -> None:
        """An offsets-only transaction of the whole plan under the pipeline's id."""
        atomic_commit(self.spec, plan, self.settings).run([])

    def reset(self, plan: Plan) -> None:
        """As :meth:`refresh`, the ranges moving (nothing to move: nothing done)."""
        if plan.active:
            self.refresh(plan)

    def cover(self, tps: list[TP]) -> None:
        """A stream's one producer, fencing every source partition's per_partition id: built again
        (and fencing again) when partitions were added."""
        if tps == self._covered:
            return
        if self._commit is not None:
            self._commit.close()
        empty = Plan(self.spec.name, "stream", ())
        self._commit = atomic_commit(self.spec, empty, self.settings, partitions=tps, keep_open=True)
        self._covered = list(tps)

    def forget(self) -> None:
        """The next batch builds a new producer: its init_transactions() settles an unsettled commit."""
        if self._commit is not None:
            self._commit.close()

    def close(self) -> None:
        self.forget()
def atomic_commit(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                  partitions: Iterable[tuple[str, int]] | None = None, keep_open: bool = False) -> TransactionalCommit:
    """The transaction of a whole plan, under the pipeline's group-level transactional.id; it
    also fences the per-partition ids of the plan's partitions.

    :param partitions: fence these partitions' ids instead (a long-lived commit: every source
        partition, since later plans may hold partitions this one does not).
    :param keep_open: one producer for many transactions (see :class:`TransactionalCommit`).
    """
    tps = [r.tp for r in plan.active] if partitions is None else list(partitions)
    return TransactionalCommit(settings, spec.transactional_id(), spec.source.group_id, plan.active,
                               spec.sink.dlq_topic, fences=[spec.transactional_id(t, p) for t, p in tps],
                               timeout_ms=spec.sink.transaction_timeout_s * 1000, keep_open=keep_open,
                               planned_ms=plan.planned_ms)


def write_atomic(df: "DataFrame | None", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                 summary: dict, tally: Counter | None = None,
                 commit: TransactionalCommit | None = None) -> CommitResult:
    """One transaction for the whole plan, on the driver.

    :param tally: filled with per-source-partition counts (see :func:`kafka_eos.sinks.batches.records`).
    :param commit: a long-lived commit set to the plan's ranges (stream mode); else a new one.
    """
    kept = commit is not None
    commit = commit or atomic_commit(spec, plan, settings)
    if commit.batch_bytes is None:  # read when its producer is built (a stream's: at its first batch)
        commit.batch_bytes = producer_batch_bytes(spec)

    def manifest(out: int, dead: int):
        return [(spec.manifest_topic, run_key(plan.pipeline, plan.run_id), {**summary, **committed_record(out, dead)}),
                *checkpoint_records(spec, plan, plan.active)]

    if df is None:
        return commit.run(batches.records((), spec, tally), manifest)
    df = batches.prepared(df, plan.offsets)
    why = one_pass_unsafe(df)
    if why is not None:  # two passes from the start
        print(f"kafka-eos: {plan.pipeline}: {why}; computing the output first, then committing it",
              file=sys.stderr, flush=True)
        return write_cached(df, commit, spec, tally, manifest)
    done: CommitResult | str | None = None
    if not kept and jvm_writer.atomic_applies(df):
        try:
            # One pass, the records produced from the driver's JVM (kafka_eos.sinks.jvm_writer); None:
            # a Spark Connect server whose plugin does not run it (nothing ran).
            done = jvm_writer.atomic(df, spec, plan, settings, summary, tally)
        except Exception as exc:  # noqa: BLE001 - only Spark's limit on the results falls back; the rest is raised
            # (Its transaction is open only while it produces, after the job: two passes would not
            # shorten it, so a timeout is raised as it is.)
            if not batches.result_too_large(exc):
                raise
            done = one_pass_limit(exc)
    if done is None:
        done = write_one_pass(df, commit, spec, tally, manifest)
    if not isinstance(done, str):
        return done
    why = done
    # Nothing of the aborted transaction is visible. Two passes: computed and cached first, the
    # transaction open only while the cached rows stream to the producer.
    print(f"kafka-eos: {plan.pipeline}: {why}; computing the output first, then committing it",
          file=sys.stderr, flush=True)
    if tally is not None:
        tally.clear()
    commit.close()
    return write_cached(df, commit, spec, tally, manifest)


def write_one_pass(df: "DataFrame", commit: TransactionalCommit, spec: PipelineSpec, tally: Counter | None,
                   manifest) -> CommitResult | str:
    """One pass through the driver's Python producer: the transaction is open while Spark computes;
    rows go to the producer as each task ends (the job starts once the commit has fenced and checked
    its checkpoint). Its result, or why two passes must take the run (:func:`one_pass_limit`)."""
    rows = batches.computed(df)
    try:
        return commit.run(batches.records(rows, spec, tally), manifest)
    except Exception as exc:  # noqa: BLE001 - only the two below fall back; the rest is raised
        why = one_pass_limit(exc)
        if why is None:
            raise
        return why
    finally:
        # The one-pass job never outlives its transaction: cancelled here, whatever ended it,
        # not when the garbage collector gets to the generators (an exception's traceback keeps
        # them alive; meanwhile the job's unread results block Spark's scheduler).
        rows.close()


def one_pass_unsafe(df: "DataFrame") -> str | None:
    """Why one pass could run the driver out of memory, or None: its tasks' results wait on the
    driver's heap while the producer takes them, up to ``spark.driver.maxResultSize``, which must
    then be well below the heap (0, no limit, is not) for Spark's own limit to stop the job (and
    the run to fall back to two passes) before the heap is full."""
    limit, heap = result_limits(df.sparkSession)
    if limit and limit <= ONE_PASS_HEAP_SHARE * heap:
        return None
    return (f"spark.driver.maxResultSize ({'no limit' if not limit else f'{limit >> 20} MiB'}) is more than "
            f"{ONE_PASS_HEAP_SHARE:.0%} of the driver's heap ({heap >> 20} MiB): one pass could fill the heap")


def one_pass_limit(exc: BaseException) -> str | None:
    """What made a one-pass atomic run fail that two passes do not meet, or None: its transaction
    outlasted the timeout while Spark computed, or its whole output was more than Spark lets one
    job return to the driver (``spark.driver.maxResultSize``; two passes return a task per job)."""
    if isinstance(exc, TransactionTimedOut):
        return str(exc)
    if batches.result_too_large(exc):
        return "the output is larger than spark.driver.maxResultSize lets one Spark job return to the driver"
    return None


def write_cached(df: "DataFrame", commit: TransactionalCommit, spec: PipelineSpec, tally: Counter | None,
                 manifest) -> CommitResult:
    """Two passes: ``df`` computed and cached before the transaction opens, then its rows stream
    from the cache to the producer one Spark task at a time (the executors pack the next while
    the driver produces)."""
    # pyspark: not at the top, where every process that plans (a DAG processor too) would load it.
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        df.count()
        rows = df.mapInArrow(batches.pack, batches.PACKED_SCHEMA).toLocalIterator(prefetchPartitions=True)
        return commit.run(batches.records(batches.unpack(rows), spec, tally), manifest)
    finally:
        df.unpersist()

