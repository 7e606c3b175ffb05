"""A Kafka-sink transform's output as Arrow record batches, and the output records they hold.

Rows reach Python as Arrow batches (``mapInArrow`` on the executors; packed into Arrow IPC
streams for the driver), never as one ``Row`` object per record: the per-record Python work is
the ``produce()`` call and little else. Columns are made ready on the JVM first
(:func:`prepared`): key and value as binary, headers only when a transform carries them.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Iterator

from kafka_eos.errors import DeadLetterWithoutTopic
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.txn import OutRecord, dead_letter_headers

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame

#: Schema of a packed DataFrame: one row per Arrow record batch, as an Arrow IPC stream.
PACKED_SCHEMA = "arrow_ipc binary"


def prepared(df: "DataFrame") -> "DataFrame":
    """The columns the sink writes, in the types it writes: binary key and value (a string, or
    any other value as text, is its UTF-8 bytes, as ``str(v).encode()`` gives), headers when
    present, source coordinates and ``dlq_reason``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def as_bytes(name: str):
        # Binary stays as it is; anything else as its text's UTF-8 bytes (a number is its digits).
        if isinstance(df.schema[name].dataType, BinaryType):
            return F.col(name)
        return F.col(name).cast("string").cast("binary").alias(name)

    cols = [as_bytes("key"), as_bytes("value")]
    if "headers" in df.columns:
        cols.append(F.col("headers"))
    return df.select(*cols, F.col("topic"), F.col("partition").cast("int").alias("partition"),
                     F.col("offset").cast("long").alias("offset"), F.col(DLQ_REASON).cast("string").alias(DLQ_REASON))


def no_dead_letter_topic(spec: PipelineSpec, topic: str, partition: int, offset: int, reason: str,
                         outcome: str = "its transaction was aborted") -> DeadLetterWithoutTopic:
    """The one-line error of a dead letter a sink without ``dlq_topic`` cannot write.

    :param outcome: what became of the work it was part of."""
    return DeadLetterWithoutTopic(
        f"{topic}-{partition} offset {offset}: dead letter ({reason}) but {spec.path} has no sink.dlq_topic: "
        f"{outcome}; set sink.dlq_topic or fix the record")


def first_dead_letter(batch: "pa.RecordBatch") -> dict | None:
    """The first row of ``batch`` marked as a dead letter, or None."""
    import pyarrow.compute as pc

    reasons = batch.column(DLQ_REASON)
    if reasons.null_count == len(batch):
        return None
    i = pc.index(pc.is_valid(reasons), True).as_py()
    return {k: batch.column(k)[i].as_py() for k in ("topic", "partition", "offset", DLQ_REASON)}


def source_partitions(batch: "pa.RecordBatch") -> set[tuple[str, int]]:
    """The source (topic, partition) pairs whose rows ``batch`` holds."""
    import pyarrow as pa

    pairs = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate([])
    return set(zip(pairs.column("topic").to_pylist(), pairs.column("partition").to_pylist()))


def tally_batch(batch: "pa.RecordBatch", tally: Counter) -> None:
    """Add ``batch``'s counts to ``tally``: ``((topic, partition), "out" | "dead")`` per source partition."""
    import pyarrow as pa

    counts = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate(
        [("offset", "count"), (DLQ_REASON, "count")])
    for topic, partition, rows, dead in zip(*(counts.column(c).to_pylist() for c in (
            "topic", "partition", "offset_count", f"{DLQ_REASON}_count"))):
        tally[((topic, partition), "out")] += rows - dead
        if dead:
            tally[((topic, partition), "dead")] += dead


def records(batches: Iterable["pa.RecordBatch"], spec: PipelineSpec, tally: Counter | None = None) -> Iterator[OutRecord]:
    """Output records of the rows in ``batches``: results to the sink topic, dead letters (the
    source key and value, the reason and source coordinates in headers) to the dead-letter topic.

    :param tally: when given, counts ``((topic, partition), "out" | "dead")`` per source partition.
    :raises DeadLetterWithoutTopic: a dead letter, and the sink has no ``dlq_topic`` (the
        transaction it was meant for aborts: nothing of the batch is committed).
    """
    sink_topic, dlq_topic, added = spec.sink.topic, spec.sink.dlq_topic, list(spec.sink.headers)
    for batch in batches:
        if not len(batch):
            continue
        if dlq_topic is None and (dead := first_dead_letter(batch)) is not None:
            raise no_dead_letter_topic(spec, dead["topic"], dead["partition"], dead["offset"], dead[DLQ_REASON])
        if tally is not None:
            tally_batch(batch, tally)
        keys, values = batch.column("key").to_pylist(), batch.column("value").to_pylist()
        reasons = batch.column(DLQ_REASON)
        carried = batch.column("headers") if "headers" in batch.schema.names else None
        if reasons.null_count == len(batch) and not added and _no_headers(carried):
            # The common case: results only, no headers to carry.
            for key, value in zip(keys, values):
                yield sink_topic, key, value, None
            continue
        headers = carried.to_pylist() if carried is not None else [None] * len(batch)
        reasons_py = reasons.to_pylist()
        topics, partitions, offsets = (batch.column(c).to_pylist() for c in ("topic", "partition", "offset"))
        for i, (key, value, reason) in enumerate(zip(keys, values, reasons_py)):
            h = [(x["key"], x["value"]) for x in headers[i] or ()] + added
            if reason is None:
                yield sink_topic, key, value, h
            else:
                yield dlq_topic, key, value, h + dead_letter_headers(reason, topics[i], partitions[i], offsets[i])


