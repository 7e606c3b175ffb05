"""The deployment's tasks on Airflow's CeleryExecutor: two Celery workers, Redis as Celery's broker,
PostgreSQL as metadata DB and result backend (the ``airflow_deployment`` fixture). Every DAG test on
the deployment runs its tasks there. These kill a worker:

- the worker and every process it started (as when its host dies) while a pipeline's Spark task is
  inside its commit: the transaction is open, its records and offsets are in it. Airflow finds the
  task without a heartbeat, retries it, and the retry runs on the other worker (the killed one stays
  down until the run has ended): every record once in the sink, none lost;
- the worker's process group while it runs a stream: the stream's process (a session of its own)
  is left an orphan and stops by itself; the task's retry on the other worker takes the lease and
  the stream goes on from its checkpoint, every record once.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse

import psutil
import pytest
import yaml
from test_airflow_rest import deploy_orders_pipeline
from test_dag_runs import VALID_ORDERS, read_committed
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


@pytest.mark.parametrize("sink,commit", [
    ("kafka", "atomic"),
    pytest.param("kafka", "per_partition", marks=pytest.mark.chaos),  # the commit in a Spark executor's Python worker
    pytest.param("sql", "atomic", marks=pytest.mark.chaos),
])
def test_a_worker_killed_mid_commit_is_retried_on_the_other_worker_exactly_once(airflow_deployment, kafka_settings,
                                                                                 unique, tmp_path, sink, commit):
    airflow = airflow_deployment
    name = f"celery_{unique.replace('-', '_')}"[:60]
    sql_url = f"sqlite:///{tmp_path / 'sink.db'}" if sink == "sql" else None
    # 5 valid orders, then a malformed one (two partitions for per_partition: a commit per partition).
    topics, dag_id = deploy_orders_pipeline(airflow, kafka_settings, name, commit, sql_url,
                                            partitions=2 if commit == "per_partition" else 1)
    point = "before_sql_commit" if sink == "sql" else "before_commit"

    airflow.pause_dir.mkdir()  # armed: the first commit to reach the point holds there
    killed = None
    try:
        run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {}})
        run_path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
        reached = airflow.pause_dir / f"{point}.reached"
        wait_until(f"the run's commit to reach {point}", lambda: reached.exists() and reached.read_text().strip(),
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
    print(f"{sink} {commit}: killed {killed} at {point}; the run succeeded {recovered_s:.0f}s later, on its retry")

    if sink == "sql":  # exactly once: every order counted once (merge add: twice would double them)
        from sqlalchemy import create_engine, text

        with create_engine(sql_url).connect() as conn:
            counted = conn.execute(text(f"select sum(order_count) from {name}_revenue")).scalar()
            dead = conn.execute(text("select count(*) from kafka_eos_dead_letters")).scalar()
        assert (counted, dead) == (len(VALID_ORDERS), 1)
        return
    # Exactly once: the killed attempt's open transaction was aborted (fenced by the retry's).
    out = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["out"])]
    assert sorted(out) == sorted(o["order_id"] for o in VALID_ORDERS)
    assert len(read_committed(kafka_settings, topics["dlq"])) == 1


def _stream_process(name: str) -> psutil.Process | None:
    """The ``kafka-eos stream`` process of pipeline ``name`` on this machine, if one runs."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "stream" in cmd and any(a.endswith(f"{name}.yaml") for a in cmd):
            return proc
    return None


def test_a_stream_whose_worker_is_killed_stops_and_resumes_on_the_other_worker(airflow_deployment, kafka_settings,
                                                                                unique):
    from collections import Counter

    from kafka_eos.sample_data import produce_orders
    from kafka_eos.spec import load_spec
    from kafka_eos.lease import stream_owner

    airflow = airflow_deployment
    name = f"cstream_{unique.replace('-', '_')}"
    topic, out = f"{name}.in", f"{name}.out"
    kafka_admin.create_topics(kafka_settings, {topic: 2, out: 2})
    before = produce_orders(kafka_settings, topic, 100, abort_every=0, malformed_every=0)
    path = airflow.dags_folder.parent / "specs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "source": {"topics": [topic]}, "transform": "identity",
                                    "sink": {"kind": "kafka", "topic": out, "commit": "per_partition"}}))
    spec = load_spec(str(path), import_transform=False)
    dag_id = f"kafka_eos_stream__{name}"
    airflow.wait_for_dag(dag_id)
    run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": {"interval_s": 0.5}})
    run_path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
    first = wait_until("the stream to hold its lease", lambda: stream_owner(spec, kafka_settings), timeout_s=240,
                       every_s=1)
    stream = wait_until("the stream's process", lambda: _stream_process(name), timeout_s=30)
    worker = next(w for w in WORKERS if stream.pid in {p.pid for p in _tree(airflow.pid(w))})

    # The worker's process group dies (a scheduler-style kill: the stream, in its own session, is
    # not in that group): the stream is an orphan now, and stops by itself.
    os.killpg(airflow.pid(worker), signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        wait_until("the orphaned stream to stop", lambda: not stream.is_running() or stream.status() == "zombie",
                   timeout_s=120, every_s=0.5)
        orphan_s = time.monotonic() - killed_at
        # Its task is retried on the other worker and the stream resumes from its checkpoint.
        after = produce_orders(kafka_settings, topic, 100, first_seq=100, abort_every=0, malformed_every=0)
        resumed = wait_until("a new stream to hold the lease", lambda: (o := stream_owner(spec, kafka_settings))
                             and o.member_id != first.member_id and o, timeout_s=300, every_s=2)
        resumed_s = time.monotonic() - killed_at
        expected = Counter(json.dumps(o).encode() for o in [*before.committed, *after.committed])
        wait_until("every record once in the sink",
                   lambda: Counter(m.value() for m in read_committed(kafka_settings, out)) == expected,
                   timeout_s=120, every_s=2)
        assert airflow.pid(worker) is None  # the retry ran on the other worker
        spark = airflow.api("GET", f"{run_path}/taskInstances")["task_instances"][0]
        assert spark["try_number"] == 2 and spark["state"] == "running", spark
        print(f"stream {name}: its worker killed, the orphan stopped in {orphan_s:.0f}s, the retry held the "
              f"lease {resumed_s:.0f}s after the kill ({resumed.client_id})")
    finally:
        airflow.api("PATCH", run_path, {"state": "failed"})  # ends the stream task
        airflow.launch(worker)
        wait_until(f"{worker} to be ready again", airflow.workers_ready, timeout_s=120, every_s=1)
