"""What the command line shows a person: one line per step, a progress line while Spark works,
and tables. Results go to stdout; steps and progress go to stderr, so ``--json`` output on
stdout stays machine-readable."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence, TextIO

from kafka_eos.spark_io import is_connect

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

#: How often the progress line may change: often enough to show life, rarely enough to read.
PROGRESS_INTERVAL_S = 5.0


class ReaderMayGo:
    """A process's stdout (or stderr) whose reader may go before the command ends (``kafka-eos txn
    hanging | head -1``): its output ends there, quietly, and the command still finishes and exits
    with its own code (3 for a finding), not with a BrokenPipeError's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        """The reader went: what is left (and the interpreter's last flush) goes to /dev/null."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class Console:
    """Step lines on stderr; silent when ``quiet`` (``--json``)."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr

    def step(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    @contextmanager
    def spark_progress(self, spark: "SparkSession", interval_s: float = PROGRESS_INTERVAL_S) -> Iterator[None]:
        """While the block runs, print the running Spark stages' task counts when they change
        (at most every ``interval_s``)."""
        if self.quiet:
            yield
            return
        if is_connect(spark):
            with self._connect_progress(spark, interval_s):
                yield
            return
        stop = threading.Event()
        tracker = spark.sparkContext.statusTracker()

        def report() -> None:
            last = ""
            while not stop.wait(interval_s):
                try:
                    stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                except Exception:  # noqa: BLE001 - the session may be stopping; progress is best effort
                    return
                line = ", ".join(f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks done"
                                 for s in stages if s is not None)
                if line and line != last:
                    self.step(f"  ... spark {line}")
                    last = line

        thread = threading.Thread(target=report, name="kafka-eos-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)


    @contextmanager
    def _connect_progress(self, spark: "SparkSession", interval_s: float) -> Iterator[None]:
        """A Spark Connect client has no status tracker: the server streams each operation's
        stages to the client's progress handlers."""
        last = {"line": "", "at": 0.0}

        def handler(stages, inflight_tasks, operation_id, done) -> None:  # pyspark calls it with keywords
            line = ", ".join(f"stage {s.stage_id}: {s.num_completed_tasks}/{s.num_tasks} tasks done"
                             for s in stages or () if not s.done)
            if line and line != last["line"] and not done and time.monotonic() - last["at"] >= interval_s:
                self.step(f"  ... spark {line}")
                last.update(line=line, at=time.monotonic())

        spark.registerProgressHandler(handler)
        try:
            yield
        finally:
            spark.removeProgressHandler(handler)


def table(rows: Sequence[Sequence[object]], header: Sequence[str], indent: str = "  ", left: int = 1) -> str:
    """A plain text table: the first ``left`` columns (names, text) left-aligned, the others
    (figures) right-aligned."""
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(parts).rstrip())
    return "\n".join(lines)


def seconds(value: float) -> str:
    return f"{value:.1f}s"


def elapsed_since(start: float) -> str:
    return seconds(time.monotonic() - start)
