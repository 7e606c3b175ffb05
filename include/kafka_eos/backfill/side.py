"""Side runs: a replay or a backfill re-derives the results of a bounded past range beside the
live pipeline, exactly once, without moving the live checkpoint.

A side run is the pipeline's own batch step under another identity (:func:`side_spec`):
- its checkpoint is a consumer group of its own, ``<group>.<kind>.<key>.g<generation>`` (SQL
  sinks: offsets rows under the side run's name), so the commit protocol is the live one: a retry
  of a committed side run finds its checkpoint at the range's end and does nothing;
- its transactional ids derive from that group: side runs of different intervals never fence each
  other or the live run, and two attempts of one interval fence each other;
- it never writes a live place. Kafka sinks: the pipeline's ``sink.backfill_topic`` (never the
  live output, whose consumers would see a range twice), each record carrying the range and the
  generation in headers; its dead letters go to ``sink.backfill_dlq_topic``, else to the backfill
  topic (told apart by their ``kafka-eos.reason`` header), never to the live dead-letter topic.
  SQL sinks: ``sink.backfill_table`` in the sink's own database — the live table's columns plus
  :data:`RANGE_COLUMN` and :data:`GENERATION_COLUMN` (part of its key) — and its dead letters to
  ``<backfill_table>_dead_letters``; :func:`promote_sql` is the statement an operator runs to
  move a checked backfill into the live table (``kafka-eos backfill promote`` runs it). Iceberg
  sinks: a branch of the live table of its own, ``kafka-eos.<pipeline>.<kind>.<key>.g<generation>`` (and that
  branch of the dead letters' table), cut from ``main`` at its first commit, its offsets in its
  snapshots under its own name; ``kafka-eos backfill promote`` moves it onto ``main``;
- its plans, summaries and checkpoint records in the run manifest are under its own name, which
  the live pipeline's lookups never take for its own.

The ranges of a side run are computed once and recorded in the run manifest under
``<pipeline>:side:<kind>.<key>`` (:func:`prepare`): a retry, a repeated backfill and a reprocess
of the same interval read the same offsets, even after more records arrived. A reprocess (asked
for explicitly) is a new generation: a new checkpoint, so the range is written again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from kafka_eos.backfill.places import (GENERATION_COLUMN, GENERATION_HEADER, RANGE_COLUMN, RANGE_HEADER,  # noqa: F401
                                       check_side_runs, promote_sql, side_branch, writes_to)
from kafka_eos.backfill.positions import PositionError, ensure_end_known, resolve, timed_positions
from kafka_eos.errors import CheckpointConflict, DataLossError, PlanError
from kafka_eos.kafka_admin import TP
from kafka_eos.manifest import ManifestStore, now_iso
from kafka_eos.pipeline import checkpoints, past_killed_attempt, source_partitions
from kafka_eos.plan import PartitionRange, Plan, SkippedRange
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.sql_store import LOCAL_URL, database_url, local_url, make_engine
from kafka_eos.spec import PipelineSpec

REPLAY, BACKFILL = "replay", "backfill"


@dataclass(frozen=True)
class Side:
    """Which side run: ``kind`` (replay | backfill), ``key`` (the interval, or the replay's range),
    ``generation`` (1, then one more per reprocess)."""

    kind: str
    key: str
    generation: int = 1

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Side":
        return cls(**json.loads(text))

    @property
    def suffix(self) -> str:
        return f"{self.kind}.{self.key}.g{self.generation}"


def interval_key(start: datetime, end: datetime) -> str:
    """A backfill's key: its data interval, in UTC, e.g. ``20260301T1200Z-20260301T1205Z``."""
    return f"{start.strftime('%Y%m%dT%H%M%SZ')}-{end.strftime('%Y%m%dT%H%M%SZ')}"


def replay_key(from_text: str, until_text: str) -> str:
    """A replay's key: the range as asked (the same request again is the same replay, done once
    unless reprocessed), as a short digest that group ids and table rows carry well."""
    digest = hashlib.sha256(json.dumps([from_text.strip(), until_text.strip()]).encode()).hexdigest()
    return digest[:16]


def side_spec(spec: PipelineSpec, side: Side) -> PipelineSpec:
    """``spec`` as the side run ``side`` runs it (see the module's docstring).

    :raises SpecError: a Kafka sink without ``sink.backfill_topic``, a SQL sink without
        ``sink.backfill_table``.
    """
    sink = spec.sink
    check_side_runs(spec, side.kind)
    if sink.kind == "kafka":
        dlq = (sink.backfill_dlq_topic or sink.backfill_topic) if sink.dlq_topic else None
        sink = dataclasses.replace(sink, topic=sink.backfill_topic, dlq_topic=dlq, headers=(
            (RANGE_HEADER, side.key.encode()), (GENERATION_HEADER, str(side.generation).encode())))
    elif sink.about.promoted_by == "branch":
        sink = dataclasses.replace(sink, branch=side_branch(spec.name, side.suffix))  # the live catalog
    else:
        # The sink's own database (``local``'s SQLite file is named after the live pipeline).
        sink = dataclasses.replace(
            sink, url=local_url(spec) if sink.url == LOCAL_URL else sink.url, table=sink.backfill_table,
            dead_letters_table=f"{sink.backfill_table}_dead_letters",
            columns=((RANGE_COLUMN, side.key), (GENERATION_COLUMN, side.generation)),
            # Keyed by range and generation too: each generation of each range has rows of its own.
            key_columns=(*sink.key_columns, RANGE_COLUMN, GENERATION_COLUMN) if sink.key_columns else ())
    return dataclasses.replace(
        spec, name=f"{spec.name}.{side.suffix}", sink=sink,
        source=dataclasses.replace(spec.source, group_id=f"{spec.source.group_id}.{side.suffix}"))


def promote_statement(spec: PipelineSpec, side: Side, settings: KafkaSettings | None = None) -> str:
    """:func:`promote_sql` for the backfill table as it is in the sink's database (its columns
    read from there; ``settings`` may carry the database as its connection gave it)."""
    from sqlalchemy import inspect

    engine = make_engine(database_url(side_spec(spec, side), settings))
    try:
        columns = [c["name"] for c in inspect(engine).get_columns(spec.sink.backfill_table)
                   if c["name"] not in (RANGE_COLUMN, GENERATION_COLUMN)]
    finally:
        engine.dispose()
    return promote_sql(spec, side.key, side.generation, columns)


def mapping_key(spec: PipelineSpec, kind: str, key: str) -> str:
    return f"{spec.name}:side:{kind}.{key}"


def prepare(spec: PipelineSpec, settings: KafkaSettings, run_id: str, kind: str, key: str, attempt: str,
            compute: Callable[[], tuple[dict[TP, tuple[int, int]], list[SkippedRange]]],
            reprocess: bool = False) -> tuple[Side, Plan, dict]:
    """The side run of ``kind``/``key``: its ranges (recorded on first use, read back after), its
    generation and its plan.

    :param attempt: what tells a retry from a new request (the run id and its clear number):
        a retry keeps its generation.
    :param compute: the ranges ``{tp: (from, until)}`` and the skipped ranges, when none are recorded.
    :param reprocess: a request that is not a retry gets a new generation (the range is written
        again); otherwise it reuses the newest one (whose checkpoint says it is done).
    :returns: the side run, its plan and the mapping record.
    """
    check_side_runs(spec, kind)  # before anything is recorded
    manifest = ManifestStore.of(spec, settings)
    manifest.ensure_topic()
    mkey = mapping_key(spec, kind, key)
    mapping = manifest.find(mkey)
    if mapping is None:
        ranges, skipped = compute()
        mapping = {"side": True, "kind": kind, "key": key, "created_at": now_iso(), "run_id": run_id,
                   "ranges": [[t, p, a, b] for (t, p), (a, b) in sorted(ranges.items())],
                   "skipped": [dataclasses.asdict(s) for s in skipped], "generations": {}}
    generations = mapping["generations"]
    if attempt not in generations:
        newest = max(generations.values(), default=0)
        generations[attempt] = newest + 1 if (reprocess or newest == 0) else newest
        manifest.put(mkey, mapping)
    side = Side(kind, key, generations[attempt])
    return side, plan_of(spec, settings, side, run_id, mapping), mapping


def preview(spec: PipelineSpec, settings: KafkaSettings, kind: str, key: str,
            compute: Callable[[], tuple[dict[TP, tuple[int, int]], list[SkippedRange]]]) -> dict:
    """What :func:`prepare` would run, with no side effects (a dry run): the recorded ranges, or
    the ones it would record now.

    :raises SpecError: the spec has no place of its own for side runs (see :func:`check_side_runs`).
    """
    check_side_runs(spec, kind)
    mapping = ManifestStore.of(spec, settings).find(mapping_key(spec, kind, key))
    if mapping is not None:
        return {**mapping, "recorded": True}
    ranges, skipped = compute()
    return {"kind": kind, "key": key, "recorded": False, "generations": {},
            "ranges": [[t, p, a, b] for (t, p), (a, b) in sorted(ranges.items())],
            "skipped": [dataclasses.asdict(s) for s in skipped]}


def plan_of(spec: PipelineSpec, settings: KafkaSettings, side: Side, run_id: str, mapping: dict,
            remaining: bool = True) -> Plan:
    """The plan of side run ``side`` over the recorded ranges, from its own checkpoint: a range
    already committed (checkpoint at its end) takes no part. ``remaining=False``: every recorded
    range, as the plan task prepared it (what a final check verifies).

    :raises CheckpointConflict: a side checkpoint that is neither absent nor the range's end.
    """
    sspec = side_spec(spec, side)
    tps = [(t, p) for t, p, _a, _b in mapping["ranges"]]
    # A retry after a killed attempt of this side run would wait for its transaction's timeout:
    # its offsets are pending until then. Its own transactional ids are fenced (never the live ones).
    done = past_killed_attempt(sspec, settings, lambda: checkpoints(sspec, settings, tps)[0]) \
        if remaining else {tp: None for tp in tps}
    ranges = []
    for t, p, start, until in mapping["ranges"]:
        ck = done[(t, p)]
        if ck == until:
            ranges.append(PartitionRange(t, p, until, until, until))
        elif ck is None:
            ranges.append(PartitionRange(t, p, start, until, None))
        else:
            raise CheckpointConflict(f"{t}-{p}: {side.kind} {side.key} generation {side.generation} is at {ck}, "
                                     f"its range is [{start}, {until}): a concurrent or stale attempt")
    skipped = tuple(SkippedRange(**s) for s in mapping.get("skipped", []))
    return Plan(pipeline=sspec.name, run_id=run_id, ranges=tuple(ranges), skipped=skipped)


def find(spec: PipelineSpec, settings: KafkaSettings, run_id: str, kind: str, key: str, attempt: str,
         remaining: bool = True) -> tuple[Side, Plan]:
    """The side run a plan task prepared for ``attempt`` (the Spark and verify tasks' view; see
    :func:`plan_of` for ``remaining``).

    :raises PlanError: none was prepared.
    """
    mapping = ManifestStore.of(spec, settings).find(mapping_key(spec, kind, key))
    if mapping is None or attempt not in mapping["generations"]:
        raise PlanError(f"manifest {spec.manifest_topic!r}: no {kind} {key!r} prepared for {attempt!r}: run the "
                        "plan task of this run first")
    side = Side(kind, key, mapping["generations"][attempt])
    return side, plan_of(spec, settings, side, run_id, mapping, remaining)


def interval_ranges(spec: PipelineSpec, settings: KafkaSettings, start: datetime,
                    end: datetime) -> tuple[dict[TP, tuple[int, int]], list[SkippedRange]]:
    """The offsets of a data interval ``[start, end)`` by record timestamp (Kafka's
    offsets-for-times), per source partition; where no record is as late as a bound, the LSO.

    :raises DataLossError: retention deleted records of the interval (``on_data_loss: fail``);
        with ``skip`` the deleted part is skipped and returned.
    :raises IntervalNotStable: on a partition no committed record is at or after ``end`` and an
        open transaction holds the LSO: records of the interval may be in it, so the interval's
        end is not known yet (a retry after the transaction ends reads the whole interval).
    """
    tps = source_partitions(spec, settings)
    # The time lookups between two reads of the offsets: an offset found by time is committed and
    # never bounded by an LSO read before it (docs/architecture.md, "Offsets").
    timed = timed_positions(settings, tps, [start, end])
    ranges, skipped = {}, []
    for tp in tps:
        # Found by the soak: a stranger's transaction held a partition while a backfill of a past
        # minute ran; ending at the LSO wrote that minute without the partition's records.
        ensure_end_known(tp, timed.found[1][tp], timed.before[tp],
                         f"the interval {start.isoformat()} - {end.isoformat()}")
        a, b = timed.at(0, tp), timed.at(1, tp)
        log_start = timed.after[tp].log_start
        # Offsets-for-times answers from the records kept: when its answer is the log start of a
        # partition that retention has cut, records of the interval may be among those deleted.
        if a <= log_start and log_start > 0:
            if spec.source.on_data_loss == "fail":
                raise DataLossError(
                    f"{tp[0]}-{tp[1]}: the interval {start.isoformat()} - {end.isoformat()} reaches back to the log "
                    f"start {log_start}: records of it may have been deleted by retention (on_data_loss: fail)")
            skipped.append(SkippedRange(tp[0], tp[1], 0, log_start))
            a = log_start
        ranges[tp] = (a, max(a, b))
    return ranges, skipped


def replay_ranges(spec: PipelineSpec, settings: KafkaSettings, from_text: str,
                  until_text: str) -> tuple[dict[TP, tuple[int, int]], list[SkippedRange]]:
    """The ranges of a replay: from a timestamp or JSON offsets, to a timestamp or JSON offsets
    (partitions named by neither side take no part).

    :raises PositionError: a bad value (see :mod:`kafka_eos.backfill.positions`), or an end
        before its start, naming the field.
    :raises IntervalNotStable: a timestamp end no committed record reaches on a partition held
        by an open transaction (as a backfill's interval).
    """
    starts, _ends = resolve(spec, settings, from_text, "params.replay_from")
    untils, _ends = resolve(spec, settings, until_text, "params.replay_until", end=True)
    ranges = {}
    for tp in sorted(set(starts) & set(untils)):
        if untils[tp] < starts[tp]:
            raise PositionError(f"params.replay_until: {tp[0]}-{tp[1]}: ends at {untils[tp]}, before its start "
                                f"{starts[tp]} (params.replay_from)")
        ranges[tp] = (starts[tp], untils[tp])
    if not ranges:
        raise PositionError("params.replay_until: names none of the partitions params.replay_from names")
    return ranges, []
