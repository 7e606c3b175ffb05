"""The run manifest scales and isolates: a lookup costs the same after 100,000 runs as after 10,
and an open transaction hides no pipeline's plan.

Before: every pipeline shared one single-partition manifest topic, written inside the pipelines'
transactions and read read_committed from offset 0. Each lookup read the whole history, and one
pipeline's open transaction (a killed Spark job's, until its timeout) pinned the LSO that every
pipeline's plan lookup stopped at: the plan a plan task had just stored was not found.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.manifest import (COMMITTED, TAIL_STEP, ManifestStore, checkpoint_key, checkpoint_record, now_iso,
                                plan_record, run_key)
from kafka_eos.pipeline import prepare_plan
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.spec import parse_spec

pytestmark = pytest.mark.integration


def _spec(name: str, source: str, tmp_path):
    return parse_spec({"name": name, "source": {"topics": [source]}, "transform": "identity",
                       "sink": {"kind": "kafka", "topic": f"{source}.out"}}, str(tmp_path / f"{name}.yaml"))


def test_an_open_transaction_hides_no_plan(kafka_settings, unique, tmp_path):
    source = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {source: 1, f"{source}.out": 1})
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(5):
        producer.produce(source, value=f"r{i}".encode(), partition=0)
    producer.flush(30)
    a, b = _spec(f"{unique}-a", source, tmp_path), _spec(f"{unique}-b", source, tmp_path)
    prepare_plan(a, kafka_settings, "a-1")

    # A killed attempt of pipeline a: its commit transaction, under a's own transactional.id,
    # stays open on a's manifest (its summary record) until the coordinator times it out.
    zombie = Producer(kafka_settings.client_config(**{"transactional.id": a.transactional_id(),
                                                      "transaction.timeout.ms": 600_000}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(a.manifest_topic, key=run_key(a.name, "a-1").encode(),
                   value=json.dumps({"status": COMMITTED, "plan": {}}).encode())
    zombie.flush(30)
    try:
        # Another pipeline's plan task stores a plan; its Spark task finds it.
        planned_b = prepare_plan(b, kafka_settings, "b-1")
        assert ManifestStore.of(b, kafka_settings).stored_plan("b-1") == planned_b
        # The pipeline's own next run plans while its zombie is still open, and finds its plan.
        planned_a = prepare_plan(a, kafka_settings, "a-2")
        assert ManifestStore.of(a, kafka_settings).stored_plan("a-2") == planned_a
        assert [r.until for r in planned_a.active] == [5]
    finally:
        zombie.abort_transaction(30)


def _history(store: ManifestStore, runs: int, every: int = 1000) -> Plan:
    """``runs`` runs' records as a Kafka-sink pipeline with one source partition writes them: the
    plan, then the summary and the checkpoint's memory (written here without a transaction),
    and the plan task's snapshot maintenance (here every ``every`` runs, not every plan: a worse
    case). Returns the last plan."""
    producer = Producer(store.settings.client_config(**{"enable.idempotence": True, "linger.ms": 50}))
    plan = None
    for i in range(runs):
        plan = Plan(store.pipeline, f"run-{i}", (PartitionRange("in", 0, 10 * i, 10 * (i + 1), 10 * i),))
        summary = {**plan_record(plan), "pipeline": store.pipeline, "run_id": plan.run_id, "status": COMMITTED,
                   "records_in": 10, "records_out": 10, "dead_letters": 0, "committed_at": now_iso()}
        for key, record in ((run_key(store.pipeline, plan.run_id), plan_record(plan)),
                            (run_key(store.pipeline, plan.run_id), summary),
                            (checkpoint_key(store.pipeline, "in", 0),
                             checkpoint_record(plan.run_id, "g", "in", 0, 10 * (i + 1)))):
            while True:
                try:
                    producer.produce(store.topic, key=key.encode(), value=json.dumps(record).encode())
                    break
                except BufferError:
                    producer.poll(0.1)
        if (i + 1) % every == 0:
            assert producer.flush(60) == 0
            store.refresh_state()
    assert producer.flush(60) == 0
    return plan


def test_a_lookup_costs_the_same_after_100000_runs_as_after_10(kafka_settings, unique, tmp_path, capsys):
    costs = {}
    for runs in (10, 100_000):
        store = ManifestStore(kafka_settings, f"kafka-eos.manifest.{unique}-{runs}", f"{unique}-{runs}")
        store.ensure_topic()
        started = time.monotonic()
        last = _history(store, runs)
        written_s = time.monotonic() - started
        store.refresh_state()  # what the next plan task does first
        lookups = {
            "stored plan of the last run": lambda: store.stored_plan(last.run_id) == last,
            "stored plan of the first run (none)": lambda: store.stored_plan("run-0") is None,
            "last run": lambda: store.last_run()["plan"]["run_id"] == last.run_id,
            "run records of the last run": lambda: store.run_records(last.run_id)[0]["status"] == COMMITTED,
            "checkpoint memory": lambda: store.state().checkpoints[("in", 0)]["offset"] == 10 * runs,
        }
        for what, lookup in lookups.items():
            before, started = store.records_read, time.monotonic()
            assert lookup(), what
            costs[(what, runs)] = (store.records_read - before, 1000 * (time.monotonic() - started))
        end = kafka_admin.partition_offsets(kafka_settings, [(store.topic, 0)])[(store.topic, 0)].high_watermark
        costs[("manifest records", runs)] = (end, written_s)

    with capsys.disabled():
        print("\nlookup                               records read (ms) after 10 runs | after 100,000 runs")
        for what in (w for w, r in costs if r == 10):
            (n10, ms10), (nbig, msbig) = costs[(what, 10)], costs[(what, 100_000)]
            print(f"  {what:36} {n10:>8} ({ms10:6.0f}) | {nbig:>8} ({msbig:6.0f})")
    for what in (w for w, r in costs if r == 10 and w != "manifest records"):
        assert costs[(what, 100_000)][0] == costs[(what, 10)][0], what
    assert costs[("manifest records", 100_000)][0] >= 300_000


def test_a_reset_forgets_the_memory(kafka_settings, unique):
    store = ManifestStore(kafka_settings, f"kafka-eos.manifest.{unique}", unique)
    store.ensure_topic()
    _history(store, 300, every=100)
    assert store.state().checkpoints[("in", 0)]["offset"] == 3000
    store.forget_checkpoints()
    state = store.state()
    assert (state.checkpoints, state.starts) == ({}, None)
    assert state.records_read == TAIL_STEP  # one step: the walk stops at the reset snapshot


def test_a_memory_that_retention_deleted_is_not_taken_for_a_new_pipeline(kafka_settings, unique, tmp_path):
    """A pipeline paused longer than the manifest's retention, whose group offsets the broker
    expired too: its next plan fails naming the group, it does not re-read from the log start."""
    from confluent_kafka import OFFSET_END, TopicPartition

    from kafka_eos.errors import CheckpointLost

    source = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {source: 1, f"{source}.out": 1})
    producer = Producer(kafka_settings.client_config())
    for i in range(5):
        producer.produce(source, value=f"r{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    spec = _spec(unique, source, tmp_path)
    store = ManifestStore.of(spec, kafka_settings)
    store.ensure_topic()
    _history(store, 3, every=10**9)  # runs, then nothing for longer than the retention:
    admin = kafka_admin.admin_client(kafka_settings)
    for fut in admin.delete_records([TopicPartition(store.topic, 0, OFFSET_END)]).values():
        fut.result(30)
    with pytest.raises(CheckpointLost, match=rf"^group 'kafka-eos.{unique}' has no committed offsets, and the "
                                             rf"manifest 'kafka-eos.manifest.{unique}' holds records of earlier runs"):
        prepare_plan(spec, kafka_settings, "after-the-pause")
    # A new pipeline (an empty manifest) plans from the log start as ever.
    fresh = _spec(f"{unique}-new", source, tmp_path)
    assert [(r.from_offset, r.until) for r in prepare_plan(fresh, kafka_settings, "first").active] == [(0, 5)]


def test_a_memory_that_retention_cut_stays_cut_until_every_partition_has_a_checkpoint(kafka_settings, unique,
                                                                                       tmp_path):
    """The refusal above held for one plan only: that plan wrote a snapshot of the cut memory,
    the next lookup found the snapshot and took the memory for whole, and the next plan (a retried
    plan task, the next schedule) read every partition again from its log start: each record
    still there written twice. Now the cut is remembered, and a partition without a checkpoint is
    refused (a lost checkpoint cannot be told from a new partition) until every partition has one;
    a refusal names the partitions the manifest still knows too."""
    from confluent_kafka import OFFSET_END, TopicPartition

    from kafka_eos.errors import CheckpointLost

    source = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {source: 2, f"{source}.out": 1})
    producer = Producer(kafka_settings.client_config())
    for i in range(10):
        producer.produce(source, value=f"r{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    spec = _spec(unique, source, tmp_path)
    group = spec.source.group_id
    store = ManifestStore.of(spec, kafka_settings)
    store.ensure_topic()
    _history(store, 3, every=10**9)
    admin = kafka_admin.admin_client(kafka_settings)
    for fut in admin.delete_records([TopicPartition(store.topic, 0, OFFSET_END)]).values():
        fut.result(30)
    for attempt in ("after-the-pause", "after-the-pause", "the-next"):  # each plan refuses, not only the first
        with pytest.raises(CheckpointLost, match=r"its memory of their checkpoints is gone \(retention\)"):
            prepare_plan(spec, kafka_settings, attempt)
    # The memory keeps partition 0's last checkpoint (a commit after the cut); the group has none.
    store.put(checkpoint_key(spec.name, source, 0), checkpoint_record("later", group, source, 0, 3))
    with pytest.raises(CheckpointLost, match=rf"^{source}-1: group '{group}' has no committed offset, and the "
                                             rf"manifest .* lost part of its memory.*; {source}-0 lost checkpoints "
                                             "the manifest still knows: restore them"):
        prepare_plan(spec, kafka_settings, "one-known")
    # Partition 1 set by the operator: partition 0's refusal gives its offset.
    kafka_admin.alter_group_offsets(kafka_settings, group, {(source, 1): 2})
    with pytest.raises(CheckpointLost, match=rf"^{source}-0: group '{group}' has no committed offset, but run 'later' "
                                             "committed 3 at .*--to-offset 3 --execute\)$"):
        prepare_plan(spec, kafka_settings, "one-set")
    assert store.state().complete is False
    # Both set: the plan goes on from them, and the memory is whole again (it remembers both).
    kafka_admin.alter_group_offsets(kafka_settings, group, {(source, 0): 3})
    plan = prepare_plan(spec, kafka_settings, "both-set")
    assert sorted((r.partition, r.from_offset, r.until) for r in plan.active) == [(0, 3, 5), (1, 2, 5)]
    state = store.state()
    assert state.complete and {tp: c["offset"] for tp, c in state.checkpoints.items()} == {(source, 0): 3,
                                                                                         (source, 1): 2}
    assert state.checkpoints[(source, 1)]["restored"] is True  # taken from the group, not a run's commit
