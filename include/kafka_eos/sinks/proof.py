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
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, Iterator

from kafka_eos.errors import InputTruncated

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

#: Spark's ``SpecialLengths.END_OF_STREAM`` as its JVM writes it after a task's last input
#: (a big-endian int, as pyspark's ``write_int`` reads it).
END_OF_STREAM = struct.pack(">i", -4)
#: The module of Spark's Python worker whose ``main(infile, outfile)`` reads a task's input.
WORKER_FILE = os.path.join("pyspark", "worker.py")
#: How long to wait for the rest of the end marker when only part of it has arrived: the JVM
#: writes the marker with the stream's end in one buffer, so the rest is a socket read away (or
#: the stream ends). A bound, not a pace.
MARKER_WAIT_S = 60.0


def worker_input() -> BinaryIO | None:
    """The input stream of the Spark Python worker running this code (found on the call stack:
    the worker's ``main`` reads a task's input from its ``infile``), or None outside a worker."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(WORKER_FILE) and "infile" in frame.f_code.co_varnames + \
                frame.f_code.co_freevars:
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
        fd = infile.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None  # a reader without a descriptor (a worker not forked by Spark's daemon)
    sock = socket.socket(fileno=os.dup(fd))
    try:
        deadline = time.monotonic() + MARKER_WAIT_S
        while time.monotonic() < deadline:
            data = sock.recv(size, socket.MSG_PEEK)
            if len(data) == size:
                return data
            if not data:
                return None
            select.select([sock], [], [], 0.01)
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
