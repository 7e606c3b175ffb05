"""An atomic Kafka transaction opens when the results are ready, and its timeout is a spec
setting the brokers must accept."""

from __future__ import annotations

import pytest

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import SpecError
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders

pytestmark = pytest.mark.integration

SLOW = '''
import time
from pyspark.sql import functions as F

@F.udf("binary")
def _slowly(value):
    time.sleep(0.1)
    return value

def slow_identity(df):
    return df.select("key", _slowly("value").alias("value"), "headers", "topic", "partition", "offset",
                     F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.fixture
def slow_transform(transforms_from):
    return transforms_from("slow_transforms", SLOW) + ":slow_identity"


def test_spark_time_does_not_count_against_an_atomic_transaction(spark, kafka_settings, make_spec, slow_transform):
    """Before: the transaction was open while Spark computed (here about 10 s of UDF time against a
    2 s timeout): the coordinator aborted it on every try, and the pipeline could never catch up."""
    spec = make_spec(slow_transform, "kafka", "atomic", transaction_timeout_s=2)
    produce_orders(kafka_settings, spec.source.topics[0], 200, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 200)
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 200


def test_a_timeout_above_the_brokers_limit_fails_before_spark(spark, kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "atomic", transaction_timeout_s=3600)
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(SpecError, match=r"sink.transaction_timeout_s: 3600 is above the brokers' "
                                        r"transaction.max.timeout.ms \(900 s\)"):
        run_batch(spark, spec, plan, kafka_settings)
    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}
