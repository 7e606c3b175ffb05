"""An Iceberg sink's catalog, tables and checkpoints, through PyIceberg (docs/iceberg.md).

The checkpoints live in the table itself: each commit of a run is one snapshot whose summary holds
the pipeline's offsets (``kafka-eos.<pipeline>.offsets``: ``{"topic": {"partition": next offset}}``)
and the run (``kafka-eos.<pipeline>.run``). A table's checkpoint is the summary of the newest snapshot
of its ``main`` branch that has one (a maintenance snapshot without it, a compaction, is looked
through to its ancestors). Every kafka-eos commit carries forward the offsets of every pipeline the
ancestry names, so the newest kafka-eos snapshot holds them all.

The catalog: PyIceberg's ``SqlCatalog`` over a SQLAlchemy URL (PostgreSQL, SQLite; ``url: local`` is
kafka-eos's embedded one, ``.local/iceberg/catalog.db``), resolved as a SQL sink's database is
(``sink.conn_id``, else ``sink.url``); the warehouse: ``sink.warehouse``, else the local folder
``.local/iceberg/warehouse``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Iterable, Iterator

from kafka_eos.errors import CheckpointConflict, SpecError
from kafka_eos.kafka_admin import TP
from kafka_eos.paths import local_dir
from kafka_eos.plan import Plan
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

#: The summary properties of a kafka-eos snapshot (``{pipeline}``: the pipeline's name).
OFFSETS_KEY = "kafka-eos.{pipeline}.offsets"
RUN_KEY = "kafka-eos.{pipeline}.run"
_OFFSETS_PREFIX, _OFFSETS_SUFFIX = "kafka-eos.", ".offsets"
#: Arrow bytes gathered before they are written as data files: the driver holds at most this much
#: of a run's results (PyIceberg then splits them by ``write.target-file-size-bytes``).
CHUNK_BYTES = 128 << 20
#: The dead-letter table's columns.
DEAD_LETTER_COLUMNS = ("pipeline", "topic", "partition", "offset", "key", "value", "reason", "run_id")


def warehouse(spec: PipelineSpec) -> str:
    """Where new tables' files go: ``sink.warehouse``, else kafka-eos's local folder."""
    if spec.sink.warehouse:
        return spec.sink.warehouse
    folder = local_dir() / "iceberg" / "warehouse"
    folder.mkdir(parents=True, exist_ok=True)
    return folder.as_uri()


def identifier(table: str) -> tuple[str, str]:
    """``namespace.table`` as (namespace, table); a bare name is in namespace ``default``."""
    namespace, _, name = table.rpartition(".")
    return (namespace or "default", name)


class IcebergStore:
    """One pipeline's Iceberg catalog and tables.

    :param url: the catalog's database (a SQLAlchemy URL: :func:`kafka_eos.sinks.sql_store.database_url`).
    """

    def __init__(self, spec: PipelineSpec, url: str) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        if url.startswith("sqlite:///"):
            from pathlib import Path

            Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        self.catalog = SqlCatalog(spec.sink.catalog, uri=url, warehouse=warehouse(spec))
        self.offsets_key = OFFSETS_KEY.format(pipeline=spec.name)
        self.run_key = RUN_KEY.format(pipeline=spec.name)

    # -- tables -------------------------------------------------------------------------------

    def table(self, name: str) -> "Table | None":
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(identifier(name))
        except NoSuchTableError:
            return None

    def create_table(self, name: str, schema: "pa.Schema") -> "Table":
        """The table ``name``, created with ``schema`` (every field optional: a transform's
        nullability may differ from run to run) where it does not exist yet."""
        import pyarrow as pa

        ident = identifier(name)
        self.catalog.create_namespace_if_not_exists(ident[0])
        optional = pa.schema([f.with_nullable(True) for f in schema])
        return self.catalog.create_table_if_not_exists(ident, schema=optional)

    def results_table(self, spark_schema) -> "Table":
        """The results table, created from the transform's output schema where missing."""
        from pyspark.sql.pandas.types import to_arrow_schema

        return self.create_table(self.spec.sink.table, to_arrow_schema(spark_schema, timezone="UTC"))

    def dead_letters_table(self) -> "Table":
        import pyarrow as pa

        return self.create_table(self.spec.sink.dead_letters_table, _dead_letter_schema(pa))

    def places(self) -> list[tuple[str, str, str, str]]:
        """``(role, namespace, name, URI)`` of the results and dead-letter tables, by OpenLineage's
        naming of a table in storage (its location: ``file`` and the path, ``s3://bucket`` and the
        key, ...); a table not created yet: its catalog name under ``iceberg://<catalog>``."""
        found = []
        for role, name in (("output", self.spec.sink.table), ("dead_letters", self.spec.sink.dead_letters_table)):
            table = self.table(name)
            if table is None:
                ns = f"iceberg://{self.spec.sink.catalog}"
                found.append((role, ns, ".".join(identifier(name)), f"{ns}/{'.'.join(identifier(name))}"))
                continue
            location = table.location().rstrip("/")
            scheme, _, rest = location.partition("://")
            if scheme == "file":
                found.append((role, "file", rest, location))
            else:
                authority, _, path = rest.partition("/")
                found.append((role, f"{scheme}://{authority}", path, location))
        return found

    # -- checkpoints ----------------------------------------------------------------------------

    def offsets(self, table: "Table | None", pipeline: str | None = None) -> dict[TP, int]:
        """A pipeline's checkpoints in ``table`` (this one's by default): the newest snapshot of
        ``main`` that has them, looking through snapshots that do not (a compaction's)."""
        key = OFFSETS_KEY.format(pipeline=pipeline or self.spec.name)
        for summary in _ancestry(table):
            raw = summary.get(key)
            if raw is not None:
                return _parse_offsets(raw, key)
        return {}

    def carried(self, table: "Table | None") -> dict[str, str]:
        """Every pipeline's offsets the ancestry of ``table``'s ``main`` names, each the newest:
        what a new snapshot carries forward."""
        found: dict[str, str] = {}
        for summary in _ancestry(table):
            for key, value in summary.additional_properties.items():
                if key.startswith(_OFFSETS_PREFIX) and key.endswith(_OFFSETS_SUFFIX) and key not in found:
                    found[key] = value
        return found

    def checkpoints(self, tps: list[TP]) -> dict[TP, int | None]:
        have = self.offsets(self.table(self.spec.sink.table))
        return {tp: have.get(tp) for tp in tps}

    def check(self, table: "Table | None", plan: Plan, place: str) -> bool:
        """Whether ``plan`` is still to be committed to ``table``: every active range's checkpoint
        at its ``expected`` offset (True), or every one at its end already (False: an earlier
        attempt committed it).

        :raises CheckpointConflict: a checkpoint neither, naming the partition and the place.
        """
        current = self.offsets(table)
        if all(current.get(r.tp) == r.until for r in plan.active):
            return False
        for r in plan.active:
            if current.get(r.tp) != r.expected:
                raise CheckpointConflict(
                    f"{r.topic}-{r.partition}: Iceberg {place} {self.spec.sink.table!r} is at {current.get(r.tp)}, "
                    f"the plan of run {plan.run_id!r} expected {r.expected} (ends at {r.until}): a concurrent or "
                    "stale plan")
        return True

    # -- writing --------------------------------------------------------------------------------

    def write_files(self, table: "Table", batches: Iterable["pa.RecordBatch"]) -> tuple[list["DataFile"], int]:
        """Data files of ``batches`` (Parquet, in the table's location), written a chunk of
        :data:`CHUNK_BYTES` at a time: (the files, their rows). Nothing is committed: files of a
        run that fails before its commit are orphans no snapshot names."""
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files, schema_to_pyarrow

        target = schema_to_pyarrow(table.schema(), include_field_ids=False)
        files: list = []
        rows = 0
        chunk: list = []
        size = 0

        def flush() -> None:
            nonlocal chunk, size
            if chunk:
                whole = pa.Table.from_batches(chunk).select(target.names).cast(target)
                files.extend(_dataframe_to_data_files(table_metadata=table.metadata, df=whole, io=table.io))
            chunk, size = [], 0

        for batch in batches:
            if not batch.num_rows:
                continue
            chunk.append(_utc(batch))
            size += batch.nbytes
            rows += batch.num_rows
            if size >= CHUNK_BYTES:
                flush()
        flush()
        return files, rows

    def commit_files(self, table: "Table", plan: Plan, files: list["DataFile"], place: str) -> bool:
        """One snapshot of ``table``'s ``main`` adding ``files``, its summary holding the plan's
        offsets (and every other pipeline's, carried forward) and the run: committed only if
        ``main`` is still the snapshot whose offsets :meth:`check` read (the catalog's
        compare-and-set); PyIceberg's own retry onto a newer snapshot is off.

        :returns: False when a concurrent attempt committed the plan first (a no-op).
        :raises CheckpointConflict: another commit moved the checkpoint elsewhere.
        """
        from pyiceberg.exceptions import CommitFailedException

        offsets = self.offsets(table)
        offsets.update({r.tp: r.until for r in plan.active})
        properties = {**self.carried(table), self.offsets_key: _format_offsets(offsets), self.run_key: plan.run_id}
        tx = _without_retries(table).transaction()
        with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
            for data_file in files:
                append.append_data_file(data_file)
        try:
            tx.commit_transaction()
        except CommitFailedException:
            now = self.offsets(self.catalog.load_table(table.name()))
            if all(now.get(r.tp) == r.until for r in plan.active):
                return False  # a concurrent attempt of the same plan committed it
            raise CheckpointConflict(f"Iceberg {place} {'.'.join(table.name())}: another commit moved it while run "
                                     f"{plan.run_id!r} committed; nothing of the run was committed there") from None
        return True


