"""kafka-eos's configuration in Airflow: the ``[kafka_eos]`` section.

Declared in the provider's ``get_provider_info()["config"]`` (:data:`OPTIONS`), so ``airflow config
list`` shows it with its defaults and ``AIRFLOW__KAFKA_EOS__<OPTION>`` sets it like any Airflow
option. The DAG factory, the operators, the triggers, the operator page and the runbook read it
here; the ``kafka-eos`` command outside Airflow keeps its environment variables
(docs/configuration.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kafka_eos.paths import pipelines_dir

SECTION = "kafka_eos"

#: The section's options, as Airflow's provider config schema wants them (string defaults).
OPTIONS: dict[str, dict[str, Any]] = {
    "pipelines_folder": {
        "description": "The folder of the pipeline specs (*.yaml): the DAG factory's default, and what the "
                       "operator page, the runbook and the owner check (no two pipelines share a consumer "
                       "group) read. Empty: $KAFKA_EOS_PIPELINES_DIR, else ./pipelines.\n",
        "version_added": "0.2.0", "type": "string", "example": "/opt/airflow/pipelines", "default": "",
    },
    "kafka_conn_id": {
        "description": "The Airflow connection of the Kafka cluster, of type kafka (the format of "
                       "apache-airflow-providers-apache-kafka: bootstrap.servers and client settings in the "
                       "extra JSON). Set it to kafka_default to share that provider's connection. A connection "
                       "named here that does not exist fails the task, naming it.\n",
        "version_added": "0.2.0", "type": "string", "example": "kafka_default", "default": "kafka_eos_kafka",
    },
    "schema_registry_conn_id": {
        "description": "The Airflow connection of the Schema Registry that pipelines with source.format or "
                       "sink.format avro, protobuf or json_schema use: type http, host (with scheme, and the "
                       "API's path, e.g. /apis/ccompat/v7 for Apicurio), port, login and password for basic "
                       "auth, and in extra the client's TLS settings (ssl.ca.location, ssl.certificate.location, "
                       "ssl.key.location). Not defined: such pipelines fail, naming it.\n",
        "version_added": "0.3.0", "type": "string", "example": "schema_registry",
        "default": "kafka_eos_schema_registry",
    },
    "spark_conn_id": {
        "description": "The Airflow connection spark-submit uses (type spark: master, deploy mode, queue), or "
                       "a spark_connect connection for Spark Connect runs.\n",
        "version_added": "0.2.0", "type": "string", "example": "spark_yarn", "default": "spark_default",
    },
    "local_broker_fallback": {
        "description": "Where the Kafka connection is not defined, use $KAFKA_BOOTSTRAP_SERVERS or the "
                       "embedded local broker (127.0.0.1:19092) instead of failing. `kafka-eos airflow start` "
                       "and the demo turn it on; leave it off in a deployment.\n",
        "version_added": "0.2.0", "type": "boolean", "example": None, "default": "False",
    },
    "deadlines": {
        "description": "Give each pipeline DAG whose spec sets source.freshness_limit_s an Airflow "
                       "DeadlineAlert: a run not finished that long after it was queued alerts through the "
                       "notifiers (the DAG factory's deadlines and deadline_notifiers options). Off by default: "
                       "Airflow 3.3's `airflow dags test` (dag.test()) fails on a DAG that has a deadline.\n",
        "version_added": "0.3.0", "type": "boolean", "example": None, "default": "False",
    },
    "dag_id_prefixes": {
        "description": "The dag_id_prefix values the DAG factory is called with over the pipelines folder "
                       "(comma-separated; the empty prefix is always one): the operator page shows a user a "
                       "pipeline when one of its DAGs, <prefix>kafka_eos__<name> or "
                       "<prefix>kafka_eos_stream__<name>, is one they may read, and links to it.\n",
        "version_added": "0.3.0", "type": "string", "example": "payments__,team_c__", "default": "",
    },
    "page_cache_seconds": {
        "description": "How long the operator page (Browse > Kafka pipelines) reuses one read of the "
                       "cluster.\n",
        "version_added": "0.2.0", "type": "float", "example": None, "default": "5",
    },
}

#: What :func:`kafka_eos_airflow.get_provider_info` returns under ``config``.
PROVIDER_CONFIG = {SECTION: {"description": "kafka-eos: exactly-once Kafka -> Spark pipelines.\n",
                             "options": OPTIONS}}


def _get(option: str) -> str:
    from airflow.configuration import conf

    return conf.get(SECTION, option, fallback=OPTIONS[option]["default"])


def pipelines_folder() -> Path:
    """``[kafka_eos] pipelines_folder``; empty: :func:`kafka_eos.paths.pipelines_dir` (its
    environment variable, else ./pipelines)."""
    return Path(_get("pipelines_folder").strip() or pipelines_dir())


def kafka_conn_id() -> str:
    """``[kafka_eos] kafka_conn_id``."""
    return _get("kafka_conn_id") or OPTIONS["kafka_conn_id"]["default"]


def schema_registry_conn_id() -> str:
    """``[kafka_eos] schema_registry_conn_id``: the Schema Registry's connection (type http)."""
    return _get("schema_registry_conn_id") or OPTIONS["schema_registry_conn_id"]["default"]


def spark_conn_id() -> str:
    """``[kafka_eos] spark_conn_id``."""
    return _get("spark_conn_id") or OPTIONS["spark_conn_id"]["default"]


def _flag(option: str) -> bool:
    return _get(option).strip().lower() in ("true", "1", "t", "yes", "on")


def local_broker_fallback() -> bool:
    """``[kafka_eos] local_broker_fallback``."""
    return _flag("local_broker_fallback")


def deadlines() -> bool:
    """``[kafka_eos] deadlines``."""
    return _flag("deadlines")


def dag_id_prefixes() -> list[str]:
    """``[kafka_eos] dag_id_prefixes``, the empty prefix first."""
    return ["", *(p.strip() for p in _get("dag_id_prefixes").split(",") if p.strip())]


def page_cache_seconds() -> float:
    """``[kafka_eos] page_cache_seconds``."""
    return float(_get("page_cache_seconds"))
