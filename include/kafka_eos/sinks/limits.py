"""Records a Kafka sink refuses for their own sake, found before they are produced.

A record larger than the producer's ``message.max.bytes`` is refused by librdkafka at
``produce()``; one larger than its topic's ``max.message.bytes`` by the broker, which fails the
whole transaction. Either way every run of the same range would fail again: the pipeline stops
for good on one record. Both limits are known before anything is produced, so each record is
measured as librdkafka measures it; one that is too large becomes a dead letter that refers to
its source record (topic, partition, offset, size, the reason) instead of carrying a payload the
dead-letter topic could not take either — inside the same transaction, like any poison record —
or, with ``sink.on_refused_record: fail``, fails the run naming the record (nothing committed).

The producer's limit is on the record's uncompressed size, as librdkafka measures it at
``produce()``; the topic's on the batch the broker receives, compressed (the sink's producers use
lz4): a record larger than the topic's limit is measured compressed, as lz4 frames it, and refused
only when that does not fit either.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING

from kafka_eos.errors import DeadLetterWithoutTopic, RecordRefused
from kafka_eos.kafka_admin import topic_config
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.wire import dead_letter_headers

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pyarrow as pa

log = logging.getLogger(__name__)

#: librdkafka's bound on a record's overhead in Kafka's v2 format (length, attributes, timestamp
#: and offset deltas, key and value lengths, header count, as varints): what its produce() adds to
#: key, value and headers before it compares with message.max.bytes (measured on 2.16: 36).
RECORD_OVERHEAD = 36
#: A record batch's own header in the v2 format: a topic's max.message.bytes bounds the batch.
BATCH_OVERHEAD = 61
#: librdkafka's default message.max.bytes.
DEFAULT_PRODUCER_MAX = 1_000_000
#: A refused record's key is kept in its dead letter up to this size (it names the record).
KEPT_KEY_BYTES = 1024
#: Room for a dead letter's own headers (reason and source coordinates) in the quick bound.
DEAD_LETTER_ROOM = 512
#: librdkafka's default batch.size: the most bytes of records it puts in one batch (MessageSet).
DEFAULT_BATCH_SIZE = 1_000_000
#: Room left under a topic's max.message.bytes for a batch's framing (librdkafka counts its
#: protocol framing in batch.size; the v2 batch header alone is :data:`BATCH_OVERHEAD`).
BATCH_FRAMING_ROOM = 1024


def with_record_limits(spec: PipelineSpec, settings: KafkaSettings) -> PipelineSpec:
    """``spec`` with the limits of each topic it writes (``sink.record_limits``): the producer's
    ``message.max.bytes`` and the topic's ``max.message.bytes`` (0 where it cannot be read: an
    ACL may forbid DescribeConfigs; then the producer's limit alone is checked)."""
    sink = spec.sink
    producer_max = int(settings.extra.get("message.max.bytes", DEFAULT_PRODUCER_MAX))
    topics = list(dict.fromkeys(t for t in (sink.topic, sink.dlq_topic) if t))
    found = topic_config(settings, topics, "max.message.bytes")
    limits = tuple((topic, producer_max, int(found.get(topic, 0))) for topic in topics)
    return dataclasses.replace(spec, sink=dataclasses.replace(sink, record_limits=limits))


