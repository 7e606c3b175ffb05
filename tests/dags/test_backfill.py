"""Backfills created with Airflow's own ``airflow backfill create`` and its REST API (``POST
/api/v2/backfills``, what the UI's backfill dialog sends), run by a real scheduler (a
local deployment: api-server, scheduler, dag-processor, triggerer), on a real broker, real Spark
and a real SQL sink: each interval's aggregates exactly, in the backfill table (the live table is
never written; the run's note gives the statement that promotes it), a repeated backfill a no-op,
reprocessing over the recorded ranges, the live pipeline going on from its own checkpoint, and an
interval beyond retention refused. ``pytest -k backfill`` selects these tests."""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.backfill.side import BACKFILL, interval_key, mapping_key
from kafka_eos.manifest import ManifestStore
from kafka_eos.spec import load_spec
from waiting import wait_until

pytestmark = pytest.mark.integration

#: Order minutes after T0, 2 partitions (even index: partition 0): three 5-minute intervals.
MINUTES = [0.5, 1.5, 1.7, 5.2, 6.1, 6.2, 6.3, 10.4, 14.9]
#: What each minute of the three intervals must hold: orders per minute.
EXACT = {0: 1, 1: 2, 5: 1, 6: 3, 10: 1, 14: 1}
#: A backfill run is a spark-submit under a real scheduler; minutes on 2 busy cores.
RUN_TIMEOUT_S = 600


def _wait(what: str, check):
    """A DAG run's outcome through Airflow's REST API, asked once a second."""
    return wait_until(what, check, RUN_TIMEOUT_S, every_s=1.0)


def _runs(airflow, dag_id: str) -> list[dict]:
    return airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]


def _finished(airflow, dag_id: str, run_type: str, count: int) -> list[dict] | None:
    runs = [r for r in _runs(airflow, dag_id) if r["run_type"] == run_type]
    return runs if len(runs) >= count and _settled(runs) else None


def _settled(runs: list[dict], with_type: str | None = None) -> list[dict] | None:
    """``runs`` when every one has ended (and one is of ``with_type``, if given)."""
    if not all(r["state"] in ("success", "failed") for r in runs):
        return None
    return runs if with_type is None or any(r["run_type"] == with_type for r in runs) else None


def _create_backfill(airflow, dag_id: str, from_date: str, to_date: str, **options) -> dict:
    """A backfill created through Airflow's REST API (``POST /api/v2/backfills``); ``options``: the
    body's other fields (``reprocess_behavior``, ``dag_run_conf``)."""
    backfill = airflow.api("POST", "/api/v2/backfills",
                           {"dag_id": dag_id, "from_date": from_date, "to_date": to_date, **options})
    assert backfill["dag_id"] == dag_id, backfill
    return backfill


def _backfill_done(airflow, dag_id: str) -> bool:
    backfills = airflow.api("GET", f"/api/v2/backfills?dag_id={dag_id}")["backfills"]
    return bool(backfills) and all(b["completed_at"] for b in backfills)


