"""Atomic scope in one pass: the transaction is open while Spark computes, rows reach the producer
as Spark's tasks end, in the order of the Spark partitions, and a failure anywhere aborts the
whole transaction (kafka_eos.sinks.atomic, kafka_eos.sinks.batches.computed)."""

from __future__ import annotations

import time

import pytest

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders
from kafka_eos.sinks import batches, jvm_writer

pytestmark = [pytest.mark.integration, pytest.mark.waits]

SLOW = '''
import time
from pyspark.sql import functions as F

@F.udf("long")
def slow_in_first(part, x):
    if part == 0:
        time.sleep(0.01)
    return x

@F.udf("long")
def slow_but_first(part, x):
    if part != 0:
        time.sleep(0.01)
    return x
'''

#: Records of the other partitions in the transaction before partition 2's task fails.
PRODUCED_FIRST = 50

#: A source partition 2 that fails, after a while, while the flag file exists.
FAILING = '''
import os, time
from pyspark.sql import functions as F

FLAG = {flag!r}
PRODUCED_FIRST = {produced_first}


@F.udf("binary")
def _fail_in_2(partition, value):
    # (Everything inside the function: the UDF is pickled by value, this module is not importable
    # in Spark's Python workers.)
    if partition == 2 and os.path.exists(FLAG):
        # Rows of the other partitions reach the transaction first: wait until some are in the
        # output topic (a fixed 3 s sleep once fell short on a loaded machine: 96 of the 100 its
        # assertion wanted).
        from confluent_kafka import Consumer, TopicPartition

        bootstrap, topic = open(FLAG).read().split()
        # read_uncommitted: the high watermark (read_committed's ends at the open transaction).
        consumer = Consumer({{"bootstrap.servers": bootstrap, "group.id": "failing-transform-probe",
                              "isolation.level": "read_uncommitted"}})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)) < PRODUCED_FIRST:
            time.sleep(0.2)
        consumer.close()
        raise ValueError("partition 2 fails")
    return value

def failing_identity(df):
    return df.select("key", _fail_in_2("partition", "value").alias("value"), "headers", "topic", "partition",
                     "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''

#: The first 100 offsets of each source partition are slow to transform.
SLOW_START = '''
import time
from pyspark.sql import functions as F

@F.udf("binary")
def _slow_start(offset, value):
    if offset < 100:
        time.sleep(0.02)
    return value

