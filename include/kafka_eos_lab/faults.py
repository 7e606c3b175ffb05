"""The fault probe of the crash tests and the fault matrix: it acts at the commit path's points
(:mod:`kafka_eos.probes`) as the environment asks. Importing it installs it; the tests and the lab
name it in ``KAFKA_EOS_PROBES`` so that every process they start installs it too. Not in the wheel.

``KAFKA_EOS_CRASH_AT=<point>[:<n>]`` SIGKILLs this process the n-th time (default 1st) it passes
``<point>``. Points, in the order a commit passes them:

- Kafka sink: ``after_produce`` (100 records produced and on the broker, before the rest),
  ``before_offsets`` (every record acknowledged, before ``send_offsets_to_transaction``),
  ``before_commit`` (offsets and manifest in the transaction, before ``commit_transaction``),
  ``after_commit`` (committed, before the run reports it: a task killed before its success is recorded);
  an atomic run's JVM writer also ``before_check`` (its producer initialised and the ids fenced, before
  the checkpoint check, beside the Spark job);
- SQL sink: ``before_sql_commit`` (rows and offsets written, before the database commit),
  ``after_sql_commit`` (committed, before the Kafka mirror);
- Iceberg sink: ``before_iceberg_commit`` (dead letters committed, the results not yet written),
  ``after_iceberg_commit`` (the table's snapshot committed, before the Kafka mirror).

Two more settings, for the cluster tests (a Spark worker hands them to its executors):
``KAFKA_EOS_CRASH_KILL=executor`` kills the Spark executor JVM this process (a Python worker)
runs under, not just this process: an executor lost mid-commit, as when its host dies.
``KAFKA_EOS_CRASH_ONCE=<file>``: only the first process to create ``<file>`` crashes, and writes
what it killed there (Spark reruns the task in a new process, which must get through).

``KAFKA_EOS_PAUSE_AT=<point>[,<point>...]`` with ``KAFKA_EOS_PAUSE_DIR=<dir>`` holds the first process
to pass ``<point>`` there: it writes ``<dir>/<point>.reached`` (its pid) and waits until ``<dir>/<point>.go``
exists. The fault matrix injects its fault meanwhile: a broker killed or stopped, a newer attempt
run to its end, a stall past the transaction timeout. While ``<dir>`` does not exist nothing pauses:
a long-lived deployment can carry the setting and a test arm it for one run by making the folder.

Where the process that commits does not inherit the run's environment (a Spark Connect server's
Python workers), the task carries the run's settings (:func:`carried`, through
:func:`kafka_eos.probes.carried`) and applies them while it runs (:func:`applied`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from kafka_eos import probes

_SPEC = os.environ.get("KAFKA_EOS_CRASH_AT", "")
_POINT, _, _N = _SPEC.partition(":")
_seen: dict[str, int] = {}
_PAUSE_AT = os.environ.get("KAFKA_EOS_PAUSE_AT", "")
#: The longest a paused process waits for its go: a fault matrix that died must not leave it hanging.
PAUSE_LIMIT_S = 600.0
#: The main class of the JVM that runs a Spark executor (standalone, YARN and Kubernetes alike).
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


#: The settings of this module, as the environment names them.
SETTINGS = ("KAFKA_EOS_CRASH_AT", "KAFKA_EOS_CRASH_KILL", "KAFKA_EOS_CRASH_ONCE", "KAFKA_EOS_PAUSE_AT",
            "KAFKA_EOS_PAUSE_DIR")


def carried() -> dict[str, str]:
    """This process's fail point settings, for a task to take where the environment does not reach."""
    return {name: os.environ[name] for name in SETTINGS if os.environ.get(name)}


@contextmanager
def applied(settings: dict[str, str]) -> Iterator[None]:
    """Inside the block, ``settings`` (from :func:`carried`) are this process's fail points; none
    given, the process keeps its own (a cluster's workers hand theirs to their executors)."""
    global _SPEC, _POINT, _N, _PAUSE_AT
    if not settings:
        yield
        return
    saved = (_SPEC, _POINT, _N, _PAUSE_AT, {name: os.environ.get(name) for name in SETTINGS})
    for name in SETTINGS:
        os.environ.pop(name, None)
    os.environ.update(settings)
    _SPEC = settings.get("KAFKA_EOS_CRASH_AT", "")
    _POINT, _, _N = _SPEC.partition(":")
    _PAUSE_AT = settings.get("KAFKA_EOS_PAUSE_AT", "")
    try:
        yield
    finally:
        _SPEC, _POINT, _N, _PAUSE_AT, env = saved
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def armed(point: str) -> bool:
    """True when this process is asked to crash or pause at ``point``."""
    return point == _POINT or point in _PAUSE_AT.split(",")


def point(point: str) -> None:
    """Pause here, or SIGKILL this process (or its executor), when the environment asks for it (tests only)."""
    if point in _PAUSE_AT.split(","):
        _pause(point)
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


def _pause(point: str) -> None:
    folder = Path(os.environ["KAFKA_EOS_PAUSE_DIR"])
    try:
        fd = os.open(folder / f"{point}.reached", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return  # another process (a partition's task, an earlier attempt) paused here
    except FileNotFoundError:
        return  # no folder: not armed now (a deployment's tests arm it by making the folder)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (folder / f"{point}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


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

probes.install(sys.modules[__name__], __name__)
