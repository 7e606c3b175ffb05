"""Positions in a pipeline's source partitions, as a person gives them: an ISO-8601 timestamp
(each partition's first offset at or after it) or explicit offsets as JSON
(``{"orders-0": 120, "orders-1": 80}``). Every value is checked against the log before anything
runs; an error is one line naming the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from confluent_kafka import Consumer, TopicPartition

from kafka_eos.errors import IntervalNotStable, SpecError
from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, TP, PartitionOffsets, partition_offsets, reader_group
from kafka_eos.pipeline import source_partitions
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec


class PositionError(SpecError):
    """A position a person gave does not fit the log (one line, naming the field)."""


def parse_timestamp(text: str, field: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 timestamp (``Z`` or an offset; none means UTC), not in the future.

    :raises PositionError: naming ``field``.
    """
    try:
        ts = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise PositionError(f"{field}: {text!r} is neither an ISO-8601 timestamp nor JSON offsets "
                            "(e.g. 2026-11-20T10:00:00Z or {\"orders-0\": 120})") from None
    ts = ts if ts.tzinfo is not None else ts.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    if ts > now:
        raise PositionError(f"{field}: {ts.isoformat()} is in the future (now {now.isoformat(timespec='seconds')})")
    return ts


def offsets_for_time(settings: KafkaSettings, tps: list[TP], ts: datetime) -> dict[TP, int | None]:
    """Per partition, the first offset whose record timestamp is at or after ``ts`` (Kafka's
    offsets-for-times, read_committed); None where no record is that late."""
    return offsets_for_times(settings, tps, [ts])[0]


def offsets_for_times(settings: KafkaSettings, tps: list[TP], times: list[datetime]) -> list[dict[TP, int | None]]:
    """:func:`offsets_for_time` of each of ``times``, in that order, through one client."""
    consumer = Consumer(settings.client_config(**{
        # A throwaway group id: the consumer never joins or commits.
        "group.id": reader_group("positions"), "enable.auto.commit": False,
        "isolation.level": "read_committed"}))
    try:
        answers = []
        for ts in times:
            ms = int(ts.timestamp() * 1000)
            found = consumer.offsets_for_times([TopicPartition(t, p, ms) for t, p in tps], ADMIN_TIMEOUT_S)
            answers.append({(f.topic, f.partition): (f.offset if f.offset >= 0 else None) for f in found})
    finally:
        consumer.close()
    return answers


@dataclass(frozen=True)
class TimedPositions:
    """Offsets found by time, with the partitions' offsets read around the lookups.

    Kafka answers offsets-for-times below the LSO it has *when it answers*: an offset found is
    committed, and may lie above an LSO read earlier (a transaction committed in between). So a
    found offset is never clamped by ``before``; the partitions' offsets are read on both sides:
    ``before`` decides where no record is that late (every committed record below ``before``'s
    LSO is earlier than the time, and the partition was or was not held by a transaction then),
    ``after`` holds the freshest log start (what retention deleted).
    """

    before: dict[TP, PartitionOffsets]
    found: list[dict[TP, int | None]]
    after: dict[TP, PartitionOffsets]

    def at(self, i: int, tp: TP) -> int:
        """The offset of ``tp`` at the ``i``-th time: the one found, else the LSO read before the
        lookup (no committed record up to there is that late; a later LSO could take in records
        committed after the lookup that are)."""
        found = self.found[i][tp]
        return found if found is not None else self.before[tp].lso


def timed_positions(settings: KafkaSettings, tps: list[TP], times: list[datetime]) -> TimedPositions:
    """Offsets-for-times of ``times`` in ``tps``, with the partitions' offsets read before and
    after the lookups (see :class:`TimedPositions`): never an LSO older than the answer it bounds."""
    before = partition_offsets(settings, tps)
    found = offsets_for_times(settings, tps, times)
    return TimedPositions(before, found, partition_offsets(settings, tps))


