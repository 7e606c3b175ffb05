"""Waiting for data, and being told when a pipeline falls behind or loses data, in real Airflow
runs (``dag.test()``, triggers run in line) on a real broker, alerts to a real HTTP receiver and
a real SMTP server: the committed-data sensor and its trigger, the freshness check, and the alert
of a plan that skipped records deleted by retention."""

from __future__ import annotations

import asyncio
import email
import importlib
import json
import time

import pytest
import yaml
from confluent_kafka import Producer, TopicPartition

from kafka_eos import kafka_admin
from kafka_eos.spec import parse_spec, spec_document

pytestmark = pytest.mark.integration


@pytest.fixture
def pipeline(kafka_settings, unique, tmp_path):
    """``pipeline(**source)``: a spec file over a fresh 2-partition source topic; returns its path."""

    def write(**source) -> str:
        topic, out = f"in-{unique}", f"out-{unique}"
        kafka_admin.create_topics(kafka_settings, {topic: 2, out: 1})
        spec = parse_spec({"name": unique, "source": {"topics": [topic], **source},
                           "sink": {"kind": "kafka", "topic": out}}, "p.yaml")
        path = tmp_path / f"{unique}.yaml"
        path.write_text(yaml.safe_dump(spec_document(spec)))
        return str(path)

    return write


def _produce(kafka_settings, topic: str, partition: int, n: int, timestamp_ms: int | None = None) -> None:
    producer = Producer(kafka_settings.client_config())
    for _ in range(n):
        producer.produce(topic, value=b"order", partition=partition,
                         **({} if timestamp_ms is None else {"timestamp": timestamp_ms}))
    assert producer.flush(30) == 0


def _aborted(kafka_settings, topic: str, partition: int, txid: str) -> None:
    producer = Producer(kafka_settings.client_config(**{"transactional.id": txid}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=partition)
    producer.flush(30)
    producer.abort_transaction(30)


def _first_event(trigger) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_the_committed_data_trigger_fires_on_committed_records_only(kafka_settings, kafka_connection, pipeline,
                                                                     unique):
    from kafka_eos_airflow.triggers.kafka import CommittedDataTrigger

    path = pipeline()
    topic = f"in-{unique}"
    _aborted(kafka_settings, topic, 1, f"writer-{unique}")  # offsets and a marker, but no data
    trigger = CommittedDataTrigger(path, kafka_connection, poll_interval_s=0.5, timeout_s=2)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)

    before = kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{unique}", [(topic, 0), (topic, 1)])
    assert _first_event(trigger) == {"status": "timeout", "pipeline": path, "timeout_s": 2}
    _produce(kafka_settings, topic, 1, 3)
    for event in (_first_event(trigger), _first_event(again)):  # twice: it only reads
        assert event["status"] == "available"
        ((row),) = event["partitions"]
        assert (row["partition"], row["checkpoint"], row["lso"], row["lag"]) == (1, None, 5, 5)
        assert row["oldest_unprocessed"]["offset"] == 2  # after the aborted record and its marker
    assert kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{unique}", [(topic, 0), (topic, 1)]) == before


GATE_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
from kafka_eos_airflow.sensors.kafka import CommittedDataSensor

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    CommittedDataSensor(task_id="wait", pipeline={pipeline!r}, poll_interval_s=1, timeout=3, soft_fail=True,
                        retries=0) >> EmptyOperator(task_id="run")
'''


def test_the_committed_data_sensor_gates_a_run(run_dag, kafka_settings, kafka_connection, pipeline, unique):
    path = pipeline()
    dag_id = f"gate_{unique.replace('-', '_')}"
    dag_run = run_dag(dag_id, GATE_DAG.format(dag_id=dag_id, pipeline=path))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"wait": "skipped", "run": "skipped"}

    _produce(kafka_settings, f"in-{unique}", 0, 2)
    kafka_admin.alter_group_offsets(kafka_settings, f"kafka-eos.{unique}", {(f"in-{unique}", 0): 1})
    dag_run = run_dag(dag_id, GATE_DAG.format(dag_id=dag_id, pipeline=path))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"wait": "success", "run": "success"}
    (wait,) = [ti for ti in dag_run.get_task_instances() if ti.task_id == "wait"]
    ((row),) = wait.xcom_pull(task_ids="wait")
    assert (row["partition"], row["checkpoint"], row["lag"], row["oldest_unprocessed"]["offset"]) == (0, 1, 1, 1)


FRESHNESS_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from kafka_eos_airflow.operators.checks import FreshnessCheckOperator
from kafka_eos_airflow.notifications.alerts import failure_notifiers

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    FreshnessCheckOperator(task_id="freshness", pipelines={pipelines!r}, retries=0,
                           on_failure_callback=failure_notifiers())
'''


def _html(mail: str) -> str:
    return "".join(part.get_payload(decode=True).decode() for part in email.message_from_string(mail).walk()
                   if part.get_content_type() == "text/html")


