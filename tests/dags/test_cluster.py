"""The distributed path, on loopback: a Spark standalone cluster (a master and two workers, each
worker its own JVM launching its own executor) that the pipeline DAGs submit to through the
``spark_default`` connection, in client deploy mode, as on a real cluster.

Each DAG run's Spark application writes Spark's event log (the file Spark's history server reads)
into the test's folder: the tests read from it which executor, on which worker, ran each
per_partition transaction, and what happened to the executor that was killed mid-commit.
"""

from __future__ import annotations

import json
import os
import sys
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_dag_runs import _specs_dir, read_committed, returned, run_dag, write_spec

from kafka_eos import kafka_admin
from kafka_eos.local.spark import LocalSparkCluster
from kafka_eos.local.spark_startup import BASE_OPTS
from kafka_eos.manifest import ManifestStore
from kafka_eos.sample_data import produce_orders
from kafka_eos.sinks.per_partition import COMMIT_JOB

pytestmark = pytest.mark.integration

#: Orders per test: every source partition gets well over the 100 output records after which the
#: ``after_produce`` fail point fires.
ORDERS = 900
PARTITIONS = 3


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory, free_ports):
    """A master and two workers (1 core, one executor each), started once for this module. Their
    JVMs and the executors' (the workers pass their environment on) on the JIT's first tier and the
    serial collector, as the tests' drivers (kafka_eos.local.spark_startup): each application's
    executors live for a test's run, where most of a JVM's CPU goes to its JIT."""
    cluster = LocalSparkCluster(tmp_path_factory.mktemp("spark"), port=free_ports(1),
                                ui_port=free_ports(3),  # the master's UI, then one per worker
                                environ={"JAVA_TOOL_OPTIONS": BASE_OPTS})
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def on_cluster(monkeypatch, airflow_db, kafka_connection, spark_cluster, tmp_path):
    """``spark_default`` points at the cluster; every application logs its events under
    ``events`` (Spark settings as ``-Dspark.…`` system properties of the driver, which SparkConf
    reads like a ``spark-defaults.conf``; ``spark_defaults(extra)`` sets them again with extra
    settings). Not a ``SPARK_CONF_DIR``: it would change the driver's class path, and the drivers
    would start without the session's class-data archive (kafka_eos.local.spark_startup)."""
    # The executors' Python, named (the Spark task never assumes the worker's own on a cluster).
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark", "host": "spark://127.0.0.1", "port": spark_cluster.port,
        "extra": {"spark.pyspark.python": sys.executable}}))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the driver, in the task's spark-submit
    events = tmp_path / "events"
    events.mkdir()
    jvm_opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    # The executors the workers launch have the drivers' class path: the same archive serves them.
    archive = [o for o in jvm_opts.split() if o.startswith("-XX:SharedArchiveFile=")]

    def spark_defaults(extra: dict[str, str] | None = None) -> None:
        conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
                "spark.eventLog.compress": "false",
                # One file per application (Spark 4 rolls event logs into a folder by default).
                "spark.eventLog.rolling.enabled": "false",
                **({"spark.executor.extraJavaOptions": archive[0]} if archive else {}), **(extra or {})}
        assert not any(" " in f"{k}{v}" for k, v in conf.items()), "SPARK_SUBMIT_OPTS is split on spaces"
        monkeypatch.setenv("SPARK_SUBMIT_OPTS", " ".join([jvm_opts, *(f"-D{k}={v}" for k, v in conf.items())]))

    spark_defaults()
    return SimpleNamespace(events=events, spark_defaults=spark_defaults, cluster=spark_cluster)


def application_events(events: Path) -> list[dict]:
    """The events of the one application that ran (the run's Spark task)."""
    (log,) = [p for p in events.iterdir() if not p.name.endswith(".inprogress")]
    return [json.loads(line) for line in log.read_text().splitlines()]


