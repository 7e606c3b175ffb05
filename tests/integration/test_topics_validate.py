"""kafka-eos topics create and validate on the real broker: the dry run creates nothing, --yes
creates what is missing with its settings (the sink as wide as the source, a compacted manifest)
and leaves what exists; validate names a missing topic, a transform that does not import and a
checkpoint behind the log start, and passes a pipeline that is ready."""

from __future__ import annotations

import json

import pytest
import yaml
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka_eos import kafka_admin
from kafka_eos.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.quick]


def _spec(tmp_path, name: str, transform: str = "identity") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [f"{name}.in"]}, "transform": transform,
        "sink": {"kind": "kafka", "topic": f"{name}.out", "dlq_topic": f"{name}.dlq", "commit": "atomic"}}))
    return str(path)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_topics_create_is_a_dry_run_until_yes_and_then_creates_what_is_missing(tmp_path, kafka_settings, unique,
                                                                             capsys):
    name = unique.replace("-", "_")
    spec = _spec(tmp_path, name)
    kafka_admin.create_topics(kafka_settings, {f"{name}.in": 2})
    boot = ["--bootstrap", kafka_settings.bootstrap_servers]

    code, out, _ = _cli(capsys, "topics", "create", spec, *boot, "--json")
    plans = {p["name"]: p for p in json.loads(out)}
    assert code == 0 and not any(p["created"] for p in plans.values())
    assert {n: (p["role"], p["existing"]) for n, p in plans.items() if n != "kafka-eos.audit"} == {
        f"{name}.in": ("source", 2), f"{name}.out": ("sink", None), f"{name}.dlq": ("dead letters", None),
        f"kafka-eos.manifest.{name}": ("manifest", None)}
    assert f"{name}.out" not in kafka_admin.cluster_metadata(kafka_settings).topics

    code, out, _ = _cli(capsys, "topics", "create", spec, *boot, "--yes")
    assert code == 0 and f"{name}.out" in out and "created" in out
    topics = kafka_admin.cluster_metadata(kafka_settings).topics
    assert {t: len(topics[t].partitions) for t in (f"{name}.out", f"{name}.dlq", f"kafka-eos.manifest.{name}")} == {
        f"{name}.out": 2, f"{name}.dlq": 2, f"kafka-eos.manifest.{name}": 1}
    resource = ConfigResource(ResourceType.TOPIC, f"kafka-eos.manifest.{name}")
    admin = kafka_admin.admin_client(kafka_settings)  # kept: a collected client cancels its requests
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["cleanup.policy"].value == "compact,delete"

    code, out, _ = _cli(capsys, "topics", "create", spec, *boot, "--yes", "--json")
    assert code == 0 and all(p["existing"] is not None and not p["created"] for p in json.loads(out))


def test_validate_names_what_is_wrong_and_passes_a_ready_pipeline(tmp_path, kafka_settings, unique, capsys):
    name = unique.replace("-", "_")
    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    broken = _spec(tmp_path, f"{name}_x", transform="no_such_module_here:transform")
    code, _, err = _cli(capsys, "validate", broken, *boot)
    assert code == 1 and err.strip() == (f"kafka-eos: {broken}: transform: cannot import module "
                                         "'no_such_module_here' (No module named 'no_such_module_here')")

    spec = _spec(tmp_path, name)
    kafka_admin.create_topics(kafka_settings, {f"{name}.in": 1})
    code, out, err = _cli(capsys, "validate", spec, *boot)
    assert code == 1 and f"FAIL  topic {name}.out: sink: missing" in out
    assert err.startswith(f"kafka-eos: {name}: 2 check(s) failed, first: topic {name}.out: sink: missing")

    assert _cli(capsys, "topics", "create", spec, *boot, "--yes")[0] == 0
    code, out, _ = _cli(capsys, "validate", spec, *boot)
    assert code == 0 and "FAIL" not in out and f"ok    checkpoints: group kafka-eos.{name}: 0 of 1" in out

    # Records deleted by retention before the pipeline read them: its checkpoint is behind the log start.
    producer = Producer(kafka_settings.client_config())
    for i in range(4):
        producer.produce(f"{name}.in", value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    kafka_admin.alter_group_offsets(kafka_settings, f"kafka-eos.{name}", {(f"{name}.in", 0): 1})
    admin = kafka_admin.admin_client(kafka_settings)
    admin.delete_records([TopicPartition(f"{name}.in", 0, 3)])[TopicPartition(f"{name}.in", 0, 3)].result(30)
    code, out, _ = _cli(capsys, "validate", spec, *boot)
    assert code == 1 and (f"FAIL  checkpoints: records deleted by retention before they were read "
                          f"(on_data_loss: fail): {name}.in-0: checkpoint 1 < log start 3") in out
