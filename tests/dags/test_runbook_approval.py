"""The abort runbook in a real Airflow deployment (scheduler, triggerer, API server): the abort of
a transaction that is no pipeline's own waits for a person's approval given in Airflow (its
Human-in-the-loop view, answered here through the REST API)."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from test_backfill import _wait
from test_runbook import DAGS_DIR, RUNBOOK

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.readers import read_committed

pytestmark = pytest.mark.integration


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
