"""Planner rules against a real broker: LSO ends, commit markers, data loss, recreated topics,
new partitions, missing topics."""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import DataLossError, TopicMissing, TopicRecreated
from kafka_eos.pipeline import compute_plan, prepare_plan, verify
from kafka_eos.readers import read_committed, settle

pytestmark = pytest.mark.integration


def produce(settings, topic, partition, n, *, commit=True, txn_id="planner-test"):
    p = Producer(settings.client_config(**{"transactional.id": f"{txn_id}-{topic}"}))
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
    p.flush(30)
    p.commit_transaction(30) if commit else p.abort_transaction(30)
    settle(settings, topic)  # the marker on the partition: the next plan sees it


def run(spark, spec, settings, run_id):
    plan = prepare_plan(spec, settings, run_id)
    summary = run_batch(spark, spec, plan, settings)
    verify(spec, settings, plan)
    return plan, summary


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_range_of_only_markers_and_aborted_records_moves_the_checkpoint(spark, kafka_settings, admin,
                                                                         make_spec, commit):
    spec = make_spec("identity", "kafka", commit, partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 5)
    run(spark, spec, kafka_settings, "r1")
    produce(kafka_settings, topic, 0, 4, commit=False)  # 4 aborted records + an abort marker

    plan, summary = run(spark, spec, kafka_settings, "r2")
    (r,) = plan.ranges
    assert (r.from_offset, r.until) == (6, 11)  # 5 records + commit marker, then 4 + abort marker
    assert summary.records_out == 0
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp])[r.tp] == 11
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 5


def test_plan_ends_at_the_lso_not_the_high_watermark(kafka_settings, admin, make_spec):
    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 3)
    open_txn = Producer(kafka_settings.client_config(**{"transactional.id": f"open-{topic}"}))
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    open_txn.produce(topic, value=b"pending", partition=0)
    open_txn.flush(30)
    try:
        plan, _ = compute_plan(spec, kafka_settings, "r")
        (r,) = plan.ranges
        offsets = kafka_admin.partition_offsets(kafka_settings, [r.tp])[r.tp]
        assert offsets.high_watermark == 5 and offsets.lso == 4
        assert r.until == 4
    finally:
        open_txn.abort_transaction(30)


def test_data_loss_fails_or_skips_and_records_the_gap(spark, kafka_settings, admin, make_spec):
    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 5)
    run(spark, spec, kafka_settings, "r1")  # checkpoint 6
    produce(kafka_settings, topic, 0, 5)  # offsets 6..10, marker 11
    fut = admin.delete_records([TopicPartition(topic, 0, 9)])
    list(fut.values())[0].result(30)  # log start -> 9: offsets 6..8 deleted unread

    with pytest.raises(DataLossError, match=rf"{topic}-0: checkpoint 6 is below the log start 9"):
        prepare_plan(spec, kafka_settings, "r2")

    skipping = dataclasses.replace(spec, source=dataclasses.replace(spec.source, on_data_loss="skip"))
    plan, summary = run(spark, skipping, kafka_settings, "r2")
    (gap,) = plan.skipped
    assert (gap.from_offset, gap.until) == (6, 9)
    assert summary.records_out == 2  # offsets 9 and 10
    from kafka_eos.manifest import ManifestStore

    record, _parts = ManifestStore.of(spec, kafka_settings).run_records("r2")
    assert record["skipped"] == [{"topic": topic, "partition": 0, "from_offset": 6, "until": 9}]


def test_checkpoint_beyond_high_watermark_fails_naming_partition(kafka_settings, admin, make_spec):
    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 2)
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {(topic, 0): 500})
    with pytest.raises(TopicRecreated, match=rf"{topic}-0: checkpoint 500 is beyond the high watermark 3"):
        compute_plan(spec, kafka_settings, "r")


