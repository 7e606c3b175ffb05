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
