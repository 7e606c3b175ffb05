"""A Kafka sink without a dead-letter topic: a dead letter fails the batch and commits nothing."""

from __future__ import annotations

import pytest

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import DeadLetterWithoutTopic
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders

pytestmark = [pytest.mark.integration, pytest.mark.quick]


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_dead_letter_without_dlq_topic_fails_the_batch_and_commits_nothing(spark, kafka_settings, make_spec,
                                                                          commit):
    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", commit, dlq_topic=None)
    assert spec.sink.dlq_topic is None
    produce_orders(kafka_settings, spec.source.topics[0], 120, abort_every=0, malformed_every=17)
    plan = prepare_plan(spec, kafka_settings, "run-1")

    with pytest.raises(Exception) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    # atomic: raised on the driver; per_partition: found by the check before any partition commits.
    assert isinstance(failed.value, DeadLetterWithoutTopic)
    message = str(failed.value)
    assert "\n" not in message
    assert f"{spec.source.topics[0]}-" in message and " offset " in message and "has no sink.dlq_topic" in message

    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}
    assert read_committed(kafka_settings, spec.sink.topic) == []


def test_identity_pipeline_needs_no_dlq_topic(spark, kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "per_partition", dlq_topic=None)
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 60, 0)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 60
