"""The operator's overview against a real broker: the same numbers as ``kafka-eos checkpoint
--json`` for a pipeline with lag and for one whose source an open transaction pins, the holder of
that transaction, the last runs from the manifest; and the cache."""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos.cli import main
from kafka_eos.overview.snapshot import CachedOverview, snapshot
from kafka_eos.spec import parse_spec

pytestmark = pytest.mark.integration


def _checkpoint_json(settings, path, capsys) -> dict:
    assert main(["--bootstrap", settings.bootstrap_servers, "checkpoint", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_overview_shows_what_checkpoint_json_shows(spark, kafka_settings, killed_transaction, make_spec,
                                                       unique, tmp_path, capsys, timeless):
    lagging = make_spec(partitions=2)
    producer = Producer(kafka_settings.client_config())
    src = lagging.source.topics[0]
    for i in range(5):
        producer.produce(src, value=f"first {i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    lagging_path = tmp_path / "lagging.yaml"
    lagging_path.write_text(yaml.safe_dump({"name": lagging.name, "source": {"topics": [src]}, "transform": "identity",
                                            "sink": {"kind": "kafka", "topic": lagging.sink.topic,
                                                     "dlq_topic": lagging.sink.dlq_topic}}))
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "run", str(lagging_path)]) == 0
    capsys.readouterr()
    for i in range(3):
        producer.produce(src, value=f"waiting {i}".encode(), partition=1)
    assert producer.flush(30) == 0

    # A second pipeline whose source partition a killed producer's transaction pins.
    held_topic = f"held-{unique}"
    from kafka_eos import kafka_admin

    kafka_admin.create_topics(kafka_settings, {held_topic: 1})
    producer.produce(held_topic, value=b"committed")
    assert producer.flush(30) == 0
    txid = f"stranger-{unique}"
    killed_transaction(txid, (held_topic, 0))
    producer.produce(held_topic, value=b"behind the open transaction")
    assert producer.flush(30) == 0
    held_path = tmp_path / "held.yaml"
    held_path.write_text(yaml.safe_dump({"name": f"held-{unique}", "source": {"topics": [held_topic]},
                                         "transform": "identity",
                                         "sink": {"kind": "kafka", "topic": lagging.sink.topic}}))
    specs = [parse_spec(yaml.safe_load(p.read_text()), str(p)) for p in (lagging_path, held_path)]

    got = {e["pipeline"]: e for e in snapshot(kafka_settings, specs)}

    for path, spec in zip((lagging_path, held_path), specs):
        expected = _checkpoint_json(kafka_settings, path, capsys)
        entry = got[spec.name]
        assert entry["error"] is None
        assert timeless(entry["partitions"]) == timeless(expected["partitions"])
        assert entry["drift"] == expected["drift"]
        assert timeless(entry["pinned"]) == timeless(expected["pinned"])
        assert entry["lag"] == sum(r["lag"] for r in expected["partitions"])
    lag = got[lagging.name]
    assert [(r["partition"], r["checkpoint"], r["lso"], r["lag"]) for r in lag["partitions"]] == [(0, 3, 3, 0),
                                                                                                  (1, 2, 5, 3)]
    assert lag["partitions"][1]["oldest_unprocessed"]["offset"] == 2 and lag["pinned"] == []
    ((run),) = lag["runs"]
    assert (run["status"], run["records_in"], run["records_out"]) == ("committed", 5, 5)
    assert run["ranges"] == [{"topic": src, "partition": 0, "from": 0, "until": 3},
                             {"topic": src, "partition": 1, "from": 0, "until": 2}]
    assert lag["sink"] == {"kind": "kafka", "commit": "atomic", "target": lagging.sink.topic,
                           "dead_letters": lagging.sink.dlq_topic}

    held = got[f"held-{unique}"]
    ((stall),) = held["pinned"]
    assert (stall["topic"], stall["partition"], stall["lso"], stall["high_watermark"]) == (held_topic, 0, 1, 3)
    culprit = stall["culprit"]
    assert culprit["transactional_id"] == txid and culprit["start_offset"] == 1 and culprit["producer_id"] >= 0
    assert held["runs"] == []


def test_the_cache_asks_the_cluster_once_per_ttl(kafka_settings, make_spec):
    spec = make_spec(partitions=1)
    loads = []

    def load():
        loads.append(1)
        return kafka_settings, [spec], []

    cache = CachedOverview(load, ttl_s=60)
    first = cache.get()
    assert cache.get() is first and len(loads) == 1
    assert [e["pipeline"] for e in first["pipelines"]] == [spec.name] and first["seconds"] > 0
    expired = CachedOverview(load, ttl_s=0)
    assert expired.get() is not expired.get() and len(loads) == 3


def test_a_snapshot_is_as_old_as_its_first_read(kafka_settings, make_spec):
    # A refresh of the operator page's snapshot reads the specs, then the cluster for a while;
    # a spec written meanwhile must be in the next request's answer, not behind the slow refresh.
    spec = make_spec(partitions=1)
    loads = []

    def load():
        loads.append(1)
        time.sleep(1.0)  # the reads of a busy cluster, longer than the TTL
        return kafka_settings, [spec], []

    cache = CachedOverview(load, ttl_s=0.5)
    first = cache.get()
    assert cache.get() is not first and len(loads) == 2
    # Requests that come while a refresh runs wait for it and get it: one read of the cluster.
    cache = CachedOverview(load, ttl_s=0.5)
    got: list[dict] = []
    waiters = [threading.Thread(target=lambda: got.append(cache.get())) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
        time.sleep(0.1)
    for waiter in waiters:
        waiter.join(30)
    assert len(got) == 3 and got[0] is got[1] is got[2] and len(loads) == 3

