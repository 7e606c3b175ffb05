"""Kafka sink: results and dead letters written transactionally with the consumed offsets.

``atomic``: one transaction on the driver; rows stream to it as Arrow batches with
``toLocalIterator`` (one Spark partition at a time), never collected whole. ``per_partition``:
one transaction per source partition, on the executors, under that partition's own
transactional.id. Rows reach Python as Arrow batches in both (:mod:`kafka_eos.sinks.batches`).
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from kafka_eos.errors import SpecError
from kafka_eos.manifest import COMMITTED, checkpoint_key, checkpoint_record, now_iso, partition_key, run_key
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.sinks import batches
from kafka_eos.txn import CommitResult, TransactionalCommit

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
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


def check_no_shuffle(df: "DataFrame", spec: PipelineSpec) -> None:
    """per_partition scope: the transform must not shuffle.

    :raises SpecError: an Exchange in the physical plan.
    """
    physical = df._jdf.queryExecution().executedPlan().toString()
    if "Exchange" in physical:
        raise SpecError(f"{spec.path}: transform: {spec.transform} shuffles (an Exchange in its plan); "
                        "per_partition scope needs a row-wise transform: use commit: atomic")


def _one_task_per_partition(tasks: int, spec: PipelineSpec, plan: Plan) -> None:
    """per_partition scope: each source partition's rows must be in exactly one Spark task. A
    union (no Exchange) puts a partition's rows in two tasks; the second would find the range
    committed by the first and drop its rows.

    :raises SpecError: the output has more or fewer Spark partitions than source ranges.
    """
    ranges = sum(1 for r in plan.active if not r.empty)
    if tasks != ranges:
        raise SpecError(f"{spec.path}: transform: {spec.transform} turns {ranges} source partitions into {tasks} "
                        "Spark partitions (a union?); per_partition scope needs one task per source "
                        "partition: use commit: atomic")


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


def partition_commit(spec: PipelineSpec, r: PartitionRange, settings: KafkaSettings,
                     planned_ms: int | None = None) -> TransactionalCommit:
    """The transaction of one source partition, under its own transactional.id; it also fences
    the group-level id (an atomic attempt of the same work).

    :param planned_ms: when the range's plan was made (:attr:`Plan.planned_ms`)."""
    return TransactionalCommit(settings, spec.transactional_id(r.topic, r.partition), spec.source.group_id, [r],
                               spec.sink.dlq_topic, fences=[spec.transactional_id()],
                               timeout_ms=spec.sink.transaction_timeout_s * 1000, planned_ms=planned_ms)


def write_atomic(df: "DataFrame | None", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                 summary: dict, tally: Counter | None = None,
                 commit: TransactionalCommit | None = None) -> CommitResult:
    """One transaction for the whole plan, on the driver.

    :param tally: filled with per-source-partition counts (see :func:`kafka_eos.sinks.batches.records`).
    :param commit: a long-lived commit set to the plan's ranges (stream mode); else a new one.
    """
    from pyspark import StorageLevel

    if df is not None:
        # Compute first, commit after: the transaction stays open only while cached rows stream
        # to the producer, not while Spark reads and transforms (its timeout would abort it).
        df = batches.prepared(df).persist(StorageLevel.MEMORY_AND_DISK)
        df.count()
    # From the cache to the driver as Arrow batches, one Spark task at a time; the executors
    # pack the next while the driver produces.
    rows = (df.mapInArrow(batches.pack, batches.PACKED_SCHEMA).toLocalIterator(prefetchPartitions=True)
            if df is not None else ())
    commit = commit or atomic_commit(spec, plan, settings)

    def manifest(out: int, dead: int):
        record = {**summary, "status": COMMITTED, "records_out": out, "dead_letters": dead,
                  "records_in": out + dead, "committed_at": now_iso()}
        return [(spec.manifest_topic, run_key(plan.pipeline, plan.run_id), record),
                *_checkpoint_records(spec, plan, plan.active)]

    try:
        return commit.run(batches.records(batches.unpack(rows), spec, tally), manifest)
    finally:
        if df is not None:
            df.unpersist()


