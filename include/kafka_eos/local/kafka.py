"""The embedded default broker: Apache Kafka 4.x, single-node KRaft, on 127.0.0.1, under .local/;
and a three-node cluster beside it (``kafka-eos kafka start --brokers 3``) for the fault matrix.

Started from the official jars resolved from Maven Central (``make jars``), with the main classes
a Kafka distribution's scripts call: ``kafka.tools.StorageTool`` to format, ``kafka.Kafka`` to run.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from kafka_eos.errors import BrokerError
from kafka_eos.logs import log4j2_properties
from kafka_eos.paths import jars_dir, local_dir, write_private
from kafka_eos.local.process_groups import stop_group, stop_groups
from kafka_eos.local.tls import ensure_tls_files
from kafka_eos.settings import KafkaSettings

HOST = "127.0.0.1"
#: Default client port; an unusual one so a developer's own Kafka on 9092 is left alone.
DEFAULT_PORT = int(os.environ.get("KAFKA_EOS_LOCAL_PORT", "19092"))
#: The JVM options of the broker (and of its storage format step), as Kafka's own scripts read them.
JVM_PERFORMANCE_OPTS_ENV = "KAFKA_JVM_PERFORMANCE_OPTS"
#: The cluster's first client port; node i listens on +2(i-1), its controller one above.
DEFAULT_CLUSTER_PORT = int(os.environ.get("KAFKA_EOS_CLUSTER_PORT", "19192"))
#: The secured broker's client port (SASL_SSL); its controller listens one above.
DEFAULT_SECURE_PORT = int(os.environ.get("KAFKA_EOS_SECURE_PORT", "19094"))
#: The secured broker's super user, for set-up only (users, topics, ACLs).
SUPER_USER = "admin"
#: The SASL mechanism of the secured broker's users.
SCRAM = "SCRAM-SHA-512"
#: How long a cold start may take: JVM start, storage load and controller election on 2 cores.
START_TIMEOUT_S = 90.0
#: How long a clean shutdown may take before the broker is killed.
STOP_TIMEOUT_S = 30.0

_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
# Every internal topic, and new topics by default, on every node (one node: one replica); a write
# needs all but one of them in sync, so a cluster of three takes the loss of one node.
default.replication.factor={replicas}
min.insync.replicas={min_isr}
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
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
    :param node_id: this node's id; with ``voters``, its place in a cluster.
    :param voters: the controller quorum (``id@host:port,...``); empty: this node alone.
    :param replicas: replicas of internal topics and of new topics (the cluster's size).
    :param cluster_id: the id every node of a cluster formats its storage with; empty: a new one.
    :param heap: the JVM's maximum heap.
    :param secure: the secured broker (``kafka-eos kafka start --secure``): one SASL_SSL listener
        (SCRAM-SHA-512 users; a CA and server certificate of its own under ``home/tls``), the
        StandardAuthorizer with nothing allowed that no ACL allows, the super user ``admin``
        for set-up only, and a controller listener that takes only the broker's own certificate.
    """

    home: Path
    port: int = DEFAULT_PORT
    overrides: tuple[tuple[str, str], ...] = ()
    node_id: int = 1
    voters: str = ""
    replicas: int = 1
    cluster_id: str = ""
    # 1 GiB is plenty for a test broker and leaves room for Spark and Airflow.
    heap: str = "1g"
    secure: bool = False

    @classmethod
    def default(cls) -> "LocalBroker":
        return cls(home=local_dir() / "kafka")

    @classmethod
    def secure_default(cls) -> "LocalBroker":
        return cls(home=local_dir() / "kafka-secure", port=DEFAULT_SECURE_PORT, secure=True)

    @property
    def users_dir(self) -> Path:
        """Where a secured broker keeps each user's client settings (one JSON file per user,
        readable by its owner only: the ``KAFKA_EOS_CLIENT_CONFIG_FILE`` of that user)."""
        return self.home / "users"

    def user_config_file(self, user: str) -> Path:
        return self.users_dir / f"{user}.json"

    def settings(self, user: str | None = None) -> KafkaSettings:
        """Client settings for this broker; on a secured one, those of ``user`` (the super user
        when None)."""
        if not self.secure:
            return KafkaSettings(self.bootstrap)
        path = self.user_config_file(user or SUPER_USER)
        try:
            extra = json.loads(path.read_text())
        except FileNotFoundError:
            how = f"`kafka-eos kafka user {user}` makes one" if user else "`kafka-eos kafka start --secure` makes it"
            raise BrokerError(f"no user {user or SUPER_USER!r} on the secured broker ({path} is missing): {how}") \
                from None
        return KafkaSettings(self.bootstrap, extra=extra)

    def add_user(self, user: str) -> Path:
        """Create (or give a new password to) the SCRAM user ``user`` on this running secured
        broker, through the super user; its client settings go to :meth:`user_config_file`.
        The user may do nothing until ACLs allow it (``kafka-eos acls ... --apply``)."""
        from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                           UserScramCredentialUpsertion)

        password = secrets.token_urlsafe(24)
        admin = AdminClient(self.settings().client_config())
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                              password.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        return self._write_user(user, password)

    def _write_user(self, user: str, password: str) -> Path:
        self.users_dir.mkdir(parents=True, exist_ok=True)
        config = {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM, "sasl.username": user,
                  "sasl.password": password, "ssl.ca.location": str(ensure_tls_files(self.home / "tls").ca)}
        path = self.user_config_file(user)
        write_private(path, json.dumps(config, indent=2) + "\n")
        return path

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    def pid(self) -> int | None:
        """The broker's process id while it lives (the fault matrix signals it)."""
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
        return self.pid() is not None and _port_open(self.port)

    def start(self, bootstrap: str | None = None) -> str:
        """Start the broker (or reuse a running one) and wait until it answers.

        :param bootstrap: the cluster this node belongs to: ready means every partition of it answers.
        :returns: the bootstrap address.
        :raises BrokerError: jars missing, port taken by another process, or no answer in time.
        """
        if self.secure:
            self._super_password()  # its client settings file, made on first use
        settings = self.settings() if self.secure else None
        if self.is_running():
            _wait_ready(self.bootstrap, START_TIMEOUT_S, cluster=bootstrap, settings=settings)
            return self.bootstrap
        proc = self.launch()
        try:
            _wait_ready(self.bootstrap, START_TIMEOUT_S, proc, self.log_file, cluster=bootstrap, settings=settings)
        except BrokerError:
            self.stop()
            raise
        return self.bootstrap

    def launch(self) -> subprocess.Popen:
        """Format the storage on first use and start the broker's JVM; do not wait for it.

        :raises BrokerError: jars missing, port taken by another process, or formatting failed.
        """
        for port in (self.port, self.port + 1):
            if _port_open(port):
                raise BrokerError(
                    f"port {HOST}:{port} is taken by another process; stop it or set "
                    f"{'KAFKA_EOS_CLUSTER_PORT' if self.voters else 'KAFKA_EOS_LOCAL_PORT'} to a free port"
                )
        classpath = _classpath()
        data_dir = self.home / "data"
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        props = self.home / "server.properties"
        secured = self._secured_settings() if self.secure else []
        # Written readable by its owner only: a secured broker's holds the super user's password.
        write_private(props, _SERVER_PROPERTIES.format(
            host=HOST, port=self.port, controller_port=self.port + 1, data_dir=data_dir, node_id=self.node_id,
            voters=self.voters or f"{self.node_id}@{HOST}:{self.port + 1}", replicas=self.replicas,
            min_isr=max(1, self.replicas - 1))
            + "".join(f"{key}={value}\n" for key, value in [*secured, *self.overrides]))
        log4j = self.home / "log4j2.properties"
        log4j.write_text(log4j2_properties(self.log_file, "INFO", _LOG_LEVELS))
        # Kafka's own scripts take the JVM's tuning from KAFKA_JVM_PERFORMANCE_OPTS; so does the
        # local broker (the test suite starts its short-lived brokers on C1 and the serial collector).
        tuning = os.environ.get(JVM_PERFORMANCE_OPTS_ENV, "").split()
        java = ["java", *tuning, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not (data_dir / "meta.properties").exists():
            cluster_id = self.cluster_id or new_cluster_id()
            args = ["kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
                    "--config", str(props), "--ignore-formatted"]
            if self.secure:
                # The super user's SCRAM credential is written into the metadata at format time
                # (before any listener could authenticate anyone). Its password goes through a
                # Java argument file, readable by its owner only, never the process list.
                args += ["--add-scram", f"{SCRAM}=[name={SUPER_USER},password={self._super_password()}]"]
            argfile = self.home / "format.args"
            write_private(argfile, "\n".join(_java_arg(a) for a in [*java[1:], *args]) + "\n")
            try:
                fmt = subprocess.run(["java", f"@{argfile}"], capture_output=True, text=True)
            finally:
                argfile.unlink(missing_ok=True)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting {data_dir} failed: {fmt.stderr.strip() or fmt.stdout.strip()}")
        with open(self.home / "logs" / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                ["java", "-Xms256m", f"-Xmx{self.heap}", *java[1:], "kafka.Kafka", str(props)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        return proc

    def _super_password(self) -> str:
        """The super user's password, made on first use and kept in its client settings file."""
        path = self.user_config_file(SUPER_USER)
        if not path.exists():
            self._write_user(SUPER_USER, secrets.token_urlsafe(24))
        return json.loads(path.read_text())["sasl.password"]

    def _secured_settings(self) -> list[tuple[str, str]]:
        tls = ensure_tls_files(self.home / "tls")
        scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule"
        return [
            ("listeners", f"SASL_SSL://{HOST}:{self.port},CONTROLLER://{HOST}:{self.port + 1}"),
            ("advertised.listeners", f"SASL_SSL://{HOST}:{self.port}"),
            ("listener.security.protocol.map", "SASL_SSL:SASL_SSL,CONTROLLER:SSL"),
            ("inter.broker.listener.name", "SASL_SSL"),
            ("sasl.enabled.mechanisms", SCRAM),
            ("sasl.mechanism.inter.broker.protocol", SCRAM),
            ("listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config",
             f'{scram_module} required username="{SUPER_USER}" password="{self._super_password()}";'),
            ("ssl.keystore.type", "PEM"), ("ssl.keystore.location", str(tls.keystore)),
            ("ssl.truststore.type", "PEM"), ("ssl.truststore.location", str(tls.ca)),
            # The controller listener takes only a client certificate the CA signed: the broker's own.
            ("listener.name.controller.ssl.client.auth", "required"),
            ("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"),
            ("allow.everyone.if.no.acl.found", "false"),
            ("super.users", f"User:{SUPER_USER};{tls.principal}"),
        ]

    def stop(self) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL after a grace period).

        :returns: True when a broker was running.
        """
        pid = self.pid()
        if pid is not None:
            # The broker leads a session of its own (start_new_session): the group is the broker.
            stop_group(pid, STOP_TIMEOUT_S)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None


@dataclass(frozen=True)
class LocalCluster:
    """Three KRaft nodes (broker and controller each, a controller quorum of three) on 127.0.0.1:
    replication factor 3 and ``min.insync.replicas=2`` for every topic, the transaction state log and
    the offsets topic included. Node i keeps its config, data and logs under ``home/node-i``.

    :param home: the cluster's folder.
    :param port: node 1's client port; node i listens on ``port + 2(i-1)`` and its controller one above.
    :param size: the number of nodes.
    """

    home: Path
    port: int = DEFAULT_CLUSTER_PORT
    size: int = 3
    overrides: tuple[tuple[str, str], ...] = ()

    @classmethod
    def default(cls) -> "LocalCluster":
        return cls(home=local_dir() / "kafka-cluster")

    @property
    def nodes(self) -> list[LocalBroker]:
        id_file = self.home / "cluster-id"
        cluster_id = id_file.read_text().strip() if id_file.exists() else ""
        voters = ",".join(f"{i}@{HOST}:{self.port + 2 * (i - 1) + 1}" for i in range(1, self.size + 1))
        # Half a gigabyte each: three brokers beside Spark on a small machine.
        return [LocalBroker(home=self.home / f"node-{i}", port=self.port + 2 * (i - 1), overrides=self.overrides,
                            node_id=i, voters=voters, replicas=self.size, cluster_id=cluster_id, heap="512m")
                for i in range(1, self.size + 1)]

    def node(self, node_id: int) -> LocalBroker:
        return self.nodes[node_id - 1]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def is_running(self) -> bool:
        return all(n.is_running() for n in self.nodes)

    def start(self) -> str:
        """Start every node that is not running (all at once: a quorum needs two to elect), and wait
        until every partition of the cluster answers.

        :returns: the bootstrap addresses.
        :raises BrokerError: as :meth:`LocalBroker.start`.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        id_file = self.home / "cluster-id"
        if not id_file.exists():
            id_file.write_text(new_cluster_id() + "\n")
        nodes = self.nodes
        procs = {n.node_id: n.launch() for n in nodes if not n.is_running()}
        try:
            for n in nodes:
                _wait_ready(n.bootstrap, START_TIMEOUT_S, procs.get(n.node_id), n.log_file, cluster=self.bootstrap)
        except BrokerError:
            self.stop()
            raise
        return self.bootstrap

    def stop(self, grace_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop every node; True when any was running. All are told at once (one by one, the last
        ones would wait for a quorum that is already gone) and waited for together; what still
        runs after ``grace_s`` is killed (a node that waits for a controller no longer there; a
        throwaway cluster need not wait for its clean shutdown at all)."""
        running = [(n, n.pid()) for n in self.nodes]
        running = [(n, pid) for n, pid in running if pid is not None]
        stop_groups([pid for _n, pid in running], grace_s)
        for n, _pid in running:
            n.pid_file.unlink(missing_ok=True)
        return bool(running)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (as ``kafka-storage random-uuid``).
    Like Kafka's ``Uuid.randomUuid``, never one that starts with ``-``: ``kafka-storage format
    --cluster-id -…`` takes it for an option (seen: one secured broker's format in 64 failed)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _classpath() -> str:
    folder = jars_dir("kafka")
    if not any(folder.glob("kafka_*.jar")):
        raise BrokerError(f"no Kafka jars in {folder}: run `make jars` first")
    return str(folder / "*")


def _java_arg(arg: str) -> str:
    """``arg`` as one argument of a Java argument file (quoted; backslashes and quotes escaped)."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _wait_ready(bootstrap: str, timeout_s: float, proc: subprocess.Popen | None = None,
                log_file: Path | None = None, cluster: str | None = None,
                settings: KafkaSettings | None = None) -> None:
    """Wait until the port accepts connections, then until the broker serves metadata, then
    until every partition's leader (of the ``cluster`` the node is part of) answers."""
    # Imported here: the DAG files import this module at parse time, where no Kafka client loads.
    from kafka_eos.kafka_admin import all_partitions, partition_offsets

    deadline = time.monotonic() + timeout_s
    port = int(bootstrap.rsplit(":", 1)[1])
    while not _port_open(port):
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker exited with code {proc.returncode}; see {log_file}")
        if time.monotonic() > deadline:
            raise BrokerError(f"broker at {bootstrap} did not listen within {timeout_s:.0f}s; see {log_file}")
        time.sleep(0.2)
    settings = settings or KafkaSettings(cluster or bootstrap)
    last_error = "no brokers in metadata"
    # The first answer asked through kafka-python (pure Python): librdkafka has aborted the whole
    # process in a metadata request to a broker still starting after a restart (twice, in CI, with
    # a new client each try and with one client for all), where a Python client only fails the try.
    from kafka.admin import KafkaAdminClient

    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(**{**settings.kafka_python_config(), "request_timeout_ms": 5000},
                                     client_id="kafka-eos-ready")
            try:
                if admin.describe_cluster().get("brokers"):
                    break
            finally:
                admin.close()
        except Exception as exc:  # noqa: BLE001 - any failure here means "not yet"
            last_error = str(exc) or type(exc).__name__
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
