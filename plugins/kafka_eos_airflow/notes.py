"""The run's note (Airflow 3 run notes, shown in the UI beside the run): a kafka-eos task writes
what its run did — the plan, the result, a dry run's would-be ranges, a reset.

A task cannot set its run's note through the Task SDK; it goes through the REST API
(``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}``) as the user of the Airflow connection
``kafka_eos_airflow_api`` (type ``http``: host, port, schema, login, password). Without that
connection no note is written (the same summary is in the task's log and XCom). A note that
cannot be written never fails the task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from urllib.parse import quote

from kafka_eos.local.airflow import API_CONN_ID

from kafka_eos_airflow.notifications.alerts import connection_or_none

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

#: Airflow keeps at most 1,000 characters of a note.
MAX_NOTE = 1000
#: A note is a courtesy: never wait long for it.
TIMEOUT_S = 15

log = logging.getLogger(__name__)


def set_run_note(context: Context, note: str) -> bool:
    """Write ``note`` as the run's note; False (logged) when it could not be written."""
    import requests

    conn = connection_or_none(API_CONN_ID, log)
    if conn is None:
        return False
    base = f"{conn.schema or 'http'}://{conn.host}:{conn.port}" if conn.port else f"{conn.schema or 'http'}://{conn.host}"
    dag_id, run_id = context["dag"].dag_id, context["run_id"]
    try:
        token = requests.post(f"{base}/auth/token", json={"username": conn.login, "password": conn.password},
                              timeout=TIMEOUT_S)
        token.raise_for_status()
        resp = requests.patch(f"{base}/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}",
                              json={"note": note[:MAX_NOTE]}, timeout=TIMEOUT_S,
                              headers={"Authorization": f"Bearer {token.json()['access_token']}"})
        resp.raise_for_status()
    except (requests.RequestException, KeyError, ValueError) as exc:
        log.warning("run note not written (%s): %s", API_CONN_ID, str(exc).splitlines()[0] if str(exc) else exc)
        return False
    return True


def ranges_text(ranges) -> str:
    """``orders-0 [0, 3), orders-1 [5, 9)`` from ``[topic, partition, from, until]`` rows."""
    return ", ".join(f"{t}-{p} [{a}, {b})" for t, p, a, b in ranges) or "nothing"
