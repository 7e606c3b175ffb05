"""What a team sets on the DAGs the factory makes (:class:`kafka_eos_airflow.dag_factory.DagOptions`),
the ``[kafka_eos]`` configuration section, the Kafka connection shared with the Kafka provider, and a
spec's ``spark:`` section reaching spark-submit."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from urllib.parse import quote

import pytest
import yaml

from kafka_eos.spec import parse_spec, spec_document

ORDERS = {"source": {"topics": ["orders"]}, "sink": {"kind": "kafka", "topic": "orders.out"}}


def _folder(path, **specs):
    """A pipelines folder holding one spec per keyword (name -> extra spec fields)."""
    path.mkdir(exist_ok=True)
    for name, extra in specs.items():
        spec = parse_spec({"name": name, "source": {"topics": [f"{name}.in"]},
                           "sink": {"kind": "kafka", "topic": f"{name}.out"}, "schedule": "*/5 * * * *", **extra},
                          str(path / f"{name}.yaml"))
        (path / f"{name}.yaml").write_text(yaml.safe_dump(spec_document(spec)))
    return path


def test_the_factory_options_shape_every_dag_and_two_folders_never_collide(tmp_path):
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    from kafka_eos_airflow.dag_factory import kafka_eos_dags
    from kafka_eos_airflow.notifications.alerts import KafkaEosAlertRouter, KafkaEosEmailNotifier, KafkaEosWebhookNotifier

    theirs = SmtpNotifier(to="payments-oncall@example.com", subject="{{ ti.dag_id }} failed")
    pay = _folder(tmp_path / "payments", charges={}, refunds={})
    dags = kafka_eos_dags(pay, dag_id_prefix="payments__", default_args={"owner": "payments", "retries": 5},
                          tags=["team-payments"], pool="spark", queue="spark_workers", notifiers=[theirs],
                          stream_dags=lambda spec: spec.name == "charges", dag_kwargs={"max_active_tasks": 2})
    assert sorted(dags) == ["payments__kafka_eos__charges", "payments__kafka_eos__refunds",
                            "payments__kafka_eos_runbook_abort_transaction", "payments__kafka_eos_stream__charges",
                            "payments__kafka_eos_watchdog"]
    for dag_id, dag in dags.items():
        assert dag.dag_id == dag_id
        assert "team-payments" in dag.tags and "kafka-eos" in dag.tags
        assert dag.max_active_tasks == 2
        for task in dag.tasks:
            assert task.owner == "payments", (dag_id, task.task_id)
            callbacks = task.on_failure_callback
            assert [type(c) for c in callbacks] == [KafkaEosWebhookNotifier, KafkaEosEmailNotifier,
                                                    KafkaEosAlertRouter]
            assert callbacks[2].notifiers == [theirs]
            # The alerts name this prefix's runbook.
            assert {c.runbook_dag_id for c in callbacks} == {"payments__kafka_eos_runbook_abort_transaction"}
    pipeline = dags["payments__kafka_eos__charges"]
    assert {t.task_id: (t.pool, t.queue, t.retries) for t in pipeline.tasks} == {
        "plan": ("default_pool", "default", 5), "spark": ("spark", "spark_workers", 5),
        "verify": ("default_pool", "default", 5)}
    (stream,) = dags["payments__kafka_eos_stream__charges"].tasks
    assert (stream.pool, stream.queue) == ("spark", "spark_workers")
    watchdog = dags["payments__kafka_eos_watchdog"]
    assert {t.task_id: t.retries for t in watchdog.tasks} == {"hung_transactions": 0, "freshness": 0,
                                                              "refresh_checkpoints": 0}
    assert {tuple(t.pipelines) for t in watchdog.tasks} == {(str(pay / "charges.yaml"), str(pay / "refunds.yaml"))}
    runbook = {t.task_id: t for t in dags["payments__kafka_eos_runbook_abort_transaction"].tasks}
    assert sorted(runbook) == ["abort_transaction", "approve", "inspect"]
    assert [(runbook[t].pipelines_folder, runbook[t].retries) for t in ("inspect", "abort_transaction")] == [
        (str(pay), 0)] * 2

    # A second folder, another prefix: no DAG id in common; no stream DAGs where they are off.
    other = kafka_eos_dags(_folder(tmp_path / "risk", scores={}), dag_id_prefix="risk__", stream_dags=False)
    assert sorted(other) == ["risk__kafka_eos__scores", "risk__kafka_eos_runbook_abort_transaction",
                             "risk__kafka_eos_watchdog"]
    assert not set(other) & set(dags)
    # Without options: kafka-eos's own defaults, the bundled notifiers only.
    plain = kafka_eos_dags(pay)
    assert "kafka_eos__charges" in plain and "kafka_eos_stream__refunds" in plain
    (task,) = [t for t in plain["kafka_eos__charges"].tasks if t.task_id == "spark"]
    assert (task.owner, task.retries, task.pool) == ("kafka-eos", 2, "default_pool")
    assert [type(c) for c in task.on_failure_callback] == [KafkaEosWebhookNotifier, KafkaEosEmailNotifier]


def test_a_freshness_limit_gives_the_pipeline_dag_a_deadline_alerting_through_the_notifiers_named(tmp_path,
                                                                                                  monkeypatch):
    from datetime import timedelta

    from airflow.providers.http.notifications.http import HttpNotifier

    from kafka_eos_airflow.dag_factory import kafka_eos_dags

    folder = _folder(tmp_path / "p", late={"source": {"topics": ["late.in"], "freshness_limit_s": 600}}, free={})
    dags = kafka_eos_dags(folder, deadlines=True,
                          deadline_notifiers=[(HttpNotifier, {"http_conn_id": "hooks", "endpoint": "/x"})])
    (deadline,) = dags["kafka_eos__late"].deadline
    assert (type(deadline.reference).__name__, deadline.interval) == ("DagRunQueuedAtDeadline", timedelta(seconds=600))
    assert deadline.callback.path == "kafka_eos_airflow.notifications.alerts.deadline_missed"
    assert deadline.callback.kwargs == {"pipeline": "late", "limit_s": 600, "notifiers": [
        {"classpath": "airflow.providers.http.notifications.http.HttpNotifier",
         "kwargs": {"http_conn_id": "hooks", "endpoint": "/x"}}]}
    assert not dags["kafka_eos__free"].deadline  # no freshness limit, no deadline
    # On by [kafka_eos] deadlines (off by default), through the bundled notifiers unless named.
    assert not kafka_eos_dags(folder)["kafka_eos__late"].deadline
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__DEADLINES", "True")
    (default,) = kafka_eos_dags(folder)["kafka_eos__late"].deadline
    assert "notifiers" not in default.callback.kwargs
    assert not kafka_eos_dags(folder, deadlines=False)["kafka_eos__late"].deadline


def test_the_configuration_section_is_the_providers_and_is_read_from_airflows_config(tmp_path, monkeypatch):
    from airflow.configuration import conf

    from kafka_eos_airflow import config, get_provider_info
    from kafka_eos_airflow.dag_factory import kafka_eos_dags
    from kafka_eos_airflow.hooks.kafka import KafkaEosHook

    options = get_provider_info()["config"]["kafka_eos"]["options"]
    assert {"pipelines_folder", "kafka_conn_id", "spark_conn_id", "local_broker_fallback",
            "page_cache_seconds"} <= set(options)
    assert all(isinstance(o["default"], str) and o["description"] for o in options.values())

    folder = _folder(tmp_path / "configured", configured={})
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__PIPELINES_FOLDER", str(folder))
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__KAFKA_CONN_ID", "kafka_default")
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__SPARK_CONN_ID", "spark_yarn")
    assert conf.get("kafka_eos", "pipelines_folder") == str(folder)
    assert config.pipelines_folder() == folder
    assert KafkaEosHook().kafka_conn_id == "kafka_default"
    dags = kafka_eos_dags()  # no folder: the configured one
    assert sorted(dags) == ["kafka_eos__configured", "kafka_eos_runbook_abort_transaction",
                            "kafka_eos_stream__configured", "kafka_eos_watchdog"]
    spark = dags["kafka_eos__configured"].get_task("spark")
    assert (spark._conn_id, spark.kafka_conn_id) == ("spark_yarn", "kafka_default")
    assert dags["kafka_eos_stream__configured"].get_task("stream").spark_conn_id == "spark_yarn"
    # The operator page and the runbook read the same setting.
    from kafka_eos_airflow.plugins.operator_page import _load  # noqa: F401 - importable where the API server runs
    from kafka_eos_airflow.operators.runbook import AbortTransactionOperator

    assert AbortTransactionOperator(task_id="abort").kafka_conn_id == "kafka_default"

    # The owner check runs over the configured folder: a second spec taking the first one's group
    # leaves neither with DAGs, and loading it (as a task does) names the other.
    from kafka_eos.errors import SpecError
    from kafka_eos.spec import load_spec

    _folder(folder, taker={"source": {"topics": ["taker.in"], "group_id": "kafka-eos.configured"}})
    assert [d for d in kafka_eos_dags() if "configured" in d or "taker" in d] == []
    with pytest.raises(SpecError, match=r"taker.yaml: source.group_id: 'kafka-eos.configured' is also the group of "
                                        r"pipeline 'configured'"):
        load_spec(str(folder / "taker.yaml"), import_transform=False)


def test_a_named_connection_that_does_not_exist_is_an_error_naming_it(monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

    from kafka_eos_airflow.hooks.kafka import KafkaEosHook

    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "False")
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_PROD", raising=False)
    with pytest.raises(AirflowNotFoundException, match=r"^Kafka connection 'kafka_prod' is not defined: define it "
                                                       r"\(type kafka, extra \{\"bootstrap.servers\"") as missing:
        KafkaEosHook("kafka_prod").get_settings()
    assert isinstance(missing.value, AirflowFailException)  # no retries: a retry finds it missing too
    # Where the local Airflow turned the fallback on, the local broker stands in.
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "True")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert KafkaEosHook("kafka_prod").get_settings().bootstrap_servers == "127.0.0.1:1"


@pytest.mark.integration
def test_one_kafka_connection_serves_both_kafka_providers(kafka_settings, monkeypatch, unique):
    """A ``kafka_default`` as apache-airflow-providers-apache-kafka writes it (a consumer's
    ``group.id`` and offsets settings included): the Kafka provider produces through it, kafka-eos
    reads through it, and its consumer settings never reach kafka-eos's clients."""
    from airflow.providers.apache.kafka.hooks.produce import KafkaProducerHook
    from airflow.sdk.exceptions import AirflowException

    from kafka_eos import kafka_admin
    from kafka_eos.readers import read_committed
    from kafka_eos_airflow.hooks.kafka import KafkaEosHook, settings_from_connection

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": kafka_settings.bootstrap_servers, "group.id": "their-app", "enable.auto.commit": True,
        "auto.offset.reset": "earliest", "socket.keepalive.enable": True}}))
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__KAFKA_CONN_ID", "kafka_default")
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "False")
    topic = f"shared-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    producer = KafkaProducerHook(kafka_config_id="kafka_default").get_producer()
    producer.produce(topic, value=b"through the Kafka provider")
    assert producer.flush(30) == 0

    settings = KafkaEosHook().get_checked_settings()
    assert settings.bootstrap_servers == kafka_settings.bootstrap_servers
    assert dict(settings.extra) == {"socket.keepalive.enable": "true"}  # JSON true as librdkafka spells it
    assert [m.value for m in read_committed(settings, topic)] == [b"through the Kafka provider"]

    from airflow.sdk import Connection

    # Callbacks as the provider takes them: only what [apache_kafka] callback_allowlist lists.
    callback = Connection(conn_id="kafka_cb", conn_type="kafka", extra=json.dumps({
        "bootstrap.servers": "b:9092", "oauth_cb": "my_company.kafka.auth.oauth_cb"}))
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "")
    with pytest.raises(AirflowException, match=r"^connection 'kafka_cb': Refusing to resolve Kafka callback "
                                               r"oauth_cb='my_company.kafka.auth.oauth_cb': the \[apache_kafka\] "
                                               r"callback_allowlist is empty"):
        settings_from_connection(callback)
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "kafka_eos_lab.oauth.unsecured_token")
    with pytest.raises(AirflowException, match=r"^connection 'kafka_cb': Refusing .* not in the \[apache_kafka\] "
                                               r"callback_allowlist \(kafka_eos_lab.oauth.unsecured_token\)"):
        settings_from_connection(callback)
    # One a kafka-eos client must not take, allowlisted or not.
    logs = Connection(conn_id="kafka_log", conn_type="kafka", extra=json.dumps({
        "bootstrap.servers": "b:9092", "log_cb": "kafka_eos_lab.oauth.unsecured_token"}))
    with pytest.raises(AirflowException, match=r"^connection 'kafka_log': Kafka settings set log_cb: kafka-eos's "
                                               r"clients take no such callback"):
        settings_from_connection(logs)


