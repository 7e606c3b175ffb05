"""The embedded Schema Registry: Apicurio Registry 2.4 (Apache-2.0) on 127.0.0.1, its data (an H2
database file) under .local/registry/. Its Confluent-compatible API (``/apis/ccompat/v7``) is what
kafka-eos, confluent-kafka's ``SchemaRegistryClient`` and every Confluent serializer speak.

Built from Maven Central by ``make jars`` (jvm/registry/pom.xml: the registry's application jar,
packaged by Quarkus's build step into a runner jar and its lib/ folder).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kafka_eos.errors import RegistryError
from kafka_eos.local.process_groups import stop_group
from kafka_eos.paths import jars_dir, local_dir

HOST = "127.0.0.1"
#: The registry's port; an unusual one so a developer's own registry on 8081 is left alone.
DEFAULT_PORT = int(os.environ.get("KAFKA_EOS_REGISTRY_PORT", "18081"))
#: The path of the Confluent-compatible API under the server's root.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: A cold start on 2 busy cores: JVM, Quarkus, the H2 schema.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
#: The compatibility rule a new registry starts with: Confluent Schema Registry's default.
DEFAULT_COMPATIBILITY = "BACKWARD"


@dataclass(frozen=True)
class LocalRegistry:
    """Paths and port of the local Schema Registry.

    :param home: folder holding the data, the log and the pid file.
    :param port: HTTP port on 127.0.0.1.
    """

    home: Path
    port: int = DEFAULT_PORT
    heap: str = "384m"

    @classmethod
    def default(cls) -> "LocalRegistry":
        return cls(home=local_dir() / "registry")

    @property
    def url(self) -> str:
        """The Confluent-compatible API's URL: what a pipeline's registry connection points at."""
        return f"http://{HOST}:{self.port}{CCOMPAT_PATH}"

    @property
    def pid_file(self) -> Path:
        return self.home / "registry.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "registry.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        return pid

    def ready(self) -> bool:
        import requests  # here: every CLI command asks only for the URL (cli._local_registry_url)

        try:
            return requests.get(f"http://{HOST}:{self.port}/health/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def is_running(self) -> bool:
        return self.pid() is not None and self.ready()

    def start(self) -> str:
        """Start the registry (or reuse a running one) and wait until it answers.

        :returns: the URL of its Confluent-compatible API.
        :raises RegistryError: the jar is missing, the port is taken, or no answer in time.
        """
        if self.pid() is not None:  # running, or still starting: wait for it
            self._wait_ready(None)
            return self.url
        if self.ready():
            raise RegistryError(f"port {HOST}:{self.port} answers but is not this registry: stop that "
                                "process or set KAFKA_EOS_REGISTRY_PORT to a free port")
        runner = runner_jar()
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC",
                 f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={self.port}",
                 f"-Dregistry.datasource.url=jdbc:h2:file:{self.home / 'data' / 'registry'}",
                 f"-Dregistry.rules.global.compatibility={DEFAULT_COMPATIBILITY}",
                 "-Dquarkus.log.level=WARN", "-Dquarkus.banner.enabled=false",
                 "-jar", str(runner)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        self._wait_ready(proc)
        # What the Confluent-compatible API reports as the global rule (the rule itself is
        # Apicurio's global rule, set above).
        import requests

        requests.put(f"{self.url}/config", json={"compatibility": DEFAULT_COMPATIBILITY}, timeout=10).raise_for_status()
        return self.url

    def _wait_ready(self, proc: subprocess.Popen | None) -> None:
        """Until the registry answers. :raises RegistryError: it exited, or no answer in time."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready():
            if (proc.poll() is not None) if proc is not None else self.pid() is None:
                self.pid_file.unlink(missing_ok=True)
                raise RegistryError(f"the registry exited while starting: see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise RegistryError(f"the registry did not answer on {HOST}:{self.port} within "
                                    f"{START_TIMEOUT_S:.0f}s: see {self.log_file}")
            time.sleep(0.5)

    def stop(self) -> bool:
        """Stop the registry. :returns: True when one was running."""
        pid = self.pid()
        if pid is not None:
            stop_group(pid, STOP_TIMEOUT_S)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None


def runner_jar() -> Path:
    """The registry's runner jar (``make jars`` builds it into .local/jars/registry/)."""
    found = sorted(jars_dir("registry").glob("*-runner.jar"))
    if not found:
        raise RegistryError(f"no Schema Registry jar in {jars_dir('registry')}: run `make jars`")
    return found[0]
