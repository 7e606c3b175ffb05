"""The per-test CPU account (tests/cpu_account.py) on real child processes: what a child spends
between two snapshots is counted, what it spent before the first is not, whether it is still
running at the second or has ended and been waited for.

Each case runs in a fresh Python of its own and measures that process's tree. A pytest worker's
tree also holds what earlier tests left under it (its SparkSession's JVM, a fixture's broker),
whose own CPU between the snapshots would be counted too: a stop's CI once saw 0.4 s of it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from cpu_account import snapshot, spent

#: A child that burns CPU seconds of its own (sys.argv[1]), says so, waits for a line on stdin,
#: then burns sys.argv[2] more.
CHILD = """
import sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
burn(float(sys.argv[1]))
print("burnt", flush=True)
sys.stdin.readline()
burn(float(sys.argv[2]))
print("done", flush=True)
sys.stdin.readline()
"""


def _child(before_s: float, after_s: float) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(before_s), str(after_s)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "burnt\n"
    return child


def ends_between_the_snapshots() -> float:
    child = _child(0.8, 0.4)
    first = snapshot()
    child.communicate("go\nend\n", timeout=60)
    return spent(first, snapshot())


def still_running_at_the_second_snapshot() -> float:
    child = _child(0.2, 0.5)
    try:
        first = snapshot()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        return spent(first, snapshot())
    finally:
        child.communicate("end\n", timeout=60)


def started_and_ended_between_the_snapshots() -> float:
    first = snapshot()
    subprocess.run([sys.executable, "-c", CHILD, "0.3", "0.3"], input="go\nend\n", text=True, check=True,
                   capture_output=True, timeout=60)
    return spent(first, snapshot())


def _measured(case) -> float:
    """The seconds ``case`` measures, run in a fresh Python whose tree holds only its own child."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tests), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, __file__, case.__name__], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return float(out.stdout)


def test_a_child_that_ends_between_the_snapshots_counts_only_what_it_spent_after_the_first():
    seconds = _measured(ends_between_the_snapshots)
    # 0.4 of its own, and the measuring process's little; not the 0.8 it had spent before the first look.
    assert 0.35 <= seconds < 0.75, seconds


def test_a_child_still_running_at_the_second_snapshot_counts_its_growth():
    seconds = _measured(still_running_at_the_second_snapshot)
    assert 0.45 <= seconds < 0.7, seconds


def test_a_child_started_and_ended_between_the_snapshots_counts_whole():
    seconds = _measured(started_and_ended_between_the_snapshots)
    # Its 0.6 of burning and its interpreter's start.
    assert 0.55 <= seconds < 1.2, seconds


if __name__ == "__main__":
    print(globals()[sys.argv[1]]())