def commit_tasks(events: list[dict], cluster: LocalSparkCluster, job: str | None = COMMIT_JOB) -> list[dict]:
    """Every attempt of a per_partition commit task (of every task, with ``job=None``): Spark task
    index, attempt, executor, the worker that launched it (its log URL points at the worker's UI)
    and how it ended."""
    stages = {s for e in events if e["Event"] == "SparkListenerJobStart"
              and (job is None or (e.get("Properties") or {}).get("spark.job.description") == job)
              for s in e["Stage IDs"]}
    worker_of = {}
    for e in events:
        if e["Event"] == "SparkListenerExecutorAdded":
            url = e["Executor Info"]["Log Urls"]["stdout"]
            port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            worker_of[e["Executor ID"]] = f"worker-{port - cluster.ui_port}"
    return [{"index": e["Task Info"]["Index"], "attempt": e["Task Info"]["Attempt"],
             "executor": e["Task Info"]["Executor ID"], "host": e["Task Info"]["Host"],
             "worker": worker_of.get(e["Task Info"]["Executor ID"]), "end": e["Task End Reason"]["Reason"]}
            for e in events if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in stages]


def _pipeline(kafka_settings, unique: str, bundled: str, **sink) -> tuple[str, dict]:
    name = f"{bundled[:3]}-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.enriched", "dlq": f"{name}.dlq"}
    kafka_admin.create_topics(kafka_settings, {t: (1 if k == "dlq" else PARTITIONS) for k, t in topics.items()})
    write_spec(bundled, name, topics, sink or {"topic": topics["enriched"], "dlq_topic": topics["dlq"]})
    return name, topics


def _assert_kafka_output_exactly_once(kafka_settings, name: str, topics: dict, truth) -> None:
    enriched = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["enriched"])]
    assert len(enriched) == len(set(enriched)), "an order was written twice"
    assert sorted(enriched) == sorted(o["order_id"] for o in truth.committed)
    assert len(read_committed(kafka_settings, topics["dlq"])) == truth.malformed
    # No transaction left open on the output: LSO == high watermark everywhere.
    out = [(topics["enriched"], p) for p in range(PARTITIONS)] + [(topics["dlq"], 0)]
    offsets = kafka_admin.partition_offsets(kafka_settings, out)
    assert {tp: o.lso for tp, o in offsets.items()} == {tp: o.high_watermark for tp, o in offsets.items()}
    # The checkpoint is at the end of the source.
    src = [(topics["orders"], p) for p in range(PARTITIONS)]
    ends = {tp: o.high_watermark for tp, o in kafka_admin.partition_offsets(kafka_settings, src).items()}
    assert kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{name}", src) == ends


def test_both_example_pipelines_run_exactly_once_on_the_cluster(on_cluster, kafka_settings, pipelines_module,
                                                                unique, tmp_path, capsys):
    # orders_enriched: Kafka sink, one transaction per source partition, on the executors.
    name, topics = _pipeline(kafka_settings, unique, "orders_enriched")
    truth = produce_orders(kafka_settings, topics["orders"], ORDERS)
    dag_run = run_dag(pipelines_module, name)
    _assert_kafka_output_exactly_once(kafka_settings, name, topics, truth)
    summary = returned(dag_run, "verify")
    assert (summary["records_in"], summary["dead_letters"]) == (len(truth.committed) + truth.malformed,
                                                                truth.malformed)
    tasks = commit_tasks(application_events(on_cluster.events), on_cluster.cluster)
    # Every source partition's transaction ran once, on an executor a worker launched (not the driver).
    assert sorted(t["index"] for t in tasks) == list(range(PARTITIONS))
    assert all(t["end"] == "Success" and t["worker"] in ("worker-1", "worker-2") for t in tasks), tasks
    with capsys.disabled():
        print(f"\n{name}: {summary['records_in']} records in, {summary['records_out']} out, "
              f"{summary['dead_letters']} dead letters; transactions: "
              + ", ".join(f"task {t['index']} on executor {t['executor']} ({t['worker']}, {t['host']})" for t in tasks))

    # revenue_per_minute: SQL sink, one database transaction on the driver, after a shuffle
    # across the executors.
    for log in on_cluster.events.iterdir():
        log.unlink()
    db = tmp_path / "revenue.db"
    rpm, rpm_topics = _pipeline(kafka_settings, unique, "revenue_per_minute", url=f"sqlite:///{db}")
    rpm_truth = produce_orders(kafka_settings, rpm_topics["orders"], ORDERS)
    run_dag(pipelines_module, rpm)
    with sqlite3.connect(db) as conn:
        counted = conn.execute("select sum(order_count) from revenue_per_minute").fetchone()[0]
        dead = conn.execute("select count(*) from kafka_eos_dead_letters where pipeline = ?", (rpm,)).fetchone()[0]
    assert (counted, dead) == (len(rpm_truth.committed), rpm_truth.malformed)
    executors = {e["Executor ID"] for e in application_events(on_cluster.events)
                 if e["Event"] == "SparkListenerExecutorAdded"}
    assert len(executors) == 2  # both workers' executors took part in the application


