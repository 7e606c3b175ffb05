"""The abort runbook in real Airflow runs (``dag.test()`` with a run conf, as the UI's trigger
form sends it) over a real hung transaction: dry run, refusals, the real abort and its audit."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.parse
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.readers import read_committed
from test_backfill import _wait

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


def _run_ended(airflow, run_id: str) -> dict | None:
    quoted = urllib.parse.quote(run_id, safe="")
    run = airflow.api("GET", f"/api/v2/dags/{RUNBOOK}/dagRuns/{quoted}")
    if run["state"] not in ("success", "failed"):
        return None
    tis = airflow.api("GET", f"/api/v2/dags/{RUNBOOK}/dagRuns/{quoted}/taskInstances")["task_instances"]
    return {t["task_id"]: t["state"] for t in tis}


def _awaiting_approval(airflow, run_id: str) -> dict | None:
    """The approval step's Human-in-the-loop request, once it waits for an answer."""
    path = f"/api/v2/dags/{RUNBOOK}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/approve"
    if airflow.api("GET", path)["state"] not in ("awaiting_input", "deferred"):
        return None
    return airflow.api("GET", f"{path}/-1/hitlDetails")


def test_a_strangers_transaction_is_aborted_only_after_an_approval_given_in_airflow(
        airflow_deployment, kafka_settings, killed_transaction, unique):
    """In a real deployment: the abort of a transaction that is no pipeline's own waits in Airflow's
    Human-in-the-loop view, showing the dry run's finding. Rejected through the REST API: nothing is
    aborted (and the rejection is audited); approved: it is aborted, naming who approved."""
    airflow = airflow_deployment
    (airflow.dags_folder / "kafka_eos_runbooks.py").write_text((DAGS_DIR / "kafka_eos_runbooks.py").read_text())
    airflow.wait_for_dag(RUNBOOK)
    topic = f"stranger-held-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    txid = f"stranger-{unique}"
    killed_transaction(txid, (topic, 0))
    conf = {"topic": topic, "partition": 0, "start_offset": 0, "dry_run": False, "force": True,
            "confirm": f"ABORT {topic}-0@0"}

    def lso() -> int:
        return kafka_admin.partition_offsets(kafka_settings, [(topic, 0)])[(topic, 0)].lso

    for answer in ("Reject", "Approve"):
        run_id = airflow.api("POST", f"/api/v2/dags/{RUNBOOK}/dagRuns",
                             {"logical_date": None, "conf": conf})["dag_run_id"]
        request = _wait("the approval request", lambda: _awaiting_approval(airflow, run_id))
        assert request["options"] == ["Approve", "Reject"] and request["subject"].startswith(
            f"Abort the transaction at {topic}-0@0 (producer ")
        body = request["body"]
        assert f"transactional.id `{txid}`" in body and f"partitions held: `{topic}-0`" in body
        assert "coordinator: broker `1`" in body and "no known pipeline's own" in body
        assert lso() == 0  # waiting: nothing changed
        airflow.api("PATCH", f"/api/v2/dags/{RUNBOOK}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
                             f"approve/-1/hitlDetails", {"chosen_options": [answer]})
        states = _wait("the runbook's run", lambda: _run_ended(airflow, run_id))
        audit = [json.loads(m.value) for m in read_committed(kafka_settings, AUDIT_TOPIC)
                 if json.loads(m.value).get("topic") == topic]
        if answer == "Reject":
            assert states == {"inspect": "success", "approve": "success", "abort_transaction": "skipped"}
            assert lso() == 0  # nothing aborted
            assert [(r["outcome"], r["who"]) for r in audit] == [("rejected", "admin")]
        else:
            assert states == {"inspect": "success", "approve": "success", "abort_transaction": "success"}
            assert lso() > 0  # the partition is free again
            assert [r["outcome"] for r in audit] == ["rejected", "aborted"]
            assert audit[-1]["who"] == "admin (approved by admin)"
            assert audit[-1]["transaction"]["transactional_id"] == txid
