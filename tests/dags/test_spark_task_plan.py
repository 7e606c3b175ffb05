"""The Spark task of a retried run re-plans when retention deleted part of the stored range."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.pipeline import prepare_plan
from kafka_eos.spec import parse_spec

pytestmark = pytest.mark.integration


def test_spark_task_replans_after_retention_deleted_part_of_the_stored_range(kafka_settings, unique, tmp_path):
    """Before: the Spark task ran the stored plan as it was, and Spark's reader (failOnDataLoss)
    failed on the deleted records on every retry, whatever on_data_loss said."""
    from kafka_eos_airflow.operators.pipeline import KafkaEosSparkSubmitOperator

    topic = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1, f"out-{unique}": 1})
    spec = parse_spec({"name": unique, "source": {"topics": [topic], "on_data_loss": "skip"},
                       "sink": {"kind": "kafka", "topic": f"out-{unique}"}}, str(tmp_path / "p.yaml"))
    producer = Producer(kafka_settings.client_config())
    for i in range(10):
        producer.produce(topic, value=f"v{i}".encode())
    producer.flush(30)
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 2})  # an earlier run
    stored = prepare_plan(spec, kafka_settings, "run-2")  # the plan task
    assert (stored.ranges[0].from_offset, stored.ranges[0].until) == (2, 10)

    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 4)])[TopicPartition(topic, 0, 4)].result(30)

    plan = KafkaEosSparkSubmitOperator.plan_to_run(kafka_settings, spec, "run-2")  # the Spark task
    (r,) = plan.ranges
    assert (r.from_offset, r.until, r.expected) == (4, 10, 2)
    assert [(s.from_offset, s.until) for s in plan.skipped] == [(2, 4)]


def test_spark_task_of_a_live_run_steps_aside_for_a_stream_that_started_after_its_plan(
        kafka_settings, kafka_connection, unique, tmp_path):
    """The plan task ran before the stream started: the Spark task must not fence the stream."""
    import yaml
    from airflow.sdk.exceptions import AirflowSkipException

    from kafka_eos.spec import spec_document
    from kafka_eos.lease import StreamLease
    from kafka_eos_airflow.operators.pipeline import KafkaEosSparkSubmitOperator

    topic = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1, f"out-{unique}": 1})
    spec = parse_spec({"name": unique, "source": {"topics": [topic]},
                       "sink": {"kind": "kafka", "topic": f"out-{unique}"}}, str(tmp_path / "p.yaml"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec_document(spec)))
    prepare_plan(spec, kafka_settings, "run-1")  # the plan task
    lease = StreamLease(spec, kafka_settings)
    lease.acquire()
    try:
        task = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=str(tmp_path / "p.yaml"),
                                           kafka_conn_id=kafka_connection)
        with pytest.raises(AirflowSkipException, match="is owned by a stream"):
            task.execute({"run_id": "run-1", "params": {}, "dag_run": None})
    finally:
        lease.release()
