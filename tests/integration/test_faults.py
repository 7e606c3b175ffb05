"""Faults: a SIGKILLed Spark job, a re-run of a committed plan, two concurrent attempts, and a
SQL sink killed between its DB commit and the Kafka mirror."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import ProducerFenced, TransactionTimedOut
from kafka_eos.pipeline import compute_plan, prepare_plan, verify
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders
from kafka_eos.txn import TransactionalCommit

from kafka_eos.sinks import jvm_writer
from kafka_eos.spark_io import connector_jars
from kafka_eos.spec import spec_document

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def write_spec_file(spec, path: Path) -> Path:
    path.write_text(yaml.safe_dump(spec_document(spec)))
    return path


def spark_submit(spec_file: Path, plan_file: Path, settings, crash_at: str | None,
                 extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """The Spark entry point in its own process, as Airflow's SparkSubmitOperator runs it."""
    env = {**os.environ, **settings.to_environ(plan_file.with_suffix(".client.json")), "PYSPARK_PYTHON": sys.executable,
           **(extra_env or {})}
    env.pop("KAFKA_EOS_CRASH_AT", None)
    if crash_at:
        env["KAFKA_EOS_CRASH_AT"] = crash_at
    return subprocess.run(
        # Under spark-submit the driver's classpath is fixed at launch: the connector goes in --jars.
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         "--jars", ",".join(connector_jars()),
         str(ROOT / "spark_apps" / "run_pipeline.py"), "--spec", str(spec_file), "--plan", str(plan_file)],
        env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("commit", ["atomic", "per_partition", "per_partition-python-writer"])
def test_killed_spark_job_then_same_plan_again_is_exactly_once(spark, kafka_settings, admin, make_spec, tmp_path,
                                                               commit):
    # atomic: the driver dies mid-transaction; per_partition: the JVM that produces a partition's
    # records (in local mode the driver's), or with the Python commit task its Python worker.
    spec = make_spec("identity", "kafka", commit.split("-")[0])
    truth = produce_orders(kafka_settings, spec.source.topics[0], 600, abort_every=4, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())

    python_writer = {jvm_writer.WRITER_ENV: "python"} if commit.endswith("python-writer") else {}
    killed = spark_submit(write_spec_file(spec, tmp_path / "spec.yaml"), plan_file, kafka_settings, "after_produce",
                          python_writer)
    assert killed.returncode != 0, killed.stdout[-2000:]
    out_tps = [(spec.sink.topic, p) for p in range(3)]
    offsets = kafka_admin.partition_offsets(kafka_settings, out_tps)
    assert sum(o.high_watermark for o in offsets.values()) >= 100  # part of the output was written ...
    visible = read_committed(kafka_settings, spec.sink.topic)
    if commit == "atomic":
        assert visible == []  # ... and none of it is visible
    # per_partition: a partition whose task finished before the crash may have committed whole.
    committed_before = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id,
                                                     [r.tp for r in plan.active])
    assert any(committed_before[r.tp] is None for r in plan.active), "the kill came too late"

    # The retry: same run id -> the stored plan -> a new attempt fences the killed one.
    again = prepare_plan(spec, kafka_settings, "run-1")
    assert again.ranges == plan.ranges
    run_batch(spark, spec, again, kafka_settings)
    verify(spec, kafka_settings, again)
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert Counter(out) == Counter(o["order_id"] for o in truth.committed)
    # The run's record counts every committed record once, across both attempts.
    from kafka_eos.manifest import ManifestStore

    record, _parts = ManifestStore.of(spec, kafka_settings).run_records("run-1")
    assert (record["status"], record["records_out"]) == ("committed", len(out))

    # A committed run re-run with the same plan is a no-op.
    rerun = run_batch(spark, spec, again, kafka_settings)
    assert rerun.status == "noop"
    assert len(read_committed(kafka_settings, spec.sink.topic)) == len(out)


def test_two_concurrent_attempts_the_older_is_fenced(kafka_settings, admin, make_spec):
    spec = make_spec("identity", "kafka", "atomic", partitions=1)
    produce_orders(kafka_settings, spec.source.topics[0], 20, abort_every=0, malformed_every=0)
    plan, _ = compute_plan(spec, kafka_settings, "run-1")

    def attempt():
        return TransactionalCommit(kafka_settings, spec.transactional_id(), spec.source.group_id,
                                   plan.active, spec.sink.dlq_topic)

    newer_result = {}

    def older_records():
        for i in range(5):
            yield spec.sink.topic, b"k", f"older-{i}".encode(), None
        # The newer attempt starts and finishes while the older is still producing.
        newer_result["r"] = attempt().run(iter([(spec.sink.topic, b"k", f"newer-{i}".encode(), None)
                                                for i in range(7)]))
        for i in range(5, 10):
            yield spec.sink.topic, b"k", f"older-{i}".encode(), None

    with pytest.raises(ProducerFenced, match=r"fenced by a newer attempt"):
        attempt().run(older_records())
    assert newer_result["r"].status == "committed"
    values = sorted(m.value.decode() for m in read_committed(kafka_settings, spec.sink.topic))
    assert values == sorted(f"newer-{i}" for i in range(7))
    (r,) = plan.active
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp])[r.tp] == r.until


