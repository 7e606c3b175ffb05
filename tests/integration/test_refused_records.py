"""A record the sink refuses for its own sake does not stop a pipeline for good: too large for
the producer's message.max.bytes, or for the sink topic's max.message.bytes (which the broker
would have refused, failing the whole transaction), it becomes a dead letter that refers to its
source record, in the same transaction; with ``sink.on_refused_record: fail`` the run fails
naming topic, partition, offset and size, and commits nothing."""

from __future__ import annotations

import json
import os

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import RecordRefused
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.readers import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.waits]

SMALL = 10  # small records per source partition


def _source_with_large_records(settings, topic: str, size: int, compressible_too: bool = False) -> list[bytes]:
    """``SMALL`` records on each of 2 partitions, and one of ``size`` random bytes among partition
    0's (at offset 5); ``compressible_too``: one of ``size`` bytes that lz4 compresses well among
    partition 1's too. Returns the values that fit the sink."""
    kafka_admin.set_topic_config(settings, topic, {"max.message.bytes": str(size + 10_000)})
    producer = Producer(settings.client_config(**{"enable.idempotence": True, "message.max.bytes": size + 10_000}))
    fits = []
    for i in range(SMALL):
        if i == 5:
            producer.produce(topic, key=b"large", value=os.urandom(size), partition=0)
            if compressible_too:
                fits.append(b"x" * size)
                producer.produce(topic, key=b"k", value=fits[-1], partition=1)
        for p in (0, 1):
            fits.append(f"r{p}-{i}".encode())
            producer.produce(topic, key=b"k", value=fits[-1], partition=p)
    assert producer.flush(30) == 0
    return fits


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
@pytest.mark.parametrize("limit", ["producer", "topic"])
def test_a_record_too_large_for_the_sink_becomes_a_reference_dead_letter(spark, kafka_settings, make_spec,
                                                                         commit, limit):
    spec = make_spec("identity", "kafka", commit, partitions=2)
    topic = spec.source.topics[0]
    if limit == "producer":  # 1.5 MB: more than librdkafka's message.max.bytes (1,000,000)
        size, why = 1_500_000, "more than the producer's message.max.bytes 1,000,000"
    else:  # 400 KB: the producer takes it; the broker would refuse it for the topic, failing the transaction.
        # A record as large that compresses well fits the topic: written.
        size, why = 400_000, "compressed, more than the topic's max.message.bytes 300,000"
        kafka_admin.set_topic_config(kafka_settings, spec.sink.topic, {"max.message.bytes": "300000"})
    fits = _source_with_large_records(kafka_settings, topic, size, compressible_too=limit == "topic")
    plan = prepare_plan(spec, kafka_settings, "r1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", len(fits), 1)
    verify(spec, kafka_settings, plan)  # the checkpoint is past the large record: the pipeline goes on
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == sorted(fits)
    (dead,) = read_committed(kafka_settings, spec.sink.dlq_topic)
    reason = dead.headers["kafka-eos.reason"].decode()
    assert reason.startswith(f"refused by the sink: {topic}-0 offset 5: its record for topic {spec.sink.topic} is "
                             f"{size + 36 + 5:,} bytes, "), reason
    assert why in reason
    assert (dead.headers["kafka-eos.source.partition"], dead.headers["kafka-eos.source.offset"]) == (b"0", b"5")
    assert dead.key == b"large"
    reference = json.loads(dead.value)
    assert reference["source"] == {"topic": topic, "partition": 0, "offset": 5} and reference["size"] == size + 41
    # The same bytes from either writer (per_partition's JVM one, atomic's Python one): json.dumps' own.
    assert dead.value == json.dumps(reference).encode() and list(reference) == ["refused", "source", "size"]


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_with_on_refused_record_fail_the_run_names_the_record_and_commits_nothing_of_its_transaction(
        spark, kafka_settings, make_spec, commit):
    """atomic: nothing of the run. per_partition: nothing of the record's partition, the others
    committed by their own transactions, and the message says so (before: "... (nothing of the run
    is committed); committed by their own transactions: <the other partition>")."""
    spec = make_spec("identity", "kafka", commit, partitions=2, on_refused_record="fail")
    topic = spec.source.topics[0]
    _source_with_large_records(kafka_settings, topic, 1_500_000)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(RecordRefused) as refused:
        run_batch(spark, spec, plan, kafka_settings)
    message = str(refused.value)
    assert "\n" not in message and "nothing of the run" not in message
    assert message.startswith(f"{topic}-0 offset 5: its record for topic {spec.sink.topic} is 1,500,041 bytes, "
                              "more than the producer's message.max.bytes 1,000,000; sink.on_refused_record: "
                              "fail (its transaction was aborted)"), message
    checkpoints = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.ranges])
    if commit == "atomic":
        assert read_committed(kafka_settings, spec.sink.topic) == []
        assert set(checkpoints.values()) == {None}
    else:
        assert message.endswith(f"; committed by their own transactions: {topic}-1"), message
        assert checkpoints == {(topic, 0): None, (topic, 1): SMALL}


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_a_sink_topic_with_a_small_max_message_bytes_takes_every_record_that_fits(spark, kafka_settings, make_spec,
                                                                                 commit):
    """Sink and dead-letter topics at max.message.bytes 300,000, 2,000 random records of 2 KB: each
    fits 150 times over, but librdkafka batched them up to its batch.size (1,000,000 bytes) and the
    broker refused whole batches (MSG_SIZE_TOO_LARGE): every run failed, the pipeline stopped for
    good. The producer's batches now stay under the topics' limit."""
    spec = make_spec("identity", "kafka", commit, partitions=2)
    for topic in (spec.sink.topic, spec.sink.dlq_topic):
        kafka_admin.set_topic_config(kafka_settings, topic, {"max.message.bytes": "300000"})
    producer = Producer(kafka_settings.client_config(**{"linger.ms": 20}))
    values = [os.urandom(2000) for _ in range(2000)]
    for i, value in enumerate(values):
        producer.produce(spec.source.topics[0], key=f"k{i}".encode(), value=value, partition=i % 2)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "r1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 2000, 0)
    verify(spec, kafka_settings, plan)
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == sorted(values)