def slow_start(df):
    return df.select("key", _slow_start("offset", "value").alias("value"), "headers", "topic", "partition",
                     "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''


#: Every row takes a second to transform: the job of 60 rows on 3 partitions, 2 cores, takes 40 s.
SLOW_ROWS = '''
import time
from pyspark.sql import functions as F

@F.udf("binary")
def _slowly(value):
    time.sleep(1)
    return value

def slow_rows(df):
    return df.select("key", _slowly("value").alias("value"), "headers", "topic", "partition", "offset",
                     F.lit(None).cast("string").alias("dlq_reason"))

def slow_rows_shuffled(df):
    return slow_rows(df).repartition(2)
'''


@pytest.mark.parametrize("found", ["committed", "moved", "committed-shuffled", "given-up"])
def test_the_jvm_writers_set_up_beside_its_job_cancels_a_job_of_no_use(spark, kafka_settings, make_spec,
                                                                     transforms_from, monkeypatch, tmp_path, found):
    """The JVM writer's init, fencing and checkpoint check run beside the Spark job
    (``AtomicTransaction.SetUp``), and their outcome is the run's: where the group is already at the
    ranges' ends (an earlier attempt committed the plan) the run is a no-op; where another plan moved
    it, a CheckpointConflict. The set-up is held before its check (``before_check``) until a job (40 s
    of work) is under way beside it; then nothing is produced, and the job is cancelled, not waited
    for. ``committed-shuffled``: the job under way is the map stage's that adaptive execution runs while
    the final job is planned; the run's tag reaches it, and it is cancelled too. ``given-up``: a plan
    ready to commit whose caller gives up while the job runs (``AtomicTransaction.cancel``, as
    ``jvm_writer`` calls it when its Py4J call is interrupted): the job is cancelled at once, nothing is
    produced, and the run fails as given up."""
    import threading
    import uuid

    from kafka_eos.errors import CheckpointConflict, TransactionFailed
    from kafka_eos.sinks import atomic

    def not_here(*args, **kwargs):
        raise AssertionError("the driver's Python producer took the run, not the JVM writer")

    monkeypatch.setattr(atomic, "write_one_pass", not_here)
    monkeypatch.setattr(atomic, "write_cached", not_here)
    job_id = uuid.uuid4().hex
    monkeypatch.setattr(jvm_writer, "_job_id", lambda: job_id)  # the JVM's name of the run
    transform = "slow_rows_shuffled" if found == "committed-shuffled" else "slow_rows"
    spec = make_spec(transforms_from("slow_rows", SLOW_ROWS) + f":{transform}", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    tps = [r.tp for r in plan.active]
    group_at = {r.tp: 1 if found == "moved" else r.until for r in plan.active}
    if found != "given-up":
        kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, group_at)
    monkeypatch.setenv("KAFKA_EOS_PAUSE_AT", "before_check")
    monkeypatch.setenv("KAFKA_EOS_PAUSE_DIR", str(tmp_path))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = run_batch(spark, spec, plan, kafka_settings)
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getActiveJobsIds())
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not ((tmp_path / "before_check.reached").exists() and set(tracker.getActiveJobsIds()) - before) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "before_check.reached").exists() and set(tracker.getActiveJobsIds()) - before, \
            "no job under way beside the set-up"
        released = time.monotonic()
        if found == "given-up":
            spark.sparkContext._jvm.io.kafkaeos.writer.AtomicTransaction.cancel(job_id)
            deadline = time.monotonic() + 20
            while set(tracker.getActiveJobsIds()) - before and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not set(tracker.getActiveJobsIds()) - before, "the job went on after its caller gave up"
    finally:
        (tmp_path / "before_check.go").touch()
    runner.join(60)
    assert not runner.is_alive()
    assert time.monotonic() - released < 20, "the run waited for the job of no use"
    if found == "moved":
        assert isinstance(outcome.get("error"), CheckpointConflict), outcome
        assert "is at 1, the plan expected None" in str(outcome["error"])
    elif found == "given-up":
        assert isinstance(outcome.get("error"), TransactionFailed), outcome
        assert "cancelled, the run's process stopped waiting for it" in str(outcome["error"])
    else:
        assert "error" not in outcome, outcome
        assert outcome["summary"].status == "noop"
    deadline = time.monotonic() + 15
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tracker.getActiveJobsIds() == [], "the job of no use went on"
    out = kafka_admin.partition_offsets(kafka_settings, [(spec.sink.topic, p) for p in range(3)])
    assert sum(o.high_watermark for o in out.values()) == 0  # nothing was produced, not even aborted
    committed = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps)
    assert committed == ({tp: None for tp in tps} if found == "given-up" else group_at)


def test_rows_come_in_partition_order_when_the_tasks_end_out_of_order(spark, transforms_from):
    module = __import__(transforms_from("slow_udfs", SLOW))
    from pyspark.sql import functions as F

    # Partition 0's rows are slow: its task ends after the others'.
    df = spark.range(0, 400, 1, 4).select(module.slow_in_first(F.spark_partition_id(), "id").alias("id"))
    got = [i for batch in batches.computed(df) for i in batch.column("id").to_pylist()]
    assert got == list(range(400))


def test_a_computation_left_early_stops_its_spark_job(spark, transforms_from):
    module = __import__(transforms_from("slow_udfs", SLOW))
    from pyspark.sql import functions as F

    # Partition 0 (first in turn) is quick; the others take about 10 s each.
    df = spark.range(0, 4000, 1, 4).select(module.slow_but_first(F.spark_partition_id(), "id").alias("id"))
    rows = batches.computed(df)
    first = next(rows)
    assert first.column("id")[0].as_py() == 0
    started = time.monotonic()
    rows.close()
    assert time.monotonic() - started < 8, "closing waited for the whole job instead of cancelling it"
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    assert spark.range(3).count() == 3  # the session goes on


