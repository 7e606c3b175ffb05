"""The checkers: one number each, all zero when a run under a fault was exactly-once.

Every input record carries an order id; the ground truth is what the input's producer committed
and aborted. The output is read by a read_committed :class:`Verifier` that runs beside the
pipeline from its start (Kafka sinks) or from the SQL table (whose ``times`` column counts writes).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from dataclasses import asdict, dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition
from sqlalchemy import text

from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, committed_offsets, partition_offsets, partitions_of
from kafka_eos.pipeline import checkpoints
from kafka_eos.readers import read_committed, settled_offsets
from kafka_eos.sample_data import Produced
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec


@dataclass(frozen=True)
class Counts:
    """What a scenario's checkers found; None: does not apply to this sink."""

    lost: int  # committed input ids missing from the output
    duplicated: int  # writes of an id beyond its first
    aborted_visible: int  # ids of aborted input transactions in the output
    uncommitted_visible: int | None  # output offsets in transactions still open (HW - LSO)
    checkpoint_gap: int  # records on the wrong side of the checkpoint: below it and missing, or above it and written
    open_transactions: int | None  # output partitions an open transaction pins (LSO < HW)
    sql_drift: int | None  # source partitions whose SQL checkpoint and Kafka mirror differ

    def anomalies(self) -> int:
        return sum(v or 0 for v in asdict(self).values())


class Verifier(threading.Thread):
    """Reads ``topic`` read_committed from its start while the pipeline runs, counting every order
    id it sees; :meth:`finish` reads on to the LSO and returns the counts."""

    def __init__(self, settings: KafkaSettings, topic: str, partitions: int) -> None:
        super().__init__(name=f"verifier {topic}", daemon=True)
        self.settings, self.topic, self.partitions = settings, topic, partitions
        self.seen: Counter = Counter()
        self._ends: dict[int, int] | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        consumer = Consumer(self.settings.client_config(**{
            "group.id": f"kafka-eos.chaos-verifier.{uuid.uuid4()}", "enable.auto.commit": False,
            "isolation.level": "read_committed"}))
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            positions = {p: 0 for p in range(self.partitions)}
            while self._ends is None or any(positions[p] < end for p, end in self._ends.items()):
                for msg in consumer.consume(1000, 0.5):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"{self.topic}-{msg.partition()}: {msg.error().str()}")
                        continue
                    self.seen[json.loads(msg.value())["order_id"]] += 1
                    positions[msg.partition()] = msg.offset() + 1
                if self._ends is not None:
                    # Past the last record, only markers: the consumer's position says how far it read.
                    for tp in consumer.position([TopicPartition(self.topic, p) for p in range(self.partitions)]):
                        positions[tp.partition] = max(positions[tp.partition], tp.offset)
        except BaseException as exc:  # noqa: BLE001 - handed to finish()
            self._error = exc
        finally:
            consumer.close()

    def finish(self, timeout_s: float = ADMIN_TIMEOUT_S * 4) -> Counter:
        offsets = partition_offsets(self.settings, [(self.topic, p) for p in range(self.partitions)])
        self._ends = {p: offsets[(self.topic, p)].lso for p in range(self.partitions)}
        self.join(timeout_s)
        if self._error is not None:
            raise self._error
        if self.is_alive():
            raise TimeoutError(f"verifier of {self.topic}: not at the LSO {self._ends} within {timeout_s:g}s")
        return self.seen


def sql_writes(spec: PipelineSpec) -> Counter:
    """How often the SQL sink wrote each order id (its ``times`` column)."""
    from kafka_eos.sinks.sql_store import make_engine

    with make_engine(spec.sink.url).connect() as conn:
        return Counter({row[0]: row[1] for row in conn.execute(text(f"SELECT order_id, times FROM {spec.sink.table}"))})


def iceberg_writes(spec: PipelineSpec) -> Counter:
    """How often the Iceberg sink wrote each order id (its rows in the table, read by PyIceberg)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from kafka_eos.sinks.iceberg_store import identifier

    catalog = SqlCatalog(spec.sink.catalog, uri=spec.sink.url, warehouse=spec.sink.warehouse)
    try:
        table = catalog.load_table(identifier(spec.sink.table))
    except Exception:  # noqa: BLE001 - no table: nothing was ever committed
        return Counter()
    return Counter(table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())


def count(settings: KafkaSettings, spec: PipelineSpec, truth: Produced, written: Counter) -> Counts:
    """Run every checker on a scenario's end state.

    :param written: how often each order id reached the output (a :class:`Verifier`'s counts, or :func:`sql_writes`).
    """
    committed_ids = {o["order_id"] for o in truth.committed}
    source = spec.source.topics[0]
    # Where each committed input record sits: the checkpoint check needs its partition and offset.
    position = {json.loads(m.value)["order_id"]: (m.partition, m.offset) for m in read_committed(settings, source)}
    tps = sorted({(source, p) for p, _ in position.values()})
    checkpoint, _drift = checkpoints(spec, settings, tps)
    gap = 0
    for order_id in committed_ids:
        p, offset = position[order_id]
        below = checkpoint[(source, p)] is not None and offset < checkpoint[(source, p)]
        gap += below != (order_id in written)
    uncommitted = open_txns = drift = None
    if spec.sink.kind == "kafka":
        topics = [t for t in (spec.sink.topic, spec.sink.dlq_topic) if t]
        out_tps = [(t, p) for t, n in partitions_of(settings, topics).items() for p in range(n)]
        offsets = partition_offsets(settings, out_tps)
        uncommitted = sum(o.high_watermark - o.lso for o in offsets.values())
        open_txns = sum(o.lso < o.high_watermark for o in offsets.values())
    else:
        mirror = committed_offsets(settings, spec.source.group_id, tps)
        drift = sum(checkpoint[tp] != mirror[tp] for tp in tps)
    return Counts(
        lost=len(committed_ids - set(written)),
        duplicated=sum(n - 1 for n in written.values() if n > 1),
        aborted_visible=len(set(truth.aborted) & set(written)),
        uncommitted_visible=uncommitted, checkpoint_gap=gap, open_transactions=open_txns, sql_drift=drift)


def wait_settled(settings: KafkaSettings, spec: PipelineSpec, timeout_s: float) -> None:
    """Give the output's transactions time to settle (a killed attempt's is aborted by the retry's
    init; a broker coming back writes pending markers) before the open-transaction count."""
    if spec.sink.kind != "kafka":
        return
    tps = [(spec.sink.topic, p) for p in range(partitions_of(settings, [spec.sink.topic])[spec.sink.topic])]
    settled_offsets(settings, tps, timeout_s, every_s=1)
