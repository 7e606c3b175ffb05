"""A Kafka-sink transform's output as Arrow record batches, and the output records they hold.

Rows reach Python as Arrow batches (``mapInArrow`` on the executors; packed into Arrow IPC
streams for the driver), never as one ``Row`` object per record: the per-record Python work is
the ``produce()`` call and little else. Columns are made ready on the JVM first
(:func:`prepared`): key and value as binary, headers only when a transform carries them.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from kafka_eos.errors import DeadLetterWithoutTopic, ResultTooLarge, mentions
from kafka_eos.sinks.limits import refusing
from kafka_eos.spark_io import is_connect, read_layout, result_limits
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON
from kafka_eos.wire import OutRecord, dead_letter_headers

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Schema of a packed DataFrame: one row per Arrow record batch, as an Arrow IPC stream.
PACKED_SCHEMA = "arrow_ipc binary"


#: From this many records a run reads, a record without headers is carried as an empty list of
#: them (see :func:`prepared`); below, as null (the extra expression cost a small stream batch
#: more than the null lists: ≈ 35 ms of its 0.34 s median at 1,000 records/s).
EMPTY_HEADERS_FROM = 5_000


def prepared(df: "DataFrame", records: int | None = None) -> "DataFrame":
    """The columns the sink writes, in the types it writes: binary key and value (a string, or
    any other value as text, is its UTF-8 bytes, as ``str(v).encode()`` gives), headers when
    present, source coordinates and ``dlq_reason``.

    :param records: at most how many rows (the plan's offsets), when known."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def as_bytes(name: str):
        # Binary stays as it is; anything else as its text's UTF-8 bytes (a number is its digits).
        if isinstance(df.schema[name].dataType, BinaryType):
            return F.col(name)
        return F.col(name).cast("string").cast("binary").alias(name)

    cols = [as_bytes("key"), as_bytes("value")]
    if "headers" in df.columns:
        headers = F.col("headers")
        if records is None or records >= EMPTY_HEADERS_FROM:
            # A record without headers as an empty list, not null (the same to the sink: no headers).
            # Spark's Arrow writer measures the batch after every row (spark.sql.execution.arrow.
            # maxBytesPerBatch), and Arrow's list vector re-fills every null's offset since its last
            # value at each measure: a batch of null lists costs rows² (6 s of a 1.2M-record run).
            headers = F.coalesce(headers, F.array().cast(df.schema["headers"].dataType)).alias("headers")
        cols.append(headers)
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
    i = pc.indices_nonzero(reasons.is_valid())[0].as_py()
    return {k: batch.column(k)[i].as_py() for k in ("topic", "partition", "offset", DLQ_REASON)}


def source_partitions(batch: "pa.RecordBatch") -> set[tuple[str, int]]:
    """The source (topic, partition) pairs whose rows ``batch`` holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(batch):
        return set()
    topics, partitions = batch.column("topic"), batch.column("partition")
    # Compared with the first row's Arrow scalars, not Python values (see one_binary_row).
    if (topics.null_count == partitions.null_count == 0 and pc.all(pc.equal(topics, topics[0])).as_py()
            and pc.all(pc.equal(partitions, partitions[0])).as_py()):
        # The usual batch (a per_partition task checks every one): one source partition's rows,
        # found without a group-by (and without importing Arrow's query engine into each worker).
        return {(topics[0].as_py(), partitions[0].as_py())}
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
    :raises RecordRefused: a record the sink cannot take, and ``sink.on_refused_record: fail``
        (see :mod:`kafka_eos.sinks.limits`).
    """
    sink_topic, dlq_topic, added = spec.sink.topic, spec.sink.dlq_topic, list(spec.sink.headers)
    for batch in batches:
        if not len(batch):
            continue
        batch = refusing(batch, spec)  # a record too large for its topic: a reference dead letter
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
        yield one_binary_row("arrow_ipc", sink.getvalue())


def one_binary_row(name: str, data: "bytes | pa.Buffer") -> "pa.RecordBatch":
    """A batch of one row whose one binary column ``name`` holds ``data``, built from Arrow
    buffers. A Spark Python worker's code converts no Python value into Arrow (a list, a scalar
    argument of a compute function): pyarrow's first conversion in a process imports pandas to
    check the value's type, ≈ 0.2–0.5 s of every worker's start that no task needs."""
    import struct

    import pyarrow as pa

    column = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(struct.pack("<ii", 0, len(data))),
                                                    pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([column], names=[name])


def unpack(rows: Iterable) -> Iterator["pa.RecordBatch"]:
    """The record batches of packed rows (see :func:`pack`)."""
    import pyarrow as pa

    for row in rows:
        yield from pa.ipc.open_stream(row[0])


#: Column :func:`computed` adds to every row while it moves: the index of its Spark partition.
PART = "_kafka_eos_spark_partition"

#: Bytes of record batches held for their turn in memory before the rest go to a temporary file.
HELD_IN_MEMORY = 64 * 1024 * 1024


def computed(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """The record batches of ``df`` from one Spark job that computes every task at once and hands
    each task's rows over as the task ends: not cached first, not one task at a time
    (``toLocalIterator``), and converted to Arrow on the JVM (no Python worker in between). Lazy:
    the job starts at the first ``next()``; closed early (``close()``), the job is cancelled
    before ``close()`` returns.

    The rows of one source partition keep their order (:func:`turns`): through Spark Connect the
    server sends the tasks in their order; in a classic session the tasks that end before their
    turn wait (:func:`in_order`).
    """
    if is_connect(df):
        yield from _connect_batches(df)
        return
    from pyspark.sql import functions as F

    # One DataFrame for both: Spark plans it (and asks Kafka for the read's offsets) once.
    marked = df.withColumn(PART, F.spark_partition_id())
    collected = _collected(marked)
    try:
        yield from in_order(collected, turns(marked))
    finally:
        collected.close()  # closed with this generator: its job is cancelled now, not at a collection


def unordered(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """The record batches of ``df`` as :func:`computed` moves them (one job, every task at once,
    Arrow from the JVM), in whatever order its tasks end: for a sink to which order means nothing
    (a SQL table). Lazy; closed early, the job is cancelled."""
    if is_connect(df):
        yield from _connect_batches(df)
        return
    collected = _collected(df)
    try:
        yield from collected
    finally:
        collected.close()


def fetched(df: "DataFrame", into: Callable[[Iterator["pa.RecordBatch"]], T], ordered: bool = False) -> T:
    """``into(batches)`` of every record batch of ``df``, however large the whole: from one job
    that computes every task at once (:func:`unordered`; ``ordered``: :func:`computed`, each
    source partition's rows in their order) while their results fit
    ``spark.driver.maxResultSize`` (Spark's limit on what one job returns to the driver), else, when
    Spark refuses them, ``into`` again from the start with one task per job (a task's results are
    bounded by the read's split). ``into`` consumes the batches before it returns (a spool, a list):
    a refused first try leaves nothing behind.

    :raises ResultTooLarge: one task's output alone is over the limit, naming it and the fix.
    """
    try:
        return into(computed(df) if ordered else unordered(df))
    except Exception as exc:  # noqa: BLE001 - only Spark's refusal of the results is tried again
        if not result_too_large(exc):
            raise
    log.info("the results of one job are over spark.driver.maxResultSize: fetching them one task at a time")
    try:
        return into(one_task_at_a_time(df))
    except Exception as exc:  # noqa: BLE001 - said in a line that names the setting
        if not result_too_large(exc):
            raise

        limit, _heap = result_limits(df.sparkSession)
        raise ResultTooLarge(f"the output is more than spark.driver.maxResultSize ({limit >> 20} MiB) lets the "
                             "driver take, even one Spark task at a time (through Spark Connect: in one "
                             "execution): raise it (the spec's spark: section), or lower "
                             "source.max_records_per_partition") from None


def result_too_large(exc: BaseException) -> bool:
    """Whether Spark refused a job's results for ``spark.driver.maxResultSize`` (its own message,
    in the error or what caused it)."""
    return mentions(exc, "spark.driver.maxResultSize")


def one_task_at_a_time(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """The record batches of ``df``, fetched one Spark task per job (Spark computes the next while
    this one is read): what one job returns to the driver is one task's output."""
    rows = df.mapInArrow(pack, PACKED_SCHEMA).toLocalIterator(prefetchPartitions=True)
    yield from unpack(rows)


def turns(df: "DataFrame") -> dict[int, object] | None:
    """Which Spark tasks of ``df`` must hand their rows over in turn: a map of every task to its
    group, in the order of their turns (the tasks of one group go in that order, groups
    independently), or None when any order will do.

    Where the lineage proves what each task reads (:func:`kafka_eos.spark_io.read_layout`), the
    tasks that read parts of one source partition are a group, in the order of their offsets. A
    shuffle leaves no order across tasks to keep (each key is in one task). Anything else (a
    union, a coalesce) is one group, in the order of the tasks' index.
    """
    layout = read_layout(df)
    if layout is not None:  # in the order of what they read
        return {task: tp for task, (tp, _from, _until) in sorted(layout.items(), key=lambda t: (t[1][0], t[1][1]))}
    execution = df._jdf.queryExecution()
    if "Exchange" in execution.executedPlan().toString():
        return None
    return dict.fromkeys(range(execution.toRdd().getNumPartitions()), 0)


def _collected(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """``df``'s record batches as its tasks end, each task's batches together (Spark's own Arrow
    collect: one job, every task's result written out as it arrives)."""
    import pyarrow as pa
    from uuid import uuid4
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _load_from_socket

    sc = df.sparkSession.sparkContext
    tag = f"kafka-eos-computed-{uuid4().hex}"
    sc.addJobTag(tag)
    try:
        with SCCallSiteSync(sc):
            port, secret, server = df._jdf.collectAsArrowToPython()
    finally:
        sc.removeJobTag(tag)
    whole = False
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
            for item in stream:
                if isinstance(item, pa.RecordBatch):  # the last item is the batches' order: not needed
                    yield item
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


def _connect_batches(df: "DataFrame") -> Iterator["pa.RecordBatch"]:
    """``df``'s record batches from a Spark Connect server, which computes every task at once and
    sends them in their order; left early, the operation is interrupted."""
    from uuid import uuid4
    from pyspark.sql.types import StructType

    session = df.sparkSession
    tag = f"kafka-eos-computed-{uuid4().hex}"
    session.addTag(tag)
    whole = False
    try:
        for item in session.client.to_table_as_iterator(df._plan.to_proto(session.client), df._plan.observations):
            if not isinstance(item, StructType):
                yield from item.to_batches()
        whole = True
    finally:
        session.removeTag(tag)
        if not whole:
            session.interruptTag(tag)


def in_order(batches: Iterable["pa.RecordBatch"], groups: dict[int, object] | None) -> Iterator["pa.RecordBatch"]:
    """``batches`` (each with the :data:`PART` column) without that column, each group's Spark
    partitions in the order ``groups`` lists them (see :func:`turns`; None: as they come).

    The batches come a partition at a time, in any order of partitions: a partition is whole when
    another's batch (or the end) comes after it, and a partition with no rows never comes. A
    partition whose group has an earlier one not yet whole (or, until the end, not yet seen) is
    held: in memory up to :data:`HELD_IN_MEMORY` bytes, then in a temporary file.
    """
    import pyarrow as pa
    from collections import deque
    from tempfile import SpooledTemporaryFile

    if groups is None:
        for batch in batches:
            yield batch.drop_columns([PART])
        return
    waiting: dict[object, deque] = {}
    for part, group in groups.items():
        waiting.setdefault(group, deque()).append(part)
    whole: set[int] = set()
    held: dict[int, list[tuple[int, int]]] = {}  # partition -> (position, length) of its batches in `spool`
    schema = None
    with SpooledTemporaryFile(max_size=HELD_IN_MEMORY) as spool:
        def turn_of(group) -> Iterator["pa.RecordBatch"]:
            """The held batches of ``group``'s partitions whose turn has come."""
            queue = waiting[group]
            while queue:
                for pos, size in held.pop(queue[0], ()):
                    spool.seek(pos)
                    yield pa.ipc.read_record_batch(pa.py_buffer(spool.read(size)), schema)
                if queue[0] not in whole:
                    return  # its turn, and its rows still to come: they go through as they come
                queue.popleft()
            if not held:  # nothing waits: the file starts over
                spool.seek(0)
                spool.truncate()

        current = None
        for batch in batches:
            if not len(batch):
                continue
            part = batch.column(PART)[0].as_py()
            if part not in groups:
                raise RuntimeError(f"a record batch of Spark partition {part}, which the plan does not have")
            batch = batch.drop_columns([PART])
            schema = batch.schema
            if part != current and current is not None:
                whole.add(current)
                yield from turn_of(groups[current])
            current = part
            if waiting[groups[part]][0] == part:
                yield batch
            else:
                data = batch.serialize()
                spool.seek(0, 2)
                held.setdefault(part, []).append((spool.tell(), data.size))
                spool.write(data)
        whole.update(groups)  # the end: a partition not seen had no rows
        for group in waiting:
            yield from turn_of(group)
