"""How `make bench` reports a row: the median of its runs, each turn's ratio against its baseline,
and the JIT's CPU seconds shown beside the JVM's but counted once. Rows are built by hand; the
expected figures are literal."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from kafka_eos_lab.bench.throughput import JIT_PART, _jit_threads, _ratios, median_run, print_cpu, verdicts


def _runs(name: str, seconds: list[float], size: int = 1, records: int = 300_000) -> list[dict]:
    return [{"name": name, "size": size, "records_in": records, "seconds": s, "records_per_s": round(records / s),
             "run": i} for i, s in enumerate(seconds)]


def _line(lines: list[str], start: str) -> str:
    """The verdict line that begins with ``start``."""
    return next(v for v in lines if v.startswith(start))


def _rated(*named: tuple[str, list[float]]) -> list[dict]:
    """Rows (``(name, each run's seconds)``), each its median run, rated against their baselines."""
    rows = [median_run(_runs(name, seconds)) for name, seconds in named]
    _ratios(rows)
    return rows


def test_a_row_is_its_median_run_with_every_runs_seconds():
    row = median_run(_runs("atomic", [20.6, 19.2, 25.0]))
    assert (row["seconds"], row["run"]) == (20.6, 0)
    assert row["all_seconds"] == [20.6, 19.2, 25.0]
    # Of two runs, the slower: a single fast run does not make the row.
    assert median_run(_runs("atomic", [18.0, 21.0]))["seconds"] == 21.0
    assert median_run(_runs("atomic", [18.0]))["seconds"] == 18.0


def test_each_turn_is_compared_with_the_baselines_run_of_the_same_turn():
    rows = [median_run(_runs("baseline", [20.0, 22.0, 24.0])), median_run(_runs("per_partition", [25.0, 20.0, 20.0]))]
    _ratios(rows)
    baseline, per_partition = rows
    assert per_partition["x_turns"] == [0.8, 1.1, 1.2]
    assert per_partition["x_baseline"] == 1.1  # 22.0 s against 20.0 s, the medians
    assert "x_turns" not in baseline
    line = _line(verdicts(rows), "per_partition at 1x")
    assert line == ("per_partition at 1x: 1.1x the at-least-once baseline, medians (runs 20.0-25.0 s; turn by turn "
                    "0.8x / 1.1x / 1.2x) (target >= 1.1x): met")


def test_the_verdict_says_the_floor_and_the_writings_seconds_beyond_it():
    # The floor: the same read and transform written nowhere. Spark's sink writes for 6 s beyond it,
    # per_partition for 4 s; the floor is 26/20 = 1.3x the baseline: no Spark-read sink is faster.
    rows = _rated(
        ("baseline", [26.0, 27.0, 25.0]), ("per_partition", [24.0, 23.0, 25.0]), ("floor", [20.0, 19.0, 21.0]),
        ("baseline_connect", [8.0, 8.0, 8.0]), ("per_partition_connect_fresh", [10.0, 9.0, 9.5]),
        ("floor_connect_fresh", [6.0, 6.5, 5.5]),
        ("per_partition_connect", [7.0, 7.0, 7.0]))
    assert rows[2]["x_baseline"] == 1.3
    lines = verdicts(rows)
    assert _line(lines, "per_partition at 1x").endswith(
        "NOT met; the floor (the same read and transform, written nowhere) is 1.3x, so the writing took 4.0 s "
        "beyond it against Spark's sink's 6.0 s")
    # Through Connect, a session each, against the floor of a session each (not spark-submit's).
    assert _line(lines, "per_partition_connect_fresh at 1x").endswith(
        "is 1.33x, so the writing took 3.5 s beyond it against Spark's sink's 2.0 s")
    # In one session: no floor of that kind here, so nothing is said.
    assert _line(lines, "per_partition_connect at 1x").endswith("(target >= 1.1x): NOT met")
    # With one, against Spark's sink in one session too (not a session each).
    rows += [median_run(_runs(name, seconds)) for name, seconds in (
        ("baseline_connect_session", [6.0, 6.0, 6.0]), ("floor_connect", [5.0, 4.0, 4.5]))]
    _ratios(rows)
    assert rows[-1]["x_baseline"] == 1.33
    assert _line(verdicts(rows), "per_partition_connect at 1x").endswith(
        "(target >= 1.1x): NOT met; the floor (the same read and transform, written nowhere) is 1.33x, so the "
        "writing took 2.5 s beyond it against Spark's sink's 1.5 s")


def test_the_jits_seconds_are_shown_but_not_added_to_the_total(capsys):
    print_cpu([{"name": "baseline", "size": 1, "seconds": 10.0, "records_per_s": 1,
                "cpu_s": {"driver_jvm": 15.0, JIT_PART: 6.0, "driver_python": 1.0, "broker": 2.0}}])
    header, line = capsys.readouterr().out.strip().splitlines()
    assert header.split()[:6] == ["CPU", "seconds", "size", "s", "JVM", "its"]
    assert line.split() == ["baseline", "1", "10.0", "15.0", "6.0", "1.0", "2.0", "18.0", "1.8"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="/proc is Linux's")
def test_the_jit_threads_are_found_by_name_in_a_running_jvm(tmp_path):
    # A JVM that lives for a few seconds (a single-file program, compiled at launch): HotSpot's C1 and
    # C2 threads are there from its start.
    (tmp_path / "Wait.java").write_text(
        "class Wait { public static void main(String[] a) throws Exception { Thread.sleep(5000); } }")
    java = subprocess.Popen(["java", str(tmp_path / "Wait.java")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found: dict = {}
    try:
        while java.poll() is None and not found:
            found = _jit_threads(java.pid)
            time.sleep(0.05)
    finally:
        java.kill()
        java.wait(30)
    assert found and all(pid == java.pid and seconds >= 0 for (pid, _tid), seconds in found.items())
    assert _jit_threads(os.getpid()) == {}  # this Python has no compiler threads
    assert _jit_threads(2 ** 22 + 7) == {}  # above Linux's largest pid: no such process


def test_spark_sink_with_kafka_eos_producer_settings_is_compared_with_the_baseline_of_its_kind_and_the_floor():
    # Spark's sink with lz4 and larger batches: its producer's work, no target of its own; and per_partition
    # through its Python commit task, beside the JVM writer's row (no target either).
    rows = _rated(
        ("baseline", [26.0, 26.0, 26.0]), ("floor", [20.0, 20.0, 20.0]), ("spark_sink_lz4", [21.0, 22.0, 20.0]),
        ("baseline_connect", [8.0, 8.0, 8.0]), ("floor_connect_fresh", [6.0, 6.0, 6.0]),
        ("spark_sink_lz4_connect_fresh", [6.4, 6.4, 6.4]), ("per_partition_python", [24.0, 23.0, 25.0]),
        ("atomic_python", [26.0, 26.0, 26.0]))
    assert [r["x_baseline"] for r in rows] == [1.0, 1.3, 1.24, 1.0, 1.33, 1.25, 1.08, 1.0]
    assert [v for v in verdicts(rows) if v.startswith(("spark_sink_lz4", "per_partition_python", "atomic_python"))] == [
        "spark_sink_lz4 at 1x: 1.24x the baseline — Spark's sink with kafka-eos's producer settings: its producer's "
        "work, transactions aside (no target); the floor (the same read and transform, written nowhere) is 1.3x, so "
        "the writing took 1.0 s beyond it against Spark's sink's 6.0 s",
        "spark_sink_lz4_connect_fresh at 1x: 1.25x the baseline — Spark's sink with kafka-eos's producer settings: "
        "its producer's work, transactions aside (no target); the floor (the same read and transform, written "
        "nowhere) is 1.33x, so the writing took 0.4 s beyond it against Spark's sink's 2.0 s",
        "per_partition_python at 1x: 1.08x the baseline — per_partition through its Python commit task (a stream's, "
        "KAFKA_EOS_WRITER=python; no target); the floor (the same read and transform, written nowhere) is 1.3x, so "
        "the writing took 4.0 s beyond it against Spark's sink's 6.0 s",
        "atomic_python at 1x: 1.0x the baseline — atomic through the driver's Python producer (a stream's, "
        "KAFKA_EOS_WRITER=python; no target); the floor (the same read and transform, written nowhere) is 1.3x, so "
        "the writing took 6.0 s beyond it against Spark's sink's 6.0 s"]
    assert not any("target >=" in v for v in verdicts(rows))  # no scope's row here: no target line
