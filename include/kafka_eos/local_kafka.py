"""The embedded default broker: Apache Kafka 4.x, single-node KRaft, on 127.0.0.1, under .local/.

Started from the official jars resolved from Maven Central (``make jars``), with the main classes
a Kafka distribution's scripts call: ``kafka.tools.StorageTool`` to format, ``kafka.Kafka`` to run.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kafka_eos.errors import BrokerError
from kafka_eos.logs import log4j2_properties
from kafka_eos.paths import jars_dir, local_dir
from kafka_eos.settings import KafkaSettings

HOST = "127.0.0.1"
#: Default client port; an unusual one so a developer's own Kafka on 9092 is left alone.
DEFAULT_PORT = int(os.environ.get("KAFKA_EOS_LOCAL_PORT", "19092"))
#: How long a cold start may take: JVM start, storage load and controller election on 2 cores.
START_TIMEOUT_S = 90.0
#: How long a clean shutdown may take before the broker is killed.
STOP_TIMEOUT_S = 30.0

_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# One node: every internal topic has one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Few internal partitions keep a single broker quick to start and to load coordinators.
offsets.topic.num.partitions=4
transaction.state.log.num.partitions=4
# No consumer joins our groups; no reason to wait for more members.
group.initial.rebalance.delay.ms=0
# Hung-transaction tests shorten transaction timeouts; 15 min is Kafka's default maximum.
transaction.max.timeout.ms=900000
# A killed producer's open transaction is aborted after its timeout; check often.
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
auto.create.topics.enable=false
"""

#: The broker's own loggers are chatty at INFO; its file keeps warnings and the rest at INFO.
_LOG_LEVELS = {"kafka": "WARN", "org.apache.kafka": "WARN"}


@dataclass(frozen=True)
class LocalBroker:
    """Paths and ports of the local broker.

    :param home: folder holding config, data, logs and the pid file.
    :param port: client port on 127.0.0.1; the controller listens on ``port + 1``.
    :param overrides: further broker settings (``name``, ``value``), e.g. a short offsets
        retention for a test.
    """

    home: Path
    port: int = DEFAULT_PORT
    overrides: tuple[tuple[str, str], ...] = ()

    @classmethod
    def default(cls) -> "LocalBroker":
        return cls(home=local_dir() / "kafka")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    def _pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return pid

    def is_running(self) -> bool:
        """True when our broker process is alive and its port answers."""
        return self._pid() is not None and _port_open(self.port)

    def start(self) -> str:
        """Start the broker (or reuse a running one) and wait until it answers.

        :returns: the bootstrap address.
        :raises BrokerError: jars missing, port taken by another process, or no answer in time.
        """
        if self.is_running():
            _wait_ready(self.bootstrap, START_TIMEOUT_S)
            return self.bootstrap
        for port in (self.port, self.port + 1):
            if _port_open(port):
                raise BrokerError(
                    f"port {HOST}:{port} is taken by another process; stop it or set "
                    "KAFKA_EOS_LOCAL_PORT to a free port"
                )
        classpath = _classpath()
        data_dir = self.home / "data"
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        props = self.home / "server.properties"
        props.write_text(_SERVER_PROPERTIES.format(
            host=HOST, port=self.port, controller_port=self.port + 1, data_dir=data_dir)
            + "".join(f"{key}={value}\n" for key, value in self.overrides))
        log4j = self.home / "log4j2.properties"
        log4j.write_text(log4j2_properties(self.log_file, "INFO", _LOG_LEVELS))
        java = ["java", f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not (data_dir / "meta.properties").exists():
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                 "--config", str(props), "--ignore-formatted"],
                capture_output=True, text=True)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting {data_dir} failed: {fmt.stderr.strip() or fmt.stdout.strip()}")
        with open(self.home / "logs" / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                # 1 GiB heap is plenty for a test broker and leaves room for Spark and Airflow.
                ["java", "-Xms256m", "-Xmx1g", *java[1:], "kafka.Kafka", str(props)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        try:
            _wait_ready(self.bootstrap, START_TIMEOUT_S, proc, self.log_file)
        except BrokerError:
            self.stop()
            raise
        return self.bootstrap

    def stop(self) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after a grace period).

        :returns: True when a broker was running.
        """
        pid = self._pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True


def _classpath() -> str:
    folder = jars_dir("kafka")
    if not any(folder.glob("kafka_*.jar")):
        raise BrokerError(f"no Kafka jars in {folder}: run `make jars` first")
    return str(folder / "*")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _wait_ready(bootstrap: str, timeout_s: float, proc: subprocess.Popen | None = None,
                log_file: Path | None = None) -> None:
    """Wait until the port accepts connections, then until the broker serves metadata, then
    until every partition's leader answers."""
    # Imported here: the DAG files import this module at parse time, where no Kafka client loads.
    from confluent_kafka.admin import AdminClient

    from kafka_eos.kafka_admin import all_partitions, partition_offsets

    deadline = time.monotonic() + timeout_s
    port = int(bootstrap.rsplit(":", 1)[1])
    while not _port_open(port):
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker exited with code {proc.returncode}; see {log_file}")
        if time.monotonic() > deadline:
            raise BrokerError(f"broker at {bootstrap} did not listen within {timeout_s:.0f}s; see {log_file}")
        time.sleep(0.2)
    settings = KafkaSettings(bootstrap)
    last_error = "no brokers in metadata"
    while time.monotonic() < deadline:
        try:
            if AdminClient(settings.client_config()).list_topics(timeout=2).brokers:
                break
        except Exception as exc:  # noqa: BLE001 - any failure here means "not yet"
            last_error = str(exc)
        time.sleep(0.5)
    else:
        raise BrokerError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s ({last_error})")
    # Metadata answers before the logs are loaded: a restarted broker still loading a partition
    # answers list_offsets with UNKNOWN_LEADER_EPOCH or NOT_LEADER. Ready means every partition,
    # the internal __consumer_offsets and __transaction_state included, has a leader that answers.
    try:
        partition_offsets(settings, all_partitions(settings))
    except BrokerError as exc:
        raise BrokerError(f"broker at {bootstrap} answers, but not for every partition: {exc}; "
                          f"see {log_file}") from None
