"""One real ``dag.test()`` run per example DAG: the real local broker, the real
SparkSubmitOperator (a real ``spark-submit`` in local mode), the real commit.

Each test runs a copy of a bundled spec (same transform, its own topics, group, pipeline name,
manifest topic and SQLite file), turned into a DAG by the project's DAG factory, and asserts on
what landed: checkpoints, a read_committed view of the output, dead letters, the manifest.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.manifest import ManifestStore
from kafka_eos.paths import pipelines_dir
from kafka_eos.settings import KafkaSettings

pytestmark = pytest.mark.integration

#: The run's logical date; any fixed date works (each test has its own pipeline).
LOGICAL_DATE = datetime(2026, 3, 1, 12, 5, tzinfo=timezone.utc)
#: Reading a few records back from a local broker takes well under a second; 60 s is a hang.
READ_TIMEOUT_S = 60.0

VALID_ORDERS = [
    {"order_id": f"o-{i}", "customer_id": f"c-{i % 3}", "amount": amount, "currency": currency,
     "category": category, "ts": f"2026-03-01T12:0{i}:00Z"}
    for i, (amount, currency, category) in enumerate(
        [("12.50", "EUR", "books"), ("99.99", "USD", "games"), ("250.00", "GBP", "books"),
         ("3.20", "EUR", "food"), ("40.00", "CHF", "games")])
]
#: A poison record: not JSON. It must end up as a dead letter, byte for byte.
MALFORMED = b'{"order_id": "o-bad", "amount": '


@pytest.fixture
def connections(monkeypatch, kafka_connection):
    """The Spark (local[2]) and Kafka connections, as Airflow reads them from the environment."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def _specs_dir() -> Path:
    import os

    # The folder the tests' DAG file (in the dags-folder bundle) builds DAGs from; see conftest.
    return Path(os.environ["AIRFLOW_HOME"]) / "specs"


def write_spec(bundled: str, name: str, topics: dict[str, str], sink: dict) -> Path:
    raw = yaml.safe_load((pipelines_dir() / f"{bundled}.yaml").read_text())
    raw["name"] = name
    raw["source"]["topics"] = [topics["orders"]]
    raw["source"]["group_id"] = f"kafka-eos.{name}"
    raw["sink"].update(sink)
    raw["manifest_topic"] = f"{name}.manifest"
    path = _specs_dir() / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def produce_orders(settings: KafkaSettings, topic: str) -> None:
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    for order in VALID_ORDERS:
        producer.produce(topic, key=order["order_id"].encode(), value=json.dumps(order).encode())
    producer.produce(topic, key=b"bad-1", value=MALFORMED)
    assert producer.flush(30) == 0


