"""A local Airflow 3 deployment: api-server, scheduler, dag-processor and triggerer as separate
processes (LocalExecutor; SQLite metadata, or PostgreSQL), on 127.0.0.1 only, over a dags folder and this
project's plugins. Or the same on Airflow's CeleryExecutor: Redis (Debian's ``redis-server``, on
127.0.0.1, its data in the home folder) as Celery's broker, the PostgreSQL metadata database as its
result backend, and Celery workers (two by default) that run the tasks. What ``airflow dags test``
is not: a real scheduler that creates runs (backfills included), a real triggerer for deferrable
sensors, an executor, and the REST API and UI.

It only starts the ``airflow`` command line (it never imports Airflow). Airflow's own log
servers are not started (``--skip-serve-logs``: they listen on every interface); task logs are
files under the home folder, which the api-server on the same machine reads.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote
from dataclasses import dataclass, field
from pathlib import Path

from kafka_eos.errors import KafkaEosError
from kafka_eos.local.postgres import LocalPostgres, _kernel_free_port
from kafka_eos.paths import IN_CHECKOUT, PROJECT_ROOT, local_dir, pipelines_dir
from kafka_eos.local.process_groups import group_of, stop_groups

HOST = "127.0.0.1"
#: The components, each an ``airflow`` subcommand of its own process.
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The executors a local deployment runs on.
EXECUTORS = ("local", "celery")
#: Task slots of each Celery worker (two workers share the deployment's 4).
CELERY_CONCURRENCY = 2
#: A task whose process stopped heartbeating for this long (a worker or its host died) is failed
#: and retried; Airflow's default is 300 s. The task runner heartbeats every few seconds.
TASK_HEARTBEAT_TIMEOUT_S = 30
#: A task queued longer than this (and looked for this often) is taken back and queued again: a
#: Celery worker killed after it took a task's message but before the task started leaves the task
#: "queued" (no heartbeat to miss) until then; Airflow's defaults are 600 s and every 120 s. Taken
#: back twice, a task is failed: a deployment whose tasks wait longer for a free worker slot raises it.
TASK_QUEUED_TIMEOUT_S, TASK_QUEUED_CHECK_S = 60, 15
#: How often :meth:`LocalAirflow.wait_for_dag` asks again for its parse while the DAG is not there.
PARSE_REQUEST_EVERY_S = 5
#: Migrating a fresh SQLite database and starting four Python processes on 2 busy cores.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
#: The login of the local deployment (Airflow's simple auth manager; its password is generated).
ADMIN = "admin"
#: A REST call's read timeout. A token request or a GET whose answer does not come within it is
#: asked again until :data:`REST_PATIENCE_S` have passed since its first try: on a saturated
#: machine the API server can be slower than one read timeout. Any other call (a DAG run's POST)
#: is asked once only, and waited for as long (asked again, it could trigger two runs).
REST_READ_S = 60.0
REST_PATIENCE_S = 180.0
#: A user's bearer token is used for this long, then asked for again (Airflow issues it for 24 h);
#: sooner when the API server refuses it (401: a restarted deployment's new signing key).
TOKEN_REUSE_S = 600.0


def _timed_out(exc: OSError) -> bool:
    """The server took longer than the read timeout (not: refused, reset, an HTTP error)."""
    return isinstance(exc, TimeoutError) or (type(exc) is urllib.error.URLError and isinstance(exc.reason, TimeoutError))


def _answer(req: urllib.request.Request, again_on_timeout: bool) -> bytes:
    """The body of the answer to ``req``, waited for :data:`REST_PATIENCE_S` in all: in one read
    (a request not safe to repeat), else in reads of :data:`REST_READ_S`, asked again after each
    that timed out (``again_on_timeout``).

    :raises urllib.error.HTTPError: the API server answered with an error.
    :raises OSError: no answer (refused, reset; a timeout once patience ran out).
    """
    if not again_on_timeout:
        with urllib.request.urlopen(req, timeout=REST_PATIENCE_S) as resp:
            return resp.read()
    deadline = time.monotonic() + REST_PATIENCE_S
    while True:
        try:
            # Never zero or less (the clock may pass the deadline between the check below and here).
            with urllib.request.urlopen(req, timeout=max(0.01, min(REST_READ_S, deadline - time.monotonic()))) as resp:
                return resp.read()
        except OSError as exc:
            if not _timed_out(exc) or time.monotonic() >= deadline:
                raise


def connections_environ(settings, spark_master: str | None = None, spark_remote: str | None = None) -> dict[str, str]:
    """The project's connections, as Airflow reads them from the environment: ``kafka_eos_kafka``
    to the cluster of ``settings``, ``spark_default`` to ``spark_master`` (default: ``SPARK_MASTER``,
    else local mode; e.g. ``spark://127.0.0.1:7077``, the cluster of ``kafka-eos spark start``) or,
    given ``spark_remote`` (default: ``SPARK_REMOTE``; e.g. ``sc://127.0.0.1:15002``, the server of
    ``kafka-eos spark start --connect``), a Spark Connect connection to that server."""
    from urllib.parse import urlparse

    remote = spark_remote or (None if spark_master else os.environ.get("SPARK_REMOTE"))
    if remote:
        url = urlparse(remote)
        spark = {"conn_type": "spark_connect", "host": url.hostname, "port": url.port or 15002}
    else:
        # A host holding a whole master URL ("spark://h:7077", "local[2]") is used as it is.
        spark = {"conn_type": "spark", "host": spark_master or os.environ.get("SPARK_MASTER") or "local[2]"}
    return {"AIRFLOW_CONN_KAFKA_EOS_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
                "bootstrap.servers": settings.bootstrap_servers, **settings.extra}}),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(spark)}


def write_specs_dag_file(dags_folder: Path, specs_folder: Path, name: str = "kafka_eos_specs.py") -> Path:
    """A DAG file in ``dags_folder`` that builds, with the DAG factory, a DAG per spec in
    ``specs_folder`` (a deployment over specs of its own: tests, benchmarks)."""
    path = dags_folder / name
    path.write_text(f'''\
"""airflow DAGs of the pipeline specs in {specs_folder}, made by kafka-eos's DAG factory."""
from kafka_eos_airflow.dag_factory import dags_from_folder

globals().update(dags_from_folder({str(specs_folder)!r}))
''')
    return path


def write_all_dags_file(dags_folder: Path, specs_folder: Path, name: str = "kafka_eos_dags.py") -> Path:
    """A DAG file with every kafka-eos DAG of ``specs_folder``: each pipeline's, the watchdog and
    the runbook (:func:`kafka_eos_airflow.dag_factory.kafka_eos_dags`), as a DAG file of your own has."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    path = dags_folder / name
    path.write_text(f'''\
"""kafka-eos's DAGs over the pipeline specs in {specs_folder}."""
from kafka_eos_airflow.dag_factory import kafka_eos_dags

globals().update(kafka_eos_dags({str(specs_folder)!r}))
''')
    return path


class AirflowError(KafkaEosError):
    """The local Airflow deployment did not start or answer."""


@dataclass
class LocalAirflow:
    """One local deployment, its state under ``home`` (metadata DB, logs, pid files).

    :param dags_folder: the DAG files it runs.
    :param environ: added to every component's environment (connections as ``AIRFLOW_CONN_*``).
    """

    home: Path
    port: int
    dags_folder: Path
    environ: dict[str, str] = field(default_factory=dict)
    #: The metadata database; None: SQLite under ``home``. With SQLite, an ``airflow`` command that
    #: writes (``backfill create``) while the scheduler runs can fail with "database is locked".
    database_url: str | None = None
    #: ``local`` (LocalExecutor) or ``celery`` (CeleryExecutor, which needs ``database_url``).
    executor: str = "local"
    #: Celery workers (``celery-worker-1``, ``-2``...), with ``executor="celery"``.
    workers: int = 2
    #: Redis's port, with ``executor="celery"`` (default: a free one, kept in the home folder).
    redis_port: int | None = None
    #: A PostgreSQL server this deployment starts and stops with itself (``kafka-eos airflow start
    #: --executor celery``): its ``database_url`` names a database on it.
    postgres: object | None = None
    _log_start: dict[str, int] = field(default_factory=dict, repr=False)
    #: Each user's bearer token, and when it was issued (``time.monotonic()``).
    _tokens: dict[str, tuple[float, str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise AirflowError(f"executor {self.executor!r}: one of {', '.join(EXECUTORS)}")
        if self.executor == "celery" and not (self.database_url or "").startswith("postgresql"):
            raise AirflowError("the CeleryExecutor needs a PostgreSQL metadata database (database_url), "
                               "its result backend too")

    @property
    def components(self) -> tuple[str, ...]:
        """This deployment's processes: Airflow's four, and with Celery, Redis and the workers."""
        if self.executor != "celery":
            return COMPONENTS
        return ("redis", *COMPONENTS, *(f"celery-worker-{n}" for n in range(1, self.workers + 1)))

    def _redis_port(self) -> int:
        """Redis's port: given, or a free one picked once and kept in the home folder."""
        if self.redis_port is not None:
            return self.redis_port
        path = self.home / "redis.port"
        if not path.exists():
            import socket

            self.home.mkdir(parents=True, exist_ok=True)
            with socket.socket() as sock:
                sock.bind((HOST, 0))
                path.write_text(str(sock.getsockname()[1]))
        return int(path.read_text())

    def _executor_env(self) -> dict[str, str]:
        if self.executor != "celery":
            return {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
        return {"AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://{HOST}:{self._redis_port()}/0",
                # Celery's database backend names a SQLAlchemy URL after "db+".
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.database_url}",
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(CELERY_CONCURRENCY),
                # Two cores: the scheduler sends and reads task states from one process.
                "AIRFLOW__CELERY__SYNC_PARALLELISM": "1"}

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of the components and of ``airflow`` commands against this deployment."""
        venv_bin = str(Path(sys.executable).parent)
        return {
            # SPARK_REMOTE became the spark_default connection: in a task, pyspark would otherwise
            # make every session a Connect client (a stream's own Spark, spark-submit's driver).
            **{k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"},
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            # The plugin loads through the provider's entry point; nothing is needed in this folder.
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.home / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url or f"sqlite:///{self.home / 'airflow.db'}",
            **self._executor_env(),
            # Two cores: a few task processes at once, not Airflow's default of 32.
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
            # New DAG files are found within seconds, not the default 5 minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # A dead worker's (or scheduler's) tasks are failed and retried within seconds of this.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(TASK_HEARTBEAT_TIMEOUT_S),
            # A task a dead worker had taken but not started is queued again within about a minute.
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(TASK_QUEUED_TIMEOUT_S),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": str(TASK_QUEUED_CHECK_S),
            # Spark binds to the loopback address too.
            "SPARK_LOCAL_IP": HOST,
            # A local Airflow of kafka-eos's own: where the Kafka connection is not defined, the
            # local broker (KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:19092) stands in.
            "AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK": "True",
            **self.environ,
        }

    @classmethod
    def default(cls, settings, executor: str | None = None) -> "LocalAirflow":
        """The deployment of ``kafka-eos airflow start``: under ``.local/airflow``, the project's
        dags/, the API and UI on ``KAFKA_EOS_AIRFLOW_PORT`` (default 8080), its Kafka connection
        pointing at ``settings``' cluster and Spark at ``SPARK_MASTER`` (default local mode).

        :param executor: ``local`` (SQLite metadata) or ``celery`` (a PostgreSQL server of its own
            under ``.local/airflow/postgres``, Redis, two workers); None: the one it was last
            started with (``local`` at first)."""
        home = local_dir() / "airflow"
        if IN_CHECKOUT:
            dags = PROJECT_ROOT / "dags"
        else:  # an installed package: a DAG file over the pipelines folder, as a user's own
            dags = home / "dags"
            write_all_dags_file(dags, pipelines_dir().resolve())
        chosen = home / "executor"
        executor = executor or (chosen.read_text().strip() if chosen.exists() else "local")
        port = int(os.environ.get("KAFKA_EOS_AIRFLOW_PORT", "8080"))
        if executor != "celery":
            return cls(home, port, dags, connections_environ(settings), executor=executor)
        pg_port = home / "postgres.port"
        if not pg_port.exists():
            home.mkdir(parents=True, exist_ok=True)
            pg_port.write_text(str(_kernel_free_port()))
        postgres = LocalPostgres(int(pg_port.read_text()), folder=home / "postgres")
        url = f"postgresql+psycopg2://kafka_eos@{HOST}:{postgres.port}/airflow"
        return cls(home, port, dags, connections_environ(settings), database_url=url, executor="celery",
                   postgres=postgres)

    def password(self, user: str = ADMIN) -> str:
        """A user's password (the admin's by default): generated once into the file Airflow's
        simple auth manager reads (mode 0600, in the home folder), before the api-server starts;
        a further user of ``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS`` is added to it then too."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(json.dumps({ADMIN: secrets.token_urlsafe(16)}) + "\n")
        passwords = json.loads(path.read_text())
        if user not in passwords:
            passwords[user] = secrets.token_urlsafe(16)
            path.write_text(json.dumps(passwords) + "\n")
        return passwords[user]

    def airflow(self, *args: str, timeout_s: float = 300.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``airflow ARGS`` against this deployment.

        :raises AirflowError: it failed (``check``), with the end of its output.
        """
        res = subprocess.run(["airflow", *args], env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        if check and res.returncode != 0:
            raise AirflowError(f"airflow {' '.join(args)}: exit {res.returncode}: "
                               f"{(res.stderr or res.stdout).strip()[-2000:]}")
        return res

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180.0, unpause: bool = True) -> None:
        """Wait until the API lists ``dag_id``; then unpause it (new DAGs start paused).

        Asks the running dag-processor to parse at once (Airflow's ``PUT /parseDagFile`` of every
        file that holds a listed DAG: those files go to the front of its queue, and the folder is
        looked at again for new files) rather than waiting for its next pass over a file
        (``min_file_process_interval``, 30 s) — a DAG file of specs makes a new spec's DAG without
        changing. Asked again every :data:`PARSE_REQUEST_EVERY_S` while the DAG is not there (a
        parse that began before the spec was written). No ``airflow dags reserialize`` (a process
        of its own, about 5 CPU seconds on a busy machine) but where no DAG is listed yet, so no
        file can be named: a new deployment whose DAG files held none. That command and the
        dag-processor may write the same new DAG's row at the same moment and the loser fails on
        the unique key; either write serves, so its exit is not checked, and when the loser is the
        dag-processor (Airflow 3.3.2 exits on it) it is started again, as a service manager would.

        :raises AirflowError: not listed in time, with the deployment's import errors.
        """
        self.revive("dag-processor")
        deadline, asked, reserialized = time.monotonic() + timeout_s, None, False
        while True:
            dags = self.api("GET", "/api/v2/dags?limit=1000")["dags"]
            if dag_id in {d["dag_id"] for d in dags}:
                break
            self.revive("dag-processor")
            tokens = {d["file_token"] for d in dags}
            if not tokens and not reserialized:
                self.airflow("dags", "reserialize", check=False)
                reserialized = True
            elif tokens and (asked is None or time.monotonic() - asked > PARSE_REQUEST_EVERY_S):
                asked = time.monotonic()
                for token in tokens:
                    try:
                        self.api("PUT", f"/api/v2/parseDagFile/{token}")
                    except urllib.error.HTTPError:
                        pass  # its file gone since the list: the folder's next look says so
            if time.monotonic() > deadline:
                errors = self.api("GET", "/api/v2/importErrors")["import_errors"]
                raise AirflowError(f"DAG {dag_id} not parsed within {timeout_s:g}s; import errors: "
                                   f"{[(e['filename'], e['stack_trace'][-300:]) for e in errors] or 'none'}")
            time.sleep(1)
        if unpause:
            self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def revive(self, *components: str) -> list[str]:
        """Start again those of ``components`` (default: all of this deployment's) that were
        started and have exited; returns their names."""
        revived = []
        for component in components or self.components:
            if self._pid_file(component).exists() and self.pid(component) is None:
                self.launch(component)
                revived.append(component)
        return revived

    def _pid_file(self, component: str) -> Path:
        return self.home / f"{component}.pid"

    def start(self) -> str:
        """Migrate the metadata DB, start the components and wait until all four report
        healthy. Returns the API's URL.

        :raises AirflowError: a component exited or the deployment was not healthy in time.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "executor").write_text(self.executor)
        if self.postgres is not None:
            self._start_postgres()
        self.airflow("db", "migrate", timeout_s=START_TIMEOUT_S)
        procs = {component: self.launch(component) for component in self.components}
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for component, proc in procs.items():
                if proc.poll() is not None:
                    self.stop()
                    raise AirflowError(f"airflow {component} exited ({proc.returncode}); see "
                                       f"{self.home / (component + '.log')}")
            if self.healthy() and self.workers_ready():
                return self.url
            time.sleep(2)
        self.stop()
        raise AirflowError(f"airflow at {self.url} not healthy within {START_TIMEOUT_S:g}s; logs in {self.home}")

    def launch(self, component: str) -> subprocess.Popen:
        """Start one component (one of :data:`COMPONENTS`) in a session of its own, its output
        appended to ``<component>.log`` in the home folder; :meth:`start` starts them all."""
        if component == "redis":
            (self.home / "redis").mkdir(parents=True, exist_ok=True)
            # Loopback only, no snapshots: Celery's queue lives as long as the deployment.
            argv = ["redis-server", "--bind", HOST, "--port", str(self._redis_port()), "--dir",
                    str(self.home / "redis"), "--save", "", "--appendonly", "no", "--protected-mode", "yes"]
            if shutil.which("redis-server") is None:
                raise AirflowError("redis-server not found: the CeleryExecutor's broker is Debian's redis-server "
                                   "(apt-get install redis-server)")
        elif component.startswith("celery-worker-"):
            # A hostname of its own per worker: Celery tells them apart by it. No log server
            # (it would listen on every interface): the api-server reads the task logs' files.
            argv = ["airflow", "celery", "worker", "--celery-hostname", f"{component}@{HOST}",
                    "--concurrency", str(CELERY_CONCURRENCY), "--skip-serve-logs", "--without-gossip",
                    "--without-mingle"]
        else:
            argv = ["airflow", *{"api-server": ["api-server", "--host", HOST, "--port", str(self.port)],
                                 "scheduler": ["scheduler", "--skip-serve-logs"],
                                 "triggerer": ["triggerer", "--skip-serve-logs"]}.get(component, [component])]
        log_file = self.home / f"{component}.log"
        self._log_start[component] = log_file.stat().st_size if log_file.exists() else 0
        with open(log_file, "ab") as log:
            # A session of its own: stop() ends the component and every process it started.
            proc = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._pid_file(component).write_text(str(proc.pid))
        return proc

    def pid(self, component: str) -> int | None:
        """The process id of a running component (the leader of its process group), or None."""
        return group_of(self._pid_file(component))

    def healthy(self) -> bool:
        """All four components report healthy on the API's health endpoint."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as resp:
                health = json.load(resp)
        except (OSError, ValueError):
            return False
        return all((health.get(k) or {}).get("status") == "healthy"
                   for k in ("metadatabase", "scheduler", "triggerer", "dag_processor"))

    def _start_postgres(self) -> None:
        """The PostgreSQL server of this deployment, and its ``airflow`` database."""
        from sqlalchemy import create_engine, text

        server = self.postgres.start()
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            if conn.execute(text("select 1 from pg_database where datname = 'airflow'")).first() is None:
                conn.execute(text("create database airflow"))
        engine.dispose()

    def workers_ready(self) -> bool:
        """Every Celery worker started by this object has said it is ready since it started
        (true with the LocalExecutor)."""
        for worker in (c for c in self.components if c.startswith("celery-worker-")):
            log = self.home / f"{worker}.log"
            if not log.exists():
                return False
            with open(log, "rb") as f:
                f.seek(self._log_start.get(worker, 0))
                if b" ready." not in f.read():
                    return False
        return True

    def stop(self) -> None:
        """End every component and what it started (SIGTERM, then SIGKILL), side by side; Redis
        after them (the Celery workers' shutdown still talks to it)."""
        for batch in ([c for c in self.components if c != "redis"], ["redis"]):
            pid_files = [f for f in map(self._pid_file, batch) if f.exists()]
            stop_groups([int(f.read_text()) for f in pid_files], STOP_TIMEOUT_S)
            for pid_file in pid_files:
                pid_file.unlink(missing_ok=True)
        if self.postgres is not None:
            self.postgres.stop()

    def token(self, user: str = ADMIN) -> str:
        """A bearer token of a user (the admin by default) for the REST API: the one issued within
        :data:`TOKEN_REUSE_S`, else a new one."""
        issued, token = self._tokens.get(user, (0.0, ""))
        if token and time.monotonic() - issued < TOKEN_REUSE_S:
            return token
        body = json.dumps({"username": user, "password": self.password(user)}).encode()
        req = urllib.request.Request(f"{self.url}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        token = json.loads(_answer(req, again_on_timeout=True))["access_token"]
        self._tokens[user] = (time.monotonic(), token)
        return token

    def run_note(self, dag_id: str, run_id: str) -> str | None:
        """The note a kafka-eos pipeline run left: the XCom ``note`` of its verify task, else of its
        plan task (a dry run or a reset ends there); None without one."""
        for task in ("verify", "plan"):
            try:
                entry = self.api("GET", f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
                                        f"/taskInstances/{task}/xcomEntries/note")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # not that task's, or it did not run
                    continue
                raise
            return str(entry["value"])
        return None

    def api(self, method: str, path: str, body: dict | None = None, user: str = ADMIN) -> dict:
        """One REST call (``/api/v2/…``) as a user (the admin by default); the decoded JSON answer.
        A GET is asked again after a read timeout (:data:`REST_PATIENCE_S`); a call refused with
        401 is made once more with a new token (a refused call did nothing)."""
        def ask() -> bytes:
            req = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {self.token(user)}"})
            return _answer(req, again_on_timeout=method == "GET")

        try:
            answer = ask()
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            self._tokens.pop(user, None)  # expired, or signed by an earlier start's key
            answer = ask()
        return json.loads(answer) if answer else {}  # 204 No Content (a DELETE)