def parse_offsets(text: str, field: str, tps: list[TP]) -> dict[TP, int]:
    """Explicit offsets: a JSON object of ``"<topic>-<partition>": offset``.

    :raises PositionError: malformed JSON, an unknown partition or an offset that is not a
        non-negative integer, naming ``field`` (and the key).
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PositionError(f"{field}: malformed JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(raw, dict) or not raw:
        raise PositionError(f"{field}: must be a JSON object of \"<topic>-<partition>\": offset, got {text!r}")
    names = {f"{t}-{p}": (t, p) for t, p in tps}
    out: dict[TP, int] = {}
    for key, offset in raw.items():
        if key not in names:
            raise PositionError(f"{field}: unknown partition {key!r} (the source partitions are "
                                f"{', '.join(sorted(names))})")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise PositionError(f"{field}: {key}: the offset must be a non-negative integer, got {offset!r}")
        out[names[key]] = offset
    return out


def ensure_end_known(tp: TP, last: int | None, o: PartitionOffsets, what: str, field: str = "") -> None:
    """A range of ``tp`` that ends at a time: ``last`` is the first committed offset at or after
    that time (None: none is). With none, while an open transaction holds the partition, the end
    is not known yet: the transaction's records may belong to the range.

    :raises IntervalNotStable: naming ``field`` (when given), the partition and the transaction's offset.
    """
    if last is not None or o.lso >= o.high_watermark:
        return
    raise IntervalNotStable(
        f"{field + ': ' if field else ''}{tp[0]}-{tp[1]}: {what} is not readable to its end yet: an open "
        f"transaction holds the partition at offset {o.lso} (high watermark {o.high_watermark}) and no committed "
        f"record at or after the end comes before it; retry when the transaction ends (kafka-eos txn hanging "
        f"{tp[0]} shows it)")


def resolve(spec: PipelineSpec, settings: KafkaSettings, text: str, field: str, now: datetime | None = None,
            end: bool = False) -> tuple[dict[TP, int], dict[TP, PartitionOffsets]]:
    """The offsets ``text`` names in ``spec``'s source partitions, each within [log start, LSO].

    A timestamp names every partition: its first record at or after it, or its LSO when no
    committed record is that late. Explicit offsets name the partitions they list.

    :param end: ``text`` ends a range: a timestamp no committed record reaches on a partition an
        open transaction holds is refused (records before it may be in that transaction).
    :returns: the offsets, and every source partition's log start, LSO and high watermark.
    :raises PositionError: naming ``field`` (see :func:`parse_timestamp`, :func:`parse_offsets`),
        or an offset below the log start (deleted) or above the LSO (not committed yet).
    :raises IntervalNotStable: ``end``, and the range's end is not known yet (above).
    """
    tps = source_partitions(spec, settings)
    if text.strip().startswith(("{", "[")):
        ends = partition_offsets(settings, tps)
        wanted = parse_offsets(text, field, tps)
        for (t, p), offset in sorted(wanted.items()):
            o = ends[(t, p)]
            if offset < o.log_start:
                raise PositionError(f"{field}: {t}-{p}: offset {offset} is below the log start {o.log_start} "
                                    "(deleted by retention)")
            if offset > o.lso:
                raise PositionError(f"{field}: {t}-{p}: offset {offset} is above the last stable offset {o.lso} "
                                    "(not committed yet)")
        return wanted, ends
    ts = parse_timestamp(text, field, now)
    # The time lookup between two reads of the offsets: its answer is never bounded by an LSO
    # read before it (a transaction that committed in between would cut the range short).
    timed = timed_positions(settings, tps, [ts])
    if end:
        for tp in tps:
            ensure_end_known(tp, timed.found[0][tp], timed.before[tp], f"the range up to {ts.isoformat()}", field)
    # No record that late: the end of what was committed; never below what retention kept.
    return {tp: max(timed.after[tp].log_start, timed.at(0, tp)) for tp in tps}, timed.after
