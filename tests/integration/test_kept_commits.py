"""A stream's per_partition commits kept between batches (kafka_eos.sinks.per_partition.kept_commit),
on the real broker: a producer kept in one Spark worker while another worker's producer of the same
transactional id took over must notice before it reads a row, fence back, and commit exactly once."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kafka_eos import kafka_admin
from kafka_eos.errors import ProducerFenced, TransactionFailed
from kafka_eos.plan import PartitionRange
from kafka_eos.readers import read_committed
from kafka_eos.sinks import per_partition
from kafka_eos.sinks.per_partition import partition_commit

pytestmark = pytest.mark.integration


def _rows(spec, batch: int, n: int = 3):
    return [(spec.sink.topic, b"k", json.dumps({"order_id": f"b{batch}-{i}"}).encode(), None) for i in range(n)]


def _out(spec, settings) -> Counter:
    return Counter(json.loads(m.value)["order_id"] for m in read_committed(settings, spec.sink.topic))


def test_a_kept_producer_fenced_by_another_worker_builds_again_before_reading(kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "per_partition", partitions=1)
    topic = spec.source.topics[0]
    # Two Spark workers' kept commits of the same partition (the same transactional id).
    worker_a = partition_commit(spec, PartitionRange(topic, 0, 0, 0, None), kafka_settings, keep=True)
    worker_b = partition_commit(spec, PartitionRange(topic, 0, 0, 0, None), kafka_settings, keep=True)
    read: list[int] = []

    def batch(commit, n: int):
        r = PartitionRange(topic, 0, n * 10, (n + 1) * 10, n * 10 if n else None)

        def rows():
            read.append(n)  # the first row is read only after the producer is known to be current
            yield from _rows(spec, n)
        result = commit.use([r]).run(rows())
        return result.status, result.producer

    try:
        assert batch(worker_a, 0) == ("committed", "built")
        assert batch(worker_a, 1) == ("committed", "kept")  # no init_transactions(): same producer, same epoch
        assert batch(worker_b, 2) == ("committed", "built")  # B's init fences A's producer
        # A's kept producer is stale: found out when its offsets go in, before a row is read, then
        # built again (its init fences B back) and the batch commits through the new one.
        assert batch(worker_a, 3) == ("committed", "rebuilt")
        assert batch(worker_a, 4) == ("committed", "kept")
        assert batch(worker_b, 5) == ("committed", "rebuilt")
    finally:
        worker_a.close()
        worker_b.close()
    assert read == [0, 1, 2, 3, 4, 5]  # every batch's rows read once, by the producer that committed them
    assert _out(spec, kafka_settings) == Counter(f"b{n}-{i}" for n in range(6) for i in range(3))
    tp = (topic, 0)
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [tp])[tp] == 60


def test_a_kept_producer_mid_transaction_is_fenced_by_a_retry_elsewhere(kafka_settings, make_spec):
    """A retried task (another worker, its own kept or new producer) fences an attempt still
    producing through a kept producer; only the retry's records are visible."""
    spec = make_spec("identity", "kafka", "per_partition", partitions=1)
    topic = spec.source.topics[0]
    first = PartitionRange(topic, 0, 0, 10, None)
    second = PartitionRange(topic, 0, 10, 20, 10)
    zombie = partition_commit(spec, first, kafka_settings, keep=True)
    retry = partition_commit(spec, second, kafka_settings, keep=True)
    try:
        assert zombie.run(iter(_rows(spec, 0))).status == "committed"
        retried: dict = {}

        def zombie_rows():
            yield from _rows(spec, 1)[:2]
            retried["result"] = retry.run(iter(_rows(spec, 1)))  # the same range, retried elsewhere
            yield _rows(spec, 1)[2]

        with pytest.raises((ProducerFenced, TransactionFailed)):
            zombie.use([second]).run(zombie_rows())
        assert (retried["result"].status, retried["result"].producer) == ("committed", "built")
    finally:
        zombie.close()
        retry.close()
    assert _out(spec, kafka_settings) == Counter([f"b0-{i}" for i in range(3)] + [f"b1-{i}" for i in range(3)])
    n = kafka_admin.partition_offsets(kafka_settings, [(spec.sink.topic, p) for p in range(3)])
    assert all(o.lso == o.high_watermark for o in n.values())  # the zombie's transaction was aborted


def test_kept_commit_is_cached_per_process_and_dropped_after_a_failure(kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "per_partition", partitions=1)
    topic = spec.source.topics[0]

    def through_cache(n: int, rows):
        r = PartitionRange(topic, 0, n * 10, (n + 1) * 10, n * 10 if n else None)
        with per_partition.kept_commit(spec, r, kafka_settings, None) as commit:
            return commit.run(rows)

    assert through_cache(0, _rows(spec, 0)).producer == "built"
    assert through_cache(1, _rows(spec, 1)).producer == "kept"

    def failing():
        yield from _rows(spec, 2)
        raise RuntimeError("the transform failed mid-batch")

    with pytest.raises(RuntimeError, match="mid-batch"):
        through_cache(2, failing())
    # The failed batch's commit was closed, not kept: its retry builds a new producer.
    assert through_cache(2, _rows(spec, 2)).producer == "built"
    assert _out(spec, kafka_settings) == Counter(f"b{n}-{i}" for n in range(3) for i in range(3))


KEPT_OVER_MANY = '''
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from kafka_eos.plan import Plan, PartitionRange
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.per_partition import commit_rowless
from kafka_eos.spec import parse_spec

bootstrap, source, sink, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = parse_spec({{"name": sys.argv[5], "source": {{"topics": [source]}}, "transform": "identity",
                   "sink": {{"kind": "kafka", "commit": "per_partition", "topic": sink}}}}, "kept.yaml")
settings = KafkaSettings(bootstrap)
for batch in range(2):  # a stream's batches: each partition's commit is kept for the next
    plan = Plan(spec.name, f"b{{batch}}", tuple(PartitionRange(source, p, 0, 0, None if batch == 0 else 0)
                                               for p in range(n)))
    done = commit_rowless(spec, plan, settings, plan.ranges, keep=True)
    assert sorted(r.status for r in done.values()) == ["committed"] * n if batch == 0 else True, done
print(len(os.listdir("/proc/self/fd")))
'''


def test_a_stream_over_hundreds_of_partitions_keeps_its_commits_within_the_descriptor_limit(kafka_settings, unique):
    """A per_partition stream's driver kept two librdkafka clients per source partition (a producer
    and a reader of the group's offsets): 200 partitions held some 3,200 file descriptors and 1,600
    threads, past the usual limit of 1,024: under that limit the process hung (librdkafka out of
    descriptors). Now one reader per group and process, and the kept producers bounded by a share
    of the limit (least recently used closed first)."""
    import subprocess
    import sys

    from kafka_eos.manifest import ManifestStore
    from kafka_eos.spec import parse_spec

    source, sink, n = f"in-{unique}", f"out-{unique}", 200
    kafka_admin.create_topics(kafka_settings, {source: n, sink: 1})
    spec = parse_spec({"name": unique, "source": {"topics": [source]}, "transform": "identity",
                       "sink": {"kind": "kafka", "commit": "per_partition", "topic": sink}}, "kept.yaml")
    ManifestStore.of(spec, kafka_settings).ensure_topic()
    run = subprocess.run([sys.executable, "-c", KEPT_OVER_MANY.format(), kafka_settings.bootstrap_servers, source,
                          sink, str(n), unique], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) < 1024 * per_partition.KEPT_FD_SHARE + 64
    committed = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(source, p) for p in range(n)])
    assert set(committed.values()) == {0}
