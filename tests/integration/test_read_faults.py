"""Faults inside the read: a Spark task that fails while its input is read commits nothing of its
partition, at every point of that input (before the first Arrow batch, at a batch boundary,
mid-batch, in the last batch) and of each kind (a JVM exception in the transform, a Python UDF's
exception, a Python worker killed). The next run then writes every record once.

Before the proof of read (kafka_eos.sinks.proof), a per_partition task whose JVM side failed saw
its Arrow input end early, committed the batches it had, and moved the checkpoint to the range's
end: the rest of the range was lost for good. A one-pass per_partition run now produces from the
JVM (kafka_eos.sinks.jvm_writer: the fault throws through Spark's iterator into its transaction);
the ``per_partition-python-writer`` cells keep the Python commit task (a stream's, a Spark Connect
client's) under the same faults. A one-pass atomic run produces from the driver's JVM once its job has
ended; the ``atomic-python-writer`` cells keep the driver's Python producer (a stream's), whose rows
come as the tasks end.

The quick cells run in ``make test``; the whole grid (every kind at every point, in both scopes
and the SQL sink) is marked ``chaos`` and runs in ``make chaos``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.readers import read_committed, settle
from kafka_eos.sinks import jvm_writer

pytestmark = pytest.mark.integration

#: Records of the faulty partition (0) and of its neighbour (1), which has no fault.
RECORDS = 3000
#: Rows per Arrow batch in these tests (the ``small_batches`` fixture): three batches per partition.
BATCH_ROWS = 1000
#: Where in partition 0's input the fault strikes (its offsets are 0 .. RECORDS-1).
POINTS = {"first": 0, "boundary": BATCH_ROWS, "mid": BATCH_ROWS + BATCH_ROWS // 2, "last": RECORDS - 1}

FAULTY = '''
import os
import signal
import sys

from pyspark import cloudpickle
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

# The UDF travels by value: Spark's Python workers (forked before this module was written) cannot
# import it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KIND, AT = {kind!r}, {at}


def _python_check(partition, offset):
    if partition == 0 and offset == AT:
        if KIND == "python_kill":
            os.kill(os.getpid(), signal.SIGKILL)  # this Python worker, mid-task
        raise ValueError(f"a Python UDF failed at offset {{offset}}")
    return True


python_check = F.udf(_python_check, BooleanType())


def faulty(df):
    hit = (F.col("partition") == 0) & (F.col("offset") == AT)
    if KIND == "jvm":
        df = df.where(F.when(hit, F.raise_error(F.lit("a JVM exception in the transform"))).otherwise(F.lit(True)))
    else:
        df = df.where(python_check(F.col("partition"), F.col("offset")))
    return df.select("key", "value", "topic", "partition", "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''


#: Padding of each value: a batch of rows is then larger than Spark's buffer to its Python worker
#: (spark.buffer.size, 64 KiB), so a batch reaches the worker before the fault that follows it.
PAD = "x" * 200


def _source(kafka_settings, spec, first: int = 0) -> dict:
    """:data:`RECORDS` records on each of the source's two partitions, values ``p:i:padding`` for
    ``i`` from ``first`` (its offset, on a partition only this writes to)."""
    src = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"linger.ms": 20}))
    for p, i in itertools.product((0, 1), range(first, first + RECORDS)):
        producer.produce(src, key=f"k{i}".encode(), value=f"{p}:{i}:{PAD}".encode(), partition=p)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0
    settle(kafka_settings, src)
    return {p: {f"{p}:{i}:{PAD}" for i in range(first, first + RECORDS)} for p in (0, 1)}


def _fence_partitions(kafka_settings, spec, plan) -> None:
    """Fence every transactional id of ``plan``'s partitions (and the atomic one): an attempt still
    at work cannot commit after this returns, and what it committed before is visible."""
    from kafka_eos.txn import fence

    for tid in [spec.transactional_id(), *(spec.transactional_id(r.topic, r.partition) for r in plan.ranges)]:
        fence(kafka_settings, tid, spec.sink.transaction_timeout_s * 1000, spec.source.topics[0])


def _values(kafka_settings, topic) -> list[str]:
    return [m.value.decode() for m in read_committed(kafka_settings, topic)]


def _run_fault(spark, kafka_settings, make_spec, transforms_from, unique, commit, kind, point, request):
    if commit == "sql":
        _run_sql_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point)
        return
    if commit == "iceberg":
        _run_iceberg_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point,
                           request.getfixturevalue("tmp_path"))
        return
    if commit == "per_partition-two-passes":
        request.getfixturevalue("two_passes")
    if commit.endswith("-python-writer"):  # one pass, its rows produced by the Python commit task / driver
        request.getfixturevalue("monkeypatch").setenv(jvm_writer.WRITER_ENV, "python")
    module = transforms_from(f"faulty_{unique.replace('-', '_')}", FAULTY.format(kind=kind, at=POINTS[point]))
    spec = make_spec(f"{module}:faulty", "kafka", commit.split("-")[0], partitions=2)
    produced = _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    tps = [r.tp for r in plan.ranges]

    with pytest.raises(Exception) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    assert CAUSE[kind] in str(failed.value), str(failed.value)[-2000:]  # the fault, not another failure

    # Nothing of the faulty partition is committed: no checkpoint, no record of it in the output.
    # A task's Python worker may still be at work after its job failed: fenced first, so what it
    # committed before is seen and it can commit nothing after.
    src = spec.source.topics[0]
    _fence_partitions(kafka_settings, spec, plan)
    checkpoints = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps)
    assert checkpoints[(src, 0)] is None, f"{kind} at {point}: partition 0's checkpoint moved to {checkpoints}"
    out = _values(kafka_settings, spec.sink.topic)
    assert not [v for v in out if v.startswith("0:")], f"{kind} at {point}: records of the failed partition committed"
    if commit.startswith("atomic"):  # one transaction: nothing of the other partition either
        assert out == [] and checkpoints[(src, 1)] is None
    # per_partition: the other partition is its own unit of work; its task may still be committing
    # after the job failed (Spark does not wait for it), so its state is checked at the end.

    # The run again (an Airflow retry: the same plan), the fault gone: every record once.
    fixed = dataclasses.replace(spec, transform="identity")
    run_batch(spark, fixed, prepare_plan(fixed, kafka_settings, "run-1"), kafka_settings)
    verify(fixed, kafka_settings, plan)
    out = _values(kafka_settings, spec.sink.topic)
    assert len(out) == 2 * RECORDS and set(out) == produced[0] | produced[1]


#: What each kind of fault makes Spark say (the run's error).
CAUSE = {"jvm": "a JVM exception in the transform", "python": "a Python UDF failed at offset",
         "python_kill": "Python worker exited unexpectedly"}

def _run_sql_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point):
    """The SQL sink (SQLite): one database transaction for the run, written from the driver after
    Spark computed everything; a fault anywhere in the read fails the job before it."""
    from sqlalchemy import create_engine, inspect, text

    def values(spec) -> list[bytes]:
        engine = create_engine(spec.sink.url)
        if not inspect(engine).has_table("results"):
            return []
        with engine.connect() as conn:
            return [bytes(v) for (v,) in conn.execute(text("select value from results"))]

    _run_table_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point, values,
                     "sql", key_columns=["topic", "partition", "offset"])


def _run_iceberg_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point, tmp_path):
    """The Iceberg sink: data files written from the driver as Spark's results arrive, then one
    snapshot; a fault anywhere in the read fails the job before that snapshot (the files written so
    far are orphans no snapshot names)."""
    from pyiceberg.catalog.sql import SqlCatalog

    def values(spec) -> list[bytes]:
        catalog = SqlCatalog(spec.sink.catalog, uri=spec.sink.url, warehouse=spec.sink.warehouse)
        return [bytes(v) for v in catalog.load_table("lake.results").scan().to_arrow().column("value").to_pylist()]

    _run_table_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point, values,
                     "iceberg", table="lake.results", warehouse=(tmp_path / "warehouse").as_uri())


def _run_table_fault(spark, kafka_settings, make_spec, transforms_from, unique, kind, point, values, sink_kind,
                     **sink):
    """A sink that commits on the driver, into a table whose ``value`` column ``values(spec)`` reads:
    after the fault no row and no checkpoint; the retry (the fault gone) writes every record once."""
    module = transforms_from(f"faulty_{unique.replace('-', '_')}", FAULTY.format(kind=kind, at=POINTS[point]))
    spec = make_spec(f"{module}:faulty", sink_kind, "atomic", partitions=2, **sink)
    produced = _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    with pytest.raises(Exception) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    assert CAUSE[kind] in str(failed.value), str(failed.value)[-2000:]
    assert values(spec) == []
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id,
                                             [r.tp for r in plan.ranges]).values()) == {None}

    fixed = transforms_from(f"fixed_{unique.replace('-', '_')}", FAULTY.format(kind=kind, at=-1))
    spec = dataclasses.replace(spec, transform=f"{fixed}:faulty")
    run_batch(spark, spec, prepare_plan(spec, kafka_settings, "run-1"), kafka_settings)
    verify(spec, kafka_settings, plan)
    written = [v.decode() for v in values(spec)]
    assert len(written) == 2 * RECORDS and set(written) == produced[0] | produced[1]


QUICK = [("per_partition", "jvm", point) for point in POINTS] + [("sql", "jvm", "mid"), ("iceberg", "jvm", "mid")] + [
    ("per_partition", "python_kill", "boundary"), ("per_partition-two-passes", "jvm", "mid"), ("atomic", "jvm", "mid"),
    ("per_partition-python-writer", "jvm", "mid"), ("per_partition-python-writer", "python_kill", "boundary"),
    ("atomic-python-writer", "python_kill", "mid")]


@pytest.mark.parametrize("commit,kind,point", QUICK)
def test_a_fault_inside_the_read_commits_nothing_of_its_partition(spark, kafka_settings, make_spec, transforms_from,
                                                                  unique, small_batches, commit, kind, point, request):
    _run_fault(spark, kafka_settings, make_spec, transforms_from, unique, commit, kind, point, request)


GRID = [cell for cell in itertools.product(["per_partition", "per_partition-python-writer", "per_partition-two-passes",
                                            "atomic", "atomic-python-writer", "sql", "iceberg"],
                                           ["jvm", "python", "python_kill"], list(POINTS)) if cell not in QUICK]


@pytest.mark.chaos
@pytest.mark.parametrize("commit,kind,point", GRID)
def test_the_whole_grid_of_faults_inside_the_read(spark, kafka_settings, make_spec, transforms_from, unique,
                                                 small_batches, commit, kind, point, request):
    _run_fault(spark, kafka_settings, make_spec, transforms_from, unique, commit, kind, point, request)


def test_a_range_committed_short_fails_its_run_again_naming_the_partition(spark, kafka_settings, make_spec,
                                                                          tmp_path, capsys, monkeypatch):
    """Verify catches what a commit missed: a range an affected version committed short (its
    task's input cut after the first batch, the checkpoint at the range's end). A retry of that run
    used to find the range committed and go green; now it reads the range all the same, Spark
    counts the rows its transform gives, and the run fails naming the partition and the numbers."""
    from kafka_eos.errors import RangeMismatch
    from kafka_eos.manifest import ManifestStore

    spec = make_spec("identity", "kafka", "per_partition", partitions=2)
    _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    src = spec.source.topics[0]
    _commit_first_batch_only(spec, plan, kafka_settings, 0, monkeypatch)

    with pytest.raises(RangeMismatch) as found:
        run_batch(spark, spec, plan, kafka_settings)
    message = str(found.value)
    assert "\n" not in message
    assert message.startswith(f"{src}-0 [0, {RECORDS}) of run 'run-1': Spark's transform gave {RECORDS} rows")
    assert f"wrote {BATCH_ROWS} results and 0 dead letters: {RECORDS - BATCH_ROWS} rows are not in the output" in message
    record, _parts = ManifestStore.of(spec, kafka_settings).run_records("run-1")
    assert record["mismatch"] == message
    with pytest.raises(RangeMismatch, match=f"^{src}-0 "):  # the DAG's verify task, the CLI's verify
        verify(spec, kafka_settings, plan)
    # The neighbour committed in full, once.
    assert len([v for v in _values(kafka_settings, spec.sink.topic) if v.startswith("1:")]) == RECORDS

    # The operator's audit finds the run: partition 0 short by 2,000 records, without a proof of
    # read; partition 1 whole. Exit 3, for scripts.
    import json

    import yaml

    from kafka_eos.cli import main
    from kafka_eos.spec import spec_document

    path = tmp_path / f"{spec.name}.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    capsys.readouterr()
    code = main(["audit", str(path), "--run-id", "run-1", "--json", "--bootstrap", kafka_settings.bootstrap_servers])
    printed = capsys.readouterr()
    assert code == 3, printed
    audit = json.loads(printed.out)
    by_partition = {a["partition"]: a for a in audit["ranges"]}
    assert (by_partition[0]["holds"], by_partition[0]["written"], by_partition[0]["verdict"], by_partition[0]["proven"]) \
        == (RECORDS, BATCH_ROWS, "short", False)
    assert (by_partition[1]["holds"], by_partition[1]["written"], by_partition[1]["verdict"], by_partition[1]["proven"]) \
        == (RECORDS, RECORDS, "whole", True)
    assert [a["partition"] for a in audit["short"]] == [0]
    assert by_partition[0]["resume_at"] == BATCH_ROWS  # the first record not written (offsets 0.. are contiguous here)
    assert by_partition[1]["resume_at"] is None

    # The finding holds the pipeline: the run's retry, and any later run, plans nothing until an
    # operator acknowledges it; the CLI exits 4 (a person must act: a retry cannot help).
    from kafka_eos.errors import PipelineHeld

    with pytest.raises(PipelineHeld) as held:
        prepare_plan(spec, kafka_settings, "run-2")
    assert str(held.value).startswith(f"pipeline {spec.name} is held since ")
    assert message in str(held.value) and str(held.value).endswith(f"kafka-eos acknowledge {spec.name} --yes")
    code = main(["run", str(path), "--bootstrap", kafka_settings.bootstrap_servers])
    printed = capsys.readouterr()
    assert code == 4 and printed.err.splitlines()[-1].startswith(f"kafka-eos: pipeline {spec.name} is held since "), \
        printed

    # Acknowledged, and a later run planned: the audit still finds run 1, by its id and among the
    # last runs (its walk passes the later run's plan), and names a run the manifest does not have.
    store = ManifestStore.of(spec, kafka_settings)
    state = store.state()
    store.acknowledge(state.held, state.read_upto, who="test", at="now")
    prepare_plan(spec, kafka_settings, "run-2")
    bootstrap = ["--bootstrap", kafka_settings.bootstrap_servers]
    for selected in (["--run-id", "run-1"], ["--last", "10"]):
        code = main(["audit", str(path), *selected, "--json", *bootstrap])
        printed = capsys.readouterr()
        assert code == 3, printed
        assert [(a["run_id"], a["partition"], a["verdict"]) for a in json.loads(printed.out)["ranges"]] == [
            ("run-1", 0, "short"), ("run-1", 1, "whole")], printed
    assert main(["audit", str(path), "--run-id", "run-0", *bootstrap]) == 1
    assert capsys.readouterr().err.strip().endswith(f"pipeline {spec.name} has no run 'run-0' in its manifest "
                                                    f"{spec.manifest_topic!r}")


def _commit_first_batch_only(spec, plan, kafka_settings, partition: int, monkeypatch) -> None:
    """Partition ``partition`` of ``plan`` committed as an affected version committed it: its
    task's input cut after the first batch (:data:`BATCH_ROWS` rows), the checkpoint at the range's
    end, a manifest record without the proof of read's ``read`` field."""
    import pyarrow as pa

    from kafka_eos.sinks import per_partition

    src = spec.source.topics[0]
    first_batch = pa.RecordBatch.from_pydict({
        "key": [f"k{i}".encode() for i in range(BATCH_ROWS)],
        "value": [f"{partition}:{i}:{PAD}".encode() for i in range(BATCH_ROWS)],
        "topic": [src] * BATCH_ROWS, "partition": pa.array([partition] * BATCH_ROWS, pa.int32()),
        "offset": pa.array(range(BATCH_ROWS), pa.int64()), "dlq_reason": pa.array([None] * BATCH_ROWS, pa.string())})
    with monkeypatch.context() as patched:
        patched.setattr(per_partition, "committed_record", lambda out, dead: {
            "status": "committed", "records_out": out, "dead_letters": dead, "records_in": out + dead})
        per_partition.commit_partition(spec, plan, kafka_settings, next(r for r in plan.active if r.partition == partition),
                                       [first_batch])


