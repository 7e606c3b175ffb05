"""kafka-eos's Airflow plugin: the operator page's FastAPI app mounted at ``/kafka-eos`` and a "Kafka
pipelines" entry in the UI's navigation that shows it (kafka_eos_airflow.plugins.operator_page). Airflow
loads it through the package's ``airflow.plugins`` entry point (and, with lazy provider discovery
off, through ``get_provider_info``'s ``plugins``): installing the package is enough, no file goes
into the plugins folder."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from kafka_eos_airflow.plugins.operator_page import URL_PREFIX, app


class KafkaEosPlugin(AirflowPlugin):
    name = "kafka_eos"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Kafka pipelines"}]
    # Shown in the UI at /plugin/kafka-pipelines, the page embedded under Airflow's navigation.
    external_views = [{"name": "Kafka pipelines", "href": f"{URL_PREFIX}/", "url_route": "kafka-pipelines",
                       "destination": "nav", "category": "browse"}]
