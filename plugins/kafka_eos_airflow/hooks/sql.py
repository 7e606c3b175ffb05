"""A SQL sink's database from its Airflow connection (``sink.conn_id``): the connection's own
provider hook builds the SQLAlchemy URL (common-sql's ``DbApiHook``: ``sqlalchemy_url``, else
``get_uri()``, as its ``get_sqlalchemy_engine`` does), so the password lives only in Airflow's
connections or its secrets backend. In a task the connection comes from the task's own
connections; elsewhere (the CLI) from Airflow's secrets backends (``AIRFLOW_CONN_*``, a
configured backend). The library finds this through the ``kafka_eos.connections`` entry point.
"""

from __future__ import annotations

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from kafka_eos.errors import SpecError


def database_url_of(conn_id: str) -> str | None:
    """The SQLAlchemy URL of connection ``conn_id``; None when it is not defined.

    :raises SpecError: the connection's type has no SQL hook (its provider is not installed, or it
        is not a database).
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    try:
        hook = conn.get_hook()
    except Exception as exc:  # noqa: BLE001 - Airflow's error for a type whose provider is not installed
        raise SpecError(f"sink.conn_id: connection {conn_id!r} of type {conn.conn_type!r}: no database hook "
                        f"({str(exc).splitlines()[0]}; install the database's Airflow provider, e.g. "
                        "apache-airflow-providers-postgres)") from None
    if not callable(getattr(hook, "get_sqlalchemy_engine", None)):
        raise SpecError(f"sink.conn_id: connection {conn_id!r} of type {conn.conn_type!r} is not a SQL database's")
    try:
        url = hook.sqlalchemy_url
    except NotImplementedError:
        return hook.get_uri()
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)
