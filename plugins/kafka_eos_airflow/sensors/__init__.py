"""The provider's sensors: :mod:`.kafka` (hung transactions, committed data waiting)."""

from kafka_eos_airflow._moved import moved

#: Names imported from ``kafka_eos_airflow.sensors`` before the provider's layout: in kafka_eos_airflow.sensors.kafka now.
__getattr__ = moved(__name__, "kafka_eos_airflow.sensors.kafka", ("kafka",))