REFUSING = '''
from pyspark.sql import functions as F


def refusing(df):
    bad = (F.col("partition") == 0) & (F.col("offset") == 5)
    return df.select("key", "value", "topic", "partition", "offset",
                     F.when(bad, F.lit("a record this transform refuses")).otherwise(F.lit(None).cast("string"))
                     .alias("dlq_reason"))
'''


def test_a_refusal_in_the_same_run_does_not_hide_a_range_committed_short(spark, kafka_settings, make_spec,
                                                                         transforms_from, unique, monkeypatch):
    """A run whose task refuses (partition 0: a dead letter and no dead-letter topic) still checks
    the partitions that committed before it fails: partition 1, committed short by an earlier
    attempt, is found and holds the pipeline. Before, the refusal was raised first, and a later
    run under another id never looked at partition 1's range again."""
    from kafka_eos.errors import PipelineHeld, RangeMismatch

    module = transforms_from(f"refusing_{unique.replace('-', '_')}", REFUSING)
    spec = make_spec(f"{module}:refusing", "kafka", "per_partition", partitions=2, dlq_topic=None)
    src = spec.source.topics[0]
    _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    _commit_first_batch_only(spec, plan, kafka_settings, 1, monkeypatch)

    with pytest.raises(RangeMismatch) as found:
        run_batch(spark, spec, plan, kafka_settings)
    message = str(found.value)
    assert "\n" not in message
    assert message.startswith(f"{src}-1 [0, {RECORDS}) of run 'run-1': Spark's transform gave {RECORDS} rows"), message
    assert f"; the run also refused a partition: {src}-0 offset 5: dead letter (" in message, message
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(src, 0)])[(src, 0)] is None
    with pytest.raises(PipelineHeld, match=f"^pipeline {spec.name} is held since .*: {src}-1 "):
        prepare_plan(spec, kafka_settings, "run-2")


