"""Kafka sink: results and dead letters written transactionally with the consumed offsets.

``atomic``: one transaction on the driver; rows stream to it with ``toLocalIterator`` (one
Spark partition at a time), never collected whole. ``per_partition``: one transaction per source
partition, on the executors, under that partition's own transactional.id.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Iterator

from kafka_eos.errors import DeadLetterWithoutTopic, SpecError
from kafka_eos.manifest import COMMITTED, checkpoint_key, checkpoint_record, now_iso, partition_key, run_key
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.txn import CommitResult, OutRecord, TransactionalCommit, dead_letter_headers

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: Columns a Kafka-sink transform must return (kafka_eos.transforms documents the contract).
REQUIRED_COLUMNS = ("key", "value", "topic", "partition", "offset", DLQ_REASON)


def check_output(df: "DataFrame", spec: PipelineSpec) -> None:
    """Reject a transform output the Kafka sink cannot commit exactly once.

    :raises SpecError: naming the missing column, or the shuffle in per_partition scope.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(f"{spec.path}: transform: {spec.transform} output lacks column(s) "
                        f"{', '.join(missing)} (see kafka_eos.transforms)")
    if spec.sink.commit == "per_partition":
        physical = df._jdf.queryExecution().executedPlan().toString()
        if "Exchange" in physical:
            raise SpecError(f"{spec.path}: transform: {spec.transform} shuffles (an Exchange in its plan); "
                            "per_partition scope needs a row-wise transform: use commit: atomic")


def _no_dead_letter_topic(spec: PipelineSpec, row) -> DeadLetterWithoutTopic:
    return DeadLetterWithoutTopic(
        f"{row['topic']}-{row['partition']} offset {row['offset']}: dead letter ({row[DLQ_REASON]}) but "
        f"{spec.path} has no sink.dlq_topic: nothing of this batch was committed; "
        "set sink.dlq_topic or fix the record")


def check_one_task_per_partition(df: "DataFrame", spec: PipelineSpec, plan: Plan) -> None:
    """per_partition scope: each source partition's rows must be in exactly one Spark task.
    A union (no Exchange) puts a partition's rows in two tasks; the second would find the range
    committed by the first and drop its rows.

    :raises SpecError: the output has more or fewer Spark partitions than source ranges.
    """
    ranges = sum(1 for r in plan.active if not r.empty)
    tasks = df.rdd.getNumPartitions()
    if tasks != ranges:
        raise SpecError(f"{spec.path}: transform: {spec.transform} turns {ranges} source partitions into {tasks} "
                        "Spark partitions (a union?); per_partition scope needs one task per source "
                        "partition: use commit: atomic")


def to_records(rows: Iterable, spec: PipelineSpec, tally: Counter | None = None) -> Iterator[OutRecord]:
    """Rows of a transform's output -> records for the sink or the dead-letter topic.

    :param tally: when given, counts ``((topic, partition), "out" | "dead")`` per source partition.
    :raises DeadLetterWithoutTopic: a dead letter, and the sink has no ``dlq_topic`` (the
        transaction it was meant for aborts: nothing of the batch is committed).
    """
    sink_topic, dlq_topic, added = spec.sink.topic, spec.sink.dlq_topic, list(spec.sink.headers)
    for row in rows:
        carried = row["headers"] if "headers" in row.__fields__ else None
        headers = [(h["key"], h["value"]) for h in carried or ()] + added
        reason = row[DLQ_REASON]
        if tally is not None:
            tally[((row["topic"], row["partition"]), "out" if reason is None else "dead")] += 1
        if reason is None:
            yield sink_topic, row["key"], row["value"], headers
        elif dlq_topic is None:
            raise _no_dead_letter_topic(spec, row)
        else:
            yield (dlq_topic, row["key"], row["value"],
                   headers + dead_letter_headers(reason, row["topic"], row["partition"], row["offset"]))


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
                               timeout_ms=spec.sink.transaction_timeout_s * 1000, keep_open=keep_open)


def partition_commit(spec: PipelineSpec, r: PartitionRange, settings: KafkaSettings) -> TransactionalCommit:
    """The transaction of one source partition, under its own transactional.id; it also fences
    the group-level id (an atomic attempt of the same work)."""
    return TransactionalCommit(settings, spec.transactional_id(r.topic, r.partition), spec.source.group_id, [r],
                               spec.sink.dlq_topic, fences=[spec.transactional_id()],
                               timeout_ms=spec.sink.transaction_timeout_s * 1000)


def write_atomic(df: "DataFrame | None", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                 summary: dict, tally: Counter | None = None,
                 commit: TransactionalCommit | None = None) -> CommitResult:
    """One transaction for the whole plan, on the driver.

    :param tally: filled with per-source-partition counts (see :func:`to_records`).
    :param commit: a long-lived commit set to the plan's ranges (stream mode); else a new one.
    """
    from pyspark import StorageLevel

    if df is not None:
        # Compute first, commit after: the transaction stays open only while cached rows stream
        # to the producer, not while Spark reads and transforms (its timeout would abort it).
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        df.count()
    rows = df.toLocalIterator(prefetchPartitions=True) if df is not None else ()
    commit = commit or atomic_commit(spec, plan, settings)

    def manifest(out: int, dead: int):
        record = {**summary, "status": COMMITTED, "records_out": out, "dead_letters": dead,
                  "records_in": out + dead, "committed_at": now_iso()}
        return [(spec.manifest_topic, run_key(plan.pipeline, plan.run_id), record),
                *_checkpoint_records(spec, plan, plan.active)]

    try:
        return commit.run(to_records(rows, spec, tally), manifest)
    finally:
        if df is not None:
            df.unpersist()


