"""Kafka sink: results and dead letters written transactionally with the consumed offsets.

``atomic`` (here): one transaction on the driver; rows stream to it as Arrow batches as Spark's
tasks end (one job computes every task at once: :func:`kafka_eos.sinks.batches.computed`), never
collected whole. ``per_partition`` (:mod:`kafka_eos.sinks.per_partition`): one transaction per
source partition, on the executors, under that partition's own transactional.id. Rows reach
Python as Arrow batches in both (:mod:`kafka_eos.sinks.batches`). The output checks and manifest
records both scopes share are here.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Iterable

from kafka_eos.errors import SpecError, TransactionTimedOut
from kafka_eos.manifest import COMMITTED, checkpoint_key, checkpoint_record, now_iso, run_key
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.sinks import batches
from kafka_eos.sinks.limits import producer_batch_bytes
from kafka_eos.txn import CommitResult, TransactionalCommit

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: Columns a Kafka-sink transform must return (kafka_eos.transforms documents the contract).
REQUIRED_COLUMNS = ("key", "value", "topic", "partition", "offset", DLQ_REASON)


def check_output(df: "DataFrame", spec: PipelineSpec) -> None:
    """Reject a transform output the Kafka sink cannot commit exactly once.

    :raises SpecError: naming the missing column.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(f"{spec.path}: transform: {spec.transform} output lacks column(s) "
                        f"{', '.join(missing)} (see kafka_eos.transforms)")


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
    rows = batches.computed(df)
    try:
        # One pass: the transaction is open while Spark computes; rows go to the producer as
        # each task ends (the job starts once the commit has fenced and checked its checkpoint).
        return commit.run(batches.records(rows, spec, tally), manifest)
    except Exception as exc:  # noqa: BLE001 - only the two below fall back; the rest is raised
        why = one_pass_limit(exc)
        if why is None:
            raise
    finally:
        # The one-pass job never outlives its transaction: cancelled here, whatever ended it,
        # not when the garbage collector gets to the generators (an exception's traceback keeps
        # them alive; meanwhile the job's unread results block Spark's scheduler).
        rows.close()
    # Nothing of the aborted transaction is visible. Two passes: computed and cached first, the
    # transaction open only while the cached rows stream to the producer.
    print(f"kafka-eos: {plan.pipeline}: {why}; computing the output first, then committing it",
          file=sys.stderr, flush=True)
    if tally is not None:
        tally.clear()
    commit.close()
    return write_cached(df, commit, spec, tally, manifest)


def one_pass_unsafe(df: "DataFrame") -> str | None:
    """Why one pass could run the driver out of memory, or None: its tasks' results wait on the
    driver's heap while the producer takes them, up to ``spark.driver.maxResultSize``, which must
    then be well below the heap (0, no limit, is not) for Spark's own limit to stop the job (and
    the run to fall back to two passes) before the heap is full."""
    from kafka_eos.spark_io import ONE_PASS_HEAP_SHARE, result_limits

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
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        df.count()
        rows = df.mapInArrow(batches.pack, batches.PACKED_SCHEMA).toLocalIterator(prefetchPartitions=True)
        return commit.run(batches.records(batches.unpack(rows), spec, tally), manifest)
    finally:
        df.unpersist()


def committed_record(out: int, dead: int) -> dict:
    """The fields of a manifest record written inside the transaction that committed its work.
    ``read: whole``: the commit saw its input's end as Spark ended it (:mod:`kafka_eos.sinks.proof`;
    the atomic scope: the job's own result, before the commit), which records of versions
    without the proof lack (``kafka-eos audit`` tells them apart)."""
    return {"status": COMMITTED, "records_out": out, "dead_letters": dead, "records_in": out + dead,
            "committed_at": now_iso(), "read": "whole"}


def checkpoint_records(spec: PipelineSpec, plan: Plan, ranges: Iterable[PartitionRange]):
    """The manifest's checkpoint records of ``ranges``, written inside the transaction that commits them."""
    return [(spec.manifest_topic, checkpoint_key(spec.name, r.topic, r.partition),
             checkpoint_record(plan.run_id, spec.source.group_id, r.topic, r.partition, r.until)) for r in ranges]
