"""The one place that chooses a pipeline's sink: its kind and commit scope, as a type.

Every caller that commits or reads checkpoints (a run, a stream, a refresh, a reset, a plan)
asks :func:`sink_of` and talks to the :class:`~kafka_eos.sinks.base.Sink` face; nothing else
switches on ``sink.kind`` or ``sink.commit`` to decide how to commit.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.base import Sink
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # the types SCOPES names (imported by sink_type), for readers and the import graph
    from kafka_eos.sinks.atomic import AtomicSink  # noqa: F401
    from kafka_eos.sinks.iceberg import IcebergSink  # noqa: F401
    from kafka_eos.sinks.per_partition import PerPartitionSink  # noqa: F401
    from kafka_eos.sinks.sql import SqlSink  # noqa: F401

#: (sink.kind, sink.commit) -> the sink's type, as ``module:class``. The spec's validation allows
#: only these pairs. Imported when asked for: a Kafka sink's run does not load SQLAlchemy or
#: pyiceberg (a tenth of a second of every CLI run and every driver's start).
SCOPES: dict[tuple[str, str], str] = {
    ("kafka", "atomic"): "kafka_eos.sinks.atomic:AtomicSink",
    ("kafka", "per_partition"): "kafka_eos.sinks.per_partition:PerPartitionSink",
    ("sql", "atomic"): "kafka_eos.sinks.sql:SqlSink",
    ("iceberg", "atomic"): "kafka_eos.sinks.iceberg:IcebergSink",
}


def sink_type(kind: str, commit: str) -> type[Sink]:
    """The sink's type of a ``(sink.kind, sink.commit)`` pair of :data:`SCOPES`."""
    module, name = SCOPES[(kind, commit)].split(":")
    return getattr(import_module(module), name)


def sink_of(spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> Sink:
    """The sink of ``spec``.

    :param keep: a long-lived sink for a stream's many batches (see :class:`Sink`).
    """
    return sink_type(spec.sink.kind, spec.sink.commit)(spec, settings, keep)
