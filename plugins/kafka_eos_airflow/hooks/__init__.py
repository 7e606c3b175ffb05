"""The provider's hooks: :mod:`.kafka` (a Kafka connection -> kafka-eos's settings and clients)."""

from kafka_eos_airflow._moved import moved

#: Names imported from ``kafka_eos_airflow.hooks`` before the provider's layout: in kafka_eos_airflow.hooks.kafka now.
__getattr__ = moved(__name__, "kafka_eos_airflow.hooks.kafka", ("kafka",))
