"""A pipeline's backlog: per source partition, the committed records between its checkpoint and
the LSO, and how old the oldest of them is.

Lag in offsets says how much is waiting, not how late the pipeline is, and offsets are not
records under transactions (a range of aborted records and markers is lag that holds no data).
So the backlog reads, read_committed, the first record after each checkpoint: its offset says
that committed data waits (what a gate on new data needs), and its timestamp how long it has
waited (what a freshness limit checks: ``source.freshness_limit_s`` in the spec).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from kafka_eos.pipeline import Drift, checkpoint_rows
from kafka_eos.readers import first_records
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec


def backlog(spec: PipelineSpec, settings: KafkaSettings, now_ms: int | None = None,
            mirror: bool = False) -> tuple[list[dict], list[Drift]]:
    """:func:`~kafka_eos.pipeline.checkpoint_rows`, each row with ``oldest_unprocessed``: the
    first committed record at or after the checkpoint and below the row's LSO (``offset``,
    ``timestamp_ms``, ``age_s``), or None when no committed record waits there (none past the
    checkpoint, or only aborted ones).

    A partition without a checkpoint counts from its log start, as its lag does. ``mirror``: a
    SQL sink's checkpoints from its Kafka mirror (see :func:`kafka_eos.pipeline.checkpoints`).
    """
    rows, drift = checkpoint_rows(spec, settings, mirror)
    return with_oldest_unprocessed(settings, rows, now_ms), drift


def with_oldest_unprocessed(settings: KafkaSettings, rows: list[dict], now_ms: int | None = None) -> list[dict]:
    """Add ``oldest_unprocessed`` (see :func:`backlog`) to checkpoint rows, of one pipeline or of
    many: one read for all, and one more for each further checkpoint of a partition that several
    pipelines read from different offsets."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    for r in rows:
        r["oldest_unprocessed"] = None
    pending = [r for r in rows if r["lag"] > 0]
    while pending:
        starts: dict = {}
        this_read, later = [], []
        for r in pending:
            tp, start = (r["topic"], r["partition"]), r["log_start"] if r["checkpoint"] is None else r["checkpoint"]
            (this_read if starts.setdefault(tp, start) == start else later).append(r)
        firsts = first_records(settings, starts, committed=True)
        for r in this_read:
            first = firsts.get((r["topic"], r["partition"]))
            # A row is one look: a record at or past the LSO it was listed with became readable
            # after that (a transaction committed in between). It is the next look's, with its LSO;
            # counted here, one commit would fire an event trigger twice (seen: two asset runs).
            if first is not None and first[0] < r["lso"]:
                r["oldest_unprocessed"] = {"offset": first[0], "timestamp_ms": first[1],
                                           "age_s": round(max(0.0, (now_ms - first[1]) / 1000), 1)}
        pending = later
    return rows


def waiting(rows: list[dict]) -> list[dict]:
    """The rows of :func:`backlog` whose partition holds committed records not processed yet."""
    return [r for r in rows if r["oldest_unprocessed"] is not None]


@dataclass(frozen=True)
class Staleness:
    """A source partition whose oldest unprocessed committed record is older than the limit."""

    pipeline: str
    topic: str
    partition: int
    checkpoint: int | None
    lso: int
    lag: int
    oldest_offset: int
    age_s: float
    limit_s: int

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (f"{self.pipeline}: {self.topic}-{self.partition}: the oldest unprocessed committed record "
                f"(offset {self.oldest_offset}) is {self.age_s:g}s old, over the limit of {self.limit_s}s "
                f"(checkpoint {self.checkpoint}, LSO {self.lso}, lag {self.lag})")


def stale(spec: PipelineSpec, rows: list[dict]) -> list[Staleness]:
    """The partitions of :func:`backlog` rows that break the spec's ``source.freshness_limit_s``
    (none when the spec sets no limit)."""
    limit = spec.source.freshness_limit_s
    if limit is None:
        return []
    return [Staleness(spec.name, r["topic"], r["partition"], r["checkpoint"], r["lso"], r["lag"],
                      r["oldest_unprocessed"]["offset"], r["oldest_unprocessed"]["age_s"], limit)
            for r in waiting(rows) if r["oldest_unprocessed"]["age_s"] > limit]