def test_partitions_added_between_runs_are_read_from_the_start(spark, kafka_settings, admin, make_spec):
    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 3)
    run(spark, spec, kafka_settings, "r1")
    list(admin.create_partitions([NewPartitions(topic, 2)]).values())[0].result(30)
    produce(kafka_settings, topic, 1, 4, txn_id="p1")

    plan, summary = run(spark, spec, kafka_settings, "r2")
    new = next(r for r in plan.ranges if r.partition == 1)
    assert (new.from_offset, new.until, new.expected) == (0, 5, None)
    assert summary.records_out == 4
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 7


def test_missing_topics_are_named_before_anything_runs(kafka_settings, make_spec):
    spec = make_spec()
    for field, role in (("source", "source"), ("topic", "sink"), ("dlq_topic", "dead-letter")):
        if field == "source":
            broken = dataclasses.replace(spec, source=dataclasses.replace(spec.source, topics=("no-such-topic-x",)))
        else:
            broken = dataclasses.replace(spec, sink=dataclasses.replace(spec.sink, **{field: "no-such-topic-y"}))
        with pytest.raises(TopicMissing, match=rf"{role} topic 'no-such-topic-[xy]' does not exist"):
            prepare_plan(broken, kafka_settings, "r")


def test_a_retry_replans_when_retention_deleted_part_of_its_stored_range(kafka_settings, admin, make_spec):
    spec = make_spec(partitions=1)
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 5)
    stored = prepare_plan(spec, kafka_settings, "r1")
    assert prepare_plan(spec, kafka_settings, "r1") == stored  # a retry reuses the stored plan
    list(admin.delete_records([TopicPartition(topic, 0, 3)]).values())[0].result(30)
    # The first run has no checkpoint: the new plan starts at the new log start.
    replanned = prepare_plan(spec, kafka_settings, "r1")
    (r,) = replanned.ranges
    assert (r.from_offset, r.until) == (3, 6)


def test_starting_latest_survives_a_partly_committed_first_run(spark, kafka_settings, make_spec):
    """Before: the first run committed partition 0 only; the next plan took partition 1 for a
    partition added later and read it from its log start: the history `latest` was to skip."""
    from kafka_eos.sinks.per_partition import commit_partition

    spec = make_spec("identity", "kafka", "per_partition", partitions=2, source={"starting_offsets": "latest"})
    topic = spec.source.topics[0]
    produce(kafka_settings, topic, 0, 5, txn_id="history")
    produce(kafka_settings, topic, 1, 7, txn_id="history")  # history `latest` skips
    first = prepare_plan(spec, kafka_settings, "first")
    r0, r1 = first.ranges
    assert (r0.from_offset, r1.from_offset) == (r0.until, r1.until)  # both start at the LSO
    # The first run commits partition 0, then dies before partition 1.
    assert commit_partition(spec, first, kafka_settings, r0, ()).status == "committed"

    produce(kafka_settings, topic, 1, 3, txn_id="new")
    plan, _ = run(spark, spec, kafka_settings, "second")
    assert plan.ranges[1].from_offset == r1.from_offset
    out = sorted(m.value.decode() for m in read_committed(kafka_settings, spec.sink.topic))
    assert out == ["v0", "v1", "v2"]  # only what came after the first plan


def test_a_backlog_drains_in_runs_of_at_most_max_records_per_run(spark, kafka_settings, make_spec):
    """A lagging atomic pipeline takes its backlog in bounded bites (one transaction each) and
    catches up: nothing lost, nothing twice."""
    spec = make_spec(partitions=3, source={"max_records_per_run": 12})
    topic = spec.source.topics[0]
    for partition, n in enumerate((5, 10, 25)):
        produce(kafka_settings, topic, partition, n)
    runs = []
    for i in range(10):
        plan, summary = run(spark, spec, kafka_settings, f"r{i}")
        if plan.is_empty:
            break
        runs.append((sum(r.until - r.from_offset for r in plan.active), summary.records_out))
    assert len(runs) >= 4 and all(span <= 12 for span, _out in runs), runs
    values = sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic))
    assert values == sorted(f"v{i}".encode() for n in (5, 10, 25) for i in range(n))
    assert sum(out for _span, out in runs) == 40
