"""Stopping local services' process groups: side by side, SIGKILL for what ignores SIGTERM."""

from __future__ import annotations

import subprocess
import time

from kafka_eos.local.process_groups import group_alive, stop_groups

#: Each stubborn group notes when SIGTERM reached it, and keeps running.
STUBBORN = "trap 'date +%s.%N >> {log}' TERM; while true; do sleep 60 & wait; done"


def _group(script: str) -> int:
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    time.sleep(0.3)  # the trap is set
    return proc.pid


def test_groups_are_told_side_by_side_and_those_that_ignore_sigterm_are_killed(tmp_path):
    logs = [tmp_path / f"stubborn-{i}.log" for i in range(3)]
    stubborn = [_group(STUBBORN.format(log=log)) for log in logs]
    polite = _group("sleep 60")
    stop_groups([*stubborn, polite], term_timeout_s=5.0)
    assert not any(group_alive(g) for g in [*stubborn, polite])
    told = [float(log.read_text().split()[0]) for log in logs]
    # One after another, each group would be told only after the one before had its 5 s.
    assert max(told) - min(told) < 5.0, told


def test_a_group_already_gone_is_no_error():
    gone = _group("exit 0")
    time.sleep(0.2)
    stop_groups([gone], term_timeout_s=1.0)
    assert not group_alive(gone)