def test_the_freshness_check_alerts_on_old_unprocessed_records(run_dag, kafka_settings, kafka_connection, pipeline,
                                                                alert_receivers, statsd, unique):
    path = pipeline(freshness_limit_s=600)
    topic = f"in-{unique}"
    dag_id = f"freshness_{unique.replace('-', '_')}"
    _produce(kafka_settings, topic, 0, 2)  # fresh: written now
    bodies, mails = alert_receivers
    dag_run = run_dag(dag_id, FRESHNESS_DAG.format(dag_id=dag_id, pipelines=[path]))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"freshness": "success"}
    assert (bodies, mails) == ([], [])

    hour_ago = int(time.time() * 1000) - 3_600_000
    _produce(kafka_settings, topic, 1, 3, timestamp_ms=hour_ago)
    dag_run = run_dag(dag_id, FRESHNESS_DAG.format(dag_id=dag_id, pipelines=[path]))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"freshness": "failed"}
    ((_path, _type, alert),) = bodies
    assert alert["text"].startswith(f"kafka-eos: {dag_id} / freshness failed (run manual__")
    assert "1 partition(s) hold committed records older than their pipeline's freshness limit" in alert["error"]
    ((late),) = alert["stale"]
    assert (late["pipeline"], late["topic"], late["partition"], late["checkpoint"], late["lso"], late["lag"],
            late["oldest_offset"], late["limit_s"]) == (unique, topic, 1, None, 3, 3, 0, 600)
    assert 3590 <= late["age_s"] < 3700
    # Both looks told Airflow's metrics the pipeline's lag and its oldest unprocessed record's age.
    lags = statsd.named(f"airflow.kafka_eos.source.lag.{unique}")
    assert [v for _n, v, kind in lags] == [2, 5] and {kind for _n, _v, kind in lags} == {"g"}
    ages = [v for _n, v, _k in statsd.named(f"airflow.kafka_eos.source.oldest_unprocessed_age_s.{unique}")]
    assert len(ages) == 2 and ages[0] < 60 and ages[1] == late["age_s"]
    ((finding),) = alert["findings"]
    assert (finding["what"], finding["pipeline"], finding["partition"], finding["lag"]) == (
        "stale_partition", unique, f"{topic}-1", 3)
    assert finding["runbook"].endswith(f"/dags/kafka_eos__{unique}")
    ((_from, _to, mail),) = mails
    assert f"<b>{topic}-1</b> ({unique}): the oldest unprocessed committed record (offset 0) is " in _html(mail)


