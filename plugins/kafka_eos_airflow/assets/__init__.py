"""The provider's assets: :mod:`.kafka` (a pipeline's source topics and sink)."""

from kafka_eos_airflow._moved import moved

#: Names imported from ``kafka_eos_airflow.assets`` before the provider's layout: in kafka_eos_airflow.assets.kafka now.
__getattr__ = moved(__name__, "kafka_eos_airflow.assets.kafka", ("kafka",))