def read_committed(settings: KafkaSettings, topic: str) -> list:
    """Every committed record of ``topic`` (read_committed, from the beginning to the LSO)."""
    consumer = Consumer(settings.client_config(**{
        "group.id": f"kafka-eos-test-reader-{uuid.uuid4()}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        done, records = set(), []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(done) < len(partitions):
            assert time.monotonic() < deadline, f"reading {topic}: no end after {READ_TIMEOUT_S}s"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error().str()
                done.add(msg.partition())
                continue
            records.append(msg)
        return records
    finally:
        consumer.close()


def assert_checkpoint_at_end(settings: KafkaSettings, group: str, topic: str) -> None:
    tps = [(topic, p) for p in range(kafka_admin.partitions_of(settings, [topic])[topic])]
    ends = {tp: o.high_watermark for tp, o in kafka_admin.partition_offsets(settings, tps).items()}
    assert kafka_admin.committed_offsets(settings, group, tps) == ends
    assert sum(ends.values()) == len(VALID_ORDERS) + 1


def returned(dag_run, task_id: str):
    """What a task of the run returned (its ``return_value`` XCom)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id,
                                                 task_ids=task_id, key="return_value")).first()
        return None if row is None else XComModel.deserialize_value(row)


def verified_lineage(lineage_events, dag_run) -> dict:
    """The verify task's OpenLineage COMPLETE event of ``dag_run``: inputs and outputs as
    (namespace, name, row count) and its ``kafkaEos`` run facet. The provider emits events off the
    task's thread: waited for."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while not (found := [e for e in lineage_events(dag_run.run_id, ".verify") if e["eventType"] == "COMPLETE"]):
        assert time.monotonic() < deadline, f"no OpenLineage COMPLETE event of {dag_run.run_id}'s verify task"
        time.sleep(0.5)
    (event,) = found

    def rows(d: dict):
        return ((d.get("outputFacets") or {}).get("outputStatistics") or {}).get("rowCount")

    return {"inputs": [(d["namespace"], d["name"], rows(d)) for d in event["inputs"]],
            "outputs": [(d["namespace"], d["name"], rows(d)) for d in event["outputs"]],
            "facet": event["run"]["facets"]["kafkaEos"]}


def asset_events(dag_run) -> list[dict]:
    """The asset events the tasks of ``dag_run`` emitted: their asset's URI and their extra."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == dag_run.run_id,
                                                          AssetEvent.source_dag_id == dag_run.dag_id)).all()
        return [{"uri": e.uri, "extra": e.extra} for e in events]


def run_dag(pipelines_module, name: str, logical_date: datetime = LOGICAL_DATE, run_conf: dict | None = None,
            states: dict | None = None):
    """``dag.test()`` of the pipeline's DAG, made by the DAG factory from the specs folder; checks
    that its tasks end in ``states`` (default: all succeeded)."""
    from airflow.sdk import DagRunState

    dag = pipelines_module.dags_from_folder(_specs_dir())[f"kafka_eos__{name}"]
    for task in dag.tasks:
        task.retries = 0  # fail fast: a failure here is a bug, and a retry waits 30 s
    started = time.monotonic()
    dag_run = dag.test(logical_date=logical_date, run_conf=run_conf)
    got = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    print(f"dag.test of {dag.dag_id}: {time.monotonic() - started:.1f}s, {got}")
    states = states or {"plan": "success", "spark": "success", "verify": "success"}
    assert got == states
    assert dag_run.state == (DagRunState.FAILED if "failed" in states.values() else DagRunState.SUCCESS)
    return dag_run


def test_orders_enriched_dag_run(airflow_db, connections, kafka_settings, pipelines_module, lineage_events, unique):
    name = f"oe-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.orders.enriched", "dlq": f"{name}.orders.dlq"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 3, topics["enriched"]: 3, topics["dlq"]: 1})
    write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"]})
    produce_orders(kafka_settings, topics["orders"])

    dag_run = run_dag(pipelines_module, name)

    assert_checkpoint_at_end(kafka_settings, f"kafka-eos.{name}", topics["orders"])
    enriched = [json.loads(m.value()) for m in read_committed(kafka_settings, topics["enriched"])]
    assert sorted(o["order_id"] for o in enriched) == sorted(o["order_id"] for o in VALID_ORDERS)
    assert all(o["size"] in ("small", "medium", "large") and o["amount_eur"] is not None for o in enriched)
    dead = read_committed(kafka_settings, topics["dlq"])
    assert [(m.key(), m.value()) for m in dead] == [(b"bad-1", MALFORMED)]
    assert dict(dead[0].headers())["kafka-eos.reason"] == b"malformed JSON"

    summary, parts = ManifestStore(kafka_settings, f"{name}.manifest", name).run_records(dag_run.run_id)
    assert summary["status"] == "committed"
    assert (summary["records_in"], summary["records_out"], summary["dead_letters"]) == (6, 5, 1)
    assert sorted(parts) == [f"{topics['orders']}-{p}" for p in range(3)]
    verified = returned(dag_run, "verify")
    assert (verified["status"], verified["records_out"], verified["dead_letters"]) == ("committed", 5, 1)
    assert returned(dag_run, "plan")["partitions"] == 3

    # Lineage (OpenLineage's file transport) and the sink's asset event name what the run read and wrote.
    server = kafka_settings.bootstrap_servers.split(",")[0]
    run = verified_lineage(lineage_events, dag_run)
    assert run["inputs"] == [(f"kafka://{server}", topics["orders"], None)]
    assert run["outputs"] == [(f"kafka://{server}", topics["enriched"], 5), (f"kafka://{server}", topics["dlq"], 1)]
    facet = run["facet"]
    assert (facet["mode"], facet["commitScope"], facet["status"], facet.get("sideKey")) == (
        "live", "per_partition", "committed", None)
    assert (facet["recordsIn"], facet["recordsOut"], facet["deadLetters"]) == (6, 5, 1)
    counts: dict[int, int] = {}
    for m in read_committed(kafka_settings, topics["orders"]):
        counts[m.partition()] = max(counts.get(m.partition(), 0), m.offset() + 1)
    assert facet["ranges"] == [{"topic": topics["orders"], "partition": p, "from": 0, "until": counts[p]}
                               for p in sorted(counts)]
    (event,) = asset_events(dag_run)
    assert event["uri"] == f"kafka://{server}/{topics['enriched']}"
    assert (event["extra"]["mode"], event["extra"]["records_out"], event["extra"]["dead_letters"]) == ("live", 5, 1)
    assert event["extra"]["ranges"] == [[topics["orders"], p, 0, counts[p]] for p in sorted(counts)]

    # The next interval has no new records: an empty plan, Spark is skipped, the run succeeds
    # and nothing is written twice.
    next_run = run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=5))
    assert returned(next_run, "plan") == {"pipeline": name, "run_id": next_run.run_id, "partitions": 0,
                                          "empty": True, "ranges": []}
    assert returned(next_run, "verify")["status"] == "empty"
    assert asset_events(next_run) == []  # nothing was written: no event of the sink's asset
    assert len(read_committed(kafka_settings, topics["enriched"])) == len(VALID_ORDERS)
    assert len(read_committed(kafka_settings, topics["dlq"])) == 1
    assert_checkpoint_at_end(kafka_settings, f"kafka-eos.{name}", topics["orders"])


def test_revenue_per_minute_dag_run(airflow_db, connections, kafka_settings, pipelines_module, lineage_events,
                                    unique, tmp_path):
    name = f"rpm-{unique}"
    topics = {"orders": f"{name}.orders"}
    db = tmp_path / "revenue.db"
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 3})
    write_spec("revenue_per_minute", name, topics, {"url": f"sqlite:///{db}"})
    produce_orders(kafka_settings, topics["orders"])

    dag_run = run_dag(pipelines_module, name)

    assert_checkpoint_at_end(kafka_settings, f"kafka-eos.{name}", topics["orders"])
    with sqlite3.connect(db) as conn:
        assert conn.execute("select sum(order_count) from revenue_per_minute").fetchone()[0] == len(VALID_ORDERS)
        dead = conn.execute("select key, value, reason from kafka_eos_dead_letters where pipeline = ?",
                            (name,)).fetchall()
    assert dead == [(b"bad-1", MALFORMED, "malformed JSON")]
    summary, _parts = ManifestStore(kafka_settings, f"{name}.manifest", name).run_records(dag_run.run_id)
    assert summary["status"] == "committed"
    assert (summary["records_in"], summary["dead_letters"]) == (6, 1)
    # A SQL sink's lineage names its database file and tables; its asset is the table's.
    lineage = verified_lineage(lineage_events, dag_run)
    assert lineage["outputs"] == [(f"sqlite://{db}", "revenue_per_minute", summary["records_out"]),
                                  (f"sqlite://{db}", "kafka_eos_dead_letters", 1)]
    from airflow.sdk import Asset

    # As a downstream DAG names it (Airflow normalizes both the same way).
    table_asset = Asset(uri=f"sqlite:///{str(db).lstrip('/')}/revenue_per_minute")
    assert [e["uri"] for e in asset_events(dag_run)] == [table_asset.uri]


def test_a_dry_run_from_the_trigger_form_shows_the_capped_plan_and_changes_nothing(
        airflow_db, connections, kafka_settings, pipelines_module, unique):
    name = f"dry-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.orders.enriched", "dlq": f"{name}.orders.dlq"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 3, topics["enriched"]: 3, topics["dlq"]: 1})
    write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"]})
    produce_orders(kafka_settings, topics["orders"])
    tps = [(topics["orders"], p) for p in range(3)]
    ends = kafka_admin.partition_offsets(kafka_settings, tps)

    dag_run = run_dag(pipelines_module, name, run_conf={"dry_run": True, "max_records_per_partition": 1},
                      states={"plan": "success", "spark": "skipped", "verify": "skipped"})
    shown = returned(dag_run, "plan")
    assert shown["dry_run"] is True
    # Every partition with records would read one offset (the run's cap, not the spec's 100,000).
    assert shown["ranges"] == [[t, p, 0, 1] for (t, p) in tps if ends[(t, p)].lso > 0]
    assert kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{name}", tps) == {tp: None for tp in tps}
    assert read_committed(kafka_settings, topics["enriched"]) == [] and read_committed(kafka_settings, topics["dlq"]) == []
    manifest = f"{name}.manifest"
    assert manifest not in kafka_admin.admin_client(kafka_settings).list_topics(timeout=30).topics  # nothing stored


def test_a_bad_param_is_refused_before_anything_runs(airflow_db, connections, kafka_settings, pipelines_module,
                                                      unique):
    from airflow.sdk.exceptions import ParamValidationError

    name = f"bad-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.orders.enriched", "dlq": f"{name}.orders.dlq"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 1, topics["enriched"]: 1, topics["dlq"]: 1})
    write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"]})
    dag = pipelines_module.dags_from_folder(_specs_dir())[f"kafka_eos__{name}"]
    with pytest.raises(ParamValidationError, match="max_records_per_partition"):
        dag.test(logical_date=LOGICAL_DATE, run_conf={"max_records_per_partition": 0})
    with pytest.raises(ParamValidationError, match="dry_run"):
        dag.test(logical_date=LOGICAL_DATE, run_conf={"dry_run": "yes"})


def test_a_checkpoint_reset_from_the_trigger_form_is_confirmed_audited_and_the_next_run_rereads(
        airflow_db, connections, kafka_settings, pipelines_module, unique, capfd):
    from kafka_eos.audit import AUDIT_TOPIC

    name = f"reset-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.orders.enriched", "dlq": f"{name}.orders.dlq"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 1, topics["enriched"]: 1, topics["dlq"]: 1})
    write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"]})
    produce_orders(kafka_settings, topics["orders"])  # offsets 0-4 valid orders, 5 the malformed one
    group, tp = f"kafka-eos.{name}", (topics["orders"], 0)
    run_dag(pipelines_module, name)
    assert kafka_admin.committed_offsets(kafka_settings, group, [tp]) == {tp: 6}

    plan_only = {"plan": "success", "spark": "skipped", "verify": "skipped"}
    to_three = json.dumps({f"{topics['orders']}-0": 3})
    shown = returned(run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=5), states=plan_only,
                             run_conf={"reset_checkpoint_to": to_three, "dry_run": True}), "plan")
    assert shown == {"pipeline": name, "dry_run": True, "reset": {f"{topics['orders']}-0": [6, 3]}}
    assert kafka_admin.committed_offsets(kafka_settings, group, [tp]) == {tp: 6}  # a dry run changes nothing

    run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=10), run_conf={"reset_checkpoint_to": to_three},
            states={"plan": "failed", "spark": "upstream_failed", "verify": "upstream_failed"})  # not confirmed
    assert f"params.reset_confirm: type exactly 'RESET {name}' to reset the checkpoint (got '')" in capfd.readouterr().out
    assert kafka_admin.committed_offsets(kafka_settings, group, [tp]) == {tp: 6}

    done = returned(run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=15), states=plan_only,
                            run_conf={"reset_checkpoint_to": to_three, "reset_confirm": f"RESET {name}"}), "plan")
    assert kafka_admin.committed_offsets(kafka_settings, group, [tp]) == {tp: 3}
    audit = [json.loads(m.value()) for m in read_committed(kafka_settings, AUDIT_TOPIC)
             if m.key() == f"reset:{name}:{done['audit']['at']}".encode()]
    assert [(a["before"], a["after"], a["asked"], a["via"].split(" run ")[0]) for a in audit] == [
        ({f"{topics['orders']}-0": 6}, {f"{topics['orders']}-0": 3}, to_three, f"kafka_eos__{name}")]

    # The next run goes on from the reset checkpoint: it re-reads offsets 3-5 (as asked).
    again = run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=20))
    assert returned(again, "plan")["ranges"] == [[topics["orders"], 0, 3, 6]]
    enriched = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["enriched"])]
    assert sorted(enriched) == sorted([o["order_id"] for o in VALID_ORDERS] + ["o-3", "o-4"])


def test_a_replay_from_the_trigger_form_writes_the_range_to_the_backfill_topic_once(
        airflow_db, connections, kafka_settings, pipelines_module, lineage_events, unique, capfd):
    name = f"replay-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.orders.enriched", "dlq": f"{name}.orders.dlq",
              "backfill": f"{name}.orders.backfill"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 3, topics["enriched"]: 3, topics["dlq"]: 1,
                                               topics["backfill"]: 3})
    write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"],
                                                 "backfill_topic": topics["backfill"]})
    produce_orders(kafka_settings, topics["orders"])
    run_dag(pipelines_module, name)  # the live run
    group, tps = f"kafka-eos.{name}", [(topics["orders"], p) for p in range(3)]
    live = kafka_admin.committed_offsets(kafka_settings, group, tps)

    # Refused before anything runs: an end before its start, names the field.
    backwards = {"replay_from": json.dumps({f"{topics['orders']}-0": 1}),
                 "replay_until": json.dumps({f"{topics['orders']}-0": 0})}
    run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=1), run_conf=backwards,
            states={"plan": "failed", "spark": "upstream_failed", "verify": "upstream_failed"})
    assert f"params.replay_until: {topics['orders']}-0: ends at 0, before its start 1 (params.replay_from)" in \
        capfd.readouterr().out

    everything = {"replay_from": json.dumps({f"{t}-{p}": 0 for t, p in tps}),
                  "replay_until": json.dumps({f"{t}-{p}": live[(t, p)] for t, p in tps})}
    live_dead_letters = len(read_committed(kafka_settings, topics["dlq"]))
    assert live_dead_letters == 1
    replay = run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=2), run_conf=everything)
    planned = returned(replay, "plan")
    assert (planned["generation"], planned["writes_to"], planned["dead_letters_to"]) == (
        1, topics["backfill"], topics["backfill"])
    assert (returned(replay, "verify")["records_out"], returned(replay, "verify")["dead_letters"]) == (
        len(VALID_ORDERS), 1)
    out = [m for m in read_committed(kafka_settings, topics["backfill"]) if "kafka-eos.reason" not in dict(m.headers())]
    assert sorted(json.loads(m.value())["order_id"] for m in out) == sorted(o["order_id"] for o in VALID_ORDERS)
    assert {dict(m.headers())["kafka-eos.generation"] for m in out} == {b"1"}
    # The replay's dead letter went to the backfill topic, marked; the live dead-letter topic did not grow.
    (dead,) = [m for m in read_committed(kafka_settings, topics["backfill"]) if "kafka-eos.reason" in dict(m.headers())]
    assert dead.value() == MALFORMED and dict(dead.headers())["kafka-eos.generation"] == b"1"
    assert len(read_committed(kafka_settings, topics["dlq"])) == live_dead_letters
    assert kafka_admin.committed_offsets(kafka_settings, group, tps) == live  # the live checkpoint did not move
    assert len(read_committed(kafka_settings, topics["enriched"])) == len(VALID_ORDERS)  # nor its output
    # The replay's lineage says it was a replay and names the backfill topic, not the live output;
    # its asset event is the backfill topic's.
    server = kafka_settings.bootstrap_servers.split(",")[0]
    lineage = verified_lineage(lineage_events, replay)
    assert lineage["outputs"] == [(f"kafka://{server}", topics["backfill"], len(VALID_ORDERS))]
    assert (lineage["facet"]["mode"], lineage["facet"]["recordsOut"], lineage["facet"]["deadLetters"]) == (
        "replay", len(VALID_ORDERS), 1)
    assert lineage["facet"]["sideKey"] == planned["replay"]
    assert [e["uri"] for e in asset_events(replay)] == [f"kafka://{server}/{topics['backfill']}"]

    # The same replay again: done already, nothing written; with reprocess: generation 2.
    again = run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=3), run_conf=everything)
    assert returned(again, "verify")["records_out"] == 0 and returned(again, "plan")["partitions"] == 0
    assert len(read_committed(kafka_settings, topics["backfill"])) == len(VALID_ORDERS) + 1
    run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=4), run_conf={**everything, "reprocess": True})
    out = read_committed(kafka_settings, topics["backfill"])
    assert sorted(dict(m.headers())["kafka-eos.generation"] for m in out) == [b"1"] * 6 + [b"2"] * 6


def test_an_iceberg_pipelines_dag_run_commits_its_table_through_a_catalog_connection(
        airflow_db, connections, kafka_settings, pipelines_module, lineage_events, unique, tmp_path, postgres_url,
        monkeypatch):
    """The Iceberg sink under Airflow: its SQL catalog's database comes from an Airflow connection
    (``sink.conn_id``), which the tasks resolve and hand to spark-submit; the table holds each valid
    order once, its dead letter in its own table, the snapshot's offsets at the end and mirrored; the
    lineage and the asset name the table by its location."""
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.engine import make_url

    name = f"ice-{unique}"
    topics = {"orders": f"{name}.orders"}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 3})
    url = make_url(postgres_url)
    monkeypatch.setenv("AIRFLOW_CONN_ICEBERG_CATALOG", json.dumps({
        "conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
        "password": url.password, "schema": url.database}))
    path = write_spec("revenue_per_minute", name, topics, {})
    raw = yaml.safe_load(path.read_text())
    table = f"lake.{name.replace('-', '_')}"
    raw["transform"] = "spark_apps.transforms.orders:as_rows"
    raw["sink"] = {"kind": "iceberg", "table": table, "conn_id": "iceberg_catalog",
                   "warehouse": (tmp_path / "warehouse").as_uri()}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    produce_orders(kafka_settings, topics["orders"])

    dag_run = run_dag(pipelines_module, name)

    assert_checkpoint_at_end(kafka_settings, f"kafka-eos.{name}", topics["orders"])
    catalog = SqlCatalog("kafka_eos", uri=postgres_url, warehouse=(tmp_path / "warehouse").as_uri())
    rows = catalog.load_table(table).scan().to_arrow().to_pylist()
    assert sorted(r["order_id"] for r in rows) == sorted(o["order_id"] for o in VALID_ORDERS)
    dead = catalog.load_table(f"{table}_dead_letters").scan().to_arrow().to_pylist()
    assert [(d["key"], d["value"], d["reason"]) for d in dead] == [(b"bad-1", MALFORMED, "malformed JSON")]
    location = catalog.load_table(table).location().rstrip("/")
    lineage = verified_lineage(lineage_events, dag_run)
    assert lineage["outputs"][0] == ("file", location[len("file://"):], len(VALID_ORDERS))
    assert [e["uri"] for e in asset_events(dag_run)] == [location]

    # A replay from the trigger form: into a branch of the table of its own, main untouched; the
    # run's summary gives the command that promotes it, which fast-forwards main (it did not move).
    from kafka_eos.cli import main

    main_snapshot = catalog.load_table(table).current_snapshot().snapshot_id
    tps = [(topics["orders"], p) for p in range(3)]
    live = kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{name}", tps)
    replay = run_dag(pipelines_module, name, LOGICAL_DATE + timedelta(minutes=1), run_conf={
        "replay_from": json.dumps({f"{t}-{p}": 0 for t, p in tps}),
        "replay_until": json.dumps({f"{t}-{p}": live[(t, p)] for t, p in tps})})
    planned, done = returned(replay, "plan"), returned(replay, "verify")
    branch = f"kafka-eos.{name}.replay.{planned['replay']}.g1"
    assert (planned["writes_to"], planned["dead_letters_to"]) == (f"{table}@{branch}", f"{table}_dead_letters@{branch}")
    assert done["promote_command"] == f"kafka-eos backfill promote {name} replay.{planned['replay']}.g1 --yes"
    assert catalog.load_table(table).current_snapshot().snapshot_id == main_snapshot
    on_branch = catalog.load_table(table).scan(
        snapshot_id=catalog.load_table(table).snapshot_by_name(branch).snapshot_id).to_arrow()
    assert sorted(on_branch.column("order_id").to_pylist()) == sorted(2 * [o["order_id"] for o in VALID_ORDERS])
    monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(_specs_dir()))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    # The replay's range is main's too: refused without --overlap (main would hold it twice).
    assert main(done["promote_command"].split()[1:]) == 1
    assert main([*done["promote_command"].split()[1:], "--overlap"]) == 0
    assert catalog.load_table(table).current_snapshot().snapshot_id == \
        catalog.load_table(table).snapshot_by_name(branch).snapshot_id
