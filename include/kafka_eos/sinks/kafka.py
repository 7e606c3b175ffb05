"""What both commit scopes of a Kafka sink share: preparing the output (record limits, checks,
encoders), placing the records that did not decode, and the manifest records written inside a
transaction.

The scopes themselves: :mod:`kafka_eos.sinks.atomic` (one transaction on the driver) and
:mod:`kafka_eos.sinks.per_partition` (one transaction per source partition, on the executors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from kafka_eos import formats
from kafka_eos.errors import SpecError
from kafka_eos.kafka_admin import transaction_max_timeout_ms
from kafka_eos.manifest import COMMITTED, checkpoint_key, checkpoint_record, now_iso
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks import batches
from kafka_eos.sinks.base import Output, Sink
from kafka_eos.sinks.limits import with_record_limits
from kafka_eos.spec import PipelineSpec
from kafka_eos.transforms import DLQ_REASON

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

#: Columns a Kafka-sink transform must return (kafka_eos.transforms documents the contract).
REQUIRED_COLUMNS = ("key", "value", "topic", "partition", "offset", DLQ_REASON)


class KafkaSink(Sink):
    """A Kafka sink in either scope: :meth:`start` and :meth:`prepare`; the scopes commit."""

    def _start(self) -> None:
        """1. Before Spark starts: the transaction timeout is one the brokers accept, and the
        largest record each written topic takes (a record too large is found before produce())."""
        check_transaction_timeout(self.spec, self.settings)
        self.spec = with_record_limits(self.spec, self.settings)

    def prepare(self, output: Output) -> Output:
        """2. The output's checks, and its key and value encoded (their schemas registered, or
        refused, before anything is written).

        :raises SpecError: a ``(results, dead_letters)`` transform, or an output column missing.
        """
        if output.dead_letters is not None:
            raise SpecError(f"{self.spec.path}: transform: a Kafka sink needs one DataFrame with "
                            f"{DLQ_REASON}, not (results, dead_letters)")
        results = output.results
        if results is not None:
            check_output(results, self.spec)
            results = formats.encoded(results, formats.sink_encoders(self.spec, self.settings, results))
        return output._replace(results=results)


def check_transaction_timeout(spec: PipelineSpec, settings: KafkaSettings) -> None:
    """A Kafka sink's transaction timeout must be one the brokers accept: checked before Spark
    starts, not found out at the first commit.

    :raises SpecError: naming the field, its value and the brokers' limit.
    """
    limit_ms = transaction_max_timeout_ms(settings)
    if spec.sink.transaction_timeout_s * 1000 > limit_ms:
        raise SpecError(f"{spec.path}: sink.transaction_timeout_s: {spec.sink.transaction_timeout_s} is above the "
                        f"brokers' transaction.max.timeout.ms ({limit_ms / 1000:g} s): lower it, or raise the "
                        "brokers' limit")


def check_output(df: "DataFrame", spec: PipelineSpec) -> None:
    """Reject a transform output the Kafka sink cannot commit exactly once.

    :raises SpecError: naming the missing column.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise SpecError(f"{spec.path}: transform: {spec.transform} output lacks column(s) "
                        f"{', '.join(missing)} (see kafka_eos.transforms)")


def with_dead_letters(results: "DataFrame | None", undecodable: "DataFrame") -> "DataFrame":
    """A Kafka sink's output and the records that did not decode, as one DataFrame of the columns
    it writes (an atomic run: one transaction, written from the driver)."""
    dead = _as_output(results, undecodable)
    return dead if results is None else batches.prepared(results).unionByName(dead)


def dead_letter_batches(results: "DataFrame | None", undecodable: "DataFrame") -> dict:
    """The records that did not decode, per source partition, as Arrow batches of the columns the
    sink writes: a per_partition run writes them in their partition's transaction (a union would
    put a partition's rows in two Spark tasks)."""
    # pyarrow: loaded by Spark's Arrow path anyway, kept off the import of every process that plans.
    import pyarrow as pa
    import pyarrow.compute as pc

    found = batches.fetched(_as_output(results, undecodable), list)  # not one job's result, if too large
    if not found:
        return {}
    table = pa.Table.from_batches(found)
    out: dict = {}
    for t, p in {(t, p) for t, p in zip(table.column("topic").to_pylist(), table.column("partition").to_pylist())}:
        part = table.filter(pc.and_(pc.equal(table.column("topic"), t), pc.equal(table.column("partition"), p)))
        out[(t, p)] = part.to_batches()
    return out


def _as_output(results: "DataFrame | None", undecodable: "DataFrame") -> "DataFrame":
    """The records that did not decode in the columns the sink writes, headers only where the
    output has them."""
    dead = batches.prepared(undecodable)
    return dead.drop("headers") if results is not None and "headers" not in results.columns else dead


def committed_record(out: int, dead: int) -> dict:
    """The fields of a manifest record written inside the transaction that committed its work.
    ``read: whole``: the commit saw its input's end as Spark ended it (:mod:`kafka_eos.sinks.proof`;
    the atomic scope: the job's own result, before the commit), which records of versions
    without the proof lack (``kafka-eos audit`` tells them apart)."""
    return {"status": COMMITTED, "records_out": out, "dead_letters": dead, "records_in": out + dead,
            "committed_at": now_iso(), "read": "whole"}


def checkpoint_records(spec: PipelineSpec, plan: Plan, ranges: Iterable[PartitionRange]):
    """The manifest's checkpoint records of ``ranges``, written inside the transaction that commits them."""
    return [(spec.manifest_topic, checkpoint_key(spec.name, r.topic, r.partition),
             checkpoint_record(plan.run_id, spec.source.group_id, r.topic, r.partition, r.until)) for r in ranges]
