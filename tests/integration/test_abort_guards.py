"""The abort's guards on a real broker: a young transaction is refused unless forced, every
attempt is audited, a transaction behind an older open one is still aborted (and the older one
named), a producer-set timestamp does not age a transaction its coordinator started now, and a
producer no coordinator lists to this client (an id it may not DESCRIBE) is never ended by a
partition marker. The verdicts a healthy broker cannot give are in tests/unit/test_abort_guards.py.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.cli import EXIT_ERROR, main
from kafka_eos.errors import AbortRefused
from kafka_eos.health.abort import attempt_abort
from kafka_eos.health.attribute import admin, open_transactions
from kafka_eos.health.detect import find_stalls
from kafka_eos.readers import read_committed

pytestmark = [pytest.mark.integration, pytest.mark.waits]


def cli(capsys, settings, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--bootstrap", settings.bootstrap_servers])
    out, err = capsys.readouterr()
    return code, out, err


def lsos(settings, topic: str, partitions: int) -> list[tuple[int, int]]:
    offsets = kafka_admin.partition_offsets(settings, [(topic, p) for p in range(partitions)])
    return [(offsets[(topic, p)].lso, offsets[(topic, p)].high_watermark) for p in range(partitions)]


def audit_of(settings, topic: str) -> list[dict]:
    return [r for r in (json.loads(m.value) for m in read_committed(settings, AUDIT_TOPIC)) if r.get("topic") == topic]


def test_a_young_transaction_is_refused_unless_forced_and_every_attempt_is_audited(kafka_settings, killed_transaction,
                                                                                   capsys, unique):
    topic = f"young-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 2})
    txid = f"healthy-looking-{unique}"
    killed_transaction(txid, (topic, 0), (topic, 1))
    abort = ("txn", "abort", "--topic", topic, "--partition", "1", "--start-offset", "0")

    # The dry run says it would be refused; the real one is refused, changes nothing, and is audited.
    code, out, err = cli(capsys, kafka_settings, *abort)
    assert code == EXIT_ERROR and f"transactional.id {txid}" in out
    assert "under the abort threshold of 900s" in err and "by its coordinator's start time" in err
    code, _out, err = cli(capsys, kafka_settings, *abort, "--yes")
    assert code == EXIT_ERROR
    assert err.startswith(f"kafka-eos: {topic}-1: the transaction at offset 0 has been open for only ")
    assert lsos(kafka_settings, topic, 2) == [(0, 1), (0, 1)]
    code, _out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", topic, "--partition", "1",
                          "--start-offset", "5", "--yes")
    assert code == EXIT_ERROR and "no open transaction starts at offset 5" in err
    # A threshold of its own still refuses a transaction younger than it.
    code, _out, err = cli(capsys, kafka_settings, *abort, "--yes", "--older-than", "600")
    assert code == EXIT_ERROR and "under the abort threshold of 600s" in err

    code, out, _err = cli(capsys, kafka_settings, *abort, "--yes", "--force")
    assert code == 0 and f"aborted: fenced transactional.id '{txid}'" in out
    assert lsos(kafka_settings, topic, 2) == [(2, 2), (2, 2)]  # the whole transaction: record + marker each

    records = audit_of(kafka_settings, topic)
    assert [(r["outcome"], r["start_offset"]) for r in records] == [
        ("refused", 0), ("refused", 5), ("refused", 0), ("aborted", 0)]
    refused, missing, _own, done = records
    assert refused["error"].startswith(f"{topic}-1: the transaction at offset 0 has been open for only ")
    assert refused["transaction"]["transactional_id"] == txid and refused["after"] is None
    assert missing["transaction"] is None and "no open transaction starts at offset 5" in missing["error"]
    assert (done["guard"]["method"], done["guard"]["forced"], done["before"], done["after"]["lso"]) == (
        "fence", True, {"lso": 0}, 2)
    assert all(r["via"] == "kafka-eos txn abort" and r["who"] for r in records)


def test_a_transaction_behind_an_older_open_one_is_aborted_and_the_older_one_named(kafka_settings,
                                                                                    killed_transaction, capsys,
                                                                                    unique):
    topic = f"behind-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    killed_transaction(f"older-{unique}", (topic, 0))  # starts at 0
    killed_transaction(f"newer-{unique}", (topic, 0))  # starts at 1, behind it
    code, out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", topic, "--partition", "0",
                         "--start-offset", "1", "--yes", "--force")
    assert (code, err) == (0, "")
    client = admin(kafka_settings)
    try:
        (older,) = open_transactions(client, topic, 0)
    finally:
        client.close()
    assert older["start_offset"] == 0
    assert (f"LSO 0 -> 0 (high watermark 3); the LSO stays at 0: an older open transaction (producer "
            f"{older['producer_id']}, starting at offset 0) still holds the partition") in out
    (record,) = audit_of(kafka_settings, topic)
    assert (record["outcome"], record["held_by_older"]) == (
        "aborted", {"start_offset": 0, "producer_id": older["producer_id"]})

    code, out, _err = cli(capsys, kafka_settings, "txn", "abort", "--topic", topic, "--partition", "0",
                          "--start-offset", "0", "--yes", "--force")
    assert code == 0 and "still holds" not in out
    assert lsos(kafka_settings, topic, 1) == [(4, 4)]


def test_a_producer_set_timestamp_does_not_age_a_transaction_its_coordinator_started_now(kafka_settings, capsys,
                                                                                        unique):
    topic = f"backdated-{unique}"
    kafka_admin.create_topics(kafka_settings, {topic: 1})
    producer = Producer(kafka_settings.client_config(**{"transactional.id": f"backdated-{unique}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    producer.produce(topic, value=b"open", partition=0, timestamp=two_hours_ago)
    producer.flush(30)
    try:
        assert find_stalls(kafka_settings, [(topic, 0)], older_than_s=600) == []
        (stall,) = find_stalls(kafka_settings, [(topic, 0)], older_than_s=0)
        assert stall.age_from == "coordinator" and stall.stuck_s < 60
        assert stall.culprit["transactional_id"] == f"backdated-{unique}"
        code, _out, err = cli(capsys, kafka_settings, "txn", "abort", "--topic", topic, "--partition", "0",
                              "--start-offset", "0", "--yes", "--older-than", "600")
        assert code == EXIT_ERROR and "by its coordinator's start time" in err
        assert lsos(kafka_settings, topic, 1) == [(0, 1)]
    finally:
        producer.abort_transaction(30)


def test_a_producer_no_coordinator_lists_to_this_client_is_never_ended_by_a_marker(secure_broker,
                                                                                    killed_transaction, unique):
    """The operator's principal may do anything but DESCRIBE transactional ids: ListTransactions
    hides the id, so the open transaction (still tracked, on two partitions) is unlisted; a marker
    would end it on one partition and leave the other to commit. Refused, even with force."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)

    plain = secure_broker.admin  # the super user, for set-up and checks
    user, operator, _file = secure_broker.user("operator")
    topic = f"hidden-{unique}"
    kafka_admin.create_topics(plain, {topic: 2})
    acls = [AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, f"User:{user}", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW),
            AclBinding(ResourceType.GROUP, "*", ResourcePatternType.LITERAL, f"User:{user}", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW),
            AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{user}", "*",
                       AclOperation.ALL, AclPermissionType.ALLOW)]
    acl_admin = kafka_admin.admin_client(plain)  # kept alive while its futures are read
    for fut in acl_admin.create_acls(acls).values():
        fut.result(30)
    killed_transaction(f"stranger-{unique}", (topic, 0), (topic, 1), settings=plain)

    with pytest.raises(AbortRefused, match=rf"^{topic}-0: the transaction at offset 0 \(producer \d+\) is listed by "
                                           r"no coordinator, yet open for only \d+s: .* --force does not lift this$"):
        attempt_abort(operator, topic, 0, 0, who="test", via="test", force=True, older_than_s=0)
    assert lsos(plain, topic, 2) == [(0, 1), (0, 1)]  # neither partition touched
    (record,) = audit_of(plain, topic)
    assert (record["outcome"], record["transaction"]["verdict"], record["method"]) == ("refused", "unlisted", None)
