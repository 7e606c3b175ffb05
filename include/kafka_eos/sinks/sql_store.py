"""The SQL store of a pipeline through SQLAlchemy: engine, tables, column types, the database
transaction of one run (offsets moved by compare-and-set, dead letters, results) and the local
spools its rows wait in. The SQL commit scope (:mod:`kafka_eos.sinks.sql`) is a short route over it.

The results reach the driver as Arrow record batches (one Spark job, converted on the JVM: no
``Row`` object per row) and are spooled as Arrow. PostgreSQL (psycopg2 or psycopg) takes them with
``COPY`` (CSV written by Arrow), straight into the table, or, where a key is there already, into a
staging table that one ``INSERT … SELECT … ON CONFLICT`` merges from; elsewhere, and whenever the database refuses the
COPY's rows (a value too long, a constraint), multi-row ``INSERT``s a batch at a time find the
refused rows. Timestamps are UTC (a ``timestamp`` column holds UTC wall-clock time).
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from sqlalchemy import (BigInteger, Boolean, Column, Date, DateTime, Float, Integer, LargeBinary,
                        MetaData, Numeric, String, Table, Text, create_engine, event, func, inspect,
                        select, update)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DataError, IntegrityError, ProgrammingError

from kafka_eos.errors import CheckpointConflict, RecordRefused, SpecError
from kafka_eos.probes import point
from kafka_eos.kafka_admin import TP, alter_group_offsets
from kafka_eos.manifest import COMMITTED, NOOP, now_iso
from kafka_eos.paths import local_dir
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: Rows per INSERT statement: large enough to amortise round trips, small enough for SQLite's
#: limit on bound parameters (32766) with a dozen columns.
BATCH_ROWS = 1000

#: PostgreSQL drivers whose raw connection takes ``COPY … FROM STDIN`` (SQLAlchemy's driver names).
COPY_DRIVERS = ("psycopg2", "psycopg")
#: Bytes of CSV handed to the driver at a time in a ``COPY``.
COPY_CHUNK_BYTES = 1 << 20
#: PostgreSQL's error code of an ``ON CONFLICT DO UPDATE`` meeting one key twice in one statement.
CARDINALITY_VIOLATION = "21000"
#: PostgreSQL's error code of a key that is there already.
UNIQUE_VIOLATION = "23505"

OFFSETS_TABLE = "kafka_eos_offsets"
DEAD_LETTERS_TABLE = "kafka_eos_dead_letters"


#: ``sink.url: local``: kafka-eos's development database, a SQLite file per pipeline under
#: ``.local/sql/`` (never chosen for a spec that does not say so).
LOCAL_URL = "local"


def local_url(spec: PipelineSpec) -> str:
    """The SQLite file that ``sink.url: local`` names (the sink kind's development database)."""
    return f"sqlite:///{local_dir() / spec.sink.about.local_database.format(name=spec.name)}"


#: The entry point group through which an installed Airflow provider resolves a connection id:
#: ``sql`` -> ``f(conn_id) -> SQLAlchemy URL | None`` (kafka_eos_airflow.hooks.sql); ``iceberg`` -> an
#: Iceberg catalog's URL (kafka_eos_airflow.hooks.iceberg: a REST catalog's, else a database's). The library
#: never imports Airflow; where the provider is installed, the CLI resolves ``sink.conn_id``
#: through Airflow's secrets backends with it.
CONNECTIONS_GROUP = "kafka_eos.connections"


def connection_url(conn_id: str, kind: str = "sql") -> str | None:
    """The URL of the Airflow connection ``conn_id`` as resolver ``kind`` gives it (see
    :data:`CONNECTIONS_GROUP`); None where no resolver is installed or no such connection is defined."""
    from importlib.metadata import entry_points

    from kafka_eos.logs import root_logging_kept

    for resolver in entry_points(group=CONNECTIONS_GROUP, name=kind):
        with root_logging_kept():  # Airflow's logging set-up, if this imports it, stays Airflow's
            return resolver.load()(conn_id)
    return None


def database_url(spec: PipelineSpec, settings: KafkaSettings | None = None, fallback: bool = False) -> str:
    """The SQL sink's database: the one ``settings`` carry (resolved by the Airflow task that
    started this process), else the Airflow connection ``sink.conn_id``, else ``sink.url``
    (``local``: :func:`local_url`). A spec that names a connection gets that connection or an
    error, in Airflow and in the CLI alike: two processes of one pipeline never write two
    databases because one of them could not see the connection.

    :param fallback: a ``sink.conn_id`` that is not defined gives way to the spec's ``sink.url``
        (only Airflow's local stack, ``[kafka_eos] local_broker_fallback``).
    :raises SpecError: one line naming the connection (or the missing fields).
    """
    sink = spec.sink
    url = settings.database_url if settings is not None else None
    if url is None and sink.conn_id is not None:
        url = connection_url(sink.conn_id, sink.about.connection)
        if url is None and not (fallback and sink.url is not None):
            raise SpecError(f"{spec.path}: sink.conn_id: Airflow connection {sink.conn_id!r} is not defined here "
                            "(in Airflow's connections or, outside a task, its secrets backends: AIRFLOW_CONN_*, "
                            "a configured backend)")
        if url is None:
            log.info("%s: Airflow connection %r is not defined: using sink.url (local_broker_fallback is on)",
                     spec.path, sink.conn_id)
    field = "sink.url" if url is None else "sink.conn_id"
    url = url or sink.url
    if url is None:
        raise SpecError(f"{spec.path}: sink: a {sink.kind} sink needs sink.conn_id or sink.url")
    url = local_url(spec) if url == LOCAL_URL else url
    if not url.startswith(("http://", "https://")):  # a database's (not an Iceberg REST catalog's)
        _check_dialect(url, f"{spec.path}: {field}")
    return url


#: The databases a SQL sink (and an Iceberg sink's SQL catalog) writes: SQLAlchemy's backend names.
DIALECTS = ("sqlite", "postgresql")


def _check_dialect(url: str, where: str) -> None:
    """:raises SpecError: ``url`` is not a database URL, or not one of :data:`DIALECTS`; said
    without the URL (it may hold a password)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        backend = make_url(url).get_backend_name()
    except ArgumentError:
        raise SpecError(f"{where}: not a database URL (dialect[+driver]://user:password@host:port/database, or "
                        "sqlite:///path)") from None
    if backend not in DIALECTS:
        raise SpecError(f"{where}: dialect {backend!r} is not supported: SQLite or PostgreSQL")


def make_engine(url: str) -> Engine:
    """An engine; SQLite gets WAL mode and ``BEGIN IMMEDIATE`` (take the write lock up front,
    so two writers serialise instead of failing at commit)."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # let SQLAlchemy's begin event emit BEGIN itself
        dbapi_conn.execute("PRAGMA journal_mode=WAL")

    @event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _sql_type(spark_type):
    from pyspark.sql import types as T

    if isinstance(spark_type, T.StringType):
        return Text()
    if isinstance(spark_type, (T.LongType,)):
        return BigInteger()
    if isinstance(spark_type, (T.IntegerType, T.ShortType, T.ByteType)):
        return Integer()
    if isinstance(spark_type, (T.DoubleType, T.FloatType)):
        return Float()
    if isinstance(spark_type, T.DecimalType):
        return Numeric(spark_type.precision, spark_type.scale)
    if isinstance(spark_type, (T.TimestampType, T.TimestampNTZType)):
        return DateTime()
    if isinstance(spark_type, T.DateType):
        return Date()
    if isinstance(spark_type, T.BooleanType):
        return Boolean()
    if isinstance(spark_type, T.BinaryType):
        return LargeBinary()
    raise SpecError(f"SQL sink: column type {spark_type.simpleString()} is not supported")


class SqlStore:
    """The SQL tables of one pipeline: its results, its offsets rows, its dead letters."""

    def __init__(self, spec: PipelineSpec, url: str) -> None:
        self.spec = spec
        self.engine = make_engine(url)
        self.metadata = MetaData()
        self.offsets = Table(
            OFFSETS_TABLE, self.metadata,
            Column("pipeline", String(255), primary_key=True),
            Column("topic", String(255), primary_key=True),
            Column("partition", Integer, primary_key=True),
            Column("next_offset", BigInteger, nullable=False),
            Column("run_id", String(255)),
            Column("updated_at", String(64)),
        )
        self.dead_letters = Table(
            spec.sink.dead_letters_table, self.metadata,
            Column("pipeline", String(255), primary_key=True),
            Column("topic", String(255), primary_key=True),
            Column("partition", Integer, primary_key=True),
            Column("offset", BigInteger, primary_key=True),
            Column("key", LargeBinary),
            Column("value", LargeBinary),
            Column("reason", Text, nullable=False),
            Column("run_id", String(255)),
        )

    def create_tables(self) -> None:
        """Create the offsets and dead-letter tables (and a SQLite file's folder) when missing."""
        if self.engine.dialect.name == "sqlite" and self.engine.url.database:
            Path(self.engine.url.database).parent.mkdir(parents=True, exist_ok=True)
        self.metadata.create_all(self.engine)

    def forget(self) -> None:
        """A deliberate fresh start (the demo's reset): drop the results table and the pipeline's
        checkpoints and dead letters. Other pipelines' rows stay."""
        with self.engine.begin() as conn:
            present = inspect(conn)
            if present.has_table(self.spec.sink.table):
                Table(self.spec.sink.table, MetaData()).drop(conn)
            for table in (self.offsets, self.dead_letters):
                if present.has_table(table.name):
                    conn.execute(table.delete().where(table.c.pipeline == self.spec.name))

    def checkpoints(self, tps: Iterable[TP]) -> dict[TP, int | None]:
        """The sink's checkpoint (next offset) per partition; None where it has none."""
        tps = list(tps)
        if self.engine.dialect.name == "sqlite" and self.engine.url.database \
                and not Path(self.engine.url.database).exists():
            return {tp: None for tp in tps}  # reading must not create the file
        with self.engine.connect() as conn:
            if not inspect(conn).has_table(OFFSETS_TABLE):
                return {tp: None for tp in tps}  # never written: no checkpoints, nothing created
            return self.checkpoints_in(conn, tps)

    def results_table(self, df: "DataFrame") -> Table:
        """The results table, created from the DataFrame's schema when missing."""
        keys = set(self.spec.sink.key_columns)
        missing = keys - set(df.columns)
        if missing:
            raise SpecError(f"{self.spec.path}: sink.key_columns: {', '.join(sorted(missing))} not in the "
                            f"transform's output ({', '.join(df.columns)})")
        table = self.metadata.tables.get(self.spec.sink.table)
        if table is None:
            table = Table(self.spec.sink.table, self.metadata,
                          *[Column(f.name, _sql_type(f.dataType), primary_key=f.name in keys)
                            for f in df.schema.fields])
            table.create(self.engine, checkfirst=True)
        return table

    def _insert(self, conn):
        """The dialect's ``insert`` construct (with ``on_conflict_*``)."""
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif conn.dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            raise SpecError(f"{self.spec.path}: sink.url: dialect {conn.dialect.name!r} is not supported "
                            "(sqlite, postgresql)")
        return insert

    def _insert_dead(self, conn, rows: list[dict]) -> int:
        """Dead-letter rows, one multi-row ``INSERT`` (a dead letter there already stays); returns
        how many it wrote (the rows ``RETURNING`` gives back: one per source record).

        ``RETURNING`` is what makes it one statement: SQLAlchemy (2.1) sends an ``ON CONFLICT``
        insert without it row by row, a round trip each (24,000 dead letters: 4.2 s against 1.2 s
        on PostgreSQL); ``DO NOTHING`` meets no row twice, so batching it is safe."""
        stmt = self._insert(conn)(self.dead_letters).on_conflict_do_nothing()
        return len(conn.execute(stmt.returning(self.dead_letters.c.offset), rows).all())

    def _upsert(self, conn, table: Table, rows: list[dict], merge: str) -> None:
        """``rows`` merged into ``table``: one multi-row ``INSERT … ON CONFLICT`` (``RETURNING``
        makes SQLAlchemy batch it, see :meth:`_insert_dead`); where the rows hold a key twice,
        which PostgreSQL merges once per statement, row by row, in their order."""
        stmt = self._on_conflict(self._insert(conn)(table), table, merge)
        keys = [table.c[k] for k in self.spec.sink.key_columns]
        if keys:
            try:
                with conn.begin_nested():
                    conn.execute(stmt.returning(*keys), rows)
                return
            except ProgrammingError as exc:
                if _sqlstate(exc) != CARDINALITY_VIOLATION:
                    raise
        conn.execute(stmt, rows)

    def _on_conflict(self, stmt, table: Table, merge: str):
        """``stmt`` (an INSERT into ``table``) merging into the rows of the same key: adding the
        values (``merge: add``) or replacing them; as it is without key columns."""
        keys = list(self.spec.sink.key_columns)
        if not keys:
            return stmt
        values = [c.name for c in table.columns if c.name not in keys]
        if merge == "add":
            sets = {c: table.c[c] + stmt.excluded[c] for c in values}
        else:
            sets = {c: stmt.excluded[c] for c in values}
        return (stmt.on_conflict_do_update(index_elements=keys, set_=sets) if sets
                else stmt.on_conflict_do_nothing(index_elements=keys))

    def _copy(self, conn, table: Table, spool: "ArrowSpool") -> int:
        """Write the spooled results with PostgreSQL's ``COPY`` (CSV, written by Arrow): straight
        into ``table`` (new keys: a run of new source records); where a key is there already (an
        aggregate's minute again, a replay), into a staging table (the target's columns and types,
        dropped at commit) that one ``INSERT … SELECT … ON CONFLICT`` merges from. Returns the rows
        written. Raises what the database refuses (the caller's savepoint undoes it)."""
        quote = conn.dialect.identifier_preparer
        target = quote.format_table(table)
        if self.spec.sink.key_columns:
            try:
                with conn.begin_nested():
                    return self._copy_into(conn, target, spool)
            except (IntegrityError, conn.dialect.dbapi.IntegrityError) as exc:
                if _sqlstate(exc) != UNIQUE_VIOLATION:
                    raise
            stage = f"kafka_eos_stage_{uuid.uuid4().hex[:12]}"
            conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {quote.quote(stage)} (LIKE {target} INCLUDING DEFAULTS) "
                                 "ON COMMIT DROP")
            written = self._copy_into(conn, quote.quote(stage), spool)
            self._merge_staged(conn, table, Table(stage, MetaData(), *[Column(n) for n in spool.schema.names]))
            return written
        return self._copy_into(conn, target, spool)

    @staticmethod
    def _copy_into(conn, into: str, spool: "ArrowSpool") -> int:
        """``COPY`` the spool's batches into the table ``into`` (quoted), in one statement: the
        database parses a batch while the next is written as CSV. Returns the rows copied."""
        columns = ", ".join(conn.dialect.identifier_preparer.quote(n) for n in spool.schema.names)
        copy = f"COPY {into} ({columns}) FROM STDIN WITH (FORMAT csv)"
        csv = _CsvFeed(spool.batches())
        with conn.connection.driver_connection.cursor() as cursor:
            if conn.dialect.driver == "psycopg2":
                cursor.copy_expert(copy, csv, size=COPY_CHUNK_BYTES)
            else:  # psycopg 3
                with cursor.copy(copy) as feed:
                    while chunk := csv.read(COPY_CHUNK_BYTES):
                        feed.write(chunk)
        return csv.rows

    def _merge_staged(self, conn, table: Table, staged: Table) -> None:
        """One ``INSERT … SELECT … ON CONFLICT`` from the staging table. PostgreSQL merges a key
        once per statement: where the run's rows hold a key more than once, ``merge: add`` sums
        them first (what merging them one by one gives); ``replace`` has no last row to keep."""
        names, keys, merge = [c.name for c in staged.columns], list(self.spec.sink.key_columns), self.spec.sink.merge
        insert = self._insert(conn)
        try:
            with conn.begin_nested():
                stmt = insert(table).from_select(names, select(*staged.c))
                conn.execute(self._on_conflict(stmt, table, merge))
                return
        except ProgrammingError as exc:
            if _sqlstate(exc) != CARDINALITY_VIOLATION:
                raise
            if merge != "add":
                raise SpecError(f"{self.spec.path}: sink.key_columns: the run's rows for table {table.name} hold a "
                                f"key ({', '.join(keys)}) more than once, and merge: {merge} keeps one row per key: "
                                "the transform must give one row per key (or merge: add)") from None
        summed = select(*[staged.c[n] if n in keys else func.sum(staged.c[n]).label(n) for n in names]) \
            .group_by(*[staged.c[k] for k in keys])
        conn.execute(self._on_conflict(insert(table).from_select(names, summed), table, merge))

    def _write_results(self, conn, table: Table, spool: "ArrowSpool") -> tuple[int, list[tuple[dict, Exception]]]:
        """The spooled results into ``table``: by ``COPY`` where the database and the columns allow
        it; else, or when the database refuses a row of the COPY, a batch of rows at a time, each
        refused row found (:meth:`_upsert_refusing`). Returns (rows written, refused rows)."""
        if conn.dialect.name == "postgresql" and conn.dialect.driver in COPY_DRIVERS and spool.copyable:
            dbapi = conn.dialect.dbapi
            try:
                with conn.begin_nested():
                    return self._copy(conn, table, spool), []
            except (DataError, IntegrityError, dbapi.DataError, dbapi.IntegrityError) as exc:
                log.info("%s: the database refused a row of the COPY (%s): finding it, a batch at a time",
                         table.name, _first_line(exc))
        written, refused = 0, []
        for batch in _batches(spool.rows()):
            these = self._upsert_refusing(conn, table, batch)
            written += len(batch) - len(these)
            refused += these
        return written, refused

    def _move_checkpoints(self, conn, plan: Plan) -> bool:
        """Compare-and-set every active range's offsets row from expected to until.

        :returns: False when all were already at ``until`` (an earlier attempt committed).
        :raises CheckpointConflict: a row is neither expected nor the end.
        """
        o, now = self.offsets, now_iso()
        current = self.checkpoints_in(conn, [r.tp for r in plan.active])
        if all(current[r.tp] == r.until for r in plan.active):
            return False
        for r in plan.active:
            where = (o.c.pipeline == self.spec.name) & (o.c.topic == r.topic) & (o.c.partition == r.partition)
            if r.expected is None:
                try:
                    with conn.begin_nested():
                        conn.execute(o.insert().values(pipeline=self.spec.name, topic=r.topic, partition=r.partition,
                                                       next_offset=r.until, run_id=plan.run_id, updated_at=now))
                    continue
                except IntegrityError:
                    pass  # someone else created it: reported below
            else:
                res = conn.execute(update(o).where(where & (o.c.next_offset == r.expected))
                                   .values(next_offset=r.until, run_id=plan.run_id, updated_at=now))
                if res.rowcount == 1:
                    continue
            raise CheckpointConflict(
                f"{r.topic}-{r.partition}: SQL sink {self.spec.sink.table!r} is at {current[r.tp]}, the plan of "
                f"run {plan.run_id!r} expected {r.expected} (ends at {r.until}): a concurrent or stale plan")
        return True

    def publish_checkpoints(self, settings: KafkaSettings, tps: list[TP], planned_ms: int | None = None) -> dict:
        """Mirror the sink's checkpoints of ``tps`` to the Kafka group offsets, read and published
        while the offsets rows are locked (SQLite: the write lock of ``BEGIN IMMEDIATE``;
        PostgreSQL: ``FOR UPDATE``): a run that commits meanwhile waits, and publishes its own
        after, so a value read before a run's commit never lands after that run's mirror (which
        moved the mirror backwards). Returns what was published."""
        if not tps:
            return {}
        with self.engine.begin() as conn:
            if not inspect(conn).has_table(OFFSETS_TABLE):
                return {}
            current = {tp: offset for tp, offset in self.checkpoints_in(conn, list(tps), lock=True).items()
                       if offset is not None}
            if current:
                alter_group_offsets(settings, self.spec.source.group_id, current, planned_ms)
        return current

    def checkpoints_in(self, conn, tps: list[TP], lock: bool = False) -> dict[TP, int | None]:
        o = self.offsets
        query = select(o.c.topic, o.c.partition, o.c.next_offset).where(o.c.pipeline == self.spec.name)
        rows = conn.execute(query.with_for_update() if lock and conn.dialect.name == "postgresql" else query).all()
        have = {(t, p): n for t, p, n in rows}
        return {tp: have.get(tp) for tp in tps}

    def commit(self, plan: Plan, results: "ArrowSpool | None", table: Table | None,
               dead_letters: Iterator[dict]) -> tuple[str, int, int]:
        """The database transaction: offsets CAS, dead letters, results. Returns (status, out, dead)."""
        out = 0
        with self.engine.begin() as conn:
            if not self._move_checkpoints(conn, plan):
                return NOOP, 0, 0
            dead = self._write_dead(conn, dead_letters)  # the records the run's dead letters are of
            if results is not None:
                out, refused = self._write_results(conn, table, results)
                # Rows the database refused for their own sake: dead letters, in this transaction,
                # one per source record (a transform may give a record several rows).
                for batch in _batches(iter(self._refused_letters(table, refused, plan))):
                    self._insert_refused(conn, batch)
                    dead |= {(x["topic"], x["partition"], x["offset"]) for x in batch}
            point("before_sql_commit")
        return COMMITTED, out, len(dead)

    def _write_dead(self, conn, dead_letters: Iterator[dict]) -> set[tuple]:
        """The run's dead letters, one row per source record (the dead-letter table's key): a record
        the transform gave several has their reasons in one (``…; and …``), not the first kept and
        the others dropped against the key. Returns the source records (topic, partition, offset)
        of the run's dead letters, those the table held already included (a replay after a reset
        wrote them before; its records are this run's too: ``in = out + dead letters``)."""
        seen: set[tuple] = set()
        more: dict[tuple, list[str]] = {}  # reasons of records written in an earlier batch
        for batch in _batches(dead_letters):
            fresh: dict[tuple, dict] = {}
            for row in batch:
                coords = (row["topic"], row["partition"], row["offset"])
                if coords in fresh:
                    fresh[coords]["reason"] = f"{fresh[coords]['reason']}; and {row['reason']}"
                elif coords in seen:
                    more.setdefault(coords, []).append(row["reason"])
                else:
                    fresh[coords] = dict(row)
            seen |= fresh.keys()
            self._insert_dead(conn, list(fresh.values()))
        for coords, reasons in more.items():
            self._add_reasons(conn, coords, reasons)
        return seen

    def _add_reasons(self, conn, coords: tuple, reasons: list[str]) -> None:
        """More reasons on the dead letter of the source record at ``coords`` (topic, partition, offset)."""
        d = self.dead_letters
        topic, partition, offset = coords
        conn.execute(update(d).where((d.c.pipeline == self.spec.name) & (d.c.topic == topic)
                                     & (d.c.partition == partition) & (d.c.offset == offset))
                     .values(reason=d.c.reason + "".join(f"; and {r}" for r in reasons)))

    def _upsert_refusing(self, conn, table: Table, rows: list[dict]) -> list[tuple[dict, Exception]]:
        """Upsert ``rows``, each batch inside a savepoint; a batch the database refuses for a row's
        own sake (a value too long for its column, a constraint: DataError, IntegrityError) is
        rolled back to it and split until the refused rows are found. Returns them, with why;
        every other row is written."""
        try:
            with conn.begin_nested():
                self._upsert(conn, table, rows, self.spec.sink.merge)
            return []
        except (DataError, IntegrityError) as exc:
            if len(rows) == 1:
                return [(rows[0], exc)]
        half = len(rows) // 2
        return self._upsert_refusing(conn, table, rows[:half]) + self._upsert_refusing(conn, table, rows[half:])

    def _insert_refused(self, conn, letters: list[dict]) -> int:
        """The dead letters of refused rows: a record that has one already (the transform's own
        dead letter of it, written first in this transaction) gets the refusal added to its reason,
        not a second letter dropped against the table's key. Returns how many it wrote anew."""
        d = self.dead_letters
        coords = {(x["topic"], x["partition"], x["offset"]) for x in letters}
        there = set()
        for topic in {t for t, _p, _o in coords}:
            offsets = [o for t, _p, o in coords if t == topic]
            rows = conn.execute(select(d.c.topic, d.c.partition, d.c.offset).where(
                (d.c.pipeline == self.spec.name) & (d.c.topic == topic) & d.c.offset.in_(offsets))).all()
            there |= {(r.topic, r.partition, r.offset) for r in rows} & coords
        for x in (x for x in letters if (x["topic"], x["partition"], x["offset"]) in there):
            self._add_reasons(conn, (x["topic"], x["partition"], x["offset"]), [x["reason"]])
        new = [x for x in letters if (x["topic"], x["partition"], x["offset"]) not in there]
        return self._insert_dead(conn, new) if new else 0

    def _refused_letters(self, table: Table, refused: list[tuple[dict, Exception]], plan: Plan) -> list[dict]:
        """The dead letters of the rows the database refused, one per source record: a record whose
        rows were refused more than once has them all in one dead letter (its value a JSON list),
        not a first one kept and the others dropped against the dead-letter table's key."""
        by_record: dict[tuple, list[tuple[dict, dict]]] = {}
        for row, exc in refused:
            letter = self._refused_row(table, row, exc, plan)
            by_record.setdefault((letter["topic"], letter["partition"], letter["offset"]), []).append((row, letter))
        letters = []
        for group in by_record.values():
            letter = dict(group[0][1])
            if len(group) > 1:
                letter["value"] = json.dumps([row for row, _ in group], default=str).encode()
                letter["reason"] = (f"refused by the sink: {len(group)} rows of this record; the first: "
                                    f"{group[0][1]['reason'].removeprefix('refused by the sink: ')}")
            letters.append(letter)
        return letters

    def _refused_row(self, table: Table, row: dict, exc: Exception, plan: Plan) -> dict:
        """The dead-letter row of a result row the database refused: the row itself (as JSON) with
        the database's reason, under its source coordinates.

        :raises RecordRefused: ``sink.on_refused_record: fail``, or a row without ``topic``,
            ``partition`` and ``offset`` columns (an aggregate's: no record to dead-letter it by).
        """
        why = f"the database refused its row for table {table.name}: {_first_line(exc)}"
        coords = all(row.get(c) is not None for c in ("topic", "partition", "offset"))
        where = f"{row['topic']}-{row['partition']} offset {row['offset']}" if coords else \
            f"the row of key {json.dumps({k: row.get(k) for k in self.spec.sink.key_columns}, default=str)}"
        if self.spec.sink.on_refused_record == "fail" or not coords:
            raise RecordRefused(f"{where}: {why}; " + (
                "sink.on_refused_record: fail" if coords else "it carries no topic, partition and offset to "
                "dead-letter it by") + " (nothing of the run is committed)")
        return {"pipeline": self.spec.name, "topic": row["topic"], "partition": row["partition"],
                "offset": row["offset"],
                "key": json.dumps({k: row.get(k) for k in self.spec.sink.key_columns}, default=str).encode(),
                "value": json.dumps(row, default=str).encode(), "reason": f"refused by the sink: {why}",
                "run_id": plan.run_id}