def test_a_commit_that_fails_mid_produce_cancels_its_spark_job_at_once(spark, kafka_settings, make_spec,
                                                                       transforms_from):
    """The one-pass job never outlives its transaction: a produce() that fails on the second row
    (of 4 tasks, the later ones slow) aborts the transaction and cancels the job before the error
    reaches the caller, with the garbage collector off (it used to wait for a cyclic collection:
    the error's traceback kept the generators alive)."""
    import gc

    from confluent_kafka import KafkaError, KafkaException

    from kafka_eos.errors import TransactionFailed
    from kafka_eos.sinks.atomic import atomic_commit, write_atomic

    module = __import__(transforms_from("slow_udfs", SLOW))
    from pyspark.sql import functions as F

    spec = make_spec("identity", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 30, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    # Partition 0 (first in turn) is quick; the others take about 10 s each.
    df = spark.range(0, 4000, 1, 4).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        module.slow_but_first(F.spark_partition_id(), "id").cast("string").cast("binary").alias("value"),
        F.lit(spec.source.topics[0]).alias("topic"), F.lit(0).alias("partition"), F.col("id").alias("offset"),
        F.lit(None).cast("string").alias("dlq_reason"))
    commit = atomic_commit(spec, plan, kafka_settings)
    real, produced = commit._produce, []

    def produce(topic, key, value, headers):
        produced.append(key)
        if len(produced) == 2:
            raise KafkaException(KafkaError(KafkaError.INVALID_RECORD, "refused for the test"))
        real(topic, key, value, headers)

    commit._produce = produce
    gc.disable()
    try:
        with pytest.raises(TransactionFailed, match="aborted after INVALID_RECORD"):
            write_atomic(df, spec, plan, kafka_settings, {}, commit=commit)
        raised = time.monotonic()
        while spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() - raised < 5:
            time.sleep(0.1)
        assert spark.sparkContext.statusTracker().getActiveJobsIds() == [], "the one-pass job outlived its commit"
    finally:
        gc.enable()
    assert read_committed(kafka_settings, spec.sink.topic) == []
    assert spark.range(3).count() == 3  # the session goes on


@pytest.mark.parametrize("writer", ["jvm", "python"])
def test_a_task_failing_after_rows_were_produced_aborts_the_whole_transaction(spark, kafka_settings, make_spec,
                                                                              transforms_from, tmp_path, monkeypatch,
                                                                              writer):
    """``python``: the driver's Python producer takes each task's rows as it ends, so rows of other
    partitions are in the transaction when partition 2's task fails; it is aborted. ``jvm``: the
    transaction opens only once the job has ended, so nothing at all is produced."""
    if writer == "python":
        monkeypatch.setenv(jvm_writer.WRITER_ENV, "python")
    flag = tmp_path / "fail"
    flag.touch()
    # jvm: partition 2 fails at once (nothing can reach the output before the job ends, nothing to wait for).
    first = PRODUCED_FIRST if writer == "python" else 0
    transform = transforms_from(f"failing_transforms_{writer}", FAILING.format(flag=str(flag), produced_first=first)) \
        + ":failing_identity"
    spec = make_spec(transform, "kafka", "atomic")
    flag.write_text(f"{kafka_settings.bootstrap_servers} {spec.sink.topic}")
    produce_orders(kafka_settings, spec.source.topics[0], 300, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(Exception, match="partition 2 fails"):
        run_batch(spark, spec, plan, kafka_settings)
    out = kafka_admin.partition_offsets(kafka_settings, [(spec.sink.topic, p) for p in range(3)])
    if writer == "python":  # rows of other partitions were produced into the transaction, then it was aborted
        assert sum(o.high_watermark for o in out.values()) >= PRODUCED_FIRST
    else:
        assert sum(o.high_watermark for o in out.values()) == 0
    assert read_committed(kafka_settings, spec.sink.topic) == []
    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}

    flag.unlink()  # the same plan again: committed once
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 300)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 300
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == {
        r.tp: r.until for r in plan.ranges}


class _Interrupted(Exception):
    """What a signal's handler raises in the driver's Python (as Airflow's task timeout does)."""


def test_a_py4j_call_interrupted_in_python_cancels_the_jvms_transaction(spark, kafka_settings, make_spec, tmp_path,
                                                                        monkeypatch):
    """The driver's Python gives up on the JVM writer's call (a signal's exception, while the JVM holds
    its transaction open at ``before_commit``): ``jvm_writer.atomic`` tells the JVM, which aborts
    instead of committing once it goes on. The same plan again commits every record once."""
    import signal
    import threading

    from kafka_eos.kafka_admin import transaction_admin

    assert threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
    spec = make_spec("identity", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    monkeypatch.setenv("KAFKA_EOS_PAUSE_AT", "before_commit")
    monkeypatch.setenv("KAFKA_EOS_PAUSE_DIR", str(tmp_path))
    reached = tmp_path / "before_commit.reached"

    def interrupt_once_paused() -> None:
        deadline = time.monotonic() + 120
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    def handler(signum, frame):
        raise _Interrupted("the driver's Python gave up")

    previous = signal.signal(signal.SIGUSR1, handler)
    interrupter = threading.Thread(target=interrupt_once_paused, daemon=True)
    try:
        interrupter.start()
        with pytest.raises(Exception) as raised:
            run_batch(spark, spec, plan, kafka_settings)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    # Raised as it is, or as Py4J reports what broke its wait for the answer: a Py4JError of the call
    # (Py4J logs the interruption itself and keeps it out of the error it raises) — not the JVM's answer.
    assert isinstance(raised.value, _Interrupted) or (
        type(raised.value).__name__ == "Py4JError" and "AtomicTransaction.commit" in str(raised.value)), \
        repr(raised.value)
    assert reached.exists()  # interrupted while the JVM held the transaction, its records produced
    (tmp_path / "before_commit.go").touch()  # the JVM goes on: cancelled, it must abort

    admin = transaction_admin(kafka_settings)
    try:
        def state() -> str:
            found = admin.describe_transactions([spec.transactional_id()])[spec.transactional_id()].state
            return getattr(found, "value", str(found))

        deadline = time.monotonic() + 60
        while state() not in ("PrepareAbort", "CompleteAbort", "PrepareCommit", "CompleteCommit") \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state() in ("PrepareAbort", "CompleteAbort")
    finally:
        admin.close()
    assert read_committed(kafka_settings, spec.sink.topic) == []
    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}

    monkeypatch.delenv("KAFKA_EOS_PAUSE_AT")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 60)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 60


