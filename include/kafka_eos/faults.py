"""Fail points for the crash tests: ``KAFKA_EOS_CRASH_AT=<point>[:<n>]`` SIGKILLs this process
the n-th time (default 1st) it passes ``<point>``. Unset, a fail point costs one dict lookup.

Points: ``after_produce`` (a Kafka commit has produced records, before its offsets and commit),
``after_sql_commit`` (the SQL transaction committed, before the Kafka mirror).

Two more settings, for the cluster tests (a Spark worker hands them to its executors):
``KAFKA_EOS_CRASH_KILL=executor`` kills the Spark executor JVM this process (a Python worker)
runs under, not just this process: an executor lost mid-commit, as when its host dies.
``KAFKA_EOS_CRASH_ONCE=<file>``: only the first process to create ``<file>`` crashes, and writes
what it killed there (Spark reruns the task in a new process, which must get through).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_SPEC = os.environ.get("KAFKA_EOS_CRASH_AT", "")
_POINT, _, _N = _SPEC.partition(":")
_seen: dict[str, int] = {}
#: The main class of the JVM that runs a Spark executor (standalone, YARN and Kubernetes alike).
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def armed(point: str) -> bool:
    """True when this process is asked to crash at ``point``."""
    return point == _POINT


def crash_point(point: str) -> None:
    """SIGKILL this process (or its executor) here when the environment asks for it (tests only)."""
    if point != _POINT:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] < int(_N or 1):
        return
    victim = _executor_pid() if os.environ.get("KAFKA_EOS_CRASH_KILL") == "executor" else os.getpid()
    once = os.environ.get("KAFKA_EOS_CRASH_ONCE")
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return  # an earlier process crashed here already
        with os.fdopen(fd, "w") as f:
            f.write(f"{point} pid={victim} python_worker={os.getpid()}\n")
    os.kill(victim, signal.SIGKILL)


def _executor_pid() -> int:
    """The executor JVM among this process's ancestors."""
    pid = os.getppid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if EXECUTOR_MAIN_CLASS.encode() in cmdline:
            return pid
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    raise RuntimeError(f"KAFKA_EOS_CRASH_KILL=executor: process {os.getpid()} does not run under a Spark executor")
