"""Each test's CPU seconds: what the test's process and every process under it spent while the
test ran (setup, call and teardown), whether they live past it or not.

A test's wall time says little on two shared cores: it waits for the CPU the other workers take.
Its CPU seconds say what it costs the suite. A pytest-xdist worker's process tree is the test's own
(the shared broker is the controlling process's child, not a worker's), so the tests' figures add
up to what the workers' trees spent, and each figure holds:

- the worker itself (the test's own Python, in-process Airflow and Spark's Python side);
- every process under it that is alive at the test's end, for what it spent since the test began
  (or since it started): the worker's SparkSession's JVM, a fixture's broker or Airflow, a test's
  spark-submit still running;
- every process that ended during the test and was waited for, through its parent's (or the
  worker's) children's times, less what it had spent before the test began (counted by the tests
  before).

A process whose parent exits before it (a daemon that forks twice, PostgreSQL's server under
``pg_ctl``) is counted only while it is under the worker.
"""

from __future__ import annotations

import os

import psutil

#: The CPU seconds of a process tree at one moment, by process (pid and start time).
Snapshot = dict[tuple[int, float], float]


def _total(times) -> float:
    """A process's own CPU seconds and those of its children it waited for."""
    return times.user + times.system + getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)


def snapshot(pid: int | None = None) -> Snapshot:
    """Every process of the tree under ``pid`` (default: this process), with its total CPU seconds."""
    root = psutil.Process(pid or os.getpid())
    totals = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            with proc.oneshot():
                totals[(proc.pid, proc.create_time())] = _total(proc.cpu_times())
        except psutil.Error:  # ended between the listing and the look: its parent's times hold it
            continue
    return totals


def spent(before: Snapshot, after: Snapshot) -> float:
    """The tree's CPU seconds between two snapshots: the alive processes' growth (children waited
    for included), less what the processes that ended had spent by ``before`` (their whole time
    arrives in a surviving parent's children's times)."""
    grown = sum(total - before.get(key, 0.0) for key, total in after.items())
    ended = sum(total for key, total in before.items() if key not in after)
    return max(0.0, grown - ended)
