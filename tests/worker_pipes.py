"""A test worker that crashes must fail the session, not hang it.

pytest-xdist learns that a worker died when the worker's pipes to the controlling process close.
A long-lived process forked from the worker keeps them open after its death: Airflow's OpenLineage
listener sends a DAG run's events through a ProcessPoolExecutor of the process that runs the DAG (a
worker, for ``dag.test()``), whose processes outlived a worker that a librdkafka abort killed and
hung a CI run. :func:`record` notes the worker's pipes when it starts; :func:`close_inherited`, run
first in each pool process, closes them there.
"""

from __future__ import annotations

import os
import stat

#: The variable that carries the worker's pipes to the processes it forks.
ENV = "KAFKA_EOS_TEST_WORKER_PIPES"


def record() -> None:
    """In a worker, at its start: its pipes (pytest-xdist's channel, nothing else is open yet)."""
    pipes = []
    for fd in range(3, 256):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                pipes.append(str(fd))
        except OSError:
            pass
    os.environ[ENV] = ",".join(pipes)


def close_inherited() -> None:
    """In a process forked from a worker: close the worker's pipes (see the module's docstring)."""
    for fd in filter(None, os.environ.get(ENV, "").split(",")):
        try:
            os.close(int(fd))
        except OSError:
            pass


def openlineage_pool_lets_go() -> None:
    """Airflow's OpenLineage listener's pool processes close the worker's pipes before anything else."""
    from airflow.providers.openlineage.plugins import listener

    original = listener._executor_initializer
    if getattr(original, "closes_worker_pipes", False):
        return

    def initializer():
        close_inherited()
        original()

    initializer.closes_worker_pipes = True
    listener._executor_initializer = initializer
