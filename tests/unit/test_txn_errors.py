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


class Coordinator:
    """A transactional.id's epoch, as the coordinator hands it out: every init takes the next one.
    The first producer's init hangs until ``answer`` is set (a coordinator gone away), then
    still takes its epoch, as librdkafka's handle, still alive, eventually does."""

    def __init__(self):
        import threading

        self.epoch = 0
        self.answer = threading.Event()
        self.producers = []
        coordinator = self

        class Producer:
            def __init__(self, _config):
                self.first = not coordinator.producers
                self.epoch = None
                coordinator.producers.append(self)

            def list_topics(self, topic=None, timeout=None):  # metadata, before the init
                return None

            def init_transactions(self, _timeout):
                if self.first:
                    coordinator.answer.wait(30)
                coordinator.epoch += 1
                self.epoch = coordinator.epoch

        self.Producer = Producer


def test_a_retry_waits_for_an_abandoned_init_so_it_cannot_be_fenced_by_it(monkeypatch):
    """An init_transactions() abandoned as hung still reaches the coordinator later. Answered after
    the retry's init, it took the newer epoch and fenced the retry mid-transaction; the retry now
    waits for it (and is not started while it still hangs)."""
    import threading
    import time

    from kafka_eos import txn

    coordinator = Coordinator()
    monkeypatch.setattr(txn, "Producer", coordinator.Producer)
    monkeypatch.setattr(txn, "CALL_TIMEOUT_S", 0.1)
    monkeypatch.setattr(txn, "HUNG_CALL_GRACE_S", 0.4)

    def attempt() -> TransactionalCommit:
        return TransactionalCommit(KafkaSettings("127.0.0.1:1"), "kafka-eos.p", "kafka-eos.p",
                                   [PartitionRange("orders", 2, 10, 20, 10)])

    with pytest.raises(TransactionFailed, match=r"^init_transactions \(kafka-eos.p, .*no answer within 0.5s"):
        attempt().open()
    # The coordinator answers the abandoned init while the retry starts.
    threading.Timer(0.2, coordinator.answer.set).start()
    retry = attempt()
    retry.open()
    coordinator.answer.wait(5)
    abandoned = coordinator.producers[0]
    for _ in range(50):  # its init ends just after the answer
        if abandoned.epoch is not None:
            break
        time.sleep(0.05)
    assert abandoned.epoch == 1
    assert retry._producer.epoch == coordinator.epoch == 2  # the newest epoch is the retry's: not fenced

    # Still hanging past the wait: the retry is not started (retriable), and waits again next time.
    coordinator2 = Coordinator()
    monkeypatch.setattr(txn, "Producer", coordinator2.Producer)
    with pytest.raises(TransactionFailed):
        attempt().open()
    with pytest.raises(TransactionFailed, match="an earlier init_transactions.* still hangs"):
        attempt().open()
    assert len(coordinator2.producers) == 1  # no second producer was built
    coordinator2.answer.set()
    again = attempt()
    again.open()
    assert again._producer.epoch == coordinator2.epoch == 2


def test_a_new_transactional_producer_asks_for_a_topics_metadata_twice_before_its_init(monkeypatch):
    """librdkafka does not look for the coordinator again for 500 ms when no broker connection is up
    at init_transactions(): the commit's producer and the fencer of the other scope's id each
    connect first (the run's source topic's metadata, twice: the second answer comes from a broker
    the first named), then init. Never the whole cluster's metadata (megabytes on a big cluster)."""
    from kafka_eos import txn

    calls = []

    class Producer:
        def __init__(self, config):
            self.id = config["transactional.id"]

        def list_topics(self, topic=None, timeout=None):
            assert topic == "orders", "a topic's metadata, not the whole cluster's"
            calls.append(("metadata", self.id))

        def init_transactions(self, _timeout):
            calls.append(("init", self.id))

    monkeypatch.setattr(txn, "Producer", Producer)
    TransactionalCommit(KafkaSettings("127.0.0.1:1"), "kafka-eos.p|orders|2", "kafka-eos.p",
                        [PartitionRange("orders", 2, 10, 20, 10)], fences=["kafka-eos.p"]).open()
    assert calls == [("metadata", "kafka-eos.p|orders|2"), ("metadata", "kafka-eos.p|orders|2"),
                     ("init", "kafka-eos.p|orders|2"), ("metadata", "kafka-eos.p"), ("metadata", "kafka-eos.p"),
                     ("init", "kafka-eos.p")]
