"""Spark's reads of planned ranges: pooled consumers under kafka-eos's group ids; the columns the sinks take."""

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


def test_the_sinks_columns_carry_a_record_without_headers_as_an_empty_list(spark):
    """``batches.prepared``: a null ``headers`` (Kafka's reader gives it for a record without
    headers) becomes an empty list, which Spark's Arrow writer measures per row in constant time;
    carried headers pass unchanged, and the batches reach Python with the same rows."""
    from pyspark.sql import functions as F

    from kafka_eos.sinks import batches

    headers = "array<struct<key:string,value:binary>>"
    df = spark.createDataFrame(
        [(b"k0", b"v0", None, "t", 0, 0), (b"k1", b"v1", [("h", b"x")], "t", 0, 1)],
        f"key binary, value binary, headers {headers}, topic string, partition int, offset long",
    ).withColumn("dlq_reason", F.lit(None).cast("string"))
    rows = {r.offset: r for r in batches.prepared(df).collect()}
    assert rows[0].headers == [] and [(h.key, bytes(h.value)) for h in rows[1].headers] == [("h", b"x")]

    def lengths(arrow_batches):
        import pyarrow as pa

        for b in arrow_batches:
            yield pa.RecordBatch.from_arrays([b.column("offset"), b.column("headers").value_lengths()],
                                             ["offset", "n"])

    got = sorted((r.offset, r.n) for r in batches.prepared(df).mapInArrow(lengths, "offset long, n int").collect())
    assert got == [(0, 0), (1, 1)]
    # A run of fewer records than EMPTY_HEADERS_FROM keeps the null (no extra expression per batch).
    small = {r.offset: r for r in batches.prepared(df, records=2).collect()}
    assert small[0].headers is None and len(small[1].headers) == 1
