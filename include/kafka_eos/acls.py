"""The Kafka ACLs a pipeline needs, computed from its spec (``kafka-eos acls PIPELINE``), and the
check a run makes of them before it writes anything.

Roles (docs/security.md):

- ``pipeline``: what its runs do — plan, read, write, commit, dead letters, side runs (replays and
  backfills: their own groups and transactional ids under ``<group>.``), a stream's lease, the
  audited checkpoint reset;
- ``watchdog``: read-only — the watchdog's and the operator page's reads (LSO, checkpoints, who
  holds a partition, the transactions of the pipeline, its last run);
- ``abort``: the runbook's abort of a hung transaction on the pipeline's partitions.

Each set is minimal: Kafka's implied operations are used (READ and WRITE imply DESCRIBE;
DESCRIBE_CONFIGS is its own), so taking any one ACL away takes away something a run does, and
:func:`check` names it before the run writes anything.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass

from kafka_eos.audit import AUDIT_TOPIC
from kafka_eos.errors import BrokerError, KafkaEosError
from kafka_eos.kafka_admin import READER_GROUP_PREFIX, transaction_admin
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

log = logging.getLogger(__name__)

ROLES = ("pipeline", "watchdog", "abort")
#: The cluster resource's name in Kafka's ACLs.
CLUSTER = "kafka-cluster"
#: The name a prefixed grant is checked with (Kafka answers for names, not for prefixes).
_PROBE = "kafka-eos-acl-check"


class PermissionMissing(KafkaEosError):
    """The principal a run uses lacks an ACL the run needs (names it and the command that grants it)."""


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: ``operation`` on the resource ``resource_type``/``name`` (``pattern``:
    LITERAL, or PREFIXED for every name starting with ``name``); ``why`` says what needs it."""

    resource_type: str  # TOPIC | GROUP | TRANSACTIONAL_ID | CLUSTER
    name: str
    pattern: str  # LITERAL | PREFIXED
    operation: str  # READ | WRITE | DESCRIBE | DESCRIBE_CONFIGS
    why: str

    def describe(self) -> str:
        what = f"{self.resource_type} {'prefix ' if self.pattern == 'PREFIXED' else ''}{self.name!r}"
        return f"{self.operation} on {what}"


#: kafka-eos's own readers (assign only: they never join or commit) have throwaway group ids under
#: one prefix; librdkafka still looks up their coordinator, which Kafka authorizes as DESCRIBE.
_READERS = ("GROUP", READER_GROUP_PREFIX, "DESCRIBE",
            "kafka-eos's readers of the manifest and of first records (never join, never commit)", "PREFIXED")


