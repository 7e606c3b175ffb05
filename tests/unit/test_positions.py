"""Time-bounded ranges and the LSO: an offset that offsets-for-times found is committed, and is
never clamped by an LSO read before the lookup (the lookups are faked: a transaction commits
between the read of the partition's offsets and the time lookup)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from kafka_eos.backfill import positions, side
from kafka_eos.errors import IntervalNotStable
from kafka_eos.kafka_admin import PartitionOffsets
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
END = START + timedelta(minutes=5)
TP = ("orders", 0)


class Cluster:
    """One partition. An open transaction X holds it from offset 101 (its records are earlier
    than END); the high watermark is 111. X commits when the lookup of END reaches the
    broker, and a committed record at or after END lands at 112 (``commits=False``: X stays open)."""

    def __init__(self, commits: bool = True) -> None:
        self.offsets = PartitionOffsets(0, 101, 111)
        self.commits = commits
        self.reads: list[str] = []

    def partition_offsets(self, _settings, tps, admin=None):
        self.reads.append(f"offsets lso={self.offsets.lso}")
        return {tp: self.offsets for tp in tps}

    def lookup(self, ms: int) -> int:
        if self.commits and ms == int(END.timestamp() * 1000):
            self.offsets = PartitionOffsets(0, 113, 113)
        self.reads.append(f"time {ms}")
        # The broker answers below the LSO it has now.
        answer = 50 if ms == int(START.timestamp() * 1000) else 112
        return answer if answer < self.offsets.lso else -1

    def consumer(self, _config):
        cluster = self

        class Consumer:
            def offsets_for_times(self, partitions, _timeout):
                for p in partitions:
                    p.offset = cluster.lookup(p.offset)
                return partitions

            def close(self):
                pass

        return Consumer()


@pytest.fixture
def cluster(monkeypatch) -> Cluster:
    cluster = Cluster()
    for module in (positions, side):
        monkeypatch.setattr(module, "partition_offsets", cluster.partition_offsets, raising=False)
        monkeypatch.setattr(module, "source_partitions", lambda _spec, _settings: [TP], raising=False)
    monkeypatch.setattr(positions, "Consumer", cluster.consumer)
    return cluster


SPEC = parse_spec({"name": "p", "source": {"topics": ["orders"]}, "transform": "identity",
                   "sink": {"kind": "kafka", "topic": "out", "backfill_topic": "out.backfill"}}, "p.yaml")
SETTINGS = KafkaSettings(bootstrap_servers="127.0.0.1:1")


def test_a_backfill_interval_ends_where_the_time_lookup_found_its_end_not_at_an_older_lso(cluster):
    ranges, skipped = side.interval_ranges(SPEC, SETTINGS, START, END)
    assert ranges == {TP: (50, 112)}, cluster.reads  # X's records [101, 111) belong to the interval
    assert skipped == []


def test_a_replay_until_timestamp_ends_where_the_time_lookup_found_it(cluster):
    ranges, _ = side.replay_ranges(SPEC, SETTINGS, START.isoformat(), END.isoformat())
    assert ranges == {TP: (50, 112)}, cluster.reads


def test_a_timestamp_reset_lands_on_the_offset_found_not_on_an_older_lso(cluster):
    targets, _ = positions.resolve(SPEC, SETTINGS, END.isoformat(), "params.reset_checkpoint_to")
    assert targets == {TP: 112}, cluster.reads


def test_an_end_no_committed_record_reaches_is_still_refused_while_a_transaction_holds_it(monkeypatch):
    cluster = Cluster(commits=False)
    for module in (positions, side):
        monkeypatch.setattr(module, "partition_offsets", cluster.partition_offsets, raising=False)
        monkeypatch.setattr(module, "source_partitions", lambda _spec, _settings: [TP], raising=False)
    monkeypatch.setattr(positions, "Consumer", cluster.consumer)
    with pytest.raises(IntervalNotStable, match=r"orders-0: the interval .* at offset 101 \(high watermark 111\)"):
        side.interval_ranges(SPEC, SETTINGS, START, END)
