"""The hung-transaction sensor in real Airflow runs (``dag.test()``, its trigger run in line),
over a real hung transaction and over healthy partitions; its trigger serializes and only reads.
"""

from __future__ import annotations

import asyncio
import email
import importlib
import json

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin

pytestmark = pytest.mark.integration


def _events(trigger) -> list:
    async def first():
        async for event in trigger.run():
            return event

    return [asyncio.run(first())]


def test_the_trigger_serializes_and_only_reads(kafka_settings, kafka_connection, killed_transaction, unique):
    from kafka_eos_airflow.triggers.kafka import HungTransactionTrigger

    topic = f"held-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    killed_transaction(f"stranger-{unique}", (topic, 0))
    trigger = HungTransactionTrigger([topic], "kafka_eos_kafka", older_than_s=0, healthy_for_s=5, poll_interval_s=1)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)

    before = kafka_admin.partition_offsets(kafka_settings, [(topic, 0)])
    first, second = _events(trigger)[0], _events(again)[0]  # the same look twice: no side effect
    assert kafka_admin.partition_offsets(kafka_settings, [(topic, 0)]) == before
    for event in (first, second):
        (stall,) = event.payload["stalls"]
        assert (stall["topic"], stall["lso"], stall["culprit"]["transactional_id"]) == (topic, 0, f"stranger-{unique}")


SENSOR_DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from kafka_eos_airflow.notifications.alerts import failure_notifiers
from kafka_eos_airflow.sensors.kafka import HungTransactionSensor

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    HungTransactionSensor(task_id="watch", topics={topics!r}, older_than_s={older_than_s}, healthy_for_s=3,
                          poll_interval_s=1, retries=0, on_failure_callback=failure_notifiers())