def _checkpoint_records(spec: PipelineSpec, plan: Plan, ranges: Iterable[PartitionRange]):
    return [(spec.manifest_topic, checkpoint_key(spec.name, r.topic, r.partition),
             checkpoint_record(plan.run_id, spec.source.group_id, r.topic, r.partition, r.until)) for r in ranges]


def commit_partition(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                     r: PartitionRange, rows: Iterable["pa.RecordBatch"]) -> CommitResult:
    """The transaction of one source partition (on an executor, or on the driver when the
    partition produced no rows at all).

    :param rows: the partition's rows, as Arrow record batches of :func:`batches.prepared` columns.
    """
    commit = partition_commit(spec, r, settings, plan.planned_ms)

    def manifest(out: int, dead: int):
        record = {"status": COMMITTED, "records_out": out, "dead_letters": dead, "records_in": out + dead,
                  "from": r.from_offset, "until": r.until, "committed_at": now_iso()}
        return [(spec.manifest_topic, partition_key(plan.pipeline, plan.run_id, r.topic, r.partition), record),
                *_checkpoint_records(spec, plan, [r])]

    return commit.run(batches.records(rows, spec), manifest)


#: Job descriptions of the per_partition passes (Spark's UI and event log show them per job).
SCAN_JOB = "kafka-eos: which source partition each task holds"
COMMIT_JOB = "kafka-eos: one transaction per source partition"


@contextmanager
def _job_description(df: "DataFrame", description: str):
    sc = df.sparkSession.sparkContext
    sc.setJobDescription(description)
    try:
        yield
    finally:
        sc.setJobDescription(None)


#: What the scan of each Spark task returns (:func:`task_sources`).
_SCAN_SCHEMA = "task int, topics array<string>, partitions array<int>, dead string"
#: What the commit of each Spark task returns.
_COMMIT_SCHEMA = "topic string, partition int, status string, records_out long, dead_letters long"


def task_sources(df: "DataFrame", spec: PipelineSpec, plan: Plan) -> tuple[dict[int, tuple[str, int]], dict | None]:
    """Before anything commits: which source partition each Spark task of ``df`` holds, and,
    for a sink without ``dlq_topic``, the first dead letter (None when there is none).

    :param df: :func:`batches.prepared` columns.
    :raises SpecError: more or fewer tasks than source ranges, a task holds rows of two source
        partitions, or a source partition's rows are in two tasks (a union, a join that moved
        rows): the scope needs one task per partition.
    """
    need_dead_letter = spec.sink.dlq_topic is None

    def scan(arrow_batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        import pyarrow as pa
        from pyspark import TaskContext

        tps, dead = set(), None
        for batch in arrow_batches:
            tps |= batches.source_partitions(batch)
            if need_dead_letter and dead is None:
                dead = batches.first_dead_letter(batch)
        ordered = sorted(tps)
        yield pa.RecordBatch.from_pydict({
            "task": [TaskContext.get().partitionId()], "topics": [[t for t, _ in ordered]],
            "partitions": [[p for _, p in ordered]], "dead": [json.dumps(dead) if dead else None]},
            schema=pa.schema([("task", pa.int32()), ("topics", pa.list_(pa.string())),
                              ("partitions", pa.list_(pa.int32())), ("dead", pa.string())]))

    owner: dict[int, tuple[str, int]] = {}
    first_dead = None
    with _job_description(df, SCAN_JOB):
        scanned = df.mapInArrow(scan, _SCAN_SCHEMA).collect()  # one row per task
    _one_task_per_partition(len(scanned), spec, plan)
    for row in scanned:
        tps = list(zip(row["topics"], row["partitions"]))
        first_dead = first_dead or (json.loads(row["dead"]) if row["dead"] else None)
        if len(tps) > 1:
            raise SpecError(f"{spec.path}: transform: {spec.transform} puts rows of "
                            f"{', '.join(f'{t}-{p}' for t, p in tps)} in one Spark task; per_partition scope "
                            "needs a row-wise transform: use commit: atomic")
        if tps:
            owner[row["task"]] = tps[0]
    if len(set(owner.values())) < len(owner):
        twice = sorted({tp for tp in owner.values() if list(owner.values()).count(tp) > 1})
        raise SpecError(f"{spec.path}: transform: rows of {', '.join(f'{t}-{p}' for t, p in twice)} are in two "
                        f"Spark tasks; per_partition scope needs a row-wise transform: use commit: atomic")
    return owner, first_dead


def _commit_spark_partition(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                            owner: dict[int, tuple[str, int]]):
    ranges = {r.tp: r for r in plan.active}

    def run(arrow_batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        import pyarrow as pa
        from pyspark import TaskContext

        index = TaskContext.get().partitionId()
        if index not in owner:
            return  # no rows when checked: the driver commits its partition offsets-only
        r = ranges[owner[index]]

        def checked(arrow_batches):
            # The rows are read again from the cache, or recomputed if an executor lost it: any
            # row of another partition stops the task before it commits.
            for batch in arrow_batches:
                for t, p in batches.source_partitions(batch) - {r.tp}:
                    raise RuntimeError(f"rows of {t}-{p} in the task of {r.topic}-{r.partition}: "
                                       "the transform is not deterministic")
                yield batch

        res = commit_partition(spec, plan, settings, r, checked(arrow_batches))
        yield pa.RecordBatch.from_pydict(
            {"topic": [r.topic], "partition": [r.partition], "status": [res.status],
             "records_out": [res.records_out], "dead_letters": [res.dead_letters]},
            schema=pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("status", pa.string()),
                              ("records_out", pa.int64()), ("dead_letters", pa.int64())]))

    return run


