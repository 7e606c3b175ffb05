"""per_partition scope refuses transforms that shuffle; a Kafka sink refuses a bad output shape."""

from __future__ import annotations

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

def unioned(df):
    # No Exchange, but each source partition's rows end up in two Spark tasks.
    cols = ["key", "value", "headers", "topic", "partition", "offset"]
    good = df.where(F.col("offset") % 2 == 0).select(*cols, F.lit(None).cast("string").alias("dlq_reason"))
    bad = df.where(F.col("offset") % 2 == 1).select(*cols, F.lit("odd offset").alias("dlq_reason"))
    return good.unionByName(bad)

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


def test_per_partition_decides_which_task_holds_which_partition_before_any_commit(
        spark, kafka_settings, make_spec, transforms_module):
    """Before: the first task committed partition 0, the others found it committed and dropped
    their rows, and the error came after that commit."""
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


def test_plan_of_a_sql_pipeline_creates_nothing(kafka_settings, make_spec, tmp_path):
    from kafka_eos.pipeline import compute_plan

    db = tmp_path / "not-yet" / "sink.db"
    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     table="revenue", key_columns=["minute", "category"], merge="add", url=f"sqlite:///{db}")
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan, drift = compute_plan(spec, kafka_settings, "probe")
    assert not plan.is_empty and drift == []
    assert not db.parent.exists()
