"""Replays and backfills as side runs of the real batch step (real broker, real Spark, real SQL):
exactly once per generation, the recorded ranges reused, the live checkpoint never moved."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.backfill.side import (BACKFILL, REPLAY, interval_key, interval_ranges, prepare, replay_key,
                                     replay_ranges, side_spec)
from kafka_eos.batch import run_batch
from kafka_eos.errors import DataLossError
from kafka_eos.readers import read_committed
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.waits]

#: A recent hour, on a 5-minute boundary: older records would be deleted by the broker's
#: retention (7 days) while the test runs.
T0 = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _prepare_replay(spec, settings, asked: tuple[str, str], attempt: str, reprocess: bool = False,
                    run_id: str = "replay-1"):
    """The side run of replaying ``asked`` (from, until) for ``attempt``: (side, plan)."""
    side, plan, _mapping = prepare(spec, settings, run_id, REPLAY, replay_key(*asked), attempt,
                                   lambda: replay_ranges(spec, settings, *asked), reprocess)
    return side, plan


def _replay(spark, spec, settings, asked: tuple[str, str], attempt: str, reprocess: bool = False,
            run_id: str = "replay-1"):
    """Prepare and run a replay: (side, run summary)."""
    side, plan = _prepare_replay(spec, settings, asked, attempt, reprocess, run_id)
    return side, run_batch(spark, side_spec(spec, side), plan, settings)


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
        return _replay(spark, spec, kafka_settings, asked, attempt, reprocess, run_id)

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


def _sql_rows(db: str, query: str) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return sorted(conn.execute(query).fetchall())


def test_sql_side_runs_write_a_table_of_their_own_never_the_live_one(spark, kafka_settings, make_spec, unique,
                                                                     tmp_path):
    from kafka_eos.errors import SpecError
    from kafka_eos.pipeline import prepare_plan

    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic", partitions=2,
                     table="revenue", key_columns=["minute", "category"], merge="add", backfill_table="revenue_bf")
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 1.7, 5.2, 6.1, 6.2, 6.3, 10.4, 14.9])
    poison = Producer(kafka_settings.client_config())
    poison.produce(topic, value=b"not json", partition=0)
    assert poison.flush(30) == 0
    db = spec.sink.url.removeprefix("sqlite:///")
    live = run_batch(spark, spec, prepare_plan(spec, kafka_settings, "live-1"), kafka_settings)
    assert (live.status, live.records_in, live.dead_letters) == ("committed", 10, 1)
    live_rows = _sql_rows(db, "select minute, order_count from revenue")
    assert [n for _m, n in live_rows] == [1, 2, 1, 3, 1, 1]
    live_checkpoint = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0), (topic, 1)])

    # A replay of part of the data: partition 0 only (the minutes 12:01 and 12:06 have orders in both).
    asked = (json.dumps({f"{topic}-0": 0}), json.dumps({f"{topic}-0": 6}))

    def replay(attempt: str, reprocess: bool = False):
        return _replay(spark, spec, kafka_settings, asked, attempt, reprocess)

    side, summary = replay("r#0")
    assert (summary.status, summary.records_in, summary.records_out, summary.dead_letters) == ("committed", 6, 4, 1)
    assert _sql_rows(db, "select minute, order_count from revenue") == live_rows  # the live table: untouched
    key = replay_key(*asked)
    assert [(n, k, g) for _m, n, k, g in _sql_rows(
        db, "select minute, order_count, kafka_eos_range, kafka_eos_generation from revenue_bf")] == [
        (1, key, 1), (1, key, 1), (2, key, 1), (1, key, 1)]  # 12:00, 12:01, 12:06, 12:14 of partition 0
    # Its dead letter went to its own table, not to the live pipeline's.
    assert _sql_rows(db, 'select pipeline, "offset" from kafka_eos_dead_letters') == [(spec.name, 5)]
    assert _sql_rows(db, 'select "offset", reason is not null from revenue_bf_dead_letters') == [(5, 1)]
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(live_checkpoint)) == live_checkpoint
    assert replay("r#0")[1].status == "empty"  # a retry: done
    side2, again = replay("r#1", reprocess=True)  # a new generation beside the first
    assert (side2.generation, again.records_out) == (2, 4)
    assert len(_sql_rows(db, "select * from revenue_bf")) == 8

    # The statement the run's note gives: the operator promotes the checked replay into the live table
    # (`kafka-eos backfill promote`: a dry run prints it, --yes runs it; a keyed table's upsert, so twice
    # is once).
    import yaml

    from kafka_eos.backfill.side import promote_statement
    from kafka_eos.cli import main
    from kafka_eos.spec import spec_document

    statement = promote_statement(spec, side)
    assert statement.startswith('INSERT INTO "revenue" (') and f"\"kafka_eos_range\" = '{key}'" in statement
    path = tmp_path / "revenue.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    flags = ["--bootstrap", kafka_settings.bootstrap_servers, "--json"]
    assert main(["backfill", "promote", str(path), side.suffix, *flags]) == 0
    assert [n for _m, n in _sql_rows(db, "select minute, order_count from revenue")] == [1, 2, 1, 3, 1, 1]
    for _ in range(2):
        assert main(["backfill", "promote", str(path), side.suffix, "--yes", *flags]) == 0
        assert [n for _m, n in _sql_rows(db, "select minute, order_count from revenue")] == [1, 1, 1, 2, 1, 1]

    # A SQL spec without a table for side runs refuses them, naming the field.
    bare = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic", partitions=2,
                     table="revenue2", key_columns=["minute", "category"], merge="add")
    with pytest.raises(SpecError, match=r"sink.backfill_table: required for a replay of a sql sink"):
        prepare(bare, kafka_settings, "replay-2", REPLAY, "k", "k#0", lambda: ({}, []))


def test_a_kafka_side_runs_dead_letters_never_reach_the_live_dead_letter_topic(spark, kafka_settings, make_spec,
                                                                               unique):
    from kafka_eos.backfill.side import RANGE_HEADER

    backfill, backfill_dlq = f"backfill-{unique}", f"backfill-dlq-{unique}"
    kafka_admin.create_topics(kafka_settings, {backfill: 1, backfill_dlq: 1})
    spec = make_spec("spark_apps.transforms.orders:enrich", partitions=2, backfill_topic=backfill)
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 2.5])  # partition 0: two orders
    producer = Producer(kafka_settings.client_config())
    producer.produce(topic, value=b"not json", partition=0)
    assert producer.flush(30) == 0
    asked = (json.dumps({f"{topic}-0": 0}), json.dumps({f"{topic}-0": 3}))

    def replay(s, attempt: str):
        return _replay(spark, s, kafka_settings, asked, attempt, reprocess=True)[1]

    summary = replay(spec, "a#0")  # no dead-letter topic of its own: into the backfill topic, marked
    assert (summary.records_out, summary.dead_letters) == (2, 1)
    assert read_committed(kafka_settings, spec.sink.dlq_topic) == []
    out = read_committed(kafka_settings, backfill)
    assert sorted(m.headers.get("kafka-eos.reason", b"-") != b"-" for m in out) == [False, False, True]
    assert all(m.headers[RANGE_HEADER] == replay_key(*asked).encode() for m in out)

    own = dataclasses.replace(spec, sink=dataclasses.replace(spec.sink, backfill_dlq_topic=backfill_dlq))
    summary = replay(own, "b#0")  # with one: there, a new generation
    assert (summary.records_out, summary.dead_letters) == (2, 1)
    assert read_committed(kafka_settings, spec.sink.dlq_topic) == []
    (dead,) = read_committed(kafka_settings, backfill_dlq)
    assert dead.value == b"not json" and dead.headers["kafka-eos.source.offset"] == b"2"
    assert len(read_committed(kafka_settings, backfill)) == 3 + 2


def test_side_runs_are_never_the_live_pipelines_memory_or_last_run(spark, kafka_settings, make_spec, unique):
    from kafka_eos.manifest import ManifestStore
    from kafka_eos.pipeline import prepare_plan

    backfill = f"backfill-{unique}"
    kafka_admin.create_topics(kafka_settings, {backfill: 1})
    spec = make_spec(partitions=2, backfill_topic=backfill)
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config())
    for p in (0, 1):
        for i in range(6):
            producer.produce(topic, value=f"v{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0
    asked = (json.dumps({f"{topic}-0": 0}), json.dumps({f"{topic}-0": 4}))
    assert _replay(spark, spec, kafka_settings, asked, "r#0")[1].status == "committed"

    # A replay before the pipeline's first live run: the live pipeline still starts at the beginning.
    manifest = ManifestStore.of(spec, kafka_settings)
    assert manifest.state().checkpoints == {}
    assert manifest.last_run() is None
    live_plan = prepare_plan(spec, kafka_settings, "live-1")
    assert sorted((r.tp, r.from_offset, r.until) for r in live_plan.active) == [
        ((topic, 0), 0, 6), ((topic, 1), 0, 6)]
    # A side run planned after the live plan task: the live run still finds its stored plan.
    side, plan = _prepare_replay(spec, kafka_settings, asked, "r#1", reprocess=True, run_id="replay-2")
    assert manifest.stored_plan("live-1").ranges == live_plan.ranges
    assert run_batch(spark, spec, live_plan, kafka_settings).status == "committed"
    assert run_batch(spark, side_spec(spec, side), plan, kafka_settings).status == "committed"
    # The side run committed last; the live pipeline's last run is still its own.
    assert manifest.last_run()["plan"]["run_id"] == "live-1"
    assert [r["plan"]["run_id"] for r in manifest.last_runs(10)] == ["live-1"]
    assert {tp: rec["offset"] for tp, rec in manifest.state().checkpoints.items()} == {(topic, 0): 6, (topic, 1): 6}
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == sorted(
        f"v{p}-{i}".encode() for p in (0, 1) for i in range(6))


def test_a_killed_side_run_does_not_hold_its_retry_until_the_transaction_timeout(spark, kafka_settings, make_spec,
                                                                                 unique):
    import time

    from confluent_kafka import Consumer

    backfill = f"backfill-{unique}"
    kafka_admin.create_topics(kafka_settings, {backfill: 1})
    spec = make_spec(partitions=1, backfill_topic=backfill)
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config())
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    asked = (json.dumps({f"{topic}-0": 0}), json.dumps({f"{topic}-0": 5}))
    side, _plan = _prepare_replay(spec, kafka_settings, asked, "r#0")
    sspec = side_spec(spec, side)

    # The side run's attempt, killed after it sent its offsets into its transaction (10 minutes).
    zombie = Producer(kafka_settings.client_config(**{"transactional.id": sspec.transactional_id(),
                                                      "transaction.timeout.ms": 600_000}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(backfill, value=b"from the killed attempt")
    group = Consumer(kafka_settings.client_config(**{"group.id": sspec.source.group_id}))
    zombie.send_offsets_to_transaction([TopicPartition(topic, 0, 5)], group.consumer_group_metadata(), 30)
    group.close()
    zombie.flush(30)

    started = time.monotonic()  # the retry: its plan fences the side run's own id, not the live one's
    side, plan = _prepare_replay(spec, kafka_settings, asked, "r#0")
    assert [(r.from_offset, r.until, r.expected) for r in plan.active] == [(0, 5, None)]
    assert run_batch(spark, sspec, plan, kafka_settings).status == "committed"
    assert time.monotonic() - started < 300, "the retry waited for the killed attempt's transaction timeout"
    assert sorted(m.value for m in read_committed(kafka_settings, backfill)) == [f"v{i}".encode() for i in range(5)]
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0)]) == {(topic, 0): None}


def test_backfill_intervals_of_a_sql_sink_are_written_once_per_generation(spark, kafka_settings, make_spec, unique,
                                                                          tmp_path):
    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic", partitions=2,
                     table="revenue", key_columns=["minute", "category"], merge="add", backfill_table="revenue_bf")
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 1.7, 5.2, 6.1, 6.2, 6.3, 10.4, 14.9])
    db = spec.sink.url.removeprefix("sqlite:///")

    def backfill(start_min: int, attempt: str, reprocess: bool = False):
        start, end = T0 + timedelta(minutes=start_min), T0 + timedelta(minutes=start_min + 5)
        side, plan, mapping = prepare(spec, kafka_settings, f"backfill__{start.isoformat()}", BACKFILL,
                                      interval_key(start, end), attempt,
                                      lambda: interval_ranges(spec, kafka_settings, start, end), reprocess)
        return mapping, run_batch(spark, side_spec(spec, side), plan, kafka_settings)

    def rows(generation: int = 1):
        return [r[1] for r in _sql_rows(db, f"select minute, order_count from revenue_bf "
                                            f"where kafka_eos_generation = {generation}")]

    mappings = {}
    for start_min in (0, 5, 10):  # three intervals, before any live run: nothing live is touched
        mappings[start_min], summary = backfill(start_min, f"b{start_min}#0")
        assert summary.status == "committed"
    assert rows() == [1, 2, 1, 3, 1, 1]  # 12:00 1, 12:01 2, 12:05 1, 12:06 3, 12:10 1, 12:14 1
    assert sum(b - a for m in mappings.values() for _t, _p, a, b in m["ranges"]) == 9  # every order, once
    assert backfill(5, "b5#1")[1].status == "empty"  # the same backfill again: nothing changes
    assert rows() == [1, 2, 1, 3, 1, 1]
    again, summary = backfill(5, "b5#2", reprocess=True)  # reprocessing reads the identical ranges
    assert again["ranges"] == mappings[5]["ranges"] and summary.status == "committed"
    assert rows(1) == [1, 2, 1, 3, 1, 1] and rows(2) == [1, 3]  # generation 2: the interval 12:05-12:10
    from sqlalchemy import inspect

    from kafka_eos.sinks.sql_store import make_engine

    assert not inspect(make_engine(spec.sink.url)).has_table("revenue")  # no live table was written

    # An interval whose records retention deleted fails, naming the partition and the log start.
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 3)])[TopicPartition(topic, 0, 3)].result(30)
    with pytest.raises(DataLossError, match=rf"{topic}-0: the interval .* reaches back to the log start 3"):
        interval_ranges(spec, kafka_settings, T0, T0 + timedelta(minutes=5))


def test_a_backfill_interval_held_open_by_a_transaction_is_refused_until_it_ends(kafka_settings, make_spec, unique):
    """Found by the soak: a stranger's transaction held a source partition while Airflow backfilled
    a past minute; the interval ended at the LSO and was written without that partition's records.
    An interval whose end no committed record reaches on a partition held by an open transaction is
    refused, naming the partition; once the transaction ends the interval is read to its end."""
    from kafka_eos.errors import IntervalNotStable

    spec = make_spec("identity", partitions=2)
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 6.0])  # partition 0: 0.5, 6.0; partition 1: 1.5
    start, end = T0, T0 + timedelta(minutes=5)
    held = Producer(kafka_settings.client_config(**{"transactional.id": f"held-{unique}"}))
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(topic, value=b"{}", partition=1, timestamp=_ms(T0 + timedelta(minutes=2)))
    assert held.flush(30) == 0
    # Partition 0 has a committed record after the interval (6.0): its end is known. Partition 1's
    # interval may go on inside the open transaction.
    with pytest.raises(IntervalNotStable, match=rf"{topic}-1: the interval .* an open transaction holds the "
                                                r"partition at offset 1 \(high watermark 2\)"):
        interval_ranges(spec, kafka_settings, start, end)
    held.commit_transaction(30)
    ranges, _skipped = interval_ranges(spec, kafka_settings, start, end)
    assert ranges == {(topic, 0): (0, 1), (topic, 1): (0, 2)}  # the held record belongs to the interval


def test_a_replay_ending_at_a_time_inside_an_open_transaction_is_refused_until_it_ends(kafka_settings, make_spec,
                                                                                      unique):
    """As a backfill's interval: a replay whose replay_until is a timestamp no committed record of
    a partition reaches, while an open transaction holds that partition, would end at the LSO and
    leave out the transaction's records of the range once it commits. Refused, naming the field and
    the partition; explicit offsets (which never go past the LSO) and the start are unaffected."""
    from kafka_eos.errors import IntervalNotStable

    spec = make_spec("identity", partitions=2)
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5, 1.5, 6.0])  # partition 0: 0.5, 6.0; partition 1: 1.5
    held = Producer(kafka_settings.client_config(**{"transactional.id": f"held-{unique}"}))
    held.init_transactions(30)
    held.begin_transaction()
    held.produce(topic, value=b"{}", partition=1, timestamp=_ms(T0 + timedelta(minutes=2)))
    assert held.flush(30) == 0
    asked = (T0.isoformat(), (T0 + timedelta(minutes=5)).isoformat())
    with pytest.raises(IntervalNotStable, match=rf"params.replay_until: {topic}-1: the range up to .* an open "
                                                r"transaction holds the partition at offset 1 \(high watermark 2\)"):
        replay_ranges(spec, kafka_settings, *asked)
    # A start in the held partition, or an end in explicit offsets, is no question of the future.
    ranges, _ = replay_ranges(spec, kafka_settings, T0.isoformat(), json.dumps({f"{topic}-0": 1, f"{topic}-1": 1}))
    assert ranges == {(topic, 0): (0, 1), (topic, 1): (0, 1)}
    held.commit_transaction(30)
    ranges, _ = replay_ranges(spec, kafka_settings, *asked)
    assert ranges == {(topic, 0): (0, 1), (topic, 1): (0, 2)}  # the held record belongs to the range


@pytest.mark.parametrize("kind", ["backfill", "replay"])
def test_a_transaction_committed_between_the_offsets_read_and_the_time_lookup_stays_in_the_range(
        kafka_settings, make_spec, unique, monkeypatch, kind):
    """Kafka answers offsets-for-times below the LSO it has when it answers. A transaction X holds
    the partition when the range's positions are read; X commits just before the lookup of the
    range's end, which then finds the committed record after X's. The range ends there, with X's
    records in it: not at the LSO read before the lookup (which left X's records out of the range,
    and out of the next one too)."""
    from kafka_eos.backfill import positions

    spec = make_spec("identity", partitions=1)
    topic = spec.source.topics[0]
    _orders_at(kafka_settings, topic, [0.5])  # offset 0
    x = Producer(kafka_settings.client_config(**{"transactional.id": f"x-{unique}"}))
    x.init_transactions(30)
    x.begin_transaction()
    for _ in range(2):  # offsets 1, 2: in the interval
        x.produce(topic, value=b"{}", partition=0, timestamp=_ms(T0 + timedelta(minutes=2)))
    assert x.flush(30) == 0
    late = Producer(kafka_settings.client_config())  # offset 3: after the interval, behind X
    late.produce(topic, value=b"{}", partition=0, timestamp=_ms(T0 + timedelta(minutes=6)))
    assert late.flush(30) == 0
    end = T0 + timedelta(minutes=5)
    real = positions.Consumer

    class CommitsXFirst:
        """A real consumer; X commits as the lookup of the range's end reaches the broker."""

        def __init__(self, config):
            self.consumer = real(config)

        def offsets_for_times(self, partitions, timeout):
            if any(p.offset == _ms(end) for p in partitions) and not committed:
                x.commit_transaction(30)
                committed.append(True)
                # The commit returns before its markers are written: the LSO moves past X soon after.
                wait_until("X's commit marker", lambda: kafka_admin.partition_offsets(
                    kafka_settings, [(topic, 0)])[(topic, 0)].lso == 5)
            return self.consumer.offsets_for_times(partitions, timeout)

        def close(self):
            self.consumer.close()

    committed: list = []
    monkeypatch.setattr(positions, "Consumer", CommitsXFirst)
    if kind == "backfill":
        ranges, _skipped = interval_ranges(spec, kafka_settings, T0, end)
    else:
        ranges, _ = replay_ranges(spec, kafka_settings, T0.isoformat(), end.isoformat())
    assert committed
    assert ranges == {(topic, 0): (0, 3)}  # X's records (1, 2) in the range, the late one (3) not
