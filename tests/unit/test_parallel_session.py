"""The test suite's own scheduler (tests/conftest.py): a worker that dies mid-test fails that test,
the other tests still run, and the session ends (pytest-xdist 3.8's scope scheduling hung for
good instead, and a CI run with it sat at 99 % until its time ran out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CRASHING = """
import os, signal
import pytest

@pytest.mark.parametrize("i", range(12))
def test_n(i):
    if i in (3, 10):
        os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_crashed_worker_fails_its_test_and_the_session_ends(tmp_path):
    (tmp_path / "test_crash.py").write_text(CRASHING)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    # The suite's conftest as a plugin; a stand-in broker address so that it starts none.
    # KAFKA_EOS_HOME: the session's durations go to its own folder, not this checkout's .local.
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
               KAFKA_EOS_TEST_BOOTSTRAP="127.0.0.1:1", KAFKA_EOS_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "--dist", "loadscope",
                          "-p", "no:cacheprovider", "-q", "test_crash.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 failed, 10 passed" in run.stdout, run.stdout[-3000:]
    failed = sorted(line.split(" - ")[0] for line in run.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == ["FAILED test_crash.py::test_n[10]", "FAILED test_crash.py::test_n[3]"]


RECORDING = """
import os, time
import pytest

def record(name):
    with open(os.environ["RUN_ORDER_FILE"], "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {time.monotonic():.3f} {name}\\n")
"""


def _ordered_session(tmp_path: Path, workers: int, modules: list[str], durations: Path, *args: str):
    """A parallel session of the suite's conftest over ``modules`` in ``tmp_path``, each test
    recording its worker in ``order.txt`` (``RECORDING``): (the finished run, order.txt)."""
    order_file = tmp_path / "order.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), str(tmp_path), env.get("PYTHONPATH", "")]),
               KAFKA_EOS_TEST_BOOTSTRAP="127.0.0.1:1", RUN_ORDER_FILE=str(order_file), KAFKA_EOS_HOME=str(tmp_path / "home"),
               KAFKA_EOS_TEST_DURATIONS=str(durations))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", str(workers), "--dist", "loadscope",
                          "-p", "no:cacheprovider", "-q", *args, *modules],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return run, order_file


def test_the_longest_work_starts_first_and_only_short_tests_wait_behind_it(tmp_path):
    """The soak, the wheel's test: by the recorded durations, a test of minutes collected last is
    handed out first, and what its worker holds behind it comes from the queue's end (the shortest
    tests), not the front (long tests another worker can start now)."""
    (tmp_path / "helper_order.py").write_text(RECORDING)
    for module in ("a", "c"):
        (tmp_path / f"test_{module}.py").write_text(
            "import pytest\nfrom helper_order import record\n\n"
            "@pytest.mark.parametrize('i', range(6))\n"
            f"def test_{module}(i):\n    record(f'{module}{{i}}')\n")
    (tmp_path / "test_z_long.py").write_text(
        "import time\nfrom helper_order import record\n\n"
        "def test_long():\n    record('long')\n    time.sleep(3)\n")
    # test_c's are the shortest; test_a's longer (but under a minute); the long test the longest.
    durations = {"test_z_long.py::test_long": 300.0,
                 **{f"test_a.py::test_a[{i}]": 20.0 - i for i in range(6)},
                 **{f"test_c.py::test_c[{i}]": 0.6 - i / 10 for i in range(6)}}
    (tmp_path / "durations.json").write_text(json.dumps(durations))
    run, order_file = _ordered_session(tmp_path, 2, ["test_a.py", "test_c.py", "test_z_long.py"],
                                       tmp_path / "durations.json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    runs = sorted((line.split() for line in order_file.read_text().splitlines()), key=lambda r: float(r[1]))
    assert len(runs) == 13
    long_worker = next(worker for worker, _, name in runs if name == "long")
    on_long_worker = [name for worker, _, name in runs if worker == long_worker]
    assert on_long_worker[0] == "long", on_long_worker
    # The two it held while the long test ran: the queue's last two (the shortest), not test_a's.
    assert sorted(on_long_worker[1:3]) == ["c4", "c5"], on_long_worker
    # The other worker took test_a's (longest first) before test_c's.
    other = [name for worker, _, name in runs if worker != long_worker]
    assert other[:6] == [f"a{i}" for i in range(6)], other
    # The session recorded what each test took, for the next one's order.
    recorded = json.loads((tmp_path / "home" / "test-durations.json").read_text())
    assert set(recorded) == set(durations) and recorded["test_z_long.py::test_long"] >= 3.0, recorded


def test_a_durations_file_that_is_no_mapping_of_seconds_orders_nothing(tmp_path, monkeypatch, pytestconfig):
    """A recorded-durations file that is missing, not JSON, or not a mapping of node ids to seconds
    leaves the order as pytest-xdist's own, instead of failing the session's scheduling."""
    # The suite's conftest as pytest loaded it (``import conftest`` may give another folder's).
    (conftest,) = [p for p in pytestconfig.pluginmanager.get_plugins()
                   if getattr(p, "__file__", None) == str(TESTS / "conftest.py")]

    path = tmp_path / "durations.json"
    monkeypatch.setenv(conftest.DURATIONS_ENV, str(path))
    try:
        for text in (None, "not json", "[1, 2]", '{"t.py::a": "x"}', '{"t.py::a": null}'):
            if text is not None:
                path.write_text(text)
            conftest._durations.cache_clear()
            assert conftest._durations() == {}, text
        path.write_text('{"t.py::a": 2, "t.py::b": 0.5}')
        conftest._durations.cache_clear()
        assert conftest._unit_seconds({"t.py::a": True, "t.py::b": False, "t.py::c": False}) == 2 + 0.5 + 5.0
        assert conftest._unit_seconds({"t.py::a": True, "t.py::b": False}, unfinished=True) == 0.5
    finally:
        conftest._durations.cache_clear()


def test_the_waiting_modules_run_on_the_last_worker_and_only_they(tmp_path):
    """With four workers, the modules marked ``waits`` go to the last one (gw3), which runs nothing
    else; the other three run the rest, and take waiting tests too once nothing else is queued."""
    (tmp_path / "helper_order.py").write_text(RECORDING)
    for module, mark, tests in (("busy", "", 9), ("sleepy", ", pytest.mark.waits", 4), ("nap", ", pytest.mark.waits", 2)):
        (tmp_path / f"test_{module}.py").write_text(
            "import time\nimport pytest\nfrom helper_order import record\n\n"
            f"pytestmark = [pytest.mark.integration{mark}]\n\n"
            f"@pytest.mark.parametrize('i', range({tests}))\n"
            f"def test_{module}(i):\n    record('{module}')\n    time.sleep(0.2)\n")
    run, order_file = _ordered_session(tmp_path, 4, ["test_busy.py", "test_sleepy.py", "test_nap.py"],
                                       tmp_path / "none.json", "-m", "integration or not integration")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "15 passed" in run.stdout, run.stdout[-3000:]
    runs = [line.split() for line in order_file.read_text().splitlines()]
    on_lane = [name for worker, _, name in runs if worker == "gw3"]
    assert len(on_lane) >= 3 and set(on_lane) <= {"nap", "sleepy"}, runs
    assert {worker for worker, _, name in runs if name == "busy"} <= {"gw0", "gw1", "gw2"}, runs
