"""The Airflow Connection of a Kafka cluster, turned into kafka-eos settings.

The connection is the Kafka provider's type (``kafka``): its extra is a librdkafka config dict, so
one connection (e.g. apache-airflow-providers-apache-kafka's ``kafka_default``) serves both
providers. Which connection: ``[kafka_eos] kafka_conn_id`` (:mod:`kafka_eos_airflow.config`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from airflow.sdk import BaseHook, Connection
from airflow.sdk.log import mask_secret
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from kafka_eos.errors import KafkaEosError
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.local.registry import LocalRegistry
from kafka_eos.settings import CALLBACK_KEYS, MSK_IAM_CALLBACK, KafkaSettings, RegistrySettings
from kafka_eos.spec import PipelineSpec
from kafka_eos_airflow import config

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

log = logging.getLogger(__name__)

#: The librdkafka key that names the cluster; every other extra key is passed through.
BOOTSTRAP_KEY = "bootstrap.servers"
#: Settings of one consumer application that a shared connection may carry (the Kafka provider's
#: form suggests a ``group.id``): kafka-eos sets its own per client (the pipeline's group,
#: read_committed, no auto commit), so they are left out rather than let near its checkpoints.
APPLICATION_KEYS = ("group.id", "group.instance.id", "enable.auto.commit", "enable.auto.offset.store",
                    "auto.offset.reset", "isolation.level", "transactional.id", "enable.idempotence")


class ConnectionNotDefined(AirflowFailException, AirflowNotFoundException):
    """The named Kafka connection does not exist: the task fails at once (a retry finds it missing
    too), naming it."""


def _setting(value: Any) -> str:
    """A JSON value as librdkafka reads it (``true``, not Python's ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_from_connection(conn: Connection) -> KafkaSettings:
    """Kafka settings from a ``kafka`` Connection, as the Kafka provider's ``KafkaBaseHook`` builds
    its config (apache-airflow-providers-apache-kafka: the extra as librdkafka settings, callbacks
    named by dotted path resolved only when ``[apache_kafka] callback_allowlist`` lists them, Amazon
    MSK IAM's token callback added for an MSK cluster with ``sasl.mechanism`` OAUTHBEARER).

    ``extra`` holds ``bootstrap.servers`` and every other setting, secrets included
    (``sasl.password``, ``sasl.oauthbearer.client.secret``: the provider's form shows only the
    extra, and Airflow masks these keys' values in logs). Callbacks stay dotted paths in the
    settings, so that every process of a run (Spark's driver and executors, the stream's child
    process) calls the same one: ``oauth_cb`` logs in every client kind (:mod:`kafka_eos.oauth`),
    ``error_cb``/``throttle_cb``/``stats_cb`` serve the confluent-kafka clients. A connection's
    login and password, where set, still become ``sasl.username`` and ``sasl.password``.

    :raises AirflowException: no ``bootstrap.servers``; a callback the allowlist does not list, or
        one no process but this one could call; naming the connection.
    """
    extra: dict[str, Any] = dict(conn.extra_dejson)
    servers = extra.pop(BOOTSTRAP_KEY, None)
    if not servers:
        raise AirflowException(
            f"connection {conn.conn_id!r}: extra has no {BOOTSTRAP_KEY!r} "
            f'(e.g. {{"{BOOTSTRAP_KEY}": "broker-1:9092"}})')
    odd = sorted(k for k in CALLBACK_KEYS if k in extra and not isinstance(extra[k], str))
    if odd:
        raise AirflowException(f"connection {conn.conn_id!r}: extra's {', '.join(odd)}: not a dotted path (a string)")
    if extra.get("sasl.oauthbearer.config"):
        # The token callback's argument may hold a secret; its key names none, so Airflow does
        # not mask it by itself.
        mask_secret(str(extra["sasl.oauthbearer.config"]))
    config = _provider_config(conn)
    for key in CALLBACK_KEYS:
        if key in config and key not in extra:
            # Added by the provider's hook, not named in the extra: a managed cluster's token.
            extra.update(_named_callback(conn.conn_id, key, config[key]))
    left_out = sorted(k for k in extra if k in APPLICATION_KEYS)
    if left_out:
        log.info("connection %r: leaving out %s (kafka-eos sets these per client)", conn.conn_id, ", ".join(left_out))
    if conn.login:
        extra["sasl.username"] = conn.login
    if conn.password:
        extra["sasl.password"] = conn.password
    try:
        return KafkaSettings(bootstrap_servers=str(servers),
                             extra={str(k): _setting(v) for k, v in extra.items() if k not in APPLICATION_KEYS})
    except KafkaEosError as exc:
        raise AirflowException(f"connection {conn.conn_id!r}: {exc}") from None


def _provider_config(conn: Connection) -> dict[str, Any]:
    """The Kafka provider's config of ``conn`` (``KafkaBaseHook._build_config``: the allowlist
    check, the managed clusters' token callbacks). Imported here, not at the top: the provider's
    hook module loads confluent-kafka, which DAG parsing must not.

    :raises AirflowException: no ``bootstrap.servers``, a callback not allowlisted, naming ``conn``.
    """
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

    class _OfConnection(KafkaBaseHook):
        def get_connection(self, conn_id: str) -> Connection:  # the connection in hand, not looked up again
            return conn

    try:
        return _OfConnection(kafka_config_id=conn.conn_id)._build_config()
    except (ValueError, ImportError) as exc:  # not allowlisted; allowlisted but not importable here
        raise AirflowException(f"connection {conn.conn_id!r}: {exc}") from None


def _named_callback(conn_id: str, key: str, callback: Any) -> dict[str, str]:
    """The dotted path (and its argument) of a callback the Kafka provider's hook added, which
    Spark's processes can call too.

    :raises AirflowException: one they cannot (a method of an Airflow hook: Google Managed Kafka's).
    """
    target = getattr(callback, "func", None)
    if key == "oauth_cb" and getattr(target, "__name__", "") == "_msk_iam_oauth_cb" and callback.args:
        return {"oauth_cb": MSK_IAM_CALLBACK, "sasl.oauthbearer.config": f"region={callback.args[0]}"}
    raise AirflowException(
        f"connection {conn_id!r}: the Kafka provider adds {key}={callback!r}, which only this process can call "
        "(Spark's driver and executors cannot); set extra's oauth_cb to a callback of your own, listed in "
        "[apache_kafka] callback_allowlist, that gets the token where it runs")


#: The client settings a registry connection's extra may hold (confluent-kafka's SchemaRegistryClient names).
REGISTRY_EXTRA_KEYS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
                       "bearer.auth.credentials.source", "bearer.auth.token", "bearer.auth.logical.cluster",
                       "bearer.auth.identity.pool.id")