def _checkpoint_records(spec: PipelineSpec, plan: Plan, ranges: Iterable[PartitionRange]):
    return [(spec.manifest_topic, checkpoint_key(spec.name, r.topic, r.partition),
             checkpoint_record(plan.run_id, spec.source.group_id, r.topic, r.partition, r.until)) for r in ranges]


def commit_partition(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                     r: PartitionRange, rows: Iterable) -> CommitResult:
    """The transaction of one source partition (on an executor, or on the driver when the
    partition produced no rows at all)."""
    commit = partition_commit(spec, r, settings)

    def manifest(out: int, dead: int):
        record = {"status": COMMITTED, "records_out": out, "dead_letters": dead, "records_in": out + dead,
                  "from": r.from_offset, "until": r.until, "committed_at": now_iso()}
        return [(spec.manifest_topic, partition_key(plan.pipeline, plan.run_id, r.topic, r.partition), record),
                *_checkpoint_records(spec, plan, [r])]

    return commit.run(to_records(rows, spec), manifest)


def task_sources(df: "DataFrame", spec: PipelineSpec) -> tuple[dict[int, tuple[str, int]], dict | None]:
    """Before anything commits: which source partition each Spark task of ``df`` holds, and,
    for a sink without ``dlq_topic``, the first dead letter (None when there is none).

    :raises SpecError: a task holds rows of two source partitions, or a source partition's rows
        are in two tasks (a union, a join that moved rows): the scope needs one task per partition.
    """
    need_dead_letter = spec.sink.dlq_topic is None

    def scan(index: int, rows: Iterator) -> Iterator[tuple]:
        tps, dead = set(), None
        for row in rows:
            tps.add((row["topic"], row["partition"]))
            if need_dead_letter and dead is None and row[DLQ_REASON] is not None:
                dead = {k: row[k] for k in ("topic", "partition", "offset", DLQ_REASON)}
        yield index, sorted(tps), dead

    owner: dict[int, tuple[str, int]] = {}
    first_dead = None
    for index, tps, dead in df.rdd.mapPartitionsWithIndex(scan).collect():
        first_dead = first_dead or dead
        if len(tps) > 1:
            raise SpecError(f"{spec.path}: transform: {spec.transform} puts rows of "
                            f"{', '.join(f'{t}-{p}' for t, p in tps)} in one Spark task; per_partition scope "
                            "needs a row-wise transform: use commit: atomic")
        if tps:
            owner[index] = tps[0]
    if len(set(owner.values())) < len(owner):
        twice = sorted({tp for tp in owner.values() if list(owner.values()).count(tp) > 1})
        raise SpecError(f"{spec.path}: transform: rows of {', '.join(f'{t}-{p}' for t, p in twice)} are in two "
                        f"Spark tasks; per_partition scope needs a row-wise transform: use commit: atomic")
    return owner, first_dead


def _commit_spark_partition(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                            owner: dict[int, tuple[str, int]]):
    ranges = {r.tp: r for r in plan.active}

    def run(index: int, rows: Iterator) -> Iterator[tuple]:
        if index not in owner:
            return  # no rows when checked: the driver commits its partition offsets-only
        r = ranges[owner[index]]

        def checked_rows():
            # The rows are read again from the cache, or recomputed if an executor lost it: any
            # row of another partition stops the task before it commits.
            for row in rows:
                if (row["topic"], row["partition"]) != r.tp:
                    raise RuntimeError(f"rows of {row['topic']}-{row['partition']} in the task of "
                                       f"{r.topic}-{r.partition}: the transform is not deterministic")
                yield row

        res = commit_partition(spec, plan, settings, r, checked_rows())
        yield (r.topic, r.partition, res.status, res.records_out, res.dead_letters)

    return run


def write_per_partition(df: "DataFrame | None", spec: PipelineSpec, plan: Plan,
                        settings: KafkaSettings) -> dict[tuple[str, int], CommitResult]:
    """One transaction per source partition, on the executors; then offsets-only transactions,
    from the driver, for every planned partition whose task had no rows (empty ranges, all
    filtered out).

    Which task holds which source partition is decided before any partition commits: the
    transform's output is cached, checked (:func:`task_sources`), then committed from the cache.
    """
    from pyspark import StorageLevel

    results: dict[tuple[str, int], CommitResult] = {}
    if df is not None:
        check_one_task_per_partition(df, spec, plan)
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            owner, dead = task_sources(df, spec)
            if dead is not None:
                raise _no_dead_letter_topic(spec, dead)
            for topic, partition, status, out, dead_letters in df.rdd.mapPartitionsWithIndex(
                    _commit_spark_partition(spec, plan, settings, owner)).collect():
                results[(topic, partition)] = CommitResult(status, out, dead_letters)
        finally:
            df.unpersist()
    for r in plan.active:
        if r.tp not in results:
            results[r.tp] = commit_partition(spec, plan, settings, r, ())
    return results
