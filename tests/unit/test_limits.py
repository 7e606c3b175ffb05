"""How a Kafka sink measures a record before produce(): as librdkafka does (its own produce()
refuses what is larger than message.max.bytes; no broker needed for that check), and which
rows of an Arrow batch it turns into reference dead letters."""

from __future__ import annotations

import dataclasses
import json
import random

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer

from kafka_eos.errors import DeadLetterWithoutTopic, RecordRefused
from kafka_eos.sinks.limits import record_size, refusing
from kafka_eos.spec import parse_spec
from kafka_eos.transforms import DLQ_REASON

LIMIT = 100_000


def _librdkafka_takes(key, value, headers) -> bool:
    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": LIMIT, "log_level": 0})
    try:
        producer.produce("t", key=key, value=value, headers=headers)
    except KafkaException:
        return False
    return True


@pytest.mark.parametrize("key, headers", [(None, None), (b"k" * 10, None), (b"k", [("abc", b"v" * 10)]),
                                          (b"key", [("a" * 70, b"w" * 300), ("b", None), ("c", b"")])])
def test_record_size_is_librdkafkas_measure(key, headers):
    base = record_size(key, b"", headers)
    largest = LIMIT - base  # the largest value librdkafka takes with this key and headers
    assert _librdkafka_takes(key, b"x" * largest, headers)
    assert not _librdkafka_takes(key, b"x" * (largest + 1), headers)
    assert record_size(key, b"x" * largest, headers) == LIMIT


SPEC = parse_spec({"name": "p", "source": {"topics": ["in"]}, "transform": "identity",
                   "sink": {"kind": "kafka", "topic": "out", "dlq_topic": "dlq"}}, "p.yaml")


def _spec(**sink):
    return dataclasses.replace(SPEC, sink=dataclasses.replace(SPEC.sink, **sink))


def _batch(values: list[bytes], reasons: list[str | None] | None = None) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "key": pa.array([b"k%d" % i for i in range(n)], pa.binary()), "value": pa.array(values, pa.binary()),
        "topic": ["in"] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        DLQ_REASON: pa.array(reasons or [None] * n, pa.string())})


def test_a_batch_without_large_records_comes_back_as_it_is():
    batch = _batch([b"a", b"b" * 1000])
    assert refusing(batch, _spec(record_limits=(("out", LIMIT, 0), ("dlq", LIMIT, 0)))) is batch


def test_a_record_too_large_becomes_a_reference_dead_letter_and_the_others_stay():
    spec = _spec(record_limits=(("out", LIMIT, 0), ("dlq", LIMIT, 0)))
    out = refusing(_batch([b"a", b"x" * LIMIT, b"c"]), spec).to_pylist()
    assert [r["value"] for r in (out[0], out[2])] == [b"a", b"c"] and out[0][DLQ_REASON] is None
    reason = out[1][DLQ_REASON]
    assert reason == (f"refused by the sink: in-0 offset 1: its record for topic out is {LIMIT + 38:,} bytes, more "
                      f"than the producer's message.max.bytes {LIMIT:,}")
    assert json.loads(out[1]["value"])["source"] == {"topic": "in", "partition": 0, "offset": 1}
    assert out[1]["key"] == b"k1"


def test_a_dead_letter_too_large_for_the_dead_letter_topic_keeps_its_first_reason():
    spec = _spec(record_limits=(("out", LIMIT, 0), ("dlq", LIMIT, 0)))
    (row,) = refusing(_batch([b"x" * LIMIT], ["malformed JSON"]), spec).to_pylist()
    assert row[DLQ_REASON].startswith("refused by the sink: in-0 offset 0: its dead letter for topic dlq is ")
    assert row[DLQ_REASON].endswith("; dead-lettered first for: malformed JSON")


def test_a_large_record_that_compresses_below_the_topics_limit_is_written():
    spec = _spec(record_limits=(("out", 10 * LIMIT, LIMIT), ("dlq", 10 * LIMIT, LIMIT)))
    out = refusing(_batch([b"x" * 2 * LIMIT, random.Random(0).randbytes(2 * LIMIT)]), spec).to_pylist()
    assert out[0][DLQ_REASON] is None
    assert "compressed, more than the topic's max.message.bytes 100,000" in out[1][DLQ_REASON]


def test_fail_or_no_dead_letter_topic_raise_naming_the_record():
    limits = (("out", LIMIT, 0),)
    with pytest.raises(RecordRefused, match=r"^in-0 offset 1: its record for topic out is 100,038 bytes, .*: fail"):
        refusing(_batch([b"a", b"x" * LIMIT]), _spec(record_limits=limits, on_refused_record="fail"))
    with pytest.raises(DeadLetterWithoutTopic, match=r"^in-0 offset 0: .* has no sink.dlq_topic"):
        refusing(_batch([b"x" * LIMIT]), _spec(record_limits=limits, dlq_topic=None))


def test_headers_count_toward_a_records_size():
    """A record whose carried headers make it too large is refused like one whose value does."""
    spec = _spec(record_limits=(("out", LIMIT, 0), ("dlq", LIMIT, 0)))
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = _batch([b"a", b"b"]).append_column(
        "headers", pa.array([[{"key": "h", "value": b"v"}], [{"key": "big", "value": b"x" * LIMIT}]], header_type))
    roomy = _spec(record_limits=(("out", 10 * LIMIT, 0), ("dlq", 10 * LIMIT, 0)))
    assert refusing(batch, roomy) is batch  # under every limit: the batch as it is, no row in Python
    out = refusing(batch, spec).to_pylist()
    assert out[0][DLQ_REASON] is None and out[0]["headers"] == [{"key": "h", "value": b"v"}]
    assert out[1][DLQ_REASON].startswith("refused by the sink: in-0 offset 1: its record for topic out is ")
    assert out[1]["headers"] is None


def test_the_bound_of_a_batch_with_headers_covers_its_largest_record():
    """The bound (computed on Arrow's buffers: offsets summed per row, no group-by) is at least the
    record_size of every row, sliced or not, with null and empty header lists and null values."""
    from kafka_eos.sinks.limits import _bound

    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    headers = [[{"key": "trace", "value": b"t" * 30}], None, [], [{"key": "a" * 40, "value": None},
                                                               {"key": "b", "value": b"v" * 90}]]
    b = _batch([b"x", b"y" * 50, b"z", b"w"]).append_column("headers", pa.array(headers, headers_type))
    for sliced in (b, b.slice(1), b.slice(2, 1), b.slice(3)):
        rows = sliced.to_pylist()
        largest = max(record_size(r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"] or ()])
                      for r in rows)
        assert largest <= _bound(sliced, SPEC) <= largest + 200