PLAN_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from kafka_eos_airflow.operators.pipeline import KafkaEosPlanOperator

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    KafkaEosPlanOperator(task_id="plan", pipeline={pipeline!r}, retries=0)
'''


def test_a_plan_that_skips_deleted_records_alerts_and_goes_on(run_dag, kafka_settings, kafka_connection, pipeline,
                                                               alert_receivers, unique):
    path = pipeline(on_data_loss="skip")
    topic = f"in-{unique}"
    _produce(kafka_settings, topic, 0, 10)
    kafka_admin.alter_group_offsets(kafka_settings, f"kafka-eos.{unique}", {(topic, 0): 2})  # an earlier run
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 6)])[TopicPartition(topic, 0, 6)].result(30)  # retention

    dag_id = f"skip_{unique.replace('-', '_')}"
    dag_run = run_dag(dag_id, PLAN_DAG.format(dag_id=dag_id, pipeline=path))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"plan": "success"}
    bodies, mails = alert_receivers
    ((_path, _type, alert),) = bodies
    assert alert["text"].startswith(f"kafka-eos: {dag_id} / plan reports (run manual__")
    assert alert["error"] == (f"pipeline {unique}: records deleted by retention before they were read were skipped "
                              f"in 1 partition(s) (on_data_loss: skip): {topic}-0 [2, 6)")
    assert alert["skipped"] == [{"pipeline": unique, "topic": topic, "partition": 0, "from": 2, "until": 6}]
    ((_from, _to, mail),) = mails
    assert f"<b>{topic}-0</b>: offsets [2, 6) were deleted by retention before they were read" in _html(mail)


def _events(trigger, seconds: float, meanwhile=None, expect: int | None = None, timeout_s: float = 60.0,
            before_meanwhile: int = 0) -> list[dict]:
    """The events a long-running trigger yields: ``meanwhile()`` runs (off the event loop) after
    the first third of ``seconds`` and once ``before_meanwhile`` events came (a loaded machine can
    make the trigger's first look later than that third); then, with ``expect``, it watches until
    that many events came (at most ``timeout_s``: a loaded machine makes each look slower); then
    for the rest of ``seconds``, in which nothing more may come."""

    async def collect():
        found: list[dict] = []

        async def watch():
            async for event in trigger.run():
                found.append(event.payload)

        async def until(count: int) -> None:
            deadline = time.monotonic() + timeout_s
            while len(found) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

        task = asyncio.create_task(watch())
        await asyncio.sleep(seconds / 3)
        await until(before_meanwhile)
        if meanwhile is not None:
            await asyncio.to_thread(meanwhile)
        if expect is not None:
            await until(expect)
        await asyncio.sleep(seconds * 2 / 3)
        task.cancel()
        return found

    return asyncio.run(collect())


def test_the_asset_watcher_fires_on_committed_records_only_once_per_new_lso(kafka_settings, kafka_connection,
                                                                            pipeline, unique, killed_transaction):
    from airflow.triggers.base import BaseEventTrigger

    from kafka_eos_airflow.triggers.kafka import CommittedDataEventTrigger

    path = pipeline()
    topic = f"in-{unique}"
    _aborted(kafka_settings, topic, 1, f"writer-{unique}")  # partition 1: offsets and a marker, no data
    killed_transaction(f"open-{unique}", (topic, 0))  # partition 0: an open transaction ...
    _produce(kafka_settings, topic, 0, 2)  # ... and committed records behind it, not readable yet
    trigger = CommittedDataEventTrigger(path, kafka_connection, poll_interval_s=0.3)
    assert isinstance(trigger, BaseEventTrigger)  # what an AssetWatcher accepts
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(*again.serialize())

    groups = [f"kafka-eos.{unique}"]
    before = kafka_admin.committed_offsets(kafka_settings, groups[0], [(topic, 0), (topic, 1)])
    assert _events(trigger, 3) == []  # aborted data and data behind an open transaction: nothing
    # Committed records on partition 1: one event for them, however many looks see the same
    # backlog; records added meanwhile (a new LSO) fire once more.
    _produce(kafka_settings, topic, 1, 3)
    for watcher in (trigger, again):  # twice, two instances: it only reads
        events = _events(watcher, 4.5, expect=1)
        assert len(events) == 1, events
        ((row,),) = [e["partitions"] for e in events]
        assert (row["partition"], row["checkpoint"], row["lso"]) == (1, None, 5)
    events = _events(trigger, 4.5, meanwhile=lambda: _produce(kafka_settings, topic, 1, 2), expect=2,
                     before_meanwhile=1)
    assert [e["partitions"][0]["lso"] for e in events] == [5, 7]
    assert kafka_admin.committed_offsets(kafka_settings, groups[0], [(topic, 0), (topic, 1)]) == before
    # The client held while its answer is awaited, and the wait bounded: a future of a client
    # already collected waited 900 s for an answer once.
    admin = kafka_admin.admin_client(kafka_settings)
    listed = kafka_admin.admin_result(admin.list_consumer_groups(request_timeout=30), "list the groups", 60)
    assert [g for g in listed.valid if g.group_id in groups] == []  # it never joined (or created) the pipeline's group


REFRESH_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from kafka_eos_airflow.operators.checks import CheckpointRefreshOperator

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    CheckpointRefreshOperator(task_id="refresh_checkpoints", pipelines={pipelines!r}, next_in_s=600, retries=0)
'''


def test_the_watchdogs_refresh_commits_again_only_what_the_retention_could_expire(
        run_dag, kafka_settings, kafka_connection, pipeline, unique):
    path = pipeline()
    topic, group = f"in-{unique}", f"kafka-eos.{unique}"
    tps = [(topic, 0), (topic, 1)]
    # Partition 0's checkpoint was committed 4 days ago (more than half the brokers' 7-day
    # retention), partition 1's a minute ago, by a run planned a minute before that.
    now_ms = int(time.time() * 1000)
    client = kafka_admin.group_client(kafka_settings, group)
    try:
        client.commit(offsets=[
            TopicPartition(topic, 0, 7, kafka_admin.offset_metadata(now_ms - 4 * 86_400_000, now_ms - 4 * 86_400_000)),
            TopicPartition(topic, 1, 3, kafka_admin.offset_metadata(now_ms - 60_000, now_ms - 120_000))],
            asynchronous=False)
    finally:
        client.close()
    _produce(kafka_settings, topic, 0, 7)
    _produce(kafka_settings, topic, 1, 3)
    before = kafka_admin.committed_offsets_and_times(kafka_settings, group, tps)

    dag_id = f"refresh_{unique.replace('-', '_')}"
    dag_run = run_dag(dag_id, REFRESH_DAG.format(dag_id=dag_id, pipelines=[path]))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"refresh_checkpoints": "success"}
    after = kafka_admin.committed_offsets_and_times(kafka_settings, group, tps)
    assert {tp: offset for tp, (offset, _t) in after.items()} == {(topic, 0): 7, (topic, 1): 3}  # unchanged
    assert after[(topic, 0)][1].committed_at >= now_ms / 1000  # committed again ...
    assert after[(topic, 0)][1].planned_at == before[(topic, 1)][1].planned_at  # ... keeping the last run's plan time
    assert after[(topic, 1)][1] == before[(topic, 1)][1]  # young: left alone