@pytest.mark.integration
def test_a_held_pipeline_fails_its_plan_and_stream_tasks_without_retries(kafka_connection, kafka_settings, unique,
                                                                         tmp_path, monkeypatch, capsys):
    """A range committed short holds the pipeline (tests/integration/test_read_faults.py finds one
    for real; here its hold record is written as the finding writes it). The plan task and the
    stream task fail at once, without spending retries: neither a retry nor a restarted stream can
    help, only an operator's acknowledgement. The stream task runs the real ``kafka-eos stream``,
    which exits 4 before it starts Spark. A dry run shows the plan, and the hold. The operator
    page and ``kafka-eos pipelines`` show it too. An acknowledgement hides no finding that came in
    after its read."""
    from airflow.sdk.exceptions import AirflowFailException

    from kafka_eos import kafka_admin
    from kafka_eos.errors import PlanError
    from kafka_eos.manifest import ManifestStore, hold_key, hold_record
    from kafka_eos.pipeline import prepare_plan
    from kafka_eos_airflow.operators.pipeline import task_errors
    from kafka_eos_airflow.operators.stream import KafkaEosStreamOperator

    kafka_admin.create_topics(kafka_settings, {f"in-{unique}": 1, f"out-{unique}": 1})
    spec = parse_spec({"name": unique, "source": {"topics": [f"in-{unique}"]},
                       "sink": {"kind": "kafka", "topic": f"out-{unique}", "commit": "per_partition"}},
                      str(tmp_path / f"{unique}.yaml"))
    (tmp_path / f"{unique}.yaml").write_text(yaml.safe_dump(spec_document(spec)))
    store = ManifestStore.of(spec, kafka_settings)
    store.ensure_topic()
    with pytest.raises(PlanError, match=rf"^pipeline {unique}: run id 'hold' is reserved"):  # the manifest's keys
        prepare_plan(spec, kafka_settings, "hold")
    # An open transaction on the manifest (a side run's attempt killed mid-commit) pins its LSO
    # below the hold: the hold is read all the same (it is written outside any transaction).
    from confluent_kafka import Producer

    pinning = Producer(kafka_settings.client_config(**{"transactional.id": f"pin-{unique}"}))
    pinning.init_transactions(30)
    pinning.begin_transaction()
    pinning.produce(spec.manifest_topic, key=b"side", value=b"{}")
    assert pinning.flush(30) == 0
    finding = f"in-{unique}-0 [0, 10) of run 'run-1': Spark's transform gave 10 rows, the partition's transaction wrote 4"
    store.put(hold_key(spec.name), hold_record("run-1", finding))
    held = rf"^pipeline {unique} is held since .*: {re.escape(finding)}; nothing is planned until"
    offsets = kafka_admin.partition_offsets(kafka_settings, [(spec.manifest_topic, 0)])[(spec.manifest_topic, 0)]
    assert offsets.lso < offsets.high_watermark  # pinned

    with pytest.raises(AirflowFailException, match=held):  # what the plan task does
        with task_errors():
            prepare_plan(spec, kafka_settings, "run-2")
    pinning.abort_transaction(30)
    # The trigger form's dry run shows the plan, and says that no run takes it.
    from kafka_eos_airflow.operators.pipeline import KafkaEosPlanOperator

    notes = []
    ti = type("TaskInstance", (), {"xcom_push": lambda self, key, value: notes.append(value)})()
    dry = KafkaEosPlanOperator(task_id="plan", pipeline=spec.path, kafka_conn_id=kafka_connection).execute(
        {"params": {"dry_run": True}, "run_id": "dry-1", "ti": ti})
    assert dry["dry_run"] and (dry["held"]["run_id"], dry["held"]["mismatch"]) == ("run-1", finding), dry
    assert notes and notes[0].startswith(f"HELD since {dry['held']['found_at']}: no run takes this plan until "
                                         f"an operator acknowledges it (kafka-eos acknowledge {unique} --yes). "
                                         "DRY RUN:"), notes
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    stream = KafkaEosStreamOperator(task_id="stream", pipeline=spec.path, spark_conn_id="spark_default")
    with pytest.raises(AirflowFailException, match=rf"^kafka-eos stream {re.escape(spec.path)} exited with 4: "
                                                   rf"kafka-eos: pipeline {unique} is held since "):
        stream.execute({"params": {}})

    # The operator page and `kafka-eos pipelines` say so, with the finding and what ends it.
    from kafka_eos.cli import main
    from kafka_eos_airflow.plugins import operator_page

    monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(tmp_path))
    monkeypatch.setattr("kafka_eos_airflow.hooks.kafka.KafkaEosHook.get_checked_settings", lambda self: kafka_settings)
    monkeypatch.setattr(operator_page, "_cache", None)
    page = operator_page.overview()
    assert [(e["pipeline"], e["held"]["run_id"], e["held"]["mismatch"]) for e in page["pipelines"]] == [
        (unique, "run-1", finding)]
    html = operator_page.render(page)
    assert html.count('class="bad held"') == 1 and f"kafka-eos acknowledge {unique} --yes" in html
    capsys.readouterr()
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "pipelines"]) == 0
    out = capsys.readouterr().out
    assert "HELD (below)" in out and f"  {unique}: held since " in out and finding in out, out

    # Another run's finding written between the acknowledging read and the acknowledgement is not
    # hidden by it: written again, it holds the pipeline still (exit 3), until acknowledged itself.
    read = store.state()
    later = f"in-{unique}-0 [10, 20) of run 'run-3': Spark's transform gave 10 rows, the partition's transaction wrote 0"
    store.put(hold_key(spec.name), hold_record("run-3", later))
    record, newer = store.acknowledge(read.held, read.read_upto, who="test", at="now")
    assert (record["run_id"], record["held"], newer["run_id"], newer["mismatch"]) == ("run-1", False, "run-3", later)
    assert store.state().held["mismatch"] == later
    bootstrap = ["--bootstrap", kafka_settings.bootstrap_servers]
    assert main(["acknowledge", spec.path, "--yes", "--json", *bootstrap]) == 0
    out = capsys.readouterr().out  # after Airflow's own log lines, where it logs this process's to stdout
    assert json.JSONDecoder().raw_decode(out[out.index('{\n  "pipeline"'):])[0]["acknowledged"]["run_id"] == "run-3"
    assert store.state().held is None
    assert main(["acknowledge", spec.path, *bootstrap]) == 0 and "is not held" in capsys.readouterr().out
    # Two operators: one read finding X, then Y came in, another acknowledged Y, then the first X.
    # Both are acknowledged: X's acknowledgement writes Y back up only if nothing acknowledged it.
    store.put(hold_key(spec.name), hold_record("run-4", "X"))
    read_x = store.state()
    store.put(hold_key(spec.name), hold_record("run-5", "Y"))
    read_y = store.state()
    assert store.acknowledge(read_y.held, read_y.read_upto, who="b", at="now")[1] is None
    assert store.acknowledge(read_x.held, read_x.read_upto, who="a", at="now")[1] is None
    assert store.state().held is None
    # A finding newer than the acknowledgement holds the pipeline by itself: nothing written back.
    store.put(hold_key(spec.name), hold_record("run-6", "Z"))
    read_z = store.state()
    store.put(hold_key(spec.name), hold_record("run-7", "W"))
    record, newer = store.acknowledge(read_z.held, read_z.read_upto, who="a", at="now")
    assert newer["run_id"] == "run-7" and store.state().held["run_id"] == "run-7"


