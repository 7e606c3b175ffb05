"""The provider's operators: :mod:`.pipeline` (plan, Spark, verify), :mod:`.stream`, :mod:`.checks`
(freshness, checkpoint refresh), :mod:`.runbook` (inspect, approve, abort a hung transaction)."""

from kafka_eos_airflow._moved import moved

#: Names imported from ``kafka_eos_airflow.operators`` before the provider's layout: in kafka_eos_airflow.operators.pipeline now.
__getattr__ = moved(__name__, "kafka_eos_airflow.operators.pipeline", ("pipeline", "stream", "checks", "runbook"))
