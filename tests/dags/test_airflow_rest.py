"""A pipeline driven through Airflow's REST API, the way a user's tooling drives it, against a real
deployment (api-server, scheduler, dag-processor, triggerer; two Celery workers, PostgreSQL): trigger a
run with a conf, wait for it, read its state, its tasks and their logs. And the hung-transaction
sensor deferring into the real triggerer, whose trigger finds the culprit.

Every call goes through ``LocalAirflow.api`` (a bearer token from ``/auth/token``, then
``/api/v2/...``); each is named in a comment.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest
import yaml
from confluent_kafka import Producer
from test_backfill import _wait
from test_dag_runs import MALFORMED, VALID_ORDERS, produce_orders, read_committed
from test_sensors import SENSOR_DAG
from waiting import wait_until

from kafka_eos import kafka_admin

pytestmark = pytest.mark.integration

TERMINAL = ("success", "failed")


def _parsed(airflow, dag_id: str) -> None:
    # GET /api/v2/dags until it is listed, then PATCH /api/v2/dags/{dag_id}: new DAGs start paused.
    airflow.wait_for_dag(dag_id)


def _trigger_and_wait(airflow, dag_id: str, conf: dict) -> dict:
    """Trigger a run with ``conf``; wait until it ends."""
    # POST /api/v2/dags/{dag_id}/dagRuns
    run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    run_id = urllib.parse.quote(run["dag_run_id"], safe="")

    def ended():
        # GET /api/v2/dags/{dag_id}/dagRuns/{run_id}
        state = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        return state if state["state"] in TERMINAL else None

    return _wait(f"run {run['dag_run_id']} of {dag_id}", ended)


def _task_states(airflow, dag_id: str, run: dict) -> dict[str, str]:
    run_id = urllib.parse.quote(run["dag_run_id"], safe="")
    # GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances
    tis = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in tis}


def _log(airflow, dag_id: str, run: dict, task_id: str, try_number: int = 1) -> str:
    """The task's log, as the UI shows it: one line per event."""
    run_id = urllib.parse.quote(run["dag_run_id"], safe="")
    # GET /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}
    answer = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
                                "?full_content=true")
    lines = []
    for line in answer["content"]:
        if not isinstance(line, dict):
            lines.append(str(line))
            continue
        lines.append(line.get("event", "").strip())
        # An exception's message is in the structured entry, not in its event text.
        lines += [f"{e.get('exc_type')}: {e.get('exc_value')}" for e in line.get("error_detail") or []]
    return "\n".join(lines)


def deploy_orders_pipeline(airflow, kafka_settings, name: str, commit: str = "atomic", sql_url: str | None = None,
                           partitions: int = 1, sql_conn_id: str | None = None) -> tuple[dict[str, str], str]:
    """An orders pipeline on the deployment, its source holding 5 valid orders and a malformed one:
    its topics and its DAG's id, parsed and unpaused. Kafka sink (orders enriched, dead letters to
    a topic) in ``commit`` scope; or with ``sql_url``, the revenue aggregation into that database."""
    topics = {t: f"{name}.{t}" for t in ("orders", "out", "dlq")}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: partitions, topics["out"]: partitions,
                                               topics["dlq"]: 1})
    produce_orders(kafka_settings, topics["orders"])
    if sql_url is None and sql_conn_id is None:
        transform, sink = "spark_apps.transforms.orders:enrich", {
            "kind": "kafka", "topic": topics["out"], "dlq_topic": topics["dlq"], "commit": commit}
    else:
        database = {"url": sql_url} if sql_conn_id is None else {"conn_id": sql_conn_id}
        transform, sink = "spark_apps.transforms.revenue:revenue_per_minute", {
            "kind": "sql", **database, "table": f"{name}_revenue", "key_columns": ["minute", "category"],
            "merge": "add", "commit": commit}
    # Manual only (no schedule): every run is one the test triggers.
    (airflow.dags_folder.parent / "specs" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topics["orders"]]}, "transform": transform, "sink": sink}))
    dag_id = f"kafka_eos__{name}"
    _parsed(airflow, dag_id)
    return topics, dag_id