def test_a_specs_spark_section_reaches_spark_submit(tmp_path, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from kafka_eos.settings import KafkaSettings
    from kafka_eos.spark_io import connector_conf
    from kafka_eos_airflow.operators.pipeline import KafkaEosSparkSubmitOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEAM", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    spec = parse_spec({**ORDERS, "name": "sized", "spark": {
        "spark.executor.memory": "3g", "spark.dynamicAllocation.enabled": True,
        "spark.jars.packages": ["org.example:udfs:1.0"], "spark.pyspark.python": "/opt/team/bin/python"}},
        str(tmp_path / "sized.yaml"))
    op = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_team",
                                     conf={"spark.executor.cores": "2", "spark.executor.memory": "4g"})
    conf = op.submit_conf(spec)
    # The operator's own conf over the spec's, the spec's over kafka-eos's; package lists joined.
    assert (conf["spark.executor.memory"], conf["spark.executor.cores"]) == ("4g", "2")
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.pyspark.python"] == "/opt/team/bin/python"  # the user's interpreter, not ours
    ours = connector_conf()
    key = "spark.jars" if "spark.jars" in ours else "spark.jars.packages"
    assert conf[key].startswith(ours[key])
    assert conf["spark.jars.packages"].endswith("org.example:udfs:1.0")
    op.conf = conf
    assert op.spark_environ(KafkaSettings("broker-1:9092"), tmp_path)["PYSPARK_PYTHON"] == "/opt/team/bin/python"
    command = SparkSubmitHook(conf=conf, conn_id="spark_team")._build_spark_submit_command("run_pipeline.py")
    assert "spark.executor.memory=4g" in command and "spark.dynamicAllocation.enabled=true" in command

    with pytest.raises(Exception, match=r"sized.yaml: spark: 'executor.memory': not a Spark setting"):
        parse_spec({**ORDERS, "name": "sized", "spark": {"executor.memory": "3g"}}, str(tmp_path / "sized.yaml"))