def test_sql_sink_killed_before_the_kafka_mirror_is_repaired(spark, kafka_settings, admin, make_spec, tmp_path):
    url = f"sqlite:///{tmp_path / 'rev.db'}"
    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     table="revenue", key_columns=["minute", "category"], merge="add", url=url)
    truth = produce_orders(kafka_settings, spec.source.topics[0], 150, abort_every=3, malformed_every=10)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())

    killed = spark_submit(write_spec_file(spec, tmp_path / "spec.yaml"), plan_file, kafka_settings,
                          "after_sql_commit")
    assert killed.returncode != 0
    tps = [r.tp for r in plan.active]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}

    # `plan` reports the drift without touching anything ...
    _, drift = compute_plan(spec, kafka_settings, "probe")
    assert {(d.topic, d.partition): (d.sink, d.kafka) for d in drift} == {r.tp: (r.until, None) for r in plan.active}
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}
    # ... and the retried run repairs it; the stored plan is a no-op, nothing counted twice.
    again = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, again, kafka_settings)
    verify(spec, kafka_settings, again)
    assert summary.status == "noop"
    mirror = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps)
    assert mirror == {r.tp: r.until for r in plan.active}
    with create_engine(url).connect() as conn:
        assert conn.execute(text("select sum(order_count) from revenue")).scalar() == len(truth.committed)
        assert conn.execute(text("select count(*) from kafka_eos_dead_letters")).scalar() == truth.malformed


@pytest.mark.parametrize("older,newer", [("atomic", "per_partition"), ("per_partition", "atomic")])
def test_attempts_in_different_commit_scopes_fence_each_other(kafka_settings, make_spec, older, newer):
    """A zombie of one scope and a retry of the same stored plan in the other scope: before the
    cross-scope fences, both passed the checkpoint check and every record was written twice."""
    from kafka_eos.sinks.atomic import atomic_commit
    from kafka_eos.sinks.per_partition import partition_commit

    spec = make_spec("identity", "kafka", "atomic", partitions=2)
    produce_orders(kafka_settings, spec.source.topics[0], 40, abort_every=0, malformed_every=0)
    plan, _ = compute_plan(spec, kafka_settings, "run-1")
    assert len(plan.active) == 2

    def records(label: str, ranges):
        return [(spec.sink.topic, b"k", f"{label}-{r.partition}-{i}".encode(), None) for r in ranges for i in range(3)]

    def run_scope(scope: str, label: str, ranges, records_of=records):
        if scope == "atomic":
            return [atomic_commit(spec, plan, kafka_settings).run(iter(records_of(label, plan.active)))]
        return [partition_commit(spec, r, kafka_settings).run(iter(records_of(label, [r]))) for r in ranges]

    newer_results = []

    def older_records(label, ranges):
        yield from records(label, ranges)[:2]
        # The newer attempt, in the other scope, starts and commits while the older one produces.
        newer_results.extend(run_scope(newer, "newer", plan.active))
        yield from records(label, ranges)[2:]

    older_ranges = plan.active if older == "atomic" else plan.active[:1]
    with pytest.raises(ProducerFenced):
        run_scope(older, "older", older_ranges, older_records)
    assert [r.status for r in newer_results] == ["committed"] * len(newer_results)
    values = sorted(m.value.decode() for m in read_committed(kafka_settings, spec.sink.topic))
    assert values == sorted(v.decode() for _t, _k, v, _h in records("newer", plan.active))
    tps = [r.tp for r in plan.active]
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == {r.tp: r.until for r in plan.active}


def test_a_transaction_aborted_by_its_timeout_is_not_reported_as_fenced(kafka_settings, make_spec):
    """librdkafka reports a coordinator's timeout abort as _FENCED ("fenced by newer producer
    instance"); the operator must read the true cause."""
    spec = make_spec("identity", "kafka", "atomic", partitions=1)
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan, _ = compute_plan(spec, kafka_settings, "run-1")
    commit = TransactionalCommit(kafka_settings, spec.transactional_id(), spec.source.group_id, plan.active,
                                 spec.sink.dlq_topic, timeout_ms=2000)

    def slow_records():
        yield spec.sink.topic, b"k", b"first", None
        # Past the 2 s timeout and the broker's abort check (every 5 s on the local broker).
        time.sleep(9)
        yield spec.sink.topic, b"k", b"second", None

    with pytest.raises(TransactionTimedOut) as failed:
        commit.run(slow_records())
    assert "after the transaction timeout of 2s" in str(failed.value)
    assert not isinstance(failed.value, ProducerFenced)
    assert read_committed(kafka_settings, spec.sink.topic) == []
    (r,) = plan.active
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp])[r.tp] is None
