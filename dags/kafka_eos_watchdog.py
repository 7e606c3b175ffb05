"""The watchdog over the pipelines folder's specs, every 5 minutes: hung transactions, freshness,
checkpoint refresh (``kafka_eos_airflow.dag_factory.watchdog_dag``).

DAG wiring only: the sensor, checks and their read-only triggers live in plugins/kafka_eos_airflow/.
"""

from __future__ import annotations

from kafka_eos.spec import spec_paths
from kafka_eos_airflow.config import pipelines_folder
from kafka_eos_airflow.dag_factory import watchdog_dag

dag = watchdog_dag([str(p) for p in spec_paths(pipelines_folder())])
