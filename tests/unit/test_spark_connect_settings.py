"""The Spark Connect mode's settings, without a server: the URL check, the Airflow connection a
local deployment gets from ``SPARK_REMOTE``, the server's command line, and the fail points a
task carries to a server's Python workers."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from kafka_eos_lab import faults
from kafka_eos.errors import KafkaEosError
from kafka_eos.local.airflow import LocalAirflow, connections_environ
from kafka_eos.local.spark_connect import SERVER_CLASS, LocalSparkConnect
from kafka_eos.settings import KafkaSettings
from kafka_eos.spark_io import _connect_url_params, with_session_id, check_reachable, pipeline_session_id


def test_an_unreachable_server_is_one_line_naming_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(KafkaEosError) as err:
            check_reachable(f"sc://127.0.0.1:{port}/;token=secret")
    assert str(err.value).startswith(f"Spark Connect server at 127.0.0.1:{port} is not reachable")
    assert "\n" not in str(err.value) and "secret" not in str(err.value)


@pytest.mark.parametrize("url", ["spark://127.0.0.1:7077", "127.0.0.1:15002", "sc://"])
def test_a_url_that_is_not_spark_connect_is_refused(url):
    with pytest.raises(KafkaEosError, match="expected sc://host"):
        check_reachable(url)


def test_a_pipelines_runs_of_one_day_name_one_session_and_anything_else_names_another():
    import uuid
    from datetime import date

    day = date(2026, 11, 28)
    conf = {"spark.sql.session.timeZone": "UTC"}
    first = pipeline_session_id("sc://h:15002", "orders", conf, day)
    assert first == pipeline_session_id("sc://h:15002", "orders", dict(conf), day)  # another run, same day
    assert uuid.UUID(first).version == 4  # what a Spark Connect client accepts as a session_id
    others = {pipeline_session_id("sc://h:15002", "payments", conf, day),  # another pipeline
              pipeline_session_id("sc://h:15002", "orders", {**conf, "spark.sql.shuffle.partitions": "4"}, day),
              pipeline_session_id("sc://h:15002", "orders", conf, date(2026, 11, 29)),  # the next day
              pipeline_session_id("sc://h:15002/;token=t2", "orders", conf, day),  # another token
              pipeline_session_id("sc://g:15002", "orders", conf, day)}  # another server
    assert first not in others and len(others) == 5


@pytest.mark.parametrize("url, expected", [
    ("sc://h:15002", "sc://h:15002/;session_id=S"),
    ("sc://h:15002/", "sc://h:15002/;session_id=S"),
    ("sc://h:15002/;token=t;user_id=u", "sc://h:15002/;token=t;user_id=u;session_id=S"),
])
def test_a_pipelines_session_id_joins_the_urls_parameters(url, expected):
    assert with_session_id(url, "S") == expected
    assert _connect_url_params(expected)["session_id"] == "S"


def test_spark_remote_makes_the_deployments_spark_connection_a_spark_connect_one(monkeypatch, tmp_path):
    settings = KafkaSettings("127.0.0.1:19092")
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15999")
    conn = json.loads(connections_environ(settings)["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert conn == {"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15999}
    # A master given wins over the environment's server; neither: local mode.
    assert json.loads(connections_environ(settings, "local[2]")["AIRFLOW_CONN_SPARK_DEFAULT"]) == \
        {"conn_type": "spark", "host": "local[2]"}
    monkeypatch.delenv("SPARK_REMOTE")
    assert json.loads(connections_environ(settings)["AIRFLOW_CONN_SPARK_DEFAULT"])["conn_type"] == "spark"
    # The components do not inherit SPARK_REMOTE: pyspark would make every session in a task remote.
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15999")
    assert "SPARK_REMOTE" not in LocalAirflow(tmp_path, 8080, tmp_path / "dags").env()


def test_the_server_listens_on_loopback_with_the_connector_and_this_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_REMOTE", "sc://elsewhere:1")
    server = LocalSparkConnect(tmp_path, port=15999)
    command = server.command()
    assert command[command.index("--class") + 1] == SERVER_CLASS
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15999"
    assert "spark-sql-kafka" in conf.get("spark.jars", conf.get("spark.jars.packages", ""))
    assert conf["spark.speculation"] == "false"
    env = server._env()
    assert "SPARK_REMOTE" not in env and env["SPARK_CONNECT_MODE"] == "0"
    assert Path(env["PYSPARK_PYTHON"]).name.startswith("python")
    assert server.url == "sc://127.0.0.1:15999"


def test_the_server_loads_kafka_eos_plugin_beside_the_connector_where_it_is_built(tmp_path, monkeypatch):
    from kafka_eos import spark_io

    jars, packaged = tmp_path / "jars", tmp_path / "package-jars"
    monkeypatch.setattr(spark_io, "jars_dir", lambda kind: jars / kind)
    monkeypatch.setattr(spark_io, "PACKAGED_JARS", packaged)
    (jars / "spark").mkdir(parents=True)
    (jars / "spark" / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()

    def conf():
        command = LocalSparkConnect(tmp_path, port=15999).command()
        return dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")

    assert "spark.connect.extensions.relation.classes" not in conf()  # not built: a server without it
    packaged.mkdir()
    (packaged / "kafka-eos-connect.jar").touch()  # an installed wheel's copy
    assert conf()["spark.jars"].split(",")[-1] == str(packaged / "kafka-eos-connect.jar")
    (jars / "connect").mkdir()
    (jars / "connect" / "kafka-eos-connect.jar").touch()  # a checkout's build goes first
    loaded = conf()
    assert loaded["spark.connect.extensions.relation.classes"] == spark_io.CONNECT_PLUGIN_CLASS
    assert loaded["spark.jars"].split(",") == [str(jars / "spark" / "spark-sql-kafka-0-10_2.13-4.2.0.jar"),
                                               str(jars / "connect" / "kafka-eos-connect.jar")]


def test_a_server_without_the_plugin_is_asked_for_the_layout_once_a_session(monkeypatch, caplog):
    """Its refusal (a server that does not know the relation): no layout, two passes; the
    session's later batches do not ask again. Any other failure is not remembered."""
    import pyspark.sql.connect.dataframe as connect_dataframe
    from pyspark.sql.connect.proto import Relation

    from kafka_eos import spark_io

    asked = []

    class Refusing:
        def __init__(self, plan, session):
            asked.append(plan.plan(None).extension.type_url)

        def collect(self):
            raise RuntimeError("[CONNECT_INVALID_PLAN.NO_HANDLER_FOR_EXTENSION] The Spark Connect plan is "
                               "invalid. No handler found for extension type: " + spark_io.READ_LAYOUT_TYPE)

    class Plan:
        def plan(self, client):
            return Relation()

    df = type("DataFrame", (), {"sparkSession": type("Session", (), {"session_id": "s-1", "client": None})(),
                                "_plan": Plan()})()
    monkeypatch.setattr(connect_dataframe, "DataFrame", Refusing)
    monkeypatch.setattr(spark_io, "_no_layout_plugin", set())
    with caplog.at_level("INFO", logger="kafka_eos.spark_io"):
        assert spark_io._connect_read_layout(df) is None
        assert spark_io._connect_read_layout(df) is None
    assert asked == [spark_io.READ_LAYOUT_TYPE]
    assert sum("does not answer kafka-eos's read layout" in r.getMessage() for r in caplog.records) == 1


