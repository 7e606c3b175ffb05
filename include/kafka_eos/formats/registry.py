"""The Schema Registry, through confluent-kafka's ``SchemaRegistryClient``: the schemas a run decodes
with and registers, read on the driver before Spark starts (executors never call the registry).

Every failure is one line: the registry unreachable names its URL (never its credentials); a
missing subject or version names it; an output schema the subject's compatibility rule refuses
names subject, latest version and rule (:class:`~kafka_eos.errors.SchemaRefused`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, TypeVar
from urllib.parse import urlsplit, urlunsplit

from kafka_eos.errors import RegistryError, SchemaRefused
from kafka_eos.settings import REGISTRY_URL_ENV, KafkaSettings, RegistrySettings

T = TypeVar("T")

#: Seconds one registry request may take: a reachable registry answers in milliseconds.
REQUEST_TIMEOUT_S = 10
#: Confluent's names of the schema types.
SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


@dataclass(frozen=True)
class Registered:
    """One schema as the registry holds it."""

    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str  # AVRO | PROTOBUF | JSON


def _transport_error(exc: BaseException) -> bool:
    """A connection refused, reset or timed out (httpx's, as confluent-kafka's client raises it)."""
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore",
                                                                             "httpcore2")


def public_url(url: str) -> str:
    """``url`` without user information (``https://user:pw@host`` names only the host)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))) \
        if parts.hostname else url


class Registry:
    """The registry of ``settings`` (a client per URL and settings, kept for the process: a stream's
    batches and a run's checks share its caches)."""

    _clients: dict[tuple, object] = {}
    _lock = threading.Lock()

    def __init__(self, settings: RegistrySettings) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = public_url(settings.url)
        key = (settings.url, tuple(sorted(settings.extra.items())))
        with self._lock:
            if key not in self._clients:
                self._clients[key] = SchemaRegistryClient(
                    {"timeout": REQUEST_TIMEOUT_S, "max.retries": 1, **settings.client_config()})
            self.client = self._clients[key]

    @classmethod
    def of(cls, settings: KafkaSettings, needed_by: str) -> "Registry":
        """:raises RegistryError: no registry configured (naming what needs one)."""
        if settings.schema_registry is None:
            raise RegistryError(f"{needed_by} needs a Schema Registry: set {REGISTRY_URL_ENV} (in Airflow: the "
                                "connection [kafka_eos] schema_registry_conn_id names; `kafka-eos registry start` "
                                "runs one on 127.0.0.1:18081)")
        return cls(settings.schema_registry)

    def call(self, what: str, func: Callable[..., T], *args) -> T:
        """``func(*args)``; a registry that does not answer, or refuses the credentials, is one
        line naming its URL. Other answers (404, 409) reach the caller as confluent-kafka raised them."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return func(*args)
        except SchemaRegistryError as exc:
            if exc.http_status_code in (401, 403):
                raise RegistryError(f"Schema Registry {self.url} refused {what}: HTTP {exc.http_status_code} "
                                    "(check the connection's credentials)") from None
            raise
        except Exception as exc:  # noqa: BLE001 - only a transport failure is "unreachable"
            if not _transport_error(exc):
                raise
            raise RegistryError(f"Schema Registry {self.url} unreachable ({what}): {type(exc).__name__}: "
                                f"{exc}") from None

    def versions(self, subject: str) -> list[Registered]:
        """Every version of ``subject``, oldest first; [] when the subject does not exist."""
        return [self.version(subject, n) for n in self._numbers(subject)]

    def latest(self, subject: str) -> Registered | None:
        """The latest version of ``subject``; None when the subject does not exist."""
        numbers = self._numbers(subject)
        return self.version(subject, numbers[-1]) if numbers else None

    def _numbers(self, subject: str) -> list[int]:
        """``subject``'s version numbers, ascending ([] when the subject does not exist). Asked each
        time, never ``get_latest_version``: the client keeps that answer for the process's life, and
        a stream's later batches must see a version registered since."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return sorted(self.call(f"versions of subject {subject!r}", self.client.get_versions, subject))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return []
            raise RegistryError(f"Schema Registry {self.url}: subject {subject!r}: {exc}") from None

    def version(self, subject: str, number: int | None) -> Registered:
        """Version ``number`` (None: the latest) of ``subject``.

        :raises RegistryError: no such subject or version.
        """
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        what = f"subject {subject!r} version {number if number is not None else 'latest'}"
        try:
            if number is None:
                # Not get_latest_version (see _numbers).
                number = max(self.call(what, self.client.get_versions, subject))
            got = self.call(what, self.client.get_version, subject, number)
        except SchemaRegistryError as exc:
            raise RegistryError(f"Schema Registry {self.url}: {what}: {exc}") from None
        return Registered(subject, got.version, got.schema_id, got.schema.schema_str, got.schema.schema_type or "AVRO")

    def compatibility(self, subject: str) -> str:
        """The compatibility rule that applies to ``subject`` (its own, else the registry's)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            level = self.call(f"compatibility of {subject!r}", self.client.get_compatibility, subject)
            if level and level != "NONE":
                return level
        except SchemaRegistryError:
            pass
        return self.call("the global compatibility", self.client.get_compatibility)

    def compatible(self, subject: str, schema: str, schema_type: str) -> bool:
        """Whether ``subject``'s compatibility rule takes ``schema`` (True for a new subject)."""
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if not self._numbers(subject):
            return True
        try:
            return bool(self.call(f"testing compatibility with {subject!r}", self.client.test_compatibility,
                                  subject, Schema(schema, schema_type)))
        except SchemaRegistryError as exc:
            raise RegistryError(f"Schema Registry {self.url}: subject {subject!r}: {exc}") from None

    def register(self, subject: str, schema: str, schema_type: str, auto_register: bool) -> int:
        """The id of ``schema`` under ``subject``: registered when new (``auto_register``), else
        looked up.

        :raises SchemaRefused: the subject's compatibility rule refuses it (nothing was registered),
            or it is not registered and ``auto_register`` is off.
        """
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        parsed = Schema(schema, schema_type)
        try:
            if auto_register:
                return self.call(f"registering under {subject!r}", self.client.register_schema, subject, parsed)
            return self.call(f"looking up under {subject!r}", self.client.lookup_schema, subject, parsed).schema_id
        except SchemaRegistryError as exc:
            latest = self.latest(subject)
            at = f"version {latest.version}" if latest else "no version yet"
            if exc.http_status_code == 409:
                rule = self.compatibility(subject)
                raise SchemaRefused(
                    f"subject {subject!r} ({at}, compatibility {rule if rule != 'NONE' else 'of the registry'}) "
                    "refuses the output "
                    f"schema: {str(exc).splitlines()[0][:300]}") from None
            if exc.http_status_code == 404 and not auto_register:
                raise SchemaRefused(f"subject {subject!r} ({at}): the output schema is not registered and "
                                    "sink.auto_register is false") from None
            raise RegistryError(f"Schema Registry {self.url}: subject {subject!r}: {exc}") from None
