"""The CLI contract (DESIGN.md §6): outputs, exit codes, one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos.cli import main
from kafka_eos.spec import spec_document

pytestmark = pytest.mark.integration


def test_kafka_status_prints_the_bootstrap_address(kafka_settings, capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    from kafka_eos.local_kafka import LocalBroker

    if LocalBroker.default().bootstrap != kafka_settings.bootstrap_servers:
        pytest.skip("tests run against $KAFKA_BOOTSTRAP_SERVERS, not the local broker")
    assert main(["kafka", "status"]) == 0
    assert capsys.readouterr().out.strip() == kafka_settings.bootstrap_servers


def test_plan_and_checkpoint_json(kafka_settings, make_spec, tmp_path, capsys):
    spec = make_spec(partitions=2)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    p = Producer(kafka_settings.client_config())
    for i in range(3):
        p.produce(spec.source.topics[0], value=b"x", partition=1)
    p.flush(30)

    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    assert main([*boot, "plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [(r["partition"], r["from_offset"], r["until"]) for r in plan["ranges"]] == [(0, 0, 0), (1, 0, 3)]
    assert main([*boot, "checkpoint", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["partitions"]
    assert [(r["partition"], r["checkpoint"], r["lso"], r["lag"]) for r in rows] == [(0, None, 0, 0), (1, None, 3, 3)]


def test_errors_are_one_line_on_stderr_with_nonzero_exit(kafka_settings, make_spec, tmp_path, capsys):
    spec = make_spec()
    doc = spec_document(spec)
    doc["source"]["topics"] = ["no-such-topic-cli"]
    path = tmp_path / "missing.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "source topic 'no-such-topic-cli' does not exist" in err

    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "plan", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml: no such pipeline spec" in capsys.readouterr().err
