"""The provider's triggers (read-only, deferrable): :mod:`.kafka`."""

from kafka_eos_airflow._moved import moved

#: Names imported from ``kafka_eos_airflow.triggers`` before the provider's layout: in kafka_eos_airflow.triggers.kafka now.
__getattr__ = moved(__name__, "kafka_eos_airflow.triggers.kafka", ("kafka",))