def _sqlstate(exc: Exception) -> str | None:
    """PostgreSQL's error code of ``exc`` (SQLAlchemy's or the driver's own error): psycopg2 calls
    it ``pgcode``, psycopg 3 ``sqlstate``."""
    orig = getattr(exc, "orig", None) or exc
    return getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)


def _first_line(exc: Exception) -> str:
    """The database's own message (the driver's error, first line), not SQLAlchemy's wrapping."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0]


def _batches(rows: Iterator[dict]) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH_ROWS:
            yield batch
            batch = []
    if batch:
        yield batch


class _CsvFeed:
    """Record batches as one CSV stream (no header), written by Arrow a batch at a time as the
    reader asks for more: a file to read for a driver's ``COPY … FROM STDIN``."""

    def __init__(self, batches: Iterable["pa.RecordBatch"]) -> None:
        import pyarrow.csv as pcsv

        self._csv, self._options = pcsv, pcsv.WriteOptions(include_header=False)
        self._batches = iter(batches)
        self._chunk, self._at = b"", 0
        self.rows = 0  # of the batches written so far

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is left, for a negative size); b"" at the end."""
        parts, wanted = [], size if size >= 0 else sys.maxsize
        while wanted > 0:
            if self._at >= len(self._chunk):
                batch = next(self._batches, None)
                if batch is None:
                    break
                data = io.BytesIO()
                self._csv.write_csv(batch, data, self._options)
                self._chunk, self._at = data.getvalue(), 0
                self.rows += batch.num_rows
                continue
            part = self._chunk[self._at:self._at + wanted]
            self._at += len(part)
            wanted -= len(part)
            parts.append(part)
        return b"".join(parts)


class Spool:
    """Rows written to a local temporary file in batches, read back as often as needed. Memory
    holds one batch at a time, however large the run."""

    def __init__(self, rows: Iterable[dict]) -> None:
        self._file = tempfile.TemporaryFile(prefix="kafka-eos-sql-")
        for batch in _batches(iter(rows)):
            pickle.dump(batch, self._file, protocol=pickle.HIGHEST_PROTOCOL)

    def rows(self) -> Iterator[dict]:
        self._file.seek(0)
        while True:
            try:
                yield from pickle.load(self._file)
            except EOFError:
                return

    def close(self) -> None:
        self._file.close()


class ArrowSpool:
    """Record batches written to a local temporary file (an Arrow IPC stream), read back as often
    as needed, as batches or as rows. Memory holds one batch at a time, however large the run.
    Timestamps stay as Spark sends them, in UTC with their zone: COPY's text carries the zone (a
    ``timestamptz`` column takes the instant, a ``timestamp`` column its UTC wall-clock time); as
    rows they are UTC without a zone (a driver would turn an aware one into the session's zone)."""

    def __init__(self, batches: Iterable["pa.RecordBatch"]) -> None:
        import pyarrow as pa

        self._file = tempfile.TemporaryFile(prefix="kafka-eos-sql-")
        self.schema: "pa.Schema | None" = None
        writer = None
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                self.schema = batch.schema
                writer = pa.ipc.new_stream(self._file, batch.schema)
            writer.write_batch(batch)
        if writer is not None:
            writer.close()

    @property
    def copyable(self) -> bool:
        """Whether Arrow's CSV writer writes every column as PostgreSQL's COPY reads it back (not
        binary, nested or other types: those go as rows)."""
        import pyarrow.types as t

        return self.schema is not None and all(
            t.is_string(f.type) or t.is_large_string(f.type) or t.is_integer(f.type) or t.is_floating(f.type)
            or t.is_decimal(f.type) or t.is_boolean(f.type) or t.is_timestamp(f.type) or t.is_date(f.type)
            for f in self.schema)

    def batches(self) -> Iterator["pa.RecordBatch"]:
        import pyarrow as pa

        if self.schema is None:
            return
        self._file.seek(0)
        yield from pa.ipc.open_stream(self._file)

    def rows(self) -> Iterator[dict]:
        for batch in self.batches():
            yield from _utc_naive(batch).to_pylist()

    def close(self) -> None:
        self._file.close()


def _utc_naive(batch: "pa.RecordBatch") -> "pa.RecordBatch":
    """``batch`` with its zoned timestamps as UTC without a zone (what Spark sends is zoned)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    zoned = [i for i, f in enumerate(batch.schema) if pa.types.is_timestamp(f.type) and f.type.tz]
    if not zoned:
        return batch
    columns = list(batch.columns)
    for i in zoned:
        columns[i] = pc.cast(columns[i], pa.timestamp(batch.schema[i].type.unit))
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def as_bytes(v):
    """A key or value as bytes (text as its UTF-8 bytes), None as it is."""
    if v is None or isinstance(v, bytes):
        return v
    return bytes(v) if isinstance(v, bytearray) else str(v).encode()

