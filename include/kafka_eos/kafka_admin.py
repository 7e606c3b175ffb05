"""Reads of cluster state the planner and the commit protocol need, through confluent-kafka:
partitions of topics, offsets (log start, LSO, high watermark), group offsets, and topic creation.

Isolation is always explicit: librdkafka's ``list_offsets`` defaults to READ_UNCOMMITTED, which is
the high watermark, not the last stable offset (docs/architecture.md, "Offsets").

Every call takes :class:`KafkaSettings` and builds its own short-lived client (but see the token
callbacks' exception below), and every read is retried with a bound while it fails with an error
that clears by itself. A client's metadata cache outlives the facts it caches: after a topic is
deleted and created again, or after a broker restart raised a partition's leader epoch, a
long-lived client sends stale leader epochs and gets ``UNKNOWN_LEADER_EPOCH`` /
``NOT_LEADER_FOR_PARTITION`` until its next metadata refresh, while a fresh client is right at
once. So each retry starts from a fresh client.

One exception: settings with a token callback (OAUTHBEARER through ``oauth_cb``). confluent-kafka
(since 2.13) holds each new client in its constructor until the callback's first token is set, and
it looks once a second: every such client costs a second before its first request, and a run's
planning and checks use a dozen. Inside :func:`shared_admin_clients` (a CLI command, the Spark
task's application, each kafka-eos step of an Airflow task) those settings share one AdminClient
per process, for a minute at most: the first attempt of a read may then go out with metadata up to
a minute old, and a retry after a transient error drops the shared client, so the retry starts
from a fresh one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from kafka_eos.errors import BrokerError, BrokerUnreachable, TopicMissing
from kafka_eos.logs import last_client_error
from kafka_eos.settings import CONNECT_TIMEOUT_ENV, KafkaSettings

#: Bound of one admin call, and of the retries of one read. Calls on a healthy cluster answer
#: in well under a second; 30 s covers a coordinator move or a restarted broker loading its logs.
ADMIN_TIMEOUT_S = 30.0

TP = tuple[str, int]
T = TypeVar("T")

#: Errors that clear by themselves: a coordinator loading or moving, a leader being elected or
#: its epoch moving (broker restart, topic re-created), a partition still loading, a pending
#: transactional offset commit (require_stable), metadata that does not know a new topic yet.
#: librdkafka reports most of them with retriable() False, hence the names.
TRANSIENT_ERRORS = frozenset({
    "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "_WAIT_COORD",
    "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH",
    "OFFSET_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "NOT_CONTROLLER",
    "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "_NOENT",
    "UNSTABLE_OFFSET_COMMIT", "REQUEST_TIMED_OUT", "_TIMED_OUT",
})

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionOffsets:
    """Offsets of one partition, read at one moment."""

    log_start: int
    lso: int  # last stable offset (READ_COMMITTED latest)
    high_watermark: int  # READ_UNCOMMITTED latest


#: How long a shared client is used before the next call builds a fresh one: a run's planning
#: and checks take seconds; a stream's command runs for hours, and a client's metadata outlives
#: the facts it caches.
SHARED_CLIENT_MAX_AGE_S = 60.0
#: The AdminClients shared inside :func:`shared_admin_clients` (settings with a token callback
#: only): settings -> (client, when it was built). None outside a scope.
_shared: dict[tuple, tuple[AdminClient, float]] | None = None
#: The process that opened the scope.
_shared_pid = 0
_shared_lock = threading.Lock()
#: Clients a forked child inherited: kept, never destroyed. librdkafka's threads do not survive a
#: fork, so a child must neither use nor destroy them (rd_kafka_destroy would wait on threads that
#: are not there). The list holds one reference more than anything releases, so not even the
#: interpreter's exit frees it.
_inherited: list = []
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_inherited))


def keep_inherited(clients: object) -> None:
    """In a child made by ``os.fork()``: the parent's librdkafka clients (any container of them)
    kept in :data:`_inherited`, so that the child never destroys them."""
    _inherited.append(clients)


def _after_fork_in_child() -> None:
    """In a child made by ``os.fork()`` (subprocesses exec at once and never come here): no scope,
    the parent's clients parked in :data:`_inherited`, a lock of its own."""
    global _shared, _shared_lock
    if _shared:
        keep_inherited(_shared)
    _shared, _shared_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def shared_admin_clients():
    """Inside: :func:`admin_client` returns one AdminClient per settings that have a token
    callback, built at first use (again once :data:`SHARED_CLIENT_MAX_AGE_S` old, and after a
    transient error) and destroyed at the scope's end; the module's docstring says why. Other
    settings still get a new client per call. A nested scope is the outer one's."""
    global _shared, _shared_pid
    pid = os.getpid()
    with _shared_lock:
        opened = _shared is None or _shared_pid != pid
        if opened:
            _shared, _shared_pid = {}, pid
    try:
        yield
    finally:
        clients = None
        if opened:
            with _shared_lock:
                if _shared_pid == os.getpid():  # a forked child unwinding its parent's scope: not its own
                    clients, _shared = _shared, None
        if clients:
            clients.clear()  # destroyed here, in the process that built them


