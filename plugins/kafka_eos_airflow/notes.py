"""What a run did, in one line — the plan, the result, a dry run's would-be ranges, a reset: in the
task's log and as the task's XCom ``note`` (the UI shows it on the task's XCom tab).

It is not written as Airflow's run note. A task cannot set its run's note through the Task SDK
or the execution API (which takes a note only when it triggers a new run); writing it through the
REST API needs the stored password of a user allowed to edit DAG runs, in a connection any task
can read, and fails under SSO or a custom auth manager. kafka-eos 0.2 did that; it no longer does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

#: The XCom key of the note.
NOTE_KEY = "note"
#: The most a note holds (Airflow's run notes held 1,000 characters; the summary fits).
MAX_NOTE = 1000

log = logging.getLogger(__name__)


def record_note(context: Context, note: str) -> None:
    """Log ``note`` and push it as the task's XCom ``note``."""
    log.info("run note: %s", note)
    context["ti"].xcom_push(key=NOTE_KEY, value=note[:MAX_NOTE])


def ranges_text(ranges) -> str:
    """``orders-0 [0, 3), orders-1 [5, 9)`` from ``[topic, partition, from, until]`` rows."""
    return ", ".join(f"{t}-{p} [{a}, {b})" for t, p, a, b in ranges) or "nothing"