MIXED = '''
from pyspark.sql import functions as F


def mixed(df):
    bad = (F.col("partition") == 0) & (F.col("offset") == 5)
    moved = (F.col("partition") == 0) & (F.col("offset") >= 1500)  # in the task's second Arrow batch
    return df.select("key", "value", "topic", F.when(moved, F.lit(1)).otherwise(F.col("partition")).alias("partition"),
                     "offset", F.when(bad, F.lit("a record this transform refuses")).otherwise(F.lit(None).cast("string"))
                     .alias("dlq_reason"))
'''


def test_a_refusal_whose_later_rows_name_another_partition_holds_nothing(spark, kafka_settings, make_spec,
                                                                       transforms_from, unique, small_batches):
    """Spark counts rows by the partition they name. Partition 0's task refuses a dead letter in its
    first batch; rows of its second batch name partition 1, so Spark's count of partition 1 holds
    them too, and partition 1's own commit (whole) would look short. The refused task reads the
    rest of its input and says so: the run fails with the refusal, as before, and nothing is held."""
    from kafka_eos.errors import DeadLetterWithoutTopic
    from kafka_eos.manifest import ManifestStore

    module = transforms_from(f"mixed_{unique.replace('-', '_')}", MIXED)
    spec = make_spec(f"{module}:mixed", "kafka", "per_partition", partitions=2, dlq_topic=None)
    src = spec.source.topics[0]
    produced = _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    with pytest.raises(DeadLetterWithoutTopic, match=f"^{src}-0 offset 5: dead letter .*committed by their own "
                                                      f"transactions: {src}-1$"):
        run_batch(spark, spec, plan, kafka_settings)
    assert ManifestStore.of(spec, kafka_settings).state().held is None
    assert sorted(_values(kafka_settings, spec.sink.topic)) == sorted(produced[1])


