"""The batch step: plan -> read -> transform -> commit. One function, so a stream loop, the CLI,
the Spark entry point and the tests all run the same code."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from kafka_eos.errors import RangeMismatch, SpecError
from kafka_eos.manifest import COMMITTED, NOOP, ManifestStore, now_iso, run_key
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from kafka_eos.sinks.sql import SqlSink
    from kafka_eos.txn import TransactionalCommit


#: Largest source range (in offsets) one Spark task reads when the driver commits (atomic scope,
#: SQL sinks): rows reach the driver one task at a time, so its memory does not grow with the run
#: (50,000 records of ~200 bytes: about 10 MB in flight).
DRIVER_TASK_RECORDS = 50_000


@dataclass
class BatchClients:
    """Clients kept between the batches of one pipeline by a caller that runs many (stream mode):
    the atomic scope's transactional commit (one producer, fenced once, for every transaction),
    the SQL sink (one engine), and in per_partition scope whether each partition's commit is kept
    where it ran (:func:`kafka_eos.sinks.per_partition.kept_commit`). A one-shot run builds its
    own, and checks the transaction timeout."""

    atomic: "TransactionalCommit | None" = None
    sql: "SqlSink | None" = None
    keep_partition_commits: bool = False
    #: The largest record each written topic takes, read at the first batch (``sink.record_limits``).
    record_limits: tuple | None = None


@dataclass(frozen=True)
class RunSummary:
    pipeline: str
    run_id: str
    status: str  # committed | noop (everything was already committed) | empty (nothing to do)
    sink: str
    partitions: int
    records_in: int
    records_out: int
    dead_letters: int
    seconds: float
    #: One entry per range of the plan that took part: topic, partition, from, until, and where
    #: the sink counts them per source partition (Kafka sinks), records in/out/dead letters.
    ranges: list[dict] = field(default_factory=list)
    #: per_partition scope: how many transactions had a producer ``built``, ``kept`` from an
    #: earlier batch, or ``rebuilt`` (the kept one was fenced by another worker's).
    producers: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _range_rows(plan: Plan, counts: dict | None = None) -> list[dict]:
    rows = []
    for r in plan.active:
        row = {"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until}
        if counts is not None and r.tp in counts:
            out, dead = counts[r.tp]
            row.update(records_in=out + dead, records_out=out, dead_letters=dead)
        rows.append(row)
    return rows


class Transformed(NamedTuple):
    """What :func:`transformed` computed (lazily: Spark runs it when the sink reads it)."""

    #: Every source record (the SQL sink counts it).
    source: "DataFrame | None"
    results: "DataFrame | None"
    #: A ``(results, dead_letters)`` transform's dead letters (else None: rows carry ``dlq_reason``).
    dead_letters: "DataFrame | None"
    #: Records that did not decode (two-pass runs of a formatted source): the sink writes them as
    #: dead letters in the run's transaction.
    undecodable: "DataFrame | None" = None


def transformed(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                decoders: list | None = None, guard: bool = True) -> Transformed:
    """The transform's output for the plan's non-empty ranges (all None when there are none).

    :param decoders: how the source's key and value are decoded (:func:`kafka_eos.formats.source_decoders`).
    :param guard: one pass: a record that does not decode fails the Spark job
        (:data:`kafka_eos.formats.UNDECODABLE`); else two passes with ``undecodable`` set.
    """
    from pyspark.sql import DataFrame

    from kafka_eos import formats
    from kafka_eos.spark_io import read_ranges

    if all(r.empty for r in plan.active):
        return Transformed(None, None, None)
    # Work committed on the driver reads in tasks of bounded size: the driver holds one at a time.
    split = spec.sink.kind == "sql" or spec.sink.commit == "atomic"
    source = read_ranges(spark, settings, plan.active, DRIVER_TASK_RECORDS if split else None)
    source, undecodable, counted = formats.decoded(source, decoders or [], guard)
    out = spec.load_transform()(source)
    if isinstance(out, DataFrame):
        return Transformed(counted, out, None, undecodable)
    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(d, DataFrame) for d in out):
        return Transformed(counted, out[0], out[1], undecodable)
    raise SpecError(f"{spec.path}: transform: {spec.transform} must return a DataFrame or "
                    f"(results, dead_letters), got {type(out).__name__}")


def check_transaction_timeout(spec: PipelineSpec, settings: KafkaSettings) -> None:
    """A Kafka sink's transaction timeout must be one the brokers accept: checked before Spark
    starts, not found out at the first commit.

    :raises SpecError: naming the field, its value and the brokers' limit.
    """
    from kafka_eos.kafka_admin import transaction_max_timeout_ms

    limit_ms = transaction_max_timeout_ms(settings)
    if spec.sink.transaction_timeout_s * 1000 > limit_ms:
        raise SpecError(f"{spec.path}: sink.transaction_timeout_s: {spec.sink.transaction_timeout_s} is above the "
                        f"brokers' transaction.max.timeout.ms ({limit_ms / 1000:g} s): lower it, or raise the "
                        "brokers' limit")


def run_batch(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
              clients: BatchClients | None = None, extra: dict | None = None) -> RunSummary:
    """Run one planned batch to its transactional commit.

    Safe to call again with the same plan (an Airflow retry): committed work is a no-op.

    :param clients: long-lived clients to commit through (stream mode); None: this run's own.
    :param extra: more fields for the run's manifest record (a stream's progress).
    """
    if plan.is_empty:
        return RunSummary(spec.name, plan.run_id, "empty", spec.sink.kind, 0, 0, 0, 0, 0.0)
    from kafka_eos import formats

    started = time.monotonic()
    # The source's schemas, before Spark starts: a registry that does not answer fails the run here.
    decoders = formats.source_decoders(spec, settings) if any(not r.empty for r in plan.active) else []
    # A SQL sink reads its source more than once anyway (it is cached): two passes from the start.
    guard = bool(decoders) and spec.sink.kind == "kafka"
    try:
        try:
            return _run_batch(spark, spec, plan, settings, clients, extra, started, decoders, guard)
        except Exception as exc:  # noqa: BLE001 - only the one-pass guard's failure is retried
            if not (guard and formats.undecodable(exc)):
                raise
        print(f"kafka-eos: {plan.pipeline}: a record does not decode; computing the decoded records first, then "
              "committing them and the dead letters", file=sys.stderr, flush=True)
        return _run_batch(spark, spec, plan, settings, clients, extra, started, decoders, guard=False)
    finally:
        formats.release()


def _run_batch(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
               clients: BatchClients | None, extra: dict | None, started: float, decoders: list,
               guard: bool) -> RunSummary:
    """:func:`run_batch`, in one pass (``guard``) or in two."""
    from kafka_eos import formats

    # Every run record in the manifest carries its plan: the latest record under the run's key
    # is what a retried task reuses (compaction keeps only that one).
    summary = {"pipeline": spec.name, "run_id": plan.run_id, "sink": spec.sink.kind,
               "started_at": now_iso(), "plan": asdict(plan),
               "skipped": [asdict(s) for s in plan.skipped], **(extra or {})}
    if spec.sink.kind == "kafka" and clients is None:
        check_transaction_timeout(spec, settings)
    source, results, dead_letters, undecodable = transformed(spark, spec, plan, settings, decoders, guard)
    producers: dict = {}
    if spec.sink.kind == "kafka":
        from kafka_eos.sinks import kafka as kafka_sink
        from kafka_eos.sinks.limits import with_record_limits

        if clients is not None and clients.record_limits is not None:
            spec = dataclasses.replace(spec, sink=dataclasses.replace(spec.sink, record_limits=clients.record_limits))
        else:  # before anything is produced: a record too large for its topic is found before produce()
            spec = with_record_limits(spec, settings)
            if clients is not None:
                clients.record_limits = spec.sink.record_limits

        if dead_letters is not None:
            raise SpecError(f"{spec.path}: transform: a Kafka sink needs one DataFrame with "
                            f"{DLQ_REASON}, not (results, dead_letters)")
        if results is not None:
            kafka_sink.check_output(results, spec)
            # The output's schemas registered (or refused) before anything is written.
            results = formats.encoded(results, formats.sink_encoders(spec, settings, results))
        dead_batches = None
        if undecodable is not None:
            if spec.sink.commit == "atomic":
                results = formats.with_dead_letters(results, undecodable)
            else:
                dead_batches = formats.dead_letter_batches(results, undecodable)
        if spec.sink.commit == "atomic":
            tally: Counter = Counter()
            commit = clients.atomic.use(plan.active, plan.planned_ms) if clients and clients.atomic else None
            res = kafka_sink.write_atomic(results, spec, plan, settings, summary, tally, commit)
            status, out, dead = res.status, res.records_out, res.dead_letters
            counts = {r.tp: (tally[(r.tp, "out")], tally[(r.tp, "dead")]) for r in plan.active}
        else:
            from kafka_eos.sinks import per_partition, proof

            per, rows = per_partition.write(results, spec, plan, settings,
                                            keep=clients is not None and clients.keep_partition_commits,
                                            dead=dead_batches)
            producers = dict(Counter(r.producer for r in per.values() if r.producer))
            counts = {tp: (r.records_out, r.dead_letters) for tp, r in per.items()}
            out = sum(r.records_out for r in per.values())
            dead = sum(r.dead_letters for r in per.values())
            status = NOOP if all(r.status == NOOP for r in per.values()) else COMMITTED
            # The run record counts what the executors committed and returned. Partitions an
            # earlier, partly committed attempt of this run committed (noop now) count from their
            # manifest records, written inside their transactions; one not found there leaves
            # the run's counts marked incomplete rather than silently smaller.
            run_out, run_dead = out, dead
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
            record = {**summary, "status": COMMITTED, "records_in": run_out + run_dead, "records_out": run_out,
                      "dead_letters": run_dead, "committed_at": now_iso(), "read": "whole"}
            if missing:
                record["counts_missing_for"] = missing
            # Verify: each partition's transaction wrote a record per row Spark gave it (a commit
            # that missed rows is recorded, then fails the run: a retry finds it again).
            mismatch = None
            if results is not None and not (missing and isinstance(rows, int)):
                written = {tp: c for tp, c in counts.items() if f"{tp[0]}-{tp[1]}" not in missing}
                undecodable_rows = {tp: sum(len(b) for b in found) for tp, found in (dead_batches or {}).items()}
                try:
                    proof.check_rows(plan, rows, written, undecodable_rows)
                except RangeMismatch as exc:
                    mismatch = exc
                    record["mismatch"] = str(exc)
            ManifestStore.of(spec, settings).put(run_key(spec.name, plan.run_id), record)
            if mismatch is not None:
                raise mismatch
            if status != NOOP:  # the run's counts, the partitions an earlier attempt committed included
                out, dead = run_out, run_dead
        records_in = out + dead
        if status == NOOP:
            counts = None  # an earlier attempt committed: this one counted nothing
    else:
        from kafka_eos.sinks import sql as sql_sink

        # An aggregating transform's output says nothing of its input size: count the source.
        # Results, dead letters and the count each read it: persist it so Kafka is read once.
        if source is not None:
            source.persist()
        try:
            counting = time.monotonic()
            records_in = source.count() if source is not None else 0
            log.info("SQL sink %s: source read and counted in %.2f s", spec.sink.table, time.monotonic() - counting)
            res = sql_sink.write(results, dead_letters, spec, plan, settings, summary, records_in,
                                 sink=clients.sql if clients else None, undecodable=undecodable)
        finally:
            if source is not None:
                source.unpersist()
        status, out, dead = res.status, res.records_out, res.dead_letters
        counts = None
    return RunSummary(spec.name, plan.run_id, status, spec.sink.kind, len(plan.active),
                      records_in, out, dead, round(time.monotonic() - started, 3), _range_rows(plan, counts),
                      producers)