def test_the_spark_task_refuses_cluster_deploy_mode_and_names_the_executors_python_on_a_cluster(
        tmp_path, monkeypatch):
    import sys

    from airflow.sdk.exceptions import AirflowFailException

    from kafka_eos_airflow.operators.pipeline import KafkaEosSparkSubmitOperator

    spec = parse_spec({**ORDERS, "name": "on_yarn"}, str(tmp_path / "on_yarn.yaml"))
    # The operator's own argument: refused at DAG parse time, in one line.
    with pytest.raises(ValueError, match=r"^spark: deploy mode 'cluster' is not supported: the run's plan and its "
                                         r"secrets are files on the Airflow worker"):
        KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, deploy_mode="cluster")
    # The connection's: refused before anything runs.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_CLUSTER", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    op = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn_cluster")
    with pytest.raises(AirflowFailException, match=r"^Spark connection 'spark_yarn_cluster': deploy mode 'cluster'"):
        op.submit_conf(spec)
    # A cluster master: the executors' Python must be named; never silently this worker's.
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps({"conn_type": "spark", "host": "yarn"}))
    op = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn")
    with pytest.raises(AirflowFailException, match=r"^Spark connection 'spark_yarn': master yarn: the executors' "
                                                   r"Python is not named: set spark.pyspark.python"):
        op.submit_conf(spec)
    from kafka_eos_airflow.operators.stream import KafkaEosStreamOperator

    stream = KafkaEosStreamOperator(task_id="stream", pipeline=spec.path, spark_conn_id="spark_yarn")
    with pytest.raises(AirflowFailException, match=r"^Spark connection 'spark_yarn': master yarn: the executors' "):
        stream._spark_master(spec)  # the stream's own Spark application: the same rule
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"spark.pyspark.python": "/opt/py/bin/python"}}))
    assert stream._spark_master(spec) == {"SPARK_MASTER": "yarn", "PYSPARK_PYTHON": "/opt/py/bin/python"}
    assert KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn").submit_conf(
        spec)["spark.pyspark.python"] == "/opt/py/bin/python"  # from the connection
    op = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn",
                                     conf={"spark.pyspark.python": "/opt/team/python"})
    assert op.submit_conf(spec)["spark.pyspark.python"] == "/opt/team/python"  # the operator's wins
    monkeypatch.setenv("PYSPARK_PYTHON", "/image/python")  # an image's environment names it
    assert KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn_bare").conf is None
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN_BARE", json.dumps({"conn_type": "spark", "host": "yarn"}))
    assert KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_yarn_bare").submit_conf(
        spec)["spark.pyspark.python"] == "/image/python"
    monkeypatch.delenv("PYSPARK_PYTHON")
    # A local master: this worker's interpreter, as before.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    op = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, conn_id="spark_local")
    assert op.submit_conf(spec)["spark.pyspark.python"] == sys.executable