def required_acls(spec: PipelineSpec, role: str = "pipeline") -> list[Acl]:
    """The minimal ACLs of ``role`` for ``spec``."""
    if role not in ROLES:
        raise KafkaEosError(f"acls: role {role!r} is not one of {', '.join(ROLES)}")
    sink, group = spec.sink, spec.source.group_id
    kafka = sink.about.transactional  # its commits are Kafka transactions, its output Kafka topics
    acls: list[Acl] = []

    def add(resource_type: str, name: str, operation: str, why: str, pattern: str = "LITERAL") -> None:
        acl = Acl(resource_type, name, pattern, operation, why)
        if not any((a.resource_type, a.name, a.pattern, a.operation) == (acl.resource_type, acl.name, acl.pattern,
                                                                           acl.operation) for a in acls):
            acls.append(acl)

    if role == "pipeline":
        for topic in spec.source.topics:
            add("TOPIC", topic, "READ", "source: read committed records, their offsets and open transactions")
        add("TOPIC", spec.manifest_topic, "READ",
            "run manifest: plans and checkpoints of earlier runs; a stream's lease")
        add("TOPIC", spec.manifest_topic, "WRITE", "run manifest: each run's plan and result")
        places = [(sink.topic, "sink: results"), (sink.dlq_topic, "dead letters"),
                  (sink.backfill_topic, "replays and backfills: results"),
                  (sink.backfill_dlq_topic, "replays and backfills: dead letters")] if kafka else \
            [(sink.dlq_topic, "dead letters")]
        for topic, why in places:
            if topic:
                add("TOPIC", topic, "WRITE", why)
        add("TOPIC", AUDIT_TOPIC, "WRITE", "audit log: checkpoint resets")
        add("GROUP", group, "READ", "checkpoints: the group's offsets, committed with each transaction")
        add("GROUP", f"{group}.", "READ", "side runs' checkpoints and a stream's lease (groups under the prefix)",
            "PREFIXED")
        add(*_READERS)
        if kafka:
            add("TRANSACTIONAL_ID", group, "WRITE", "atomic commits, and fencing of earlier attempts")
            add("TRANSACTIONAL_ID", f"{group}|", "WRITE", "per-partition commits (one id per source partition)",
                "PREFIXED")
            add("TRANSACTIONAL_ID", f"{group}.", "WRITE", "side runs' commits", "PREFIXED")
        add("CLUSTER", CLUSTER, "DESCRIBE_CONFIGS", "the brokers' transaction.max.timeout.ms and offsets retention")
    elif role == "watchdog":
        for topic in spec.source.topics:
            # Kafka authorizes DescribeProducers (who holds a partition's LSO) as READ on the topic.
            add("TOPIC", topic, "READ", "LSO, lag, and the producer that holds a partition (DescribeProducers)")
        add("TOPIC", spec.manifest_topic, "READ", "the last run, plan times, the stream's owner")
        for topic in ((sink.topic, sink.dlq_topic) if kafka else (sink.dlq_topic,)):
            if topic:
                add("TOPIC", topic, "DESCRIBE", "the pipeline's outputs exist")
        add("GROUP", group, "DESCRIBE", "checkpoints")
        add("GROUP", f"{group}.", "DESCRIBE", "side runs' checkpoints and the stream's lease", "PREFIXED")
        add(*_READERS)
        if kafka:
            for name, pattern in ((group, "LITERAL"), (f"{group}|", "PREFIXED"), (f"{group}.", "PREFIXED")):
                add("TRANSACTIONAL_ID", name, "DESCRIBE",
                    "the pipeline's transactions (ListTransactions shows only the ids a principal may describe)",
                    pattern)
        add("CLUSTER", CLUSTER, "DESCRIBE_CONFIGS", "the brokers' transaction.max.timeout.ms and offsets retention")
    else:  # abort
        for topic in spec.source.topics:
            add("TOPIC", topic, "READ", "the producer that holds the partition (DescribeProducers)")
        add("TOPIC", AUDIT_TOPIC, "WRITE", "audit log: every abort attempt")
        add(*_READERS)
        if kafka:
            for name, pattern in ((group, "LITERAL"), (f"{group}|", "PREFIXED"), (f"{group}.", "PREFIXED")):
                add("TRANSACTIONAL_ID", name, "WRITE", "ending a hung transaction by fencing its id", pattern)
        add("CLUSTER", CLUSTER, "DESCRIBE_CONFIGS", "the brokers' transaction.max.timeout.ms (the abort threshold)")
    return acls


def principal_of(settings: KafkaSettings) -> str | None:
    """The principal a SASL user name makes (``User:<name>``); None without one."""
    user = settings.extra.get("sasl.username")
    return f"User:{user}" if user else None


def acls_command(spec_ref: str, principal: str | None, role: str = "pipeline") -> str:
    who = f" --principal {principal}" if principal else ""
    return f"kafka-eos acls {spec_ref}{who}{'' if role == 'pipeline' else f' --role {role}'} --apply"


def apply(settings: KafkaSettings, acls: list[Acl], principal: str, host: str = "*") -> None:
    """Create ``acls`` for ``principal`` (the settings' principal must be allowed to: a super user
    or ALTER on the cluster). Creating an ACL that exists is a no-op."""
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)
    from confluent_kafka import KafkaException

    from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, admin_client

    # confluent-kafka calls the cluster resource BROKER.
    bindings = [AclBinding(ResourceType["BROKER" if a.resource_type == "CLUSTER" else a.resource_type], a.name,
                           ResourcePatternType[a.pattern], principal, host, AclOperation[a.operation],
                           AclPermissionType.ALLOW) for a in acls]
    admin = admin_client(settings)  # kept alive until every answer is in
    for binding, future in admin.create_acls(bindings).items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(f"creating the ACL {binding}: {exc.args[0].str()}") from exc


def check(spec: PipelineSpec, settings: KafkaSettings, role: str = "pipeline", spec_ref: str | None = None) -> None:
    """Check that the principal of ``settings`` holds every ACL of ``role`` for ``spec``, asking
    Kafka what it may do (authorized operations of topics, groups and the cluster; a describe of
    the transactional ids, which only a principal allowed to use them passes).

    :raises PermissionMissing: naming the first missing permission and the command that grants it.
    """
    acls = required_acls(spec, role)
    missing = _missing(settings, acls)
    if missing:
        acl = missing[0]
        principal = principal_of(settings)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PermissionMissing(
            f"{principal or 'this principal'} lacks {acl.describe()}{more}, needed for {acl.why}: nothing was "
            f"written; grant the pipeline's ACLs with `{acls_command(spec_ref or spec.name, principal, role)}`")


