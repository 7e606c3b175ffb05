"""The stream loop: plan -> read -> transform -> transactional commit, again and again, in one
SparkSession, through :func:`kafka_eos.batch.run_batch` (the batch step every run uses) and the
same commit protocol. What makes it a stream is what it keeps between batches:

- the lease (:mod:`kafka_eos.lease`), polled between batches;
- one sink (:func:`kafka_eos.sinks.scope.sink_of`, ``keep=True``) and its clients: the atomic
  scope's transactional producer (fenced once, one epoch for every transaction); in per_partition
  scope each partition's producer, kept in the Spark worker that used it
  (:func:`kafka_eos.sinks.per_partition.kept_commit`); the SQL sink's engine; and an admin client
  for offsets;
- the checkpoints it committed, so a batch is planned from one offsets request (LSO, log start,
  high watermark) instead of the full planning round (topics, group offsets, the manifest's
  memory), which runs at the start, every :data:`FULL_PLAN_EVERY_S` and after a failed batch.

Every batch runs as run id ``stream``: its record in the run manifest (``<pipeline>:stream``, the
stream's progress: last batch's plan and counts, totals since the start) and its per-partition
records replace the previous ones under compaction instead of adding keys. So a batch that finds a
range committed short (:class:`kafka_eos.errors.RangeMismatch`) stops the stream, and the finding is
kept under the pipeline's hold key too (:func:`kafka_eos.manifest.hold_key`): a restarted stream's
first plan refuses (:class:`kafka_eos.errors.PipelineHeld`) until an operator acknowledges it.

Stopping: :meth:`StreamRunner.stop` (the CLI's SIGTERM/SIGINT handler) lets the batch in flight
finish (commit) and ends the loop; a batch that fails meanwhile is aborted by the commit protocol.
After a SIGKILL the next start plans from the checkpoints in Kafka; the killed stream's open
transaction is aborted by the new producer's init_transactions().
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

from kafka_eos import acls
from kafka_eos.batch import RunSummary, run_batch
from kafka_eos.errors import BrokerError, PipelineBusy, ProducerFenced, RangeMismatch, TransactionFailed
from kafka_eos.kafka_admin import admin_client, offsets_retention_s, partition_offsets
from kafka_eos.manifest import STREAM_RUN_ID, ManifestStore, now_iso
from kafka_eos.pipeline import fresh_plan
from kafka_eos.plan import Plan, plan_ranges
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.scope import sink_of
from kafka_eos.spec import PipelineSpec
from kafka_eos.stream import DEFAULT_INTERVAL_S
from kafka_eos.lease import StreamLease, batch_in_flight
from kafka_eos.stream.figures import batch_figures, failed_figures

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: A full planning round this often: new partitions, checkpoints moved by someone else (a reset),
#: idle checkpoints to commit again before the broker's offsets retention expires them. More often
#: where the retention is short: every quarter of it (a checkpoint is committed again once it is
#: half the retention old, so a round comes before it is three quarters old).
FULL_PLAN_EVERY_S = 60.0
#: Failed batches in a row (aborted transactions, a broker away) before the stream gives up.
MAX_CONSECUTIVE_FAILURES = 5
#: Wait after a failed batch, doubled per failure in a row: a broker restart takes seconds.
FAILURE_BACKOFF_S = 1.0


@dataclass
class StreamStats:
    """What a stream did since it started."""

    batches: int = 0
    records_in: int = 0
    records_out: int = 0
    dead_letters: int = 0
    failed_batches: int = 0
    stopped_by: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def batch_line(n: int, summary: RunSummary, plan_s: float) -> str:
    """The one line a stream logs per batch: counts, time, and the ranges it read."""
    ranges = " ".join(f"{r['topic']}-{r['partition']} [{r['from']}, {r['until']})" for r in summary.ranges
                      if r["until"] != r["from"])
    producers = ", ".join(f"{k} {summary.producers[k]}" for k in ("kept", "built", "rebuilt")
                          if summary.producers.get(k))
    return (f"batch {n} {summary.status}: in {summary.records_in}, out {summary.records_out}, dead "
            f"{summary.dead_letters}; {summary.seconds + plan_s:.2f} s (plan {plan_s:.2f} s"
            f"{'; producers ' + producers if producers else ''}); {ranges or 'no records'}")


def _retriable(exc: BaseException) -> bool:
    """A failed batch worth planning and running again: an aborted or unsettled transaction, a
    broker that did not answer; in per_partition scope these arrive from Spark's executors
    inside a Py4J error's text. Fencing is never retried (another writer took over)."""
    if isinstance(exc, ProducerFenced):
        return False
    if isinstance(exc, (TransactionFailed, BrokerError)):
        return True
    text = str(exc)
    return "kafka_eos.errors.TransactionFailed" in text or "kafka_eos.errors.BrokerError" in text


