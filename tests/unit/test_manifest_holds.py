"""Which hold a walk of the run manifest takes (newest first): the first hold record, unless the
newest snapshot's read already covered it; a snapshot is read at one offset and written at a later
one, so a hold record between the two is newer than the snapshot's. The walks themselves, on a
real broker: tests/integration/test_read_faults.py and tests/dags/test_factory_options.py."""

from __future__ import annotations

from kafka_eos.manifest import _Holds, hold_key, hold_record, reserved_run_id, state_key

HELD = hold_record("run-2", "in-0 [0, 10) of run 'run-2': short")
ACKNOWLEDGED = {**hold_record("run-1", "in-0 [0, 5) of run 'run-1': short"), "held": False}


def newest(*records: tuple[int, str, dict | None]) -> dict | None:
    """The hold a walk over ``(offset, key, record)``, newest first, takes."""
    holds = _Holds("p")
    for offset, key, rec in records:
        holds.see(offset, key, rec)
    return holds.newest()


def snapshot(read_upto: int, **hold) -> dict:
    return {"snapshot": True, "reset": False, "read_upto": read_upto, "checkpoints": [], "starts": None, **hold}


def test_a_hold_record_newer_than_the_snapshots_read_is_taken_over_the_snapshots_hold():
    # The snapshot was read at 10 (no hold then) and written at 20; the hold came at 15.
    assert newest((20, state_key("p"), snapshot(10, hold=None)), (15, hold_key("p"), HELD)) == HELD
    assert newest((20, state_key("p"), snapshot(10, hold=HELD)), (15, hold_key("p"), ACKNOWLEDGED)) == ACKNOWLEDGED


def test_a_hold_record_the_snapshot_read_is_settled_by_the_snapshot():
    # Read at 16, after the hold at 15: the snapshot knows that hold or a newer one (acknowledged).
    assert newest((20, state_key("p"), snapshot(16, hold=ACKNOWLEDGED)), (15, hold_key("p"), HELD)) == ACKNOWLEDGED


def test_the_first_hold_record_wins_and_a_snapshot_without_the_field_knows_no_hold():
    assert newest((30, hold_key("p"), ACKNOWLEDGED), (20, hold_key("p"), HELD)) == ACKNOWLEDGED
    legacy = snapshot(16)  # no "hold" field: written by a version before holds
    assert newest((20, state_key("p"), legacy), (15, hold_key("p"), HELD)) == HELD
    assert newest((20, state_key("p"), legacy)) is None


def test_other_pipelines_and_tombstones_are_not_holds():
    assert newest((20, hold_key("p.replay.r1.g1"), HELD), (19, hold_key("q"), HELD), (18, hold_key("p"), None)) is None
    assert newest((20, state_key("q"), snapshot(0, hold=HELD))) is None


def test_run_ids_that_would_write_under_the_manifests_own_keys_are_reserved():
    for run_id in ("hold", "state", "starts", "stream", "side", "checkpoint:in-0", "hold:x"):
        assert reserved_run_id(run_id), run_id
    for run_id in ("manual__2026-11-27T10:14:05+00:00", "scheduled__2026-11-27T10:00:00+00:00", "holdings", "run-1"):
        assert not reserved_run_id(run_id), run_id