def test_an_output_larger_than_one_job_may_return_is_committed_in_two_passes(spark, kafka_settings, make_spec,
                                                                             max_result_size, capfd):
    spec = make_spec("identity", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 600, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    max_result_size("100k")  # about 50 KB per source partition's task, 150 KB in all
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 600)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 600
    assert ("larger than spark.driver.maxResultSize lets one Spark job return to the driver; computing the "
            "output first, then committing it") in capfd.readouterr().err


def test_one_pass_is_not_tried_where_its_results_could_fill_the_drivers_heap(spark, kafka_settings, make_spec,
                                                                           max_result_size, capfd):
    """One pass returns every task's result through the driver's heap, bounded by
    spark.driver.maxResultSize: a session's own sets it to 40 % of the heap; a limit above half the
    heap, or none (0), could run the driver out of memory before Spark stops the job, so such a run
    commits in two passes from the start."""
    from kafka_eos.spark_io import result_limits

    limit, heap = result_limits(spark)
    assert 0 < limit <= 0.4 * heap + 1  # get_session bounded it
    spec = make_spec("identity", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 300, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    max_result_size("0")  # no limit
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 300)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 300
    assert ("spark.driver.maxResultSize (no limit) is more than 50% of the driver's heap "
            f"({heap >> 20} MiB): one pass could fill the heap; computing the output first") in capfd.readouterr().err


def test_a_source_partition_read_in_several_tasks_keeps_its_order_in_the_output(spark, kafka_settings, make_spec,
                                                                                transforms_from, monkeypatch):
    from kafka_eos import batch as batch_module

    monkeypatch.setattr(batch_module, "DRIVER_TASK_RECORDS", 100)  # 3 tasks per source partition
    transform = transforms_from("slow_start", SLOW_START) + ":slow_start"
    spec = make_spec(transform, "kafka", "atomic", partitions=2)
    produce_orders(kafka_settings, spec.source.topics[0], 600, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 600)
    source = {(m.partition, m.value): m.offset for m in read_committed(kafka_settings, spec.source.topics[0])}
    assert len(source) == 600
    seen: dict[tuple, list] = {}
    for m in read_committed(kafka_settings, spec.sink.topic):
        for (p, value), offset in source.items():
            if value == m.value:
                seen.setdefault((m.partition, p), []).append(offset)
    assert sum(len(v) for v in seen.values()) == 600
    # Each source partition's records in every output partition in their source order, though the
    # tasks holding its later offsets ended first.
    assert all(offsets == sorted(offsets) for offsets in seen.values())


def test_the_order_kept_follows_what_each_task_reads(spark, kafka_settings, make_spec):
    from kafka_eos.spark_io import read_layout, read_ranges

    spec = make_spec("identity", "kafka", "atomic", partitions=2)
    produce_orders(kafka_settings, spec.source.topics[0], 400, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    split = read_ranges(spark, kafka_settings, plan.active, 100)
    source = spec.source.topics[0]
    tasks = batches.turns(split)  # the parts of one source partition: a group
    assert tasks == {task: tp for task, (tp, _f, _u) in read_layout(split).items()}
    assert set(tasks.values()) == {(source, 0), (source, 1)}
    assert all(list(tasks.values()).count(tp) >= 2 for tp in set(tasks.values()))
    assert batches.turns(split.groupBy("partition").count()) is None  # a shuffle: any order
    assert set(batches.turns(split.union(split)).values()) == {0}  # a union: one order for all