def test_a_stream_that_commits_a_range_short_stops_and_stays_held_until_acknowledged(
        spark, kafka_settings, make_spec, tmp_path, capsys, monkeypatch):
    """A stream's batches all run as run ``stream``, so the next batch's run record replaces the
    last one's. A batch whose partition's transaction wrote fewer records than Spark gave it (a
    lab fault: the driver's commit drops the second half of partition 0's rows) stops the stream,
    and the finding holds the pipeline under a key of its own: a restarted stream (an Airflow retry)
    and a batch run refuse to plan, a snapshot of the manifest's memory keeps it, until an operator
    acknowledges it. Then the stream goes on from its checkpoint: the records the short commit lost
    stay lost (the hold was for a person to repair them), nothing is written twice."""
    import json

    import yaml

    from kafka_eos.audit import AUDIT_TOPIC
    from kafka_eos.backfill.reset import reset_checkpoint
    from kafka_eos.cli import main
    from kafka_eos.errors import PipelineHeld, RangeMismatch
    from kafka_eos.manifest import ManifestStore
    from kafka_eos.overview.snapshot import snapshot
    from kafka_eos.sinks import per_partition
    from kafka_eos.spec import spec_document
    from kafka_eos.stream.loop import STREAM_RUN_ID, StreamRunner

    spec = make_spec("identity", "kafka", "per_partition", partitions=2)
    src = spec.source.topics[0]
    produced = _source(kafka_settings, spec)
    commit_rowless = per_partition.commit_rowless
    kept: list[str] = []

    def short(spec_, plan, settings, ranges, keep=False, dead=None):
        """The driver's commit of a small stream batch, losing the second half of partition 0's rows."""
        dead = dict(dead or {})
        if dead.get((src, 0)):
            rows = sum(len(part) for part in dead[(src, 0)])
            first = dead[(src, 0)][0]
            dead[(src, 0)] = [first.slice(0, len(first) // 2)]
            kept.extend(v.decode() for v in dead[(src, 0)][0].column("value").to_pylist())
            assert len(kept) < rows
        return commit_rowless(spec_, plan, settings, ranges, keep, dead)

    store = ManifestStore.of(spec, kafka_settings)
    store.ensure_topic()
    before = store.state()  # a snapshot of this, written after the hold, must not hide it
    monkeypatch.setattr(per_partition, "commit_rowless", short)
    with pytest.raises(RangeMismatch) as found:
        StreamRunner(spark, spec, kafka_settings, interval_s=0.1, stop_when_caught_up=True).run()
    monkeypatch.undo()
    message = str(found.value)
    assert message.startswith(f"{src}-0 [0, {RECORDS}) of run {STREAM_RUN_ID!r}: Spark's transform gave {RECORDS} "
                              f"rows"), message
    assert f"{RECORDS - len(kept)} rows are not in the output" in message

    # A restarted stream refuses before its first plan, naming the finding and what ends it.
    lines: list[str] = []
    with pytest.raises(PipelineHeld) as held:
        StreamRunner(spark, spec, kafka_settings, interval_s=0.1, stop_when_caught_up=True, report=lines.append).run()
    assert message in str(held.value) and str(held.value).endswith(f"kafka-eos acknowledge {spec.name} --yes")
    assert lines == []  # no batch ran
    store.put_snapshot(before)  # a snapshot read before the hold and written after it (a plan's meanwhile)
    assert store.state().held["mismatch"] == message
    store.put_snapshot(store.state())  # a snapshot written since keeps the hold
    assert store.state().held["mismatch"] == message
    # The operator page's read, and `kafka-eos pipelines`' (its last run only: the hold is newer).
    assert [snapshot(kafka_settings, [spec], runs=n)[0]["held"]["mismatch"] for n in (10, 1)] == [message] * 2
    # A checkpoint reset (a repair) keeps the hold: its snapshot forgets the checkpoints, not the hold.
    reset_checkpoint(spec, kafka_settings, {(src, 0): RECORDS}, run_id="reset-1", asked="offsets", who="test",
                     via="test")
    assert store.state().held["mismatch"] == message
    path = tmp_path / f"{spec.name}.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    bootstrap = ["--bootstrap", kafka_settings.bootstrap_servers]
    capsys.readouterr()
    for command in ("stream", "run"):  # the stream's CLI (before it starts Spark), and a batch run
        assert main([command, str(path), *bootstrap]) == 4, command
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"kafka-eos: pipeline {spec.name} is held since ")
    assert main(["plan", str(path), "--json", *bootstrap]) == 0  # a look at the next plan says so
    assert json.loads(capsys.readouterr().out)["held"]["mismatch"] == message

    # The operator: a dry run shows the finding (exit 3 while held), --yes acknowledges it.
    assert main(["acknowledge", str(path), *bootstrap]) == 3
    printed = capsys.readouterr().out
    assert printed.startswith(f"pipeline {spec.name} is held since ") and message in printed
    assert main(["acknowledge", str(path), "--yes", "--note", "replayed from the audit's resume_at", "--json",
                 *bootstrap]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["held"] is None and done["acknowledged"]["mismatch"] == message
    assert done["acknowledged"]["held"] is False and done["acknowledged"]["acknowledged_by"]
    audit = [json.loads(m.value) for m in read_committed(kafka_settings, AUDIT_TOPIC)
             if m.key.decode() == f"acknowledge:{spec.name}:{done['acknowledged']['acknowledged_at']}"]
    assert [(a["action"], a["run_id"], a["note"]) for a in audit] == [
        ("acknowledge_hold", STREAM_RUN_ID, "replayed from the audit's resume_at")]
    assert main(["acknowledge", str(path), *bootstrap]) == 0
    assert capsys.readouterr().out.strip() == f"pipeline {spec.name} is not held"

    # The stream goes on from its checkpoint (the range's end): the new records once each.
    more = _source(kafka_settings, spec, first=RECORDS)
    StreamRunner(spark, spec, kafka_settings, interval_s=0.1, stop_when_caught_up=True).run()
    out = _values(kafka_settings, spec.sink.topic)
    assert sorted(out) == sorted([*kept, *produced[1], *more[0], *more[1]])
    assert store.state().held is None and snapshot(kafka_settings, [spec])[0]["held"] is None


KILLING = '''
import os
import signal

from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

AT = {at}


def _jvm_of(pid):
    """The nearest ancestor of ``pid`` that is a JVM (the Spark executor this Python worker serves)."""
    while pid > 1:
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            if b"java" in f.read().split(b"\\0")[0]:
                return pid
        with open(f"/proc/{{pid}}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return None


def _check(partition, offset):
    if partition == 0 and offset == AT:
        os.kill(_jvm_of(os.getpid()), signal.SIGKILL)  # the executor lost, as when its host dies
    return True


check = F.udf(_check, BooleanType())


def killing(df):
    return df.where(check(F.col("partition"), F.col("offset"))).select(
        "key", "value", "topic", "partition", "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["boundary", "mid", "last"])
def test_an_executor_killed_mid_read_commits_nothing_of_its_partition(spark, kafka_settings, make_spec, tmp_path,
                                                                      monkeypatch, point):
    """spark-submit (the executor is the application's JVM in local mode), per_partition in one pass:
    a Python UDF kills the JVM at ``point`` of partition 0's input. The tasks' Python workers see
    their input end; none may commit. The same plan again: every record once."""
    from integration.test_faults import spark_submit, write_spec_file

    module = f"killing_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(KILLING.format(at=POINTS[point]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    spec = make_spec(f"{module}:killing", "kafka", "per_partition", partitions=2)
    produced = _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    killed = spark_submit(write_spec_file(spec, tmp_path / "spec.yaml"), plan_file, kafka_settings, None)
    assert killed.returncode != 0, killed.stdout[-2000:]

    fixed = dataclasses.replace(spec, transform="identity")
    run_batch(spark, fixed, prepare_plan(fixed, kafka_settings, "run-1"), kafka_settings)
    verify(fixed, kafka_settings, plan)
    out = _values(kafka_settings, spec.sink.topic)
    assert len(out) == 2 * RECORDS and set(out) == produced[0] | produced[1]




def test_records_deleted_by_retention_mid_run_commit_nothing_of_their_partition(spark, kafka_settings, make_spec):
    """The range's records deleted on the broker after the plan was made, before its task read
    them (the Kafka read's failOnDataLoss fails the task at its first fetch, before any row reaches
    Python). Before the proof of read the task saw no row and committed the range empty, its
    checkpoint past records it never read. Now nothing of the partition is committed, and the next
    plan stops at the records that are gone (on_data_loss decides), not a silent skip."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from kafka_eos.errors import DataLossError

    spec = make_spec("identity", "kafka", "per_partition", partitions=2)
    src = spec.source.topics[0]
    first = _source(kafka_settings, spec)
    run_batch(spark, spec, prepare_plan(spec, kafka_settings, "run-1"), kafka_settings)
    _source(kafka_settings, spec, first=RECORDS)
    plan = prepare_plan(spec, kafka_settings, "run-2")
    admin = AdminClient(kafka_settings.client_config())
    for future in admin.delete_records([TopicPartition(src, 0, RECORDS + RECORDS // 2)]).values():
        future.result(30)  # retention, as a short retention.ms or an operator's delete-records does it

    with pytest.raises(Exception) as failed:
        run_batch(spark, spec, plan, kafka_settings)
    assert "Some data may have been lost" in str(failed.value) or "OffsetOutOfRange" in str(failed.value), \
        str(failed.value)[-2000:]
    _fence_partitions(kafka_settings, spec, plan)  # a task's Python worker still at work commits nothing after
    out = _values(kafka_settings, spec.sink.topic)
    assert sorted(v for v in out if v.startswith("0:")) == sorted(first[0])  # run-1's, nothing of run-2's
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(src, 0)])[(src, 0)] == RECORDS
    with pytest.raises(DataLossError, match=f"{src}-0"):  # the next plan names the records that are gone
        prepare_plan(spec, kafka_settings, "run-3")



ONCE = '''
import os

from pyspark.sql import functions as F

AT, MARK = {at}, {mark!r}


def once(df):
    """A JVM exception at offset AT of partition 0, in the first batch planned only (decided on the
    driver, where the stream calls the transform for each batch)."""
    if not os.path.exists(MARK):
        open(MARK, "w").close()
        hit = (F.col("partition") == 0) & (F.col("offset") == AT)
        df = df.where(F.when(hit, F.raise_error(F.lit("a JVM exception in the transform, once"))).otherwise(F.lit(True)))
    return df.select("key", "value", "topic", "partition", "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''


def test_a_stream_batch_whose_read_fails_commits_nothing_and_the_restart_writes_every_record(
        spark, kafka_settings, make_spec, transforms_from, unique, tmp_path):
    """A stream's batch large enough for its executors to commit (over 20,000 planned offsets),
    its transform failing mid-read of partition 0 (once): the stream stops on the error with nothing
    of partition 0 committed; started again, it writes every record once."""
    from kafka_eos.stream.loop import StreamRunner

    records = 12_000  # per partition: 24,000 planned offsets, more than DRIVER_BATCH_OFFSETS
    at = records - 500  # in the range's second Arrow batch: the first reached the task
    module = transforms_from(f"once_{unique.replace('-', '_')}", ONCE.format(at=at, mark=str(tmp_path / "failed-once")))
    spec = make_spec(f"{module}:once", "kafka", "per_partition", partitions=2)
    src = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"linger.ms": 20}))
    for p, i in itertools.product((0, 1), range(records)):
        producer.produce(src, value=f"{p}:{i}:{PAD}".encode(), partition=p)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    settle(kafka_settings, src)

    with pytest.raises(Exception, match="a JVM exception in the transform, once"):
        StreamRunner(spark, spec, kafka_settings, interval_s=0.1, stop_when_caught_up=True).run()
    assert (tmp_path / "failed-once").exists()
    StreamRunner(spark, spec, kafka_settings, interval_s=0.1, stop_when_caught_up=True).run()
    out = _values(kafka_settings, spec.sink.topic)
    assert len(out) == 2 * records and len(set(out)) == 2 * records


