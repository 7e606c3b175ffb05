"""Exactly-once, judged on a read_committed consumer's view (or a query): no loss, no duplicate,
nothing from an aborted transaction, checkpoint == each partition's planned end."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from sqlalchemy import create_engine, text

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders

pytestmark = pytest.mark.integration


def run_once(spark, spec, settings, run_id):
    plan = prepare_plan(spec, settings, run_id)
    summary = run_batch(spark, spec, plan, settings)
    verify(spec, settings, plan)
    return plan, summary


def capped(spec, n):
    return dataclasses.replace(spec, source=dataclasses.replace(spec.source, max_records_per_partition=n))


@pytest.mark.quick
@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_kafka_sink_identity_exactly_once_over_aborted_input(spark, kafka_settings, admin, make_spec, commit):
    spec = make_spec("identity", "kafka", commit)
    source = spec.source.topics[0]
    truth = produce_orders(kafka_settings, source, 300, abort_every=3, malformed_every=0)
    assert truth.aborted, "the input must hold aborted transactions"

    # Run 1 is capped below the LSO; run 2 reads the rest; run 3 finds nothing new.
    plan1, s1 = run_once(spark, capped(spec, 60), kafka_settings, "run-1")
    lso = kafka_admin.partition_offsets(kafka_settings, [r.tp for r in plan1.ranges])
    assert any(r.until < lso[r.tp].lso for r in plan1.ranges), "run 1 should be capped below the LSO"
    plan2, s2 = run_once(spark, spec, kafka_settings, "run-2")
    plan3, s3 = run_once(spark, spec, kafka_settings, "run-3")
    assert s3.status == "empty" and plan3.is_empty

    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    expected = [o["order_id"] for o in truth.committed]
    assert Counter(out) == Counter(expected)  # nothing lost, nothing twice
    assert not set(out) & set(truth.aborted)  # nothing from an aborted transaction
    assert s1.records_out + s2.records_out == len(expected)

    checkpoints = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan2.ranges])
    for r in plan2.ranges:
        assert checkpoints[r.tp] == r.until == lso[r.tp].lso
    # Each checkpoint's metadata reads back whole (per_partition's JVM writer ends it with a NUL, as
    # librdkafka does: confluent-kafka reads it as a C string): run 2's plan time, to the millisecond.
    times = kafka_admin.committed_offsets_and_times(kafka_settings, spec.source.group_id, [r.tp for r in plan2.active])
    assert {at.planned_at for _offset, at in times.values()} == {plan2.planned_ms / 1000}, times


@pytest.mark.quick
def test_orders_enriched_poison_goes_to_dlq_in_the_same_transaction(spark, kafka_settings, make_spec):
    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", "per_partition")
    truth = produce_orders(kafka_settings, spec.source.topics[0], 200, abort_every=4, malformed_every=9)
    _, summary = run_once(spark, spec, kafka_settings, "run-1")

    enriched = [json.loads(m.value) for m in read_committed(kafka_settings, spec.sink.topic)]
    dead = read_committed(kafka_settings, spec.sink.dlq_topic)
    assert sorted(o["order_id"] for o in enriched) == sorted(o["order_id"] for o in truth.committed)
    assert all(o["size"] in ("small", "medium", "large") and "amount_eur" in o for o in enriched)
    assert len(dead) == truth.malformed == summary.dead_letters
    reasons = Counter(m.headers["kafka-eos.reason"].decode().split(":")[0] for m in dead)
    assert set(reasons) == {"malformed JSON", "missing field", "bad amount", "bad currency"}
    for m in dead:
        assert m.headers["kafka-eos.source.topic"].decode() == spec.source.topics[0]
        int(m.headers["kafka-eos.source.offset"])  # a real offset


def _sql_pipeline(make_spec, url):
    return make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     table="revenue", key_columns=["minute", "category"], merge="add", url=url)


def _check_sql(spec, settings, admin, truth, url):
    with create_engine(url).connect() as conn:
        counted = conn.execute(text("select sum(order_count) from revenue")).scalar()
        dead = conn.execute(text("select count(*) from kafka_eos_dead_letters where pipeline = :p"),
                            {"p": spec.name}).scalar()
        offsets = dict(((t, p), n) for t, p, n in conn.execute(text(
            "select topic, partition, next_offset from kafka_eos_offsets where pipeline = :p"), {"p": spec.name}))
    assert counted == len(truth.committed)  # each committed valid order counted exactly once
    assert dead == truth.malformed
    tps = list(offsets)
    lso = kafka_admin.partition_offsets(settings, tps)
    mirror = kafka_admin.committed_offsets(settings, spec.source.group_id, tps)
    for tp in tps:
        assert offsets[tp] == lso[tp].lso == mirror[tp]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sql_sink_exactly_once_additive_merge(spark, kafka_settings, admin, make_spec, tmp_path, backend, request):
    url = f"sqlite:///{tmp_path / 'rev.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    spec = _sql_pipeline(make_spec, url)
    if backend == "postgres":
        with create_engine(url).begin() as conn:  # the session's database is shared: a fresh table
            conn.execute(text("drop table if exists revenue"))
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 250, abort_every=3, malformed_every=11)
    run_once(spark, capped(spec, 40), kafka_settings, "run-1")
    more = produce_orders(kafka_settings, topic, 150, first_seq=250, abort_every=2, malformed_every=11,
                          transactional_id=f"more-{spec.name}")
    run_once(spark, spec, kafka_settings, "run-2")
    _, again = run_once(spark, spec, kafka_settings, "run-2")  # a retried task: same run id
    assert again.status in ("noop", "empty")
    truth.committed += more.committed
    truth.malformed += more.malformed
    _check_sql(spec, kafka_settings, admin, truth, url)
