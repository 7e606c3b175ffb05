"""Which broker to hit, and how: the leader of a partition or the coordinator of a transactional
id or group, SIGKILLed, SIGTERMed (a clean shutdown) or SIGSTOPped; then brought back and waited
for until every replica is in sync again."""

from __future__ import annotations

import os
import signal
import time

from kafka_eos.errors import BrokerError
from kafka_eos.kafka_admin import cluster_metadata
from kafka_eos.local.kafka import LocalCluster
from kafka_eos.settings import KafkaSettings

#: Kafka's internal topics: a transactional id's coordinator leads one partition of the first, a
#: group's coordinator one of the second.
TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"
#: How long a healed cluster may take to bring every replica back in sync (a restarted node
#: catches up on the internal topics' partitions, 50 of them by default, on two cores).
IN_SYNC_TIMEOUT_S = 180.0

ACTIONS = ("kill", "term", "stop")


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (for text in the Basic Multilingual Plane): the hash Kafka places
    transactional ids and groups with."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal topic's partition whose leader coordinates ``key`` (Kafka's ``Utils.abs(hash) % n``)."""
    return (java_hash(key) & 0x7FFFFFFF) % partitions


def leader_of(settings: KafkaSettings, topic: str, partition: int, md=None) -> int:
    """The node that leads ``topic-partition`` now.

    :param md: the cluster's metadata already read.
    :raises BrokerError: the partition has no leader.
    """
    md = md or cluster_metadata(settings)
    leader = md.topics[topic].partitions[partition].leader
    if leader < 0:
        raise BrokerError(f"{topic}-{partition} has no leader")
    return leader


def coordinator_of(settings: KafkaSettings, internal_topic: str, key: str) -> int:
    """The coordinator of a transactional id (:data:`TRANSACTION_STATE`) or group (:data:`CONSUMER_OFFSETS`)."""
    md = cluster_metadata(settings)
    partitions = len(md.topics[internal_topic].partitions)
    return leader_of(settings, internal_topic, coordinator_partition(key, partitions), md)


def hit(cluster: LocalCluster, node_id: int, action: str) -> None:
    """Kill (SIGKILL), terminate (SIGTERM, waiting for the clean shutdown) or stop (SIGSTOP) a node."""
    node = cluster.node(node_id)
    pid = node.pid()
    if pid is None:
        raise BrokerError(f"node {node_id} is not running")
    if action == "kill":
        os.kill(pid, signal.SIGKILL)
        node.pid_file.unlink(missing_ok=True)
    elif action == "term":
        node.stop()
    elif action == "stop":
        os.kill(pid, signal.SIGSTOP)
    else:
        raise ValueError(f"action {action!r}: one of {ACTIONS}")


def heal(cluster: LocalCluster, node_id: int, action: str) -> None:
    """Bring a node back: SIGCONT a stopped one, start a killed or terminated one."""
    node = cluster.node(node_id)
    if action == "stop":
        os.kill(node.pid(), signal.SIGCONT)
    else:
        node.start(bootstrap=cluster.bootstrap)


def wait_in_sync(settings: KafkaSettings, timeout_s: float = IN_SYNC_TIMEOUT_S) -> None:
    """Wait until every partition of the cluster has all its replicas in sync.

    :raises BrokerError: some are still out of sync at the deadline (named).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        md = cluster_metadata(settings)
        behind = [f"{t}-{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                  if pm.leader < 0 or set(pm.isrs) != set(pm.replicas)]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"{len(behind)} partition(s) not in sync within {timeout_s:g}s: {behind[:5]}")
        time.sleep(1)