def test_a_pipeline_triggered_with_a_conf_through_the_rest_api(airflow_deployment, kafka_settings, unique):
    airflow = airflow_deployment
    name = f"rest_{unique.replace('-', '_')}"
    topics, dag_id = deploy_orders_pipeline(airflow, kafka_settings, name)  # 5 valid orders, then a malformed one

    # A run capped by its conf reads the first 3 offsets only.
    first = _trigger_and_wait(airflow, dag_id, {"max_records_per_partition": 3})
    assert first["state"] == "success" and first["conf"]["max_records_per_partition"] == 3
    assert _task_states(airflow, dag_id, first) == {"plan": "success", "spark": "success", "verify": "success"}
    plan_log = _log(airflow, dag_id, first, "plan")
    assert f"{topics['orders']}-0: [0, 3) checkpoint=None" in plan_log
    spark_log = _log(airflow, dag_id, first, "spark")
    assert "spark-submit --master local[2]" in spark_log and "run_pipeline.py" in spark_log
    verify_log = _log(airflow, dag_id, first, "verify")
    assert f"pipeline {name} run {first['dag_run_id']}: committed, 1 partition(s), in=3 out=3 dead letters=0" in verify_log
    out = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["out"])]
    assert out == [o["order_id"] for o in VALID_ORDERS[:3]]

    # A run with the defaults reads the rest, the malformed record into the dead-letter topic.
    second = _trigger_and_wait(airflow, dag_id, {})
    assert second["state"] == "success"
    assert (f"pipeline {name} run {second['dag_run_id']}: committed, 1 partition(s), in=3 out=2 dead letters=1"
            in _log(airflow, dag_id, second, "verify"))
    out = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["out"])]
    assert out == [o["order_id"] for o in VALID_ORDERS]
    assert [m.value() for m in read_committed(kafka_settings, topics["dlq"])] == [MALFORMED]


def test_a_sql_pipeline_writes_postgresql_through_an_airflow_connection(airflow_deployment, kafka_settings,
                                                                         postgres_url, unique):
    """The spec names the database's Airflow connection (no URL, no password anywhere in the spec or
    the environment): the tasks resolve it through Airflow's connections (here stored in the
    metadata database through the REST API) with the PostgreSQL provider's hook; the Spark task
    hands it to spark-submit in a file of its own. The rows and the offsets land in PostgreSQL."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    airflow = airflow_deployment
    u = unique.replace("-", "_")
    name, role, password = f"pgconn_{u}", f"writer_{u}", f"pw-{u}-secret"
    server = make_url(postgres_url)
    with create_engine(postgres_url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f"create database {name}"))
        conn.execute(text(f"create role {role} login password '{password}'"))
        conn.execute(text(f"alter database {name} owner to {role}"))
    conn_id = f"warehouse_{u}"
    # POST /api/v2/connections: the connection, its password in Airflow's store only.
    airflow.api("POST", "/api/v2/connections", {
        "connection_id": conn_id, "conn_type": "postgres", "host": server.host, "port": server.port,
        "login": role, "password": password, "schema": name})
    topics, dag_id = deploy_orders_pipeline(airflow, kafka_settings, name, sql_conn_id=conn_id)
    assert password not in (airflow.dags_folder.parent / "specs" / f"{name}.yaml").read_text()

    run = _trigger_and_wait(airflow, dag_id, {})
    assert run["state"] == "success" and _task_states(airflow, dag_id, run) == {
        "plan": "success", "spark": "success", "verify": "success"}
    for task in ("plan", "spark", "verify"):
        assert password not in _log(airflow, dag_id, run, task), task
    as_writer = server.set(username=role, password=password, database=name)
    with create_engine(as_writer).connect() as conn:
        orders = conn.execute(text(f"select sum(order_count) from {name}_revenue")).scalar()
        offsets = conn.execute(text("select topic, partition, next_offset from kafka_eos_offsets "
                                    "where pipeline = :p"), {"p": name}).all()
        dead = conn.execute(text("select count(*) from kafka_eos_dead_letters where pipeline = :p"),
                            {"p": name}).scalar()
    assert (orders, dead) == (len(VALID_ORDERS), 1)
    assert [tuple(r) for r in offsets] == [(topics["orders"], 0, len(VALID_ORDERS) + 1)]
    assert kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{name}", [(topics["orders"], 0)]) == {
        (topics["orders"], 0): len(VALID_ORDERS) + 1}


CONNECT_DAG = """\
from kafka_eos_airflow.dag_factory import dags_from_folder

