"""The one face every commit scope shows a run (docs/architecture.md, "One route per scope").

A run (:mod:`kafka_eos.batch`) plans, reads, decodes and transforms; then it hands the
transform's :class:`Output` to its sink, which

1. prepares it (:meth:`Sink.prepare`: record limits, encoders, dead letters, the output's checks),
2. commits it with the plan's offsets and writes the run's manifest record (:meth:`Sink.commit`),
   returning one :class:`Outcome` whatever the scope.

Around runs a sink also commits its checkpoints again unchanged (:meth:`Sink.refresh`), moves
them (:meth:`Sink.reset`), reads them against the Kafka group (:meth:`Sink.checkpoints`), checks a
finished run (:meth:`Sink.verify`) and closes the clients it keeps between a stream's batches
(:meth:`Sink.close`). :func:`kafka_eos.sinks.scope.sink_of` chooses a spec's sink: the one place
that does. The model is quix-streams' single commit point over polymorphic sinks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Iterator, NamedTuple

from kafka_eos.kafka_admin import TP
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


class Output(NamedTuple):
    """A transform's output for a plan (lazy: Spark computes it when the sink reads it)."""

    #: Every source record, decoded (the SQL sink counts them).
    source: "DataFrame | None"
    results: "DataFrame | None"
    #: A ``(results, dead_letters)`` transform's dead letters (else None: rows carry ``dlq_reason``).
    dead_letters: "DataFrame | None"
    #: Records that did not decode (two-pass runs of a formatted source): the sink writes them as
    #: dead letters in the run's transaction.
    undecodable: "DataFrame | None" = None
    #: The one frame ``results`` and ``dead_letters`` were split from (:func:`results_apart`): a sink
    #: that reads them in two Spark jobs computes it once for both (:meth:`MirroredSink.counted`).
    split_from: "DataFrame | None" = None


@dataclass(frozen=True)
class Outcome:
    """What a sink's commit of one plan did, in every scope."""

    #: ``committed``, or ``noop`` (an earlier attempt committed every range already).
    status: str
    records_in: int
    records_out: int
    dead_letters: int
    #: Per source partition of the plan: (records out, dead letters), where the scope counts them.
    counts: dict[TP, tuple[int, int]] | None = None
    #: per_partition scope: how many transactions had a producer ``built``, ``kept`` or ``rebuilt``.
    producers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Drift:
    """The Kafka mirror of a sink's checkpoint differs from the sink's own (the sink is ahead)."""

    topic: str
    partition: int
    sink: int | None
    kafka: int | None