def _forget_shared_admins() -> None:
    """The next :func:`admin_client` call of each settings builds a fresh client (fresh metadata)."""
    with _shared_lock:
        if _shared is not None and _shared_pid == os.getpid():
            _shared.clear()


def admin_client(settings: KafkaSettings) -> AdminClient:
    """An AdminClient of ``settings``: a new one, except for settings with a token callback inside
    :func:`shared_admin_clients`."""
    if settings.token_callback is None:
        return AdminClient(settings.client_config())
    key = settings.key
    with _shared_lock:
        shared = _shared if _shared is not None and _shared_pid == os.getpid() else None
        if shared is not None and key in shared:
            client, built = shared[key]
            if time.monotonic() - built < SHARED_CLIENT_MAX_AGE_S:
                return client
    client = AdminClient(settings.client_config())  # about a second: not under the lock
    if shared is not None:
        with _shared_lock:
            if _shared is shared:
                shared[key] = (client, time.monotonic())
    return client


def is_transient_error(err: KafkaError) -> bool:
    """True for a Kafka error that clears by itself."""
    return err.retriable() or err.name() in TRANSIENT_ERRORS


def is_transient(exc: BaseException) -> bool:
    """True for a :class:`BrokerError` caused by a Kafka error that clears by itself."""
    cause = exc.__cause__
    return isinstance(cause, KafkaException) and is_transient_error(cause.args[0])


def admin_result(future, what: str, timeout_s: float = ADMIN_TIMEOUT_S):
    """An admin call's result, waited for up to ``timeout_s``.

    :raises BrokerError: the call failed, naming ``what`` and Kafka's error.
    :raises BrokerUnreachable: no answer in time, naming ``what`` and the wait.
    """
    try:
        return future.result(timeout=timeout_s)
    except KafkaException as exc:
        err = exc.args[0]
        raise BrokerError(f"{what}: {err.name()} ({err.str()})") from exc
    except concurrent.futures.TimeoutError:
        raise BrokerUnreachable(f"{what}: no answer within {timeout_s:g} s") from None