'''


def test_the_sensor_fails_naming_the_culprit_alerts_and_passes_on_healthy_partitions(
        run_dag, kafka_connection, kafka_settings, killed_transaction, alert_receivers, capfd, unique):
    held, healthy = f"held-{unique}", f"healthy-{unique}"
    kafka_admin.create_topics(kafka_settings, {held: 2, healthy: 2})
    producer = Producer(kafka_settings.client_config())
    for topic in (held, healthy):
        producer.produce(topic, value=b"committed", partition=1)
    assert producer.flush(30) == 0
    txid = f"stranger-{unique}"
    killed_transaction(txid, (held, 1))

    healthy_dag, held_dag = (f"sensor_{what}_{unique.replace('-', '_')}" for what in ("healthy", "held"))
    def run_sensor_dag(dag_id: str, topics: list[str], older_than_s: float) -> dict[str, str]:
        dag_run = run_dag(dag_id, SENSOR_DAG.format(dag_id=dag_id, topics=topics, older_than_s=older_than_s))
        return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}

    assert run_sensor_dag(healthy_dag, [healthy], 1) == {"watch": "success"}
    bodies, mails = alert_receivers
    assert (bodies, mails) == ([], [])  # a healthy watch alerts nobody
    assert run_sensor_dag(held_dag, [held, healthy], 1) == {"watch": "failed"}
    out, err = capfd.readouterr()  # the task's log
    log = out + err
    assert (f"1 partition(s) held by an open transaction for longer than 1s (read_committed readers stop there): "
            f"{held}-1: LSO 1 < HW 2 (1 offsets waiting), held for ") in log
    abort = f"kafka-eos txn abort --topic {held} --partition 1 --start-offset 1"
    assert f"transactional.id {txid}, long-running; abort: {abort}" in log

    # The webhook got the alert as JSON (Slack reads its text) ...
    ((_path, content_type, alert),) = bodies
    assert content_type == "application/json"
    assert alert["text"].startswith(f"kafka-eos: {held_dag} / watch failed (run manual__")
    assert (alert["dag_id"], alert["task_id"]) == (held_dag, "watch") and alert["run_id"].startswith("manual__")
    ((stall),) = alert["stalls"]
    assert (stall["partition"], stall["lso"], stall["high_watermark"], stall["transactional_id"], stall["verdict"],
            stall["abort"]) == (f"{held}-1", 1, 2, txid, "long-running", abort)
    assert stall["producer_id"] >= 0 and stall["open_for_s"] >= 1
    assert stall["runbook"] == {"dag_id": "kafka_eos_runbook_abort_transaction",
                                "conf": {"topic": held, "partition": 1, "start_offset": 1}}
    ((finding),) = alert["findings"]
    assert (finding["what"], finding["partition"], finding["transactional_id"], finding["runbook_conf"]) == (
        "held_partition", f"{held}-1", txid, stall["runbook"]["conf"])
    assert finding["runbook"].endswith("/dags/kafka_eos_runbook_abort_transaction") and finding["since"]
    # ... and so did the mailbox.
    ((sender, recipients, mail),) = mails
    assert (sender, recipients) == ("kafka-eos@example.com", ["ops@example.com"])
    message = email.message_from_string(mail)
    assert message["Subject"].startswith(f"kafka-eos: {held_dag} / watch failed")
    body = "".join(part.get_payload(decode=True).decode() for part in message.walk()
                   if part.get_content_type() == "text/html")
    assert f"<b>{held}-1</b>: LSO 1 &lt; HW 2" in body and txid in body and abort in body


def test_the_watchdogs_threshold_follows_the_longest_transaction_timeout_of_its_pipelines(tmp_path, unique):
    """A pipeline that allows a 900 s transaction is not reported at the old fixed 360 s: the
    sensor defers with the longest transaction_timeout_s of its pipelines plus a minute."""
    import yaml
    from airflow.sdk.exceptions import TaskDeferred

    from kafka_eos_airflow.sensors.kafka import HungTransactionSensor

    paths = []
    for timeout_s in (300, 900):
        path = tmp_path / f"p{timeout_s}.yaml"
        path.write_text(yaml.safe_dump({"name": f"p{timeout_s}", "source": {"topics": [f"in-{unique}"]},
                                        "sink": {"kind": "kafka", "topic": f"out-{timeout_s}-{unique}",
                                                 "transaction_timeout_s": timeout_s}}))
        paths.append(str(path))
    for pipelines, expected in ((paths[:1], 360.0), (paths, 960.0)):
        with pytest.raises(TaskDeferred) as deferred:
            HungTransactionSensor(task_id="watch", pipelines=pipelines).execute({})
        assert deferred.value.trigger.older_than_s == expected
    with pytest.raises(TaskDeferred) as deferred:  # given, it is kept
        HungTransactionSensor(task_id="watch", pipelines=paths, older_than_s=30).execute({})
    assert deferred.value.trigger.older_than_s == 30


def test_the_watchdog_over_a_pipeline_that_never_ran_watches_what_exists(tmp_path, kafka_settings, kafka_connection,
                                                                         killed_transaction, statsd, unique):
    """A pipeline's run manifest and backfill topic exist only after its first run: the watchdog
    over it watches its other topics meanwhile (it found a stranger's transaction on the source)
    instead of failing every run with "topic does not exist" (met in the soak: a stream pipeline
    not started yet). A topic named by the DAG itself must still exist."""
    import yaml
    from airflow.sdk.exceptions import TaskDeferred

    from kafka_eos.errors import BrokerError
    from kafka_eos_airflow.notifications.alerts import HungTransactionsFound
    from kafka_eos_airflow.sensors.kafka import HungTransactionSensor

    source, out = f"in-{unique}", f"out-{unique}"
    kafka_admin.create_topics(kafka_settings, {source: 1, out: 1})
    killed_transaction(f"stranger-{unique}", (source, 0))
    path = tmp_path / "never_ran.yaml"
    path.write_text(yaml.safe_dump({"name": f"never-ran-{unique}", "source": {"topics": [source]},
                                    "sink": {"kind": "kafka", "topic": out, "backfill_topic": f"side-{unique}"}}))
    with pytest.raises(TaskDeferred) as deferred:
        HungTransactionSensor(task_id="watch", pipelines=[str(path)], older_than_s=0, healthy_for_s=3,
                              poll_interval_s=1).execute({})
    trigger = deferred.value.trigger
    assert set(trigger.missing_ok) == {source, out, f"side-{unique}", f"kafka-eos.manifest.never-ran-{unique}"}
    (event,) = _events(trigger)
    assert event.payload["status"] == "stalled"
    assert [(s["topic"], s["partition"]) for s in event.payload["stalls"]] == [(source, 0)]
    # The watch's end fails the task, and tells Airflow's metrics (StatsD here) what it found.
    sensor = HungTransactionSensor(task_id="watch", pipelines=[str(path)], older_than_s=0)
    with pytest.raises(HungTransactionsFound) as found:
        sensor.execute_complete({}, event.payload)
    assert found.value.stalls[0]["pipelines"] == [f"never-ran-{unique}"]
    name = f"never-ran-{unique}"
    assert statsd.named("airflow.kafka_eos.watchdog.pinned_partitions") == [
        ("airflow.kafka_eos.watchdog.pinned_partitions", 1, "g"),
        (f"airflow.kafka_eos.watchdog.pinned_partitions.{name}", 1, "g")]
    ages = statsd.named("airflow.kafka_eos.watchdog.pinned_max_age_s")
    assert [m[0] for m in ages] == ["airflow.kafka_eos.watchdog.pinned_max_age_s",
                                    f"airflow.kafka_eos.watchdog.pinned_max_age_s.{name}"]
    assert ages[0][1] == ages[1][1] == event.payload["stalls"][0]["stuck_s"] and ages[0][1] >= 0

    with pytest.raises(TaskDeferred) as deferred:
        HungTransactionSensor(task_id="watch", topics=[f"absent-{unique}"], pipelines=[str(path)], older_than_s=0,
                              healthy_for_s=3, poll_interval_s=1).execute({})
    with pytest.raises(BrokerError, match=f"topic 'absent-{unique}' does not exist"):
        _events(deferred.value.trigger)


def test_a_look_the_cluster_does_not_answer_is_tried_again_then_reported(kafka_settings, kafka_connection, free_ports,
                                                                         monkeypatch, unique):
    """Found by the soak: one look timed out while a partition's leader was down, and the trigger's
    exception failed the watchdog with Airflow's bare "Trigger failure". A look the cluster does not
    answer is now tried again at the next poll; only looks failing for unreachable_after_s in a row
    end the watch, with an event that names the error."""
    import os

    from kafka_eos.errors import BrokerError
    from kafka_eos.health import detect
    from kafka_eos_airflow.triggers.kafka import HungTransactionTrigger, cluster_away

    topic = f"watched-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    live = os.environ["AIRFLOW_CONN_KAFKA_EOS_KAFKA"]
    away = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": f"127.0.0.1:{free_ports(1)}"}})
    monkeypatch.setattr(detect, "ADMIN_TIMEOUT_S", 2.0)  # a look at nobody fails in 2 s, not 30

    # Nobody answers: looks fail, are tried again, and after unreachable_after_s the watch ends.
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", away)
    trigger = HungTransactionTrigger([topic], kafka_connection, older_than_s=60, healthy_for_s=1,
                                     poll_interval_s=0.2, unreachable_after_s=3)
    event = _events(trigger)[0].payload
    assert event["status"] == "unreachable" and event["failing_s"] >= 3, event
    assert "transport" in event["error"].lower() or "timed out" in event["error"].lower(), event

    from kafka_eos_airflow.sensors.kafka import HungTransactionSensor

    sensor = HungTransactionSensor(task_id="hung_transactions", topics=[topic], kafka_conn_id=kafka_connection)
    with pytest.raises(Exception, match=r"(?i)^hung_transactions: the cluster of connection 'kafka_eos_kafka' did not "
                                        r"answer for \d+s; no partition could be checked: .*(transport|timed out)"):
        sensor.execute_complete({}, event)

    # The cluster answers again after a failed look: the watch goes on and ends healthy.
    looks: list[str] = []
    real_look = HungTransactionTrigger.look

    def look(self, previous):
        try:
            return real_look(self, previous)
        except Exception as exc:
            looks.append(type(exc).__name__)
            os.environ["AIRFLOW_CONN_KAFKA_EOS_KAFKA"] = live  # the cluster is back for the next look
            raise

    monkeypatch.setattr(HungTransactionTrigger, "look", look)
    event = _events(HungTransactionTrigger([topic], kafka_connection, older_than_s=60, healthy_for_s=1,
                                           poll_interval_s=0.2, unreachable_after_s=60))[0].payload
    assert looks and (event["status"], event["partitions"]) == ("healthy", 1), (looks, event)

    # What is no sign of the cluster being away still ends the watch at once, as it is.
    assert not cluster_away(BrokerError(f"topic {topic!r} does not exist"))