class Sink(ABC):
    """One pipeline's sink in one commit scope.

    :param keep: a long-lived sink for many batches (a stream): it keeps its clients (a producer,
        an engine, each partition's commit) between them until :meth:`close`.
    """

    #: Whether the driver commits: the source is then read in tasks of bounded size, so rows
    #: reach the driver one bounded task at a time.
    commits_on_driver = True
    #: Whether a formatted source is decoded in one pass, a record that does not decode failing
    #: the job (then two passes); a sink that reads its source twice anyway decodes in two.
    decodes_in_one_pass = True
    #: Whether each source partition's transaction writes a manifest record of its own (its range
    #: and counts), beside the run's (``kafka-eos audit`` compares each with the source).
    partition_records = False
    #: Whether a run with nothing to read still needs the transform's output (of no records): its
    #: schema makes the place its offsets are committed to (an Iceberg table).
    needs_output_schema = False

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> None:
        self.spec = spec
        self.settings = settings
        self.keep = keep
        self._started = False

    def start(self) -> None:
        """Checks and set-up before Spark starts: once per sink, whoever asks first (a stream
        before its first batch, :func:`kafka_eos.batch.run_batch` for every run)."""
        if not self._started:
            self._start()
            self._started = True

    def _start(self) -> None:
        """:meth:`start`'s work, in each scope."""

    @abstractmethod
    def prepare(self, output: Output) -> Output:
        """The output as the sink writes it (checked, encoded, dead letters placed).

        :raises SpecError: an output the scope cannot commit exactly once.
        """

    @abstractmethod
    def commit(self, plan: Plan, output: Output, record: dict) -> Outcome:
        """Commit ``plan``'s ranges with ``output`` in one step of the scope, and the run's
        manifest record (``record``: the run's fields so far). Safe to call again with the same
        plan: committed work is a no-op."""

    @abstractmethod
    def refresh(self, plan: Plan) -> None:
        """Commit the checkpoints of ``plan``'s ranges again, unchanged (``from == until``)."""

    @abstractmethod
    def reset(self, plan: Plan) -> None:
        """Move the checkpoints of ``plan``'s active ranges from ``expected`` to ``until``, no rows."""

    def checkpoints(self, tps: list[TP], group: dict[TP, int | None]) -> tuple[dict[TP, int | None], list[Drift]]:
        """The pipeline's checkpoints, given the group's (``group``), and the drift of the group
        where the sink keeps its own. Kafka sinks: the group's offsets are the checkpoints."""
        return group, []

    def repair(self, drift: list[Drift]) -> None:
        """Republish the sink's own checkpoints to the group (nothing for a Kafka sink)."""

    def keep_checkpoints(self) -> None:
        """At each refresh, due or not (the watchdog's, ``kafka-eos checkpoint --refresh``): what
        keeps the sink's own checkpoints where maintenance could lose them (nothing for most)."""

    def verify(self, plan: Plan) -> None:
        """After a run: what the scope can check beyond the checkpoints (see :func:`kafka_eos.pipeline.verify`)."""

    def cover(self, tps: list[TP]) -> None:
        """A stream's partitions, at each full plan (a long-lived commit that fences them)."""

    def forget(self) -> None:
        """After a failed batch: drop clients whose state is unknown (the next batch builds new ones)."""

    def close(self) -> None:
        """Close the clients kept between batches."""

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


