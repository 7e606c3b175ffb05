"""The deployment's tasks on Airflow's CeleryExecutor: two Celery workers, Redis as Celery's broker,
PostgreSQL as metadata DB and result backend (the ``airflow_deployment`` fixture). Every DAG test on
the deployment runs its tasks there; this one kills a worker (the worker and every process it
started, as when its host dies) while a pipeline's Spark task is inside its commit: the
transaction is open, its records and offsets are in it. Airflow finds the task without a heartbeat,
retries it, and the retry runs on the other worker (the killed one stays down until the run has
ended): every record once in the sink, none lost.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.parse

import psutil
import pytest
import yaml
from test_dag_runs import VALID_ORDERS, produce_orders, read_committed
from waiting import wait_until

from kafka_eos import kafka_admin

pytestmark = pytest.mark.integration

WORKERS = ("celery-worker-1", "celery-worker-2")


def _tree(pid: int) -> list[psutil.Process]:
    """A process and all it started."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _kill_host_of(airflow, pid: int) -> str:
    """SIGKILL the Celery worker whose process tree holds ``pid``, and its whole tree. Returns its name."""
    for worker in WORKERS:
        tree = _tree(airflow.pid(worker))
        if pid in {p.pid for p in tree}:
            for proc in tree:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            return worker
    raise AssertionError(f"process {pid} (the paused commit) runs under no Celery worker")


def test_a_worker_killed_mid_commit_is_retried_on_the_other_worker_exactly_once(airflow_deployment, kafka_settings,
                                                                                 unique):
    airflow = airflow_deployment
    name = f"celery_{unique.replace('-', '_')}"
    topics = {t: f"{name}.{t}" for t in ("orders", "out", "dlq")}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 1, topics["out"]: 1, topics["dlq"]: 1})
    produce_orders(kafka_settings, topics["orders"])  # 5 valid orders, then a malformed one
    (airflow.dags_folder.parent / "specs" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topics["orders"]]},
        "transform": "spark_apps.transforms.orders:enrich",
        "sink": {"kind": "kafka", "topic": topics["out"], "dlq_topic": topics["dlq"]}}))
    dag_id = f"kafka_eos__{name}"
    airflow.wait_for_dag(dag_id)

    airflow.pause_dir.mkdir()  # armed: the first commit to reach before_commit holds there
    killed = None
    try:
        run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {}})
        run_path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
        reached = airflow.pause_dir / "before_commit.reached"
        wait_until("the run's commit to reach before_commit", lambda: reached.exists() and reached.read_text().strip(),
                   timeout_s=300, every_s=0.5)
        killed = _kill_host_of(airflow, int(reached.read_text()))
        killed_at = time.monotonic()
        # Disarmed: the retry commits.
        for path in airflow.pause_dir.iterdir():
            path.unlink()
        airflow.pause_dir.rmdir()

        ended = wait_until("the run to end after its worker was killed",
                           lambda: (r := airflow.api("GET", run_path))["state"] in ("success", "failed") and r,
                           timeout_s=420, every_s=2)
        recovered_s = time.monotonic() - killed_at
        assert airflow.pid(killed) is None, f"{killed} came back during the retry"
        spark = next(ti for ti in airflow.api("GET", f"{run_path}/taskInstances")["task_instances"]
                     if ti["task_id"] == "spark")
        assert ended["state"] == "success", (ended, spark)
        assert spark["try_number"] == 2, spark
    finally:
        if airflow.pause_dir.exists():
            for path in airflow.pause_dir.iterdir():
                path.unlink()
            airflow.pause_dir.rmdir()
        if killed is not None:  # the next tests get two workers again
            airflow.launch(killed)
            wait_until(f"{killed} to be ready again", airflow.workers_ready, timeout_s=120, every_s=1)
    print(f"killed {killed} inside the commit; the run succeeded {recovered_s:.0f}s later, on its retry")

    # Exactly once: the killed attempt's open transaction was aborted (fenced by the retry's).
    out = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["out"])]
    assert out == [o["order_id"] for o in VALID_ORDERS]
    assert len(read_committed(kafka_settings, topics["dlq"])) == 1
