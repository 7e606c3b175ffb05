"""Proof of read: a Spark task commits its source range only after it has seen the end of its
input as Spark ends it, never because its input iterator stopped (docs/architecture.md, "Proof of
read").

A per_partition task's Python function (``mapInArrow``) reads its rows from the Spark Python
worker's input stream. When the task's JVM side ends its input normally — every record of the
range read and transformed — it writes the Arrow stream's end and, right after it, Spark's
``END_OF_STREAM`` marker (-4, four bytes). When the JVM side fails (an exception in the read, the
transform or the decode guard, a record deleted by retention, a fetch failure, the executor lost),
it closes the stream instead: pyarrow reads a stream cut between two batches as a normal end, and
the function would see fewer rows than the range holds. :func:`whole` tells the two apart after the
last batch by looking at the next four bytes of the worker's input without consuming them: the
marker, or the end of the stream. Anything but the marker raises :class:`InputTruncated` inside
the records the transaction produces, so the transaction aborts before its offsets can commit.

The proof is about the task's input, not its rows: a filter, an explode or a dead letter changes
which rows reach the function, never whether Spark ended the input. The same holds in a classic
session and through Spark Connect (the server's Python workers are Spark's own), with or without
kafka-eos's server plugin, in one pass and in two.

A second, independent check follows each commit job (:class:`RowCount`): Spark itself counts, on
the JVM, the rows its transform hands each source partition's commit (an Observation, merged from
the one successful task of each partition), and the run compares that count with the results and
dead letters the partition's transaction wrote (:func:`check_rows`). A commit that wrote fewer rows
than Spark gave it — whatever the cause — fails the run, naming the partition and the numbers.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, Iterator

from kafka_eos.errors import InputTruncated, RangeMismatch
from kafka_eos.kafka_admin import TP
from kafka_eos.plan import PartitionRange, Plan

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame

#: Spark's ``SpecialLengths.END_OF_STREAM`` as its JVM writes it after a task's last input
#: (a big-endian int, as pyspark's ``write_int`` reads it).
END_OF_STREAM = struct.pack(">i", -4)
#: The module of Spark's Python worker whose ``main(infile, outfile)`` reads a task's input.
WORKER_FILE = "pyspark/worker.py"
#: How long to wait for the rest of the end marker when only part of it has arrived: the JVM
#: writes the marker with the stream's end in one buffer, so the rest is a socket read away (or
#: the stream ends). A bound, not a pace.
MARKER_WAIT_S = 60.0


def worker_input() -> BinaryIO | None:
    """The input stream of the Spark Python worker running this code (found on the call stack:
    the worker's ``main`` reads a task's input from its ``infile``), or None outside a worker."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.replace(os.sep, "/").endswith(WORKER_FILE) and \
                "infile" in frame.f_code.co_varnames + frame.f_code.co_freevars:
            found = frame.f_locals.get("infile")
            if found is not None:
                return found
        frame = frame.f_back
    return None


def input_ended(infile: BinaryIO) -> bool:
    """Whether Spark ended this task's input normally: the next four bytes of ``infile`` (not
    consumed: the worker reads them itself after the task) are ``END_OF_STREAM``. False when the
    stream ends there, or holds anything else."""
    head = infile.peek(len(END_OF_STREAM))
    if len(head) >= len(END_OF_STREAM):
        return head[:len(END_OF_STREAM)] == END_OF_STREAM
    if not head:
        return False  # the JVM closed its side: the input was cut
    if not END_OF_STREAM.startswith(head):
        return False
    # Part of the marker is in the reader's buffer and the rest still in the socket (a buffered
    # reader's peek does not read more while it holds bytes): look at the socket itself.
    rest = _socket_peek(infile, len(END_OF_STREAM) - len(head))
    return rest is not None and head + rest == END_OF_STREAM


def _socket_peek(infile: BinaryIO, size: int) -> bytes | None:
    """The next ``size`` bytes of the socket under ``infile`` past its buffer, not consumed; None
    when the stream ends first or the socket cannot be reached."""
    try:
        fd = os.dup(infile.fileno())
    except (AttributeError, OSError, io.UnsupportedOperation):
        # A reader without a descriptor (a worker not forked by Spark's daemon): unproven, so the
        # task fails and Spark runs it again (the marker split across two reads is rare).
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    try:
        # The duplicate shares the worker's file status flags: blocking, as the worker reads it
        # (a process-wide default timeout would have made the constructor set it non-blocking).
        sock.setblocking(True)
        deadline = time.monotonic() + MARKER_WAIT_S
        while time.monotonic() < deadline:
            data = sock.recv(size, socket.MSG_PEEK)  # blocks until a byte comes or the stream ends
            if len(data) >= size:
                return data[:size]
            if not data:
                return None
            time.sleep(0.001)  # part of what is missing is there: the rest is on its way
        return None
    finally:
        sock.close()  # the duplicate only: the worker's own descriptor stays open