class MirroredSink(Sink):
    """A sink that keeps its own checkpoints (a database's offsets table, a table's snapshot
    summary) and mirrors them to the Kafka group offsets: the sink is the truth, the mirror may lag
    behind it (a crash between the sink's commit and the mirror) but never lead."""

    #: It reads its source more than once anyway (persisted): two passes from the start.
    decodes_in_one_pass = False
    #: The type of :attr:`store`: built from the spec and the sink's database URL.
    store_type: type

    def __init__(self, spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> None:
        super().__init__(spec, settings, keep)
        self._store = None

    @property
    def store(self):
        """The sink's own store (its database, built at first use: the URL the settings carry, the
        connection ``sink.conn_id``, else ``sink.url``)."""
        if self._store is None:
            from kafka_eos.sinks.sql_store import database_url

            self._store = self.store_type(self.spec, database_url(self.spec, self.settings))
        return self._store

    #: The sink in words, for its errors (``SQL sink 'orders'``).
    @property
    @abstractmethod
    def place(self) -> str: ...

    @abstractmethod
    def own_checkpoints(self, tps: list[TP]) -> dict[TP, int | None]:
        """The sink's own checkpoints of ``tps``."""

    @abstractmethod
    def publish(self, tps: list[TP], planned_ms: int | None = None) -> dict:
        """The sink's checkpoints of ``tps``, as they are now, to the group; returns what was published."""

    @abstractmethod
    def move(self, plan: Plan) -> None:
        """:meth:`reset`'s own step: the sink's checkpoints of ``plan``'s active ranges moved, no rows."""

    @contextmanager
    def counted(self, output: Output) -> Iterator[int]:
        """The source's record count, the source persisted meanwhile: the results, the dead letters
        and the count each read it (an aggregating transform's output says nothing of its input
        size), and Kafka is read once. Results and dead letters split from one frame read it
        persisted too: each record's row or dead letter is one answer of the transform, though the
        two are written by two Spark jobs (a rule on the clock, such as ``current_timestamp()``, is
        fixed per job; a nondeterministic one is asked again by each job)."""
        if output.source is None:
            yield 0
            return
        kept = []
        try:
            for frame in (output.source, output.split_from):
                if frame is not None:
                    frame.persist()  # plans the frame: may raise
                    kept.append(frame)
            yield output.source.count()
        finally:
            for frame in kept:
                frame.unpersist()

    def finish(self, plan: Plan, record: dict, outcome: Outcome) -> Outcome:
        """After the sink's commit: the mirror (standard lag tools see progress; the planner repairs
        it if this is lost), then a committed run's manifest record."""
        from kafka_eos.manifest import COMMITTED, ManifestStore, now_iso, run_key

        self.publish([r.tp for r in plan.active], plan.planned_ms)
        if outcome.status == COMMITTED:
            ManifestStore.of(self.spec, self.settings).put(
                run_key(self.spec.name, plan.run_id),
                {**record, "status": COMMITTED, "records_in": outcome.records_in, "records_out": outcome.records_out,
                 "dead_letters": outcome.dead_letters, "committed_at": now_iso(),
                 "finished_at": datetime.now(timezone.utc).isoformat()})
        return outcome

    def checkpoints(self, tps: list[TP], group: dict[TP, int | None]) -> tuple[dict[TP, int | None], list[Drift]]:
        """:raises CheckpointConflict: the Kafka mirror is ahead of the sink."""
        from kafka_eos.errors import CheckpointConflict

        sink = self.own_checkpoints(tps)
        drift = []
        for tp in tps:
            s, k = sink.get(tp), group.get(tp)
            if s == k:
                continue
            if k is not None and (s is None or k > s):
                raise CheckpointConflict(
                    f"{tp[0]}-{tp[1]}: group {self.spec.source.group_id!r} is at {k} but the {self.place} is at "
                    f"{s}: the Kafka checkpoint is ahead of the sink; reset the group to the sink's offsets")
            drift.append(Drift(tp[0], tp[1], s, k))
        return sink, drift

    def repair(self, drift: list[Drift]) -> None:
        """Republish the sink's checkpoints to the group, as they are now, not as the drift was read."""
        self.publish([(d.topic, d.partition) for d in drift if d.sink is not None])

    def refresh(self, plan: Plan) -> None:
        """The sink's checkpoints as they are now to the group."""
        self.publish([r.tp for r in plan.ranges], plan.planned_ms)

    def reset(self, plan: Plan) -> None:
        """The sink's checkpoints moved (:meth:`move`). A Kafka mirror behind the sink is repaired by
        the next plan; one ahead of it stops the pipeline: so the mirror goes back before the sink
        does, and forward after it."""
        from kafka_eos.kafka_admin import alter_group_offsets

        moving = plan.active
        if not moving:
            return
        back = {r.tp: r.until for r in moving if r.expected is not None and r.until < r.expected}
        if back:
            alter_group_offsets(self.settings, self.spec.source.group_id, back)
        self.move(plan)
        alter_group_offsets(self.settings, self.spec.source.group_id, {r.tp: r.until for r in moving})


def results_apart(output: Output) -> Output:
    """``output`` with a results frame's dead letters (rows with a ``dlq_reason``) apart, where the
    transform did not give them apart itself."""
    from pyspark.sql import functions as F

    from kafka_eos.transforms import DLQ_REASON

    results, dead_letters = output.results, output.dead_letters
    if results is not None and dead_letters is None and DLQ_REASON in results.columns:
        split_from = results
        dead_letters = split_from.where(F.col(DLQ_REASON).isNotNull())
        results = split_from.where(F.col(DLQ_REASON).isNull()).drop(DLQ_REASON)
        return output._replace(results=results, dead_letters=dead_letters, split_from=split_from)
    return output
