"""The test suite's own scheduler (tests/conftest.py): a worker that dies mid-test fails that test,
the other tests still run, and the session ends (pytest-xdist 3.8's scope scheduling hung for
good instead, and a CI run with it sat at 99 % until its time ran out)."""

from __future__ import annotations

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
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
               KAFKA_EOS_TEST_BOOTSTRAP="127.0.0.1:1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "--dist", "loadscope",
                          "-p", "no:cacheprovider", "-q", "test_crash.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 failed, 10 passed" in run.stdout, run.stdout[-3000:]
    failed = sorted(line.split(" - ")[0] for line in run.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == ["FAILED test_crash.py::test_n[10]", "FAILED test_crash.py::test_n[3]"]
