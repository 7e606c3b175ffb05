"""Runbooks: DAGs an operator triggers from the UI to fix what an alert reported
(``kafka_eos_runbook_abort_transaction``, ``kafka_eos_airflow.dag_factory.runbook_dag``).

DAG wiring only: the operator lives in plugins/kafka_eos_airflow/operators/runbook.py.
"""

from __future__ import annotations

from kafka_eos_airflow.dag_factory import runbook_dag

dag = runbook_dag()
