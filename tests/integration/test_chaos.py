"""The fault matrix's quick scenarios on a three-node cluster of this test's own (``make chaos``
runs them all): one per sink and kind of fault, each checked for loss, duplicates, aborted input,
open transactions, checkpoints apart from the output and SQL drift."""

from __future__ import annotations

import pytest

from kafka_eos_lab.chaos.__main__ import render
from kafka_eos_lab.chaos.scenarios import cells_of, run_matrix
from kafka_eos.kafka_admin import broker_config, cluster_metadata, create_topics
from kafka_eos.local.kafka import LocalCluster
from kafka_eos.settings import KafkaSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, free_ports):
    cluster = LocalCluster(home=tmp_path_factory.mktemp("cluster"), port=free_ports(6))
    cluster.start()
    yield cluster
    cluster.stop(grace_s=5)  # thrown away: a node waiting for a quorum already gone is killed


def test_three_nodes_replicate_every_topic_three_times_with_two_in_sync_required(cluster, unique):
    settings = KafkaSettings(cluster.bootstrap)
    create_topics(settings, {unique: 2})
    md = cluster_metadata(settings)
    assert sorted(md.brokers) == [1, 2, 3]
    assert {len(p.replicas) for p in md.topics[unique].partitions.values()} == {3}
    assert broker_config(settings, "min.insync.replicas", 0) == 2
    assert broker_config(settings, "transaction.state.log.replication.factor", 0) == 3
    assert broker_config(settings, "offsets.topic.replication.factor", 0) == 3


def _retry_in(spark):
    """A cell's retry as ``kafka-eos run`` does it (the stored plan of the run id, the batch, the
    check of every checkpoint), in the worker's SparkSession: the fault is in the first attempt's
    own process; a retry's JVM start is no part of what a cell proves."""
    from kafka_eos.batch import run_batch
    from kafka_eos.pipeline import prepare_plan, verify

    def retry(spec, settings, run_id):
        plan = prepare_plan(spec, settings, run_id)
        if not plan.is_empty:
            run_batch(spark, spec, plan, settings)
            verify(spec, settings, plan)
    return retry


def test_quick_scenarios_lose_nothing_and_duplicate_nothing(cluster, tmp_path, spark):
    outcomes = run_matrix(cluster, cells_of(quick=True), tmp_path, retry=_retry_in(spark))
    print(render(outcomes))
    for o in outcomes:
        assert o.error == "", (o.scenario, o.sink, o.error)
        assert o.fault, (o.scenario, o.sink)  # the fault happened
        assert o.counts.anomalies() == 0, (o.scenario, o.sink, o.counts)
        assert o.exits[-1] == 0, (o.scenario, o.sink, o.exits)
    by_cell = {(o.scenario, o.sink): o for o in outcomes}
    # The killed Spark task failed its run; the retry got through.
    assert by_cell[("process SIGKILL at produce", "per_partition")].exits[0] != 0
    # The driver killed with the offsets in its open transaction: the first retry plans (fencing
    # that transaction, which held the group's offsets) and commits. The transaction is the driver
    # JVM's (the JVM writer): the JVM is SIGKILLed, and `kafka-eos run`, its parent, fails (exit 2).
    assert by_cell[("process SIGKILL at commit", "atomic")].exits == [2, 0]
