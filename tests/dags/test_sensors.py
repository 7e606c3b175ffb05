"""The hung-transaction sensor in real Airflow runs (``dag.test()``, its trigger run in line),
over a real hung transaction and over healthy partitions; its trigger serializes and only reads.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin

pytestmark = pytest.mark.integration


def _events(trigger) -> list:
    async def first():
        async for event in trigger.run():
            return event

    return [asyncio.run(first())]


def test_the_trigger_serializes_and_only_reads(kafka_settings, killed_transaction, monkeypatch, unique):
    from kafka_eos_airflow.triggers import HungTransactionTrigger

    topic = f"held-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    killed_transaction(f"stranger-{unique}", (topic, 0))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": kafka_settings.bootstrap_servers}}))
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
from kafka_eos_airflow.sensors import HungTransactionSensor

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    HungTransactionSensor(task_id="watch", topics={topics!r}, older_than_s={older_than_s}, healthy_for_s=3,
                          poll_interval_s=1, retries=0)
'''


def run_sensor_dag(dag_id: str, topics: list[str], older_than_s: float):
    """``dag.test()`` of a one-sensor DAG, written to the tests' dags folder (dag.test re-parses it)."""
    path = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{dag_id}.py"
    path.write_text(SENSOR_DAG.format(dag_id=dag_id, topics=topics, older_than_s=older_than_s))
    module_spec = importlib.util.spec_from_file_location(dag_id, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    dag_run = module.dag.test()
    return {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def test_the_sensor_fails_naming_the_culprit_and_passes_on_healthy_partitions(
        airflow_db, kafka_settings, killed_transaction, monkeypatch, capfd, unique):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": kafka_settings.bootstrap_servers}}))
    held, healthy = f"held-{unique}", f"healthy-{unique}"
    kafka_admin.create_topics(kafka_settings, {held: 2, healthy: 2})
    producer = Producer(kafka_settings.client_config())
    for topic in (held, healthy):
        producer.produce(topic, value=b"committed", partition=1)
    assert producer.flush(30) == 0
    killed_transaction(f"stranger-{unique}", (held, 1))

    assert run_sensor_dag(f"sensor_healthy_{unique.replace('-', '_')}", [healthy], 1) == {"watch": "success"}
    assert run_sensor_dag(f"sensor_held_{unique.replace('-', '_')}", [held, healthy], 1) == {"watch": "failed"}
    out, err = capfd.readouterr()  # the task's log
    log = out + err
    assert (f"1 partition(s) held by an open transaction for longer than 1s (read_committed readers stop there): "
            f"{held}-1: LSO 1 < HW 2 (1 offsets waiting), held for ") in log
    assert f"transactional.id stranger-{unique}, long-running; abort: kafka-eos txn abort --topic {held} " \
           "--partition 1 --start-offset 1" in log
