"""Integration fixtures: topics on the real broker, example pipelines, a real PostgreSQL."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from kafka_eos import kafka_admin
from kafka_eos.spec import PipelineSpec, parse_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def admin(kafka_settings):
    return kafka_admin.admin_client(kafka_settings)


@pytest.fixture
def make_spec(kafka_settings, unique, tmp_path):
    """Build a spec over fresh topics: ``make_spec(transform, sink_kind, commit, partitions=3, **sink)``."""

    def build(transform: str = "identity", kind: str = "kafka", commit: str = "atomic",
              partitions: int = 3, source: dict | None = None, **sink) -> PipelineSpec:
        src, out, dlq = f"in-{unique}", f"out-{unique}", f"dlq-{unique}"
        kafka_admin.create_topics(kafka_settings, {src: partitions, out: 3, dlq: 1})
        if kind == "kafka":
            sink = {"topic": out, "dlq_topic": dlq, **sink}
        else:
            sink = {"table": "results", "url": f"sqlite:///{tmp_path / 'sink.db'}", **sink}
        doc = {"name": unique, "source": {"topics": [src], **(source or {})}, "transform": transform,
               "sink": {"kind": kind, "commit": commit, **sink}}
        return parse_spec(doc, str(tmp_path / f"{unique}.yaml"))

    return build


@pytest.fixture
def transforms_from(tmp_path, monkeypatch):
    """``transforms_from(module_name, source)``: a transform module of this test's own, importable
    by the driver and by Spark's local Python workers. Returns the module name."""

    def write(module: str, source: str) -> str:
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return module

    return write


@pytest.fixture
def private_broker(tmp_path, free_ports):
    """``private_broker(**settings)``: a broker of this test's own (cold, under tmp_path, on free
    ports), with broker settings of its own; stopped at the end of the test."""
    from kafka_eos.local_kafka import LocalBroker

    started = []

    def start(**overrides) -> LocalBroker:
        broker = LocalBroker(home=tmp_path / f"kafka-{len(started)}", port=free_ports(2),
                             overrides=tuple((k.replace("_", "."), str(v)) for k, v in overrides.items()))
        started.append(broker)
        broker.start()
        return broker

    yield start
    for broker in started:
        broker.stop()
        shutil.rmtree(broker.home, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin() -> Path:
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "initdb").exists():
            return base
    raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql: "
                       "run `make postgres` (installs Debian's postgresql package)")


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (it refuses to run as root: runs as postgres)."""
    bin_dir = _pg_bin()
    # Not under pytest's tmp folder: that is private to root, and the server runs as postgres.
    base = Path(tempfile.mkdtemp(prefix="kafka-eos-pg-"))
    base.chmod(0o755)
    data = base / "data"
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_pg:
        shutil.chown(base, "postgres")
    subprocess.run([*as_pg, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "kafka_eos"],
                   check=True, capture_output=True)
    port = _free_port()
    log = base / "pg.log"
    subprocess.run([*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o",
                    f"-p {port} -k {data.parent} -c listen_addresses=127.0.0.1", "start"],
                   check=True, capture_output=True)
    url = f"postgresql+psycopg2://kafka_eos@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 30
    from sqlalchemy import create_engine, text

    while True:
        try:
            with create_engine(url).connect() as conn:
                conn.execute(text("select 1"))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    yield url
    subprocess.run([*as_pg, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                   capture_output=True)
    shutil.rmtree(base, ignore_errors=True)
