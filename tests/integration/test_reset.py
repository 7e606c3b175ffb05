"""Positions a person gives (timestamps, JSON offsets) checked against a real log, and checkpoint
resets on a real broker and a real SQL sink: fenced, exactly where asked, audited."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.backfill.positions import PositionError, resolve
from kafka_eos.backfill.reset import reset_checkpoint
from kafka_eos.manifest import ManifestStore
from kafka_eos.pipeline import checkpoints
from kafka_eos.readers import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.quick]

#: A recent hour, on a 5-minute boundary: older records would be deleted by the broker's
#: retention (7 days) while the test runs.
T0 = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)


def _produce_at(kafka_settings, topic: str, partition: int, minutes: list[int]) -> None:
    producer = Producer(kafka_settings.client_config())
    for m in minutes:
        producer.produce(topic, value=f"m{m}".encode(), partition=partition,
                         timestamp=int((T0 + timedelta(minutes=m)).timestamp() * 1000))
    assert producer.flush(30) == 0


def test_positions_are_checked_against_the_log(kafka_settings, make_spec):
    spec = make_spec(partitions=2)
    topic = spec.source.topics[0]
    _produce_at(kafka_settings, topic, 0, [0, 1, 2, 3])
    _produce_at(kafka_settings, topic, 1, [0, 5, 10])
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 2)])[TopicPartition(topic, 0, 2)].result(30)  # retention

    def refused(text: str) -> str:
        with pytest.raises(PositionError) as err:
            resolve(spec, kafka_settings, text, "params.reset_checkpoint_to")
        message = str(err.value)
        assert message.startswith("params.reset_checkpoint_to: ") and "\n" not in message
        return message

    assert f"unknown partition '{topic}-7' (the source partitions are {topic}-0, {topic}-1)" in refused(
        json.dumps({f"{topic}-7": 1}))
    assert f"{topic}-0: offset 1 is below the log start 2 (deleted by retention)" in refused(json.dumps({f"{topic}-0": 1}))
    assert f"{topic}-1: offset 4 is above the last stable offset 3 (not committed yet)" in refused(
        json.dumps({f"{topic}-1": 4}))
    assert f"{topic}-1: the offset must be a non-negative integer, got -1" in refused(json.dumps({f"{topic}-1": -1}))
    assert "malformed JSON (Expecting value at character" in refused('{"orders-0": ')
    assert "is in the future" in refused((datetime.now(timezone.utc) + timedelta(hours=1)).isoformat())
    assert "'yesterday' is neither an ISO-8601 timestamp nor JSON offsets" in refused("yesterday")

    at = lambda text: resolve(spec, kafka_settings, text, "f")[0]  # noqa: E731
    assert at(json.dumps({f"{topic}-1": 2})) == {(topic, 1): 2}  # only the partitions listed
    # A timestamp: the first record at or after it; none that late: the LSO; never below the log start.
    iso = lambda minutes: (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
    assert at(iso(4) + "Z") == {(topic, 0): 4, (topic, 1): 1}
    assert at(iso(0.5) + "+00:00") == {(topic, 0): 2, (topic, 1): 1}
    assert at(iso(-60)) == {(topic, 0): 2, (topic, 1): 0}  # no zone: UTC


def test_a_kafka_checkpoint_reset_fences_the_pipeline_lands_where_asked_and_is_audited(kafka_settings, make_spec):
    spec = make_spec(partitions=2)  # atomic scope
    topic = spec.source.topics[0]
    _produce_at(kafka_settings, topic, 0, [0, 1, 2])
    _produce_at(kafka_settings, topic, 1, [0, 1])
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 3, (topic, 1): 2})  # a run
    # An attempt of the pipeline still in flight: its transaction must not land after the reset.
    zombie = Producer(kafka_settings.client_config(**{"transactional.id": spec.transactional_id()}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(spec.sink.topic, value=b"zombie")
    zombie.flush(30)

    record = reset_checkpoint(spec, kafka_settings, {(topic, 0): 1}, run_id="manual-reset-1",
                              asked=json.dumps({f"{topic}-0": 1}), who="alice", via="test")
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0), (topic, 1)]) == {
        (topic, 0): 1, (topic, 1): 2}  # only the partition asked for
    with pytest.raises(KafkaException):  # fenced
        zombie.commit_transaction(30)
    assert [m.value for m in read_committed(kafka_settings, spec.sink.topic)] == []
    (audit,) = [json.loads(m.value) for m in read_committed(kafka_settings, AUDIT_TOPIC)
                if m.key == f"reset:{spec.name}:{record['at']}".encode()]
    assert (audit["action"], audit["pipeline"], audit["who"], audit["status"], audit["before"], audit["after"]) == (
        "reset_checkpoint", spec.name, "alice", "reset", {f"{topic}-0": 3}, {f"{topic}-0": 1})
    # The manifest remembers the reset checkpoint, not the higher one before it.
    assert ManifestStore.of(spec, kafka_settings).state().checkpoints[(topic, 0)]["offset"] == 1

    again = reset_checkpoint(spec, kafka_settings, {(topic, 0): 1}, run_id="manual-reset-2", asked="1",
                             who="alice", via="test")
    assert again["status"] == "noop"


def test_a_sql_checkpoint_reset_moves_the_sink_and_its_mirror(kafka_settings, make_spec):
    from kafka_eos.plan import PartitionRange, Plan
    from kafka_eos.sinks.sql_store import SqlStore, database_url

    spec = make_spec(kind="sql", partitions=2, key_columns=["k"])
    topic = spec.source.topics[0]
    _produce_at(kafka_settings, topic, 0, [0, 1, 2, 3])
    sink = SqlStore(spec, database_url(spec))
    sink.create_tables()
    sink.commit(Plan(spec.name, "run-1", (PartitionRange(topic, 0, 0, 4, None),)), None, None, iter(()))
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 4})  # its mirror

    for target in (1, 3):  # back, then forward
        reset_checkpoint(spec, kafka_settings, {(topic, 0): target}, run_id=f"reset-{target}", asked=str(target),
                         who="bob", via="test")
        assert sink.checkpoints([(topic, 0)]) == {(topic, 0): target}
        assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0)]) == {(topic, 0): target}
        assert checkpoints(spec, kafka_settings, [(topic, 0), (topic, 1)]) == ({(topic, 0): target, (topic, 1): None}, [])


def test_a_reset_steps_aside_while_a_stream_owns_the_pipeline(kafka_settings, make_spec):
    """A streaming pipeline's offsets are the stream's: a reset's transaction would fence its
    producer. Refused, naming the stream; nothing moves."""
    from kafka_eos.errors import PipelineBusy
    from kafka_eos.lease import StreamLease

    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    _produce_at(kafka_settings, topic, 0, [0, 1, 2])
    lease = StreamLease(spec, kafka_settings)
    lease.acquire(wait_s=0)
    try:
        with pytest.raises(PipelineBusy, match=rf"^pipeline {spec.name} is owned by a stream, kafka-eos-stream:.*: a "
                                               r"checkpoint reset waits until it stops"):
            reset_checkpoint(spec, kafka_settings, {(topic, 0): 2}, run_id="reset-1", asked="2", who="bob", via="test")
    finally:
        lease.release()
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0)]) == {(topic, 0): None}
