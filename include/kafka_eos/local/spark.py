"""A Spark standalone cluster on this machine: one master and N workers, on 127.0.0.1 only, from
the pyspark distribution installed in the project's environment, its state under .local/spark/.

Each process is the main class a Spark distribution's ``sbin/start-master.sh`` / ``start-worker.sh``
would run (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``): pip's
pyspark ships ``spark-class`` but not the ``sbin`` scripts. Applications reach it at
``spark://127.0.0.1:<port>`` (client deploy mode: the driver runs where spark-submit runs). The
workers launch executors with the project's interpreter (``spark.pyspark.python``), which has
kafka_eos and confluent-kafka installed: that is how executors get the project here, as the image
in docker-compose.yml gets it on a real cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kafka_eos.errors import KafkaEosError
from kafka_eos.paths import local_dir
from kafka_eos.local.process_groups import group_of, stop_group

HOST = "127.0.0.1"
#: Spark's own default master port; the UI moves off 8080 (Airflow's API server uses it).
DEFAULT_PORT = int(os.environ.get("KAFKA_EOS_SPARK_PORT", "7077"))
DEFAULT_UI_PORT = int(os.environ.get("KAFKA_EOS_SPARK_UI_PORT", "8090"))
#: Three JVMs starting on 2 cores; each needs ~5-10 s and the workers then register.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


class SparkClusterError(KafkaEosError):
    """The local Spark cluster did not start or answer."""


@dataclass
class LocalSparkCluster:
    """One master and ``workers`` workers, their pid files, logs and work dirs under ``home``.

    :param worker_cores: cores each worker offers (one executor per worker with the defaults).
    :param worker_memory: memory each worker offers its executors (an executor takes 1g by default).
    :param environ: added to every process's environment (the workers pass it on to executors).
    """

    home: Path
    port: int = DEFAULT_PORT
    ui_port: int = DEFAULT_UI_PORT
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "2g"
    environ: dict[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls) -> "LocalSparkCluster":
        """The cluster of ``kafka-eos spark start`` (``make cluster-up``): under .local/spark."""
        return cls(local_dir() / "spark")

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    def _processes(self) -> list[tuple[str, list[str]]]:
        master = ("master", ["org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(self.port),
                             "--webui-port", str(self.ui_port)])
        workers = [(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", self.master_url, "--host", HOST,
                                    # Worker UIs after the master's; the RPC port is Spark's pick.
                                    "--webui-port", str(self.ui_port + n), "--cores", str(self.worker_cores),
                                    "--memory", self.worker_memory, "--work-dir", str(self.home / f"worker-{n}")])
                   for n in range(1, self.workers + 1)]
        return [master, *workers]

    def _env(self) -> dict[str, str]:
        return {**os.environ,
                # Every socket of the master, the workers and their executors on loopback.
                "SPARK_LOCAL_IP": HOST,
                # Where Spark writes its daemons' logs and pid files when asked; ours go to home.
                "SPARK_LOG_DIR": str(self.home / "logs"),
                # Executors run kafka_eos's commit code: the interpreter that has it.
                "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
                **self.environ}

    def _pid_file(self, name: str) -> Path:
        return self.home / f"{name}.pid"

    def status(self) -> dict | None:
        """The master's own view (its ``/json/`` endpoint: workers, applications), or None."""
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as resp:
                return json.load(resp)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict]:
        state = self.status() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def start(self) -> str:
        """Start the master and the workers (those not running yet) and wait until every worker
        has registered. Returns the master URL.

        :raises SparkClusterError: a process exited, or the workers did not register in time.
        """
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        spark_class = str(Path(sys.executable).parent / "spark-class")
        procs: dict[str, subprocess.Popen] = {}
        for name, args in self._processes():
            if self._pid(name) is not None:
                continue
            log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
            # A session of its own: stop() ends the process and the executors a worker started.
            procs[name] = subprocess.Popen([spark_class, *args], env=self._env(), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            self._pid_file(name).write_text(str(procs[name].pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    self.stop()
                    raise SparkClusterError(f"spark {name} exited ({proc.returncode}); see "
                                            f"{self.home / 'logs' / (name + '.log')}")
            if len(self.alive_workers()) >= self.workers:
                return self.master_url
            time.sleep(1)
        self.stop()
        raise SparkClusterError(f"spark master {self.master_url}: {self.workers} worker(s) not registered within "
                                f"{START_TIMEOUT_S:g}s; logs in {self.home / 'logs'}")

    def _pid(self, name: str) -> int | None:
        return group_of(self._pid_file(name))

    def stop(self) -> bool:
        """End the workers (and their executors), then the master: SIGTERM, then SIGKILL.
        Returns whether anything was running."""
        was_running = False
        for name, _args in reversed(self._processes()):
            pid = self._pid(name)
            self._pid_file(name).unlink(missing_ok=True)
            if pid is None:
                continue
            was_running = True
            stop_group(pid, STOP_TIMEOUT_S)
        return was_running

