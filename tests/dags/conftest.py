"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME (SQLite metadata DB) per test session.

Airflow reads its configuration once, when it is first imported, so the environment is set
here at import time, before any test module imports airflow. The dags-folder bundle of
``dag.test()`` runs is a temporary folder with one DAG file that builds, with the project's DAG
factory, a DAG per spec the tests write to ``TEST_SPECS_DIR`` (``dag.test()`` re-parses its
bundle and needs the DAG there). The project's own dags/ folder is parsed by explicit path.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from shared_servers import last_test_using


PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGS_DIR = PROJECT_ROOT / "dags"
PLUGINS_DIR = PROJECT_ROOT / "plugins"
#: The venv's bin: ``spark-submit`` and ``airflow`` resolve from PATH.
VENV_BIN = Path(sys.prefix) / "bin"

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="kafka-eos-airflow-"))
TEST_DAGS_DIR = AIRFLOW_HOME / "dags"
TEST_SPECS_DIR = AIRFLOW_HOME / "specs"
TEST_DAGS_DIR.mkdir()
TEST_SPECS_DIR.mkdir()
LINEAGE_FILE = AIRFLOW_HOME / "openlineage.jsonl"

os.environ.update({
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(TEST_DAGS_DIR),
    # The plugin loads through the package's entry point, as in a user's Airflow.
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(AIRFLOW_HOME / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    # OpenLineage's file transport: every task's events, one JSON document per line, which the
    # lineage assertions read (lineage_events).
    "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(LINEAGE_FILE),
                                                   "append": True}),
})
if str(VENV_BIN) not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
# What Airflow does for its plugins folder and dags folder; the tests import both directly.
for folder in (PLUGINS_DIR, DAGS_DIR):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

(TEST_DAGS_DIR / "kafka_eos_test_dags.py").write_text(f'''\
"""airflow DAGs of the DAG tests' pipeline specs, made by the project's DAG factory."""
import sys

if {str(DAGS_DIR)!r} not in sys.path:
    sys.path.insert(0, {str(DAGS_DIR)!r})

from kafka_eos_pipelines import dags_from_folder

globals().update(dags_from_folder({str(TEST_SPECS_DIR)!r}))
''')


@pytest.fixture(scope="session", autouse=True)
def _airflow_home():
    """Remove the session's AIRFLOW_HOME at the end."""
    yield AIRFLOW_HOME
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db():
    """The SQLite metadata DB, created once per session with ``airflow db migrate``."""
    import worker_pipes

    worker_pipes.openlineage_pool_lets_go()  # dag.test() runs here: a crash of this worker must not hang
    # A fresh SQLite migration takes well under a minute; 10 min covers 2 busy shared cores.
    res = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=os.environ.copy(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"airflow db migrate failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return AIRFLOW_HOME / "airflow.db"


@pytest.fixture(scope="session")
def pipelines_module():
    """The DAG factory module (dags/kafka_eos_pipelines.py)."""
    import kafka_eos_pipelines

    return kafka_eos_pipelines


@pytest.fixture
def kafka_connection(monkeypatch, kafka_settings):
    """The ``kafka_eos_kafka`` connection to the tests' broker, as Airflow reads it from the environment."""
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", json.dumps({
        "conn_type": "kafka", "extra": {"bootstrap.servers": kafka_settings.bootstrap_servers, **kafka_settings.extra}}))
    return "kafka_eos_kafka"


@pytest.fixture
def run_dag(airflow_db):
    """``run_dag(dag_id, source)``: ``dag.test()`` of the ``dag`` a DAG file defines; the file goes
    into the tests' dags folder first (``dag.test()`` re-parses its bundle). Returns the DagRun."""

    def run(dag_id: str, source: str):
        path = TEST_DAGS_DIR / f"{dag_id}.py"
        path.write_text(source)
        module_spec = importlib.util.spec_from_file_location(dag_id, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module.dag.test()

    return run


def _lineage_events(run_id: str | None = None, job_name: str = "") -> list[dict]:
    """The OpenLineage events the file transport wrote, in the order written: of the tasks of DAG run
    ``run_id`` (None: any), whose job names end with ``job_name``."""
    if not LINEAGE_FILE.exists():
        return []
    events = [json.loads(line) for line in LINEAGE_FILE.read_text().splitlines() if line.strip()]
    return [e for e in events if e["job"]["name"].endswith(job_name) and (run_id is None or (
            (e["run"]["facets"].get("airflow") or {}).get("dagRun") or {}).get("run_id") == run_id)]


@pytest.fixture
def lineage_events():
    """``lineage_events(run_id=None, job_name="")``: the OpenLineage events the tasks wrote (the
    session's file transport)."""
    return _lineage_events


class StatsdReceiver:
    """A StatsD server's socket on loopback: the kafka-eos metrics Airflow's StatsD client sent, as
    (name, value, type) per line (``airflow.kafka_eos.run.records_in.my-pipeline:6|c``). A thread
    drains the socket all along (Airflow's own metrics would fill its buffer) and keeps kafka-eos's."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[tuple[str, float, str]] = []
        self._closed = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while not self._closed.is_set():
            try:
                packet = self.sock.recv(65536).decode()
            except (TimeoutError, OSError):
                continue
            for line in packet.splitlines():
                name, _, rest = line.partition(":")
                if ".kafka_eos." in name:
                    value, _, kind = rest.partition("|")
                    self.lines.append((name, float(value), kind.split("|")[0]))

    def named(self, prefix: str, wait_s: float = 1.0) -> list[tuple[str, float, str]]:
        """The metrics received whose name starts with ``prefix``, after ``wait_s`` for late packets."""
        time.sleep(wait_s)
        return [m for m in list(self.lines) if m[0].startswith(prefix)]

    def environ(self) -> dict[str, str]:
        """Airflow's configuration that sends its metrics here."""
        return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(self.port)}

    def close(self) -> None:
        self._closed.set()
        self.sock.close()


