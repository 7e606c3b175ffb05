"""Stopping the local services' process groups (Airflow's components, Spark's daemons): each is
started in a session of its own, so one signal reaches the process and everything it started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

#: After SIGTERM went unheeded this long... SIGKILL, and this long for the kernel to end the group.
KILL_WAIT_S = 5.0


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is still running."""
    try:
        # The leader is our child when this process started it: reap it, or as a zombie it keeps
        # the group "alive" until the timeout.
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):  # gone, or no longer ours
        return False


def group_of(pid_file: Path) -> int | None:
    """The process group recorded in ``pid_file`` (its leader's pid) while any of it runs, else None."""
    try:
        pgid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return pgid if group_alive(pgid) else None


def stop_group(pgid: int, term_timeout_s: float) -> None:
    """SIGTERM the group, then SIGKILL what is left after ``term_timeout_s``."""
    stop_groups([pgid], term_timeout_s)


def stop_groups(pgids: list[int], term_timeout_s: float) -> None:
    """SIGTERM every group at once, then SIGKILL what is left of them after ``term_timeout_s``:
    components that stop side by side take as long as the slowest, not the sum (a Celery
    worker's warm shutdown waits for its running task until the SIGKILL)."""
    left = list(pgids)
    for sig, wait_s in ((signal.SIGTERM, term_timeout_s), (signal.SIGKILL, KILL_WAIT_S)):
        for pgid in list(left):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                left.remove(pgid)
        deadline = time.monotonic() + wait_s
        left = [pgid for pgid in left if group_alive(pgid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = [pgid for pgid in left if group_alive(pgid)]
        if not left:
            return
