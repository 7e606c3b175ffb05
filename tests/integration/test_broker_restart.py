"""The embedded default's first run, and the run after a broker restart, both work at once.

What broke first runs: a restarted broker raises its partitions' leader epochs, and the demo then
deletes and re-creates its topics. A client that cached the old topics' metadata asked for offsets
with a leader epoch the new topics do not have yet (UNKNOWN_LEADER_EPOCH, NOT_LEADER_FOR_PARTITION)
and failed at once. This test runs the demo's path — reset topics and groups, produce, run both
example pipelines, check exactly-once — on a private broker started cold, then stops it, starts it
again and runs the same path straight away.
"""

from __future__ import annotations


import pytest
import yaml

from kafka_eos import demo
from kafka_eos.cli import main
from kafka_eos.sample_data import produce_orders
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import spec_document

pytestmark = pytest.mark.integration


def _demo_round(settings: KafkaSettings, specs, spec_files, sql_file, seed: int) -> demo.Report:
    demo.reset(settings, specs)  # with KAFKA_EOS_SQL_URL: drops the demo's table and rows there
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


def test_demo_path_on_a_cold_broker_then_right_after_a_restart(spark, tmp_path, private_broker, monkeypatch):
    # The SQL sink where KAFKA_EOS_SQL_URL says, as a deployment sets it: the demo's runs, its
    # reset and its checks all use that database (before, the checks read the default file).
    sql_file = tmp_path / "revenue.db"
    monkeypatch.setenv("KAFKA_EOS_SQL_URL", f"sqlite:///{sql_file}")
    specs = demo.demo_specs()
    assert [s.name for s in specs] == ["orders_enriched", "revenue_per_minute"]
    assert specs[1].sink.url == f"sqlite:///{sql_file}"
    spec_files = []
    for spec in specs:
        path = tmp_path / f"{spec.name}.yaml"
        path.write_text(yaml.safe_dump(spec_document(spec)))
        spec_files.append(path)
    broker = private_broker()  # cold: storage formatted now
    settings = KafkaSettings(broker.bootstrap)
    first = _demo_round(settings, specs, spec_files, sql_file, seed=0)
    assert first.ok, [c for c in first.checks if not c.ok]

    assert broker.stop()
    broker.start()
    second = _demo_round(settings, specs, spec_files, sql_file, seed=1000)
    assert second.ok, [c for c in second.checks if not c.ok]
    assert len(second.checks) == len(first.checks) >= 10