ALERTS_DAG = '''
from datetime import datetime
from airflow.providers.http.notifications.http import HttpNotifier
from airflow.sdk import DAG, task
from kafka_eos_airflow.dag_factory import DagOptions
from kafka_eos_airflow.operators.pipeline import KafkaEosPlanOperator

# An Airflow notifier of the HTTP provider's own, templated: the only channel of these DAGs.
options = DagOptions(bundled_notifiers=False, notifiers=[HttpNotifier(
    http_conn_id="kafka_eos_alerts_webhook", endpoint="/theirs",
    json={{"said": "{{{{ kafka_eos_alert.text }}}}", "findings": "{{{{ kafka_eos_alert.findings | tojson }}}}"}})])

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args=options.args(retries=0)) as dag:
    @task
    def boom():
        raise ValueError("boom")

    KafkaEosPlanOperator(task_id="plan", pipeline={pipeline!r}) >> boom()
'''


@pytest.mark.integration
def test_an_airflow_notifier_of_the_teams_gets_the_alerts_and_the_failures(run_dag, kafka_settings, alert_receivers,
                                                                           tmp_path, unique):
    from confluent_kafka import Producer, TopicPartition

    from kafka_eos import kafka_admin

    topic = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1, f"out-{unique}": 1})
    spec = parse_spec({"name": unique, "source": {"topics": [topic], "on_data_loss": "skip"},
                       "sink": {"kind": "kafka", "topic": f"out-{unique}"}}, "p.yaml")
    path = tmp_path / f"{unique}.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    producer = Producer(kafka_settings.client_config())
    for _ in range(6):
        producer.produce(topic, value=b"order", partition=0)
    assert producer.flush(30) == 0
    kafka_admin.alter_group_offsets(kafka_settings, f"kafka-eos.{unique}", {(topic, 0): 1})
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(topic, 0, 4)])[TopicPartition(topic, 0, 4)].result(30)

    dag_id = f"theirs_{unique.replace('-', '_')}"
    dag_run = run_dag(dag_id, ALERTS_DAG.format(dag_id=dag_id, pipeline=str(path)))
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"plan": "success", "boom": "failed"}
    bodies, mails = alert_receivers
    assert mails == []  # the bundled notifiers are off
    said = {body["said"].split(" (run ")[0]: (body["said"], json.loads(body["findings"]))
            for endpoint, _type, body in bodies if endpoint == "/theirs"}
    assert len(bodies) == 2 and sorted(said) == [f"kafka-eos: {dag_id} / boom failed",
                                                 f"kafka-eos: {dag_id} / plan reports"], bodies
    # The payload besides the text: what, which pipeline and partition, since when, where to act.
    text, (failed,) = said[f"kafka-eos: {dag_id} / boom failed"]
    assert text.endswith("try 1): boom")
    assert (failed["what"], failed["task_id"], failed["error"]) == ("task_failed", "boom", "boom")
    assert failed["runbook"].endswith(f"/dags/{dag_id}/runs/{quote(dag_run.run_id)}/tasks/boom?try_number=1")
    text, (skipped,) = said[f"kafka-eos: {dag_id} / plan reports"]
    assert f"{topic}-0 [1, 4)" in text
    assert (skipped["what"], skipped["pipeline"], skipped["partition"], skipped["from"], skipped["until"]) == (
        "skipped_records", unique, f"{topic}-0", 1, 4)
    assert datetime.fromisoformat(skipped["since"]) <= datetime.now(timezone.utc)


