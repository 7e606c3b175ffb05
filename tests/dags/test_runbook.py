"""The abort runbook in real Airflow runs (``dag.test()`` with a run conf, as the UI's trigger
form sends it) over a real hung transaction: dry run, refusals, the real abort and its audit."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.readers import read_committed

pytestmark = pytest.mark.integration

RUNBOOK = "kafka_eos_runbook_abort_transaction"
DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture
def runbook(airflow_db, kafka_connection):
    """``runbook(**conf)``: one ``dag.test()`` run of the project's runbook DAG; returns (state, its
    return value)."""
    # dag.test() re-parses the DAG's bundle: the project's DAG file goes into the tests' dags folder.
    bundle = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "kafka_eos_runbooks.py"
    bundle.write_text((DAGS_DIR / "kafka_eos_runbooks.py").read_text())
    module_spec = importlib.util.spec_from_file_location("kafka_eos_runbooks_under_test", bundle)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    dag = module.dag

    def run(**conf):
        """(the tasks' states, what the task that went furthest returned)."""
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        dag_run = dag.test(run_conf=conf)
        states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
        with create_session() as session:
            rows = {task_id: session.scalars(XComModel.get_many(
                run_id=dag_run.run_id, dag_ids=RUNBOOK, task_ids=task_id, key="return_value")).first()
                for task_id in ("inspect", "approve", "abort_transaction")}
        returned = {k: XComModel.deserialize_value(r) for k, r in rows.items() if r is not None}
        return states, returned

    return run


def test_the_runbook_dry_runs_refuses_then_aborts_its_pipelines_own_and_audits(
        runbook, kafka_settings, killed_transaction, tmp_path, monkeypatch, unique):
    import yaml

    from kafka_eos.spec import load_spec

    topic = f"held-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 2})
    producer = Producer(kafka_settings.client_config())
    producer.produce(topic, value=b"before", partition=1)
    assert producer.flush(30) == 0
    # The transaction is a known pipeline's own (its transactional.id): no approval is asked for it.
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "own.yaml").write_text(yaml.safe_dump({"name": f"own-{unique}", "source": {"topics": [topic]},
                                                    "sink": {"kind": "kafka", "topic": f"out-{unique}"}}))
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__PIPELINES_FOLDER", str(folder))
    txid = load_spec(str(folder / "own.yaml"), import_transform=False).transactional_id()
    killed_transaction(txid, (topic, 1))
    producer.produce(topic, value=b"behind", partition=1)
    assert producer.flush(30) == 0

    def lso():
        return kafka_admin.partition_offsets(kafka_settings, [(topic, 1)])[(topic, 1)].lso

    target = {"topic": topic, "partition": 1, "start_offset": 1}
    refused = {"inspect": "failed", "approve": "upstream_failed", "abort_transaction": "upstream_failed"}
    # The transaction is seconds old: a dry run says it would be refused, a forced one says how.
    states, returned = runbook(**target)  # dry_run is on by default
    assert states == refused and returned == {}
    states, returned = runbook(**target, force=True)
    assert states == {"inspect": "success", "approve": "skipped", "abort_transaction": "skipped"}
    result = returned["inspect"]
    assert result["dry_run"] is True and result["needs_approval"] is False
    assert (result["transaction"]["transactional_id"], result["transaction"]["start_offset"],
            result["transaction"]["pipeline"], result["transaction"]["partitions"]) == (txid, 1, f"own-{unique}",
                                                                                     [f"{topic}-1"])
    assert (result["guard"]["method"], result["guard"]["forced"], result["guard"]["threshold_s"]) == ("fence", True, 900)
    assert lso() == 1

    # Refused, nothing changed: no confirmation, a wrong one, a wrong offset, a wrong partition, too young.
    assert runbook(**target, dry_run=False, force=True)[0] == refused
    assert runbook(**target, dry_run=False, force=True, confirm=f"ABORT {topic}-1@2")[0] == refused
    assert runbook(**{**target, "start_offset": 2}, dry_run=False, force=True, confirm=f"ABORT {topic}-1@2")[0] == refused
    assert runbook(**{**target, "partition": 0}, dry_run=False, force=True, confirm=f"ABORT {topic}-0@1")[0] == refused
    # force given: dag.test() keeps the DAG object, and a param left out keeps the last run's value.
    assert runbook(**target, dry_run=False, force=False, confirm=f"ABORT {topic}-1@1")[0] == refused
    assert lso() == 1

    # The pipeline's own transaction: approved without asking anyone, and aborted.
    states, returned = runbook(**target, dry_run=False, force=True, confirm=f"ABORT {topic}-1@1")
    assert states == {"inspect": "success", "approve": "success", "abort_transaction": "success"}
    assert returned["approve"] == {"approval": "not needed", "pipeline": f"own-{unique}"}
    result = returned["abort_transaction"]
    offsets = kafka_admin.partition_offsets(kafka_settings, [(topic, 1)])[(topic, 1)]
    assert offsets.lso == offsets.high_watermark == 4  # before, the aborted record, its marker, behind
    audit = [json.loads(m.value) for m in read_committed(kafka_settings, AUDIT_TOPIC)
             if json.loads(m.value).get("topic") == topic]
    # Every attempt past the dry runs is recorded, refused ones too.
    assert [(r["outcome"], r["partition"], r["start_offset"]) for r in audit] == [
        ("refused", 1, 1), ("refused", 1, 1), ("refused", 1, 2), ("refused", 0, 1), ("refused", 1, 1),
        ("aborted", 1, 1)]
    assert "under the abort threshold of 900s" in audit[4]["error"]
    record = audit[-1]
    assert record == result["audit"]
    assert (record["partition"], record["start_offset"], record["transaction"]["transactional_id"],
            record["before"], record["after"]["lso"]) == (1, 1, txid, {"lso": 1}, 4)
    assert all(r["via"].startswith(f"{RUNBOOK} run manual__") and r["who"] for r in audit)