def whole(batches: Iterator["pa.RecordBatch"], what: str, span: str) -> Iterator["pa.RecordBatch"]:
    """``batches`` (a Spark task's input, as its Python function receives them), then, at their
    end, the proof that Spark ended the input: :class:`InputTruncated` when it did not.

    :param what: the source partition the task commits (``topic-partition``), for the error.
    :param span: the range it commits (``[from, until)``), for the error.
    :raises InputTruncated: outside a Spark Python worker, or the input was cut.
    """
    infile = worker_input()
    if infile is None:
        raise InputTruncated(f"{what}: no Spark Python worker input to prove the read of {span} against; "
                             "nothing committed")
    rows, last = 0, None
    for batch in batches:
        rows += len(batch)
        if len(batch):
            last = batch
        yield batch
    if not input_ended(infile):
        offset = last.column("offset")[len(last) - 1].as_py() if last is not None and \
            "offset" in last.schema.names else None
        raise InputTruncated(f"{what}: the Spark task's input ended after {rows} rows (last source offset "
                             f"{offset}) without Spark's end of input: the read or the transform failed, or "
                             f"the executor was lost; its transaction was aborted, nothing of {span} committed")


#: Up to this many ranges a commit job counts its rows per source partition (each row is compared
#: with every range's coordinates, on the JVM); above, one count for the whole job, checked as a sum.
COUNTED_RANGES = 64


class RowCount:
    """Spark's own count of the rows a commit job hands its Python tasks, per source partition:
    an Observation on the job's input, counted on the JVM as the rows pass and merged from the
    successful task of each partition. Read it (:meth:`counts`) only after the job succeeded."""

    def __init__(self, df: "DataFrame", ranges: "list[PartitionRange] | tuple[PartitionRange, ...]") -> None:
        import uuid

        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        self.ranges = [r for r in ranges if not r.empty]
        self.per_partition = len(self.ranges) <= COUNTED_RANGES
        self._observation = Observation(f"kafka-eos-rows-{uuid.uuid4().hex}")
        if self.per_partition:
            counts = [F.count_if((F.col("topic") == r.topic) & (F.col("partition") == r.partition)).alias(f"r{i}")
                      for i, r in enumerate(self.ranges)]
        else:
            counts = [F.count(F.lit(1)).alias("all")]
        #: The job's input, counted: the commit job runs this DataFrame.
        self.df = df.observe(self._observation, *counts)

    def counts(self) -> dict[TP, int] | int:
        """Rows per source partition, or (above :data:`COUNTED_RANGES` ranges) the job's total."""
        got = self._observation.get
        if not self.per_partition:
            return int(got["all"])
        return {r.tp: int(got[f"r{i}"]) for i, r in enumerate(self.ranges)}


def check_rows(plan: Plan, rows: dict[TP, int] | int, written: dict[TP, tuple[int, int]],
               undecodable: dict[TP, int] | None = None) -> None:
    """Verify a commit job: every partition's transaction wrote one record per row Spark's
    transform gave it, plus one dead letter per record that did not decode.

    :param rows: :meth:`RowCount.counts` of the job.
    :param written: (results, dead letters) each partition's transaction wrote, by this attempt or
        (a partition an earlier attempt committed) by the one that committed it; a partition not in
        it is not checked.
    :param undecodable: records per partition that did not decode (two-pass formats), written as
        dead letters beside the transform's rows.
    :raises RangeMismatch: naming the partition, its range and the numbers.
    """
    undecodable = undecodable or {}
    ranges = {r.tp: r for r in plan.active if not r.empty}
    if isinstance(rows, int):
        expected = rows + sum(undecodable.get(tp, 0) for tp in ranges)
        got = sum(sum(written.get(tp, (0, 0))) for tp in ranges)
        if got != expected:
            raise RangeMismatch(f"run {plan.run_id!r}: Spark's transform gave {expected} rows over {len(ranges)} "
                                f"partitions, their transactions wrote {got} records: {expected - got} rows are not "
                                "in the output; audit the run (kafka-eos audit) to find the partition")
        return
    for tp in sorted(ranges):
        if tp not in written:
            continue  # committed by an earlier attempt whose counts are not known
        r, extra = ranges[tp], undecodable.get(tp, 0)
        out, dead = written.get(tp, (0, 0))
        expected = rows.get(tp, 0) + extra
        if out + dead != expected:
            more = f" (+ {extra} that did not decode)" if extra else ""
            raise RangeMismatch(f"{r.topic}-{r.partition} [{r.from_offset}, {r.until}) of run {plan.run_id!r}: Spark's "
                                f"transform gave {rows.get(tp, 0)} rows{more}, the partition's transaction wrote "
                                f"{out} results and {dead} dead letters: {expected - out - dead} rows are not in the "
                                "output; audit the run (kafka-eos audit) and replay the range")