class StreamRunner:
    """Run one pipeline as a stream until :meth:`stop` (or ``max_batches``, or caught up).

    :param interval_s: the least time between the starts of two batches (a batch that takes
        longer is followed at once); also how often an idle stream looks for new records.
    :param report: called with each batch's line (default: logged at INFO).
    :param stop_when_caught_up: end at the first plan with nothing to read (drain and stop).
    :param force: start even if a batch run's plan looks in flight.
    :param observe: called with each batch's figures (:mod:`kafka_eos.stream.figures`).
    """

    def __init__(self, spark: "SparkSession", spec: PipelineSpec, settings: KafkaSettings,
                 interval_s: float = DEFAULT_INTERVAL_S, report: Callable[[str], None] | None = None,
                 max_batches: int | None = None, stop_when_caught_up: bool = False, force: bool = False,
                 observe: Callable[[dict], None] | None = None) -> None:
        self.spark = spark
        self.spec = spec
        self.settings = settings
        self.interval_s = interval_s
        self.report = report or log.info
        self.max_batches = max_batches
        self.stop_when_caught_up = stop_when_caught_up
        self.force = force
        self.observe = observe or (lambda _figures: None)
        self.stats = StreamStats()
        self.started_at = now_iso()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._lease = StreamLease(spec, settings)
        self._admin = None
        self._sink = sink_of(spec, settings, keep=True)
        self._checkpoints: dict | None = None
        self._last_full = 0.0
        self._full_every_s = FULL_PLAN_EVERY_S

    def stop(self, reason: str = "stop requested") -> None:
        """End the loop after the batch in flight (safe from a signal handler)."""
        self._stop_reason = self._stop_reason or reason
        self._stop.set()

    def stop_with_parent(self, parent_pid: int, every_s: float = 1.0) -> threading.Thread:
        """Stop (after the batch in flight) once the process ``parent_pid`` is no longer this
        one's parent: the Airflow task that started this stream died (its worker or host killed,
        its process killed by the task runner) and the stream would go on as an orphan holding
        the pipeline's lease, while the task's retry waits for it. A daemon thread that looks
        every ``every_s``."""
        def watch() -> None:
            while not self._stop.wait(every_s):
                if os.getppid() != parent_pid:
                    self.stop(f"its parent process {parent_pid} ended (an orphan stream stops)")
                    return

        thread = threading.Thread(target=watch, name="kafka-eos-parent-watch", daemon=True)
        thread.start()
        return thread

    # -- planning -------------------------------------------------------------------------
    def _plan(self) -> Plan:
        full = (self._checkpoints is None or time.monotonic() - self._last_full > self._full_every_s
                or any(ck is None for ck in self._checkpoints.values()))
        if full:
            plan = fresh_plan(self.spec, self.settings, STREAM_RUN_ID, may_fence=self._checkpoints is None)
            self._checkpoints = {r.tp: r.expected for r in plan.ranges}
            self._last_full = time.monotonic()
            self._sink.cover([r.tp for r in plan.ranges])
            return plan
        offsets = partition_offsets(self.settings, list(self._checkpoints), admin=self._admin)
        return plan_ranges(self.spec, STREAM_RUN_ID, offsets, self._checkpoints)

    def _forget(self) -> None:
        """After a failed batch: the next one plans in full, with a new producer (an unsettled
        commit is settled by its init_transactions())."""
        self._checkpoints = None
        self._sink.forget()

    # -- the loop -------------------------------------------------------------------------
    def _setup(self) -> None:
        acls.check(self.spec, self.settings)  # before anything is written
        if not self.force:
            window = self.spec.sink.transaction_timeout_s
            running = batch_in_flight(self.spec, self.settings, window)
            if running is not None:
                raise PipelineBusy(
                    f"pipeline {self.spec.name}: run {running['plan']['run_id']!r} planned at "
                    f"{running.get('updated_at')} has not committed (a batch run in flight?): wait for it, or "
                    f"start with --force if it failed (its transaction, if open, is aborted either way)")
        ManifestStore.of(self.spec, self.settings).ensure_compaction()  # a record per batch: compacted hourly
        self._lease.acquire()
        self._admin = admin_client(self.settings)
        # Nothing else refreshes a streaming pipeline's idle checkpoints (a refresh steps aside).
        self._full_every_s = min(FULL_PLAN_EVERY_S, offsets_retention_s(self.settings) / 4)
        self._sink.start()

    def run(self) -> StreamStats:
        """Run batches until stopped.

        :raises PipelineBusy: another stream owns the pipeline, or a batch run is in flight.
        :raises KafkaEosError: a batch failed in a way a retry does not fix (fenced, a conflict,
            data loss, a bad spec), or :data:`MAX_CONSECUTIVE_FAILURES` batches failed in a row.
        """
        self._setup()
        try:
            self._loop()
        finally:
            self._lease.release()
            self._sink.close()
        self.stats.stopped_by = self._stop_reason
        return self.stats

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._lease.keep()
            began = time.monotonic()
            try:
                plan = self._plan()
                plan_s = time.monotonic() - began
                if plan.is_empty:
                    if self.stop_when_caught_up:
                        self.stop("caught up")
                    self._stop.wait(self.interval_s)
                    continue
                n = self.stats.batches + 1
                summary = run_batch(self.spark, self.spec, plan, self.settings, self._sink,
                                    extra={"stream": self._progress(n)})
            except Exception as exc:  # noqa: BLE001 - decided below: retried, or raised
                if self._stop.is_set() and not isinstance(exc, RangeMismatch):  # that one committed: said as it is
                    # Stopping: Spark may have gone down with the signal. The commit protocol
                    # aborted the transaction; the next start resumes from the checkpoints.
                    self.report(f"batch {self.stats.batches + 1} not committed while stopping "
                                f"({type(exc).__name__}); the next start resumes from the checkpoint")
                    break
                if not _retriable(exc):
                    raise
                failures += 1
                self.stats.failed_batches += 1
                self.observe(failed_figures(self.spec.name, self.stats.batches + 1))
                self._forget()
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    raise
                wait = FAILURE_BACKOFF_S * 2 ** (failures - 1)
                self.report(f"batch {self.stats.batches + 1} failed ({_first_line(exc)}); retrying in {wait:g} s")
                self._stop.wait(wait)
                continue
            failures = 0
            self._checkpoints.update({r.tp: r.until for r in plan.active})
            self.stats.batches += 1
            self.stats.records_in += summary.records_in
            self.stats.records_out += summary.records_out
            self.stats.dead_letters += summary.dead_letters
            self.report(batch_line(n, summary, plan_s))
            self.observe(batch_figures(self.spec.name, n, summary, plan_s))
            if self.max_batches is not None and self.stats.batches >= self.max_batches:
                self.stop(f"{self.max_batches} batches")
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def _progress(self, n: int) -> dict:
        """The stream's part of each batch's manifest record."""
        return {"batch": n, "started_at": self.started_at, "client_id": self._lease.client_id,
                "interval_s": self.interval_s, "totals_before": self.stats.as_dict()}


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
