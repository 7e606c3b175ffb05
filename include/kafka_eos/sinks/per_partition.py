"""The ``per_partition`` commit scope of a Kafka sink: one transaction per source partition, on the
executors, under that partition's own transactional.id (docs/architecture.md, "Commit protocol").

:func:`write` takes a run through these steps:

1. Before anything commits, the output's shape: no Exchange in its plan (a shuffle mixes source
   partitions), and which Spark task holds which source partition. Where Spark's own lineage
   proves it (:func:`lineage_owner`: every step from the output back to the Kafka read keeps
   task *i*'s rows in task *i*, and each read task holds one whole planned range) the run takes
   **one pass**; otherwise the output is cached and scanned first (**two passes**,
   :func:`task_sources`), which also finds a dead letter without a dead-letter topic before any
   commit.
2. One transaction per task (:func:`commit_partition`, the steps of :mod:`kafka_eos.txn`). In one
   pass the task opens its transaction before its rows are read, produces while Spark reads and
   transforms, and commits at its end, as Kafka Streams and Flink's two-phase sink do; the
   transaction (and so the LSO of the output partitions it writes) is then open for the task's
   whole time. A one-pass batch run's tasks produce from the JVM (:mod:`kafka_eos.sinks.jvm_writer`:
   the same transaction, its rows never in Python); the Python commit task (:func:`_commit_task`)
   takes streams, two passes and records that did not decode. A task whose rows break the scope's rules (a row of another source partition, a
   dead letter and no dead-letter topic) aborts its transaction and reports a refusal instead of
   committing.
3. A refusal fails the run with one line naming the partition and the rule (the partitions of
   other tasks may have committed: each partition is its own unit of work), once step 5 has
   checked the partitions that committed (a short one fails the run first, and holds it).
4. Offsets-only transactions, from the driver, for planned partitions no task held (empty ranges;
   in two passes also a task whose rows were all filtered out).
5. The run's record (:meth:`PerPartitionSink.commit`): the counts each partition's transaction
   wrote (an earlier attempt's from its partition records), checked against Spark's own count of
   the rows it gave each task (:func:`kafka_eos.sinks.proof.check_rows`); a mismatch is recorded,
   then fails the run (and :func:`kafka_eos.pipeline.verify`), and holds the pipeline: nothing
   plans until an operator acknowledges it (``kafka-eos acknowledge``).

A stream's small batch (``keep=True``, at most :data:`DRIVER_BATCH_OFFSETS` planned offsets, the
tasks proven in step 1) takes step 2 on the driver instead (:func:`driver_commits`): its rows are
collected (one Spark job), checked as a task checks them before anything commits, and each
partition's transaction runs from the driver under its own id.

A stream (``keep=True``) keeps each partition's commit in the Python process that used it (a
reused Spark worker, or the driver) for its next batch (:func:`kept_commit`): its producer, its
epoch, its checkpoint reader and group metadata. Spark does not send a partition's task to the
same worker every time, so another worker may hold a producer of the same id: whichever inits last
fences the other, and a kept producer checks its epoch before it reads a row
(:class:`kafka_eos.txn.TransactionalCommit`, ``recheck_epoch``), building a new one if fenced.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from kafka_eos import probes
from kafka_eos.errors import DeadLetterWithoutTopic, KafkaEosError, RangeMismatch, RecordRefused, SpecError
from kafka_eos.kafka_admin import TP, keep_inherited
from kafka_eos.manifest import (COMMITTED, NOOP, ManifestStore, hold_key, hold_record, now_iso, partition_key,
                                produce_json, run_key)
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks import batches, jvm_writer, proof
from kafka_eos.sinks.base import Outcome, Output
from kafka_eos.sinks.kafka import KafkaSink, checkpoint_records, committed_record, dead_letter_batches
from kafka_eos.sinks.limits import producer_batch_bytes
from kafka_eos.spark_io import is_connect, read_layout
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.txn import CommitResult, TransactionalCommit

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame

class PerPartitionSink(KafkaSink):
    """A Kafka sink in ``per_partition`` scope (the module's steps)."""

    commits_on_driver = False
    partition_records = True

    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Steps 1–5."""
        spec, settings = self.spec, self.settings
        dead = dead_letter_batches(output.results, output.undecodable) if output.undecodable is not None else None
        per, rows, refusal = write(output.results, spec, plan, settings, keep=self.keep, dead=dead)  # 1.–4.
        producers = dict(Counter(r.producer for r in per.values() if r.producer))
        counts = {tp: (r.records_out, r.dead_letters) for tp, r in per.items()}
        out = sum(r.records_out for r in per.values())
        dead_letters = sum(r.dead_letters for r in per.values())
        status = NOOP if all(r.status == NOOP for r in per.values()) else COMMITTED
        # 5. The run record counts what the executors committed and returned. Partitions an
        # earlier, partly committed attempt of this run committed (noop now) count from their
        # manifest records, written inside their transactions; one not found there leaves
        # the run's counts marked incomplete rather than silently smaller.
        run_out, run_dead = out, dead_letters
        earlier = [tp for tp, r in per.items() if r.status == NOOP]
        missing: list[str] = []
        if earlier:
            _run, parts = ManifestStore.of(spec, settings).run_records(plan.run_id)
            for t, p in earlier:
                rec = parts.get(f"{t}-{p}")
                if rec is None:
                    missing.append(f"{t}-{p}")
                else:
                    run_out += rec["records_out"]
                    run_dead += rec["dead_letters"]
                    counts[(t, p)] = (rec["records_out"], rec["dead_letters"])
        record = {**record, "status": COMMITTED, "records_in": run_out + run_dead, "records_out": run_out,
                  "dead_letters": run_dead, "committed_at": now_iso(), "read": "whole"}
        if missing:
            record["counts_missing_for"] = missing
        # Verify: each partition's transaction wrote a record per row Spark gave it (a commit
        # that missed rows is recorded, then fails the run: a retry finds it again).
        mismatch = None
        # A refused partition's rows are in a job's total (above proof.COUNTED_RANGES ranges): not
        # checkable then, nor where a refusal made Spark's counts untrue (rows None).
        if output.results is not None and rows is not None and not ((missing or refusal) and isinstance(rows, int)):
            written = {tp: c for tp, c in counts.items() if f"{tp[0]}-{tp[1]}" not in missing}
            undecodable_rows = {tp: sum(len(b) for b in found) for tp, found in (dead or {}).items()}
            try:
                proof.check_rows(plan, rows, written, undecodable_rows)
            except RangeMismatch as exc:
                mismatch = exc
                record["mismatch"] = str(exc)
        store = ManifestStore.of(spec, settings)
        if refusal is not None:  # 3. a task refused: the run fails, its other commits checked first
            if mismatch is None:
                raise refusal
            store.put(hold_key(spec.name), hold_record(plan.run_id, str(mismatch)))
            raise RangeMismatch(f"{mismatch}; the run also refused a partition: {refusal}") from refusal
        if mismatch is None:
            store.put(run_key(spec.name, plan.run_id), record)
        else:
            # The run record keeps the finding under the run's id (a stream's next batch replaces
            # it); the hold under the pipeline's, and it stops every plan until acknowledged. Both in
            # one flush (in practice one produce request). The hold last: the newest record, which
            # a walk over the last runs passes (ManifestStore.last_runs_and_hold).
            produce_json(settings, store.topic, [(run_key(spec.name, plan.run_id), record),
                                                 (hold_key(spec.name), hold_record(plan.run_id, str(mismatch)))])
            raise mismatch
        if status == NOOP:  # an earlier attempt committed: this one counted nothing
            return Outcome(status, out + dead_letters, out, dead_letters, None, producers)
        # The run's counts, the partitions an earlier attempt committed included.
        return Outcome(status, run_out + run_dead, run_out, run_dead, counts, producers)

    def refresh(self, plan: Plan) -> None:
        """Offsets-only transactions, each under its partition's own id, several at a time."""
        commit_rowless(self.spec, plan, self.settings, plan.ranges)

    def reset(self, plan: Plan) -> None:
        """One offsets-only transaction per moving partition, each under its own id."""
        for r in plan.active:
            partition_commit(self.spec, r, self.settings).run([])

    def verify(self, plan: Plan) -> None:
        """A partition's transaction that wrote fewer records than Spark gave it: its run recorded it.

        :raises RangeMismatch: as the run recorded it.
        """
        if not plan.active:
            return
        record, _parts = ManifestStore.of(self.spec, self.settings).run_records(plan.run_id)
        if record is not None and record.get("mismatch"):
            raise RangeMismatch(record["mismatch"])


#: Job descriptions of the per_partition jobs (Spark's UI and event log show them per job).
SCAN_JOB = "kafka-eos: which source partition each task holds"
COMMIT_JOB = "kafka-eos: one transaction per source partition"

#: A task's status when its rows broke the scope's rules: its transaction was aborted.
REFUSED = "refused"
#: Offsets-only transactions committed at once from the driver (each waits on the broker).
ROWLESS_COMMITS_AT_ONCE = 8
#: A stream batch of at most this many planned offsets commits its partitions from the driver
#: (:func:`driver_commits`): its rows are few, and one process keeps every partition's producer
#: (no twin in another Spark worker fencing it); above, each task commits its own.
DRIVER_BATCH_OFFSETS = 20_000

#: A kept commit unused this long is closed at the next look into the cache (a stream that ended
#: while its Python workers live on, e.g. in a Spark Connect server).
KEPT_IDLE_S = 300.0
#: File descriptors one kept commit holds (its producer: measured 7-8 on librdkafka 2.16 against
#: one broker, more against more), with room: :func:`kept_limit` keeps a process's kept commits to
#: a share of its descriptor limit.
KEPT_COMMIT_FDS = 16
#: The share of the process's file-descriptor limit its kept commits may hold.
KEPT_FD_SHARE = 0.5

#: What each task of the scan (:func:`task_sources`) and of the commit job returns: one row, a JSON
#: object (the scan: ``task``, ``topics``, ``partitions``, ``dead``; a commit: its partition, how its
#: transaction ended, and for a refusal why), built without converting Python values into Arrow
#: (:func:`kafka_eos.sinks.batches.one_binary_row`).
_RESULT_SCHEMA = "result binary"


class _Refused(Exception):
    """Raised inside a task's records: the rows break the scope's rules (its transaction aborts)."""


class _NoRows(Exception):
    """Raised inside a one-pass task's records at their end when none came: its transaction
    aborts, and the driver commits the range offsets-only (step 4)."""


def partition_commit(spec: PipelineSpec, r: PartitionRange, settings: KafkaSettings,
                     planned_ms: int | None = None, keep: bool = False) -> TransactionalCommit:
    """The transaction of one source partition, under its own transactional.id; it also fences
    the group-level id (an atomic attempt of the same work).

    :param planned_ms: when the range's plan was made (:attr:`Plan.planned_ms`).
    :param keep: a long-lived commit for many transactions (:func:`kept_commit`)."""
    return TransactionalCommit(settings, spec.transactional_id(r.topic, r.partition), spec.source.group_id, [r],
                               spec.sink.dlq_topic, fences=[spec.transactional_id()],
                               timeout_ms=spec.sink.transaction_timeout_s * 1000, planned_ms=planned_ms,
                               keep_open=keep, recheck_epoch=keep, batch_bytes=producer_batch_bytes(spec),
                               shared_reader=keep)


#: This process's kept commits (:func:`kept_commit`): key -> (commit, last used, monotonic).
_kept: dict[tuple, tuple[TransactionalCommit, float]] = {}
_kept_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()`` (OpenLineage's event pool in a task process, say): no
    kept commits; the parent's, whose producers' librdkafka threads did not survive the fork, kept
    and never used, closed or destroyed (``kafka_admin.keep_inherited``). The child that commits
    builds its own, under the same transactional.ids: the parent's are fenced then."""
    global _kept, _kept_lock
    if _kept:
        keep_inherited(_kept)
    _kept, _kept_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _kept_key(spec: PipelineSpec, r: PartitionRange, settings: KafkaSettings) -> tuple:
    return (spec.transactional_id(r.topic, r.partition), spec.source.group_id, spec.sink.dlq_topic,
            spec.transactional_id(), spec.sink.transaction_timeout_s, producer_batch_bytes(spec),
            settings.key)


def kept_limit() -> int:
    """How many commits this process keeps at most: a share of its file-descriptor limit (a
    stream over hundreds of partitions kept a producer per partition and ran a driver with
    the usual limit of 1,024 out of descriptors). The least recently used go first."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(8, int(soft * KEPT_FD_SHARE) // KEPT_COMMIT_FDS)


@contextmanager
def kept_commit(spec: PipelineSpec, r: PartitionRange, settings: KafkaSettings, planned_ms: int | None):
    """The commit of ``r``'s partition this process kept from an earlier batch (or a new one),
    for one transaction; kept again if it ends well, closed if it fails (its producer's state is
    then unknown: the next batch builds a new one). Taken out of the cache while in use: one user
    at a time. Commits idle for :data:`KEPT_IDLE_S` are closed on the way."""
    key = _kept_key(spec, r, settings)
    now = time.monotonic()
    with _kept_lock:
        idle = [k for k, (_c, used) in _kept.items() if now - used > KEPT_IDLE_S and k != key]
        stale = [_kept.pop(k)[0] for k in idle]
        commit = _kept.pop(key, (None, 0.0))[0]
    for idle_commit in stale:
        idle_commit.close()
    if commit is None:
        commit = partition_commit(spec, r, settings, planned_ms, keep=True)
    try:
        yield commit.use([r], planned_ms)
    except BaseException:
        commit.close()
        raise
    with _kept_lock:
        _kept[key] = (commit, time.monotonic())
        over = len(_kept) - kept_limit()
        evicted = [_kept.pop(k)[0] for k, _v in sorted(_kept.items(), key=lambda kv: kv[1][1])[:max(0, over)]]
    for least_used in evicted:
        least_used.close()


def commit_partition(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                     r: PartitionRange, rows: Iterable["pa.RecordBatch"], keep: bool = False) -> CommitResult:
    """The transaction of one source partition (on an executor, or on the driver when the
    partition produced no rows at all).

    :param rows: the partition's rows, as Arrow record batches of :func:`batches.prepared` columns.
    :param keep: through this process's kept commit of the partition (a stream's batches).
    """
    def manifest(out: int, dead: int):
        record = {**committed_record(out, dead), "from": r.from_offset, "until": r.until}
        return [(spec.manifest_topic, partition_key(plan.pipeline, plan.run_id, r.topic, r.partition), record),
                *checkpoint_records(spec, plan, [r])]

    if not keep:
        return partition_commit(spec, r, settings, plan.planned_ms).run(batches.records(rows, spec), manifest)
    with kept_commit(spec, r, settings, plan.planned_ms) as commit:
        return commit.run(batches.records(rows, spec), manifest)


def check_no_shuffle(df: "DataFrame", spec: PipelineSpec) -> None:
    """Step 1: the transform must not shuffle.

    :raises SpecError: an Exchange in the physical plan.
    """
    # A Connect client's DataFrame has no JVM plan here: the server explains it.
    physical = df._explain_string(extended=False) if is_connect(df) else \
        df._jdf.queryExecution().executedPlan().toString()
    if "Exchange" in physical:
        raise SpecError(f"{spec.path}: transform: {spec.transform} shuffles (an Exchange in its plan); "
                        "per_partition scope needs a row-wise transform: use commit: atomic")


def lineage_owner(df: "DataFrame", plan: Plan) -> dict[int, TP] | None:
    """Step 1, one pass: which source partition each Spark task of ``df`` holds, proven from the
    lineage of the RDD Spark runs for it, before any task runs; None where it cannot be proven.

    The proof: every dependency from ``df``'s RDD back to the Kafka read is one-to-one (task *i*'s
    rows come from read task *i* only: no union, no coalesce, no shuffle), and the read's tasks
    hold the plan's non-empty ranges exactly, one whole range each. Spark builds the read's tasks
    from the same ranges each time the plan runs, so the task that commits reads what was checked
    here; each task still checks its rows' ``topic`` and ``partition`` as they stream.
    """
    read = read_layout(df)
    if read is None:
        return None
    planned = {r.tp: (r.from_offset, r.until) for r in plan.active if not r.empty}
    if sorted(tp for tp, _f, _u in read.values()) != sorted(planned) or \
            any(planned[tp] != (f, u) for tp, f, u in read.values()):
        return None  # a range split over tasks (or not read as planned): the scan decides
    return {index: tp for index, (tp, _f, _u) in read.items()}


def proven_dataframe(df: "DataFrame") -> "DataFrame":
    """Step 1, one pass: ``df`` as a DataFrame of the very RDD whose lineage :func:`lineage_owner`
    proved, so that the commit job runs that RDD (the proof's own object) instead of planning the
    transform again — a second plan reads the Kafka source's offsets again and compiles its code
    again (about a second of a run's first job in a new JVM). A Spark Connect client's DataFrame,
    or a Spark without the internal call this needs, is returned as it is (Spark plans it again;
    the tasks still check every row's source partition)."""
    if is_connect(df):
        return df
    try:
        session = df.sparkSession
        jdf = session._jsparkSession.internalCreateDataFrame(df._jdf.queryExecution().toRdd(), df._jdf.schema(), False)
        return type(df)(jdf, session)
    except Exception as exc:  # noqa: BLE001 - planned again, as before
        log.debug("per_partition: the proven RDD not reused (%s): the commit job plans the transform again", exc)
        return df


def task_sources(df: "DataFrame", spec: PipelineSpec, plan: Plan) -> tuple[dict[int, TP], dict | None]:
    """Step 1, two passes: which source partition each Spark task of ``df`` holds, and, for a sink
    without ``dlq_topic``, the first dead letter (None when there is none), from a scan of ``df``.

    :param df: :func:`batches.prepared` columns, cached (the commit pass reads them again).
    :raises SpecError: more or fewer tasks than source ranges, a task holds rows of two source
        partitions, or a source partition's rows are in two tasks (a union, a join that moved
        rows): the scope needs one task per partition.
    """
    need_dead_letter = spec.sink.dlq_topic is None

    def scan(arrow_batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        from pyspark import TaskContext

        tps, dead = set(), None
        for batch in arrow_batches:
            tps |= batches.source_partitions(batch)
            if need_dead_letter and dead is None:
                dead = batches.first_dead_letter(batch)
        ordered = sorted(tps)
        yield batches.one_binary_row("result", json.dumps({
            "task": TaskContext.get().partitionId(), "topics": [t for t, _ in ordered],
            "partitions": [p for _, p in ordered], "dead": dead}).encode())

    owner: dict[int, TP] = {}
    first_dead = None
    with _job_description(df, SCAN_JOB):
        scanned = [json.loads(row["result"]) for row in df.mapInArrow(scan, _RESULT_SCHEMA).collect()]  # one per task
    _one_task_per_partition(len(scanned), spec, plan)
    for row in scanned:
        tps = list(zip(row["topics"], row["partitions"]))
        first_dead = first_dead or row["dead"]
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


def _one_task_per_partition(tasks: int, spec: PipelineSpec, plan: Plan) -> None:
    """Each source partition's rows must be in exactly one Spark task. A union (no Exchange) puts
    a partition's rows in two tasks; the second would find the range committed by the first and
    drop its rows.

    :raises SpecError: the output has more or fewer Spark partitions than source ranges.
    """
    ranges = sum(1 for r in plan.active if not r.empty)
    if tasks != ranges:
        raise SpecError(f"{spec.path}: transform: {spec.transform} turns {ranges} source partitions into {tasks} "
                        "Spark partitions (a union?); per_partition scope needs one task per source "
                        "partition: use commit: atomic")


def _commit_task(spec: PipelineSpec, plan: Plan, settings: KafkaSettings, owner: dict[int, TP], one_pass: bool,
                 keep: bool, dead: dict):
    """Step 2: the ``mapInArrow`` function of the commit job; one transaction per task."""
    ranges = {r.tp: r for r in plan.active}
    fail_points = probes.carried()  # the run's test settings reach a Connect server's workers too

    def run(arrow_batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        with probes.applied(fail_points):
            yield from _run(arrow_batches)

    def _run(arrow_batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        from pyspark import TaskContext

        index = TaskContext.get().partitionId()
        if index not in owner:
            # No partition of its own (two passes: no rows when scanned). Its rows, if the job
            # was planned otherwise than the proof (a Connect server plans it again), are some
            # partition's: refused, so that the run fails before the driver commits any range
            # offsets-only.
            found = set()
            for batch in proof.whole(arrow_batches, f"Spark task {index}", "no range"):
                found |= batches.source_partitions(batch)
            if found:
                t, p = sorted(found)[0]
                yield _result_row((t, p), CommitResult(REFUSED), "SpecError",
                                  f"rows of {t}-{p} in Spark task {index}, which the proof of the task layout gave "
                                  "no source partition (the job was planned again otherwise): nothing of "
                                  f"{t}-{p} is committed by it", foreign=True)
            return
        r = ranges[owner[index]]

        def checked(arrow_batches):
            # One pass: the first look at the rows. Two passes: read again from the cache, or
            # recomputed if an executor lost it. Either way, a row of another partition stops the
            # task before it commits, and so does an input Spark did not end (proof.whole).
            seen = False
            for batch in proof.whole(arrow_batches, f"{r.topic}-{r.partition}", f"[{r.from_offset}, {r.until})"):
                for t, p in sorted(batches.source_partitions(batch) - {r.tp}):
                    raise _Refused(_relabelled(spec, (t, p), r.tp) if one_pass else
                                   f"rows of {t}-{p} in the task of {r.topic}-{r.partition}: the transform is not "
                                   "deterministic")
                seen = seen or len(batch) > 0
                yield batch
            if not seen and one_pass:
                # No row says which source partition this task read: the lineage's proof maps
                # tasks to ranges, and a re-plan (a Connect server's) could map them otherwise.
                # The driver commits the range offsets-only, after every task has had its say.
                raise _NoRows()

        refusal = reason = None
        foreign = False
        try:
            spark_rows = checked(arrow_batches)
            res = commit_partition(spec, plan, settings, r, itertools.chain(spark_rows, dead.get(r.tp, ())), keep)
            for _batch in spark_rows:
                # An earlier attempt committed the range (noop): its rows are read all the same, so
                # that Spark's count of them (proof.RowCount) is whole and checks that attempt's.
                pass
        except _NoRows:  # its transaction was aborted; step 4 commits the range
            return
        except (_Refused, DeadLetterWithoutTopic, RecordRefused) as exc:  # the transaction was aborted
            res = CommitResult(REFUSED)
            refusal, reason = type(exc).__name__, str(exc)
            # The rest of the input, read for Spark's count of it (step 5 checks the partitions
            # that committed): rows in it naming another partition make that count untrue.
            foreign = isinstance(exc, _Refused) or any(batches.source_partitions(b) - {r.tp} for b in arrow_batches)
        yield _result_row(r.tp, res, refusal, reason, foreign)

    return run


def _result_row(tp: TP, res: CommitResult, refusal: str | None, reason: str | None,
                foreign: bool = False) -> "pa.RecordBatch":
    """What a commit task returns for its partition (:data:`_RESULT_SCHEMA`); ``foreign``: a
    refused task met rows naming another partition (Spark's counts are not true then)."""
    return batches.one_binary_row("result", json.dumps({
        "topic": tp[0], "partition": tp[1], "status": res.status, "records_out": res.records_out,
        "dead_letters": res.dead_letters, "producer": res.producer, "refusal": refusal, "reason": reason,
        "foreign": foreign}).encode())


def _relabelled(spec: PipelineSpec, found: TP, task: TP) -> str:
    return (f"{spec.path}: transform: {spec.transform} puts rows of {found[0]}-{found[1]} in the Spark task of "
            f"{task[0]}-{task[1]}; per_partition scope needs a row-wise transform that keeps topic and partition: "
            "use commit: atomic")


def driver_commits(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, owner: dict[int, TP],
                   dead: dict) -> tuple[dict[TP, CommitResult], dict[TP, int]]:
    """Step 2 for a small stream batch whose tasks the lineage proved: its rows collected to the
    driver (one Spark job, Arrow, every task at once, each row marked with its task), checked as a
    task checks them (each row is its task's source partition; a dead letter needs a topic), and
    only then each partition's transaction from this process, under the partition's own id, through
    the commit this process keeps for it (:func:`kept_commit`). Returns them and the rows collected
    per partition (one job: it fails whole, or returns every row).

    :raises SpecError: a row of another partition in a task (nothing committed).
    :raises DeadLetterWithoutTopic: a dead letter and no ``sink.dlq_topic`` (nothing committed).
    """
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    rows: dict[TP, list] = {}
    for batch in batches.fetched(df.withColumn(batches.PART, F.spark_partition_id()), list):
        for task in pc.unique(batch.column(batches.PART)).to_pylist():
            part = batch.filter(pc.equal(batch.column(batches.PART), task)).drop_columns([batches.PART])
            tp = owner[task]
            for other in sorted(batches.source_partitions(part) - {tp}):
                raise SpecError(f"{_relabelled(spec, other, tp)}; no partition of this run was committed")
            rows.setdefault(tp, []).append(part)
    if spec.sink.dlq_topic is None:  # a dead letter needs a topic: found before anything commits
        for part in itertools.chain(*rows.values(), *dead.values()):
            if (first := batches.first_dead_letter(part)) is not None:
                raise batches.no_dead_letter_topic(spec, first["topic"], first["partition"], first["offset"],
                                                   first[DLQ_REASON], "no partition of this run was committed")
    counts = {r.tp: sum(len(part) for part in rows.get(r.tp, ())) for r in plan.active if not r.empty}
    return commit_rowless(spec, plan, settings, [r for r in plan.active if r.tp in rows], keep=True,
                          dead={tp: [*found, *dead.get(tp, ())] for tp, found in rows.items()}), counts


def write(df: "DataFrame | None", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, keep: bool = False,
          dead: dict | None = None) -> tuple[dict[TP, CommitResult], dict[TP, int] | int | None, KafkaEosError | None]:
    """Commit ``plan`` in per_partition scope (the module's steps).

    :param df: the transform's output, or None when every planned range is empty.
    :param keep: a stream's batch: each partition's commit is kept for the next (:func:`kept_commit`).
    :param dead: more rows per source partition (Arrow batches of :func:`batches.prepared` columns:
        records that did not decode), written in that partition's transaction after its rows.
    :returns: each partition's commit, Spark's count of the rows its transform gave them
        (:meth:`proof.RowCount.counts`), for :func:`proof.check_rows`, and a task's refusal (step 3:
        the run fails with it once the partitions that committed are checked; step 4 is skipped).
    :raises SpecError: the transform shuffles or does not keep one source partition per task.
    :raises DeadLetterWithoutTopic: a dead letter and no ``sink.dlq_topic``.
    """
    results: dict[TP, CommitResult] = {}
    rows: dict[TP, int] | int = {}
    if df is not None:
        planned = plan.offsets
        df = batches.prepared(df, planned)
        check_no_shuffle(df, spec)  # 1. no shuffle (first: with an Exchange, planning the RDD runs stages),
        owner = lineage_owner(df, plan)  # 1. and one source partition per task, proven: one pass
        one_pass = owner is not None
        if one_pass:
            df = proven_dataframe(df)
        # At DEBUG in a stream (a line per batch, many a second); a run's log says it at INFO.
        log.log(logging.DEBUG if keep else logging.INFO, "%s: per_partition in %s", spec.name,
                "one pass (the lineage proves each task's source partition)" if one_pass
                else "two passes (the lineage does not prove each task's source partition)")
        if one_pass and keep and planned <= DRIVER_BATCH_OFFSETS:  # 2. a small stream batch: from the driver
            results, rows = driver_commits(df, spec, plan, settings, owner, dead or {})
        else:
            results, rows, refusal = _task_commits(df, spec, plan, settings, owner, keep, dead)
            if refusal is not None:
                return results, rows, refusal
    # 4. offsets-only transactions for the partitions no task held
    results.update(commit_rowless(spec, plan, settings, [r for r in plan.active if r.tp not in results], keep,
                                  dead or {}))
    return results, rows, None


def _task_commits(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                  owner: dict[int, TP] | None, keep: bool,
                  dead: dict | None) -> tuple[dict[TP, CommitResult], dict[TP, int] | int | None, KafkaEosError | None]:
    """Steps 1–3 on the executors: a transaction per Spark task, in one pass where ``owner`` was
    proven, else after a scan of the cached output. Returns the tasks' commits (not the refused
    ones), Spark's count of the rows it gave each (:class:`proof.RowCount`; None where a refusal
    made it untrue), and the first refusal as its error (:func:`_refusal`), or None."""
    from pyspark import StorageLevel

    one_pass = owner is not None
    if not one_pass:
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
    counted = proof.RowCount(df, plan.active)  # Spark's own count of what each task is given
    try:
        if not one_pass:  # 1. or found by a scan of the cached output: two passes
            owner, first_dead = task_sources(df, spec, plan)
            if first_dead is not None:
                raise batches.no_dead_letter_topic(spec, first_dead["topic"], first_dead["partition"],
                                                   first_dead["offset"], first_dead[DLQ_REASON],
                                                   "no partition of this run was committed")
        with _job_description(df, COMMIT_JOB):  # 2. a transaction per task
            committed = None
            if jvm_writer.applies(df, one_pass, keep, dead):  # its records produced from the JVM
                committed = jvm_writer.commits(df if is_connect(df) else counted.df, spec, plan, settings, owner)
                # A Connect server runs the job for its plugin and sends no observation of it back: there
                # each task's count of the rows it took from Spark's iterator stands in for Spark's own.
                counts = (lambda: jvm_writer.rows_of(committed, plan)) if is_connect(df) else counted.counts
            if committed is None:
                committed = [json.loads(row["result"]) for row in counted.df.mapInArrow(
                    _commit_task(spec, plan, settings, owner, one_pass, keep, dead or {}), _RESULT_SCHEMA).collect()]
                counts = counted.counts
    finally:
        if not one_pass:
            df.unpersist()
    # Spark counts rows by the partition they name: a refused task that met rows naming another
    # partition (relabelled, recomputed otherwise, a task with no range) leaves them in that
    # partition's count, which then checks nothing (None).
    trusted = not any(row["foreign"] for row in committed if row["status"] == REFUSED)
    return ({(row["topic"], row["partition"]): CommitResult(row["status"], row["records_out"], row["dead_letters"],
                                                            row["producer"]) for row in committed if row["status"] != REFUSED},
            counts() if trusted else None, _refusal(committed))


def _refusal(rows: list) -> KafkaEosError | None:
    """Step 3: the first refusal as its error, saying which partitions of the run are committed
    (by this attempt, or by an earlier one); None when no task refused."""
    refused = sorted((r for r in rows if r["status"] == REFUSED), key=lambda r: (r["topic"], r["partition"]))
    if not refused:
        return None
    done = sorted(f"{r['topic']}-{r['partition']}" for r in rows if r["status"] in (COMMITTED, NOOP))
    others = "; ".join(f"{r['topic']}-{r['partition']}" for r in refused[1:])
    text = (f"{refused[0]['reason']}{f' (refused too: {others})' if others else ''}; committed by their own "
            f"transactions: {', '.join(done) if done else 'no partition of this run'}")
    return {cls.__name__: cls for cls in (DeadLetterWithoutTopic, RecordRefused)}.get(refused[0]["refusal"], SpecError)(text)


def commit_rowless(spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                   ranges: Sequence[PartitionRange], keep: bool = False,
                   dead: dict | None = None) -> dict[TP, CommitResult]:
    """The transactions of ``ranges`` from this process (the driver), each under its partition's
    own id, several at a time: ranges no Spark task held (empty ranges, idle checkpoints committed
    again, partitions whose every record did not decode: then with those dead letters in ``dead``),
    and a small stream batch's partitions with their rows in ``dead`` (:func:`driver_commits`)."""
    dead = dead or {}
    if len(ranges) <= 1:
        return {r.tp: commit_partition(spec, plan, settings, r, dead.get(r.tp, ()), keep) for r in ranges}
    with ThreadPoolExecutor(min(ROWLESS_COMMITS_AT_ONCE, len(ranges)), thread_name_prefix="kafka-eos-rowless") as pool:
        done = pool.map(lambda r: commit_partition(spec, plan, settings, r, dead.get(r.tp, ()), keep), ranges)
        return {r.tp: result for r, result in zip(ranges, done)}


@contextmanager
def _job_description(df: "DataFrame", description: str):
    if is_connect(df):  # no SparkContext in a Connect client; the server names the job itself
        yield
        return
    sc = df.sparkSession.sparkContext
    sc.setJobDescription(description)
    try:
        yield
    finally:
        sc.setJobDescription(None)
