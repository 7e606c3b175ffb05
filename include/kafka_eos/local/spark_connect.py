"""A long-lived Spark for small runs: Spark's own Connect server, from the pyspark distribution
installed in the project's environment, on 127.0.0.1, its log and pid file under .local/spark-connect/.

A run through it (``kafka-eos run --spark-remote sc://127.0.0.1:15002``, or a DAG whose Spark
connection has the type ``spark_connect``) pays no JVM start: the server's driver, its Kafka
connector and its Python workers are already up. pip's pyspark ships the server's jar
(``jars/spark-connect_2.13-<version>.jar``) but not Spark's ``sbin/start-connect-server.sh``; this
runs what that script runs: ``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``.

The server's Python workers run kafka_eos's commit code (per_partition scope) and the user's
Python UDFs: it runs with this interpreter, which must be the clients' Python version too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kafka_eos.errors import KafkaEosError
from kafka_eos.local.process_groups import group_of, stop_group
from kafka_eos.logs import log4j2_properties
from kafka_eos.paths import local_dir
from kafka_eos.spark_io import QUIET_LOGGERS, RESULT_HEAP_SHARE, connect_plugin_conf, local_master_conf, merged_conf, session_conf, size_bytes

HOST = "127.0.0.1"
#: Spark Connect's own default port.
DEFAULT_PORT = int(os.environ.get("KAFKA_EOS_SPARK_CONNECT_PORT", "15002"))
#: One JVM (driver and server) starting on 2 cores, the connector's jars on its class path.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkConnectError(KafkaEosError):
    """The local Spark Connect server did not start or answer."""


@dataclass
class LocalSparkConnect:
    """The server's process (a session of its own), its pid file and log under ``home``.

    :param master: the master the server's driver uses (``local[2]``, or a cluster's URL).
    :param environ: added to the server's environment (its Python workers inherit it).
    :param conf: more Spark settings, over kafka-eos's session settings.
    :param plugin: load kafka-eos's server plugin (per_partition's one-pass proof); False: a server
        as a managed service runs it, without (per_partition in two passes).
    """

    home: Path
    port: int = DEFAULT_PORT
    master: str = "local[2]"
    environ: dict[str, str] = field(default_factory=dict)
    conf: dict[str, str] = field(default_factory=dict)
    plugin: bool = True

    @classmethod
    def default(cls) -> "LocalSparkConnect":
        """The server of ``kafka-eos spark start --connect``: under .local/spark-connect."""
        return cls(local_dir() / "spark-connect")

    @property
    def url(self) -> str:
        """The clients' address (``SparkSession.builder.remote``, ``SPARK_REMOTE``)."""
        return f"sc://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def _pid_file(self) -> Path:
        return self.home / "server.pid"

    def command(self) -> list[str]:
        log4j = self.home / "log4j2.properties"
        # kafka-eos's plugin: per_partition scope's proof of one pass, from the server.
        conf = {**merged_conf(session_conf(), connect_plugin_conf() if self.plugin else {}),
                **local_master_conf(self.master),
                # Warnings and errors to the server's log (at INFO it logs every request).
                "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
                # Loopback only: the server's default is every interface.
                "spark.connect.grpc.binding.address": HOST,
                "spark.connect.grpc.binding.port": str(self.port),
                **self.conf}
        if "spark.driver.maxResultSize" not in conf:  # as spark_io.bound_result_size, of the server's heap

            heap = size_bytes(conf.get("spark.driver.memory", "1g"), "m")
            conf["spark.driver.maxResultSize"] = str(int(heap * RESULT_HEAP_SHARE))
        args = [str(Path(sys.executable).parent / "spark-submit"), "--master", self.master, "--class", SERVER_CLASS,
                "--name", "kafka-eos-spark-connect"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def _env(self) -> dict[str, str]:
        env = {**os.environ,
               "SPARK_LOCAL_IP": HOST,
               # The server's Python workers run kafka_eos code: this interpreter.
               "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
               # As Spark's start-connect-server.sh: the server itself is a classic application.
               "SPARK_CONNECT_MODE": "0",
               **self.environ}
        # A client's setting must not make the server a client of itself.
        env.pop("SPARK_REMOTE", None)
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        return env

    def pid(self) -> int | None:
        return group_of(self._pid_file)

    def is_running(self) -> bool:
        return self.pid() is not None and _port_open(self.port)

    def start(self) -> str:
        """Start the server unless it runs, and wait until it accepts a session. Returns its URL.

        :raises SparkConnectError: the process exited, or no session within :data:`START_TIMEOUT_S`.
        """
        if self.pid() is None:
            if _port_open(self.port):
                raise SparkConnectError(f"port {self.port} on {HOST} is taken by another process: set "
                                        "KAFKA_EOS_SPARK_CONNECT_PORT to a free one")
            self.home.mkdir(parents=True, exist_ok=True)

            (self.home / "log4j2.properties").write_text(log4j2_properties(self.log_file, "WARN", QUIET_LOGGERS))
            log = open(self.log_file, "ab")  # noqa: SIM115 - the child keeps it
            # A session of its own: stop() ends the server and the Python workers it started.
            proc = subprocess.Popen(self.command(), env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home)
            self._pid_file.write_text(str(proc.pid))
        else:
            proc = None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                self._pid_file.unlink(missing_ok=True)
                raise SparkConnectError(f"spark connect server exited ({proc.returncode}); see {self.log_file}")
            if _port_open(self.port) and _answers(self.url):
                return self.url
            time.sleep(1)
        self.stop()
        raise SparkConnectError(f"spark connect server {self.url} did not answer within {START_TIMEOUT_S:g}s; "
                                f"see {self.log_file}")

    def stop(self) -> bool:
        """End the server (and its Python workers): SIGTERM, then SIGKILL. Whether it was running."""
        pid = self.pid()
        self._pid_file.unlink(missing_ok=True)
        if pid is None:
            return False
        stop_group(pid, STOP_TIMEOUT_S)
        return True


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _answers(url: str) -> bool:
    """Whether the server answers a request (the gRPC port opens before the session manager is up).
    Asked from a child process: a Connect client and a classic session cannot share a process."""
    probe = ("import sys; from pyspark.sql import SparkSession; "
             "s = SparkSession.builder.remote(sys.argv[1]).getOrCreate(); "
             "assert s.range(1).count() == 1")
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYSPARK_GATEWAY_PORT")}
    try:
        return subprocess.run([sys.executable, "-c", probe, url], env=env, capture_output=True,
                               timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False
