"""A test worker that crashes fails the session instead of hanging it, even when a process pool it
forked (Airflow's OpenLineage listener's) outlives it: a real pytest-xdist session in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _session(folder: Path, initializer: str) -> tuple[float, subprocess.CompletedProcess | None]:
    (folder / "conftest.py").write_text(textwrap.dedent("""
        import worker_pipes

        def pytest_configure(config):
            if hasattr(config, "workerinput"):
                worker_pipes.record()
    """))
    (folder / "test_crash.py").write_text(textwrap.dedent(f"""
        import os
        from concurrent.futures import ProcessPoolExecutor

        import worker_pipes

        def square(x):
            return x * x

        def pool_process_starts():
            with open("pool.pid", "w") as f:  # the test ends it when the session is over
                f.write(str(os.getpid()))
            {initializer}()

        def test_a_worker_with_a_pool_aborts():
            pool = ProcessPoolExecutor(max_workers=1, initializer=pool_process_starts)
            assert pool.submit(square, 3).result() == 9
            os.abort()  # what a librdkafka assertion does to the process

        def test_another():
            pass
    """))
    started = time.monotonic()
    # Its output to a file: the orphaned pool process holds the session's stdout and stderr too.
    with open(folder / "session.log", "w") as log:
        session = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                                    str(folder)], cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                                   env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"}, start_new_session=True)
    try:
        code = session.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(session.pid, signal.SIGKILL)
        session.wait()
        code = None
    finally:
        pid = (folder / "pool.pid").read_text() if (folder / "pool.pid").exists() else ""
        if pid:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = (folder / "session.log").read_text()
    return time.monotonic() - started, None if code is None else subprocess.CompletedProcess([], code, out, "")


def test_a_crashed_worker_fails_the_session_though_its_forked_pool_lives_on(tmp_path):
    seconds, done = _session(tmp_path, "worker_pipes.close_inherited")
    assert done is not None, "the session hung after its worker crashed"
    assert done.returncode == 1 and "crashed while running" in done.stdout and "1 failed, 1 passed" in done.stdout, \
        done.stdout[-2000:]
    assert seconds < 30


def test_the_openlineage_listeners_pool_closes_the_worker_pipes_first():
    import worker_pipes
    from airflow.providers.openlineage.plugins import listener

    original = listener._executor_initializer  # already wrapped, where this worker ran a DAG test
    try:
        worker_pipes.openlineage_pool_lets_go()
        wrapped = listener._executor_initializer
        worker_pipes.openlineage_pool_lets_go()  # once: not wrapped again
        assert wrapped.closes_worker_pipes and listener._executor_initializer is wrapped
    finally:
        listener._executor_initializer = original
