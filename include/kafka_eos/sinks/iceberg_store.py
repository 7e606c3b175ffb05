"""An Iceberg sink's catalog, tables and checkpoints, through PyIceberg (docs/iceberg.md).

The checkpoints live in the table itself: each commit of a run is one snapshot whose summary holds
the pipeline's offsets (``kafka-eos.<pipeline>.offsets``: ``{"topic": {"partition": next offset}}``)
and the run (``kafka-eos.<pipeline>.run``). A table's checkpoint is the summary of the newest snapshot
of its ``main`` branch that has one (a maintenance snapshot without it, a compaction, is looked
through to its ancestors). Every kafka-eos commit carries forward the offsets of every pipeline the
ancestry names, so the newest kafka-eos snapshot holds them all.

A side run (a replay, a backfill) commits to a branch of its own (``sink.branch``), cut from ``main``
at its first commit: its offsets are the summary of that branch's snapshots, under its own name;
:meth:`IcebergStore.promote` moves a branch onto ``main``.

The catalog (:func:`open_catalog`), resolved as a SQL sink's database is (``sink.conn_id``, else
``sink.url``): PyIceberg's ``SqlCatalog`` over a SQLAlchemy URL (PostgreSQL, SQLite; ``url: local`` is
kafka-eos's embedded one, ``.local/iceberg/catalog.db``; the warehouse: ``sink.warehouse``, else the
local folder ``.local/iceberg/warehouse``), or a REST catalog at an ``http(s)://`` URL (its
credentials in the URL's user part, its other properties in the query: :func:`rest_properties`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Iterable, Iterator

from kafka_eos.errors import CheckpointConflict, CheckpointLost, PlanError, SpecError
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
#: Table properties: the commit that promoted a side run's branch onto ``main`` sets one for the
#: branch (the branch's snapshot it promoted) and one for the side run (the branch): ``{name}``.
PROMOTED_KEY = "kafka-eos.promoted.{name}"
#: A table property set by the commit that cut a side run's branch: the ``main`` snapshot it was cut from.
CUT_KEY = "kafka-eos.cut.{branch}"
#: A table property: the ranges of a pipeline's side runs promoted onto ``main`` (``{"topic-p": [[from, until]]}``).
RANGES_KEY = "kafka-eos.{pipeline}.promoted-ranges"
#: A table property set by a pipeline's first commit (its run id): the pipeline has committed to
#: this table, so offsets missing from an expired ancestry are lost, not never written.
MARKER_KEY = "kafka-eos.{pipeline}.first-run"
_OFFSETS_PREFIX, _OFFSETS_SUFFIX = "kafka-eos.", ".offsets"
#: Arrow bytes gathered before they are written as data files: the driver holds at most this much
#: of a run's results (PyIceberg then splits them by ``write.target-file-size-bytes``).
CHUNK_BYTES = 128 << 20
#: How often a run's commit is checked and tried again after other commits moved the table.
COMMIT_ATTEMPTS = 5
#: The dead-letter table's columns.
DEAD_LETTER_COLUMNS = ("pipeline", "topic", "partition", "offset", "key", "value", "reason", "run_id")


def warehouse(spec: PipelineSpec) -> str:
    """Where new tables' files go: ``sink.warehouse``, else kafka-eos's local folder."""
    if spec.sink.warehouse:
        return spec.sink.warehouse
    folder = local_dir() / "iceberg" / "warehouse"
    folder.mkdir(parents=True, exist_ok=True)
    return folder.as_uri()


def is_rest(url: str) -> bool:
    """Whether a catalog URL names a REST catalog (else a SQL catalog's database)."""
    return url.startswith(("http://", "https://"))


#: Catalog properties that hold secrets (by a word in their name): checked for control characters,
#: kept out of every message, masked in Airflow's logs.
SECRET_WORDS = ("credential", "token", "secret", "password", "sas", "key", "authorization", "connection-string")
#: ... except these, which name a secret's owner or kind, not the secret.
NOT_SECRET = ("s3.access-key-id", "token-type", "rest.signing-name")


def is_secret(name: str) -> bool:
    """Whether catalog property ``name`` holds a secret (:data:`SECRET_WORDS`)."""
    name = name.lower()
    return name not in NOT_SECRET and any(word in name for word in SECRET_WORDS)


def rest_properties(url: str) -> dict[str, str]:
    """PyIceberg's REST catalog properties of ``url``:
    ``https://CLIENT_ID:CLIENT_SECRET@host/path?warehouse=w&scope=s`` gives ``uri``
    (``https://host/path``), ``credential`` (``CLIENT_ID:CLIENT_SECRET``: OAuth2 client credentials);
    ``https://:TOKEN@host/path`` gives ``token`` (a bearer token); each query parameter is a
    property (``warehouse``, ``scope``, ``oauth2-server-uri``, ``header.X-Iceberg-Access-Delegation``,
    ``s3.*``, ...). Credentials holding ``@ / ? # :`` must be percent-encoded (the Airflow
    connection's URL is). The URL holds secrets: never log it.

    :raises SpecError: not such a URL, a user part that is not percent-encoded (a second ``@``), a
        secret with a control character — never quoting the URL.
    """
    from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" in parts.netloc.rpartition("@")[0] or "@" in parts.path or "@" in parts.fragment:
        raise SpecError("Iceberg REST catalog URL: its credentials must be percent-encoded ('@', '/', '?', '#' "
                        "within them)")
    try:
        port = parts.port
    except ValueError:
        raise SpecError("Iceberg REST catalog URL: not http(s)://[user:secret@]host[:port][/path][?properties] "
                        "(percent-encode the credentials)") from None
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if port:
        netloc += f":{port}"
    properties = {"uri": urlunsplit((parts.scheme, netloc, parts.path, "", ""))}
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if user:
        properties["credential"] = f"{user}:{password}"
    elif password:
        properties["token"] = password
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(c in name for name, _value in query for c in "@/"):  # a raw secret's "?" split the URL there
        raise SpecError("Iceberg REST catalog URL: its credentials must be percent-encoded ('@', '/', '?', '#' "
                        "within them)")
    properties.update(query)
    for name, value in properties.items():
        if is_secret(name) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise SpecError(f"Iceberg REST catalog URL: its {name} holds a control character (a line break?)")
    return properties


def _redacted(text: str, properties: dict[str, str]) -> str:
    """``text`` without the secrets of ``properties``: as written, percent-encoded (both ways), as
    a Python literal would show them, and a credential's secret half alone."""
    from urllib.parse import quote, quote_plus

    for name, value in properties.items():
        if not is_secret(name) or not value:
            continue
        for secret in {value, *value.split(":", 1)[1:]}:
            if len(secret) >= 4:
                for form in (secret, quote(secret, safe=""), quote_plus(secret), repr(secret)[1:-1]):
                    text = text.replace(form, "***")
    return text


def open_catalog(spec: PipelineSpec, url: str):
    """The pipeline's catalog at ``url`` (see the module's docstring).

    :raises SpecError: a SQL catalog other than the embedded one without ``sink.warehouse``.
    """
    if is_rest(url):
        from pyiceberg.catalog.rest import RestCatalog

        try:
            properties = rest_properties(url)
        except SpecError as exc:
            raise SpecError(f"{spec.path}: sink: {exc}") from None
        if spec.sink.warehouse:
            properties.setdefault("warehouse", spec.sink.warehouse)
        try:
            return RestCatalog(spec.sink.catalog, **properties)
        except Exception as exc:  # noqa: BLE001 - PyIceberg's REST errors, said in one line (never the URL's secrets)
            first = _redacted((str(exc).strip().splitlines() or [""])[0], properties)
            raise SpecError(f"{spec.path}: Iceberg REST catalog {properties['uri']}: {type(exc).__name__}: {first}") \
                from None
    from pyiceberg.catalog.sql import SqlCatalog

    if url.startswith("sqlite:///"):
        from pathlib import Path

        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    if spec.sink.warehouse is None and spec.sink.url != "local":
        raise SpecError(f"{spec.path}: sink.warehouse: required for an iceberg sink on a SQL catalog other than the "
                        "embedded one (url: local): where the catalog puts the table's files")
    return SqlCatalog(spec.sink.catalog, uri=url, warehouse=warehouse(spec))


def identifier(table: str) -> tuple[str, str]:
    """``namespace.table`` as (namespace, table); a bare name is in namespace ``default``."""
    namespace, _, name = table.rpartition(".")
    return (namespace or "default", name)


class IcebergStore:
    """One pipeline's Iceberg catalog and tables.

    :param url: the catalog's database (a SQLAlchemy URL: :func:`kafka_eos.sinks.sql_store.database_url`).
    """

    def __init__(self, spec: PipelineSpec, url: str) -> None:
        self.spec = spec
        self.catalog = open_catalog(spec, url)
        self.offsets_key = OFFSETS_KEY.format(pipeline=spec.name)
        self.run_key = RUN_KEY.format(pipeline=spec.name)
        self.branch = spec.sink.branch

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
        optional = pa.schema([_optional(f) for f in schema])
        return self.catalog.create_table_if_not_exists(ident, schema=optional)

    def results_table(self, spark_schema) -> "Table":
        """The results table, created from the transform's output schema where missing, with the
        spec's partition fields (``sink.partition_by``; an existing table keeps its own spec).

        :raises SpecError: a partition field the output's columns cannot take, naming it.
        """
        from pyspark.sql.pandas.types import to_arrow_schema

        from kafka_eos.spec import partition_field

        table = self.create_table(self.spec.sink.table, to_arrow_schema(spark_schema, timezone="UTC"))
        if self.spec.sink.partition_by and table.current_snapshot() is None and table.spec().is_unpartitioned():
            try:
                with table.update_spec() as update:
                    for text in self.spec.sink.partition_by:
                        update.add_field(*partition_field(text))
            except ValueError as exc:
                raise SpecError(f"{self.spec.path}: sink.partition_by: {exc}") from None
            table = self.catalog.load_table(table.name())
        return table

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
        ``main`` that has them, looking through snapshots that do not (a compaction's).

        :raises CheckpointLost: the ancestry ends at an expired snapshot before one that has them
            (kafka-eos cannot tell "never committed" from "expired": the pipeline must not start over).
        """
        key = OFFSETS_KEY.format(pipeline=pipeline or self.spec.name)
        for summary in _ancestry(table, self.branch):
            if summary is _EXPIRED:
                if MARKER_KEY.format(pipeline=pipeline or self.spec.name) not in table.properties:
                    return {}  # it never committed here (a table it adopts, with expired history)
                raise CheckpointLost(
                    f"Iceberg table {'.'.join(table.name())}: the snapshots since pipeline "
                    f"{pipeline or self.spec.name!r}'s last commit were compacted and its snapshot was expired: "
                    "its offsets are gone from the table; reset it explicitly (`kafka-eos reset`) from the group's "
                    "mirror or a known offset")
            raw = summary.additional_properties.get(key)
            if raw is not None:
                return _parse_offsets(raw, key)
        return {}

    def carried(self, table: "Table | None") -> dict[str, str]:
        """Every pipeline's offsets the ancestry of ``table``'s ``main`` names, each the newest:
        what a new snapshot carries forward."""
        found: dict[str, str] = {}
        for summary in _ancestry(table, self.branch):
            if summary is _EXPIRED:
                break
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

    def write_files(self, table: "Table", batches: Iterable["pa.RecordBatch"],
                    keys: list["pa.Table"] | None = None) -> tuple[list["DataFile"], int]:
        """Data files of ``batches`` (Parquet, in the table's location), written a chunk of
        :data:`CHUNK_BYTES` at a time: (the files, their rows). Nothing is committed: files of a
        run that fails before its commit are orphans no snapshot names.

        :param keys: where given, the values of ``sink.key_columns`` of every row written are
            added to it (as the table's types), for :meth:`rewrites`.
        """
        import pyarrow as pa
        from pyiceberg.io.pyarrow import _dataframe_to_data_files, schema_to_pyarrow

        target = schema_to_pyarrow(table.schema(), include_field_ids=False)
        checked = False
        files: list = []
        rows = 0
        chunk: list = []
        size = 0

        def flush() -> None:
            nonlocal chunk, size
            if chunk:
                whole = pa.Table.from_batches(chunk).select(target.names).cast(target)
                if keys is not None:
                    keys.append(whole.select(list(self.spec.sink.key_columns)))
                files.extend(_dataframe_to_data_files(table_metadata=table.metadata, df=whole, io=table.io))
            chunk, size = [], 0

        for batch in batches:
            if not batch.num_rows:
                continue
            batch = _utc(batch)
            if not checked:
                self._check_schema(table, batch.schema)
                missing = [k for k in self.spec.sink.key_columns if k not in batch.schema.names] if keys is not None \
                    else []
                if missing:
                    raise SpecError(f"{self.spec.path}: sink.key_columns: {', '.join(missing)} not in the transform's "
                                    f"output for Iceberg table {self.spec.sink.table!r}")
                checked = True
            chunk.append(batch)
            size += batch.nbytes
            rows += batch.num_rows
            if size >= CHUNK_BYTES:
                flush()
        flush()
        return files, rows

    def _check_schema(self, table: "Table", schema: "pa.Schema") -> None:
        """:raises SpecError: ``schema`` has a field ``table`` lacks (top level or nested) or a type
        it cannot take without loss (Iceberg's promotion rules), naming the table: never a column
        dropped or narrowed in silence. (Evolve the table's schema first: the catalog's tools.)"""
        from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible

        try:
            _check_pyarrow_schema_compatible(table.schema(), provided_schema=schema,
                                             format_version=table.metadata.format_version)
        except ValueError as exc:
            first = str(exc).strip().splitlines()[0]
            raise SpecError(f"Iceberg table {'.'.join(table.name())}: the transform's output does not fit its schema "
                            f"({first}); evolve the table's schema first") from None

    def commit_files(self, table: "Table", plan: Plan, files: list["DataFile"],
                     keys: "pa.Table | None" = None, reset: bool = False) -> bool:
        """One snapshot of the results table's branch adding ``files``, its summary holding the
        plan's offsets (and every other pipeline's, carried forward) and the run: committed only if
        the branch is still the snapshot whose offsets were checked (the catalog's compare-and-set;
        PyIceberg's own retry, which rebases onto a newer snapshot past the check, is off). Another
        commit meanwhile (a compaction, another pipeline) that left this pipeline's checkpoint where
        it was: checked again on the new snapshot and tried again, :data:`COMMIT_ATTEMPTS` times.
        With ``keys`` (``merge: upsert``) the same snapshot also replaces the files holding rows of
        those keys by files without them (:meth:`rewrites`, planned again on every attempt).

        The first commit of this pipeline on ``main`` sets the table property ``first-run``: its run
        and, where the table held no offsets of the pipeline before, where it started on each
        partition (main never holds its records below that: what a promote checks a side run
        against). ``reset``: an explicit reset moves those starts down to where it sets the
        checkpoints, in the same commit.

        :returns: False when a concurrent attempt committed the plan first (a no-op).
        :raises CheckpointConflict: another commit moved this pipeline's checkpoint.
        """
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(COMMIT_ATTEMPTS):
            offsets = self.offsets(table)
            had_offsets = bool(offsets)
            offsets.update({r.tp: r.until for r in plan.active})
            properties = {**self.carried(table), self.offsets_key: _format_offsets(offsets),
                          self.run_key: plan.run_id}
            deleted, replacing = self.rewrites(table, keys) if keys is not None else ([], [])
            try:
                _append(table, [*files, *replacing], properties, self._marker(table, plan, had_offsets, reset),
                        self.branch, deleted)
                return True
            except CommitFailedException:
                table = self.catalog.load_table(table.name())
                if not self.check(table, plan, "table"):
                    return False  # a concurrent attempt of the same plan committed it
                log.info("Iceberg table %s moved while run %s committed (attempt %d): checked again",
                         self.spec.sink.table, plan.run_id, attempt + 1)
        raise CheckpointConflict(f"Iceberg table {self.spec.sink.table!r}: moved by other commits "
                                 f"{COMMIT_ATTEMPTS} times while run {plan.run_id!r} committed; nothing of it was "
                                 "committed")

    def _marker(self, table: "Table", plan: Plan, had_offsets: bool, reset: bool) -> dict[str, str]:
        """The ``first-run`` table property to set with this commit ({} to leave it): see
        :meth:`commit_files`."""
        marker = MARKER_KEY.format(pipeline=self.spec.name)
        if self.branch != MAIN:
            return {}
        if marker not in table.properties:
            value: dict = {"run": plan.run_id}
            if not had_offsets:  # its first commit, not the first one recorded on an older table
                value["from"] = json.loads(_format_offsets({r.tp: r.from_offset for r in plan.ranges}))
            return {marker: json.dumps(value, sort_keys=True, separators=(",", ":"))}
        if not reset:
            return {}
        starts = _starts(table.properties[marker])
        if starts is None:
            return {}  # no starts recorded: nothing to move
        value = json.loads(table.properties[marker])
        starts.update({r.tp: min(starts.get(r.tp, r.until), r.until) for r in plan.active})
        value["from"] = json.loads(_format_offsets(starts))
        return {marker: json.dumps(value, sort_keys=True, separators=(",", ":"))}

    def upsert_keys(self, parts: list["pa.Table"]) -> "pa.Table":
        """The run's keys (:meth:`write_files`'s ``keys``) as one table.

        :raises SpecError: a key with a null field, or a key more than once (``merge: upsert``
            keeps one row per key: the transform must give one), naming it.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        names = list(self.spec.sink.key_columns)
        keys = pa.concat_tables(parts) if parts else None
        if keys is None or not keys.num_rows:
            return keys
        for name in names:
            if keys.column(name).null_count:
                raise SpecError(f"{self.spec.path}: sink.key_columns: the run's rows for Iceberg table "
                                f"{self.spec.sink.table!r} hold a null {name!r}: an upsert's key must be set")
        counts = keys.group_by(names).aggregate([([], "count_all")])
        twice = counts.filter(pc.greater(counts.column("count_all"), 1))
        if twice.num_rows:
            first = {n: twice.column(n)[0].as_py() for n in names}
            raise SpecError(f"{self.spec.path}: sink.key_columns: the run's rows for Iceberg table "
                            f"{self.spec.sink.table!r} hold the key {json.dumps(first, default=str)} more than once, "
                            "and merge: upsert keeps one row per key: the transform must give one row per key")
        return keys

    def rewrites(self, table: "Table", keys: "pa.Table | None") -> tuple[list["DataFile"], list["DataFile"]]:
        """Copy-on-write of ``keys``'s rows in ``table``'s branch: (the data files holding rows of
        those keys, the files that replace them: their other rows). The files to read are those
        whose column statistics may hold a key (each key column's range); one file is in memory
        at a time.

        :raises SpecError: the table has row-level delete files (another engine's merge-on-read),
            which this copy-on-write does not apply: compact it first.
        """
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual
        from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

        head = _head(table, self.branch)
        if head is None or keys is None or not keys.num_rows:
            return [], []
        names = list(self.spec.sink.key_columns)
        where = AlwaysTrue()
        for name in names:
            low, high = (v.as_py() for v in pc.min_max(keys.column(name)).values())
            if isinstance(low, (int, str)) and not isinstance(low, bool):
                where = And(where, GreaterThanOrEqual(name, low), LessThanOrEqual(name, high))
        wanted = keys.select(names)
        deleted, replacing = [], []
        for task in table.scan(row_filter=where, snapshot_id=head.snapshot_id).plan_files():
            if task.delete_files:
                raise SpecError(f"Iceberg table {'.'.join(table.name())}: data file {task.file.file_path} has row-level "
                                "deletes (merge-on-read): an upsert rewrites files and cannot apply them; compact the "
                                "table first")
            rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([task])
            numbered = pa.array(range(rows.num_rows), pa.int64())
            found = rows.select(names).cast(wanted.schema).append_column("__kafka_eos_row", numbered)
            hit = found.join(wanted, names, join_type="left semi").column("__kafka_eos_row").combine_chunks()
            if not len(hit):
                continue
            keep = pc.invert(pc.is_in(numbered, value_set=hit))
            deleted.append(task.file)
            kept = rows.filter(keep)
            if kept.num_rows:
                replacing.extend(_dataframe_to_data_files(table_metadata=table.metadata, df=kept, io=table.io))
        return deleted, replacing

    def new_dead_letters(self, table: "Table", plan: Plan, rows: Iterable[dict]) -> Iterator[dict]:
        """The dead-letter rows of ``plan`` that ``table`` does not hold yet (this pipeline's, by
        topic, partition and offset): an earlier attempt of the same range (a crash between its
        dead letters' snapshot and the table's, a replay after a reset) wrote the others."""
        from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

        ranges = [r for r in plan.active if not r.empty]
        held: set[tuple[str, int, int]] = set()
        head = _head(table, self.branch)
        if ranges and head is not None:
            per_range = [And(EqualTo("topic", r.topic), EqualTo("partition", r.partition),
                             GreaterThanOrEqual("offset", r.from_offset), LessThan("offset", r.until))
                         for r in ranges]
            where = And(EqualTo("pipeline", self.spec.name), per_range[0] if len(per_range) == 1 else Or(*per_range))
            found = table.scan(row_filter=where, selected_fields=("topic", "partition", "offset"),
                               snapshot_id=head.snapshot_id).to_arrow()
            held = {(t, p, o) for t, p, o in zip(*(found.column(c).to_pylist() for c in ("topic", "partition", "offset")))}
        return (row for row in rows if (row["topic"], row["partition"], row["offset"]) not in held)

    def commit_dead_letters(self, table: "Table", plan: Plan, files: list["DataFile"]) -> None:
        """The dead letters' snapshot, committed only if the dead-letter table is still the one
        :meth:`new_dead_letters` read (else the run fails: its retry reads it again).

        :raises CheckpointConflict: the dead-letter table moved meanwhile.
        """
        from pyiceberg.exceptions import CommitFailedException

        try:
            _append(table, files, {self.run_key: plan.run_id}, branch=self.branch)
        except CommitFailedException:
            raise CheckpointConflict(f"Iceberg dead-letter table {self.spec.sink.dead_letters_table!r}: moved while run "
                                     f"{plan.run_id!r} wrote its dead letters; nothing of the run was committed") \
                from None

    def carry(self, table: "Table") -> bool:
        """Where the newest snapshot of ``table`` does not hold this pipeline's offsets (a compaction
        committed after it), a snapshot of no files that holds them again, so that expiring the older
        snapshots keeps them. Returns whether it committed one (a concurrent commit: not now)."""
        from pyiceberg.exceptions import CommitFailedException

        current = table.current_snapshot()
        if self.branch != MAIN or current is None or current.summary is None \
                or self.offsets_key in current.summary.additional_properties:
            return False
        offsets = self.offsets(table)
        if not offsets:
            return False
        try:
            _append(table, [], {**self.carried(table), self.offsets_key: _format_offsets(offsets)})
        except CommitFailedException:
            return False
        return True

    # -- side runs -----------------------------------------------------------------------------

    def promote(self, branch: str, side: str, apply: bool, ranges: dict[TP, tuple[int, int]] | None = None,
                overlap: bool = False) -> list[dict]:
        """Move side-run branch ``branch`` of the results and dead-letter tables onto ``main`` (this
        store's pipeline is the live one; ``side``: the side run without its generation,
        ``<pipeline>.<kind>.<key>``; ``ranges``: its ranges). Both tables are checked before either
        is committed. Where ``main`` is still the snapshot the branch was cut from (the table
        property ``kafka-eos.cut.<branch>``, set by the commit that cut it), a fast-forward: ``main``
        becomes the branch's snapshot, which carries ``main``'s offsets. Else one snapshot on
        ``main`` that appends the data files the branch holds beyond its cut, carrying ``main``'s
        offsets — only where the branch kept every file of its cut and added no row-level deletes
        (else its files hold main's rows again), and never for an upsert's results (an append would
        not replace the rows of its keys). Each table's promotion is one compare-and-set commit on
        ``main`` that also sets ``kafka-eos.promoted.<branch>``, ``kafka-eos.promoted.<side>`` (the
        branch: another generation of the same side run is refused) and the ranges promoted: a second
        promote of the branch does nothing, and one stopped between the two tables finishes.

        ``merge: append``: the rows are added to ``main`` as they are, so each range must lie below
        the offset where the live pipeline started on its partition (the marker of its first commit:
        main never holds, and the live pipeline never writes, records below it) and must not meet a
        range promoted before; else the promote is refused unless ``overlap`` (the operator deleted
        those records from ``main``, or knows it lacks them).

        :param apply: False: what it would do, committing nothing (a dry run).
        :returns: per table: ``{"table", "action" (fast-forward | append | promoted before | no
            branch), "files", "rows", "snapshot"}``.
        :raises PlanError: neither table has the branch; its cut snapshot was expired; another
            generation was promoted; a range main holds or will hold; a branch that rewrote its cut's
            files; an upsert's results onto a main that moved.
        :raises CheckpointConflict: ``main`` moved while a table was promoted (promote again).
        """
        from pyiceberg.exceptions import CommitFailedException

        tables = {name: self.table(name) for name in (self.spec.sink.table, self.spec.sink.dead_letters_table)}
        promoted: dict[str, list[list]] = {}  # "topic-p": [[from, until, branch], ...]
        for table in filter(None, tables.values()):
            for tp, spans in _parse_ranges(table.properties.get(RANGES_KEY.format(pipeline=self.spec.name))).items():
                promoted.setdefault(tp, []).extend(s for s in spans if s not in promoted.get(tp, []))
        with_branch = [t for t in tables.values() if t is not None and t.metadata.snapshot_by_name(branch) is not None]
        finished = with_branch and all(PROMOTED_KEY.format(name=branch) in t.properties for t in with_branch)
        if self.spec.sink.merge == "append" and ranges and not overlap and not finished:
            # This branch's own spans (a promote stopped between the two tables) are not a meeting.
            self._check_no_overlap(tables[self.spec.sink.table], ranges,
                                   {tp: [s for s in spans if s[2:] != [branch]] for tp, spans in promoted.items()})
        for (topic, partition), (start, until) in (ranges or {}).items():
            if until > start and [start, until, branch] not in promoted.get(f"{topic}-{partition}", []):
                promoted.setdefault(f"{topic}-{partition}", []).append([start, until, branch])
        planned = [self._promotion(name, table, branch, side, promoted) for name, table in tables.items()]
        if all(e["action"] == "no branch" for e, _ in planned):
            raise PlanError(f"Iceberg table {self.spec.sink.table!r}: no branch {branch!r} (nor of "
                            f"{self.spec.sink.dead_letters_table!r}): no side run of that name committed")
        for entry, step in planned:
            if not apply or step is None:
                continue
            table, head, files, markers = step
            try:
                if entry["action"] == "fast-forward":
                    _fast_forward(table, head.snapshot_id, markers)
                else:
                    _append(table, files, {**self.carried(table), "kafka-eos.promoted": branch}, markers)
                entry["snapshot"] = self.catalog.load_table(table.name()).current_snapshot().snapshot_id
            except CommitFailedException:
                raise CheckpointConflict(f"Iceberg table {entry['table']!r}: main moved while branch {branch!r} was "
                                         "promoted; nothing of that table was promoted: promote again") from None
        return [entry for entry, _ in planned]

    def _promotion(self, name: str, table: "Table | None", branch: str, side: str,
                   promoted: dict[str, list[list]]) -> tuple[dict, tuple | None]:
        """One table's part of :meth:`promote`, checked: (its entry, what to commit or None);
        ``promoted``: the side runs' ranges promoted, this one's included."""
        head = table.metadata.snapshot_by_name(branch) if table is not None and branch != MAIN else None
        entry = {"table": name, "action": "no branch", "files": 0, "rows": 0, "snapshot": None}
        if head is None:
            return entry, None
        marker, side_marker = PROMOTED_KEY.format(name=branch), PROMOTED_KEY.format(name=side)
        if marker in table.properties:
            entry.update(action="promoted before", snapshot=int(table.properties[marker]))
            return entry, None
        if table.properties.get(side_marker, branch) != branch:
            raise PlanError(f"Iceberg table {name!r}: {table.properties[side_marker]} of this side run was promoted "
                            f"already; promoting {branch!r} too would add its rows twice")
        cut_raw = table.properties.get(CUT_KEY.format(branch=branch))
        cut = table.metadata.snapshot_by_id(int(cut_raw)) if cut_raw else None
        if cut is None:
            raise PlanError(f"Iceberg table {name!r}: the snapshot branch {branch!r} was cut from is "
                            f"{'expired' if cut_raw else 'not recorded'}: kafka-eos cannot tell the branch's rows "
                            "from main's; promote it with the catalog's own tools")
        main = table.current_snapshot()
        forward = main is not None and main.snapshot_id == cut.snapshot_id
        results = name == self.spec.sink.table
        if not forward and results and self.spec.sink.merge == "upsert":
            raise PlanError(f"Iceberg table {name!r}: main moved since branch {branch!r} was cut, and an upsert's "
                            "branch replaced rows, which an append onto main cannot: promote it while main stays "
                            "at the cut (pause the live pipeline, reprocess the side run, promote)")
        head_files = _live_files(table, head)
        cut_paths = {f.file_path for f in _live_files(table, cut)}
        deletes = {f.file_path for f in _live_files(table, head, deletes=True)} - \
            {f.file_path for f in _live_files(table, cut, deletes=True)}
        if not forward and (cut_paths - {f.file_path for f in head_files} or deletes):
            raise PlanError(f"Iceberg table {name!r}: branch {branch!r} rewrote files of its cut or added row-level "
                            "deletes (a compaction, a DELETE or MERGE on the branch): its files would bring main's "
                            "rows again; promote it while main stays at the cut, or with the catalog's own tools")
        files = [f for f in head_files if f.file_path not in cut_paths]
        entry.update(action="fast-forward" if forward else "append", files=len(files),
                     rows=sum(f.record_count for f in files))
        markers = {marker: str(head.snapshot_id), side_marker: branch,
                   RANGES_KEY.format(pipeline=self.spec.name): json.dumps(promoted, sort_keys=True, separators=(",", ":"))}
        return entry, (table, head, files, markers)

    def _check_no_overlap(self, table: "Table | None", ranges: dict[TP, tuple[int, int]],
                          promoted: dict[str, list[list]]) -> None:
        """:raises PlanError: a range the live pipeline's part of ``main`` holds or will hold (at or
            above where it started on the partition, or the start unknown), or that meets a range
            promoted before."""
        first = table.properties.get(MARKER_KEY.format(pipeline=self.spec.name)) if table is not None else None
        starts = _starts(first) if first else {}  # None: a marker from before it held the starts
        for (topic, partition), (start, until) in sorted(ranges.items()):
            if until <= start:
                continue
            live = None if starts is None else starts.get((topic, partition))
            if live is None or until > live:
                where = (f"past {live}, where the live pipeline started on it" if live is not None else
                         "where the live pipeline may read (it has not committed there yet, or its start is not "
                         "recorded)")
                raise PlanError(
                    f"{topic}-{partition}: the side run's range [{start}, {until}) reaches {where}: main of Iceberg "
                    f"table {self.spec.sink.table!r} holds or will hold those records, and promoting appends them "
                    "again (merge: append); promote with --overlap once main lacks them for good (deleted from "
                    "main, or the live pipeline never reads them)")
            for a, b, *_branch in promoted.get(f"{topic}-{partition}", []):
                if start < b and a < until:
                    raise PlanError(f"{topic}-{partition}: the side run's range [{start}, {until}) meets [{a}, {b}), "
                                    f"promoted before into Iceberg table {self.spec.sink.table!r}: promoting appends "
                                    "those records again; promote with --overlap only after deleting them from main")


def _append(table: "Table", files: list["DataFile"], properties: dict[str, str],
            table_properties: dict[str, str] | None = None, branch: str = "main",
            deleted: list["DataFile"] = ()) -> None:
    """One fast-append snapshot of ``files`` on ``branch`` with ``properties`` in its summary (and
    ``table_properties`` set on the table in the same commit), committed only onto the snapshot
    ``table`` was loaded at; with ``deleted``, an overwrite snapshot that also removes those
    files. A branch that does not exist yet is cut from ``main``'s current snapshot in the same
    commit (committed only if it still does not exist).

    :raises CommitFailedException: the branch moved (or was created) meanwhile.
    """
    from pyiceberg.table.update.snapshot import ManageSnapshots

    cut = branch != MAIN and branch not in table.metadata.refs
    if cut and table.current_snapshot() is None:
        # A branch is cut from a snapshot (the catalog refuses a branch of a table without one): an
        # empty one on main first, its own compare-and-set (a concurrent first commit wins).
        _append(table, [], {})  # lost to another first commit: the caller checks and plans again
        table = table.catalog.load_table(table.name())
    tx = _without_retries(table).transaction()
    if cut:  # the cut recorded with it: what the branch holds beyond main's rows then (promote)
        table_properties = {**(table_properties or {}),
                            CUT_KEY.format(branch=branch): str(table.current_snapshot().snapshot_id)}
    if table_properties:
        tx.set_properties(table_properties)
    if cut:
        # Staged first: the transaction keeps the first ref requirement (the branch absent).
        ManageSnapshots(tx).create_branch(table.current_snapshot().snapshot_id, branch).commit()
    update = tx.update_snapshot(snapshot_properties=properties, branch=branch)
    with (update.overwrite() if deleted else update.fast_append()) as append:
        for data_file in deleted:
            append.delete_data_file(data_file)
        for data_file in files:
            append.append_data_file(data_file)
    tx.commit_transaction()


def _fast_forward(table: "Table", snapshot_id: int, table_properties: dict[str, str]) -> None:
    """``main`` set to ``snapshot_id`` (and ``table_properties`` set) in one commit, only if ``main``
    is still the snapshot ``table`` was loaded at.

    :raises CommitFailedException: ``main`` moved meanwhile.
    """
    from pyiceberg.table.update.snapshot import ManageSnapshots

    tx = _without_retries(table).transaction()
    tx.set_properties(table_properties)
    ManageSnapshots(tx).set_current_snapshot(snapshot_id=snapshot_id)
    tx.commit_transaction()


def _starts(marker: str) -> dict[TP, int] | None:
    """Where the live pipeline started on each partition, as its ``first-run`` marker records it
    (None: a marker that records none, an older one's plain run id)."""
    try:
        return _parse_offsets(json.dumps(json.loads(marker)["from"]), "first-run")
    except (ValueError, KeyError, TypeError, SpecError):
        return None


def _parse_ranges(raw: str | None) -> dict[str, list[list]]:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def _live_files(table: "Table", snapshot, deletes: bool = False) -> list["DataFile"]:
    """The data files ``snapshot`` holds (``deletes``: its row-level delete files)."""
    from pyiceberg.manifest import ManifestContent

    content = ManifestContent.DELETES if deletes else ManifestContent.DATA
    return [entry.data_file for manifest in snapshot.manifests(table.io) if manifest.content == content
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)]


def _without_retries(table: "Table") -> "Table":
    """``table`` whose commits PyIceberg does not retry: a retry rebases the snapshot onto whatever
    committed meanwhile, past the checkpoint check (a duplicate when that was this run's twin)."""
    from pyiceberg.table import Table, TableProperties

    metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}})
    # config: a REST catalog's per-table settings (a table's own token) stay.
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog, config=table.config)


