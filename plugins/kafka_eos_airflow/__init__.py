"""Airflow integration of kafka-eos, an Airflow provider: a hook (Connection ->
:class:`kafka_eos.settings.KafkaSettings`), thin operators, sensors and triggers that call the
library, notifiers, the DAG factory (:mod:`kafka_eos_airflow.dag_factory`) and the operator page's
plugin. Nothing here holds Kafka or Spark logic.

Airflow finds it through the ``apache_airflow_provider`` entry point (:func:`get_provider_info`):
``airflow providers list`` shows it, and its plugin loads without a file in the plugins folder.
"""

from __future__ import annotations

from typing import Any

from kafka_eos import __version__
from kafka_eos_airflow.config import PROVIDER_CONFIG


def get_provider_info() -> dict[str, Any]:
    """The provider's description for Airflow's ProvidersManager (read without importing Airflow)."""
    return {
        "package-name": "kafka-eos",
        "name": "kafka-eos",
        "description": "Exactly-once Kafka -> Spark pipelines: explicit offset ranges of committed records, "
                       "transactional writes, offset checkpoints in Kafka, hung-transaction detection.",
        "versions": [__version__],
        "integrations": [{
            "integration-name": "kafka-eos",
            "external-doc-url": "https://kafka.apache.org/documentation/#semantics",
            "tags": ["apache"],
        }],
        "operators": [{"integration-name": "kafka-eos", "python-modules": [
            "kafka_eos_airflow.operators.pipeline", "kafka_eos_airflow.operators.checks", "kafka_eos_airflow.operators.runbook",
            "kafka_eos_airflow.operators.stream"]}],
        "sensors": [{"integration-name": "kafka-eos", "python-modules": ["kafka_eos_airflow.sensors.kafka"]}],
        "hooks": [{"integration-name": "kafka-eos", "python-modules": ["kafka_eos_airflow.hooks.kafka"]}],
        "triggers": [{"integration-name": "kafka-eos", "python-modules": ["kafka_eos_airflow.triggers.kafka"]}],
        # The connections are of the types their providers register (kafka: apache-kafka, spark:
        # apache-spark, http, smtp); kafka-eos adds none of its own.
        "notifications": ["kafka_eos_airflow.notifications.alerts.KafkaEosWebhookNotifier",
                          "kafka_eos_airflow.notifications.alerts.KafkaEosEmailNotifier"],
        "plugins": [{"name": "kafka_eos", "plugin-class": "kafka_eos_airflow.plugins.plugin.KafkaEosPlugin"}],
        # [kafka_eos]: `airflow config list` shows it, AIRFLOW__KAFKA_EOS__* sets it.
        "config": PROVIDER_CONFIG,
    }
