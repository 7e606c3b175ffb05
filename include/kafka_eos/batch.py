"""The batch step: plan -> read -> decode -> transform -> hand over to the sink. One function, so a
stream loop, the CLI, the Spark entry point and the tests all run the same code.

The commit itself is the sink's (:mod:`kafka_eos.sinks.base`: one face, a module per commit
scope, chosen by :func:`kafka_eos.sinks.scope.sink_of`): this module only plans what to read,
reads and decodes it, runs the transform and hands the output over.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from kafka_eos import formats
from kafka_eos.errors import KafkaEosError, SpecError, TransformFailed, task_traceback
from kafka_eos.manifest import now_iso
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.base import Outcome, Output, Sink
from kafka_eos.sinks.scope import sink_of
from kafka_eos.spark_io import KAFKA_SOURCE_SCHEMA, read_ranges
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

#: Largest source range (in offsets) one Spark task reads when the driver commits (atomic scope,
#: SQL sinks): rows reach the driver one task at a time, so its memory does not grow with the run
#: (50,000 records of ~200 bytes: about 10 MB in flight).
DRIVER_TASK_RECORDS = 50_000


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


def transformed(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
                decoders: list | None = None, guard: bool = True, sink: Sink | None = None) -> Output:
    """The transform's output for the plan's non-empty ranges (all None when there are none, unless
    the sink needs the output's schema all the same: then the transform's output of no records).

    :param decoders: how the source's key and value are decoded (:func:`kafka_eos.formats.source_decoders`).
    :param guard: one pass: a record that does not decode fails the Spark job
        (:data:`kafka_eos.formats.UNDECODABLE`); else two passes with ``undecodable`` set.
    :param sink: the sink it is for (default: the spec's).
    """
    # pyspark: not at the top, where every process that plans (a DAG processor too) would load it.
    from pyspark.sql import DataFrame

    sink = sink or sink_of(spec, settings)
    if all(r.empty for r in plan.active):
        if not sink.needs_output_schema:
            return Output(None, None, None)
        source = spark.createDataFrame([], KAFKA_SOURCE_SCHEMA)  # nothing to read: the source's columns
    else:
        # Work committed on the driver reads in tasks of bounded size: the driver holds one at a time.
        source = read_ranges(spark, settings, plan.active, DRIVER_TASK_RECORDS if sink.commits_on_driver else None)
    source, undecodable, counted = formats.decoded(source, decoders or [], guard)
    try:
        out = spec.load_transform()(source)
    except KafkaEosError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: its error, named, in one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise TransformFailed(f"{spec.path}: transform {spec.transform} failed to build the run's DataFrame: "
                              f"{type(exc).__name__}: {first}") from exc
    if isinstance(out, DataFrame):
        return Output(counted, out, None, undecodable)
    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(d, DataFrame) for d in out):
        return Output(counted, out[0], out[1], undecodable)
    raise SpecError(f"{spec.path}: transform: {spec.transform} must return a DataFrame or "
                    f"(results, dead_letters), got {type(out).__name__}")


def run_batch(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
              sink: Sink | None = None, extra: dict | None = None) -> RunSummary:
    """Run one planned batch to its transactional commit.

    Safe to call again with the same plan (an Airflow retry): committed work is a no-op.

    :param sink: a long-lived sink of ``spec`` to commit through (a stream's); None: this run's own.
    :param extra: more fields for the run's manifest record (a stream's progress).
    """
    if plan.is_empty:
        return RunSummary(spec.name, plan.run_id, "empty", spec.sink.kind, 0, 0, 0, 0, 0.0)
    started = time.monotonic()
    own = sink is None
    if own:
        sink = sink_of(spec, settings)
    elif sink.spec.name != spec.name:
        raise KafkaEosError(f"run {plan.run_id!r} of pipeline {spec.name!r} handed to the sink of {sink.spec.name!r}")
    try:
        # The source's schemas, before Spark starts: a registry that does not answer fails the run here.
        # (A sink that needs the output of no records decodes them too: the output's columns.)
        decoders = formats.source_decoders(spec, settings) \
            if any(not r.empty for r in plan.active) or sink.needs_output_schema else []
        sink.start()  # the sink's checks, before Spark starts (a long-lived sink's: done already)
        guard = bool(decoders) and sink.decodes_in_one_pass
        try:
            outcome = _handed_over(spark, spec, plan, settings, sink, extra, decoders, guard)
        except Exception as exc:  # noqa: BLE001 - only the one-pass guard's failure is retried
            if not (guard and formats.undecodable(exc)):
                raise
            print(f"kafka-eos: {plan.pipeline}: a record does not decode; computing the decoded records first, "
                  "then committing them and the dead letters", file=sys.stderr, flush=True)
            outcome = _handed_over(spark, spec, plan, settings, sink, extra, decoders, guard=False)
    except KafkaEosError:
        raise
    except Exception as exc:  # noqa: BLE001 - the transform's own code raised in a task: named, in one line
        failed = transform_raised(spec, exc)
        if failed is None:
            raise
        raise failed from exc
    finally:
        formats.release()
        if own:
            sink.close()
    return RunSummary(spec.name, plan.run_id, outcome.status, spec.sink.kind, len(plan.active),
                      outcome.records_in, outcome.records_out, outcome.dead_letters,
                      round(time.monotonic() - started, 3), _range_rows(plan, outcome.counts), outcome.producers)


def transform_raised(spec: PipelineSpec, exc: BaseException) -> TransformFailed | None:
    """``exc`` as the transform's error where it is a Spark task's Python error raised with the
    transform's module on the stack (a UDF raising on a record), else None: a traceback of
    kafka-eos's own task code stays an unexpected error. The module is known by its path's end,
    which holds wherever the workers import it from (a folder, a zip of --py-files)."""
    found = task_traceback(exc)
    if found is None or ":" not in spec.transform:
        return None
    line, files = found
    module = spec.transform.split(":", 1)[0].replace(".", "/")
    ends = (f"/{module}.py", f"/{module}/__init__.py")
    # Not a file of kafka-eos's or PySpark's own of the same name (a transform module named `txn`),
    # nor, for a top-level module, one of an installed library's.
    others = ("/kafka_eos/", "/pyspark/", "/py4j/") + (() if "/" in module else ("-packages/",))
    if not any((f.endswith(ends) or f in (ends[0][1:], ends[1][1:])) and not any(o in f for o in others)
               for f in files):
        return None
    return TransformFailed(f"{spec.path}: transform {spec.transform} raised in a Spark task: {line}")


def _handed_over(spark: "SparkSession", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, sink: Sink,
                 extra: dict | None, decoders: list, guard: bool) -> Outcome:
    """Read, decode and transform (in one pass: ``guard``, or in two), and hand the output to ``sink``."""
    # Every run record in the manifest carries its plan: the latest record under the run's key
    # is what a retried task reuses (compaction keeps only that one).
    record = {"pipeline": spec.name, "run_id": plan.run_id, "sink": spec.sink.kind,
              "started_at": now_iso(), "plan": asdict(plan),
              "skipped": [asdict(s) for s in plan.skipped], **(extra or {})}
    output = transformed(spark, spec, plan, settings, decoders, guard, sink)
    return sink.commit(plan, sink.prepare(output), record)