def _no_headers(carried: "pa.Array | None") -> bool:
    """No row carries a header (a record without headers reads as null or as an empty list)."""
    import pyarrow.compute as pc

    if carried is None or carried.null_count == len(carried):
        return True
    return (pc.max(pc.list_value_length(carried)).as_py() or 0) == 0


def pack(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
    """``mapInArrow`` function: each batch as one row holding its Arrow IPC stream (rows reach
    the driver a batch at a time, not a ``Row`` object per record)."""
    import pyarrow as pa

    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        yield pa.RecordBatch.from_arrays([pa.array([sink.getvalue().to_pybytes()], pa.binary())],
                                         names=["arrow_ipc"])


def unpack(rows: Iterable) -> Iterator["pa.RecordBatch"]:
    """The record batches of packed rows (see :func:`pack`)."""
    import pyarrow as pa

    for row in rows:
        yield from pa.ipc.open_stream(row[0])


#: Schema of a packed DataFrame whose rows say which Spark partition they come from; a row with
#: no ``arrow_ipc`` ends its partition (see :func:`pack_marked`).
MARKED_SCHEMA = "arrow_ipc binary, spark_partition int"

#: Bytes of out-of-order partitions held in memory before the rest go to a temporary file.
HELD_IN_MEMORY = 64 * 1024 * 1024


def computed(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """The record batches of ``df`` in the order of its partitions, from one Spark job that
    computes every partition at once and hands each over as its task ends: not cached first,
    not one task at a time (``toLocalIterator``). Lazy: the job starts at the first ``next()``.

    Through Spark Connect the server sends partitions in order itself; in a classic session the
    partitions arrive in the order their tasks end, and those that come before their turn wait
    (in memory up to :data:`HELD_IN_MEMORY`, then in a temporary file).
    """
    from kafka_eos.spark_io import is_connect

    if is_connect(df):
        yield from unpack(df.mapInArrow(pack, PACKED_SCHEMA).toLocalIterator())
        return
    yield from unpack((ipc,) for ipc in in_order(_marked_rows(df.mapInArrow(pack_marked, MARKED_SCHEMA))))


def pack_marked(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
    """``mapInArrow`` function: :func:`pack`'s rows with the task's partition index, then one
    row without ``arrow_ipc`` that ends the partition (an empty partition has only that one)."""
    import pyarrow as pa
    from pyspark import TaskContext

    part = pa.array([TaskContext.get().partitionId()], pa.int32())
    names = ["arrow_ipc", "spark_partition"]
    for row in pack(batches):
        yield pa.RecordBatch.from_arrays([row.column(0), part], names=names)
    yield pa.RecordBatch.from_arrays([pa.array([None], pa.binary()), part], names=names)


def _marked_rows(marked: "DataFrame") -> Iterator[tuple[bytes | None, int]]:
    """(arrow_ipc, spark_partition) rows of ``marked`` as its tasks end, each partition's rows
    together (Spark's Arrow collect: one job, every partition's result written as it arrives)."""
    import pyarrow as pa
    from uuid import uuid4
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _load_from_socket

    sc = marked.sparkSession.sparkContext
    tag = f"kafka-eos-computed-{uuid4().hex}"
    sc.addJobTag(tag)
    try:
        with SCCallSiteSync(sc):
            port, secret, server = marked._jdf.collectAsArrowToPython()
    finally:
        sc.removeJobTag(tag)
    whole = False
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
            for item in stream:
                if isinstance(item, pa.RecordBatch):
                    yield from zip(item.column(0).to_pylist(), item.column(1).to_pylist())
        whole = True
    finally:
        if whole:
            with unwrap_spark_exception():
                server.getResult()  # the job's own error, if it failed
        else:  # left before the end (the commit failed): stop the job, then let it go
            sc.cancelJobsWithTag(tag)
            try:
                server.getResult()
            except Exception:  # noqa: BLE001 - the commit's own error is the one that matters
                pass


def in_order(rows: Iterable[tuple[bytes | None, int]]) -> Iterator[bytes]:
    """The ``arrow_ipc`` values of ``rows`` in partition order. ``rows`` come a partition at a
    time in any order of partitions, each partition's rows in order and ended by a row whose
    value is None; partitions ahead of their turn are held until it comes.

    :raises RuntimeError: a partition's end never came (Spark lost a task's result).
    """
    from tempfile import SpooledTemporaryFile

    turn = 0
    held: dict[int, list[tuple[int, int]]] = {}  # partition -> (position, length) of its values in `spool`
    ended: set[int] = set()
    with SpooledTemporaryFile(max_size=HELD_IN_MEMORY) as spool:
        def release():
            nonlocal turn
            while turn in held:
                for pos, size in held.pop(turn):
                    spool.seek(pos)
                    yield spool.read(size)
                if turn not in ended:
                    return  # its remaining rows come next, in turn
                ended.discard(turn)
                turn += 1
            if not held:  # nothing waits: the file starts over
                spool.seek(0)
                spool.truncate()

        for ipc, part in rows:
            if part != turn:
                held.setdefault(part, [])
                if ipc is None:
                    ended.add(part)
                else:
                    spool.seek(0, 2)
                    held[part].append((spool.tell(), len(ipc)))
                    spool.write(ipc)
            elif ipc is not None:
                yield ipc
            else:
                turn += 1
                yield from release()
        if held:
            raise RuntimeError(f"Spark partition(s) {sorted(held)[:5]} came without partition {turn}'s end")