def _rows(db: Path, t0: datetime, where: str = "revenue_per_minute") -> dict[int, int]:
    """Orders per minute after ``t0`` in a table (or a query's rows of minute and count)."""
    query = where if where.startswith("select") else f"select minute, order_count from {where}"
    with sqlite3.connect(db) as conn:
        rows = conn.execute(query).fetchall()
    return {int((datetime.fromisoformat(str(m)).replace(tzinfo=timezone.utc) - t0).total_seconds() // 60): n
            for m, n in rows}


def _generation(n: int) -> str:
    return f"select minute, order_count from revenue_per_minute_backfill where kafka_eos_generation = {n}"


def test_backfill_through_airflows_backfill_command_is_exact_idempotent_and_leaves_the_live_run_alone(
        airflow_deployment, kafka_settings, unique, tmp_path):
    airflow = airflow_deployment
    t0 = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    name = f"bf_{unique.replace('-', '_')}"
    topic, db = f"{name}.orders", tmp_path / "revenue.db"
    kafka_admin.create_topics(kafka_settings, {topic: 2})
    producer = Producer(kafka_settings.client_config())
    for i, m in enumerate(MINUTES):
        at = t0 + timedelta(minutes=m)
        producer.produce(topic, partition=i % 2, timestamp=int(at.timestamp() * 1000), value=json.dumps(
            {"order_id": f"o-{i}", "customer_id": "c", "amount": "10.00", "currency": "EUR", "category": "books",
             "ts": at.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode())
    assert producer.flush(30) == 0
    spec_path = airflow.dags_folder.parent / "specs" / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topic]}, "transform": "spark_apps.transforms.revenue:revenue_per_minute",
        "sink": {"kind": "sql", "table": "revenue_per_minute", "key_columns": ["minute", "category"], "merge": "add",
                 "url": f"sqlite:///{db}", "backfill_table": "revenue_per_minute_backfill"},
        "schedule": "*/5 * * * *"}))
    spec = load_spec(str(spec_path), import_transform=False)
    dag_id = f"kafka_eos__{name}"

    # The live pipeline first: unpaused, its scheduled run reads everything from its checkpoint.
    airflow.wait_for_dag(dag_id)
    (live,) = _wait("the first scheduled run", lambda: _finished(airflow, dag_id, "scheduled", 1))[:1]
    assert live["state"] == "success"
    assert _rows(db, t0) == EXACT
    tps = [(topic, 0), (topic, 1)]
    live_checkpoint = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps)
    assert live_checkpoint == {(topic, 0): 5, (topic, 1): 4}
    with sqlite3.connect(db) as conn:  # history goes wrong (a bad deploy, a manual edit) ...
        conn.execute("update revenue_per_minute set order_count = 99")

    # ... and Airflow's backfill recomputes it: three intervals, each with its exact aggregates, in
    # the backfill table; the live table is not written.
    frm, to = t0.isoformat(), (t0 + timedelta(minutes=10)).isoformat()
    airflow.airflow("backfill", "create", "--dag-id", dag_id, "--from-date", frm, "--to-date", to)
    runs = _wait("three backfill runs", lambda: _finished(airflow, dag_id, "backfill", 3))
    assert [r["state"] for r in runs] == ["success"] * 3, runs
    _wait("the backfill completed", lambda: _backfill_done(airflow, dag_id))
    assert set(_rows(db, t0).values()) == {99}
    assert _rows(db, t0, _generation(1)) == EXACT
    manifest = ManifestStore.of(spec, kafka_settings)
    keys = [interval_key(t0 + timedelta(minutes=m), t0 + timedelta(minutes=m + 5)) for m in (0, 5, 10)]
    recorded = {k: manifest.find(mapping_key(spec, BACKFILL, k)) for k in keys}
    assert [r["ranges"] for r in recorded.values()] == [
        [[topic, 0, 0, 2], [topic, 1, 0, 1]], [[topic, 0, 2, 4], [topic, 1, 1, 3]], [[topic, 0, 4, 5], [topic, 1, 3, 4]]]
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == live_checkpoint
    notes = sorted(airflow.run_note(dag_id, r["dag_run_id"]) for r in _runs(airflow, dag_id)
                   if r["run_type"] == "backfill")  # each run says
    # orders in, rows out (one per minute and category)
    assert [n.split(" dead-lettered")[0] for n in notes] == [
        f"backfill {k}: committed: {n} in, {rows} out, 0" for k, n, rows in zip(keys, (3, 4, 2), (2, 2, 2))]
    assert notes[0].endswith(f"{topic}-0 [0, 2), {topic}-1 [0, 1).")
    assert all("Written to table `revenue_per_minute_backfill` in the sink's database" in n for n in notes)
    # The operator checks the backfill and runs the statement each note gives: the live table is repaired.
    statements = [re.search(r"after checking: (INSERT INTO .*?;)", n).group(1) for n in notes]
    with sqlite3.connect(db) as conn:
        for statement in statements:
            conn.execute(statement)
    assert _rows(db, t0) == EXACT

    # The same backfill again (Airflow reruns the completed runs): already written, nothing changes.
    with sqlite3.connect(db) as conn:
        conn.execute("update revenue_per_minute_backfill set order_count = 77 where order_count = 3")
    middle = (t0 + timedelta(minutes=5)).isoformat()
    # This time through the REST API, as the UI's dialog asks (the command imports all of Airflow:
    # some 8 CPU seconds a call).
    _create_backfill(airflow, dag_id, middle, middle, reprocess_behavior="completed")
    _wait("the repeated backfill completed", lambda: _backfill_done(airflow, dag_id))
    assert _rows(db, t0, _generation(1)) == {**EXACT, 6: 77}  # a no-op: the edit is still there
    assert _rows(db, t0, _generation(2)) == {}
    # Reprocessing, asked for: a new generation over the recorded ranges, beside the first.
    _create_backfill(airflow, dag_id, middle, middle, reprocess_behavior="completed", dag_run_conf={"reprocess": True})
    _wait("the reprocessing backfill completed", lambda: _backfill_done(airflow, dag_id))
    assert _rows(db, t0, _generation(2)) == {5: 1, 6: 3}
    assert _rows(db, t0) == EXACT  # still the live table's own
    again = manifest.find(mapping_key(spec, BACKFILL, keys[1]))
    assert again["ranges"] == recorded[keys[1]]["ranges"] and max(again["generations"].values()) == 2

    # The live pipeline goes on from its own checkpoint: a new order, read only by the next live run
    # (the manual one asked for here, or a scheduled one its */5 schedule starts first).
    before = {r["dag_run_id"] for r in _wait("no run under way", lambda: _settled(_runs(airflow, dag_id)))}
    now = datetime.now(timezone.utc)
    producer.produce(topic, partition=1, timestamp=int(now.timestamp() * 1000), value=json.dumps(
        {"order_id": "o-live", "customer_id": "c", "amount": "5.00", "currency": "EUR", "category": "food",
         "ts": now.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode())
    assert producer.flush(30) == 0
    airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})

    live = _wait("the live runs after the new order", lambda: _settled(
        [r for r in _runs(airflow, dag_id) if r["dag_run_id"] not in before], with_type="manual"))
    assert [r["state"] for r in live] == ["success"] * len(live), live
    notes = [airflow.run_note(dag_id, r["dag_run_id"]) for r in live]
    reading = [n for n in notes if not n.startswith("empty: nothing new to read")]
    assert len(reading) == 1, live
    assert reading[0].startswith("committed: 1 in, 1 out, 0 dead-lettered in ")
    assert reading[0].endswith(f"; {topic}-1 [4, 5).")
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == {(topic, 0): 5, (topic, 1): 5}
    with sqlite3.connect(db) as conn:
        assert conn.execute("select sum(order_count) from revenue_per_minute").fetchone()[0] == len(MINUTES) + 1


