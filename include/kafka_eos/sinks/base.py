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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

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
