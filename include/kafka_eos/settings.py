"""Frozen connection settings. Built from CLI flags, the environment or an Airflow Connection.

Only :meth:`KafkaSettings.from_environ` reads the environment, and only when it is called by an
entry point (CLI, Spark app); no module reads ``os.environ`` deep inside.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from kafka_eos.errors import KafkaEosError

#: Environment variable with the bootstrap servers (docs/configuration.md).
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
#: Environment variable with extra librdkafka settings as a JSON object (security, SASL ...).
#: Secrets travel here, never on a command line.
CLIENT_CONFIG_ENV = "KAFKA_EOS_CLIENT_CONFIG"
#: Environment variable naming a file with the same JSON object. The Airflow Spark task hands
#: settings to spark-submit this way: the file is readable by its owner only, and the
#: environment carries just its path (Airflow's Spark hook turns environment variables into
#: ``--conf`` arguments on YARN and Kubernetes, where every process list shows them).
CLIENT_CONFIG_FILE_ENV = "KAFKA_EOS_CLIENT_CONFIG_FILE"
#: Environment variable naming a file (readable by its owner only) that holds the SQL sink's
#: database URL as the Airflow task resolved it (its connection ``sink.conn_id``, else its
#: ``sink.url``): how the Spark and stream tasks hand it to their child process, never on a
#: command line or in the environment itself.
DATABASE_URL_FILE_ENV = "KAFKA_EOS_DATABASE_URL_FILE"
#: Environment variable with the seconds to wait for a first answer from the cluster.
CONNECT_TIMEOUT_ENV = "KAFKA_EOS_CONNECT_TIMEOUT_S"
#: A reachable cluster answers metadata in milliseconds; 10 s rides out a slow DNS or TLS
#: handshake and still tells a person about a wrong address before they give up waiting.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Environment variable with the Schema Registry's URL (its Confluent-compatible API).
REGISTRY_URL_ENV = "KAFKA_EOS_SCHEMA_REGISTRY_URL"
#: Environment variable with the registry client's further settings as a JSON object
#: (``basic.auth.user.info``, ``ssl.ca.location``, ``ssl.certificate.location`` ...: confluent-kafka's
#: ``SchemaRegistryClient`` names); and one naming a file with it (secrets never in the environment).
REGISTRY_CONFIG_ENV = "KAFKA_EOS_SCHEMA_REGISTRY_CONFIG"
REGISTRY_CONFIG_FILE_ENV = "KAFKA_EOS_SCHEMA_REGISTRY_CONFIG_FILE"
#: librdkafka's own log lines go to this Python logger instead of stderr (see kafka_eos.logs).
CLIENT_LOGGER = logging.getLogger("kafka_eos.librdkafka")
#: librdkafka's ``reconnect.backoff.ms`` where the settings give none (its default is 100 ms).
#: librdkafka (2.x) leaves its bootstrap connection once the metadata names the brokers, and waits
#: half this backoff (at least 11 ms) before it connects to one of them: 50 ms of every new client's
#: first request by default — of each command's admin clients, each checkpoint read, each producer's
#: init; 11 ms with 20. Reconnecting after a broker is lost still backs off exponentially (jittered,
#: doubling from 20 ms, as the Java clients' from 50 ms), up to
#: ``reconnect.backoff.max.ms`` (10 s). (The Java clients' writer has a wait of its own cut short the
#: same way: ``retry.backoff.ms``, ``io.kafkaeos.writer.Transaction.COORDINATOR_BACKOFF_MS``.)
RECONNECT_BACKOFF_MS = 20


#: librdkafka settings whose values are callables, which kafka-eos's settings hold as dotted paths
#: (``package.module.function``, as the Kafka provider's connection extra does): the token callback
#: serves every client kind (:mod:`kafka_eos.oauth`); the others confluent-kafka's clients only.
CALLBACK_KEYS = ("oauth_cb", "error_cb", "throttle_cb", "stats_cb")
#: Callbacks a kafka-eos client must not take: its own logger takes librdkafka's log lines, and its
#: offsets are committed only in its transactions.
REFUSED_CALLBACK_KEYS = ("log_cb", "on_commit", "on_delivery")
#: Amazon MSK IAM's token callback (:func:`kafka_eos.oauth.msk_iam_oauth_cb`), its region in
#: ``sasl.oauthbearer.config`` (``region=us-east-1``).
MSK_IAM_CALLBACK = "kafka_eos.oauth.msk_iam_oauth_cb"

#: librdkafka setting -> kafka-python argument, for what both clients have.
_KAFKA_PYTHON_NAMES = {
    "security.protocol": "security_protocol", "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_plain_username", "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile", "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile", "ssl.key.password": "ssl_password",
}


@dataclass(frozen=True)
class RegistrySettings:
    """Where the Schema Registry is and how to talk to it (confluent-kafka's ``SchemaRegistryClient``).

    :param url: the Confluent-compatible API's URL (``https://registry:8081``; Apicurio's is under
        ``/apis/ccompat/v7``).
    :param extra: further client settings: ``basic.auth.user.info`` (``user:password``),
        ``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location`` ...
    """

    url: str
    # Not in repr: it holds the basic-auth password.
    extra: Mapping[str, str] = field(default_factory=dict, repr=False)

    def client_config(self) -> dict:
        return {"url": self.url, **self.extra}

    def to_environ(self, config_file: Path) -> dict:
        """Environment variables carrying these settings to a child process; ``extra`` goes to
        ``config_file`` (created readable by its owner only)."""
        env = {REGISTRY_URL_ENV: self.url}
        if self.extra:
            fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(dict(self.extra), out)
            env[REGISTRY_CONFIG_FILE_ENV] = str(config_file)
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default_url: str | None = None) -> "RegistrySettings | None":
        """The registry of the environment, else at ``default_url``; None when neither names one."""
        url = environ.get(REGISTRY_URL_ENV) or default_url
        if not url:
            return None
        extra = _json_object(environ.get(REGISTRY_CONFIG_ENV), REGISTRY_CONFIG_ENV)
        path = environ.get(REGISTRY_CONFIG_FILE_ENV)
        if path:
            extra.update(_json_object(_read(path, REGISTRY_CONFIG_FILE_ENV), f"{REGISTRY_CONFIG_FILE_ENV} file {path}"))
        return cls(url=url.rstrip("/"), extra={str(k): str(v) for k, v in extra.items()})


def _read(path: str, env: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise KafkaEosError(f"{env}: cannot read {path}: {exc.strerror}") from None


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
    #: The Schema Registry of the cluster's topics (pipelines whose ``format`` is avro, protobuf or
    #: json_schema need it); None: none configured.
    schema_registry: RegistrySettings | None = None
    #: A SQL sink's database URL, resolved once by the Airflow task that built these settings for
    #: one pipeline (its connection ``sink.conn_id``, else ``sink.url``), so that every process of
    #: a run uses the same one; None: resolved where it is needed
    #: (:func:`kafka_eos.sinks.sql_store.database_url`). Not in repr: it holds a password.
    database_url: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        refused = sorted(k for k in self.extra if k in REFUSED_CALLBACK_KEYS)
        if refused:
            raise KafkaEosError(f"Kafka settings set {', '.join(refused)}: kafka-eos's clients take no such callback "
                                "(their log lines go to its logger; offsets are committed only in its transactions)")

    @property
    def key(self) -> tuple:
        """These settings as a hashable value (``extra`` is a mapping): the key of a process's
        cache of clients built from them."""
        return (self.bootstrap_servers, tuple(sorted((k, repr(v)) for k, v in self.extra.items())))

    @property
    def token_callback(self) -> str | None:
        """The dotted path of the OAUTHBEARER token callback (``oauth_cb``) every client logs in
        through; None: no callback."""
        return self.extra.get("oauth_cb") or None

    def client_config(self, **overrides: object) -> dict:
        """The librdkafka configuration dict for confluent-kafka clients, callbacks (dotted paths in
        the settings) resolved to their callables. Their log lines go to the ``kafka_eos.librdkafka``
        Python logger, never straight to stderr.

        :raises KafkaEosError: a callback that cannot be imported, naming it.
        """
        conf: dict = {"bootstrap.servers": self.bootstrap_servers, "logger": CLIENT_LOGGER,
                      "reconnect.backoff.ms": RECONNECT_BACKOFF_MS, **self.extra}
        if any(key in self.extra for key in CALLBACK_KEYS):
            # kafka_eos.oauth (and kafka-python's token provider base) only where a callback is named.
            from kafka_eos.oauth import checked_token_callback, resolve_callback

            for key in CALLBACK_KEYS:
                if isinstance(conf.get(key), str):
                    conf[key] = resolve_callback(conf[key])
        if self.token_callback is not None:
            # Its answers checked as every other client kind's are (an expiry in the past, or in
            # milliseconds, would stop the token's refresh).
            conf["oauth_cb"] = checked_token_callback(conf["oauth_cb"], self.token_callback)
        conf.update(overrides)
        return conf

    def spark_options(self, python: str | None = None) -> dict:
        """The ``kafka.*`` options for Spark's Kafka connector (Java client names).

        :param python: the interpreter (with kafka-eos) that the Java client's login runs a token
            callback with, on the driver and the executors; None: this process's.
        """
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers}
        extra = dict(self.extra)
        user, password = extra.pop("sasl.username", None), extra.pop("sasl.password", None)
        oauth = _oidc(extra)
        if self.token_callback is not None:
            # The Python token callback, called by kafka-eos's Java login handler (jvm/connect).
            opts["kafka.sasl.login.callback.handler.class"] = JAVA_CALLBACK_HANDLER
            fields = {"callback": ("oauth_cb", self.token_callback), "python": ("python", python or sys.executable),
                      "config": ("sasl.oauthbearer.config", extra.get("sasl.oauthbearer.config", ""))}
            opts["kafka.sasl.jaas.config"] = f"{JAVA_OAUTH_MODULE} required " + " ".join(
                f'{k}="{_jaas_quoted(v, name)}"' for k, (name, v) in fields.items()) + ";"
        elif oauth is not None:
            # librdkafka's built-in OIDC client-credentials flow, as the Java client's own.
            opts["kafka.sasl.oauthbearer.token.endpoint.url"] = oauth["token_endpoint_url"]
            opts["kafka.sasl.login.callback.handler.class"] = JAVA_OIDC_HANDLER
            fields = [f'clientId="{_jaas_quoted(oauth["client_id"], "sasl.oauthbearer.client.id")}"',
                      f'clientSecret="{_jaas_quoted(oauth["client_secret"], "sasl.oauthbearer.client.secret")}"']
            if oauth["scope"]:
                fields.append(f'scope="{_jaas_quoted(oauth["scope"], "sasl.oauthbearer.scope")}"')
            opts["kafka.sasl.jaas.config"] = f"{JAVA_OAUTH_MODULE} required {' '.join(fields)};"
        elif user is not None:
            mech = extra.get("sasl.mechanism", "PLAIN").upper()
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if mech == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            opts["kafka.sasl.jaas.config"] = (
                f'{module} required username="{_jaas_quoted(user, "sasl.username")}" '
                f'password="{_jaas_quoted(password or "", "sasl.password")}";'
            )
        for key, value in extra.items():
            if key in ("security.protocol", "sasl.mechanism"):
                opts[f"kafka.{key}"] = value
            elif key == "ssl.ca.location":  # a PEM file, which Java reads as a PEM truststore
                opts["kafka.ssl.truststore.location"] = value
                opts["kafka.ssl.truststore.type"] = "PEM"
        return opts

    def kafka_python_config(self) -> dict:
        """The same settings for kafka-python's clients (the transaction admin API); librdkafka
        settings it has no equivalent for are left out."""
        conf: dict = {"bootstrap_servers": self.bootstrap_servers.split(","),
                      "request_timeout_ms": int(max(self.connect_timeout_s, 30.0) * 1000)}
        for key, name in _KAFKA_PYTHON_NAMES.items():
            if key in self.extra:
                conf[name] = self.extra[key]
        oauth = _oidc(self.extra)
        if self.token_callback is not None:
            from kafka_eos.oauth import CallbackTokenProvider

            conf["sasl_oauth_token_provider"] = CallbackTokenProvider(
                self.token_callback, self.extra.get("sasl.oauthbearer.config", ""))
        elif oauth is not None:
            # kafka-python's token provider: loaded only by a connection that logs in with OIDC.
            from kafka_eos.oauth import ClientCredentialsTokenProvider

            conf["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider(**oauth)
        return conf

    def to_environ(self, config_file: Path) -> dict:
        """Environment variables that carry these settings to a child process (e.g. spark-submit),
        with no secret among them: ``extra`` goes to ``config_file``, created readable by its
        owner only, and the environment names the file.

        :raises FileExistsError: ``config_file`` exists (it is never overwritten or reused).
        """
        # CLIENT_CONFIG_ENV emptied: the child's settings are these, never merged with its parent's
        # environment.
        env = {BOOTSTRAP_ENV: self.bootstrap_servers, CONNECT_TIMEOUT_ENV: str(self.connect_timeout_s),
               CLIENT_CONFIG_ENV: ""}
        if self.extra:
            fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(dict(self.extra), out)
            env[CLIENT_CONFIG_FILE_ENV] = str(config_file)
        if self.schema_registry is not None:
            env.update(self.schema_registry.to_environ(config_file.with_name(config_file.stem + "-registry.json")))
        if self.database_url is not None:
            url_file = config_file.with_name(config_file.stem + "-database")
            fd = os.open(url_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(self.database_url)
            env[DATABASE_URL_FILE_ENV] = str(url_file)
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], bootstrap: str | None = None,
                     default_bootstrap: str | None = None, default_registry: str | None = None) -> "KafkaSettings":
        """Settings from an explicit ``bootstrap``, else the environment, else ``default_bootstrap``.

        :raises KafkaEosError: when no bootstrap servers are known or the extra config is not JSON.
        """
        servers = bootstrap or environ.get(BOOTSTRAP_ENV) or default_bootstrap
        if not servers:
            raise KafkaEosError(f"no Kafka bootstrap servers: pass --bootstrap or set {BOOTSTRAP_ENV}")
        extra = _json_object(environ.get(CLIENT_CONFIG_ENV), CLIENT_CONFIG_ENV)
        path = environ.get(CLIENT_CONFIG_FILE_ENV)
        if path:
            extra.update(_json_object(_read(path, CLIENT_CONFIG_FILE_ENV), f"{CLIENT_CONFIG_FILE_ENV} file {path}"))
        raw_timeout = environ.get(CONNECT_TIMEOUT_ENV)
        try:
            timeout = float(raw_timeout) if raw_timeout else DEFAULT_CONNECT_TIMEOUT_S
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise KafkaEosError(f"{CONNECT_TIMEOUT_ENV}: {raw_timeout!r} is not a positive number of seconds")
        url_file = environ.get(DATABASE_URL_FILE_ENV)
        return cls(bootstrap_servers=servers, extra={str(k): str(v) for k, v in extra.items()},
                   connect_timeout_s=timeout,
                   schema_registry=RegistrySettings.from_environ(environ, default_registry),
                   database_url=_read(url_file, DATABASE_URL_FILE_ENV).strip() if url_file else None)


#: The Java client's OIDC client-credentials login (Kafka 3.4 and later; a JVM started with
#: ``-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=<token endpoint>`` on Kafka 4 clients).
JAVA_OIDC_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
JAVA_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
#: kafka-eos's Java login through a Python token callback (jvm/connect; the jar is in every Spark
#: application kafka-eos starts: :func:`kafka_eos.spark_io.connector_jars`).
JAVA_CALLBACK_HANDLER = "io.kafkaeos.oauth.PythonTokenLoginCallbackHandler"


def _jaas_quoted(value: str, name: str) -> str:
    """``value`` inside a JAAS option's double quotes (Kafka's ``JaasConfig`` reads it with Java's
    ``StreamTokenizer``: backslash and quote escaped).

    :raises KafkaEosError: a control character in it (a line break ends a quoted string there, and
        what follows would be read as further options), naming the setting, never the value.
    """
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise KafkaEosError(f"{name}: a control character (a line break?) in its value, which the Java client's "
                            "login configuration cannot hold")
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _oidc(extra: Mapping[str, str]) -> dict | None:
    """librdkafka's OIDC settings (``sasl.mechanism=OAUTHBEARER``, ``sasl.oauthbearer.method=oidc``)
    as the fields of a client-credentials grant; None for any other mechanism."""
    mechanism = (extra.get("sasl.mechanism") or extra.get("sasl.mechanisms") or "").upper()
    if mechanism != "OAUTHBEARER" or extra.get("oauth_cb"):
        return None
    if extra.get("sasl.oauthbearer.method", "default").lower() != "oidc":
        raise KafkaEosError("sasl.mechanism OAUTHBEARER: a token callback (oauth_cb) or sasl.oauthbearer.method=oidc "
                            "(client credentials: sasl.oauthbearer.client.id, .client.secret and .token.endpoint.url) "
                            "is what Spark's and the admin API's clients can log in with")
    missing = [k for k in ("sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
                           "sasl.oauthbearer.token.endpoint.url") if not extra.get(k)]
    if missing:
        raise KafkaEosError(f"sasl.oauthbearer.method=oidc: {', '.join(missing)} not set")
    return {"token_endpoint_url": extra["sasl.oauthbearer.token.endpoint.url"],
            "client_id": extra["sasl.oauthbearer.client.id"],
            "client_secret": extra["sasl.oauthbearer.client.secret"],
            "scope": extra.get("sasl.oauthbearer.scope") or None}


def _json_object(raw: str | None, where: str) -> dict:
    """The JSON object in ``raw`` ({} when empty).

    :raises KafkaEosError: naming ``where`` (never the content: it may hold a password).
    """
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise KafkaEosError(f"{where} is not a JSON object: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    if not isinstance(value, dict):
        raise KafkaEosError(f"{where} is not a JSON object")
    return value
