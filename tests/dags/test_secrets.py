"""A pipeline run on the secured broker (TLS, SCRAM, ACLs) keeps the password out of process lists,
environment variables that kafka-eos sets, task logs, kafka-eos's log files and Airflow's database
(XCom and run notes included).

Before: the Spark task put the client settings, password included, into spark-submit's
environment (``KAFKA_EOS_CLIENT_CONFIG``), and Airflow's Spark hook turns that environment into
``--conf spark.kubernetes.driverEnv.…=…`` / ``spark.yarn.appMasterEnv.…`` arguments on Kubernetes
and YARN masters, where every process list shows them.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from test_dag_runs import VALID_ORDERS, produce_orders, read_committed, run_dag, write_spec

from kafka_eos import kafka_admin
from kafka_eos.settings import KafkaSettings

pytestmark = pytest.mark.integration

USER = "alice"


class ProcessWatch(threading.Thread):
    """Samples every process's command line, and the environment of the Spark job's processes,
    until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopped = threading.Event()
        self.cmdlines: set[str] = set()
        self.spark_environ: dict[str, str] = {}

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for proc in Path("/proc").glob("[0-9]*"):
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if "run_pipeline.py" in cmdline:
                        for var in (proc / "environ").read_bytes().split(b"\0"):
                            name, _, value = var.decode(errors="replace").partition("=")
                            self.spark_environ[name] = value
                except OSError:
                    continue  # gone, or not ours to read
                self.cmdlines.add(cmdline)


def test_a_dag_run_on_the_secured_broker_with_exactly_the_computed_acls_keeps_the_password_secret(
        airflow_db, secure_broker, pipelines_module, monkeypatch, capfd, caplog, unique):
    """Plan task, Spark task (Spark's own Kafka reader) and commit, over TLS and SCRAM, as a
    principal holding exactly what `kafka-eos acls` computes and nothing else."""
    from kafka_eos import acls
    from kafka_eos.paths import local_dir
    from kafka_eos.spec import load_spec
    from kafka_eos.topics import create_missing, pipeline_topics

    admin = secure_broker.admin
    user, user_settings, _file = secure_broker.user("dag")
    password = user_settings.extra["sasl.password"]
    name = f"sasl-{unique}"
    topics = {"orders": f"{name}.orders", "enriched": f"{name}.enriched", "dlq": f"{name}.dlq"}
    kafka_admin.create_topics(admin, {topics["orders"]: 2})
    path = write_spec("orders_enriched", name, topics, {"topic": topics["enriched"], "dlq_topic": topics["dlq"],
                                                        "backfill_topic": f"{name}.backfill"})
    spec = load_spec(str(path), import_transform=False)
    create_missing(admin, pipeline_topics(spec, admin))  # what `kafka-eos topics create --yes` does
    acls.apply(admin, acls.required_acls(spec), f"User:{user}")
    produce_orders(admin, topics["orders"])
    # The connections live in the environment here (AIRFLOW_CONN_*, the harness's own store); the
    # password is in the Kafka connection's extra (`sasl.password`), the one field the Kafka
    # provider's form shows, as the docs tell users to keep it.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", json.dumps({
        "conn_type": "kafka",
        "extra": {"bootstrap.servers": secure_broker.bootstrap, "security.protocol": "SASL_SSL",
                  "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
                  "ssl.ca.location": user_settings.extra["ssl.ca.location"]}}))
    log_dirs = [local_dir() / "logs", secure_broker.broker.home / "logs"]  # kafka-eos's, Spark's, the broker's
    logs_before = {f: f.stat().st_size for d in log_dirs for f in d.rglob("*") if f.is_file()}

    watch = ProcessWatch()
    watch.start()
    try:
        run_dag(pipelines_module, name)
    finally:
        watch.stopped.set()
        watch.join()

    # The run really went through the SASL_SSL listener, with the password: the output is there.
    assert len(read_committed(admin, topics["enriched"])) == len(VALID_ORDERS)
    # The watch saw the Spark job, its command line and its environment ...
    assert any("run_pipeline.py" in c for c in watch.cmdlines) and watch.spark_environ
    # ... and the password in neither (AIRFLOW_CONN_* is the harness's connection store).
    assert not [c for c in watch.cmdlines if password in c]
    assert not [k for k, v in watch.spark_environ.items() if password in v and not k.startswith("AIRFLOW_CONN_")]
    assert "KAFKA_EOS_CLIENT_CONFIG_FILE" in watch.spark_environ
    # Task logs (what Airflow printed and logged, spark-submit's output included) ...
    out, err = capfd.readouterr()
    logs = out + err + caplog.text
    assert "KAFKA_EOS_SUMMARY" in logs  # the Spark job's own output is among them
    assert password not in logs
    # ... and every file under AIRFLOW_HOME: log files and the metadata database, XCom included.
    airflow_home = Path(airflow_db).parent
    leaks = [str(f) for f in airflow_home.rglob("*") if f.is_file() and password.encode() in f.read_bytes()]
    assert not leaks
    # ... and what this run added to the log files of kafka-eos, Spark and the broker.
    for f in (f for d in log_dirs for f in d.rglob("*")):
        if f.is_file():
            with f.open("rb") as fh:
                fh.seek(logs_before.get(f, 0))
                assert password.encode() not in fh.read(), f
    # The client settings file is gone with the task.
    assert not Path(watch.spark_environ["KAFKA_EOS_CLIENT_CONFIG_FILE"]).exists()


def test_on_yarn_no_secret_reaches_the_spark_submit_command(monkeypatch, tmp_path):
    """Airflow's Spark hook turns env_vars into --conf arguments on YARN (and, with the same loop,
    on Kubernetes, whose hook needs the cncf.kubernetes provider, not installed here): what the
    Spark task gives it must hold no secret."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from kafka_eos_airflow.operators.pipeline import KafkaEosSparkSubmitOperator

    password = f"pw-{uuid.uuid4().hex}"
    settings = KafkaSettings("b:9092", extra={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                              "sasl.username": USER, "sasl.password": password})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": "yarn"}))
    operator = KafkaEosSparkSubmitOperator(task_id="spark", pipeline="orders_enriched", conn_id="spark_cluster")
    env = operator.spark_environ(settings, tmp_path)
    command = SparkSubmitHook(conn_id="spark_cluster", env_vars=env)._build_spark_submit_command("app.py")
    assert any("KAFKA_EOS_CLIENT_CONFIG_FILE" in arg for arg in command)  # the hook did put env into argv
    assert not [arg for arg in command if password in arg]
    assert json.loads((tmp_path / "kafka-client.json").read_text())["sasl.password"] == password
