"""The one place that chooses a pipeline's sink: its kind and commit scope, as a type.

Every caller that commits or reads checkpoints (a run, a stream, a refresh, a reset, a plan)
asks :func:`sink_of` and talks to the :class:`~kafka_eos.sinks.base.Sink` face; nothing else
switches on ``sink.kind`` or ``sink.commit`` to decide how to commit.
"""

from __future__ import annotations

from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.atomic import AtomicSink
from kafka_eos.sinks.base import Sink
from kafka_eos.sinks.iceberg import IcebergSink
from kafka_eos.sinks.per_partition import PerPartitionSink
from kafka_eos.sinks.sql import SqlSink
from kafka_eos.spec import PipelineSpec

#: (sink.kind, sink.commit) -> the sink's type. The spec's validation allows only these pairs.
SCOPES: dict[tuple[str, str], type[Sink]] = {
    ("kafka", "atomic"): AtomicSink,
    ("kafka", "per_partition"): PerPartitionSink,
    ("sql", "atomic"): SqlSink,
    ("iceberg", "atomic"): IcebergSink,
}


def sink_of(spec: PipelineSpec, settings: KafkaSettings, keep: bool = False) -> Sink:
    """The sink of ``spec``.

    :param keep: a long-lived sink for a stream's many batches (see :class:`Sink`).
    """
    return SCOPES[(spec.sink.kind, spec.sink.commit)](spec, settings, keep)
