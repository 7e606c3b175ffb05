"""The Airflow Connection of a Kafka cluster, turned into kafka-eos settings.

The connection is the Kafka provider's type (``kafka``): its extra is a librdkafka config dict.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from kafka_eos.local.kafka import LocalBroker
from kafka_eos.settings import KafkaSettings

#: The librdkafka key that names the cluster; every other extra key is passed through.
BOOTSTRAP_KEY = "bootstrap.servers"


def settings_from_connection(conn: Connection) -> KafkaSettings:
    """Kafka settings from a ``kafka`` Connection.

    ``extra`` holds ``bootstrap.servers`` (required) and any other librdkafka settings
    (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location`` ...). The connection's
    login and password, when set, become ``sasl.username`` and ``sasl.password`` (they win over
    the same keys in extra), so the secret can live in the password field.

    :raises AirflowException: the extra has no ``bootstrap.servers``.
    """
    extra: dict[str, Any] = dict(conn.extra_dejson)
    servers = extra.pop(BOOTSTRAP_KEY, None)
    if not servers:
        raise AirflowException(
            f"connection {conn.conn_id!r}: extra has no {BOOTSTRAP_KEY!r} "
            f'(e.g. {{"{BOOTSTRAP_KEY}": "broker-1:9092"}})')
    if conn.login:
        extra["sasl.username"] = conn.login
    if conn.password:
        extra["sasl.password"] = conn.password
    return KafkaSettings(bootstrap_servers=str(servers), extra={str(k): str(v) for k, v in extra.items()})


class KafkaEosHook(BaseHook):
    """Reads a ``kafka`` Connection into :class:`~kafka_eos.settings.KafkaSettings`.

    When the connection does not exist, the settings come from the environment like the CLI's:
    ``KAFKA_BOOTSTRAP_SERVERS`` (and ``KAFKA_EOS_CLIENT_CONFIG``), else the embedded default, the
    local single-node broker of ``kafka-eos kafka start`` (127.0.0.1:19092). That keeps a fresh
    checkout's DAGs runnable with no setup; production defines the connection.

    :param kafka_conn_id: the Airflow connection id (default ``kafka_eos_kafka``).
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "kafka_eos_kafka"
    conn_type = "kafka"
    hook_name = "kafka-eos (Apache Kafka)"

    def __init__(self, kafka_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.kafka_conn_id = kafka_conn_id

    def get_settings(self) -> KafkaSettings:
        """The settings of the connection, or of the environment / embedded default without one.

        :raises AirflowException: the connection exists but has no ``bootstrap.servers``.
        :raises KafkaEosError: no connection and ``KAFKA_EOS_CLIENT_CONFIG`` is not a JSON object.
        """
        try:
            conn = self.get_connection(self.kafka_conn_id)
        except AirflowNotFoundException:
            settings = KafkaSettings.from_environ(os.environ, default_bootstrap=LocalBroker.default().bootstrap)
            self.log.info("No connection %r: using Kafka at %s (KAFKA_BOOTSTRAP_SERVERS or the embedded "
                          "local broker)", self.kafka_conn_id, settings.bootstrap_servers)
            return settings
        return settings_from_connection(conn)

    def get_checked_settings(self) -> KafkaSettings:
        """:meth:`get_settings`, after checking that the cluster answers within the connect
        timeout (``KAFKA_EOS_CONNECT_TIMEOUT_S``, 10 s by default).

        :raises BrokerUnreachable: one line naming the bootstrap servers and the connection error.
        """
        from kafka_eos.kafka_admin import check_reachable

        settings = self.get_settings()
        check_reachable(settings)
        return settings

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's connection test: does the cluster answer?"""
        try:
            settings = self.get_checked_settings()
        except Exception as exc:  # noqa: BLE001 - the UI shows the message, whatever failed
            return False, str(exc)
        return True, f"Kafka at {settings.bootstrap_servers} answers"
