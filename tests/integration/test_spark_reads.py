"""Spark's reads of planned ranges: pooled consumers under kafka-eos's group ids."""

from __future__ import annotations

import dataclasses

from kafka_eos.pipeline import prepare_plan
from kafka_eos.sample_data import produce_orders
from kafka_eos.spark_io import read_ranges


def test_reads_of_the_same_partitions_with_other_kafka_settings_in_one_session(spark, kafka_settings, make_spec):
    """Spark keys its pool of consumers by group id and partition and fails a task whose Kafka
    parameters differ from the pooled consumer's: a read with other settings gets its own id, and
    a read again with the first settings gets the first consumers back, both whole."""
    spec = make_spec("identity", "kafka", "atomic", partitions=2)
    produce_orders(kafka_settings, spec.source.topics[0], 40, per_transaction=10, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    other = dataclasses.replace(kafka_settings, extra={**kafka_settings.extra, "security.protocol": "PLAINTEXT"})
    assert other.spark_options() != kafka_settings.spark_options()
    reads = []
    for settings in (kafka_settings, other, kafka_settings):
        rows = read_ranges(spark, settings, plan.active).select("partition", "offset", "value").collect()
        reads.append(sorted((r.partition, r.offset, bytes(r.value)) for r in rows))
    assert len(reads[0]) == 40 and len({(p, o) for p, o, _ in reads[0]}) == 40
    assert reads[1] == reads[0] and reads[2] == reads[0]