def write_per_partition(df: "DataFrame | None", spec: PipelineSpec, plan: Plan,
                        settings: KafkaSettings) -> dict[tuple[str, int], CommitResult]:
    """One transaction per source partition, on the executors; then offsets-only transactions,
    from the driver, for every planned partition whose task had no rows (empty ranges, all
    filtered out).

    Which task holds which source partition is decided before any partition commits: the
    transform's output is cached, checked (:func:`task_sources`), then committed from the cache.
    Both passes move rows to Python as Arrow batches.
    """
    from pyspark import StorageLevel

    results: dict[tuple[str, int], CommitResult] = {}
    if df is not None:
        df = batches.prepared(df).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # Checked on the cached DataFrame's plan (it shows the plan it caches): Spark plans
            # the read once, not once for the check and again for the run.
            check_no_shuffle(df, spec)
            owner, dead = task_sources(df, spec, plan)
            if dead is not None:
                raise batches.no_dead_letter_topic(spec, dead["topic"], dead["partition"], dead["offset"],
                                                   dead[DLQ_REASON])
            with _job_description(df, COMMIT_JOB):
                committed = df.mapInArrow(_commit_spark_partition(spec, plan, settings, owner), _COMMIT_SCHEMA).collect()
            for row in committed:
                results[(row["topic"], row["partition"])] = CommitResult(row["status"], row["records_out"],
                                                                         row["dead_letters"])
        finally:
            df.unpersist()
    results.update(commit_rowless(spec, plan, settings, [r for r in plan.active if r.tp not in results]))
    return results


#: Offsets-only transactions committed at once from the driver (each waits on the broker).
ROWLESS_COMMITS_AT_ONCE = 8


def commit_rowless(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                   ranges: Sequence[PartitionRange]) -> dict[tuple[str, int], CommitResult]:
    """The offsets-only transactions of ``ranges`` (partitions with no rows: empty ranges, idle
    checkpoints committed again), each under its partition's own id, several at a time."""
    if len(ranges) <= 1:
        return {r.tp: commit_partition(spec, plan, settings, r, ()) for r in ranges}
    with ThreadPoolExecutor(min(ROWLESS_COMMITS_AT_ONCE, len(ranges)), thread_name_prefix="kafka-eos-rowless") as pool:
        done = pool.map(lambda r: commit_partition(spec, plan, settings, r, ()), ranges)
        return {r.tp: result for r, result in zip(ranges, done)}
