"""A SQL sink's database through Airflow's connections (``sink.conn_id``): resolved by the
connection's own provider hook through Airflow's secrets backends (the environment's
``AIRFLOW_CONN_*`` and a configured local-file backend, in a process of their own as the CLI's),
carried to a child process in a file of its own, never the environment; no default database."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from kafka_eos.errors import SpecError
from kafka_eos.settings import DATABASE_URL_FILE_ENV, KafkaSettings
from kafka_eos.spec import parse_spec

DOC = {"name": "rev", "source": {"topics": ["orders"]}, "transform": "identity",
       "sink": {"kind": "sql", "table": "t", "conn_id": "warehouse"}}

#: What the child process prints: the URL each spec resolves to, or the error.
PROBE = """
import json, sys
from kafka_eos.errors import SpecError
from kafka_eos.sinks.sql_store import database_url
from kafka_eos.spec import parse_spec
out = {}
for label, doc, fallback in json.loads(sys.argv[1]):
    try:
        out[label] = database_url(parse_spec(doc, "p.yaml", {}), fallback=fallback)
    except SpecError as exc:
        out[label] = "error: " + str(exc)
print(json.dumps(out))
"""


def _resolve(cases, env: dict) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SECRETS__"))}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_conn_id_resolves_through_the_environment_and_a_local_file_secrets_backend(tmp_path):
    with_url = {**DOC, "sink": {**DOC["sink"], "url": "sqlite:////tmp/fallback.db"}}
    http = {**DOC, "sink": {**DOC["sink"], "conn_id": "not_a_database"}}
    nope = {**with_url, "sink": {**with_url["sink"], "conn_id": "nope"}}
    cases = [["env", DOC, False], ["missing", {**DOC, "sink": {**DOC["sink"], "conn_id": "nope"}}, True],
             ["missing_with_url", nope, False], ["local_stack_fallback", nope, True], ["http", http, False]]
    env = {"AIRFLOW_CONN_WAREHOUSE": json.dumps({"conn_type": "postgres", "host": "db.example", "port": 6543,
                                                 "login": "writer", "password": "s3cret/pa ss", "schema": "dw"}),
           "AIRFLOW_CONN_NOT_A_DATABASE": "http://example.com"}
    got = _resolve(cases, env)
    # The postgres provider's hook builds the URL (its driver, the password quoted).
    from sqlalchemy.engine import make_url

    url = make_url(got["env"])
    assert url.get_backend_name() == "postgresql" and url.drivername.startswith("postgresql+psycopg"), got["env"]
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "writer", "s3cret/pa ss", "db.example", 6543, "dw")
    undefined = ("error: p.yaml: sink.conn_id: Airflow connection 'nope' is not defined here (in Airflow's "
                 "connections or, outside a task, its secrets backends: AIRFLOW_CONN_*, a configured backend)")
    # A spec that names a connection gets it or an error (the CLI too): never another database.
    assert got["missing"] == undefined and got["missing_with_url"] == undefined
    assert got["local_stack_fallback"] == "sqlite:////tmp/fallback.db"  # only Airflow's local stack
    assert got["http"] == "error: sink.conn_id: connection 'not_a_database' of type 'http' is not a SQL database's"

    # Airflow's local-file secrets backend (what an estate's Vault or cloud backend plugs into).
    db = tmp_path / "warehouse.db"
    (tmp_path / "connections.json").write_text(json.dumps({"warehouse": {"conn_type": "sqlite", "host": str(db)}}))
    got = _resolve([["file", DOC, False]], {
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(tmp_path / "connections.json")})})
    assert got["file"].startswith("sqlite:") and got["file"].endswith(str(db)), got
    from sqlalchemy import create_engine, text

    with create_engine(got["file"]).begin() as conn:  # the URL opens that very file
        conn.execute(text("create table t (x int)"))
    assert db.exists()


def test_the_resolved_database_travels_in_a_private_file_not_the_environment(tmp_path):
    url = "postgresql+psycopg://writer:s3cret@db.example:6543/dw"
    settings = KafkaSettings("127.0.0.1:9092", database_url=url)
    assert "s3cret" not in repr(settings)
    env = settings.to_environ(tmp_path / "client.json")
    assert "s3cret" not in json.dumps(env)
    path = env[DATABASE_URL_FILE_ENV]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert KafkaSettings.from_environ(env).database_url == url
    # It wins over the spec's own URL where the pipeline runs (a Spark driver).
    from kafka_eos.sinks.sql_store import database_url

    spec = parse_spec({**DOC, "sink": {**DOC["sink"], "url": "sqlite:////elsewhere.db"}}, "p.yaml", {})
    assert database_url(spec, KafkaSettings.from_environ(env)) == url


def test_there_is_no_default_database():
    with pytest.raises(SpecError, match=r"^p.yaml: sink: a sql sink needs its database"):
        parse_spec({**DOC, "sink": {"kind": "sql", "table": "t"}}, "p.yaml", {})


#: The CLI's way: its log set up, a connection resolved (Airflow imported and its logging
#: configured on the way), then a failure logged with its traceback as the CLI logs one.
CLI_PROBE = """
import json, logging, sys
from kafka_eos.errors import SpecError
from kafka_eos.logs import setup_cli_logging
from kafka_eos.sinks.sql_store import database_url
from kafka_eos.spec import parse_spec
setup_cli_logging()
try:
    database_url(parse_spec(json.loads(sys.argv[1]), "p.yaml", {}))
except SpecError:
    logging.getLogger("kafka_eos.cli").error("failed", exc_info=True)
print("the end")
"""


def test_a_connection_resolved_by_the_cli_leaves_its_log_in_the_log_file(tmp_path):
    """Airflow configures logging when the resolver first imports it: the CLI's log records (a
    failure's traceback) still go to its log file only, never to stdout (``--json``'s document)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SECRETS__"))}
    done = subprocess.run([sys.executable, "-c", CLI_PROBE, json.dumps(DOC)], capture_output=True, text=True,
                          timeout=120, env={**clean, "KAFKA_EOS_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "the end\n", done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    logged = (tmp_path / "logs" / "kafka-eos.log").read_text()
    assert "Airflow connection 'warehouse' is not defined here" in logged and "Traceback" in logged, logged


def test_a_database_other_than_sqlite_or_postgresql_is_refused_naming_the_field_not_the_password():
    from kafka_eos.sinks.sql_store import database_url

    def url(value: str) -> str:
        return database_url(parse_spec({**DOC, "sink": {"kind": "sql", "table": "t", "url": value}}, "p.yaml", {}))

    with pytest.raises(SpecError, match=r"^p.yaml: sink.url: dialect 'mysql' is not supported: SQLite or PostgreSQL$"):
        url("mysql://writer:s3cret@db.example/dw")
    with pytest.raises(SpecError, match=r"^p.yaml: sink.url: not a database URL \(") as refused:
        url("writer:s3cret@db.example")
    assert "s3cret" not in str(refused.value)
    assert url("postgresql+psycopg://writer:s3cret@db.example/dw").startswith("postgresql+psycopg://")
    assert url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
