"""The verdict of attribution, with Kafka's find-hanging logic, on the coordinator answers that a
healthy test broker cannot be made to give (a transaction the coordinator forgot). The real
broker's answers (long-running, not permitted) are in tests/integration/test_hung_transactions.py."""

from __future__ import annotations

from types import SimpleNamespace

from kafka_eos.health.attribute import HANGING, LONG_RUNNING, UNLISTED, describe, pipeline_of
from kafka_eos.spec import parse_spec

TXN = {"producer_id": 7, "producer_epoch": 0, "coordinator_epoch": 0, "start_offset": 42, "last_write": None}


class Coordinator:
    """The two coordinator calls :func:`describe` makes, answering as a broker would."""

    def __init__(self, listed: list, described: dict) -> None:
        self.listed, self.described = listed, described

    def list_transactions(self, producer_id_filters):
        return {1: [t for t in self.listed if t.producer_id in producer_id_filters]}

    def describe_transactions(self, txids):
        return {t: self.described[t] for t in txids if t in self.described}


def _listing(txid: str, pid: int = 7):
    return SimpleNamespace(transactional_id=txid, producer_id=pid, state="Ongoing")


def _description(state: str, pid: int = 7, partitions=(("t", 0),)):
    return SimpleNamespace(state=SimpleNamespace(value=state), producer_id=pid, producer_epoch=0,
                           transaction_timeout_ms=600_000, transaction_start_time_ms=1_700_000_000_000,
                           topic_partitions=[SimpleNamespace(topic=t, partition=p) for t, p in partitions])


def test_a_transaction_the_coordinator_tracks_on_the_partition_is_long_running():
    out = describe(Coordinator([_listing("x")], {"x": _description("Ongoing")}), "t", 0, TXN, [])
    assert (out["verdict"], out["transactional_id"], out["coordinator_state"], out["transaction_timeout_s"],
            out["transaction_started_ms"]) == (LONG_RUNNING, "x", "Ongoing", 600.0, 1_700_000_000_000)


def test_a_producer_no_coordinator_lists_is_unlisted_not_proven_hanging():
    # The broker lists only the ids the client may DESCRIBE: a healthy transaction can be unlisted.
    out = describe(Coordinator([], {}), "t", 0, TXN, [])
    assert (out["verdict"], out["transactional_id"], out["coordinator_state"]) == (UNLISTED, None, None)
    out = describe(Coordinator([_listing("x")], {}), "t", 0, TXN, [])  # listed, its view unreadable
    assert (out["verdict"], out["transactional_id"]) == (UNLISTED, "x")


def test_a_transaction_the_coordinator_ended_or_moved_on_from_is_hanging():
    # The coordinator completed it (markers lost), tracks other partitions only, or the id has a
    # new producer: nothing will ever end the transaction on this partition but an abort.
    for described in (_description("CompleteAbort"), _description("Ongoing", partitions=[("t", 1)]),
                      _description("Ongoing", pid=8)):
        out = describe(Coordinator([_listing("x")], {"x": described}), "t", 0, TXN, [])
        assert out["verdict"] == HANGING, described


def test_a_pipelines_own_transactional_ids_are_named_as_its_own():
    spec = parse_spec({"name": "p", "source": {"topics": ["t"]}, "sink": {"kind": "kafka", "topic": "o"}})
    assert [pipeline_of(t, [spec]) for t in ("kafka-eos.p", "kafka-eos.p|t|0", "kafka-eos.pq", None)] == [
        "p", "p", None, None]
    out = describe(Coordinator([_listing("kafka-eos.p|t|0")], {"kafka-eos.p|t|0": _description("Ongoing")}),
                   "t", 0, TXN, [spec])
    assert (out["pipeline"], out["verdict"]) == ("p", LONG_RUNNING)