def test_lineage_names_sql_places_by_the_naming_spec_without_credentials():
    from kafka_eos.settings import KafkaSettings
    from kafka_eos.sinks.sql_store import local_url
    from kafka_eos_airflow.assets.kafka import sink_asset
    from kafka_eos_airflow.lineage import output_places

    settings = KafkaSettings("broker-1:9092,broker-2:9092")
    pg = parse_spec({"name": "pg", "source": {"topics": ["in"]}, "sink": {
        "kind": "sql", "table": "analytics.revenue", "key_columns": ["k"],
        "url": "postgresql+psycopg2://writer:s3cret@db.example:6543/warehouse"}}, "pg.yaml")
    places = output_places(pg, settings)
    assert places == [
        ("output", "postgres://db.example:6543", "warehouse.analytics.revenue",
         "postgres://db.example:6543/warehouse/analytics/revenue"),
        ("dead_letters", "postgres://db.example:6543", "warehouse.public.kafka_eos_dead_letters",
         "postgres://db.example:6543/warehouse/public/kafka_eos_dead_letters")]
    assert "s3cret" not in repr(places) and "writer" not in repr(places)
    assert sink_asset(pg, settings).uri == "postgres://db.example:6543/warehouse/analytics/revenue"
    # url: local: the development SQLite file the sink writes.
    local = parse_spec({"name": "local", "source": {"topics": ["in"]},
                        "sink": {"kind": "sql", "table": "t", "key_columns": ["k"], "url": "local"}}, "local.yaml")
    path = local_url(local).removeprefix("sqlite:///")
    assert output_places(local, settings)[0][:3] == ("output", f"sqlite:///{path.lstrip('/')}", "t")
