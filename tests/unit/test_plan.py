"""Planner rules (docs/architecture.md, "Plans") on given offsets and checkpoints; Kafka-backed cases live in
tests/integration/test_planner.py."""

from __future__ import annotations

import time

import pytest

from kafka_eos.errors import DataLossError, PlanError, SpecError, TopicRecreated
from kafka_eos.kafka_admin import CommitTimes, PartitionOffsets, offset_metadata
from kafka_eos.plan import Plan, plan_ranges, stale_checkpoints
from kafka_eos.spec import parse_spec


def spec(**source):
    return parse_spec({"name": "p", "source": {"topics": ["t"], **source}, "transform": "identity",
                       "sink": {"kind": "kafka", "topic": "o", "dlq_topic": "d"}}, "p.yaml")


def off(start, lso, hw=None):
    return PartitionOffsets(start, lso, lso if hw is None else hw)


def test_first_run_earliest_reads_from_log_start_to_lso():
    plan = plan_ranges(spec(), "r", {("t", 0): off(5, 20, 23)}, {("t", 0): None})
    (r,) = plan.ranges
    assert (r.from_offset, r.until, r.expected) == (5, 20, None)


def test_first_run_latest_starts_at_lso_and_pins_the_checkpoint():
    plan = plan_ranges(spec(starting_offsets="latest"), "r", {("t", 0): off(0, 20)}, {("t", 0): None})
    (r,) = plan.ranges
    assert (r.from_offset, r.until) == (20, 20)
    assert plan.active == (r,)  # committing offset 20 makes the next run start there


def test_checkpoint_is_from_and_cap_is_an_offset_span():
    plan = plan_ranges(spec(max_records_per_partition=10), "r", {("t", 0): off(0, 100)}, {("t", 0): 42})
    (r,) = plan.ranges
    assert (r.from_offset, r.until, r.expected) == (42, 52, 42)


def test_partition_added_later_reads_from_its_log_start_even_with_latest():
    plan = plan_ranges(spec(starting_offsets="latest"), "r",
                       {("t", 0): off(0, 10), ("t", 1): off(3, 7)}, {("t", 0): 10, ("t", 1): None})
    new = plan.ranges[1]
    assert (new.from_offset, new.until, new.expected) == (3, 7, None)
    assert [r.tp for r in plan.active] == [("t", 1)]


def test_data_loss_fails_by_default_naming_partition_and_offsets():
    with pytest.raises(DataLossError, match=r"t-0: checkpoint 4 is below the log start 9"):
        plan_ranges(spec(), "r", {("t", 0): off(9, 30)}, {("t", 0): 4})


def test_data_loss_skip_records_the_gap_and_moves_on():
    plan = plan_ranges(spec(on_data_loss="skip"), "r", {("t", 0): off(9, 30)}, {("t", 0): 4})
    (r,) = plan.ranges
    assert (r.from_offset, r.until, r.expected) == (9, 30, 4)
    (gap,) = plan.skipped
    assert (gap.from_offset, gap.until) == (4, 9)


def test_checkpoint_beyond_high_watermark_means_recreated_topic():
    with pytest.raises(TopicRecreated, match=r"t-0: checkpoint 50 is beyond the high watermark 12"):
        plan_ranges(spec(), "r", {("t", 0): off(0, 12)}, {("t", 0): 50})


def test_nothing_new_is_an_empty_plan():
    plan = plan_ranges(spec(), "r", {("t", 0): off(0, 12, 15)}, {("t", 0): 12})
    assert plan.is_empty


def test_plan_round_trips_through_json_and_rejects_garbage():
    plan = plan_ranges(spec(on_data_loss="skip"), "r7", {("t", 0): off(9, 30)}, {("t", 0): 4})
    again = Plan.from_json(plan.to_json())
    assert again == plan
    with pytest.raises(PlanError, match=r"plan.json: not a kafka-eos plan"):
        Plan.from_json('{"pipeline": "p"}', "plan.json")


def test_idle_partitions_with_an_old_commit_are_refreshed_and_others_are_not():
    offsets = {("t", 0): off(0, 30), ("t", 1): off(0, 30), ("t", 2): off(0, 50)}
    cks = {("t", 0): 30, ("t", 1): 30, ("t", 2): 40}
    plan = plan_ranges(spec(), "r", offsets, cks, stale={("t", 0), ("t", 2)})
    by_p = {r.partition: r for r in plan.ranges}
    assert by_p[0].refresh and by_p[0].empty  # idle and old: committed again, unchanged
    assert not by_p[1].refresh  # idle, recently committed: left alone
    assert not by_p[2].refresh and (by_p[2].from_offset, by_p[2].until) == (40, 50)  # moves anyway
    assert [r.partition for r in plan.active] == [0, 2]
    assert [r.partition for r in plan.moving] == [2]
    assert Plan.from_json(plan.to_json()) == plan


#: A retention of one minute, as on the test brokers.
R = 60.0


def _last_run(planned: float, committed: float) -> CommitTimes:
    return CommitTimes(committed_at=committed, planned_at=planned)


