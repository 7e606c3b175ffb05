"""A stream started by an Airflow task stops once that task's process is gone (its worker killed
under it), instead of living on as an orphan that holds the pipeline's lease."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec
from kafka_eos.stream.loop import StreamRunner

SPEC = {"name": "orphan_watch", "source": {"topics": ["orphan.in"]}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": "orphan.out"}}


def _runner() -> StreamRunner:
    # No Spark and no broker: only the loop's stop logic is used here.
    return StreamRunner(None, parse_spec(SPEC, "orphan_watch.yaml"), KafkaSettings("127.0.0.1:1"))


def test_a_stream_whose_parent_lives_goes_on():
    runner = _runner()
    runner.stop_with_parent(os.getppid(), every_s=0.02)
    time.sleep(0.3)
    assert not runner._stop.is_set()
    runner.stop()


def test_a_stream_whose_parent_ended_stops_naming_it():
    # A real process that has ended: its pid is no longer this process's parent.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(ended.stdout)
    runner = _runner()
    runner.stop_with_parent(gone, every_s=0.02)
    assert runner._stop.wait(2.0)
    assert runner._stop_reason == f"its parent process {gone} ended (an orphan stream stops)"