def test_fail_points_carried_to_another_process_apply_inside_the_block_only(monkeypatch, tmp_path):
    for name in faults.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert faults.carried() == {} and not faults.armed("after_produce")
    monkeypatch.setenv("KAFKA_EOS_PAUSE_AT", "before_commit")
    monkeypatch.setenv("KAFKA_EOS_PAUSE_DIR", str(tmp_path))
    carried = faults.carried()
    assert carried == {"KAFKA_EOS_PAUSE_AT": "before_commit", "KAFKA_EOS_PAUSE_DIR": str(tmp_path)}
    for name in carried:
        monkeypatch.delenv(name)  # the other process: a Connect server's Python worker
    with faults.applied({**carried, "KAFKA_EOS_CRASH_AT": "after_produce:1000000"}):
        assert faults.armed("after_produce") and faults.armed("before_commit")
        assert os.environ["KAFKA_EOS_PAUSE_DIR"] == str(tmp_path)
        faults.point("after_produce")  # counted, not yet the pass that kills
    assert not faults.armed("after_produce") and not faults.armed("before_commit")
    assert "KAFKA_EOS_PAUSE_DIR" not in os.environ
    with faults.applied({}):  # nothing carried: the process keeps its own (a cluster's executors)
        assert not faults.armed("after_produce")


def test_the_lab_installs_its_fault_probe_here_and_names_it_to_the_processes_it_starts():
    import kafka_eos_lab
    from kafka_eos import probes

    assert kafka_eos_lab.PROBES_ENV == probes.PROBES_ENV
    assert os.environ[probes.PROBES_ENV] == "kafka_eos_lab.faults"
    assert probes._probe is faults
