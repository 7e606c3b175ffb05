"""A throwaway PostgreSQL server on 127.0.0.1 from Debian's server package (``make postgres``),
for the SQL sink's tests and benchmark. PostgreSQL refuses to run as root: as root it runs as the
``postgres`` user, from a folder that user owns."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from kafka_eos.errors import KafkaEosError

#: A fresh cluster answers within a few seconds; 2 busy cores make it slower.
START_TIMEOUT_S = 30.0


def _pg_bin() -> Path:
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "initdb").exists():
            return base
    raise KafkaEosError("PostgreSQL server binaries not found under /usr/lib/postgresql: "
                        "run `make postgres` (installs Debian's postgresql package)")


def _kernel_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """``start()`` initialises a cluster in a new temporary folder and returns its SQLAlchemy URL
    (user ``kafka_eos``, trust authentication on loopback); ``stop()`` stops it and removes the folder.

    :param port: the port to listen on; by default a free one the kernel picks.
    :param folder: a folder that keeps the cluster between a stop and the next start (a local
        Airflow's metadata database); by default a new temporary one, removed by ``stop()``.
    """

    def __init__(self, port: int | None = None, folder: Path | None = None) -> None:
        self.bin_dir = _pg_bin()
        self.port = port
        self.folder = folder
        self.base: Path | None = None
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def start(self) -> str:
        from sqlalchemy import create_engine, text

        if self.folder is not None:
            self.base = self.folder
            self.base.mkdir(parents=True, exist_ok=True)
        else:  # not under a private tmp folder: the server may run as another user
            self.base = Path(tempfile.mkdtemp(prefix="kafka-eos-pg-"))
        self.base.chmod(0o755)
        data = self.base / "data"
        if self.as_pg:
            shutil.chown(self.base, "postgres")
        if not (data / "PG_VERSION").exists():
            subprocess.run([*self.as_pg, str(self.bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "kafka_eos"],
                           check=True, capture_output=True)
        port = self.port or _kernel_free_port()
        running = subprocess.run([*self.as_pg, str(self.bin_dir / "pg_ctl"), "-D", str(data), "status"],
                                 capture_output=True).returncode == 0
        if not running:
            subprocess.run([*self.as_pg, str(self.bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.base / "pg.log"),
                            "-w", "-o", f"-p {port} -k {self.base} -c listen_addresses=127.0.0.1", "start"],
                           check=True, capture_output=True)
        url = f"postgresql+psycopg2://kafka_eos@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                engine = create_engine(url)
                with engine.connect() as conn:
                    conn.execute(text("select 1"))
                engine.dispose()
                return url
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server (one kept in ``folder`` too, started by another process)."""
        self.base = self.base or self.folder
        if self.base is None:
            return
        subprocess.run([*self.as_pg, str(self.bin_dir / "pg_ctl"), "-D", str(self.base / "data"), "-m", "fast", "stop"],
                       capture_output=True)
        if self.folder is None:
            shutil.rmtree(self.base, ignore_errors=True)
        self.base = None
