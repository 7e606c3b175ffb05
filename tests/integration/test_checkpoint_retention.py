"""Checkpoints outlive the broker's offsets retention: idle partitions are committed again in
time, and a checkpoint that expired anyway is an error that names it, never a fresh start.

Before: an idle partition took no part in a plan, so its group offset was never committed again;
with no members in the group, Kafka deleted it `offsets.retention.minutes` after the last commit,
and the next run read the partition from its log start: every retained record twice.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import CheckpointLost
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.readers import read_committed
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec

pytestmark = pytest.mark.integration

#: The smallest retention Kafka takes (1 minute), checked every second.
RETENTION_S = 60


def test_idle_checkpoints_are_kept_alive_and_an_expired_one_is_named(spark, private_broker, tmp_path):
    broker = private_broker(offsets_retention_minutes=RETENTION_S // 60, offsets_retention_check_interval_ms=1000)
    settings = KafkaSettings(broker.bootstrap)
    kafka_admin.create_topics(settings, {"in": 2, "out-kept": 2, "out-idle": 2})
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    for i in range(20):
        producer.produce("in", value=f"r{i}".encode(), partition=i % 2)
    producer.flush(30)

    def spec(name: str):
        return parse_spec({"name": name, "source": {"topics": ["in"]}, "transform": "identity",
                           "sink": {"kind": "kafka", "topic": f"out-{name}"}}, str(tmp_path / f"{name}.yaml"))

    kept, idle = spec("kept"), spec("idle")

    def run(s, run_id):
        plan = prepare_plan(s, settings, run_id)
        run_batch(spark, s, plan, settings)
        verify(s, settings, plan)
        return plan

    run(kept, "first")
    run(idle, "first")
    tps = [("in", 0), ("in", 1)]
    assert kafka_admin.committed_offsets(settings, idle.source.group_id, tps) == {("in", 0): 10, ("in", 1): 10}

    # Nothing new arrives. `kept` runs every 10 s; `idle` does not run at all.
    refreshed, started = 0, time.monotonic()
    while time.monotonic() - started < RETENTION_S + 30:
        time.sleep(10)
        plan = run(kept, f"tick-{int(time.monotonic() - started)}")
        assert not plan.moving  # nothing new to read ...
        refreshed += sum(r.refresh for r in plan.active)  # ... but old checkpoints are committed again

    assert refreshed >= 2
    assert kafka_admin.committed_offsets(settings, kept.source.group_id, tps) == {("in", 0): 10, ("in", 1): 10}
    assert len(read_committed(settings, "out-kept")) == 20  # nothing read twice

    # The broker expired the idle pipeline's checkpoints; its next run says so and reads nothing.
    assert kafka_admin.committed_offsets(settings, idle.source.group_id, tps) == {("in", 0): None, ("in", 1): None}
    with pytest.raises(CheckpointLost, match=r"^in-0: group 'kafka-eos.idle' has no committed offset, but run "
                                             r"'first' committed 10 .*--to-offset 10 --execute\)$"):
        prepare_plan(idle, settings, "after-expiry")
    assert len(read_committed(settings, "out-idle")) == 20