@pytest.fixture
def statsd(monkeypatch):
    """Airflow's metrics configured to StatsD (``[metrics] statsd_on``) at a UDP socket the test
    reads. ``dag.test()`` runs tasks in this process, without the task runner's main, so the
    metrics backend is set up here the way that main sets it up in a worker's task process."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    receiver = StatsdReceiver()
    for key, value in receiver.environ().items():
        monkeypatch.setenv(key, value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    yield receiver
    monkeypatch.undo()
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    receiver.close()


@pytest.fixture
def alert_receivers(monkeypatch, free_ports):
    """A real HTTP receiver and a real SMTP server on loopback, and the Airflow connections that
    point the kafka-eos notifiers at them. Yields (webhook bodies, mails)."""
    from aiosmtpd.controller import Controller

    bodies: list = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            length = int(self.headers["Content-Length"])
            bodies.append((self.path, self.headers["Content-Type"], json.loads(self.rfile.read(length))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    mails: list = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
            mails.append((envelope.mail_from, envelope.rcpt_tos, envelope.content.decode()))
            return "250 OK"

    http = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    smtp_port = free_ports(1)
    smtp = Controller(Inbox(), hostname="127.0.0.1", port=smtp_port)
    smtp.start()
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_ALERTS_WEBHOOK", json.dumps({
        "conn_type": "http", "host": "127.0.0.1", "port": http.server_address[1], "schema": "http"}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_ALERTS_SMTP", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": smtp_port,
        "extra": {"to": "ops@example.com", "from_email": "kafka-eos@example.com", "disable_tls": True,
                  "disable_ssl": True}}))
    yield bodies, mails
    smtp.stop()
    http.shutdown()


#: The deployment's users with per-DAG permissions: DAG id patterns each may read.
PAGE_USERS = {"alice": ["kafka_eos__page_a_*"], "bob": ["team_c__*"]}


@pytest.fixture(scope="session")
def airflow_deployment(kafka_settings, free_ports, postgres_url):
    """A real Airflow deployment on 127.0.0.1, for the tests that need Airflow's scheduler
    (backfills), its executor or its API: api-server, scheduler, dag-processor, triggerer, on the
    CeleryExecutor (Redis as Celery's broker, PostgreSQL as metadata DB and result backend, two
    Celery workers that run every task of these tests). Its DAGs are made by the project's DAG
    factory from the specs the tests write to the ``specs`` folder beside its dags folder. Started
    once per session, stopped at its end.

    ``deployment.pause_dir``: the commits' pause points (``before_commit``, ``before_sql_commit``,
    see :mod:`kafka_eos_lab.faults`) are set for every task and armed only while this folder exists: a
    test makes it to hold one run's commit there (the worker-kill tests)."""
    from sqlalchemy import create_engine, text

    from kafka_eos.local.airflow import LocalAirflow, connections_environ, write_specs_dag_file

    # PostgreSQL, not SQLite: `airflow backfill create` writes while the scheduler runs, and SQLite
    # answers "database is locked".
    database = f"airflow_{uuid.uuid4().hex[:8]}"
    with create_engine(postgres_url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f"create database {database}"))

    home = Path(tempfile.mkdtemp(prefix="kafka-eos-airflow-deployment-"))
    (home / "dags").mkdir()
    (home / "specs").mkdir()
    write_specs_dag_file(home / "dags", home / "specs", "kafka_eos_deployed.py")
    # The operator page, the runbook and the watchdog read the pipelines of the specs folder from
    # Airflow's own configuration, as in a deployment (no KAFKA_EOS_PIPELINES_DIR).
    # Its metrics go to StatsD at a socket the tests read (deployment.statsd), as a deployment's would.
    statsd = StatsdReceiver()
    pause_dir = home / "pause"
    environ = {**connections_environ(kafka_settings, "local[2]"),
               "KAFKA_EOS_PAUSE_AT": "before_commit,before_sql_commit", "KAFKA_EOS_PAUSE_DIR": str(pause_dir),
               "AIRFLOW__KAFKA_EOS__PIPELINES_FOLDER": str(home / "specs"),
               "AIRFLOW__KAFKA_EOS__PAGE_CACHE_SECONDS": "1", "AIRFLOW__KAFKA_EOS__DEADLINES": "True",
               # Per-DAG permissions (the operator page's filter): alice and bob read only the
               # DAGs their patterns match (kafka_eos_lab.auth).
               "AIRFLOW__CORE__AUTH_MANAGER": "kafka_eos_lab.auth.DagPatternAuthManager",
               # The DAG factory's prefixes the page looks for (test_operator_page.py's team_c).
               "AIRFLOW__KAFKA_EOS__DAG_ID_PREFIXES": "team_c__",
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:viewer,bob:viewer",
               "KAFKA_EOS_LAB_DAG_ACCESS": json.dumps(PAGE_USERS),  # kafka_eos_lab.auth.ACCESS_ENV
               **statsd.environ()}
    deployment = LocalAirflow(home / "home", free_ports(1), home / "dags", environ,
                              database_url=postgres_url.rsplit("/", 1)[0] + f"/{database}", executor="celery",
                              redis_port=free_ports(1))
    for user in PAGE_USERS:
        deployment.password(user)  # in the simple auth manager's file before the API server starts
    deployment.statsd = statsd
    deployment.pause_dir = pause_dir
    deployment.start()
    yield deployment
    deployment.stop()
    statsd.close()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _deployment_left_quiet(request):
    """After each test on the shared deployment: every DAG it deployed is paused, its runs still
    going are marked failed (their tasks end), and the specs and DAG files it wrote are removed.
    Otherwise scheduled pipelines of earlier tests keep starting spark-submits every few minutes
    and hold the executor's slots while later tests wait for their own runs."""
    if "airflow_deployment" not in request.fixturenames:
        yield
        return
    airflow = request.getfixturevalue("airflow_deployment")
    folders = (airflow.dags_folder, airflow.dags_folder.parent / "specs")
    before = {p for folder in folders for p in folder.iterdir()}
    yield
    for path in {p for folder in folders for p in folder.iterdir()} - before:
        path.unlink()
    for dag in airflow.api("GET", "/api/v2/dags?limit=1000&paused=false")["dags"]:
        airflow.api("PATCH", f"/api/v2/dags/{dag['dag_id']}", {"is_paused": True})
    for run in airflow.api("GET", "/api/v2/dags/~/dagRuns?state=running&state=queued&limit=1000")["dag_runs"]:
        run_id = urllib.parse.quote(run["dag_run_id"], safe="")
        airflow.api("PATCH", f"/api/v2/dags/{run['dag_id']}/dagRuns/{run_id}", {"state": "failed"})
    if last_test_using(request, "airflow_deployment"):
        # The session's last test on the deployment: its four components would otherwise go on
        # polling (some 7% of a core) for the rest of the session. The fixture's own stop at the
        # session's end then finds nothing running.
        airflow.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the shared deployment reports the deployment's state beside its error:
    the components' health, the runs not ended, and the end of the scheduler's and triggerer's logs."""
    outcome = yield
    report = outcome.get_result()
    airflow = getattr(item, "funcargs", {}).get("airflow_deployment")
    if airflow is None or not report.failed:
        return
    lines = []
    try:
        with urllib.request.urlopen(f"{airflow.url}/api/v2/monitor/health", timeout=10) as resp:
            lines.append(f"health: {json.load(resp)}")
        runs = airflow.api("GET", "/api/v2/dags/~/dagRuns?state=running&state=queued&limit=100")["dag_runs"]
        lines += [f"not ended: {r['dag_id']} {r['dag_run_id']} {r['state']}" for r in runs] or ["not ended: none"]
    except Exception as exc:  # noqa: BLE001 - the report of a failure must not fail itself
        lines.append(f"the deployment did not answer: {exc!r}")
    for component in ("scheduler", "triggerer", "dag-processor"):
        log = airflow.home / f"{component}.log"
        tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
        lines += [f"--- {component}.log (last {len(tail)} lines)", *tail]
    report.sections.append(("airflow deployment", "\n".join(lines)))


@pytest.fixture
def browser(airflow_deployment):
    """Headless Chromium (Debian's ``chromium`` and ``chromedriver``, driven by Selenium), logged in
    to the deployment's UI as its admin (the session cookie the UI's own login sets)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1800"):
        options.add_argument(arg)
    # The system's driver, named: Selenium Manager would try to download one.
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    driver.implicitly_wait(20)  # the UI renders after its API calls answer
    try:
        driver.get(f"{airflow_deployment.url}/api/v2/version")
        driver.add_cookie({"name": "_token", "value": airflow_deployment.token(), "path": "/"})
        yield driver
    finally:
        driver.quit()
