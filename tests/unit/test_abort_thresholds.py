"""The abort's guards (kafka_eos.health.abort.check_abort) on the verdicts and ages a real broker
cannot be made to give on demand (a coordinator that forgot a transaction, a 15-minute-old one),
and the one failure path: fencing that fails never falls back to a partition marker. The guards
on a real broker are in tests/integration/test_abort_guards.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_eos.errors import AbortFailed, AbortRefused
from kafka_eos.health import abort
from kafka_eos.health.attribute import HANGING, LONG_RUNNING, UNLISTED
from kafka_eos.spec import parse_spec

NOW_MS = 1_800_000_000_000
MAX_TIMEOUT_S = 900.0


@pytest.fixture(autouse=True)
def broker_max_timeout(monkeypatch):
    monkeypatch.setattr(abort, "transaction_max_timeout_ms", lambda _settings: MAX_TIMEOUT_S * 1000)


def txn(verdict: str, started_s_ago: float | None = None, last_write_s_ago: float | None = None,
        pipeline: str | None = None) -> dict:
    return {"producer_id": 7, "producer_epoch": 1, "coordinator_epoch": 0, "start_offset": 42,
            "transactional_id": None if verdict == UNLISTED else "x", "pipeline": pipeline, "verdict": verdict,
            "transaction_started_ms": None if started_s_ago is None else NOW_MS - int(started_s_ago * 1000),
            "last_write_ms": None if last_write_s_ago is None else NOW_MS - int(last_write_s_ago * 1000)}


def check(t: dict, **kwargs) -> dict:
    return abort.check_abort(None, "t", 0, t, now_ms=NOW_MS, **kwargs)


def test_a_tracked_transaction_is_aged_by_its_coordinator_and_fenced_once_past_the_threshold():
    # The producer's last write says an hour; the coordinator says 100 s: the coordinator counts.
    young = txn(LONG_RUNNING, started_s_ago=100, last_write_s_ago=3600)
    with pytest.raises(AbortRefused, match=r"^t-0: the transaction at offset 42 has been open for only 100s "
                                           r"\(by its coordinator's start time\), under the abort threshold of 900s"):
        check(young)
    assert check(young, force=True) == {"method": "fence", "age_s": 100.0, "age_from": "its coordinator's start time",
                                        "threshold_s": MAX_TIMEOUT_S, "forced": True}
    assert check(young, older_than_s=60)["forced"] is False
    assert check(txn(LONG_RUNNING, started_s_ago=901))["method"] == "fence"


def test_the_default_threshold_is_the_larger_of_the_brokers_max_and_the_pipelines_timeout():
    spec = parse_spec({"name": "p", "source": {"topics": ["t"]},
                       "sink": {"kind": "kafka", "topic": "o", "transaction_timeout_s": 1200}})
    with pytest.raises(AbortRefused, match="under the abort threshold of 1200s"):
        check(txn(LONG_RUNNING, started_s_ago=1000, pipeline="p"), specs=[spec])
    assert check(txn(LONG_RUNNING, started_s_ago=1000, pipeline="other"), specs=[spec])["threshold_s"] == 900


def test_a_hanging_transaction_gets_a_marker_past_the_threshold():
    assert check(txn(HANGING, last_write_s_ago=1000))["method"] == "marker"
    with pytest.raises(AbortRefused, match="open for only 10s"):
        check(txn(HANGING, last_write_s_ago=10))


def test_an_unlisted_producer_gets_a_marker_only_when_no_coordinator_could_still_track_it():
    for forced in (False, True):
        with pytest.raises(AbortRefused, match=r"listed by no coordinator, yet open for only 950s: .* DESCRIBE"):
            check(txn(UNLISTED, last_write_s_ago=950), force=forced, older_than_s=1)
    assert check(txn(UNLISTED, last_write_s_ago=MAX_TIMEOUT_S + abort.UNLISTED_MARGIN_S + 1))["method"] == "marker"
    with pytest.raises(AbortRefused, match="open for only an unknown time"):
        check(txn(UNLISTED), force=True)


def test_fencing_that_fails_fails_the_abort_and_writes_no_marker(monkeypatch):
    markers = []

    class FailingProducer:
        def __init__(self, _config):
            pass

        def init_transactions(self, _timeout):
            raise KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                            "Transactional Id authorization failed"))

    class Settings:
        def client_config(self, **extra):
            return extra

    monkeypatch.setattr(abort, "Producer", FailingProducer)
    monkeypatch.setattr(abort, "partition_offsets", lambda _s, tps: {tp: type("O", (), {"lso": 42}) for tp in tps})
    monkeypatch.setattr(abort, "admin", lambda _s: markers.append("admin client opened") or None)
    with pytest.raises(AbortFailed, match=r"^t-0: fencing transactional.id 'x' failed \(Transactional Id "
                                          r"authorization failed\); no abort marker was written"):
        abort.abort_transaction(Settings(), "t", 0, txn(LONG_RUNNING, started_s_ago=1000))
    assert markers == []


def test_the_watchdog_threshold_follows_the_longest_transaction_timeout():
    from kafka_eos.health import DEFAULT_OLDER_THAN_S, watch_threshold_s

    assert watch_threshold_s([]) == DEFAULT_OLDER_THAN_S == 360
    assert watch_threshold_s([300, 60]) == 360
    assert watch_threshold_s([300, 900]) == 960
