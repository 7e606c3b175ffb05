"""Stopping local services' process groups: side by side, SIGKILL for what ignores SIGTERM."""

from __future__ import annotations

import subprocess
import time

from kafka_eos.local.process_groups import group_alive, stop_groups


def _group(script: str) -> int:
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    time.sleep(0.3)  # the trap is set
    return proc.pid


def test_groups_stop_side_by_side_and_one_that_ignores_sigterm_is_killed():
    stubborn = [_group("trap '' TERM; sleep 60 & wait; sleep 60") for _ in range(2)]
    polite = _group("sleep 60")
    started = time.monotonic()
    stop_groups([*stubborn, polite], term_timeout_s=2.0)
    took = time.monotonic() - started
    assert not any(group_alive(g) for g in [*stubborn, polite])
    # One SIGTERM wait for all of them (not one per group), then the SIGKILL.
    assert 2.0 <= took < 4.0, took


def test_a_group_already_gone_is_no_error():
    gone = _group("exit 0")
    time.sleep(0.2)
    stop_groups([gone], term_timeout_s=1.0)
    assert not group_alive(gone)