def registry_from_connection(conn: Connection) -> RegistrySettings:
    """Schema Registry settings from an ``http`` Connection: its URL from schema, host, port and
    path (``https://registry:8081``, ``http://apicurio:8080/apis/ccompat/v7``), basic auth from
    login and password, TLS files from the extra.

    :raises AirflowException: no host, or an extra key the registry client does not take.
    """
    if not conn.host:
        raise AirflowException(f"connection {conn.conn_id!r}: no host (the Schema Registry's address)")
    host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
    scheme, _, rest = host.partition("://")
    address, slash, path = rest.partition("/")
    url = f"{scheme}://{address}{f':{conn.port}' if conn.port and ':' not in address else ''}{slash}{path}"
    extra = dict(conn.extra_dejson)
    unknown = sorted(k for k in extra if k not in REGISTRY_EXTRA_KEYS)
    if unknown:
        raise AirflowException(f"connection {conn.conn_id!r}: extra {', '.join(unknown)}: not a Schema Registry client "
                               f"setting (known: {', '.join(REGISTRY_EXTRA_KEYS)})")
    if conn.login:
        extra["basic.auth.user.info"] = f"{conn.login}:{conn.password or ''}"
    return RegistrySettings(url.rstrip("/"), {str(k): _setting(v) for k, v in extra.items()})


