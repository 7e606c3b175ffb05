"""Checkpoints outlive the broker's offsets retention: while runs come less than the retention
apart, no checkpoint of any partition expires; a pipeline that does not run at all keeps its
checkpoints through the watchdog's refresh or `kafka-eos checkpoint --refresh`; and a checkpoint
that expired anyway is an error that names it, never a fresh start.

Before: an idle partition was committed again only once its checkpoint was half the retention
old at a plan. Runs 0.7 of the retention apart, each committing 20 s after its plan (a DAG's Spark
task starting), found the idle partition's checkpoint younger than that at one plan and expired
(`-1001`) at the next: every run after it stopped with CheckpointLost.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import CheckpointLost
from kafka_eos.pipeline import prepare_plan, refresh_checkpoints, verify
from kafka_eos.readers import read_committed
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.waits]

#: The smallest retention Kafka takes (1 minute), checked every second.
RETENTION_S = 60
#: How long the runs go on: past twice the retention after the idle partitions' first commit.
SOAK_S = 2 * RETENTION_S
#: Records on the idle partition, written before the first runs only.
IDLE_RECORDS = 10


def test_no_checkpoint_expires_while_runs_come_within_the_retention_and_an_expired_one_is_named(
        spark, private_broker, tmp_path):
    broker = private_broker(offsets_retention_minutes=RETENTION_S // 60, offsets_retention_check_interval_ms=1000)
    settings = KafkaSettings(broker.bootstrap)
    names = ("quick", "slow", "watched", "forgotten")
    kafka_admin.create_topics(settings, {"in": 2, **{f"out-{n}": 2 for n in names}})
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    written = 0

    def produce(n: int, partition: int) -> None:
        nonlocal written
        for _ in range(n):
            producer.produce("in", value=f"r{written}".encode(), partition=partition)
            written += 1
        producer.flush(30)

    specs = {}
    for name in names:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nsource: {{topics: [in]}}\ntransform: identity\n"
                        f"sink: {{kind: kafka, topic: out-{name}, commit: per_partition}}\n")
        specs[name] = load_spec(str(path))
    produce(IDLE_RECORDS, 1)  # partition 1 is idle from now on
    produce(5, 0)
    for name in ("watched", "forgotten"):  # they run once, now
        plan = prepare_plan(specs[name], settings, "first")
        run_batch(spark, specs[name], plan, settings)
        verify(specs[name], settings, plan)
    tps = [("in", 0), ("in", 1)]

    # Partition 0 gets records before every plan. `quick` runs every 0.3 of the retention and
    # commits 8 s after its plan; `slow` every 0.7, committing 20 s after its plan (its commits
    # come 0.7 of the retention apart too). `watched`
    # never runs: the watchdog's refresh looks at it every 20 s (its next look within 25 s).
    # `forgotten` neither runs nor is refreshed.
    planned: dict[str, object] = {}
    refreshed: dict[str, int] = {"quick": 0, "slow": 0, "watched": 0}

    def plan_run(name: str, k: int):
        def step():
            produce(3, 0)
            planned[name] = plan = prepare_plan(specs[name], settings, f"run-{k}")
            refreshed[name] += sum(r.refresh and r.partition == 1 for r in plan.active)
        return step

    def commit(name: str):
        def step():
            plan = planned.pop(name)
            run_batch(spark, specs[name], plan, settings)
            verify(specs[name], settings, plan)
        return step

    def watchdog():
        refreshed["watched"] += ("in", 1) in refresh_checkpoints(specs["watched"], settings, next_in_s=25).partitions

    events = []
    for name, every, lag in (("quick", 0.3 * RETENTION_S, 8), ("slow", 0.7 * RETENTION_S, 20)):
        k = 0
        while k * every + lag <= SOAK_S:
            events += [(k * every, plan_run(name, k)), (k * every + lag, commit(name))]
            k += 1
    events += [(t, watchdog) for t in range(20, int(SOAK_S), 20)]
    started = time.monotonic()
    for at, step in sorted(events, key=lambda e: e[0]):
        time.sleep(max(0.0, at - (time.monotonic() - started)))
        step()

    assert refreshed["quick"] >= 2 and refreshed["slow"] >= 2 and refreshed["watched"] >= 2, refreshed
    for name in ("quick", "slow", "watched"):  # every checkpoint of every partition lives
        offsets = kafka_admin.committed_offsets(settings, specs[name].source.group_id, tps)
        assert offsets[("in", 1)] == IDLE_RECORDS and offsets[("in", 0)] is not None, (name, offsets)
    # A refresh by hand: the command commits every checkpoint again, unchanged.
    before = kafka_admin.committed_offsets_and_times(settings, specs["watched"].source.group_id, tps)
    cli = subprocess.run([str(Path(sys.executable).parent / "kafka-eos"), "checkpoint", str(specs["watched"].path),
                          "--refresh", "--bootstrap", broker.bootstrap], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "refreshed 2 checkpoint(s) of watched" in cli.stderr, cli.stderr
    after = kafka_admin.committed_offsets_and_times(settings, specs["watched"].source.group_id, tps)
    for tp in tps:
        assert after[tp][0] == before[tp][0] and after[tp][1].committed_at > before[tp][1].committed_at

    # The runs read every record once: a last run catches up, and nothing was read twice.
    for name in ("quick", "slow", "watched"):
        plan = prepare_plan(specs[name], settings, "catch-up")
        run_batch(spark, specs[name], plan, settings)
        verify(specs[name], settings, plan)
        assert len(read_committed(settings, f"out-{name}")) == written, name

    # The broker expired the forgotten pipeline's checkpoints; its next run says so and reads nothing.
    forgotten = specs["forgotten"]
    assert kafka_admin.committed_offsets(settings, forgotten.source.group_id, tps) == {("in", 0): None, ("in", 1): None}
    with pytest.raises(CheckpointLost, match=r"^in-0: group 'kafka-eos.forgotten' has no committed offset, but run "
                                             r"'first' committed 5 .*--to-offset 5 --execute\); likewise in-1 "
                                             r"\(kafka-eos checkpoint forgotten gives each one's offset\)$"):
        prepare_plan(forgotten, settings, "after-expiry")
    assert len(read_committed(settings, "out-forgotten")) == IDLE_RECORDS + 5
