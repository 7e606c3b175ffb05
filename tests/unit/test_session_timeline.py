"""The session's timeline (tests/session_timeline.py): workers' spans, the cores' use by minute,
and a sampler that reads the real ``/proc/stat``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from session_timeline import CoreSampler, by_minute, summary_lines, worker_spans  # noqa: E402


def test_each_workers_span_and_the_seconds_its_tests_took():
    tests = {"a": ("gw0", 100.0, 130.0), "b": ("gw0", 140.0, 200.0), "c": ("gw1", 105.0, 300.0)}
    assert worker_spans(tests) == {"gw0": (100.0, 200.0, 90.0, 2), "gw1": (105.0, 300.0, 195.0, 1)}


def test_the_cores_by_minute_average_their_samples_and_carry_a_minute_without_one():
    start = 1000.0
    samples = [(start - 5, 0.0), (start + 10, 0.5), (start + 50, 1.0), (start + 130, 0.2)]
    assert by_minute(samples, start) == [0.75, 0.75, 0.2]  # minute 1 has no sample: minute 0's


def test_the_summary_names_each_worker_and_the_quiet_minutes():
    start = 0.0
    tests = {"a": ("gw0", 0.0, 120.0), "b": ("gw1", 10.0, 40.0)}
    lines = summary_lines(tests, [(30.0, 0.9), (90.0, 0.3)], start)
    assert lines[0] == "gw0: 1 tests from 0 s to 120 s, in them 120 s (100% of its span)"
    assert lines[1] == "gw1: 1 tests from 10 s to 40 s, in them 30 s (100% of its span)"
    assert lines[2].endswith(": 90 30") and lines[3] == "mean 60%; under 60% in minute(s) 1"


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the sampler reads Linux's /proc/stat")
def test_the_sampler_sees_a_core_kept_busy():
    sampler = CoreSampler(every_s=0.2).start()
    end = time.monotonic() + 1.2
    while time.monotonic() < end:  # one core busy: at least 1/cores of the machine, less the rest's idle
        pass
    sampler.stop()
    busy = [b for _, b in sampler.samples]
    assert len(busy) >= 3, sampler.samples
    assert max(busy) >= 0.8 / (os.cpu_count() or 1), busy
