"""The embedded default's first run, and the run after a broker restart, both work at once.

What broke first runs: a restarted broker raises its partitions' leader epochs, and the demo then
deletes and re-creates its topics. A client that cached the old topics' metadata asked for offsets
with a leader epoch the new topics do not have yet (UNKNOWN_LEADER_EPOCH, NOT_LEADER_FOR_PARTITION)
and failed at once. This test runs the demo's path — reset topics and groups, produce, run both
example pipelines, check exactly-once — on a private broker started cold, then stops it, starts it
again and runs the same path straight away.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket

import pytest
import yaml

from kafka_eos import demo
from kafka_eos.cli import main
from kafka_eos.local_kafka import LocalBroker
from kafka_eos.sample_data import produce_orders
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import load_spec, spec_document

pytestmark = pytest.mark.integration


def _two_free_ports() -> int:
    """A port p with p + 1 free too (the broker's client and controller listeners)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _demo_round(settings: KafkaSettings, specs, spec_files, sql_file, seed: int) -> demo.Report:
    demo.reset(settings, specs)
    sql_file.unlink(missing_ok=True)  # what reset() does to the demo's own SQLite file
    truth = produce_orders(settings, "orders", 400, first_seq=seed, seed=seed,
                           transactional_id=f"kafka-eos.restart-test.{seed}")
    for path in spec_files:
        assert main(["run", str(path), "--bootstrap", settings.bootstrap_servers]) == 0
    report = demo.Report()
    enriched = demo.check_kafka_pipeline(report, settings, specs[0], truth)
    demo.check_sql_pipeline(report, specs[1], truth, enriched)
    for spec in specs:
        demo.check_checkpoints(report, settings, spec)
    return report


def test_demo_path_on_a_cold_broker_then_right_after_a_restart(spark, tmp_path, capsys):
    broker = LocalBroker(home=tmp_path / "kafka", port=_two_free_ports())
    specs = [load_spec("orders_enriched"), load_spec("revenue_per_minute")]
    # The SQL sink in this test's folder: reset() deletes only the default SQLite file.
    sql_file = tmp_path / "revenue.db"
    specs[1] = dataclasses.replace(specs[1], sink=dataclasses.replace(specs[1].sink, url=f"sqlite:///{sql_file}"))
    spec_files = []
    for spec in specs:
        path = tmp_path / f"{spec.name}.yaml"
        path.write_text(yaml.safe_dump(spec_document(spec)))
        spec_files.append(path)
    try:
        broker.start()  # cold: storage formatted now
        settings = KafkaSettings(broker.bootstrap)
        first = _demo_round(settings, specs, spec_files, sql_file, seed=0)
        assert first.ok, [c for c in first.checks if not c.ok]

        assert broker.stop()
        broker.start()
        second = _demo_round(settings, specs, spec_files, sql_file, seed=1000)
        assert second.ok, [c for c in second.checks if not c.ok]
        assert len(second.checks) == len(first.checks) >= 10
    finally:
        broker.stop()
        shutil.rmtree(tmp_path / "kafka", ignore_errors=True)