globals().update(dags_from_folder({specs!r}, spark_conn_id={conn_id!r}))
"""


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_a_dag_run_through_a_spark_connect_connection(airflow_deployment, connect_server, kafka_settings, unique,
                                                      tmp_path, commit):
    airflow = airflow_deployment
    name = f"connect_{unique.replace('-', '_')}"
    topics = {t: f"{name}.{t}" for t in ("orders", "out", "dlq")}
    kafka_admin.create_topics(kafka_settings, {topics["orders"]: 1, topics["out"]: 1, topics["dlq"]: 1})
    produce_orders(kafka_settings, topics["orders"])  # 5 valid orders, then a malformed one
    # The Spark connection a user adds in the UI: type Spark Connect, the server's host and port.
    conn_id = f"spark_connect_{name}"
    # POST /api/v2/connections
    airflow.api("POST", "/api/v2/connections", {"connection_id": conn_id, "conn_type": "spark_connect",
                                                "host": "127.0.0.1", "port": connect_server.port})
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topics["orders"]]},
        "transform": "spark_apps.transforms.orders:enrich",
        "sink": {"kind": "kafka", "topic": topics["out"], "dlq_topic": topics["dlq"], "commit": commit}}))
    (airflow.dags_folder / f"{name}.py").write_text(CONNECT_DAG.format(specs=str(specs), conn_id=conn_id))
    dag_id = f"kafka_eos__{name}"
    _parsed(airflow, dag_id)

    run = _trigger_and_wait(airflow, dag_id, {})
    assert _task_states(airflow, dag_id, run) == {"plan": "success", "spark": "success", "verify": "success"}
    spark_log = _log(airflow, dag_id, run, "spark")
    assert f"through Spark connection '{conn_id}' (Spark Connect)" in spark_log and "spark-submit" not in spark_log
    assert (f"pipeline {name} run {run['dag_run_id']}: committed, 1 partition(s), in=6 out=5 dead letters=1"
            in _log(airflow, dag_id, run, "verify"))
    out = [json.loads(m.value())["order_id"] for m in read_committed(kafka_settings, topics["out"])]
    assert out == [o["order_id"] for o in VALID_ORDERS]
    assert [m.value() for m in read_committed(kafka_settings, topics["dlq"])] == [MALFORMED]


def test_the_hung_transaction_sensor_defers_to_the_real_triggerer(airflow_deployment, kafka_settings,
                                                                   killed_transaction, unique):
    airflow = airflow_deployment
    held = f"held-{unique}"
    kafka_admin.create_topics(kafka_settings, {held: 1})
    producer = Producer(kafka_settings.client_config())
    producer.produce(held, value=b"committed")
    assert producer.flush(30) == 0
    txid = f"stranger-{unique}"
    killed_transaction(txid, (held, 0))
    dag_id = f"sensor_{unique.replace('-', '_')}"
    (airflow.dags_folder / f"{dag_id}.py").write_text(SENSOR_DAG.format(dag_id=dag_id, topics=[held], older_than_s=1))
    _parsed(airflow, dag_id)

    run = _trigger_and_wait(airflow, dag_id, {})

    assert run["state"] == "failed" and _task_states(airflow, dag_id, run) == {"watch": "failed"}

    seen: list[str] = []

    def resumed_and_failed():
        # The run's state can turn failed a moment before the resumed task's last lines reach its
        # log (seen once in a loaded run): wait for them.
        seen[:] = log = _log(airflow, dag_id, run, "watch").splitlines()
        deferred = log.index("Pausing task as DEFERRED.") if "Pausing task as DEFERRED." in log else len(log)
        return log if any(line.startswith("HungTransactionsFound: ") for line in log[deferred:]) else None

    try:
        log = wait_until("the resumed task's failure in its log", resumed_and_failed, 60, every_s=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the log served last:\n" + "\n".join(seen)) from None
    # The task handed its wait to the triggerer, whose trigger fired; the task resumed and failed
    # naming the open transaction.
    deferred = log.index("Pausing task as DEFERRED.")
    (failure,) = [line for line in log[deferred:] if line.startswith("HungTransactionsFound: ")]
    resumed = log.index(failure)
    started = [i for i, line in enumerate(log) if line.startswith(f"trigger {dag_id}/{run['dag_run_id']}/watch/")
               and line.endswith("starting")]
    if started:
        # The triggerer's part of the task's log (its file beside the task's): the trigger started
        # after the deferral and before the task resumed. Its last lines ('Trigger fired event')
        # were missing once from the log the API served (a fresh clone's run); where present,
        # they come between.
        assert deferred < started[0] < resumed, log
        if "Trigger fired event" in log:
            assert started[0] < log.index("Trigger fired event") < resumed, log
    else:
        # Seen once in five full runs: the log the API served had no triggerer's part (the task's
        # own lines all there). The triggerer's process log then shows this trigger's work: the
        # health client's lookup of the stranger's transactional id, which only the trigger makes.
        triggerer = (airflow.home / "triggerer.log").read_text()
        assert f"Coordinator for TRANSACTION/{txid} is" in triggerer, "\n".join(log)
        print("the task log served had no triggerer's part:\n" + "\n".join(log))
    assert f"{held}-0: LSO 1 < HW 2 (1 offsets waiting), held for " in failure
    assert f"transactional.id {txid}" in failure
    print(failure)