#: What :func:`_ancestry` yields where a parent snapshot has been expired.
_EXPIRED = object()
MAIN = "main"


def _head(table: "Table", branch: str):
    """The newest snapshot of ``branch``; of ``main`` where the branch is not cut yet (its first
    commit cuts it there)."""
    return table.metadata.snapshot_by_name(branch) or table.current_snapshot()


def _ancestry(table: "Table | None", branch: str = MAIN) -> Iterator:
    """The summaries of ``table``'s ``branch`` (:func:`_head`), newest first; :data:`_EXPIRED` last
    where the ancestry ends at a parent that has been expired: a parent that is gone, or a snapshot
    without one that is not the table's first (its sequence number above 1: expiry clears the
    survivor's parent; a format-1 table has no sequence numbers, and its truncated ancestry cannot
    be told)."""
    if table is None:
        return
    snapshot = _head(table, branch)
    while snapshot is not None:
        if snapshot.summary is not None:
            yield snapshot.summary
        if snapshot.parent_snapshot_id is None:
            if (snapshot.sequence_number or 0) > 1:
                yield _EXPIRED
            return
        parent = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        if parent is None:
            yield _EXPIRED
            return
        snapshot = parent


def _optional(field: "pa.Field") -> "pa.Field":
    """``field`` and every field nested in it nullable."""
    import pyarrow as pa

    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([_optional(t.field(i)) for i in range(t.num_fields)])
    elif pa.types.is_list(t):
        t = pa.list_(_optional(t.value_field))
    elif pa.types.is_large_list(t):
        t = pa.large_list(_optional(t.value_field))
    elif pa.types.is_map(t):
        t = pa.map_(t.key_field, _optional(t.item_field))
    return field.with_type(t).with_nullable(True)


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
