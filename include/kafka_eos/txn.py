"""The commit protocol (docs/architecture.md, "Commit protocol"), in one place for every Kafka sink and scope.

One :class:`TransactionalCommit` is one transaction of one unit of work: the whole plan
(``atomic``) or one source partition (``per_partition``). The sequence, step by step:

1. ``init_transactions()`` under a transactional.id derived from the work: fences every older
   attempt of the same work and aborts its open transaction. Then, with throwaway producers,
   ``init_transactions()`` under the ids the *other* commit scope uses for the same partitions
   (``fences``): a zombie of an attempt in the other scope is fenced too.
2. Read the group's committed offsets (require_stable): equal to the plan's expected checkpoint
   -> go on; equal to ``until`` -> an earlier attempt committed -> no-op; else -> conflict.
3. Produce results and dead letters, flush, ``send_offsets_to_transaction({tp: until})``,
   produce the manifest record, ``commit_transaction()``.

A stream (``keep_open=True``) runs many transactions through one commit: steps 1 and 1b once, at
its first, then 2 and 3 per transaction (:meth:`TransactionalCommit.use` sets the next ranges).
A kept commit that other processes may fence between its transactions (``recheck_epoch=True``: a
stream's per_partition producers, kept in Spark's Python workers) first sends its offsets right
after ``begin_transaction()``, before any record is read: a producer fenced meanwhile learns it
there, is built again (steps 1, 1b and 2 again: its init fences the other holder back), and the
rows are produced by the new one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kafka_eos.errors import CheckpointConflict, CheckpointLost, ProducerFenced, TransactionFailed, TransactionTimedOut
from kafka_eos.probes import armed, point
from kafka_eos.kafka_admin import committed_offsets, group_client, keep_inherited, offset_metadata
from kafka_eos.plan import PartitionRange
from kafka_eos.settings import KafkaSettings
from kafka_eos.wire import OutRecord, is_dead_letter

log = logging.getLogger(__name__)

#: Default upper bound of one transaction (a spec's sink.transaction_timeout_s sets it). A killed
#: attempt's transaction is aborted by the next init_transactions() at once; this only matters
#: when nobody retries. Must stay at or below the broker's transaction.max.timeout.ms (15 min by
#: default), which run_batch checks before Spark starts.
TRANSACTION_TIMEOUT_MS = 300_000
#: Timeout of one blocking transactional call (init, offsets, commit, abort).
CALL_TIMEOUT_S = 60.0
#: How often a retriable error of one call is retried before the attempt fails.
MAX_CALL_RETRIES = 5
#: A coordinator call that has not returned this long after its own timeout is hung: librdkafka
#: does not honour send_offsets_to_transaction()'s timeout while the group's coordinator is away
#: (confluentinc/librdkafka#5456, #5511; met in the soak: a stream blocked for good after its
#: group's coordinator was killed, holding its lease, so no restart could take over).
HUNG_CALL_GRACE_S = 30.0
#: The calls that wait on a coordinator, and so may hang.
COORDINATOR_CALLS = ("init_transactions", "send_offsets_to_transaction", "commit_transaction")

@dataclass(frozen=True)
class CommitResult:
    """What one transaction did. ``status`` is ``committed`` or ``noop`` (already committed)."""

    status: str
    records_out: int = 0
    dead_letters: int = 0
    #: Where its producer came from (:attr:`TransactionalCommit.producer_was`).
    producer: str = ""


def _bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    return str(value).encode()


class TransactionalCommit:
    """One transaction of one unit of work; lazy (no network until :meth:`run`)."""

    def __init__(self, settings: KafkaSettings, transactional_id: str, group_id: str,
                 ranges: Sequence[PartitionRange], dlq_topic: str | None = None,
                 fences: Sequence[str] = (), timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                 keep_open: bool = False, planned_ms: int | None = None, recheck_epoch: bool = False,
                 batch_bytes: int | None = None, shared_reader: bool = False) -> None:
        self.settings = settings
        #: Read the group's offsets through this process's one reader of the group
        #: (:func:`_shared_reader`), not one of its own: a process that keeps a commit per
        #: partition (a stream's) keeps one reader, not hundreds.
        self.shared_reader = shared_reader
        #: The producer's batch.size (None: librdkafka's): below the written topics' max.message.bytes
        #: (:func:`kafka_eos.sinks.limits.producer_batch_bytes`); read when the producer is built.
        self.batch_bytes = batch_bytes
        #: When the plan of the ranges was made: stored beside the checkpoint (see
        #: :func:`kafka_eos.plan.stale_checkpoints`).
        self.planned_ms = planned_ms
        #: False: one transaction, its clients closed after it. True: many (stream mode), one
        #: producer and epoch for all of them, until :meth:`close`.
        self.keep_open = keep_open
        #: A long-lived commit another process may fence between transactions: each transaction
        #: of a producer built earlier checks its epoch before rows are read (module docstring).
        self.recheck_epoch = recheck_epoch
        #: How this commit's last transaction got its producer: ``built`` (a new producer, fenced
        #: older attempts), ``kept`` (the one of an earlier transaction), ``rebuilt`` (the kept one
        #: had been fenced: a new one fenced back).
        self.producer_was = ""
        self.timeout_ms = timeout_ms
        self._begun: float | None = None
        self.transactional_id = transactional_id
        self.fences = tuple(fences)
        self.group_id = group_id
        self.ranges = tuple(ranges)
        self.dlq_topic = dlq_topic
        self._producer: Producer | None = None
        self._delivery_error: tuple[KafkaError, str] | None = None
        #: Kept between :meth:`run` calls of a long-lived commit (stream mode): the group's
        #: metadata and a consumer that reads its committed offsets.
        self._group_md = None
        self._reader: Consumer | None = None

    # -- the one retry routine ------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], object]) -> object:
        """Run one transactional call: retry retriable errors, abort on txn_requires_abort,
        stop on fencing and fatal errors (never rebuild a fenced producer)."""
        for attempt in range(MAX_CALL_RETRIES + 1):
            try:
                if what in COORDINATOR_CALLS:
                    return _bounded(what, fn, CALL_TIMEOUT_S + HUNG_CALL_GRACE_S)
                return fn()
            except CallHung as hung:
                # The handle is stuck inside librdkafka: abandoned, never called again (an abort would
                # hang too). The next attempt's init_transactions() under this transactional.id fences
                # it and aborts its open transaction; a commit's outcome is settled the same way.
                self._producer, self._group_md = None, None
                if what == "init_transactions":
                    # Its request may still reach the coordinator, and take a newer epoch than the
                    # next attempt's: that attempt waits for it first (see _wait_for_hung_init).
                    _hung_inits[self.transactional_id] = hung.worker
                outcome = "outcome unknown" if what == "commit_transaction" else "left open"
                raise TransactionFailed(f"{what} ({self.transactional_id}, {self._ranges_text()}): {hung}; the "
                                        f"transaction is {outcome} until the next attempt's init_transactions() "
                                        "settles it") from None
            except (KafkaException, SystemError) as exc:
                kafka_exc = self._explain(exc)
                if kafka_exc is None:
                    raise TransactionFailed(f"{what} ({self.transactional_id}, {self._ranges_text()}): "
                                            f"aborted after {exc}") from None
                err: KafkaError = kafka_exc.args[0]
                if err.retriable() and not err.fatal() and not err.txn_requires_abort() \
                        and attempt < MAX_CALL_RETRIES:
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    continue
                raise self._failure(what, err) from None
        raise AssertionError("unreachable")

    def _failure(self, what: str, err: KafkaError) -> TransactionFailed:
        """The error to raise for ``err``, after aborting where that is the right move."""
        where = f"{what} ({self.transactional_id}, {self._ranges_text()})"
        if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
            # The coordinator aborts a transaction open longer than its timeout and bumps the
            # producer's epoch: librdkafka then reports "fenced by newer producer instance" too.
            # The coordinator's clock starts after ours (at the first record), so a transaction
            # it timed out has been open here at least as long as the timeout.
            open_s = time.monotonic() - self._begun if self._begun is not None else 0.0
            if open_s * 1000 >= self.timeout_ms:
                return TransactionTimedOut(
                    f"{where}: aborted by the transaction coordinator after the transaction timeout of "
                    f"{self.timeout_ms / 1000:g}s (open {open_s:.0f}s here); librdkafka reports it as "
                    f"{err.name()}. Nothing of it is visible; raise sink.transaction_timeout_s (up to the "
                    "brokers' transaction.max.timeout.ms) or lower source.max_records_per_run")
            return ProducerFenced(f"{where}: fenced by a newer attempt of the same work: {err.str()}")
        if err.fatal():
            return TransactionFailed(f"{where}: fatal {err.name()}: {err.str()}")
        if err.txn_requires_abort():
            self._abort()
            return TransactionFailed(f"{where}: aborted after {err.name()}: {err.str()}")
        if what == "commit_transaction":
            # The commit may have reached the coordinator: do not abort. The next attempt's
            # init_transactions() settles it, and its checkpoint check sees which way it went.
            return TransactionFailed(f"{where}: outcome unknown after {err.name()}: {err.str()}; "
                                     "a retry of the same plan settles it")
        self._abort()
        return TransactionFailed(f"{where}: aborted after {err.name()}: {err.str()}")

    def _explain(self, exc: BaseException) -> KafkaException | None:
        """The KafkaException behind ``exc``; for a bare SystemError from confluent-kafka (seen
        from flush() when fencing lands mid-callback) or a bare _FATAL (produce() in a fatal state),
        ask the producer: in a fatal state abort_transaction() raises the fatal error itself.
        None: there was none, and it did abort."""
        kafka_exc = _kafka_exception(exc)
        if self._producer is None or (kafka_exc is not None and kafka_exc.args[0].code() != KafkaError._FATAL):
            return kafka_exc
        try:
            self._producer.abort_transaction(CALL_TIMEOUT_S)
        except (KafkaException, SystemError) as probe:
            return _kafka_exception(probe) or kafka_exc
        return kafka_exc

    def _ranges_text(self) -> str:
        return ", ".join(f"{r.topic}-{r.partition} [{r.from_offset}, {r.until})" for r in self.ranges)

    def _abort(self) -> None:
        try:
            if self._producer is not None:
                self._producer.abort_transaction(CALL_TIMEOUT_S)
        except KafkaException:
            pass  # the next init_transactions() of this transactional.id aborts it anyway

    def _on_delivery(self, err: KafkaError | None, msg) -> None:
        if err is not None and self._delivery_error is None:
            self._delivery_error = (err, f"{msg.topic()}-{msg.partition()}")

    def _produce(self, topic: str, key, value, headers) -> None:
        while True:
            try:
                self._producer.produce(topic, key=_bytes(key), value=_bytes(value), headers=headers or None)
                return
            except BufferError:
                # Local queue full: let deliveries drain. Briefly: with reports for failures
                # only, poll() returns at its timeout, not at the first delivery.
                self._producer.poll(0.005)

    # -- the protocol ---------------------------------------------------------------------
    def run(self, records: Iterable[OutRecord],
            manifest: Callable[[int, int], Iterable[tuple[str, str, dict]]] = lambda n, d: ()) -> CommitResult:
        """Commit ``records`` with the ranges' offsets in one transaction.

        :param records: output records; those to the DLQ topic are counted as dead letters.
        :param manifest: called with (records out, dead letters) once all are produced; returns
            (topic, key, record) manifest entries to write inside the transaction.
        :raises CheckpointConflict: the committed offsets are neither expected nor the end.
        :raises ProducerFenced: a newer attempt took over.
        :raises TransactionFailed: the transaction was aborted; nothing of it is visible.
        """
        try:
            return self._run(records, manifest)
        finally:
            if not self.keep_open:
                self.close()

    def _run(self, records, manifest) -> CommitResult:
        """The commit protocol's steps (docs/architecture.md, "Commit protocol")."""
        self.producer_was = "built" if self._producer is None else "kept"
        while True:
            kept = self._producer is not None
            self.open()  # 1. fence older attempts (once per producer: a long-lived commit keeps its epoch)
            self._delivery_error, self._begun = None, None
            if self._already_committed():  # 2. check the checkpoint, now that no older attempt can commit
                return CommitResult("noop", producer=self.producer_was)
            self._call("begin_transaction", self._producer.begin_transaction)
            self._begun = time.monotonic()
            if not (kept and self.recheck_epoch):
                offsets_sent = False
                break
            if self._epoch_holds():  # 3b first: the offsets, before any record is read
                offsets_sent = True
                break
            # Fenced since its last transaction (the same id's producer in another Spark worker):
            # built again, and its init fences that one back. Nothing was read or written yet.
            self._producer, self.producer_was = None, "rebuilt"
        out, dead = self._produce_records(records)  # 3. produce, every record acknowledged
        point("before_offsets")
        if not offsets_sent:
            self._send_offsets()  # 3b. the consumed offsets, into the same transaction
        for topic, key, record in manifest(out, dead):  # 3c. the manifest record(s), inside it too
            self._produce(topic, key, json.dumps(record, sort_keys=True), None)
        # 3d. Commit. A retriable failure here is retried by _call; commit is idempotent.
        point("before_commit")
        self._call("commit_transaction", lambda: self._producer.commit_transaction(CALL_TIMEOUT_S))
        point("after_commit")
        return CommitResult("committed", out, dead, self.producer_was)

    def _already_committed(self) -> bool:
        """Step 2: True when this commit's ranges are already committed (a retry after a landed
        commit: a no-op).

        :raises CheckpointLost: a checkpoint the plan expected is gone.
        :raises CheckpointConflict: a checkpoint is neither the plan's expected one nor its end.
        """
        committed = self._committed([r.tp for r in self.ranges])
        # Refresh ranges (idle partitions, checkpoint committed again unchanged) cannot tell a
        # landed commit from a pending one; the ranges that move decide, when there are any.
        deciding = [r for r in self.ranges if r.expected != r.until]
        if deciding and all(committed[r.tp] == r.until for r in deciding):
            return True
        for r in self.ranges:
            if committed[r.tp] is None and r.expected is not None:
                raise CheckpointLost(
                    f"{r.topic}-{r.partition}: group {self.group_id!r} has no committed offset any more, the plan "
                    f"expected {r.expected}: the broker expired it (offsets.retention.minutes) or the group was "
                    "deleted after the plan was made; nothing was written")
            if committed[r.tp] != r.expected:
                raise CheckpointConflict(
                    f"{r.topic}-{r.partition}: group {self.group_id!r} is at {committed[r.tp]}, the plan "
                    f"expected {r.expected} (ends at {r.until}): a concurrent or stale plan")
        return False

    def _produce_records(self, records) -> tuple[int, int]:
        """Step 3: produce ``records`` into the open transaction and wait until every one is
        acknowledged (or the first delivery error), before any offset goes in.

        :returns: (records out, dead letters).
        :raises TransactionFailed: a record could not be produced or delivered (aborted).
        """
        out = dead = 0
        try:
            for topic, key, value, headers in records:
                self._produce(topic, key, value, headers)
                if topic == self.dlq_topic and is_dead_letter(headers):
                    dead += 1
                else:
                    out += 1
                if out + dead == 100 and armed("after_produce"):
                    self._producer.flush(CALL_TIMEOUT_S)  # part of the output is on the broker
                    point("after_produce")
        except (KafkaException, SystemError) as exc:
            # Only the error is kept, never an exception: a traceback kept in this frame would
            # keep ``records`` (and a one-pass Spark job behind it) alive until a cyclic collection.
            err = _error_of(self._explain(exc))
            if err is None:
                raise TransactionFailed(f"produce ({self.transactional_id}, {self._ranges_text()}): "
                                        f"aborted after {exc}") from None
            raise self._failure("produce", err) from None
        except Exception:
            self._abort()
            raise
        self._call("flush", lambda: self._flush())
        if self._delivery_error is not None:
            err, where = self._delivery_error
            raise self._failure(f"delivery to {where}", err)
        return out, dead

    def _epoch_holds(self) -> bool:
        """Step 3b at the start of a kept producer's transaction: False when the producer was
        fenced since its last transaction (it is then let go: fatal in librdkafka)."""
        try:
            self._send_offsets()
        except ProducerFenced:
            return False
        return True

    def _send_offsets(self) -> None:
        """Step 3b: the consumed offsets (the next offset to read is each range's end), with the
        commit time in their metadata (the planner refreshes idle checkpoints by it)."""
        metadata = offset_metadata(planned_ms=self.planned_ms)
        offsets = [TopicPartition(r.topic, r.partition, r.until, metadata) for r in self.ranges]
        if self._group_md is None:
            self._group_md = _group_metadata(self.settings, self.group_id)
        group_md = self._group_md
        self._call("send_offsets_to_transaction",
                   lambda: self._producer.send_offsets_to_transaction(offsets, group_md, CALL_TIMEOUT_S))

    def open(self) -> None:
        """Steps 1 and 1b, when this commit has no producer yet: a commit used for many
        transactions (:meth:`use` between them) fences once, at its first."""
        if self._producer is not None:
            return
        _wait_for_hung_init(self.transactional_id)
        self._producer = Producer(self.settings.client_config(**{
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "transaction.timeout.ms": self.timeout_ms,
            # Keys land where Java producers put them.
            "partitioner": "murmur2_random",
            # Batch for throughput; a transaction flushes before it commits anyway.
            "linger.ms": 20,
            "compression.type": "lz4",
            # A delivery report per failed record only: no Python call per record that landed.
            "on_delivery": self._on_delivery,
            "delivery.report.only.error": True,
            **({"batch.size": self.batch_bytes} if self.batch_bytes else {}),
        }))
        try:
            # 1. Fence older attempts of the same work; their open transaction is aborted.
            _connect(self._producer, self._topic)
            self._call("init_transactions", lambda: self._producer.init_transactions(CALL_TIMEOUT_S))
            # 1b. Fence attempts of the same partitions in the other commit scope. Own id first, then
            # the others: of two attempts that overlap, whichever inits last fences the other's
            # producer, so at most one of them can commit (docs/architecture.md, "Fencing across scopes").
            for fence_id in self.fences:
                self._fence(fence_id)
        except BaseException:
            self._producer = None  # not open: the next run() starts again from step 1
            raise

    def use(self, ranges: Sequence[PartitionRange], planned_ms: int | None = None) -> "TransactionalCommit":
        """The next transaction of a long-lived commit covers ``ranges`` (same transactional.id)."""
        self.ranges, self.planned_ms = tuple(ranges), planned_ms
        return self

    def close(self) -> None:
        """Let go of the producer and reader. After a failure whose outcome is unknown the next
        :meth:`run` builds a new producer: its init_transactions() settles the old transaction."""
        self._producer, self._group_md = None, None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _committed(self, tps: list) -> dict:
        if self.shared_reader:
            reader, lock = _shared_reader(self.settings, self.group_id)
            with lock:
                return committed_offsets(self.settings, self.group_id, tps, consumer=reader)
        if self._reader is None:
            self._reader = group_client(self.settings, self.group_id)
        return committed_offsets(self.settings, self.group_id, tps, consumer=self._reader)

    @property
    def _topic(self) -> str | None:
        """A topic this commit's principal may describe: its first range's source (read), else its
        dead letters' (written)."""
        return self.ranges[0].topic if self.ranges else self.dlq_topic

    def _fence(self, transactional_id: str) -> None:
        try:
            fence(self.settings, transactional_id, self.timeout_ms, self._topic)
        except KafkaException as exc:
            err = exc.args[0]
            raise TransactionFailed(f"fencing {transactional_id} before committing {self._ranges_text()}: "
                                    f"{err.name()}: {err.str()}") from None

    def _flush(self) -> None:
        remaining = self._producer.flush(CALL_TIMEOUT_S)
        if remaining:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} records not delivered"))


