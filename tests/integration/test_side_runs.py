"""Replays and backfills as side runs of the real batch step (real broker, real Spark, real SQL):
exactly once per generation, the recorded ranges reused, the live checkpoint never moved."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.backfill.side import (BACKFILL, REPLAY, interval_key, interval_ranges, prepare, replay_key,
                                     replay_ranges, side_spec)
from kafka_eos.batch import run_batch
from kafka_eos.errors import DataLossError, PlanError
from kafka_eos.readers import read_committed

pytestmark = pytest.mark.integration

#: A recent hour, on a 5-minute boundary: older records would be deleted by the broker's
#: retention (7 days) while the test runs.
T0 = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def test_a_replay_writes_its_range_once_per_generation_beside_the_live_pipeline(spark, kafka_settings, make_spec,
                                                                                unique):
    backfill = f"backfill-{unique}"
    kafka_admin.create_topics(kafka_settings, {backfill: 1})
    spec = make_spec(partitions=2, backfill_topic=backfill)
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config())
    for p, n in ((0, 10), (1, 4)):
        for i in range(n):
            producer.produce(topic, key=f"{p}-{i}".encode(), value=f"v{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0
    live = {(topic, 0): 10, (topic, 1): 4}
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, live)  # the live pipeline is done

    run_id = "manual__2026-11-23T10:00:00+00:00"
    asked = (json.dumps({f"{topic}-0": 2, f"{topic}-1": 0}), json.dumps({f"{topic}-0": 6, f"{topic}-1": 4}))

    def replay(attempt: str, reprocess: bool = False):
        side, plan, _mapping = prepare(spec, kafka_settings, run_id, REPLAY, replay_key(*asked), attempt,
                                       lambda: replay_ranges(spec, kafka_settings, *asked), reprocess)
        return side, run_batch(spark, side_spec(spec, side), plan, kafka_settings)

    side, summary = replay(f"{run_id}#0")
    assert (side.generation, summary.status, summary.records_out) == (1, "committed", 8)
    out = read_committed(kafka_settings, backfill)
    assert sorted(m.key for m in out) == sorted([f"0-{i}".encode() for i in range(2, 6)] +
                                                [f"1-{i}".encode() for i in range(4)])
    assert {(m.headers["kafka-eos.range"], m.headers["kafka-eos.generation"]) for m in out} == {
        (replay_key(*asked).encode(), b"1")}
    for i in range(5):  # more records arrive: the recorded range does not grow
        producer.produce(topic, value=b"late", partition=0)
    producer.flush(30)

    assert replay(f"{run_id}#0")[1].status == "empty"  # a retry: committed already
    assert replay(f"{run_id}#1")[1].status == "empty"  # asked again, no reprocess: generation 1 is done
    side, summary = replay(f"{run_id}#2", reprocess=True)  # reprocess: a new generation, the same ranges
    assert (side.generation, summary.status, summary.records_out) == (2, "committed", 8)
    out = read_committed(kafka_settings, backfill)
    assert sorted(m.headers["kafka-eos.generation"] for m in out) == [b"1"] * 8 + [b"2"] * 8
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(live)) == live  # untouched
    assert read_committed(kafka_settings, spec.sink.topic) == []  # the live output: nothing


def _orders_at(kafka_settings, topic: str, minutes: list[float]) -> None:
    producer = Producer(kafka_settings.client_config())
    for i, m in enumerate(minutes):
        at = T0 + timedelta(minutes=m)
        order = {"order_id": f"o-{i}", "customer_id": "c", "amount": "10.00", "currency": "EUR",
                 "category": "books", "ts": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        producer.produce(topic, value=json.dumps(order).encode(), partition=i % 2, timestamp=_ms(at))
    assert producer.flush(30) == 0


def test_backfill_intervals_replace_their_sql_rows_once(spark, kafka_settings, make_spec, unique, tmp_path):
    import sqlite3

    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic", partitions=2,
                     table="revenue", key_columns=["minute", "category"], merge="add")
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 1.7, 5.2, 6.1, 6.2, 6.3, 10.4, 14.9])
    db = spec.sink.url.removeprefix("sqlite:///")
    with pytest.raises(PlanError, match=rf"{topic}-0: the backfill .* reads \[0, 2\), beyond the live checkpoint None"):
        prepare(spec, kafka_settings, "early", BACKFILL, "k", "early#0",
                lambda: interval_ranges(spec, kafka_settings, T0, T0 + timedelta(minutes=5)))
    # The live pipeline has read everything: a backfill recomputes rows, it adds nothing twice.
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 5, (topic, 1): 4})
    from kafka_eos.sinks.sql import SqlSink
    from kafka_eos.plan import PartitionRange, Plan

    SqlSink(spec).create_tables()
    SqlSink(spec).commit(Plan(spec.name, "live", (PartitionRange(topic, 0, 0, 5, None), PartitionRange(topic, 1, 0, 4, None))),
                         None, None, iter(()))

    def backfill(start_min: int, attempt: str, reprocess: bool = False):
        start, end = T0 + timedelta(minutes=start_min), T0 + timedelta(minutes=start_min + 5)
        side, plan, mapping = prepare(spec, kafka_settings, f"backfill__{start.isoformat()}", BACKFILL,
                                      interval_key(start, end), attempt,
                                      lambda: interval_ranges(spec, kafka_settings, start, end), reprocess)
        return mapping, run_batch(spark, side_spec(spec, side), plan, kafka_settings)

    def rows():
        with sqlite3.connect(db) as conn:
            return sorted(conn.execute("select minute, order_count from revenue").fetchall())

    mappings = {}
    for start_min in (0, 5, 10):  # three intervals
        mappings[start_min], summary = backfill(start_min, f"b{start_min}#0")
        assert summary.status == "committed"
    assert [r[1] for r in rows()] == [1, 2, 1, 3, 1, 1]  # 12:00 1, 12:01 2, 12:05 1, 12:06 3, 12:10 1, 12:14 1
    assert sum(b - a for m in mappings.values() for _t, _p, a, b in m["ranges"]) == 9  # every order, once
    assert backfill(5, "b5#1")[1].status == "empty"  # the same backfill again: nothing changes
    assert [r[1] for r in rows()] == [1, 2, 1, 3, 1, 1]
    again, summary = backfill(5, "b5#2", reprocess=True)  # reprocessing reads the identical ranges
    assert again["ranges"] == mappings[5]["ranges"] and summary.status == "committed"
    assert [r[1] for r in rows()] == [1, 2, 1, 3, 1, 1]  # replaced, not added

    # An interval whose records retention deleted fails, naming the partition and the log start.
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 3)])[TopicPartition(topic, 0, 3)].result(30)
    with pytest.raises(DataLossError, match=rf"{topic}-0: the interval .* reaches back to the log start 3"):
        interval_ranges(spec, kafka_settings, T0, T0 + timedelta(minutes=5))
