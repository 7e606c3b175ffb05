"""A Kafka sink without a dead-letter topic: a dead letter fails the batch; the transaction it was
meant for (the whole batch in atomic scope, its partition in per_partition scope) commits nothing."""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import pytest

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import DeadLetterWithoutTopic
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed, settle
from kafka_eos.sample_data import produce_orders

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.mark.parametrize("commit", ["atomic", "per_partition-two-passes"])
def test_dead_letter_without_dlq_topic_fails_the_batch_and_commits_nothing(spark, kafka_settings, make_spec,
                                                                          commit, request):
    if commit == "per_partition-two-passes":
        request.getfixturevalue("two_passes")  # the scan finds the dead letter before any commit
    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", commit.split("-")[0], dlq_topic=None)
    assert spec.sink.dlq_topic is None
    produce_orders(kafka_settings, spec.source.topics[0], 120, abort_every=0, malformed_every=17)
    plan = prepare_plan(spec, kafka_settings, "run-1")

    with pytest.raises(Exception) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    # atomic: raised on the driver; two passes: found by the scan before any partition commits.
    assert isinstance(failed.value, DeadLetterWithoutTopic)
    message = str(failed.value)
    assert "\n" not in message
    assert f"{spec.source.topics[0]}-" in message and " offset " in message and "has no sink.dlq_topic" in message

    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}
    assert read_committed(kafka_settings, spec.sink.topic) == []


def test_in_one_pass_only_the_partition_with_a_dead_letter_and_no_dlq_topic_commits_nothing(
        spark, kafka_settings, make_spec):
    """per_partition in one pass: each partition is its own transaction, opened before its rows
    are read. The task that meets a dead letter (and no dead-letter topic) aborts; the others
    commit their own rows, once; the error names the record and says what committed."""
    from confluent_kafka import Producer

    from kafka_eos.sample_data import make_order

    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", "per_partition", dlq_topic=None)
    src = spec.source.topics[0]
    rng, start = random.Random(3), datetime(2026, 11, 22, tzinfo=timezone.utc)
    producer = Producer(kafka_settings.client_config(**{"transactional.id": f"{src}-writer"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    orders = {p: [make_order(p * 100 + i, rng, start) for i in range(10)] for p in range(3)}
    for p, batch in orders.items():
        for order in batch:
            producer.produce(src, key=order["customer_id"].encode(), value=json.dumps(order).encode(), partition=p)
    producer.produce(src, key=b"c-1", value=b"{not json", partition=1)  # offset 10 of partition 1
    producer.commit_transaction(30)
    settle(kafka_settings, src)  # the commit's markers on all three partitions (else one may be left for later)
    plan = prepare_plan(spec, kafka_settings, "run-1")

    with pytest.raises(DeadLetterWithoutTopic) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"{src}-1 offset 10: dead letter (")
    assert "has no sink.dlq_topic" in message and message.endswith(f"committed by their own transactions: {src}-0, {src}-2")

    ends = {r.tp: r.until for r in plan.ranges}
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == {
        (src, 0): ends[(src, 0)], (src, 1): None, (src, 2): ends[(src, 2)]}
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert sorted(out) == sorted(o["order_id"] for p in (0, 2) for o in orders[p])


def test_identity_pipeline_needs_no_dlq_topic(spark, kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "per_partition", dlq_topic=None)
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 60, 0)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 60
