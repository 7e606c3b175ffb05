"""Session fixtures: one real Kafka broker, one SparkSession, unique names per test.

The broker is ``$KAFKA_BOOTSTRAP_SERVERS`` when set, else the local single-node KRaft broker
under .local/ (started here if it is not running, and stopped at the end if this session
started it).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import random
import re
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from shared_servers import last_test_using


# py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
# pytest closed its streams ("--- Logging error ---"); that INFO line is of no use in tests.
logging.getLogger("py4j").setLevel(logging.WARNING)
# Every Spark of the tests (in-process and spark-submit children) stays on loopback.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Operators run in-process without a Kafka connection: the tests' broker stands in, as in the
# local Airflow of `kafka-eos airflow start` (tests/unit/test_airflow_config.py turns it off).
os.environ.setdefault("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "True")
# The fault probe on the commit path's points (kafka_eos.probes), in this process and, through the
# environment, in every process the tests start: crash and pause tests arm it by its settings
# (KAFKA_EOS_CRASH_AT, KAFKA_EOS_PAUSE_AT). The wheel has none: a deployment's points do nothing.
import kafka_eos_lab.faults  # noqa: E402,F401 - installs the probe; sets KAFKA_EOS_PROBES for children


ROOT = Path(__file__).resolve().parents[1]

#: The broker of a parallel session (``pytest -n N``, as ``make test`` runs): pytest's controlling
#: process starts the local broker once and hands its address to every worker here.
SHARED_BROKER_ENV = "KAFKA_EOS_TEST_BOOTSTRAP"


def pytest_configure(config):
    """In the controlling process of a parallel session (or the one process of a serial one): the
    JVM settings of every Spark driver the tests start (:mod:`kafka_eos.local.spark_startup`), and the one broker
    the workers share (each worker starting its own would race for the same port and data folder).
    The workers, started after this, inherit both through the environment."""
    from kafka_eos.settings import BOOTSTRAP_ENV

    global _RUNS_TESTS
    _RUNS_TESTS = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its pipes to the controller, first
        import worker_pipes

        worker_pipes.record()
    if config.option.collectonly:
        return  # collecting starts no JVM and no broker
    if not _RUNS_TESTS:  # the controlling process of a parallel session: the cores' use, sampled
        global _CORES
        from session_timeline import CoreSampler

        _CORES = CoreSampler().start()
    from kafka_eos.local.spark_startup import driver_environ

    # A new archive is made beside the shared broker's start, before any test's driver: a session
    # that left it to be made beside the tests took 100 s to make it (not 25), and its first
    # drivers started without it.
    drivers, archive = driver_environ()
    os.environ.update(drivers)
    parallel = bool(getattr(config.option, "numprocesses", None))
    try:
        if (not parallel or os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(BOOTSTRAP_ENV)
                or os.environ.get(SHARED_BROKER_ENV)):
            _tune_test_brokers()
        else:
            from kafka_eos.local.kafka import LocalBroker

            broker = LocalBroker.default()
            config.kafka_eos_broker = (broker, not broker.is_running())
            broker.start()
            os.environ[SHARED_BROKER_ENV] = broker.bootstrap  # the workers, started after this, inherit it
            _tune_test_brokers()  # after the shared broker: it does most of the brokers' work
    finally:  # also when the broker did not start: the probe's job ends and its folder goes
        if archive is not None:
            archive.join()


def _tune_test_brokers() -> None:
    """The brokers the tests start (clusters, the secured broker, private ones; a serial session's
    own broker too) and their storage-format steps on the JIT's first tier and the serial
    collector: most live for a test or a module, where half a start's CPU goes to the JIT. The
    parallel session's shared broker, started before this, keeps the JVM's defaults."""
    from kafka_eos.local.kafka import JVM_PERFORMANCE_OPTS_ENV

    os.environ.setdefault(JVM_PERFORMANCE_OPTS_ENV, "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@functools.cache
def _module_text(root: Path, path: str) -> str:
    """A test module's source, ``path`` relative to the session's ``root`` (the controller of a
    parallel session collects no items: what a module needs is read from its text); empty if it
    cannot be read."""
    try:
        return (root / path).read_text()
    except OSError:
        return ""


@functools.cache
def _shared_scope(root: Path, path: str) -> str | None:
    """The work unit a test module's tests belong to in a parallel session: ``airflow-deployment``
    for every module on the session's Airflow deployment (one deployment, on one worker),
    ``secure-broker`` for every module on the secured broker (likewise), the module itself for one
    with a module-scoped fixture (a Spark or Kafka cluster of its own), else None (each test on
    its own)."""
    text = _module_text(root, path)
    if not text:
        return None
    if "airflow_deployment" in text:
        return "airflow-deployment"
    if "secure_broker" in text:
        return "secure-broker"  # one secured broker per session (not one per worker), stopped early
    # A module-scoped fixture of the module's own, or the shared module-scoped Connect server.
    return path if 'scope="module"' in text or "connect_server" in text else None


#: A test module's ``pytestmark`` line with the marker ``waits`` (a module that mostly waits: a
#: timeout, a retention, a stream's interval): with at least :data:`WAITING_LANE_WORKERS`
#: workers, the last one runs these modules only.
WAITS_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.waits\b", re.M)
#: The fewest workers of a session that gives its last one to the waiting modules. Sampled over a
#: whole CI run with three workers, the cores idled 14 % of the time, mostly in the minutes where
#: two workers waited at once (the retention test's sleeps, a transaction's timeout, a stream's
#: batches); a fourth worker for any test slowed every test beside it (docs/testing.md).
WAITING_LANE_WORKERS = 4


@functools.cache
def _waits(root: Path, scope: str) -> bool:
    """Whether a work unit's module is marked ``waits`` (:data:`WAITS_MARK`, read from its text:
    the controller collects no items)."""
    return WAITS_MARK.search(_module_text(root, scope.split("::", 1)[0])) is not None


#: Each test's seconds (setup, call and teardown) in a whole ``make test`` on this machine, by node
#: id: the suite's scheduler hands out the longest work first. Every parallel session records its
#: own in ``.local/test-durations.json`` (:func:`pytest_sessionfinish`); docs/testing.md says how
#: this file is refreshed from a CI run's. ``KAFKA_EOS_TEST_DURATIONS`` names another file.
DURATIONS_FILE = Path(__file__).with_name("durations.json")
DURATIONS_ENV = "KAFKA_EOS_TEST_DURATIONS"
#: The seconds of a test the file does not know yet (a new test): an integration test's median.
UNKNOWN_TEST_S = 5.0
#: A work unit of at least this many seconds holds only short tests behind it on its worker.
LONG_UNIT_S = 60.0
#: The tests' seconds this session (in its controlling process: reports of every worker), and
#: those whose teardown ended (an interrupted test's seconds are not recorded).
_SESSION_SECONDS: dict[str, float] = {}
_SESSION_ENDED: set[str] = set()


def _read_durations(path: Path) -> dict[str, float]:
    """The seconds by node id recorded in ``path``; none if it is missing or not such a mapping."""
    try:
        recorded = json.loads(path.read_text())
        return {str(nodeid): float(seconds) for nodeid, seconds in recorded.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


@functools.cache
def _durations() -> dict[str, float]:
    """The recorded seconds the scheduler orders by (:data:`DURATIONS_FILE`, or the file ``DURATIONS_ENV`` names)."""
    return _read_durations(Path(os.environ.get(DURATIONS_ENV) or DURATIONS_FILE))


def _unit_seconds(unit, unfinished: bool = False) -> float:
    """A work unit's (``{nodeid: done}``) seconds by the recorded durations (``unfinished``: of
    the tests not done yet only)."""
    durations = _durations()
    return sum(durations.get(nodeid, UNKNOWN_TEST_S) for nodeid, done in unit.items() if not (unfinished and done))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Tests go to the two workers one by one, except those that share something expensive
    (:func:`_shared_scope`): those go together. (pytest-xdist's own ``loadgroup`` does not group
    under pytest 9: it rewrites a node attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedResourceScheduling(LoadScopeScheduling):
        _first_assigned = False

        def _split_scope(self, nodeid: str) -> str:
            return _shared_scope(config.rootpath, nodeid.split("::", 1)[0]) or nodeid

        def _waiting_lane(self):
            """The worker that runs the waiting modules (:data:`WAITS_MARK`): the session's
            last (a crashed worker's replacement is numbered after them all, never the lane),
            while it runs beside another that can take the rest; None with fewer than
            :data:`WAITING_LANE_WORKERS` workers."""
            if self.numnodes < WAITING_LANE_WORKERS:
                return None
            live = [n for n in self.assigned_work if not n.shutting_down]
            lane = next((n for n in live if n.gateway.id == f"gw{self.numnodes - 1}"), None)
            return lane if lane is not None and len(live) > 1 else None

        def _assign_work_unit(self, node):
            # pytest-xdist queues the units by their number of tests, most first, then as
            # collected: one-test units of minutes (the soak, the wheel's test, a stream's refresh)
            # started near the session's end and ended it alone on one worker. The longest work
            # first, by the recorded durations (sorted once, before the first unit is handed out).
            if not self._first_assigned:
                self._first_assigned = True
                for scope, _unit in sorted(self.workqueue.items(), key=lambda item: -_unit_seconds(item[1])):
                    self.workqueue.move_to_end(scope)
            # The waiting lane takes the waiting modules only (and ends when none is left); the
            # other workers take the rest, and the waiting modules too once nothing else is left
            # (or the lane is gone: a crashed lane's tests are queued again).
            lane = self._waiting_lane()
            scopes = list(self.workqueue)
            if lane is not None:
                mine = [s for s in scopes if _waits(config.rootpath, s) == (node is lane)]
                scopes = mine if mine or node is lane else scopes
            if not scopes:
                node.shutdown()
                return
            # A worker runs a test once it holds the next one: what waits behind a unit of
            # minutes is taken from the queue's end (the shortest), not a long unit another worker
            # could start now.
            pending = self.assigned_work.get(node, {}).values()
            shortest_behind = len(scopes) > 1 and any(_unit_seconds(unit, unfinished=True) >= LONG_UNIT_S
                                                      for unit in pending)
            self.workqueue.move_to_end(scopes[-1] if shortest_behind else scopes[0], last=False)
            super()._assign_work_unit(node)

        # pytest-xdist 3.8's LoadScopeScheduling hangs the session for good once a worker crashes
        # (pytest-xdist issues 1323, 1327, 1378): it queues the dead worker's *finished* units
        # again (empty units that never complete), and gives the replacement worker one test where
        # a worker waits for two before it runs the first. With a unit per test, as here, the
        # run then never ends (a CI run sat at 99 % until its 90 minutes were up). The two
        # methods below queue only unfinished tests, never the one the worker died in (it is
        # reported failed), and fill a worker up to three tests, telling it to stop once the
        # queue is empty.
        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            unfinished = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
            if not unfinished:
                return None
            unit = next(iter(unfinished.values()))  # the first unfinished: the worker was in it
            crashed = next(nodeid for nodeid, done in unit.items() if not done)
            unit[crashed] = True
            self.workqueue.update((scope, unit) for scope, unit in unfinished.items() if not all(unit.values()))
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

        def _reschedule(self, node):
            # A replacement worker still collecting (two crashed: the second's replacement may
            # finish collecting first and reschedule every node) gets work after its collection.
            if node.shutting_down or node not in self.registered_collections:
                return
            while self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue and not node.shutting_down:
                node.shutdown()

    return SharedResourceScheduling(config, log)


#: The folders whose tests need the real stack: each of their tests is marked ``integration``
#: (a ``pytestmark`` in a conftest.py is not read by pytest; a module's own still is).
INTEGRATION_FOLDERS = ("integration", "dags")


def pytest_collection_modifyitems(config, items):
    """Every test of :data:`INTEGRATION_FOLDERS` is marked ``integration`` (``make test-quick``
    selects by it)."""
    for item in items:
        path = Path(str(item.path))
        parts = path.relative_to(ROOT).parts if path.is_relative_to(ROOT) else ()
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in INTEGRATION_FOLDERS:
            item.add_marker(pytest.mark.integration)


#: The CPU seconds of each test's process tree (tests/cpu_account.py), by node id: the snapshot
#: at its start (in the process that runs it), and the seconds its teardown's report carries (in
#: the controlling process).
_CPU_AT_START: dict[str, dict] = {}
#: This process runs tests (a worker, or a serial session), not only the workers' reports.
_RUNS_TESTS = True
_SESSION_CPU: dict[str, float] = {}
#: Each test's worker and the epoch seconds its setup began and its teardown ended (the controlling
#: process of a parallel session), and the cores' use meanwhile (tests/session_timeline.py).
_SESSION_SPANS: dict[str, tuple[str, float, float]] = {}
_SESSION_START = time.time()
_CORES = None
#: The report's user property that carries a test's CPU seconds to the controlling process.
CPU_PROPERTY = "cpu_seconds"
#: How many tests the CPU summary names.
CPU_SUMMARY_TESTS = 30


def pytest_runtest_logstart(nodeid, location):
    """Where the test runs: its process tree's CPU seconds before its setup."""
    if not _RUNS_TESTS:
        return
    from cpu_account import snapshot

    _CPU_AT_START[nodeid] = snapshot()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown's report carries the test's CPU seconds (setup, call and teardown)."""
    outcome = yield
    if call.when != "teardown" or item.nodeid not in _CPU_AT_START:
        return
    from cpu_account import snapshot, spent

    seconds = spent(_CPU_AT_START.pop(item.nodeid), snapshot())
    outcome.get_result().user_properties.append((CPU_PROPERTY, round(seconds, 2)))


def pytest_runtest_logreport(report):
    """In the controlling process (every worker's reports come here too): the test's seconds,
    and its CPU seconds."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _SESSION_SECONDS[report.nodeid] = _SESSION_SECONDS.get(report.nodeid, 0.0) + report.duration
        node = getattr(report, "node", None)  # the worker that ran it (pytest-xdist sets it)
        if node is not None:
            worker, start, _ = _SESSION_SPANS.get(report.nodeid, (node.gateway.id, report.start, 0.0))
            _SESSION_SPANS[report.nodeid] = (worker, min(start, report.start), report.stop)
        if report.when == "teardown":
            _SESSION_ENDED.add(report.nodeid)
            cpu = dict(report.user_properties).get(CPU_PROPERTY)
            if cpu is not None:
                _SESSION_CPU[report.nodeid] = cpu


def pytest_terminal_summary(terminalreporter):
    """The tests' CPU seconds (each test's process tree; the shared broker not counted): their sum
    and the most costly, beside their wall seconds. On two shared cores a test's wall time is
    mostly its wait for the CPU; its CPU seconds are what it costs the suite."""
    if not _SESSION_CPU:
        return
    total = sum(_SESSION_CPU.values())
    terminalreporter.write_sep("=", f"the tests' CPU seconds: {total:,.0f} in all (their process trees)")
    for nodeid, cpu in sorted(_SESSION_CPU.items(), key=lambda kv: -kv[1])[:CPU_SUMMARY_TESTS]:
        terminalreporter.write_line(f"{cpu:8.1f} CPU-s {_SESSION_SECONDS.get(nodeid, 0.0):8.1f} s  {nodeid}")
    if _SESSION_SPANS:
        from session_timeline import summary_lines

        terminalreporter.write_sep("=", "the session's timeline (seconds from its start)")
        for line in summary_lines(_SESSION_SPANS, _CORES.samples if _CORES else [], _SESSION_START):
            terminalreporter.write_line(line)


def _record_durations(session) -> None:
    """A parallel session's tests' seconds into ``.local/test-durations.json`` (over what earlier
    sessions recorded there), for :data:`DURATIONS_FILE`; their CPU seconds likewise into
    ``.local/test-cpu.json``; the session's timeline into ``.local/test-timeline.json``."""
    ended = {nodeid: round(seconds, 2) for nodeid, seconds in _SESSION_SECONDS.items() if nodeid in _SESSION_ENDED}
    if not ended or not getattr(session.config.option, "numprocesses", None):
        return
    from kafka_eos.paths import local_dir

    cpu = {nodeid: seconds for nodeid, seconds in _SESSION_CPU.items() if nodeid in ended}
    for name, figures in (("test-durations.json", ended), ("test-cpu.json", cpu)):
        path = local_dir() / name
        recorded = _read_durations(path)
        recorded.update(figures)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(json.dumps(dict(sorted(recorded.items())), indent=0) + "\n")
            os.replace(partial, path)  # a concurrent session's reader sees a whole file
        except OSError as exc:  # the order of a later session only: never the session's result
            logging.getLogger(__name__).warning("test figures not recorded in %s: %s", path, exc)
    timeline = local_dir() / "test-timeline.json"  # this session's only (no earlier one's)
    try:
        timeline.write_text(json.dumps({"start": _SESSION_START, "tests": _SESSION_SPANS,
                                        "cores_busy": _CORES.samples if _CORES else []}) + "\n")
    except OSError as exc:
        logging.getLogger(__name__).warning("the session's timeline not recorded in %s: %s", timeline, exc)


def pytest_sessionfinish(session, exitstatus):
    """In the controlling process: the tests' seconds recorded (:func:`_record_durations`).
    In a worker, after its last test's teardown: kill what a test's code forked and left behind
    in the worker's own session (services started in sessions of their own are their owners' to
    stop). Such a process holds the worker's stdout, so ``make test | tee`` (CI) never ends: seen
    with OpenLineage's DAG-event process pool, which ``dag.test()`` forks in the test's process
    and whose child spun on the inherited SQLite connection after the test had passed."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _record_durations(session)
        return
    import psutil

    sid = os.getsid(0)
    for child in psutil.Process().children(recursive=True):
        try:
            if os.getsid(child.pid) == sid:
                logging.getLogger(__name__).warning("killing %s, left behind by a test: %s", child.pid,
                                                    " ".join(child.cmdline())[:200])
                child.kill()
        except (psutil.Error, ProcessLookupError):
            pass


def pytest_unconfigure(config):
    broker, started_here = getattr(config, "kafka_eos_broker", (None, False))
    if broker is not None and started_here and os.environ.get("KAFKA_EOS_KEEP_BROKER") != "1":
        broker.stop()


@pytest.fixture(scope="session")
def kafka_settings():
    from kafka_eos.local.kafka import LocalBroker
    from kafka_eos.settings import BOOTSTRAP_ENV, KafkaSettings

    if os.environ.get(BOOTSTRAP_ENV):
        yield KafkaSettings.from_environ(os.environ)
        return
    if os.environ.get(SHARED_BROKER_ENV):  # a worker of a parallel session: the controller's broker
        yield KafkaSettings(os.environ[SHARED_BROKER_ENV])
        _goodbye_before_the_broker_stops()
        return
    broker = LocalBroker.default()
    started_here = not broker.is_running()
    broker.start()
    yield KafkaSettings(broker.bootstrap)
    _goodbye_before_the_broker_stops()
    if started_here and os.environ.get("KAFKA_EOS_KEEP_BROKER") != "1":
        broker.stop()


def _goodbye_before_the_broker_stops() -> None:
    """Clients left for the garbage collector say goodbye while the broker is still there, not at
    interpreter exit (where they log connection errors to a stopped broker); Spark's Python
    workers hold per_partition producers until the session stops."""
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
            # py4j's finalizer thread may still send (and log, through the root logger, to the
            # worker's streams, closed by then) a Java object's release: not a failure of any test.
            logging.raiseExceptions = False
    gc.collect()


@pytest.fixture(scope="session")
def spark():
    """One ``local[2]`` SparkSession (with Spark's Kafka connector) for every in-process test."""
    from kafka_eos.spark_io import get_session

    session = get_session("kafka-eos-tests", master="local[2]")
    # Tiny test data: 2 shuffle partitions instead of 200 keep aggregations quick.
    session.conf.set("spark.sql.shuffle.partitions", "2")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _cli_logging_ends_with_the_test():
    """A CLI call configures logging for its process; in tests the next test is the next process."""
    yield
    from kafka_eos.logs import reset_cli_logging

    reset_cli_logging()


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_stream():
    """A library that configures logging when first imported (Airflow adds a handler on the root
    logger, bound to the ``sys.stdout`` of that moment) may be imported during a test whose
    captured output is closed when it ends; every later log record would then print a
    "--- Logging error ---" into the next tests' stderr. Such a handler goes with its stream."""
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(getattr(handler, "stream", None), "closed", False):
            root.removeHandler(handler)


@pytest.fixture
def unique(request) -> str:
    """A short name unique to this test, for its topics, groups and pipelines. The topics named
    with it are deleted from the session's broker after the test: a broker that piles up thousands
    of topics answers every full metadata request (and the tests after it) slower."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:30]
    name = f"{base}-{uuid.uuid4().hex[:8]}"
    yield name
    _delete_topics_named(name)


def _delete_topics_named(name: str) -> None:
    from confluent_kafka.admin import AdminClient

    from kafka_eos.local.kafka import LocalBroker

    local = LocalBroker.default()
    bootstrap = os.environ.get(SHARED_BROKER_ENV) or os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or (
        local.bootstrap if local.is_running() else None)
    if not bootstrap:
        return
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "reconnect.backoff.ms": 20})  # settings.RECONNECT_BACKOFF_MS
        doomed = [t for t in admin.list_topics(timeout=10).topics if name in t]
        for future in (admin.delete_topics(doomed, operation_timeout=10).values() if doomed else ()):
            future.result(30)
    except Exception as exc:  # noqa: BLE001 - tidying only: a broker the test stopped, a topic gone
        logging.getLogger(__name__).info("deleting the topics of %s: %s", name, exc)



#: A producer that opens a transaction on the given partitions, writes one record to each, says
#: so, and waits to be killed. Its transaction timeout is long (10 min): only an abort ends it.
_OPEN_AND_WAIT = """
import json, os, sys, time
from confluent_kafka import Producer
bootstrap, txid, *tps = sys.argv[1:]
extra = json.loads(open(os.environ["CLIENT_CONFIG_FILE"]).read()) if os.environ.get("CLIENT_CONFIG_FILE") else {}
p = Producer({**extra, "bootstrap.servers": bootstrap, "transactional.id": txid, "transaction.timeout.ms": 600000})
p.init_transactions(30)
p.begin_transaction()
for tp in tps:
    topic, partition = tp.rsplit(":", 1)
    p.produce(topic, value=b"never committed", partition=int(partition))
p.flush(30)
print("open", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def killed_transaction(tmp_path, kafka_settings):
    """``killed_transaction(txid, (topic, partition), ..., settings=None)``: a transaction opened on
    those partitions by another process (on the session's broker unless ``settings`` name another,
    with their security settings), which is then SIGKILLed: a real hung transaction."""
    import json
    import signal
    import subprocess

    from kafka_eos.paths import write_private

    script = tmp_path / "open_and_wait.py"
    script.write_text(_OPEN_AND_WAIT)

    def open_and_kill(txid: str, *tps: tuple[str, int], settings=None) -> None:
        settings = settings or kafka_settings
        env = dict(os.environ)
        if settings.extra:
            config = tmp_path / f"client-{uuid.uuid4().hex}.json"
            write_private(config, json.dumps(dict(settings.extra)))
            env["CLIENT_CONFIG_FILE"] = str(config)
        proc = subprocess.Popen([sys.executable, str(script), settings.bootstrap_servers, txid,
                                 *(f"{t}:{p}" for t, p in tps)], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout.readline().strip() == "open"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)

    return open_and_kill


#: Test servers listen below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
#: 32768-60999 here): a port picked in that range can be taken as the local port of any outgoing
#: connection before the server binds it (the likely cause of a 3-node cluster's node exiting at its
#: start once, while the nodes dialled each other). Each xdist worker picks in a band of its own.
PORT_BAND_BASE, PORT_BAND_SIZE = 20000, 3000


def adjacent_free_ports(n: int) -> int:
    """A port p with p + 1 .. p + n - 1 free too (a broker's client, controller and SASL listeners),
    below the ephemeral range, in this xdist worker's band."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = PORT_BAND_BASE + (int(worker) if worker.isdigit() else 0) % 4 * PORT_BAND_SIZE
    for _ in range(200):
        port = random.randrange(low, low + PORT_BAND_SIZE - n)
        socks = [socket.socket() for _ in range(n)]
        try:
            for i, sock in enumerate(socks):
                sock.bind(("127.0.0.1", port + i))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} adjacent free ports on 127.0.0.1 in {low}-{low + PORT_BAND_SIZE}")


@pytest.fixture(scope="session")
def free_ports():
    """``free_ports(n)``: see :func:`adjacent_free_ports`."""
    return adjacent_free_ports


class SecureBroker:
    """The session's secured broker (``kafka-eos kafka start --secure``'s settings, on free ports):
    SASL_SSL with SCRAM-SHA-512, the StandardAuthorizer with nothing allowed without an ACL.
    ``admin``: the super user's settings (set-up only); :meth:`user` makes a principal that may do
    nothing until ACLs allow it."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap
        self.admin = broker.settings()

    def user(self, prefix: str = "user"):
        """A new SCRAM user: (name, its client settings, the path of its settings file)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        path = self.broker.add_user(name)
        return name, self.broker.settings(name), path


@pytest.fixture(autouse=True)
def _secure_broker_stops_after_its_last_test(request):
    """An idle secured broker costs some 5% of a core; it stops after the session's last test on it
    (the fixture's own stop at the session's end then finds nothing running)."""
    yield
    if "secure_broker" in request.fixturenames and last_test_using(request, "secure_broker"):
        request.getfixturevalue("secure_broker").broker.stop()


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory):
    """One secured broker for the session's tests (each test makes its own users and topics)."""
    import shutil

    from kafka_eos.local.kafka import LocalBroker

    home = tmp_path_factory.mktemp("kafka-secure")
    # OAUTHBEARER beside SCRAM, with Kafka's default validator of unsecured (unsigned) tokens, so a
    # test can log in through a token callback of its own (kafka_eos_lab.oauth): its tokens name any
    # principal, which then holds only what ACLs allow it. Not in `kafka-eos kafka start --secure`.
    oauth = (("sasl.enabled.mechanisms", "SCRAM-SHA-512,OAUTHBEARER"),
             ("listener.name.sasl_ssl.oauthbearer.sasl.jaas.config",
              "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"))
    broker = LocalBroker(home=home, port=adjacent_free_ports(2), secure=True, overrides=oauth)
    broker.start()
    yield SecureBroker(broker)
    broker.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server (``local[2]``) on a free port, for one module's tests."""
    from kafka_eos.local.spark_connect import LocalSparkConnect

    server = LocalSparkConnect(tmp_path_factory.mktemp("spark-connect"), port=adjacent_free_ports(1))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (:class:`kafka_eos.local.postgres.LocalPostgres`)."""
    from kafka_eos.local.postgres import LocalPostgres

    server = LocalPostgres(port=adjacent_free_ports(1))
    yield server.start()
    server.stop()


def _timeless(value):
    """``value`` without the fields that change from one look to the next (ages)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("age_s", "stuck_s")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


@pytest.fixture
def timeless():
    """``timeless(value)``: a JSON-like value without its age fields, to compare two looks."""
    return _timeless