def _missing(settings: KafkaSettings, acls: list[Acl]) -> list[Acl]:
    from confluent_kafka import KafkaException, TopicCollection

    from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, admin_client, retrying

    admin = admin_client(settings)
    allowed: dict[tuple[str, str], set[str] | None] = {}

    def name_of(acl: Acl) -> str:
        return acl.name + _PROBE if acl.pattern == "PREFIXED" else acl.name

    topics = sorted({a.name for a in acls if a.resource_type == "TOPIC"})
    if topics:
        for topic, future in zip(topics, admin.describe_topics(
                TopicCollection(topics), include_authorized_operations=True).values()):
            try:
                allowed[("TOPIC", topic)] = _names(future.result(timeout=ADMIN_TIMEOUT_S).authorized_operations)
            except KafkaException as exc:
                if exc.args[0].code() not in _authorization_errors() and exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART":
                    raise BrokerError(f"describing topic {topic!r}: {exc.args[0].str()}") from exc
                # Not allowed to DESCRIBE it (Kafka does not tell a principal that may not see a
                # topic whether it exists); a topic that does not exist is the run's own error.
                allowed[("TOPIC", topic)] = set() if exc.args[0].code() in _authorization_errors() else None
    for group in sorted({name_of(a) for a in acls if a.resource_type == "GROUP"}):
        # A group coordinator still loading (a new cluster's first groups) answers with a
        # transient error: asked again.
        allowed[("GROUP", group)] = retrying(lambda g=group: _group_operations(admin, g))
    if any(a.resource_type == "CLUSTER" for a in acls):
        allowed[("CLUSTER", CLUSTER)] = _cluster_operations(admin)
    txids = sorted({name_of(a) for a in acls if a.resource_type == "TRANSACTIONAL_ID"})
    if txids:
        # Kafka reports no authorized operations for transactional ids: describing one passes only
        # with DESCRIBE (which WRITE implies); the pipeline's set grants WRITE alone.
        described = _describable_txids(settings, txids)
        for txid in txids:
            allowed[("TRANSACTIONAL_ID", txid)] = {"WRITE", "DESCRIBE"} if txid in described else set()

    missing = []
    for acl in acls:
        ops = allowed.get((acl.resource_type, name_of(acl)))
        if ops is not None and acl.operation not in ops:
            missing.append(acl)
    return missing


def _names(operations) -> set[str] | None:
    """AclOperation values as names; READ/WRITE (and the rest) imply DESCRIBE, as Kafka's
    authorizer has it, so the set is what the principal may do. None: the cluster did not say
    (then the run finds out itself)."""
    if operations is None:
        return None
    names = {op.name for op in operations}
    if names & {"READ", "WRITE", "DELETE", "ALTER"}:
        names.add("DESCRIBE")
    if "ALTER_CONFIGS" in names:
        names.add("DESCRIBE_CONFIGS")
    if "ALL" in names:
        names |= {"READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER", "ALTER_CONFIGS", "CREATE", "DELETE"}
    return names


def _group_operations(admin, group: str) -> set[str] | None:
    from confluent_kafka import KafkaException

    from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S

    future = admin.describe_consumer_groups([group], include_authorized_operations=True)[group]
    try:
        return _names(future.result(timeout=ADMIN_TIMEOUT_S).authorized_operations)
    except KafkaException as exc:
        if exc.args[0].code() in _authorization_errors():
            return set()
        raise BrokerError(f"describing group {group!r}: {exc.args[0].name()} ({exc.args[0].str()})") from exc


def _cluster_operations(admin) -> set[str]:
    """What the principal may do on the cluster. DescribeCluster reports it only to a principal
    allowed to DESCRIBE the cluster: otherwise DescribeConfigs of a broker is tried directly."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S

    nodes = admin.describe_cluster(request_timeout=ADMIN_TIMEOUT_S).result(timeout=ADMIN_TIMEOUT_S + 5).nodes
    if not nodes:
        return set()
    broker = nodes[0].id
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    try:
        admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() in _authorization_errors():
            return set()
        raise BrokerError(f"describing broker {broker}'s settings: {exc.args[0].str()}") from exc
    return {"DESCRIBE_CONFIGS"}


def _describable_txids(settings: KafkaSettings, txids: list[str]) -> set[str]:
    """Those of ``txids`` the principal may describe (one kafka-python client for them all)."""
    from kafka.errors import TransactionalIdAuthorizationFailedError

    client = transaction_admin(settings)
    found = set()
    try:
        for txid in txids:
            try:
                client.describe_transactions([txid])
            except TransactionalIdAuthorizationFailedError:
                continue
            except Exception as exc:  # noqa: BLE001 - not found, no coordinator yet: allowed all the same
                log.debug("describing transactional id %s: %s", txid, exc)
            found.add(txid)
    finally:
        client.close()
    return found


@functools.cache
def _authorization_errors() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                      KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


def as_json(acls: list[Acl], principal: str | None) -> list[dict]:
    return [{**asdict(a), "principal": principal, "permission": "ALLOW", "host": "*"} for a in acls]
