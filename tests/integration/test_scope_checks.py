"""per_partition scope: one pass where Spark's lineage proves one source partition per task, two
passes where it does not; transforms that shuffle, split or relabel partitions are refused without
loss; a Kafka sink refuses a bad output shape."""

from __future__ import annotations

import json

import pytest

from kafka_eos.batch import run_batch
from kafka_eos.errors import SpecError
from kafka_eos.pipeline import prepare_plan
from kafka_eos.sample_data import produce_orders

pytestmark = [pytest.mark.integration, pytest.mark.quick]

SHUFFLING = '''
from pyspark.sql import functions as F

def shuffled(df):
    return df.repartition(4, "key").withColumn("dlq_reason", F.lit(None).cast("string"))

def missing_columns(df):
    return df.select("key", "value")

def unknown_column(df):
    return df.select("key", F.col("no_such_column").alias("value"))

def unioned(df):
    # No Exchange, but each source partition's rows end up in two Spark tasks.
    cols = ["key", "value", "headers", "topic", "partition", "offset"]
    good = df.where(F.col("offset") % 2 == 0).select(*cols, F.lit(None).cast("string").alias("dlq_reason"))
    bad = df.where(F.col("offset") % 2 == 1).select(*cols, F.lit("odd offset").alias("dlq_reason"))
    return good.unionByName(bad)

def without_partition_1(df):
    # Row-wise (one pass), but every row of source partition 1 is filtered out.
    return df.where(F.col("partition") != 1).select("key", "value", "headers", "topic", "partition", "offset",
                                                    F.lit(None).cast("string").alias("dlq_reason"))

def relabelled(df):
    # No Exchange, one task per source partition, but every row claims partition 0.
    return df.select("key", "value", "headers", "topic", F.lit(0).alias("partition"), "offset",
                     F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.fixture
def transforms_module(transforms_from):
    return transforms_from("scope_transforms", SHUFFLING)


def test_per_partition_rejects_a_shuffling_transform_and_commits_nothing(spark, kafka_settings, admin,
                                                                         make_spec, transforms_module):
    from kafka_eos import kafka_admin

    spec = make_spec(f"{transforms_module}:shuffled", "kafka", "per_partition")
    produce_orders(kafka_settings, spec.source.topics[0], 30, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(SpecError, match=r"shuffles \(an Exchange in its plan\).*use commit: atomic"):
        run_batch(spark, spec, plan, kafka_settings)
    offsets = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.ranges])
    assert set(offsets.values()) == {None}


def test_kafka_sink_names_missing_output_columns(spark, kafka_settings, make_spec, transforms_module):
    spec = make_spec(f"{transforms_module}:missing_columns", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(SpecError, match=r"output lacks column\(s\) topic, partition, offset, dlq_reason"):
        run_batch(spark, spec, plan, kafka_settings)


def test_a_transform_that_cannot_build_its_dataframe_is_named_in_one_line(spark, kafka_settings, make_spec,
                                                                          transforms_module):
    spec = make_spec(f"{transforms_module}:unknown_column", "kafka", "per_partition")
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    from kafka_eos.errors import TransformFailed

    with pytest.raises(TransformFailed) as refused:
        run_batch(spark, spec, plan, kafka_settings)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(f"{spec.path}: transform {transforms_module}:unknown_column failed to build "
                                         "the run's DataFrame: AnalysisException: [UNRESOLVED_COLUMN"), refused.value
    assert "no_such_column" in str(refused.value)


def test_per_partition_rejects_a_union_that_splits_partitions_across_tasks(spark, kafka_settings, admin,
                                                                          make_spec, transforms_module):
    from kafka_eos import kafka_admin

    spec = make_spec(f"{transforms_module}:unioned", "kafka", "per_partition")
    produce_orders(kafka_settings, spec.source.topics[0], 40, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(SpecError, match=r"turns 3 source partitions into 6 Spark partitions"):
        run_batch(spark, spec, plan, kafka_settings)
    offsets = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.ranges])
    assert set(offsets.values()) == {None}


def test_per_partition_in_one_pass_a_task_whose_rows_claim_another_partition_commits_nothing(
        spark, kafka_settings, make_spec, transforms_module):
    """One pass (the lineage proves which task reads which partition): the tasks of partitions 1
    and 2 find rows claiming partition 0 and abort their transactions; partition 0's task holds
    its own rows and commits them, once. Nothing is lost: 1 and 2 stay where they were."""
    from kafka_eos import kafka_admin
    from kafka_eos.batch import transformed
    from kafka_eos.readers import read_committed
    from kafka_eos.sinks import batches, per_partition

    spec = make_spec(f"{transforms_module}:relabelled", "kafka", "per_partition")
    src = spec.source.topics[0]
    produce_orders(kafka_settings, src, 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    assert sum(1 for r in plan.active if not r.empty) == 3
    output = transformed(spark, spec, plan, kafka_settings).results
    assert per_partition.lineage_owner(batches.prepared(output), plan) is not None  # one pass
    with pytest.raises(SpecError, match=rf"puts rows of {src}-0 in the Spark task of {src}-[12]; .*keeps topic "
                                        rf"and partition.*committed by their own transactions: {src}-0$"):
        run_batch(spark, spec, plan, kafka_settings)
    ends = {r.tp: r.until for r in plan.ranges}
    offsets = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends))
    assert offsets == {(src, 0): ends[(src, 0)], (src, 1): None, (src, 2): None}
    source_0 = [m.value for m in read_committed(kafka_settings, src) if m.partition == 0]
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == sorted(source_0)


def test_per_partition_in_one_pass_a_partition_whose_rows_are_all_filtered_out_commits_its_offsets_once(
        spark, kafka_settings, make_spec, transforms_module):
    """One pass, and a transform that keeps no row of partition 1: that task finds no row at its
    end, aborts its transaction, and the driver commits the range's offsets alone (step 4). The
    other partitions' rows are written once; every checkpoint ends at its range's end (past the
    aborted transactions' markers); the same plan again writes nothing more."""
    from kafka_eos import kafka_admin
    from kafka_eos.batch import transformed
    from kafka_eos.readers import read_committed
    from kafka_eos.sinks import batches, per_partition

    spec = make_spec(f"{transforms_module}:without_partition_1", "kafka", "per_partition")
    src = spec.source.topics[0]
    truth = produce_orders(kafka_settings, src, 90, abort_every=3, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    assert sum(1 for r in plan.active if not r.empty) == 3
    output = transformed(spark, spec, plan, kafka_settings).results
    assert per_partition.lineage_owner(batches.prepared(output), plan) is not None  # one pass
    kept = sorted(m.value for m in read_committed(kafka_settings, src) if m.partition != 1)
    assert kept and len(kept) < len(truth.committed)  # partition 1 held committed records too

    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", len(kept), 0)
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == kept
    ends = {r.tp: r.until for r in plan.ranges}
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == ends

    again = run_batch(spark, spec, plan, kafka_settings)  # a retry of the same run: already committed
    assert again.status == "noop", again
    assert sorted(m.value for m in read_committed(kafka_settings, spec.sink.topic)) == kept
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == ends


def test_a_small_stream_batch_commits_its_partitions_from_the_driver_and_refuses_a_relabelling_before_any(
        spark, kafka_settings, make_spec, transforms_module):
    """A stream's batch of few records (per_partition.DRIVER_BATCH_OFFSETS) is collected and each
    partition's transaction runs from the driver, its producer kept there for the next batch; its
    rows are checked as a task checks them, and before anything commits: a transform that relabels
    partitions commits nothing."""
    from kafka_eos import kafka_admin
    from kafka_eos.readers import read_committed
    from kafka_eos.sinks import per_partition
    from kafka_eos.sinks.scope import sink_of

    spec = make_spec("identity", "kafka", "per_partition")
    sink = sink_of(spec, kafka_settings, keep=True)  # a stream's sink: its commits kept between batches
    src = spec.source.topics[0]
    committed = []
    for first, run_id, producers in ((0, "s1", {"built": 3}), (1000, "s2", {"kept": 3})):  # producers kept
        truth = produce_orders(kafka_settings, src, 90, first_seq=first, abort_every=4,
                               malformed_every=0, transactional_id=f"{run_id}-{spec.name}")
        plan = prepare_plan(spec, kafka_settings, run_id)
        assert sum(r.until - r.from_offset for r in plan.active) <= per_partition.DRIVER_BATCH_OFFSETS
        summary = run_batch(spark, spec, plan, kafka_settings, sink)
        assert (summary.status, summary.records_out, summary.producers) == ("committed", len(truth.committed),
                                                                           producers)
        committed += [o["order_id"] for o in truth.committed]
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert sorted(out) == sorted(committed)  # every committed order once, none of an aborted transaction
    ends = {r.tp: r.until for r in plan.ranges}
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == ends

    # The same pipeline with a transform that relabels partitions, over the next records.
    relabel = make_spec(f"{transforms_module}:relabelled", "kafka", "per_partition")
    produce_orders(kafka_settings, src, 60, first_seq=2000, abort_every=0, malformed_every=0, transactional_id="r")
    plan = prepare_plan(relabel, kafka_settings, "s3")
    sink = sink_of(relabel, kafka_settings, keep=True)
    assert plan.active and all(r.from_offset == ends[r.tp] for r in plan.active)
    with pytest.raises(SpecError, match=r"keeps topic and partition.*; no partition of this run was committed$"):
        run_batch(spark, relabel, plan, kafka_settings, sink)
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == ends
    assert len(read_committed(kafka_settings, spec.sink.topic)) == len(committed)


def test_per_partition_in_two_passes_decides_which_task_holds_which_partition_before_any_commit(
        spark, kafka_settings, make_spec, transforms_module, two_passes):
    """Where the lineage proves nothing, the cached output is scanned first. Before the scan: the
    first task committed partition 0, the others found it committed and dropped their rows, and
    the error came after that commit."""
    from kafka_eos import kafka_admin
    from kafka_eos.readers import read_committed
    spec = make_spec(f"{transforms_module}:relabelled", "kafka", "per_partition")
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    assert sum(1 for r in plan.active if not r.empty) == 3
    with pytest.raises(SpecError, match=r"in two Spark tasks"):
        run_batch(spark, spec, plan, kafka_settings)
    offsets = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.ranges])
    assert set(offsets.values()) == {None}
    assert read_committed(kafka_settings, spec.sink.topic) == []


def _jobs_of(spark, group: str, run) -> int:
    """How many Spark jobs ``run()`` started (under a job group of its own)."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


@pytest.mark.parametrize("one_pass", [True, False])
def test_per_partition_reads_and_commits_in_one_spark_job_where_the_lineage_proves_the_tasks(
        spark, kafka_settings, make_spec, request, unique, one_pass):
    """A row-wise transform's run is one Spark job: each task opens its partition's transaction,
    produces as it reads and transforms, and commits; no cache, no scan. Where the lineage proves
    nothing, two jobs (the scan, then the commit). Both exactly once."""
    from kafka_eos import kafka_admin
    from kafka_eos.readers import read_committed

    if not one_pass:
        request.getfixturevalue("two_passes")
    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", "per_partition", partitions=4)
    src = spec.source.topics[0]
    truth = produce_orders(kafka_settings, src, 200, abort_every=3, malformed_every=13)
    plan = prepare_plan(spec, kafka_settings, "r1")
    summaries = []
    jobs = _jobs_of(spark, unique, lambda: summaries.append(run_batch(spark, spec, plan, kafka_settings)))
    assert jobs == (1 if one_pass else 2)
    (summary,) = summaries
    assert (summary.status, summary.records_out, summary.dead_letters) == (
        "committed", len(truth.committed), truth.malformed)
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert sorted(out) == sorted(o["order_id"] for o in truth.committed)
    assert len(read_committed(kafka_settings, spec.sink.dlq_topic)) == truth.malformed
    ends = {r.tp: r.until for r in plan.ranges}
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)) == ends


def test_the_lineage_proves_one_partition_per_task_only_for_one_to_one_steps(
        spark, kafka_settings, make_spec, transforms_module):
    """The proof names each task's partition for a row-wise transform, and proves nothing for a
    union (a partition's rows in two tasks) or a read split into several tasks per partition."""
    from kafka_eos.batch import transformed
    from kafka_eos.sinks import batches
    from kafka_eos.sinks.per_partition import lineage_owner, proven_dataframe
    from kafka_eos.spark_io import read_layout, read_ranges

    spec = make_spec("spark_apps.transforms.orders:enrich", "kafka", "per_partition")
    produce_orders(kafka_settings, spec.source.topics[0], 90, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    output = transformed(spark, spec, plan, kafka_settings).results
    owner = lineage_owner(batches.prepared(output), plan)
    assert owner is not None and sorted(owner.values()) == sorted(r.tp for r in plan.active if not r.empty)
    assert len(owner) == batches.prepared(output).rdd.getNumPartitions()
    # The commit job runs the RDD the proof walked, not a plan made again: its plan is a scan of
    # that RDD, its lineage the same read, its rows the same.
    prepared = batches.prepared(output)
    proven = proven_dataframe(prepared)
    assert "Scan ExistingRDD" in proven._jdf.queryExecution().executedPlan().toString()
    assert read_layout(proven) == read_layout(prepared)
    assert sorted(proven.collect()) == sorted(prepared.collect())

    union = make_spec(f"{transforms_module}:unioned", "kafka", "per_partition")
    produce_orders(kafka_settings, union.source.topics[0], 90, abort_every=0, malformed_every=0)
    union_plan = prepare_plan(union, kafka_settings, "r1")
    unioned = transformed(spark, union, union_plan, kafka_settings).results
    assert lineage_owner(batches.prepared(unioned), union_plan) is None

    split = read_ranges(spark, kafka_settings, plan.active, max_records_per_task=10)
    assert lineage_owner(split, plan) is None


def test_plan_of_a_sql_pipeline_creates_nothing(kafka_settings, make_spec, tmp_path):
    from kafka_eos.pipeline import compute_plan

    db = tmp_path / "not-yet" / "sink.db"
    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     table="revenue", key_columns=["minute", "category"], merge="add", url=f"sqlite:///{db}")
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan, drift = compute_plan(spec, kafka_settings, "probe")
    assert not plan.is_empty and drift == []
    assert not db.parent.exists()