def _without_retries(table: "Table") -> "Table":
    """``table`` whose commits PyIceberg does not retry: a retry rebases the snapshot onto whatever
    committed meanwhile, past the checkpoint check (a duplicate when that was this run's twin)."""
    from pyiceberg.table import Table, TableProperties

    metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog)


def _ancestry(table: "Table | None") -> Iterator:
    """The summaries of ``table``'s ``main`` branch, newest first."""
    if table is None:
        return
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.summary is not None:
            yield snapshot.summary
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)


def _format_offsets(offsets: dict[TP, int]) -> str:
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(by_topic, sort_keys=True, separators=(",", ":"))


def _parse_offsets(raw: str, key: str) -> dict[TP, int]:
    try:
        return {(topic, int(p)): int(o) for topic, parts in json.loads(raw).items() for p, o in parts.items()}
    except (ValueError, AttributeError) as exc:
        raise SpecError(f"snapshot summary {key}: not kafka-eos's offsets ({exc})") from None


def _dead_letter_schema(pa) -> "pa.Schema":
    return pa.schema([("pipeline", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("key", pa.binary()), ("value", pa.binary()),
                      ("reason", pa.string()), ("run_id", pa.string())])


def dead_letter_batches(rows: Iterable[dict], size: int = 10_000) -> Iterator["pa.RecordBatch"]:
    """Dead-letter rows (:func:`kafka_eos.sinks.sql.dead_letter_rows`) as record batches."""
    import pyarrow as pa

    schema = _dead_letter_schema(pa)
    chunk: list[dict] = []
    for row in rows:
        chunk.append({c: row[c] for c in DEAD_LETTER_COLUMNS})
        if len(chunk) >= size:
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk, schema=schema)


def _utc(batch: "pa.RecordBatch") -> "pa.RecordBatch":
    """Spark's zoned timestamps in UTC (Iceberg's ``timestamptz`` is UTC; its ``timestamp`` takes the
    UTC wall-clock time)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    zoned = [i for i, f in enumerate(batch.schema) if pa.types.is_timestamp(f.type) and f.type.tz]
    if not zoned:
        return batch
    columns = list(batch.columns)
    for i in zoned:
        columns[i] = pc.cast(columns[i], pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