def test_an_idle_checkpoint_is_refreshed_when_it_might_not_live_until_the_next_runs_commit():
    # Runs 42 s apart (0.7 of the retention), each committing 20 s after its plan (a Spark
    # task's start). The idle partition was last committed by the run before, 22 s ago: younger
    # than half the retention, but 22 + 42 + 20 s old at the next run's commit: refreshed now.
    now = 1000.0
    last = _last_run(planned=now - 42, committed=now - 22)
    cks = {("t", 0): 10, ("t", 1): 5}
    assert stale_checkpoints(cks, {("t", 0): last, ("t", 1): last}, R, now) == {("t", 1), ("t", 0)}
    # Runs 6 s apart, committing 1 s after their plan: a checkpoint 20 s old lives until the next commit.
    quick = _last_run(planned=now - 6, committed=now - 5)
    assert stale_checkpoints(cks, {("t", 0): quick, ("t", 1): CommitTimes(now - 20, now - 26)}, R, now) == set()
    # ... but not one 40 s old (more than half the retention), whatever the spacing.
    assert stale_checkpoints(cks, {("t", 0): quick, ("t", 1): CommitTimes(now - 40, now - 46)}, R, now) == {("t", 1)}


def test_checkpoints_without_kafka_eos_times_are_refreshed_and_missing_ones_are_not():
    now = 1000.0
    cks = {("t", 0): 10, ("t", 1): 5, ("t", 2): None}
    times = {("t", 0): CommitTimes(now - 1, now - 2), ("t", 1): CommitTimes(), ("t", 2): CommitTimes()}
    assert stale_checkpoints(cks, times, R, now) == {("t", 1)}


def test_a_caller_that_comes_back_later_refreshes_what_would_expire_before_then():
    # The watchdog runs again in at most 10 minutes; the retention is a day.
    now, day = 100_000.0, 86_400.0
    cks = {("t", 0): 1, ("t", 1): 2}
    times = {("t", 0): CommitTimes(now - 0.4 * day), ("t", 1): CommitTimes(now - 0.1 * day)}
    assert stale_checkpoints(cks, times, day, now, next_in_s=600) == set()
    # Back in 0.36 days: the first would be 0.76 of the retention old by then.
    assert stale_checkpoints(cks, times, day, now, next_in_s=0.36 * day) == {("t", 0)}


def test_the_offset_metadata_carries_commit_and_plan_times():
    assert offset_metadata(now_ms=2000, planned_ms=1500) == "kafka-eos committed_at=2000 planned_at=1500"
    assert offset_metadata(now_ms=2000) == "kafka-eos committed_at=2000"
    plan = plan_ranges(spec(), "r", {("t", 0): off(0, 1)}, {("t", 0): None})
    assert abs(plan.planned_ms / 1000 - time.time()) < 60


def test_a_lost_checkpoint_the_manifest_remembers_is_an_error_not_a_new_partition():
    from kafka_eos.errors import CheckpointLost

    offsets = {("t", 0): off(0, 30), ("t", 1): off(0, 30)}
    history = {("t", 1): {"offset": 25, "run_id": "scheduled__x", "committed_at": "2026-11-01T00:00:00+00:00"}}
    with pytest.raises(CheckpointLost) as lost:
        plan_ranges(spec(), "r", offsets, {("t", 0): 30, ("t", 1): None}, history=history)
    message = str(lost.value)
    assert message.startswith("t-1: group 'kafka-eos.p' has no committed offset, but run 'scheduled__x' committed 25")
    assert "--reset-offsets --to-offset 25" in message and "\n" not in message
    # A partition the manifest never saw is new: read from its log start.
    plan = plan_ranges(spec(), "r", offsets, {("t", 0): 30, ("t", 1): None}, history={})
    assert [(r.partition, r.from_offset, r.until) for r in plan.ranges] == [(0, 30, 30), (1, 0, 30)]


def test_a_partly_committed_first_run_keeps_its_starting_policy():
    """starting_offsets: latest, the first run committed partition 0 only: partition 1 goes on from
    where the first plan started it, not from its log start (which would read all its history)."""
    offsets = {("t", 0): off(0, 50), ("t", 1): off(0, 60)}
    plan = plan_ranges(spec(starting_offsets="latest"), "r2", offsets, {("t", 0): 40, ("t", 1): None},
                       starts={("t", 0): 40, ("t", 1): 45})
    assert [(r.partition, r.from_offset, r.until, r.expected) for r in plan.ranges] == [(0, 40, 50, 40),
                                                                                        (1, 45, 60, None)]
    # Without the first plan's starts, partition 1 would look like a partition added later.
    plan = plan_ranges(spec(starting_offsets="latest"), "r2", offsets, {("t", 0): 40, ("t", 1): None})
    assert plan.ranges[1].from_offset == 0


def test_a_run_is_capped_in_all_in_proportion_to_each_backlog():
    offsets = {("t", 0): off(0, 10), ("t", 1): off(0, 20), ("t", 2): off(0, 70), ("t", 3): off(0, 1)}
    none = dict.fromkeys(offsets)
    plan = plan_ranges(spec(max_records_per_run=50), "r", offsets, none)
    # 50 of 101: shares of 4.95, 9.9 and 34.65 round down; one of 0.495 rounds up (it moves too).
    assert [(r.from_offset, r.until) for r in plan.ranges] == [(0, 4), (0, 9), (0, 34), (0, 1)]
    # Within the cap, nothing changes; the per-partition cap applies first.
    assert [r.until for r in plan_ranges(spec(max_records_per_run=101), "r", offsets, none).ranges] == [10, 20, 70, 1]
    capped = plan_ranges(spec(max_records_per_partition=10, max_records_per_run=20), "r", offsets, none)
    assert [r.until for r in capped.ranges] == [6, 6, 6, 1]


def test_max_records_per_run_must_be_positive():
    with pytest.raises(SpecError, match=r"^p.yaml: source.max_records_per_run: "):
        spec(max_records_per_run=0)
