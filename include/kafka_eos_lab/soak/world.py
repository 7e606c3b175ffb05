"""The soak's world: a three-node cluster, PostgreSQL (the SQL sink's database and Airflow's), a
Spark Connect server for the DAG runs, and a local Airflow deployment (LocalExecutor scheduler,
triggerer, dag-processor, api-server) over three pipelines — the two bundled ones scheduled every
minute and a third run as a stream — with the watchdog, the runbook and the operator page. Alerts
go to a webhook receiver here, as they would to an on-call tool.

Everything binds 127.0.0.1, on ports from ``base_port`` up; the state lives under ``home``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import yaml

from kafka_eos.kafka_admin import create_topics
from kafka_eos.local.airflow import LocalAirflow, connections_environ, write_all_dags_file
from kafka_eos.local.kafka import LocalCluster
from kafka_eos.local.postgres import LocalPostgres
from kafka_eos.local.spark_connect import LocalSparkConnect
from kafka_eos.paths import PROJECT_ROOT
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec, load_spec

SOURCE = "orders"
#: The source's partitions at the start (a fault adds more).
SOURCE_PARTITIONS = 3
#: The third pipeline: the bundled orders pipeline as a stream, atomic scope, outputs of its own.
STREAM = "orders_stream"
#: The DAG runs' fail point (:mod:`kafka_eos_lab.faults`): a process passing it while the token file is
#: absent creates the file and is killed there. The fault driver arms it by removing the file.
CRASH_POINT = "before_commit"
#: The DAGs the soak drives, by the ids kafka-eos's DAG factory gives them (the REST API names DAGs by id).
WATCHDOG_DAG = "kafka_eos_watchdog"
RUNBOOK_DAG = "kafka_eos_runbook_abort_transaction"
STREAM_DAG = f"kafka_eos_stream__{STREAM}"


def pipeline_dag(name: str) -> str:
    return f"kafka_eos__{name}"


class AlertInbox:
    """An HTTP receiver on 127.0.0.1 for the webhook notifier: every body posted, with when."""

    def __init__(self) -> None:
        self.alerts: list[tuple[float, dict]] = []
        inbox = self.alerts

        class Receiver(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                inbox.append((time.time(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=self.server.serve_forever, name="alert inbox", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()


#: The SQL sink's database URL reaches the specs through this variable (Airflow's environment).
SQL_URL_VAR = "KAFKA_EOS_SOAK_SQL_URL"


def soak_specs(folder: Path, sql_url_var: str = SQL_URL_VAR) -> dict[str, Path]:
    """The soak's three specs in ``folder``: the bundled ``orders_enriched`` and ``revenue_per_minute``
    scheduled every minute, and ``orders_stream`` (the first as a stream, atomic, its own outputs)."""
    folder.mkdir(parents=True, exist_ok=True)
    bundled = PROJECT_ROOT / "include" / "pipelines"
    docs = {name: yaml.safe_load((bundled / f"{name}.yaml").read_text())
            for name in ("orders_enriched", "revenue_per_minute")}
    for doc in docs.values():
        doc["schedule"] = "* * * * *"
    docs["revenue_per_minute"]["sink"]["url"] = f"${{{sql_url_var}}}"
    stream = json.loads(json.dumps(docs["orders_enriched"]))
    stream.update(name=STREAM, schedule=None)
    stream["source"]["group_id"] = f"kafka-eos.{STREAM}"
    stream["sink"] = {"kind": "kafka", "topic": "orders.stream", "dlq_topic": "orders.stream.dlq", "commit": "atomic"}
    docs[STREAM] = stream
    specs = {}
    for name, doc in docs.items():
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        specs[name] = path
    return specs


@dataclass
class World:
    """Start with :meth:`start`, end with :meth:`stop` (everything it started, whatever failed)."""

    home: Path
    base_port: int = 19600
    started: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cluster = LocalCluster(self.home / "cluster", port=self.base_port)
        self.settings = KafkaSettings(self.cluster.bootstrap)
        self.postgres = LocalPostgres(port=self.base_port + 8)
        self.crash_token = self.home / "crash" / "killed"
        self.fail_points = {"KAFKA_EOS_CRASH_AT": CRASH_POINT, "KAFKA_EOS_CRASH_ONCE": str(self.crash_token)}
        # The fail point is the server's only: its Python workers run orders_enriched's per_partition
        # commits (a DAG's Spark task); the atomic and SQL commits run in the task, the stream in its own Spark.
        self.connect = LocalSparkConnect(self.home / "spark-connect", port=self.base_port + 9,
                                         environ=self.fail_points)
        self.specs_dir = self.home / "specs"
        self.spec_paths = soak_specs(self.specs_dir)
        self.inbox: AlertInbox | None = None
        self.airflow: LocalAirflow | None = None
        self.sql_url = ""
        self._specs: dict[str, PipelineSpec] = {}

    def spec(self, name: str) -> PipelineSpec:
        """The pipeline's spec, read once (after :meth:`start`: the SQL sink's URL is known then)."""
        if name not in self._specs:
            self._specs[name] = load_spec(str(self.spec_paths[name]), environ={**os.environ, SQL_URL_VAR: self.sql_url})
        return self._specs[name]

    @property
    def pipelines(self) -> list[str]:
        return list(self.spec_paths)

    def start(self, log=print) -> None:
        from sqlalchemy import create_engine, text

        # Disarmed until a fault removes it.
        self.crash_token.parent.mkdir(parents=True, exist_ok=True)
        self.crash_token.write_text("disarmed\n")
        log(f"PostgreSQL on 127.0.0.1:{self.postgres.port}")
        admin_url = self.postgres.start()
        self.started.append(self.postgres.stop)
        with create_engine(admin_url, isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text("create database soak"))
            conn.execute(text("create database airflow"))
        base = admin_url.rsplit("/", 1)[0]
        self.sql_url = f"{base}/soak"
        log(f"three Kafka nodes at {self.cluster.bootstrap}")
        self.cluster.start()
        self.started.append(self.cluster.stop)
        create_topics(self.settings, {SOURCE: SOURCE_PARTITIONS, "orders.enriched": 3, "orders.dlq": 1,
                                      "orders.backfill": 3, "orders.stream": 3, "orders.stream.dlq": 1})
        log(f"Spark Connect server at {self.connect.url}")
        self.connect.start()
        self.started.append(self.connect.stop)
        self.inbox = AlertInbox()
        self.started.append(self.inbox.close)
        dags = self.home / "dags"
        write_all_dags_file(dags, self.specs_dir)
        environ = {
            **connections_environ(self.settings, spark_remote=self.connect.url),
            "AIRFLOW__KAFKA_EOS__PIPELINES_FOLDER": str(self.specs_dir), SQL_URL_VAR: self.sql_url,
            # The operator page's figures are read fresh for the audit.
            "AIRFLOW__KAFKA_EOS__PAGE_CACHE_SECONDS": "1",
            "AIRFLOW_CONN_KAFKA_EOS_ALERTS_WEBHOOK": json.dumps({
                "conn_type": "http", "host": "127.0.0.1", "port": self.inbox.port, "schema": "http"}),
        }
        # The CeleryExecutor: Redis and two workers (a fault kills one); a task whose worker died
        # is retried after the deployment's heartbeat timeout (30 s, not Airflow's 5 minutes).
        self.airflow = LocalAirflow(self.home / "airflow", self.base_port + 10, dags, environ,
                                    database_url=f"{base}/airflow", executor="celery", redis_port=self.base_port + 11)
        log(f"Airflow at {self.airflow.url}")
        self.airflow.start()
        self.started.append(self.airflow.stop)
        for dag_id in (*(pipeline_dag(n) for n in self.pipelines if n != STREAM), WATCHDOG_DAG, RUNBOOK_DAG,
                       STREAM_DAG):
            self.airflow.wait_for_dag(dag_id)

    def stop(self) -> None:
        for stop in reversed(self.started):
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest whatever one did
                print(f"soak: stopping: {exc}")
        self.started.clear()
