"""Iceberg's own REST catalog server on 127.0.0.1 (``jvm/iceberg-rest/LoopbackRestCatalog.java``
over the jars ``make jars`` resolves and pyspark's Hadoop jars), for the Iceberg sink's REST
catalog tests: a JdbcCatalog in SQLite behind the REST protocol, its warehouse a local folder,
each request asked for a bearer token."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pyspark

from kafka_eos.errors import KafkaEosError
from kafka_eos.paths import jars_dir

SOURCE = Path(__file__).resolve().parents[2] / "jvm" / "iceberg-rest" / "LoopbackRestCatalog.java"
START_TIMEOUT_S = 90.0


class RestCatalogServer:
    """``start()`` runs the server over ``folder`` (its catalog database and warehouse) and returns
    its URI, ``http://127.0.0.1:PORT``; ``stop()`` ends it. ``token``: the bearer token it asks for."""

    def __init__(self, folder: Path, token: str) -> None:
        self.folder, self.token = folder, token
        self.process: subprocess.Popen | None = None
        self.warehouse = (folder / "warehouse").as_uri()

    def start(self) -> str:
        jars = jars_dir("iceberg-rest")
        if not (jars / ".resolved").exists():
            raise KafkaEosError(f"{jars}: Iceberg's REST catalog jars are missing: run `make jars`")
        hadoop = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-*.jar"))
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "server.log", "w")
        # The token through the environment, never the command line (a process list shows it).
        self.process = subprocess.Popen(
            ["java", "-cp", os.pathsep.join([f"{jars}/*", *map(str, hadoop)]), str(SOURCE), "0", self.warehouse,
             f"jdbc:sqlite:file:{self.folder / 'catalog.db'}"],
            stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "KAFKA_EOS_REST_TOKEN": self.token})
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if match := re.match(r"listening on (\d+)", line or ""):
                return f"http://127.0.0.1:{match.group(1)}"
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise KafkaEosError(f"Iceberg's REST catalog did not start: see {self.folder / 'server.log'}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