class KafkaEosHook(BaseHook):
    """Reads a ``kafka`` Connection into :class:`~kafka_eos.settings.KafkaSettings`.

    A connection that does not exist is an error naming it. Only where ``[kafka_eos]
    local_broker_fallback`` is on (``kafka-eos airflow start``, the demo) do the settings then come
    from the environment like the CLI's: ``KAFKA_BOOTSTRAP_SERVERS`` (and ``KAFKA_EOS_CLIENT_CONFIG``),
    else the embedded local broker of ``kafka-eos kafka start`` (127.0.0.1:19092).

    :param kafka_conn_id: the Airflow connection id; None: ``[kafka_eos] kafka_conn_id`` (default
        ``kafka_eos_kafka``).
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "kafka_eos_kafka"
    conn_type = "kafka"
    hook_name = "kafka-eos (Apache Kafka)"

    def __init__(self, kafka_conn_id: str | None = None) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def get_settings(self, registry: bool = False) -> KafkaSettings:
        """The settings of the connection (or, with the fallback on and no connection, of the
        environment / embedded local broker).

        :param registry: with the Schema Registry (:meth:`get_registry`): what a task that runs a
            pipeline's Spark work needs; the looks at offsets (sensors, triggers, the page) do not.

        :raises ConnectionNotDefined: no such connection (and no fallback), naming it.
        :raises AirflowException: the connection exists but has no ``bootstrap.servers``.
        :raises KafkaEosError: the fallback's ``KAFKA_EOS_CLIENT_CONFIG`` is not a JSON object.
        """
        settings = self._kafka_settings()
        return dataclasses.replace(settings, schema_registry=self.get_registry()) if registry else settings

    def get_registry(self) -> RegistrySettings | None:
        """The Schema Registry of ``[kafka_eos] schema_registry_conn_id``; where it is not defined,
        with the local fallback on, ``$KAFKA_EOS_SCHEMA_REGISTRY_URL`` or the embedded registry of
        ``kafka-eos registry start``; else None (a pipeline that needs one fails, saying so)."""
        try:
            conn = self.get_connection(config.schema_registry_conn_id())
        except AirflowNotFoundException:
            if not config.local_broker_fallback():
                return None

            return RegistrySettings.from_environ(os.environ, LocalRegistry.default().url)
        return registry_from_connection(conn)

    def _kafka_settings(self) -> KafkaSettings:
        try:
            conn = self.get_connection(self.kafka_conn_id)
        except AirflowNotFoundException:
            if not config.local_broker_fallback():
                raise ConnectionNotDefined(
                    f"Kafka connection {self.kafka_conn_id!r} is not defined: define it (type kafka, extra "
                    f'{{"{BOOTSTRAP_KEY}": "broker-1:9092", ...}}) or set [kafka_eos] kafka_conn_id to the one '
                    "you have (e.g. kafka_default)") from None
            settings = KafkaSettings.from_environ(os.environ, default_bootstrap=LocalBroker.default().bootstrap)
            self.log.info("No connection %r: using Kafka at %s (KAFKA_BOOTSTRAP_SERVERS or the embedded "
                          "local broker; [kafka_eos] local_broker_fallback is on)", self.kafka_conn_id,
                          settings.bootstrap_servers)
            return settings
        return settings_from_connection(conn)

    def get_checked_settings(self, registry: bool = False) -> KafkaSettings:
        """:meth:`get_settings`, after checking that the cluster answers within the connect
        timeout (``KAFKA_EOS_CONNECT_TIMEOUT_S``, 10 s by default).

        :raises BrokerUnreachable: one line naming the bootstrap servers and the connection error.
        """
        from kafka_eos.kafka_admin import check_reachable

        settings = self.get_settings(registry)
        check_reachable(settings)
        return settings

    def get_pipeline_settings(self, spec: PipelineSpec, registry: bool = False) -> KafkaSettings:
        """:meth:`get_checked_settings` for one pipeline: with a SQL sink's database resolved from
        its Airflow connection (``sink.conn_id``), which the settings then carry to a Spark
        process in a file of the task's own. A connection that is not defined is an error naming
        it; only where ``[kafka_eos] local_broker_fallback`` is on does the spec's ``sink.url``
        stand in for it.

        :raises SpecError: the connection is not defined, or is not a database's.
        """
        return self.with_database(self.get_checked_settings(registry), spec)

    @staticmethod
    def with_database(settings: KafkaSettings, spec: PipelineSpec) -> KafkaSettings:
        """``settings`` with ``spec``'s SQL database resolved (see :meth:`get_pipeline_settings`):
        resolved once, here, and carried to the task's Spark process, so that every process of a
        run writes and reads the same database."""
        if spec.sink.about.transactional:
            return settings
        # SQLAlchemy and the Kafka clients (sql_store): not at DAG parse time, see the top.
        from kafka_eos.sinks.sql_store import database_url

        url = database_url(spec, settings, fallback=config.local_broker_fallback())
        return dataclasses.replace(settings, database_url=url)

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's connection test: does the cluster answer?"""
        try:
            settings = self.get_checked_settings()
        except Exception as exc:  # noqa: BLE001 - the UI shows the message, whatever failed
            return False, str(exc)
        return True, f"Kafka at {settings.bootstrap_servers} answers"