def test_a_backfill_interval_beyond_retention_fails_naming_the_log_start(airflow_deployment, kafka_settings, unique,
                                                                        tmp_path):
    airflow = airflow_deployment
    t0 = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    name = f"bfr_{unique.replace('-', '_')}"
    topic = f"{name}.orders"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    producer = Producer(kafka_settings.client_config())
    for m in (1, 2, 7):
        producer.produce(topic, value=b"{}", timestamp=int((t0 + timedelta(minutes=m)).timestamp() * 1000))
    assert producer.flush(30) == 0
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 2)])[TopicPartition(topic, 0, 2)].result(30)  # retention
    spec_path = airflow.dags_folder.parent / "specs" / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump({
        # latest: the live run that unpausing starts reads nothing (only backfills are tested here)
        "name": name, "source": {"topics": [topic], "starting_offsets": "latest"},
        "transform": "spark_apps.transforms.revenue:revenue_per_minute",
        "sink": {"kind": "sql", "table": "revenue", "key_columns": ["minute", "category"],
                 "url": f"sqlite:///{tmp_path / 'revenue.db'}", "backfill_table": "revenue_backfill"},
        "schedule": "*/5 * * * *"}))
    dag_id = f"kafka_eos__{name}"
    airflow.wait_for_dag(dag_id)

    _create_backfill(airflow, dag_id, t0.isoformat(), t0.isoformat())
    (run,) = _wait("the backfill run", lambda: _finished(airflow, dag_id, "backfill", 1))
    assert run["state"] == "failed"
    logs = airflow.home / "logs" / f"dag_id={dag_id}" / f"run_id={run['dag_run_id']}" / "task_id=plan"
    text = "".join(p.read_text() for p in logs.glob("attempt=*.log"))
    assert (f"{topic}-0: the interval {t0.isoformat()} - {(t0 + timedelta(minutes=5)).isoformat()} reaches back to "
            "the log start 2: records of it may have been deleted by retention (on_data_loss: fail)") in text
