"""Airflow integration of kafka-eos: a hook (Connection -> :class:`kafka_eos.settings.KafkaSettings`)
and thin operators that call the library. Airflow puts ``plugins/`` on ``sys.path``, so DAGs
import this package as ``kafka_eos_airflow``. Nothing here holds Kafka or Spark logic.
"""