def test_an_executor_killed_mid_commit_is_retried_exactly_once(on_cluster, kafka_settings, pipelines_module,
                                                               unique, tmp_path, capsys):
    name, topics = _pipeline(kafka_settings, unique, "orders_enriched")
    truth = produce_orders(kafka_settings, topics["orders"], ORDERS)
    crashed = tmp_path / "crashed"
    # The first per_partition transaction to reach 100 produced records (flushed to the broker,
    # transaction open) SIGKILLs the executor JVM it runs in; no other attempt does.
    on_cluster.spark_defaults({"spark.executorEnv.KAFKA_EOS_CRASH_AT": "after_produce",
                               "spark.executorEnv.KAFKA_EOS_CRASH_KILL": "executor",
                               "spark.executorEnv.KAFKA_EOS_CRASH_ONCE": str(crashed)})

    dag_run = run_dag(pipelines_module, name)

    victim = int(crashed.read_text().split("pid=")[1].split()[0])
    assert not Path(f"/proc/{victim}").exists(), "the executor JVM was killed"
    _assert_kafka_output_exactly_once(kafka_settings, name, topics, truth)
    summary, parts = ManifestStore(kafka_settings, f"{name}.manifest", name).run_records(dag_run.run_id)
    assert summary["status"] == "committed" and len(parts) == PARTITIONS
    assert summary["records_in"] == len(truth.committed) + truth.malformed

    tasks = commit_tasks(application_events(on_cluster.events), on_cluster.cluster)
    lost = [t for t in tasks if t["end"] == "ExecutorLostFailure"]
    assert len(lost) == 1, tasks
    (retry,) = [t for t in tasks if t["index"] == lost[0]["index"] and t["end"] == "Success"]
    assert retry["executor"] != lost[0]["executor"]  # Spark ran the task again on a live executor
    assert sorted(t["index"] for t in tasks if t["end"] == "Success") == list(range(PARTITIONS))
    with capsys.disabled():
        print(f"\n{name}: executor {lost[0]['executor']} ({lost[0]['worker']}, pid {victim}) killed in task "
              f"{lost[0]['index']}'s transaction; retried as attempt {retry['attempt']} on executor "
              f"{retry['executor']} ({retry['worker']}); {summary['records_in']} records in, "
              f"{summary['records_out']} out, exactly once")


def test_the_stream_dag_runs_its_spark_application_on_the_cluster(on_cluster, kafka_settings, pipelines_module,
                                                                  unique):
    name = f"st-{unique}"
    topic, out = f"{name}.in", f"{name}.out"
    kafka_admin.create_topics(kafka_settings, {topic: 2, out: 2})
    truth = produce_orders(kafka_settings, topic, 300, malformed_every=0)
    (_specs_dir() / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topic], "max_records_per_partition": 60}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": out, "commit": "per_partition"}}))
    dag = pipelines_module.dags_from_folder(_specs_dir())[f"kafka_eos_stream__{name}"]
    dag.tasks[0].retries = 0
    dag_run = dag.test(run_conf={"until_caught_up": True, "interval_s": 0.2})
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"stream": "success"}

    values = [m.value() for m in read_committed(kafka_settings, out)]
    assert sorted(values) == sorted(json.dumps(o).encode() for o in truth.committed)  # exactly once
    events = application_events(on_cluster.events)
    (start,) = [e for e in events if e["Event"] == "SparkListenerApplicationStart"]
    assert start["App ID"].startswith("app-")  # a standalone master's application, not local mode
    # A stream's small batches commit their partitions from the driver (per_partition.driver_commits);
    # what they read, they read in the cluster's workers.
    tasks = commit_tasks(events, on_cluster.cluster, job=None)
    assert tasks and {t["worker"] for t in tasks} <= {"worker-1", "worker-2"}
