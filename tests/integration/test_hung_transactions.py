"""Hung transactions on a real broker: a SIGKILLed producer's open transaction is found, named
and aborted; live and healthy partitions raise nothing; a pipeline recognises its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.cli import EXIT_ERROR, EXIT_FOUND, main
from kafka_eos.health.attribute import attribute
from kafka_eos.health.detect import find_stalls
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.readers import read_committed, settle
from kafka_eos.spec import spec_document

pytestmark = pytest.mark.integration


def produce(settings, topic: str, partition: int, n: int, tag: str) -> None:
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    for i in range(n):
        producer.produce(topic, value=f"{tag}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def cli(capsys, settings, *argv: str) -> tuple[int, str, str]:
    """The CLI in-process, the broker given after the subcommand (as users type it too)."""
    code = main([*argv, "--bootstrap", settings.bootstrap_servers])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_killed_producers_transaction_is_found_named_and_aborted(kafka_settings, make_spec, spark,
                                                                  killed_transaction, capsys, unique):
    spec = make_spec(partitions=2)
    source, other = spec.source.topics[0], f"other-{unique}"
    kafka_admin.create_topics(kafka_settings, {other: 1})
    produce(kafka_settings, source, 1, 3, "before")
    txid = f"stranger-{unique}"
    killed_transaction(txid, (source, 1), (other, 0))
    produce(kafka_settings, source, 1, 100, "behind")  # committed, but behind the open transaction
    time.sleep(1.2)

    code, out, _err = cli(capsys, kafka_settings, "txn", "hanging", "--topic", source, "--topic", other, "--older-than", "1",
                          "--json")
    assert code == EXIT_FOUND
    found = {(s["topic"], s["partition"]): s for s in json.loads(out)["stalled"]}
    assert set(found) == {(source, 1), (other, 0)}
    held = found[(source, 1)]
    assert (held["lso"], held["high_watermark"], held["waiting"]) == (3, 104, 101)
    assert held["stuck_s"] >= 1
    culprit = held["culprit"]
    assert (culprit["transactional_id"], culprit["start_offset"], culprit["verdict"]) == (txid, 3, "long-running")
    assert culprit["producer_id"] == found[(other, 0)]["culprit"]["producer_id"] >= 0
    assert culprit["pipeline"] is None and culprit["transaction_timeout_s"] == 600

    # The pipeline reads up to the LSO only: the 100 committed records wait, and it says so.
    plan = prepare_plan(spec, kafka_settings, "blocked")
    assert [(r.partition, r.until) for r in plan.ranges] == [(0, 0), (1, 3)]
    Path(spec.path).write_text(yaml.safe_dump(spec_document(spec)))
    code, out, _err = cli(capsys, kafka_settings, "checkpoint", spec.path, "--json")
    (pinned,) = json.loads(out)["pinned"]
    assert (pinned["partition"], pinned["lso"], pinned["waiting"], pinned["culprit"]["transactional_id"]) == (
        1, 3, 101, txid)
    code, out, _err = cli(capsys, kafka_settings, "checkpoint", spec.path)
    assert f"  PINNED {source}-1: LSO 3 < HW 104 (101 offsets waiting), held for " in out

    # Refused: a wrong start offset, a wrong partition; a dry run changes nothing.
    code, _out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", source, "--partition", "1", "--start-offset", "4")
    assert code == EXIT_ERROR
    assert err.strip() == f"kafka-eos: {source}-1: no open transaction starts at offset 4 (open transactions start at: 3)"
    code, _out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", source, "--partition", "0", "--start-offset", "3")
    assert code == EXIT_ERROR and "no open transaction starts at offset 3 (open transactions start at: none is open)" in err
    # Seconds old, under the threshold (the guards are tests/integration/test_abort_guards.py): forced.
    code, _out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", source, "--partition", "1", "--start-offset", "3")
    assert code == EXIT_ERROR and "under the abort threshold" in err
    code, out, _err = cli(capsys, kafka_settings, "txn", "abort", "--topic", source, "--partition", "1", "--start-offset", "3",
                          "--force")
    assert code == 0 and f"transactional.id {txid}" in out and "dry run: nothing changed" in out
    assert "it would be aborted by fencing its transactional.id" in out
    assert kafka_admin.partition_offsets(kafka_settings, [(source, 1)])[(source, 1)].lso == 3

    code, out, _err = cli(capsys, kafka_settings, "txn", "abort", "--topic", source, "--partition", "1", "--start-offset", "3",
                          "--yes", "--force")
    assert code == 0 and "aborted:" in out
    offsets = kafka_admin.partition_offsets(kafka_settings, [(source, 1), (other, 0)])
    assert all(o.lso == o.high_watermark for o in offsets.values())  # the whole transaction, both topics
    code, out, _err = cli(capsys, kafka_settings, "txn", "hanging", "--topic", source, "--topic", other, "--older-than", "0")
    assert code == 0 and out.startswith("no partition held by an open transaction")

    # The blocked pipeline now takes the records behind it, once.
    for run_id in ("after-abort", "again"):
        plan = prepare_plan(spec, kafka_settings, run_id)
        run_batch(spark, spec, plan, kafka_settings)
        verify(spec, kafka_settings, plan)
    values = sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic))
    assert values == sorted([f"before-{i}".encode() for i in range(3)] + [f"behind-{i}".encode() for i in range(100)])


def test_live_short_and_committed_transactions_are_not_reported(kafka_settings, make_spec, capsys):
    spec = make_spec(partitions=1)
    source = spec.source.topics[0]
    produce(kafka_settings, source, 0, 5, "ok")
    code, out, _err = cli(capsys, kafka_settings, "txn", "hanging", "--topic", source, "--older-than", "0")
    assert code == 0  # healthy

    # A live transaction under the pipeline's own transactional.id, open for a moment.
    live = Producer(kafka_settings.client_config(**{"transactional.id": spec.transactional_id()}))
    live.init_transactions(30)
    live.begin_transaction()
    live.produce(source, value=b"in flight", partition=0)
    live.flush(30)
    tps = [(source, 0)]
    assert find_stalls(kafka_settings, tps, older_than_s=60) == []  # under the threshold
    (stall,) = attribute(kafka_settings, find_stalls(kafka_settings, tps, older_than_s=0), [spec])
    assert (stall.lso, stall.culprit["pipeline"], stall.culprit["transactional_id"]) == (
        5, spec.name, spec.transactional_id())
    live.commit_transaction(30)
    # commit_transaction() returns before the commit's marker is on the partition (its LSO moves
    # then): a look in between finds the partition held, and no open transaction on it.
    settle(kafka_settings, source)
    assert find_stalls(kafka_settings, tps, older_than_s=0) == []  # committed: cleared


def test_without_admin_permission_the_held_partition_is_still_reported(secure_broker, killed_transaction,
                                                                       capsys, monkeypatch, unique):
    """A client allowed only to DESCRIBE the topic (offsets, metadata) sees the held partition;
    the holder cannot be named, and the report says why."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)

    plain = secure_broker.admin  # the super user, for set-up
    user, limited, _file = secure_broker.user("limited")
    topic = f"held-{unique}"
    kafka_admin.create_topics(plain, {topic: 1})
    admin = kafka_admin.admin_client(plain)
    for fut in admin.create_acls([AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}",
                                             "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)]).values():
        fut.result(30)
    produce(plain, topic, 0, 2, "committed")
    killed_transaction(f"stranger-{unique}", (topic, 0), settings=plain)
    produce(plain, topic, 0, 3, "behind")

    (stall,) = attribute(limited, find_stalls(limited, [(topic, 0)], older_than_s=0))
    assert (stall.lso, stall.high_watermark, stall.culprit) == (2, 6, None)
    assert stall.stuck_s is None  # not permitted to read the record at the LSO either
    assert stall.attribution_error.startswith("not permitted")
    # The CLI, through the restricted account, reports it too.
    monkeypatch.setenv("KAFKA_EOS_CLIENT_CONFIG", json.dumps(dict(limited.extra)))
    code, out, _err = cli(capsys, limited, "txn", "hanging", "--topic", topic, "--json")
    assert code == EXIT_FOUND
    (reported,) = json.loads(out)["stalled"]
    assert reported["attribution_error"].startswith("not permitted") and reported["lso"] == 2
