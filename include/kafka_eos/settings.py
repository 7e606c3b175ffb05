"""Frozen connection settings. Built from CLI flags, the environment or an Airflow Connection.

Only :meth:`KafkaSettings.from_environ` reads the environment, and only when it is called by an
entry point (CLI, Spark app); no module reads ``os.environ`` deep inside.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Mapping

from kafka_eos.errors import KafkaEosError

#: Environment variable with the bootstrap servers (docs/configuration.md).
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
#: Environment variable with extra librdkafka settings as a JSON object (security, SASL ...).
#: Secrets travel here, never on a command line.
CLIENT_CONFIG_ENV = "KAFKA_EOS_CLIENT_CONFIG"
#: Environment variable with the seconds to wait for a first answer from the cluster.
CONNECT_TIMEOUT_ENV = "KAFKA_EOS_CONNECT_TIMEOUT_S"
#: A reachable cluster answers metadata in milliseconds; 10 s rides out a slow DNS or TLS
#: handshake and still tells a person about a wrong address before they give up waiting.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: librdkafka's own log lines go to this Python logger instead of stderr (see kafka_eos.logs).
CLIENT_LOGGER = logging.getLogger("kafka_eos.librdkafka")


@dataclass(frozen=True)
class KafkaSettings:
    """Where the cluster is and how to talk to it.

    :param bootstrap_servers: ``host:port[,host:port]``.
    :param extra: further librdkafka settings (``security.protocol``, ``sasl.*`` ...).
    :param connect_timeout_s: how long to wait for a first answer before calling the cluster
        unreachable.
    """

    bootstrap_servers: str
    # Not in repr: it holds SASL passwords and the like, and reprs end up in logs and tracebacks.
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    def client_config(self, **overrides: object) -> dict:
        """The librdkafka configuration dict for confluent-kafka clients. Their log lines go to
        the ``kafka_eos.librdkafka`` Python logger, never straight to stderr."""
        conf: dict = {"bootstrap.servers": self.bootstrap_servers, "logger": CLIENT_LOGGER, **self.extra}
        conf.update(overrides)
        return conf

    def spark_options(self) -> dict:
        """The ``kafka.*`` options for Spark's Kafka connector (Java client names)."""
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers}
        extra = dict(self.extra)
        user, password = extra.pop("sasl.username", None), extra.pop("sasl.password", None)
        if user is not None:
            mech = extra.get("sasl.mechanism", "PLAIN").upper()
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if mech == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            opts["kafka.sasl.jaas.config"] = (
                f'{module} required username="{user}" password="{password}";'
            )
        for key, value in extra.items():
            if key in ("security.protocol", "sasl.mechanism"):
                opts[f"kafka.{key}"] = value
            elif key == "ssl.ca.location":  # a PEM file, which Java reads as a PEM truststore
                opts["kafka.ssl.truststore.location"] = value
                opts["kafka.ssl.truststore.type"] = "PEM"
        return opts

    def to_environ(self) -> dict:
        """Environment variables that carry these settings to a child process (e.g. spark-submit)."""
        env = {BOOTSTRAP_ENV: self.bootstrap_servers}
        if self.extra:
            env[CLIENT_CONFIG_ENV] = json.dumps(dict(self.extra))
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], bootstrap: str | None = None,
                     default_bootstrap: str | None = None) -> "KafkaSettings":
        """Settings from an explicit ``bootstrap``, else the environment, else ``default_bootstrap``.

        :raises KafkaEosError: when no bootstrap servers are known or the extra config is not JSON.
        """
        servers = bootstrap or environ.get(BOOTSTRAP_ENV) or default_bootstrap
        if not servers:
            raise KafkaEosError(f"no Kafka bootstrap servers: pass --bootstrap or set {BOOTSTRAP_ENV}")
        extra: dict = {}
        raw = environ.get(CLIENT_CONFIG_ENV)
        if raw:
            try:
                extra = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise KafkaEosError(f"{CLIENT_CONFIG_ENV} is not a JSON object: {exc}") from None
            if not isinstance(extra, dict):
                raise KafkaEosError(f"{CLIENT_CONFIG_ENV} is not a JSON object")
        raw_timeout = environ.get(CONNECT_TIMEOUT_ENV)
        try:
            timeout = float(raw_timeout) if raw_timeout else DEFAULT_CONNECT_TIMEOUT_S
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise KafkaEosError(f"{CONNECT_TIMEOUT_ENV}: {raw_timeout!r} is not a positive number of seconds")
        return cls(bootstrap_servers=servers, extra={str(k): str(v) for k, v in extra.items()},
                   connect_timeout_s=timeout)
