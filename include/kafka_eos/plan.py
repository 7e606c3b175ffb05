"""Plans: the unit of work of one run (docs/architecture.md, "Plans").

``plan_ranges`` is a pure function of the spec, the partitions' offsets and the checkpoints, so
every rule is testable without a broker; :func:`make_plan` gathers that state from Kafka.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Collection, Mapping

from kafka_eos.errors import CheckpointLost, DataLossError, PlanError, TopicRecreated
from kafka_eos.kafka_admin import TP, CommitTimes, PartitionOffsets
from kafka_eos.spec import PipelineSpec


@dataclass(frozen=True)
class PartitionRange:
    """Half-open ``[from_offset, until)`` of one source partition.

    ``expected`` is the committed checkpoint the commit checks (None: the group has none). It
    differs from ``from_offset`` for a new partition and after a ``skip``. ``refresh`` marks an
    idle partition whose checkpoint is committed again, unchanged, so that the broker's offsets
    retention never expires it.
    """

    topic: str
    partition: int
    from_offset: int
    until: int
    expected: int | None
    refresh: bool = False

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def empty(self) -> bool:
        return self.from_offset == self.until


@dataclass(frozen=True)
class SkippedRange:
    """Records lost to retention before they were read (``on_data_loss: skip``)."""

    topic: str
    partition: int
    from_offset: int
    until: int


@dataclass(frozen=True)
class Plan:
    pipeline: str
    run_id: str
    ranges: tuple[PartitionRange, ...]
    skipped: tuple[SkippedRange, ...] = ()
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())

    @property
    def active(self) -> tuple[PartitionRange, ...]:
        """Ranges that take part in the run: non-empty, moving the checkpoint (a new partition, a
        skip), or refreshing an idle partition's checkpoint."""
        return tuple(r for r in self.ranges if not r.empty or r.expected != r.until or r.refresh)

    @property
    def moving(self) -> tuple[PartitionRange, ...]:
        """Active ranges that move their checkpoint (not mere refreshes)."""
        return tuple(r for r in self.active if r.expected != r.until)

    @property
    def offsets(self) -> int:
        """Offsets the run reads: the ends of its non-empty ranges less their starts (records,
        and the markers of transactions among them)."""
        return sum(r.until - r.from_offset for r in self.active if not r.empty)

    @property
    def planned_ms(self) -> int:
        """When the plan was made (epoch ms): its commits store it beside the checkpoint."""
        return int(datetime.fromisoformat(self.created_at).timestamp() * 1000)

    @property
    def is_empty(self) -> bool:
        return not self.active

    def as_dict(self) -> dict:
        """The plan as plain JSON values (what :meth:`to_json` writes). Built field by field: the
        manifest writes one per run, and ``dataclasses.asdict``'s deep copy costs ten times more."""
        return {**vars(self), "ranges": [dict(vars(r)) for r in self.ranges],
                "skipped": [dict(vars(s)) for s in self.skipped]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> "Plan":
        try:
            raw = json.loads(text)
            return cls(
                pipeline=raw["pipeline"], run_id=raw["run_id"], created_at=raw["created_at"],
                ranges=tuple(PartitionRange(**r) for r in raw["ranges"]),
                skipped=tuple(SkippedRange(**r) for r in raw.get("skipped", [])),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"{where}: not a kafka-eos plan ({exc.__class__.__name__}: {exc})") from None


#: Refresh a checkpoint whose predicted age at the next commit reaches this share of the
#: retention: the rest is room for a next run later than the last spacing predicts.
REFRESH_AT_SHARE = 0.75


def stale_checkpoints(checkpoints: Mapping[TP, int | None], times: Mapping[TP, CommitTimes], retention_s: float,
                      now: float, next_in_s: float | None = None) -> set[TP]:
    """The checkpoints to commit again now, so that the broker's offsets retention (which
    deletes a member-less group's offset ``retention_s`` after its last commit) never expires one.

    A checkpoint is refreshed when it may not survive until the commit after this one: its age
    then is its age now, plus the time to the next run, plus that run's time from plan to commit.
    Without ``next_in_s`` both come from the newest commit's metadata: runs come as far apart as
    the last two plans did, and commit as long after planning as the last run did. Refreshed
    anyway: a checkpoint half the retention old, or one without kafka-eos's commit time.

    :param next_in_s: when the next chance to refresh comes (a watchdog's interval), instead.
    """
    newest = max((t for t in times.values() if t.committed_at is not None),
                 key=lambda t: t.committed_at, default=None)
    if next_in_s is not None:
        ahead = next_in_s
    elif newest is None:
        ahead = 0.0
    elif newest.planned_at is None:
        ahead = now - newest.committed_at
    else:
        ahead = (now - newest.planned_at) + max(0.0, newest.committed_at - newest.planned_at)
    stale = set()
    for tp, ck in checkpoints.items():
        at = times.get(tp, CommitTimes()).committed_at
        if ck is None:
            continue
        if at is None or now - at >= retention_s / 2 or now - at + ahead >= retention_s * REFRESH_AT_SHARE:
            stale.add(tp)
    return stale


def plan_ranges(spec: PipelineSpec, run_id: str, offsets: Mapping[TP, PartitionOffsets],
                checkpoints: Mapping[TP, int | None], stale: Collection[TP] = (),
                history: Mapping[TP, dict] | None = None, starts: Mapping[TP, int] | None = None) -> Plan:
    """Compute the next plan of ``spec`` from the partitions' offsets and the checkpoints.

    :param offsets: log start, LSO and high watermark of every source partition.
    :param checkpoints: the committed next offset of every source partition (None: no checkpoint).
    :param stale: partitions whose checkpoint was committed long enough ago that it must be
        committed again (offsets retention); idle ones among them get a ``refresh`` range.
    :param history: for partitions without a checkpoint, the last checkpoint kafka-eos committed
        (from the run manifest: ``offset``, ``run_id``, ``committed_at``), where there is one.
    :param starts: with ``starting_offsets: latest``, where the pipeline's first plan started each
        partition (from the run manifest): partitions still without a checkpoint go on from there,
        not from their log start (``latest`` survives a partly committed first run).
    :raises CheckpointLost: a partition lost a checkpoint that kafka-eos had committed.
    :raises DataLossError: a checkpoint below the log start with ``on_data_loss: fail``.
    :raises TopicRecreated: a checkpoint beyond the high watermark.
    """
    history = history or {}
    lost = [tp for tp in sorted(offsets) if checkpoints.get(tp) is None and tp in history]
    if lost:
        tp, last = lost[0], history[lost[0]]
        others = ", ".join(f"{t}-{p}" for t, p in lost[1:])
        # A checkpoint the manifest took from the group after its memory was cut (not a commit's).
        held = (f"the group held {last['offset']} when the manifest remembered it again at {last.get('committed_at')}"
                if last.get("restored") else
                f"run {last.get('run_id')!r} committed {last['offset']} at {last.get('committed_at')}")
        raise CheckpointLost(
            f"{tp[0]}-{tp[1]}: group {spec.source.group_id!r} has no committed offset, but {held}: the broker "
            "expired it (offsets.retention.minutes) or the group was deleted. Nothing is re-read; "
            f"restore it (kafka-consumer-groups --group {spec.source.group_id} --topic {tp[0]}:{tp[1]} "
            f"--reset-offsets --to-offset {last['offset']} --execute)"
            + (f"; likewise {others} (kafka-eos checkpoint {spec.name} gives each one's offset)" if others else ""))
    starts = starts or {}
    first_run = all(checkpoints.get(tp) is None for tp in offsets) and not starts
    cap = spec.source.max_records_per_partition
    bounds: dict[TP, tuple[int, int]] = {}
    skipped = []
    for tp in sorted(offsets):
        topic, partition = tp
        off = offsets[tp]
        ck = checkpoints.get(tp)
        # Where this partition goes on from: its checkpoint, else (a first run that committed
        # only some partitions) the start the pipeline's first plan chose for it.
        pos, what = (ck, "checkpoint") if ck is not None else (starts.get(tp), "first plan's start")
        if pos is None:
            # A pipeline's first run follows its starting policy; a partition added later
            # is read from its log start, so nothing written to it is missed.
            if first_run and spec.source.starting_offsets == "latest":
                start = off.lso
            else:
                start = off.log_start
        elif pos > off.high_watermark:
            raise TopicRecreated(
                f"{topic}-{partition}: {what} {pos} is beyond the high watermark {off.high_watermark} "
                f"(topic recreated or truncated?); reset group {spec.source.group_id!r} to go on")
        elif pos < off.log_start:
            if spec.source.on_data_loss == "fail":
                raise DataLossError(
                    f"{topic}-{partition}: {what} {pos} is below the log start {off.log_start}: "
                    f"{off.log_start - pos} offsets were deleted unread (on_data_loss: fail)")
            skipped.append(SkippedRange(topic, partition, pos, off.log_start))
            start = off.log_start
        else:
            start = pos
        # The end is the LSO seen now: read_committed readers stop there, and an end beyond
        # it makes Spark's executors poll until timeout. The cap is an offset span.
        bounds[tp] = (start, max(start, min(off.lso, start + cap)))
    spans = shares({tp: until - start for tp, (start, until) in bounds.items()}, spec.source.max_records_per_run)
    ranges = []
    for tp, (start, _until) in bounds.items():
        until, ck = start + spans[tp], checkpoints.get(tp)
        ranges.append(PartitionRange(tp[0], tp[1], start, until, ck, refresh=until == start == ck and tp in stale))
    return Plan(pipeline=spec.name, run_id=run_id, ranges=tuple(ranges), skipped=tuple(skipped))


def shares(spans: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """Cut per-partition offset spans down to ``limit`` in all, each in proportion to its size,
    as Spark's ``maxOffsetsPerTrigger`` does: a share below one offset rounds up (every partition
    with a backlog moves), larger shares round down (the total stays within ``limit``, give or
    take those round-ups)."""
    total = sum(spans.values())
    if total <= limit:
        return dict(spans)
    out = {}
    for tp, span in spans.items():
        share = limit * span / total
        out[tp] = min(span, math.ceil(share) if share < 1 else math.floor(share))
    return out
