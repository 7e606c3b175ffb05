"""The soak's load: orders committed (and some aborted) on the source topic at a steady rate for
the whole soak, with poison records among them, through brokers that die and come back.

What was committed is not taken from this producer's word: the audit reads the source back with a
read_committed consumer (a commit whose answer was lost may still have committed). This thread
logs what it attempted (every order id, per transaction) so the audit can tell an aborted id from
one never produced.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from kafka_eos.sample_data import order_record
from kafka_eos.settings import KafkaSettings

log = logging.getLogger(__name__)

#: The producer's own bound on one transaction: a commit stuck behind a dead broker is retried
#: within it (Kafka's default is 60 s; its coordinator aborts what outlives it).
TRANSACTION_TIMEOUT_MS = 60_000
#: How long one commit or abort call may wait for the coordinator before it is retried.
CALL_TIMEOUT_S = 30.0
#: New partitions of the source (a fault adds them) are seen within this many milliseconds.
METADATA_REFRESH_MS = 10_000
#: The event time of the orders: the soak's own start, so side runs by time find them.
TRANSACTIONAL_ID = "kafka-eos.soak.load"


class Load(threading.Thread):
    """Transactions of ``per_transaction`` orders, ``per_second`` orders a second; every
    ``abort_every``-th transaction aborted, every ``malformed_every``-th order poison.

    :param log_path: JSON lines, one per transaction: ``{"ids": [...], "poison": [...], "intent":
        "commit"|"abort", "outcome": "committed"|"aborted"|"unknown"}`` (``ids``: the valid orders;
        ``poison``: the ids the poison records were made from, where they have one).
    """

    def __init__(self, settings: KafkaSettings, topic: str, log_path: Path, *, seed: int,
                 per_second: float = 20.0, per_transaction: int = 10, abort_every: int = 4,
                 malformed_every: int = 17) -> None:
        super().__init__(name="soak load", daemon=True)
        self.settings, self.topic, self.log_path = settings, topic, log_path
        self.rng = random.Random(seed)
        self.per_second, self.per_transaction = per_second, per_transaction
        self.abort_every, self.malformed_every = abort_every, malformed_every
        self.stats = {"committed": 0, "aborted": 0, "unknown": 0, "errors": 0}
        self._halt = threading.Event()
        self._start = datetime.now(timezone.utc).replace(second=0, microsecond=0)

    def stop(self, timeout_s: float = 120.0) -> None:
        self._halt.set()
        self.join(timeout_s)

    def _producer(self) -> Producer:
        producer = Producer(self.settings.client_config(**{
            "transactional.id": TRANSACTIONAL_ID, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS, "partitioner": "murmur2_random",
            "linger.ms": 5}))
        self._call(producer.init_transactions)
        return producer

    def _call(self, call) -> None:
        """One transactional call, retried while the error says a retry may succeed (a broker
        away, a coordinator moving); other errors are raised."""
        deadline = time.monotonic() + TRANSACTION_TIMEOUT_MS / 1000
        while True:
            try:
                call(CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline or self._halt.is_set():
                    raise
                time.sleep(1)

    def run(self) -> None:
        producer, seq, txn = None, 0, 0
        with self.log_path.open("a") as out:
            while not self._halt.is_set():
                began = time.monotonic()
                txn += 1
                intent = "abort" if self.abort_every and txn % self.abort_every == 0 else "commit"
                ids, poison = [], []
                try:
                    producer = producer or self._producer()
                    producer.begin_transaction()
                    for _ in range(self.per_transaction):
                        order, value, is_poison = order_record(seq, self.rng, self._start, self.malformed_every)
                        producer.produce(self.topic, key=order["customer_id"].encode(), value=value)
                        (poison if is_poison else ids).append(order["order_id"])
                        seq += 1
                    if intent == "abort":
                        producer.flush(CALL_TIMEOUT_S)
                        self._call(producer.abort_transaction)
                        outcome = "aborted"
                    else:
                        self._call(producer.commit_transaction)
                        outcome = "committed"
                except KafkaException as exc:
                    self.stats["errors"] += 1
                    log.warning("soak load: transaction %d: %s", txn, exc)
                    outcome = self._recover(producer, exc)
                    if outcome == "unknown":
                        producer = None  # a fatal error: a new producer (its init fences this one)
                self.stats[outcome] += 1
                out.write(json.dumps({"txn": txn, "ids": ids, "poison": poison, "intent": intent,
                                      "outcome": outcome}) + "\n")
                out.flush()
                self._halt.wait(max(0.0, self.per_transaction / self.per_second - (time.monotonic() - began)))
        if producer is not None:
            producer.flush(CALL_TIMEOUT_S)

    def _recover(self, producer: Producer | None, exc: KafkaException) -> str:
        """After a failed call: abort when Kafka says the transaction can be aborted; else its fate
        is unknown to this thread (the audit reads what the broker kept)."""
        error = exc.args[0]
        if producer is not None and error.txn_requires_abort():
            try:
                self._call(producer.abort_transaction)
                return "aborted"
            except KafkaException as again:
                log.warning("soak load: abort after %s: %s", error, again)
        return "unknown"