def retrying(call: Callable[[], T], timeout_s: float = ADMIN_TIMEOUT_S) -> T:
    """Run ``call`` again while it fails with a transient Kafka error, for up to ``timeout_s``.

    ``call`` should build its client itself, so that each attempt starts with fresh metadata.

    :raises BrokerError: the first error that is not transient, or the last one after the bound.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            return call()
        except BrokerError as exc:
            if not is_transient(exc) or time.monotonic() > deadline:
                raise
            log.info("retrying after a transient error: %s", exc)
            _forget_shared_admins()
            # Leader elections and coordinator loads on a healthy cluster take tens to hundreds
            # of milliseconds; back off to 1 s so a slow restart is not hammered.
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def check_reachable(settings: KafkaSettings) -> None:
    """Fail fast, in one line, when no broker of ``settings`` answers within its connect timeout.

    :raises BrokerUnreachable: naming the bootstrap servers, the wait and the last connection error.
    """
    admin = admin_client(settings)
    with last_client_error() as seen:
        try:
            # DescribeCluster: the brokers, not the metadata of every topic of the cluster.
            brokers = admin.describe_cluster(request_timeout=settings.connect_timeout_s).result(
                timeout=settings.connect_timeout_s + 5).nodes
        except KafkaException as exc:
            err = exc.args[0]
            admin.poll(0)  # librdkafka's queued log lines reach the logger when the client is polled
            # "... failed: Connection refused (after 0ms in state CONNECT)": the cause is enough.
            detail = re.sub(r" \(after \d+ms in state \w+\)$", "", seen.message or err.str())
            raise BrokerUnreachable(
                f"cannot reach Kafka at {settings.bootstrap_servers} within {settings.connect_timeout_s:g}s "
                f"({detail}); check --bootstrap / KAFKA_BOOTSTRAP_SERVERS ({CONNECT_TIMEOUT_ENV} sets the wait)"
            ) from exc
    if not brokers:
        raise BrokerUnreachable(f"Kafka at {settings.bootstrap_servers} answered with no brokers")


@dataclass(frozen=True)
class TopicsMetadata:
    """What the cluster says of some topics (and only of them): how many partitions each of
    those that exist has, and why each of the others could not be described."""

    partitions: dict[str, int]
    #: topic -> the broker's reason (``does not exist``, ``not authorized``…).
    missing: dict[str, str]
    where: str

    def count(self, topic: str, role: str = "topic") -> int:
        """``topic``'s partitions.

        :raises TopicMissing: naming the topic, its role and why it could not be described.
        """
        if topic not in self.partitions:
            raise TopicMissing(f"{role} topic {topic!r} {self.missing.get(topic, 'was not described')} on {self.where}")
        return self.partitions[topic]


#: Describe errors that say a topic is not there (or not there for this principal).
_ABSENT = {"UNKNOWN_TOPIC_OR_PART": "does not exist", "UNKNOWN_TOPIC_ID": "does not exist",
           "TOPIC_AUTHORIZATION_FAILED": "is not authorized to be described"}


def topics_metadata(settings: KafkaSettings, topics: Iterable[str], timeout_s: float = ADMIN_TIMEOUT_S) -> TopicsMetadata:
    """The partition counts of ``topics``: one metadata request naming them, never one for the
    whole cluster's metadata (on a shared cluster of thousands of topics that is megabytes and
    seconds, for each run, sensor poke and page view).

    :param timeout_s: bound of the request, and of its retries after errors that clear by themselves.
    :raises BrokerError: the cluster did not answer (its cause the client's error), or refused for
        another reason than absence.
    """
    from confluent_kafka import TopicCollection

    names = list(dict.fromkeys(topics))

    def once() -> TopicsMetadata:
        found: dict[str, int] = {}
        missing: dict[str, str] = {}
        admin = admin_client(settings)  # kept alive while its futures are read
        futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                found[name] = len(future.result(timeout=timeout_s + 5).partitions)
            except KafkaException as exc:
                err = exc.args[0]
                if err.name() not in _ABSENT:  # a transient one is retried (a coordinator moving...)
                    raise BrokerError(f"describing topic {name!r}: {err.str()}") from exc
                missing[name] = _ABSENT[err.name()]
        return TopicsMetadata(found, missing, settings.bootstrap_servers)

    return retrying(once, timeout_s) if names else TopicsMetadata({}, {}, settings.bootstrap_servers)


def transaction_admin(settings: KafkaSettings):
    """A kafka-python admin client for ``settings`` (close it after use): the admin API of
    transactions (list, describe; abort by the protocol), which confluent-kafka does not have."""
    # kafka-python: only the transaction tools need it; every other client is confluent-kafka's.
    from kafka import KafkaAdminClient

    return KafkaAdminClient(**settings.kafka_python_config(), client_id="kafka-eos-health")


def partitions_of(settings: KafkaSettings, topics: Iterable[str], role: str = "topic",
                  md: TopicsMetadata | None = None) -> dict[str, int]:
    """Number of partitions per topic.

    :param md: :func:`topics_metadata` of these topics already read (else it is read now).
    :raises TopicMissing: naming the first topic that does not exist and its role.
    """
    topics = list(topics)
    md = md or topics_metadata(settings, topics)
    return {topic: md.count(topic, role) for topic in topics}


def broker_count(settings: KafkaSettings) -> int:
    """How many brokers the cluster has (DescribeCluster)."""
    admin = admin_client(settings)
    return len(admin.describe_cluster(request_timeout=ADMIN_TIMEOUT_S).result(timeout=ADMIN_TIMEOUT_S + 5).nodes)


def cluster_metadata(settings: KafkaSettings):
    """The whole cluster's topics and brokers: for the fault harness and the local broker's
    readiness, which look at every partition of a cluster of their own; never on a pipeline's
    path (:func:`topics_metadata`)."""
    return admin_client(settings).list_topics(timeout=ADMIN_TIMEOUT_S)


def all_partitions(settings: KafkaSettings) -> list[TP]:
    """Every partition of every topic, internal ones (``__consumer_offsets``,
    ``__transaction_state``) included."""
    md = admin_client(settings).list_topics(timeout=ADMIN_TIMEOUT_S)
    return sorted((t, p) for t, tmd in md.topics.items() if tmd.error is None for p in tmd.partitions)


def ensure_compacted_topic(settings: KafkaSettings, topic: str, partitions: int = 1,
                           retention_ms: int | None = None, segment_ms: int | None = None) -> None:
    """Create ``topic`` compacted when it is missing (a run manifest), and wait until it can be
    used. With ``retention_ms`` it is ``compact,delete``: records older than that go too. With
    ``segment_ms`` its segments roll at least that often (compaction never touches the active one)."""
    if topic in topics_metadata(settings, [topic]).partitions:
        return
    _create(settings, {topic: partitions}, default_replication(broker_count(settings)),
            compacted_config(retention_ms, segment_ms))


def default_replication(brokers: int) -> int:
    """The replication factor kafka-eos gives a topic it creates: 3, or every broker of a smaller
    cluster (``brokers``: how many it has)."""
    return min(3, brokers) or 1


def compacted_config(retention_ms: int | None = None, segment_ms: int | None = None) -> dict[str, str]:
    """A compacted topic's settings: ``compact``, or ``compact,delete`` with ``retention_ms``; its
    segments rolled at least every ``segment_ms``."""
    config = {"cleanup.policy": "compact"} if retention_ms is None else \
        {"cleanup.policy": "compact,delete", "retention.ms": str(retention_ms)}
    if segment_ms is not None:
        config["segment.ms"] = str(segment_ms)
    return config


def set_topic_config(settings: KafkaSettings, topic: str, config: Mapping[str, str]) -> None:
    """Set some of a topic's settings, leaving the others as they are (incremental alter).

    :raises BrokerError: the cluster refused (an ACL may forbid AlterConfigs).
    """
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()])
    admin = admin_client(settings)
    admin_result(admin.incremental_alter_configs([resource])[resource], f"setting {', '.join(config)} of topic {topic!r}")


def topic_config(settings: KafkaSettings, topics: Iterable[str], name: str) -> dict[str, str]:
    """One setting of each of ``topics`` (one request), where the cluster lets it be read: a
    topic whose setting cannot be read (an ACL may forbid DescribeConfigs) is left out, and logged."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    resources = [ConfigResource(ResourceType.TOPIC, t) for t in dict.fromkeys(topics)]
    if not resources:
        return {}
    admin = admin_client(settings)
    found = {}
    for resource, future in admin.describe_configs(resources, request_timeout=ADMIN_TIMEOUT_S).items():
        try:
            found[resource.name] = future.result(timeout=ADMIN_TIMEOUT_S)[name].value
        except (KafkaException, KeyError) as exc:
            log.warning("cannot read topic %s's %s (%s)", resource.name, name, exc)
    return found


def create_topics(settings: KafkaSettings, topics: Mapping[str, int], config: Mapping[str, str] | None = None) -> None:
    """Create topics (name -> partitions) with the brokers' default replication factor when
    missing; existing ones are kept. Returns once every partition of the new topics has a leader
    that answers ``list_offsets``."""
    # -1: the cluster's default.replication.factor (1 on the local broker, 3 on the local cluster).
    _create(settings, topics, -1, dict(config or {}))


def create_topic(settings: KafkaSettings, topic: str, partitions: int, replication: int,
                 config: Mapping[str, str]) -> None:
    """Create ``topic`` with these settings when missing, and wait until it can be used."""
    _create(settings, {topic: partitions}, replication, dict(config))


def _create(settings: KafkaSettings, topics: Mapping[str, int], replication: int, config: dict) -> None:
    existing = topics_metadata(settings, topics).partitions
    new = [NewTopic(t, n, replication, config=config) for t, n in topics.items() if t not in existing]
    if not new:
        return
    admin = admin_client(settings)
    for topic, fut in admin.create_topics(new).items():
        try:
            fut.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise BrokerError(f"creating topic {topic!r}: {exc.args[0].str()}") from None
    # Created is not usable yet: the leaders are still being elected. Wait with fresh clients
    # (this one may have cached an older incarnation of the same names; a shared one too).
    _forget_shared_admins()
    partition_offsets(settings, [(t.topic, p) for t in new for p in range(t.num_partitions)])


def partition_offsets(settings: KafkaSettings, tps: Iterable[TP],
                      admin: AdminClient | None = None) -> dict[TP, PartitionOffsets]:
    """Log start, LSO and high watermark of each partition (one batched request per kind).

    :param admin: a client to ask first (a long-lived caller's); a retry after a transient error
        starts from a fresh client (see the module's docstring).
    """
    tps = list(tps)
    if not tps:
        return {}
    if admin is None:
        # One client for the three queries, connected first by a metadata request for one of the
        # topics: a new client's first ListOffsets can find no usable broker yet (its bootstrap
        # connection handing over to the broker's own) and wait 1-3 s for librdkafka's next
        # leader query.
        admin = admin_client(settings)
        try:
            admin.list_topics(tps[0][0], timeout=ADMIN_TIMEOUT_S)
        except KafkaException:
            pass  # the queries' own retries handle a cluster that is not there yet

    def query(spec: OffsetSpec, isolation: IsolationLevel) -> dict[TP, int]:
        given = admin

        def once() -> dict[TP, int]:
            nonlocal given
            # The client must outlive its futures: a collected client never completes them.
            client, given = (given if given is not None else admin_client(settings)), None
            futs = client.list_offsets({TopicPartition(t, p): spec for t, p in tps}, isolation_level=isolation,
                                      request_timeout=ADMIN_TIMEOUT_S)
            return {(tp.topic, tp.partition): admin_result(f, f"list_offsets {tp.topic}-{tp.partition}").offset
                    for tp, f in futs.items()}

        return retrying(once)

    start = query(OffsetSpec.earliest(), IsolationLevel.READ_COMMITTED)
    lso = query(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    hw = query(OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    return {tp: PartitionOffsets(start[tp], lso[tp], hw[tp]) for tp in tps}


#: The group ids of kafka-eos's throwaway readers (assign, never subscribe or commit) start with
#: this: librdkafka still looks up their coordinator, which Kafka authorizes as DESCRIBE on the group.
READER_GROUP_PREFIX = "kafka-eos.reader."


def reader_group(kind: str) -> str:
    """A throwaway reader's group id (never joined, never committed to)."""
    return f"{READER_GROUP_PREFIX}{kind}.{uuid.uuid4()}"


def group_client(settings: KafkaSettings, group_id: str) -> Consumer:
    """A consumer of ``group_id`` that never joins it (no subscribe): it only fetches and commits
    offsets. Group offsets go through a consumer rather than the AdminClient: librdkafka 2.16's
    admin OffsetFetch/OffsetCommit path dereferences a missing consumer-group handle on
    coordinator errors (a segfault seen while __consumer_offsets was still loading)."""
    return Consumer(settings.client_config(**{
        "group.id": group_id, "enable.auto.commit": False,
        # read_committed makes librdkafka ask for stable offsets (KIP-447 require_stable):
        # a pending transactional offset commit is waited out, never read half-done.
        "isolation.level": "read_committed",
    }))


#: What kafka-eos stores in each group offset's metadata (Kafka keeps the commit time but the fetch
#: API does not return it): ``kafka-eos committed_at=<epoch ms> planned_at=<epoch ms>``, when the
#: offset was committed and when the run that committed it was planned.
_COMMITTED_AT = re.compile(r"committed_at=(\d+)")
_PLANNED_AT = re.compile(r"planned_at=(\d+)")


@dataclass(frozen=True)
class CommitTimes:
    """When a group offset was committed, and when the run that committed it was planned (epoch
    seconds; None where the metadata does not say: an offset committed by another tool)."""

    committed_at: float | None = None
    planned_at: float | None = None
    #: The group's offsets were pending in an open transaction when read (a look, not a plan for a
    #: run: see :func:`committed_offsets_and_times`' ``settle_s``): this is the offset before it.
    pending: bool = False


def offset_metadata(now_ms: int | None = None, planned_ms: int | None = None) -> str:
    """The metadata kafka-eos commits with every checkpoint: when it was committed, and when the
    run that commits it was planned (the planner's estimate of how far apart runs come)."""
    text = f"kafka-eos committed_at={int(time.time() * 1000) if now_ms is None else now_ms}"
    return text if planned_ms is None else f"{text} planned_at={planned_ms}"


def committed_offsets(settings: KafkaSettings, group_id: str, tps: Iterable[TP],
                      consumer: Consumer | None = None) -> dict[TP, int | None]:
    """The group's committed offsets (stable: pending transactional commits are waited out).

    :param consumer: a :func:`group_client` of ``group_id`` to ask first (a long-lived caller's).
    :returns: tp -> next offset to read, or None where the group has no offset.
    """
    return {tp: offset for tp, (offset, _at)
            in committed_offsets_and_times(settings, group_id, tps, consumer).items()}


def committed_offsets_and_times(settings: KafkaSettings, group_id: str, tps: Iterable[TP],
                                consumer: Consumer | None = None,
                                settle_s: float | None = None) -> dict[TP, tuple[int | None, CommitTimes]]:
    """The group's committed offsets and when kafka-eos committed them (:class:`CommitTimes`;
    empty for no offset, or an offset committed without kafka-eos's metadata).

    :param consumer: a :func:`group_client` of ``group_id`` to ask first; a retry after a transient
        error starts from a fresh client (see the module's docstring).
    :param settle_s: for a look (``checkpoint``, ``plan``, a sensor), not a plan a run takes: how
        long a stable read may wait for offsets pending in an open transaction (an attempt killed
        between sending its offsets and its commit keeps them pending until a run fences it, or its
        transaction times out) before the offsets before that transaction are read instead, marked
        ``pending``. None: wait the full bound, as a run's plan must.
    """
    tps = list(tps)
    if not tps:
        return {}
    given = consumer

    def once(client_of=group_client, timeout_s=ADMIN_TIMEOUT_S):
        nonlocal given
        client, given = (given if given is not None else client_of(settings, group_id)), None
        try:
            res = client.committed([TopicPartition(t, p) for t, p in tps], timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"committed offsets of group {group_id!r}: {exc.args[0].str()}") from exc
        finally:
            if client is not consumer:
                client.close()
        _raise_partition_errors(res, f"committed offset in group {group_id!r}")
        return res

    def settled():
        """A stable read that waits ``settle_s`` for pending offsets; (None, True) when they stay
        pending. Other transient errors (a coordinator loading or moving) are retried for the full
        bound, as ever."""
        try:
            return once(timeout_s=settle_s), False
        except BrokerError as exc:
            cause = exc.__cause__
            if isinstance(cause, KafkaException) and cause.args[0].code() in (
                    KafkaError._TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT):
                return None, True
            raise

    if settle_s is None:
        res, pending = retrying(once), False
    else:
        res, pending = retrying(settled)
        if pending:
            # The coordinator answers a read that does not ask for stable offsets at once: the wait
            # was for offsets pending in an open transaction (not for a coordinator that is away).
            res = retrying(lambda: once(client_of=_unstable_group_client))
            log.info("the offsets of group %s are pending in an open transaction: read as before it", group_id)
    out: dict[TP, tuple[int | None, CommitTimes]] = {}
    for tp in res:
        if tp.offset < 0:
            out[(tp.topic, tp.partition)] = (None, CommitTimes(pending=pending))
            continue
        text = _metadata_text(tp)
        committed, planned = (_COMMITTED_AT.search(text), _PLANNED_AT.search(text))
        out[(tp.topic, tp.partition)] = (tp.offset, CommitTimes(
            int(committed.group(1)) / 1000 if committed else None, int(planned.group(1)) / 1000 if planned else None,
            pending))
    return out


def _metadata_text(tp: TopicPartition) -> str:
    """A committed offset's metadata as text, or "" where it does not read as text. confluent-kafka
    reads the metadata librdkafka fetched as a C string: a metadata a Java client committed (no
    terminating NUL, where librdkafka writes one) reads on into whatever follows it in memory, at
    best as bytes that are not UTF-8 (kafka-eos's JVM writer adds the NUL: this is for another
    client's commit, an operator's tool)."""
    try:
        return tp.metadata or ""
    except UnicodeDecodeError:
        return ""


def _unstable_group_client(settings: KafkaSettings, group_id: str) -> Consumer:
    """:func:`group_client` that does not ask for stable offsets: a pending transactional offset
    commit is not waited for; the offsets before it are read."""
    return Consumer(settings.client_config(**{"group.id": group_id, "enable.auto.commit": False,
                                              "isolation.level": "read_uncommitted"}))


#: Kafka's default offsets.retention.minutes (7 days), used when the broker's config cannot be read.
DEFAULT_OFFSETS_RETENTION_S = 7 * 24 * 3600.0


#: Kafka's default transaction.max.timeout.ms (15 minutes).
DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900_000


def broker_config(settings: KafkaSettings, name: str, default: float) -> float:
    """A numeric setting of one of the cluster's brokers, or ``default`` when it cannot be read
    (an ACL may forbid DescribeConfigs: that is logged, not fatal)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = admin_client(settings)
    try:
        broker = admin.describe_cluster(request_timeout=ADMIN_TIMEOUT_S).result(timeout=ADMIN_TIMEOUT_S + 5).nodes[0].id
        resource = ConfigResource(ResourceType.BROKER, str(broker))
        return float(admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)[name].value)
    except (KafkaException, KeyError, IndexError, ValueError, TypeError) as exc:
        log.warning("cannot read the brokers' %s (%s): assuming %s", name, exc, default)
        return default


def offsets_retention_s(settings: KafkaSettings) -> float:
    """How long the cluster keeps the committed offsets of a group without members after their
    last commit (the brokers' ``offsets.retention.minutes``)."""
    return broker_config(settings, "offsets.retention.minutes", DEFAULT_OFFSETS_RETENTION_S / 60) * 60


def transaction_max_timeout_ms(settings: KafkaSettings) -> float:
    """The longest transaction timeout the brokers accept (``transaction.max.timeout.ms``)."""
    return broker_config(settings, "transaction.max.timeout.ms", DEFAULT_TRANSACTION_MAX_TIMEOUT_MS)


def _raise_partition_errors(tps, what: str) -> None:
    for tp in tps:
        if tp.error is not None:
            raise BrokerError(f"{what}, {tp.topic}-{tp.partition}: {tp.error.name()} ({tp.error.str()})") \
                from KafkaException(tp.error)


def alter_group_offsets(settings: KafkaSettings, group_id: str, offsets: Mapping[TP, int],
                        planned_ms: int | None = None) -> None:
    """Set the group's offsets (the Kafka mirror of a SQL sink's checkpoint; the group has no
    members, so a plain offset commit outside any generation is accepted).

    :param planned_ms: when the run that commits them was planned (see :func:`offset_metadata`)."""
    if not offsets:
        return
    consumer = group_client(settings, group_id)
    try:
        def once():
            try:
                res = consumer.commit(offsets=[TopicPartition(t, p, o, offset_metadata(planned_ms=planned_ms))
                                               for (t, p), o in offsets.items()], asynchronous=False)
            except KafkaException as exc:
                raise BrokerError(f"mirroring checkpoint to group {group_id!r}: {exc.args[0].str()}") from exc
            _raise_partition_errors(res or [], f"mirroring checkpoint to group {group_id!r}")

        retrying(once)
    finally:
        consumer.close()
