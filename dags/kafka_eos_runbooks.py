"""Runbooks: DAGs an operator triggers from the UI to fix what an alert reported.

``kafka_eos_runbook_abort_transaction``: abort the open transaction that holds a partition's LSO.
Fill in topic, partition and start offset from the alert (or `kafka-eos txn hanging`). The first
run is a dry run that shows the transaction and changes nothing; a real run needs `dry_run` off and
the typed confirmation `ABORT <topic>-<partition>@<start offset>`, checks that the LSO moved and
records who aborted what in the `kafka-eos.audit` topic.

DAG wiring only: the operator lives in plugins/kafka_eos_airflow/runbook.py.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG

from kafka_eos_airflow.notifiers import RUNBOOK_DAG_ID, failure_notifiers
from kafka_eos_airflow.runbook import PARAMS, AbortTransactionOperator

with DAG(
    dag_id=RUNBOOK_DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    default_args={"owner": "kafka-eos", "retries": 0, "on_failure_callback": failure_notifiers()},
    tags=["kafka-eos", "runbook"],
    doc_md=__doc__,
) as dag:
    # No retries: a refused or failed abort needs a person, not a second try.
    AbortTransactionOperator(task_id="abort_transaction")