def producer_batch_bytes(spec: PipelineSpec) -> int | None:
    """The producer's ``batch.size`` for ``spec``'s sink, or None for librdkafka's own: under the
    smallest ``max.message.bytes`` of the topics it writes (``sink.record_limits``). The broker
    refuses a whole batch larger than its topic's limit (MSG_SIZE_TOO_LARGE, the transaction
    aborts), though each record in it fits: with librdkafka's default of 1,000,000 bytes, a topic at
    300,000 refused every run of records 150 times smaller than its limit."""
    smallest = min((topic_max for _topic, _producer_max, topic_max in spec.sink.record_limits if topic_max), default=0)
    if not smallest or smallest - BATCH_FRAMING_ROOM >= DEFAULT_BATCH_SIZE:
        return None
    return max(smallest - BATCH_FRAMING_ROOM, smallest // 2)


def refused_because(key: bytes | None, value: bytes | None, headers, producer_max: int,
                    topic_max: int) -> tuple[int, str] | None:
    """Why the sink would refuse a record, or None: its size and the limit it exceeds."""
    size = record_size(key, value, headers)
    if size > producer_max:
        return size, f"more than the producer's message.max.bytes {producer_max:,}"
    if topic_max and size + BATCH_OVERHEAD > topic_max:
        import pyarrow as pa

        payload = b"".join([key or b"", value or b"", *(n.encode() + (d or b"") for n, d in headers or ())])
        batch = BATCH_OVERHEAD + RECORD_OVERHEAD + len(pa.compress(payload, codec="lz4", asbytes=True))
        if batch > topic_max:
            return size, f"{batch:,} bytes compressed, more than the topic's max.message.bytes {topic_max:,}"
    return None


def record_size(key: bytes | None, value: bytes | None, headers) -> int:
    """A record's size as librdkafka's produce() measures it against message.max.bytes."""
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, data in headers or ():
        name_len, data_len = len(name.encode()), len(data or b"")
        size += _varint_len(name_len) + name_len + _varint_len(data_len) + data_len
    return size


def _varint_len(n: int) -> int:
    """Bytes of ``n`` as a zig-zag varint (Kafka's record format)."""
    n, length = n << 1, 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return length


def refusing(batch: "pa.RecordBatch", spec: PipelineSpec) -> "pa.RecordBatch":
    """``batch`` (:func:`kafka_eos.sinks.batches.prepared` columns) with every row whose record
    the sink would refuse turned into a reference dead letter (module docstring). Batches with
    no record near a limit (a bound computed on Arrow's columns) come back as they are.

    :raises RecordRefused: such a row, and ``sink.on_refused_record: fail``, naming it.
    :raises DeadLetterWithoutTopic: such a row, and no ``sink.dlq_topic``.
    """
    import pyarrow as pa

    limits = {topic: (producer_max, topic_max) for topic, producer_max, topic_max in spec.sink.record_limits}
    if not limits or not len(batch) or _bound(batch, spec) <= min(
            min(p, t - BATCH_OVERHEAD) if t else p for p, t in limits.values()):
        return batch
    sink, added = spec.sink, list(spec.sink.headers)
    rows = batch.to_pylist()
    for row in rows:
        reason = row[DLQ_REASON]
        headers = [(h["key"], h["value"]) for h in row.get("headers") or ()] + added
        if reason is not None:
            headers += dead_letter_headers(reason, row["topic"], row["partition"], row["offset"])
        topic = sink.dlq_topic if reason is not None else sink.topic
        if topic not in limits or (why := refused_because(row["key"], row["value"], headers, *limits[topic])) is None:
            continue
        size, limit = why
        what = (f"{row['topic']}-{row['partition']} offset {row['offset']}: its {'dead letter' if reason else 'record'}"
                f" for topic {topic} is {size:,} bytes, {limit}")
        if sink.on_refused_record == "fail":
            raise RecordRefused(f"{what}; sink.on_refused_record: fail (its transaction was aborted)")
        refused = f"refused by the sink: {what}" + (f"; dead-lettered first for: {reason}" if reason else "")
        if sink.dlq_topic is None:
            raise DeadLetterWithoutTopic(f"{what}, and {spec.path} has no sink.dlq_topic for a dead letter: its "
                                         "transaction was aborted; set sink.dlq_topic, or raise the limit")
        log.warning("%s: a reference dead letter instead", what)
        key = row["key"] if len(row["key"] or b"") <= KEPT_KEY_BYTES else None
        row.update(key=key, headers=None, **{DLQ_REASON: refused, "value": json.dumps({
            "refused": what, "source": {"topic": row["topic"], "partition": row["partition"], "offset": row["offset"]},
            "size": size}).encode()})
    return pa.RecordBatch.from_pylist(rows, schema=batch.schema)


def _offsets(array: "pa.Array") -> "np.ndarray":
    """The offsets of a list, string or binary ``array`` as numpy reads them from its buffer (an
    Array's ``to_numpy`` goes through pandas). A null's slot counts its bytes, if it has any: a bound."""
    import numpy as np
    import pyarrow as pa

    large = pa.types.is_large_list(array.type) or pa.types.is_large_binary(array.type) or \
        pa.types.is_large_string(array.type)
    return np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)[
        array.offset:array.offset + len(array) + 1]


def _bound(batch: "pa.RecordBatch", spec: PipelineSpec) -> int:
    """At least the largest record ``batch``'s rows make (Arrow's columns, no row in Python): the
    largest key, the largest value and the largest dead-letter reason (each of any row), plus the
    most header bytes of a row. Only Arrow arrays go into Arrow's functions, no Python value
    (see :func:`kafka_eos.sinks.batches.one_binary_row`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def longest(array) -> int:
        return pc.max(pc.binary_length(array)).as_py() or 0  # nulls left out

    bound = longest(batch.column("key")) + longest(batch.column("value"))
    reasons = batch.column(DLQ_REASON)
    if reasons.null_count < len(batch):
        bound += longest(reasons) + DEAD_LETTER_ROOM
    headers = 0  # the most header bytes a row carries (with the largest key and value: a bound)
    if "headers" in batch.schema.names:
        carried = batch.column("headers")
        if isinstance(carried, pa.ChunkedArray):
            carried = carried.combine_chunks()
        if len(carried.values):
            # Each header's bytes (and 20 of its own), summed per row from the list's offsets (a
            # group-by would import Arrow's query engine, and pandas with it, into the worker).
            flat = carried.values
            per_header = 20 + sum(np.diff(_offsets(flat.field(name))) for name in ("key", "value"))
            ends = np.concatenate([[0], np.cumsum(per_header)])
            offsets = _offsets(carried)
            headers = int((ends[offsets[1:]] - ends[offsets[:-1]]).max(initial=0))
    added = sum(len(name) + len(data) + 20 for name, data in spec.sink.headers)
    return bound + headers + RECORD_OVERHEAD + added
