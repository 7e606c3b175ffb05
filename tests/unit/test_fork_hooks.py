"""The process-wide caches of librdkafka clients across ``os.fork()``: a child made by a fork (a
pool's process, OpenLineage's event pool in a task process) has none of its parent's clients'
threads, so it must neither use nor destroy them; it builds its own. Each check runs in a real
forked child, whose exit status says whether it held."""

from __future__ import annotations

import os
import time
from typing import Callable

from kafka_eos.settings import KafkaSettings

#: How long a child is given for its check (it connects to nothing).
CHILD_TIMEOUT_S = 30


def _holds_in_a_forked_child(check: Callable[[], bool]) -> None:
    """Fork; ``check()`` in the child, its result (or an exception: False) the child's exit
    status; asserted here within :data:`CHILD_TIMEOUT_S`."""
    pid = os.fork()
    if pid == 0:
        try:
            ok = bool(check())
        except BaseException:  # noqa: BLE001 - reported as the exit status
            ok = False
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid, f"the child did not end within {CHILD_TIMEOUT_S} s"
    assert os.waitstatus_to_exitcode(done[1]) == 0, "the check failed in the child"


def _parked(obj: object) -> bool:
    """``obj`` is among what this (child) process keeps of its parent's clients."""
    from kafka_eos import kafka_admin

    # Each cache parked is a dict whose values are tuples holding the client (and its lock or age).
    return any(isinstance(parked, dict) and any(obj in value for value in parked.values())
               for parked in kafka_admin._inherited)


def _free(lock) -> bool:
    """``lock`` can be taken (and is given back): not one the parent held at the fork."""
    if not lock.acquire(timeout=1):
        return False
    lock.release()
    return True


def test_a_forked_child_reads_group_offsets_with_readers_of_its_own():
    """After the parent read group offsets: the parent's reader is neither used nor destroyed in
    the child; the child that reads builds its own."""
    from kafka_eos import txn

    settings = KafkaSettings("127.0.0.1:9")
    parent, _ = txn._shared_reader(settings, "g")
    try:
        with txn._readers_lock:  # held by another of the parent's threads at the fork: not the child's
            _holds_in_a_forked_child(lambda: not txn._readers and _parked(parent)
                                     and _free(txn._readers_lock)
                                     and txn._shared_reader(settings, "g")[0] is not parent)
        assert txn._shared_reader(settings, "g")[0] is parent  # the parent's own, untouched
    finally:
        txn._readers.pop((settings.key, "g"))[0].close()


def test_a_forked_child_keeps_no_commit_of_its_parents_stream():
    """A stream's kept per-partition commits (their producers): in the child, none is kept (a
    batch there builds its own commit), the parent's are parked, and the cache's lock is the
    child's own; the parent's commits stay its own."""
    from kafka_eos.sinks import per_partition

    commit = object()  # stands in for a kept TransactionalCommit
    key = ("kafka-eos.p.orders.0",)
    per_partition._kept[key] = (commit, time.monotonic())
    try:
        with per_partition._kept_lock:  # held by another of the parent's threads at the fork
            _holds_in_a_forked_child(lambda: not per_partition._kept and _parked(commit)
                                     and _free(per_partition._kept_lock))
        assert per_partition._kept[key][0] is commit
    finally:
        per_partition._kept.pop(key, None)