#: This process's shared readers of group offsets (:func:`_shared_reader`): key -> (consumer, lock).
_readers: dict[tuple, tuple[Consumer, threading.Lock]] = {}
_readers_lock = threading.Lock()


def _shared_reader(settings: KafkaSettings, group_id: str) -> tuple[Consumer, threading.Lock]:
    """This process's one reader of ``group_id``'s offsets (a consumer that never joins it), with
    the lock its users take: a librdkafka client costs some 8 file descriptors and 4 threads, and a
    stream's driver kept two per source partition (200 partitions: 3,200 descriptors, 1,600 threads)."""
    key = (settings.key, group_id)
    with _readers_lock:
        if key not in _readers:
            _readers[key] = (group_client(settings, group_id), threading.Lock())
        return _readers[key]


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()``: readers of its own when it reads group offsets; the
    parent's, whose librdkafka threads did not survive the fork, kept and never used or
    destroyed (``kafka_admin.keep_inherited``)."""
    global _readers, _readers_lock
    if _readers:
        keep_inherited(_readers)
    _readers, _readers_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class CallHung(Exception):
    """A blocking client call did not return within its bound (see :data:`HUNG_CALL_GRACE_S`);
    ``worker`` is the thread still inside it."""

    def __init__(self, message: str, worker: threading.Thread | None = None) -> None:
        super().__init__(message)
        self.worker = worker


#: The threads of this process still inside an abandoned init_transactions(), by transactional.id.
_hung_inits: dict[str, threading.Thread] = {}


def _wait_for_hung_init(transactional_id: str) -> None:
    """Before a new producer of ``transactional_id`` inits: an earlier init_transactions() of this
    process under the same id that was abandoned while it hung must have ended. Its handle still
    asks the coordinator for the id's epoch; answered after the new producer's init, it would
    take a newer epoch and fence the new producer mid-transaction.

    :raises TransactionFailed: it has not ended within :data:`HUNG_CALL_GRACE_S` (retriable: a
        later attempt waits again).
    """
    worker = _hung_inits.get(transactional_id)
    if worker is None:
        return
    worker.join(HUNG_CALL_GRACE_S)
    if worker.is_alive():
        raise TransactionFailed(f"init_transactions ({transactional_id}): an earlier init_transactions() of this "
                                "process under the same id still hangs; a new producer could be fenced when it "
                                "returns: not started (a retry waits for it again)")
    _hung_inits.pop(transactional_id, None)


def _bounded(what: str, fn: Callable[[], object], limit_s: float) -> object:
    """``fn()``, in a thread of its own so that the caller stops waiting after ``limit_s``.

    :raises CallHung: ``fn`` had not returned by then (it goes on in its daemon thread; its client
        must not be used again).
    """
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=call, name=f"kafka-eos {what}", daemon=True)
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        raise CallHung(f"no answer within {limit_s:g}s (the client ignored its own timeout of "
                       f"{CALL_TIMEOUT_S:g}s: librdkafka#5456, a coordinator gone away)", worker)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


#: How long :func:`_connect` waits for the cluster's metadata (an unreachable cluster is then
#: init_transactions()' to report, under its own bound).
CONNECT_WAIT_S = 5.0


def _connect(producer: Producer, topic: str | None = None) -> None:
    """Connect a new transactional producer to the cluster before its init_transactions().

    librdkafka looks for the transaction coordinator as soon as init is called; when no broker
    connection is up at that moment (the bootstrap connection just handed over to the brokers
    the metadata named) it does not ask again until its coordinator timer fires, 500 ms later.
    Spark tasks' new producers met it in 8 of 18 tasks (0.5 s of a 50,000-record task). ``topic``'s
    metadata twice (the second request goes to a broker the first one named, so one is up when
    it returns): none of 40 inits waited, against 6 of 40 after one request and 4 of 40 with none;
    the whole cluster's metadata did as well but costs more the bigger the cluster (0.044 s beside
    12,000 partitions): only without a topic to ask about.

    :param topic: a topic the producer's principal may describe (the run's source or sink)."""
    try:
        for _ in range(2 if topic else 1):
            producer.list_topics(topic, timeout=CONNECT_WAIT_S)
    except KafkaException as exc:
        log.debug("metadata before init_transactions: %s", exc)


def fence(settings: KafkaSettings, transactional_id: str, timeout_ms: int, topic: str | None = None) -> None:
    """Bump the epoch of ``transactional_id`` (aborting its open transaction) and let go.

    :param topic: a topic of the work fenced, to connect by (:func:`_connect`).

    :raises KafkaException: the coordinator refused or did not answer (a call that hung past its
        bound is abandoned, as :meth:`TransactionalCommit._call` does).
    :raises TransactionFailed: an earlier init of the same id still hangs (:func:`_wait_for_hung_init`).
    """
    _wait_for_hung_init(transactional_id)
    fencer = Producer(settings.client_config(**{
        "transactional.id": transactional_id, "transaction.timeout.ms": timeout_ms}))
    try:
        _connect(fencer, topic)
        _bounded("init_transactions", lambda: fencer.init_transactions(CALL_TIMEOUT_S),
                 CALL_TIMEOUT_S + HUNG_CALL_GRACE_S)
    except CallHung as hung:
        _hung_inits[transactional_id] = hung.worker
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"init_transactions ({transactional_id}): {hung}")) \
            from None


def _error_of(exc: KafkaException | None) -> KafkaError | None:
    return exc.args[0] if exc is not None else None


def _kafka_exception(exc: BaseException) -> KafkaException | None:
    """The KafkaException behind ``exc``. confluent-kafka 2.16 raises a SystemError from flush()
    when a fatal error (e.g. fencing) arrives while delivery callbacks run; the KafkaException
    is its cause."""
    while exc is not None and not isinstance(exc, KafkaException):
        exc = exc.__cause__ or exc.__context__
    return exc


def _group_metadata(settings: KafkaSettings, group_id: str):
    """Group metadata for send_offsets_to_transaction, from a consumer that never joins the group
    (generation -1): the pipeline's group is reserved for kafka-eos and has no members."""
    consumer = Consumer(settings.client_config(**{"group.id": group_id, "enable.auto.commit": False}))
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()
