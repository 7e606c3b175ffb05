"""A pipeline's backlog on a real broker: committed records only (not aborted ones, not those
behind an open transaction), the age of the oldest, and the freshness limit of the spec."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.health.backlog import backlog, stale, waiting, with_oldest_unprocessed

pytestmark = pytest.mark.integration


def _by_partition(rows: list[dict]) -> dict[int, dict]:
    return {r["partition"]: r for r in rows}


def test_backlog_ages_the_oldest_committed_record_and_checks_freshness(kafka_settings, make_spec, unique):
    spec = make_spec(partitions=3, source={"freshness_limit_s": 600})
    topic = spec.source.topics[0]
    hour_ago = int(time.time() * 1000) - 3_600_000
    txn = Producer(kafka_settings.client_config(**{"transactional.id": f"writer-{unique}"}))
    txn.init_transactions(30)
    for p in (0, 1):  # an aborted transaction at the head of partitions 0 and 1: offsets 0, 1, marker 2
        txn.begin_transaction()
        txn.produce(topic, value=b"aborted", partition=p, timestamp=hour_ago - 60_000)
        txn.produce(topic, value=b"aborted", partition=p, timestamp=hour_ago - 60_000)
        txn.flush(30)
        txn.abort_transaction(30)
    plain = Producer(kafka_settings.client_config())
    for _ in range(3):  # partition 0: committed records at offsets 3-5, an hour old
        plain.produce(topic, value=b"late", partition=0, timestamp=hour_ago)
    plain.produce(topic, value=b"fresh", partition=2)  # partition 2: one record, written now
    assert plain.flush(30) == 0
    txn.begin_transaction()  # partition 1: an open transaction at offset 3 ...
    txn.produce(topic, value=b"open", partition=1)
    txn.flush(30)
    plain.produce(topic, value=b"behind", partition=1)  # ... and a committed record behind it (offset 4)
    assert plain.flush(30) == 0

    rows = _by_partition(backlog(spec, kafka_settings)[0])
    assert [(r["lso"], r["lag"]) for r in rows.values()] == [(6, 6), (3, 3), (1, 1)]
    assert rows[0]["oldest_unprocessed"]["offset"] == 3 and rows[0]["oldest_unprocessed"]["timestamp_ms"] == hour_ago
    assert 3590 <= rows[0]["oldest_unprocessed"]["age_s"] < 3700
    assert rows[1]["oldest_unprocessed"] is None  # lag 3, but aborted records and the LSO: nothing to read
    assert rows[2]["oldest_unprocessed"]["offset"] == 0 and rows[2]["oldest_unprocessed"]["age_s"] < 60
    assert [r["partition"] for r in waiting(list(rows.values()))] == [0, 2]
    (late,) = stale(spec, list(rows.values()))
    assert (late.topic, late.partition, late.checkpoint, late.lso, late.oldest_offset, late.limit_s) == (
        topic, 0, None, 6, 3, 600)
    assert late.summary().startswith(f"{spec.name}: {topic}-0: the oldest unprocessed committed record (offset 3) is ")
    assert "over the limit of 600s (checkpoint None, LSO 6, lag 6)" in late.summary()

    txn.abort_transaction(30)  # the record behind the open transaction becomes readable
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 6, (topic, 2): 1})
    rows = _by_partition(backlog(spec, kafka_settings)[0])
    assert rows[0]["oldest_unprocessed"] is None and rows[2]["oldest_unprocessed"] is None
    assert (rows[1]["lso"], rows[1]["oldest_unprocessed"]["offset"]) == (6, 4)

    # A row is one look: listed while the transaction was open (LSO 3), the record that became
    # readable since (offset 4) is not that look's backlog; the next look, with its LSO, has it.
    (looked_before,) = with_oldest_unprocessed(kafka_settings, [{**rows[1], "lso": 3, "lag": 3}])
    assert looked_before["oldest_unprocessed"] is None
    assert rows[1]["oldest_unprocessed"]["offset"] == 4
    assert stale(spec, list(rows.values())) == []  # processed, or fresh
