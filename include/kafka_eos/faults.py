"""Fail points for the crash tests: ``KAFKA_EOS_CRASH_AT=<point>[:<n>]`` SIGKILLs this process
the n-th time (default 1st) it passes ``<point>``. Unset, a fail point costs one dict lookup.

Points: ``after_produce`` (a Kafka commit has produced records, before its offsets and commit),
``after_sql_commit`` (the SQL transaction committed, before the Kafka mirror).
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("KAFKA_EOS_CRASH_AT", "")
_POINT, _, _N = _SPEC.partition(":")
_seen: dict[str, int] = {}


def armed(point: str) -> bool:
    """True when this process is asked to crash at ``point``."""
    return point == _POINT


def crash_point(point: str) -> None:
    """SIGKILL this process here when the environment asks for it (tests only)."""
    if point != _POINT:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] >= int(_N or 1):
        os.kill(os.getpid(), signal.SIGKILL)
