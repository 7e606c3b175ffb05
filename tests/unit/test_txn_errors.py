"""The commit protocol's one retry routine, on a faked producer (failure paths only; the
protocol itself is proved against a real broker in tests/integration)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_eos.errors import ProducerFenced, TransactionFailed
from kafka_eos.plan import PartitionRange
from kafka_eos.settings import KafkaSettings
from kafka_eos.txn import TransactionalCommit


class FakeProducer:
    def __init__(self, abort_error: KafkaError | None = None):
        self.aborts = 0
        self.abort_error = abort_error

    def abort_transaction(self, _timeout):
        self.aborts += 1
        if self.abort_error is not None:
            raise KafkaException(self.abort_error)


def commit_with(producer: FakeProducer) -> TransactionalCommit:
    c = TransactionalCommit(KafkaSettings("127.0.0.1:1"), "kafka-eos.p", "kafka-eos.p",
                            [PartitionRange("orders", 2, 10, 20, 10)])
    c._producer = producer
    return c


def raising(*errors):
    calls = iter(errors)

    def fn():
        err = next(calls)
        if err is None:
            return "ok"
        if isinstance(err, BaseException):
            raise err
        raise KafkaException(err)

    return fn


def test_retriable_errors_are_retried_then_succeed(monkeypatch):
    monkeypatch.setattr("kafka_eos.txn.time.sleep", lambda _s: None)
    c = commit_with(FakeProducer())
    timed_out = KafkaError(KafkaError._TIMED_OUT, "slow", retriable=True)
    assert c._call("flush", raising(timed_out, timed_out, None)) == "ok"
    assert c._producer.aborts == 0


def test_abortable_error_aborts_and_names_the_ranges():
    c = commit_with(FakeProducer())
    err = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "timed out", txn_requires_abort=True)
    with pytest.raises(TransactionFailed, match=r"orders-2 \[10, 20\)\): aborted after INVALID_PRODUCER_EPOCH"):
        c._call("send_offsets_to_transaction", raising(err))
    assert c._producer.aborts == 1


def test_fencing_is_fatal_and_never_aborted_or_retried():
    c = commit_with(FakeProducer())
    with pytest.raises(ProducerFenced, match=r"fenced by a newer attempt"):
        c._call("commit_transaction", raising(KafkaError(KafkaError._FENCED, "newer epoch", fatal=True)))
    assert c._producer.aborts == 0


def test_unknown_commit_outcome_is_not_aborted(monkeypatch):
    monkeypatch.setattr("kafka_eos.txn.time.sleep", lambda _s: None)
    c = commit_with(FakeProducer())
    err = KafkaError(KafkaError.REQUEST_TIMED_OUT, "no answer", retriable=True)
    with pytest.raises(TransactionFailed, match=r"outcome unknown .* a retry of the same plan settles it"):
        c._call("commit_transaction", raising(*[err] * 10))
    assert c._producer.aborts == 0


def test_bare_system_error_is_explained_by_the_producer_state():
    # confluent-kafka 2.16's flush() can return NULL without an exception when fencing lands
    # during delivery callbacks; the producer's fatal state says what happened.
    c = commit_with(FakeProducer(abort_error=KafkaError(KafkaError._FENCED, "newer epoch", fatal=True)))
    with pytest.raises(ProducerFenced):
        c._call("flush", raising(SystemError("returned NULL without setting an exception")))
    c = commit_with(FakeProducer())
    with pytest.raises(TransactionFailed, match=r"flush .*: aborted after returned NULL"):
        c._call("flush", raising(SystemError("returned NULL without setting an exception")))
    assert c._producer.aborts == 1


def test_a_coordinator_call_that_ignores_its_timeout_fails_the_transaction_and_abandons_the_producer(monkeypatch):
    """librdkafka's send_offsets_to_transaction() can block for good while the group's coordinator
    is away (librdkafka#5456; a soak's stream hung so after a broker kill): past its bound the
    call fails the transaction, and the stuck producer is never called again (no abort on it: that
    would hang too); the next attempt's new producer fences it. Calls that return are unchanged."""
    import threading

    from kafka_eos import txn

    monkeypatch.setattr(txn, "CALL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(txn, "HUNG_CALL_GRACE_S", 0.3)
    stuck = threading.Event()
    c = commit_with(FakeProducer())
    producer = c._producer
    with pytest.raises(TransactionFailed, match=r"send_offsets_to_transaction \(kafka-eos.p, orders-2 \[10, 20\)\): "
                                                r"no answer within 0.5s .*left open until the next attempt"):
        c._call("send_offsets_to_transaction", lambda: stuck.wait(30))
    assert c._producer is None and producer.aborts == 0
    with pytest.raises(TransactionFailed, match=r"commit_transaction .*outcome unknown"):
        commit_with(FakeProducer())._call("commit_transaction", lambda: stuck.wait(30))
    stuck.set()
    # A call that answers in time returns its value (errors still take the retry routine).
    assert commit_with(FakeProducer())._call("init_transactions", lambda: "ok") == "ok"
    err = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "timed out", txn_requires_abort=True)
    c = commit_with(FakeProducer())
    with pytest.raises(TransactionFailed, match=r"aborted after INVALID_PRODUCER_EPOCH"):
        c._call("send_offsets_to_transaction", raising(err))
    assert c._producer.aborts == 1
