"""An Iceberg sink's catalog from its Airflow connection (``sink.conn_id``), as the URL
:func:`kafka_eos.sinks.iceberg_store.open_catalog` opens:

- a connection of type ``iceberg`` (the Apache Iceberg provider's: Catalog URI in *Host*, the OAuth2
  client id and secret in *Login* and *Password* — a *Password* without a *Login* is a bearer token —,
  more catalog properties in *Extra*, e.g. ``{"warehouse": "…", "scope": "PRINCIPAL_ROLE:ALL",
  "token": "…"}``) is a REST catalog:
  ``https://CLIENT_ID:CLIENT_SECRET@host/path?warehouse=…`` (see
  :func:`kafka_eos.sinks.iceberg_store.rest_properties`);
- any other is a SQL catalog's database (:func:`kafka_eos_airflow.hooks.sql.database_url_of`).

The secrets stay in Airflow's connections or its secrets backend; the task hands the URL to its
Spark process in a file of mode 0600, as a SQL sink's. The library finds this through the
``kafka_eos.connections`` entry point (``iceberg``).
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, quote, quote_plus, urlencode, urlsplit, urlunsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.log import mask_secret

from kafka_eos.errors import SpecError
from kafka_eos_airflow.hooks.sql import database_url_of

#: The connection type of a REST catalog (apache-airflow-providers-apache-iceberg's).
REST_TYPE = "iceberg"


def catalog_url_of(conn_id: str) -> str | None:
    """The catalog URL of connection ``conn_id``; None when it is not defined.

    :raises SpecError: a REST connection without a Catalog URI, or one that is not ``http(s)://``;
        a non-REST connection that is not a database's.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    if conn.conn_type != REST_TYPE:
        return database_url_of(conn_id)
    return rest_url(conn_id, conn.host, conn.login, conn.password, conn.extra_dejson)


def rest_url(conn_id: str, host: str | None, login: str | None, password: str | None, extra: dict) -> str:
    """A REST catalog's URL of a connection's fields (its module's docstring)."""
    parts = urlsplit(host or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"sink.conn_id: connection {conn_id!r} of type {REST_TYPE!r}: its Host must be the REST "
                        f"catalog's URI, http(s)://host[:port][/path]")
    if "@" in parts.netloc:
        raise SpecError(f"sink.conn_id: connection {conn_id!r} of type {REST_TYPE!r}: its Host holds credentials: "
                        "put them in Login and Password")
    netloc = parts.netloc
    if login or password:  # client credentials; a password alone: a bearer token
        netloc = f"{quote(login or '', safe='')}:{quote(password or '', safe='')}@{netloc}"
    properties = dict(parse_qsl(parts.query, keep_blank_values=True))  # a query the Host names stays
    properties.update({str(k): _property(v) for k, v in (extra or {}).items()})
    from kafka_eos.sinks.iceberg_store import is_secret

    for value in [v for k, v in properties.items() if v and is_secret(k)] + ([password] if password else []):
        for form in {value, quote(value, safe=""), quote_plus(value)}:
            mask_secret(form)
    url = urlunsplit((parts.scheme, netloc, parts.path, urlencode(properties), ""))
    mask_secret(url)
    return url


def _property(value) -> str:
    """A catalog property's text: JSON's words for booleans, JSON for lists and objects."""
    if isinstance(value, str):
        return value
    return json.dumps(value)