def test_a_task_the_proof_gave_no_partition_refuses_the_rows_it_meets(spark, kafka_settings, make_spec,
                                                                      monkeypatch):
    """One pass with a task layout that does not match the job Spark runs (a Connect server plans
    the job again): a task the proof gave no source partition used to return at once, dropping the
    rows it was given, and the driver then committed their range offsets-only. Now it refuses them:
    the run fails, and nothing of that range is committed."""
    from kafka_eos.errors import SpecError
    from kafka_eos.sinks import per_partition

    spec = make_spec("identity", "kafka", "per_partition", partitions=2)
    src = spec.source.topics[0]
    _source(kafka_settings, spec)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    real = per_partition.lineage_owner

    def shifted(df, plan):  # the second range's task index is not the one Spark runs it in
        owner = real(df, plan)
        last = max(owner)
        return {**{i: tp for i, tp in owner.items() if i != last}, last + 7: owner[last]}

    monkeypatch.setattr(per_partition, "lineage_owner", shifted)
    with pytest.raises(SpecError, match="which the proof of the task layout gave no source partition"):
        run_batch(spark, spec, plan, kafka_settings)
    _fence_partitions(kafka_settings, spec, plan)
    checkpoints = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.ranges])
    shifted_tp = [tp for tp, ck in checkpoints.items() if ck is None]
    assert len(shifted_tp) == 1, checkpoints  # the other partition committed whole, in its own transaction
    assert not [v for v in _values(kafka_settings, spec.sink.topic) if v.startswith(f"{shifted_tp[0][1]}:")]
