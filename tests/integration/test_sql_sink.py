"""The SQL sink's database transaction is short: Spark computes first, the database writes after."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine, text

from kafka_eos.batch import run_batch
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.sample_data import produce_orders

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

#: PostgreSQL ends a session that sits idle inside a transaction longer than this. A Spark job
#: takes far longer; a run of database statements has no pause near it.
IDLE_IN_TRANSACTION_MS = 300


def test_the_database_transaction_never_waits_on_spark(spark, kafka_settings, make_spec, postgres_url):
    """Before: rows streamed from Spark into an open transaction, and PostgreSQL's
    idle_in_transaction_session_timeout ended the session mid-run ("terminating connection due to
    idle-in-transaction timeout"); nothing could commit."""
    url = f"{postgres_url}?options=-c%20idle_in_transaction_session_timeout%3D{IDLE_IN_TRANSACTION_MS}"
    table = "revenue_short_txn"
    with create_engine(postgres_url).begin() as conn:  # the session's database is shared: a fresh table
        conn.execute(text(f"drop table if exists {table}"))
    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     table=table, key_columns=["minute", "category"], merge="add", url=url)
    truth = produce_orders(kafka_settings, spec.source.topics[0], 300, abort_every=4, malformed_every=13)

    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    verify(spec, kafka_settings, plan)

    assert (summary.status, summary.dead_letters) == ("committed", truth.malformed)
    with create_engine(postgres_url).connect() as conn:
        assert conn.execute(text(f"select sum(order_count) from {table}")).scalar() == len(truth.committed)


NAMES = '''
from pyspark.sql import functions as F

def names(df):
    return df.select("topic", "partition", "offset", F.col("value").cast("string").alias("name"),
                     F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.mark.parametrize("on_refused", ["dead_letter", "fail"])
def test_a_row_the_database_refuses_is_a_dead_letter_not_a_stopped_pipeline(spark, kafka_settings, make_spec,
                                                                             postgres_url, transforms_from, unique,
                                                                             on_refused):
    """A value too long for its column (DataError) and one a CHECK constraint refuses
    (IntegrityError): each failed the whole batch on every run. Now the rows the database refuses
    are found (a savepoint per batch, split until found) and written as dead letters in the same
    transaction, the rest as results; ``fail`` names the record and commits nothing."""
    from confluent_kafka import Producer

    from kafka_eos import kafka_admin
    from kafka_eos.errors import RecordRefused
    from kafka_eos.sinks.sql_store import BATCH_ROWS

    table = f"names_{unique.replace('-', '_')}"[:60]
    with create_engine(postgres_url).begin() as conn:
        conn.execute(text(f'create table {table} (topic text, partition int, "offset" bigint, name varchar(8) '
                          f"check (name <> 'bad'), primary key (topic, partition, \"offset\"))"))
    transform = transforms_from("names_transform", NAMES) + ":names"
    spec = make_spec(transform, "sql", "atomic", partitions=2, table=table, url=postgres_url,
                     key_columns=["topic", "partition", "offset"], on_refused_record=on_refused)
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(BATCH_ROWS + 200):  # more than one batch of rows
        name = "much-too-long" if i == 700 else "bad" if i == 1100 else f"n{i}"
        producer.produce(topic, value=name.encode(), partition=i % 2)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    if on_refused == "fail":
        with pytest.raises(RecordRefused, match=rf"^{topic}-0 offset 350: the database refused its row for table "
                                                rf"{table}: value too long for type character varying\(8\); "
                                                r"sink.on_refused_record: fail \(nothing of the run is committed\)$"):
            run_batch(spark, spec, plan, kafka_settings)
        with create_engine(postgres_url).connect() as conn:
            assert conn.execute(text(f"select count(*) from {table}")).scalar() == 0
        assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id,
                                                 [r.tp for r in plan.ranges]).values()) == {None}
        return
    summary = run_batch(spark, spec, plan, kafka_settings)
    verify(spec, kafka_settings, plan)  # past the refused rows: the pipeline goes on
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", BATCH_ROWS + 198, 2)
    with create_engine(postgres_url).connect() as conn:
        assert conn.execute(text(f"select count(*) from {table}")).scalar() == BATCH_ROWS + 198
        dead = conn.execute(text("select topic, partition, \"offset\", reason, value from kafka_eos_dead_letters "
                                 "where pipeline = :p order by \"offset\""), {"p": spec.name}).all()
    assert [(d.topic, d.partition, d.offset) for d in dead] == [(topic, 0, 350), (topic, 0, 550)]
    assert dead[0].reason == (f"refused by the sink: the database refused its row for table {table}: value too long "
                              "for type character varying(8)")
    assert dead[1].reason.startswith(f"refused by the sink: the database refused its row for table {table}: new row "
                                     f'for relation "{table}" violates check constraint')
    assert b'"name": "much-too-long"' in bytes(dead[0].value)


TWO_ROWS = '''
from pyspark.sql import functions as F

def two_rows(df):
    rows = df.select("topic", "partition", "offset", F.explode(F.array(F.lit(1), F.lit(2))).alias("n"),
                     F.col("value").cast("string").alias("value"))
    both = F.col("value") == "deadbad"  # row 1 a dead letter of the transform's, row 2 a row the database refuses
    twice = F.col("value") == "dead2"  # both rows dead letters of the transform's
    return rows.select("topic", "partition", "offset", "n",
                       F.when(both, F.lit("bad")).otherwise(F.col("value")).alias("name"),
                       F.when(both & (F.col("n") == 1), F.lit("the transform's own reason"))
                       .when(twice, F.concat(F.lit("rule "), F.col("n").cast("string"))).alias("dlq_reason"))
'''


def test_rows_the_database_refuses_of_one_record_are_one_dead_letter_holding_them_all(spark, kafka_settings,
                                                                                     make_spec, transforms_from,
                                                                                     unique, tmp_path):
    """A transform that gives each record two rows; the database refuses both rows of one record.
    Before: two dead letters of the same source coordinates, the second dropped against the
    dead-letter table's key (ON CONFLICT DO NOTHING) and counted all the same. Now one dead letter
    holds both rows, and the count is what the table holds. Likewise a record both of whose rows
    the transform makes dead letters: one letter with both reasons."""
    url = f"sqlite:///{tmp_path / 'two.db'}"
    table = "two_rows"
    with create_engine(url).begin() as conn:
        conn.execute(text(f'create table {table} (topic text, partition int, "offset" bigint, n int, name text '
                          f"check (name <> 'bad'), primary key (topic, partition, \"offset\", n))"))
    spec = make_spec(transforms_from(f"two_{unique.replace('-', '_')}", TWO_ROWS) + ":two_rows", "sql", "atomic",
                     partitions=1, table=table, url=url, key_columns=["topic", "partition", "offset", "n"])
    from confluent_kafka import Producer

    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(10):
        value = b"bad" if i in (3, 7) else b"deadbad" if i == 5 else b"dead2" if i == 8 else f"n{i}".encode()
        producer.produce(spec.source.topics[0], value=value, partition=0)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.records_out, summary.dead_letters) == (12, 4)
    with create_engine(url).connect() as conn:
        assert conn.execute(text(f"select count(*) from {table}")).scalar() == 12
        dead = conn.execute(text('select "offset", reason, value from kafka_eos_dead_letters where pipeline = :p '
                                 'order by "offset"'), {"p": spec.name}).all()
    assert [d.offset for d in dead] == [3, 5, 7, 8]
    # Two dead letters of the transform's for one record: one letter, both reasons (not the second dropped).
    assert dead[3].reason == "rule 1; and rule 2", dead[3].reason
    assert all(d.reason.startswith("refused by the sink: 2 rows of this record; the first: the database refused "
                                   f"its row for table {table}: ") for d in (dead[0], dead[2])), dead[0].reason
    assert sorted(r["n"] for r in json.loads(bytes(dead[0].value))) == [1, 2]
    # One record, a dead letter of the transform's and a row the database refused: one letter, both reasons.
    assert dead[1].reason.startswith("the transform's own reason; and refused by the sink: the database refused "
                                     f"its row for table {table}: "), dead[1].reason


def test_a_run_larger_than_one_job_may_return_is_fetched_a_task_at_a_time(spark, kafka_settings, make_spec,
                                                                           transforms_from, unique, tmp_path,
                                                                           max_result_size):
    """Results and dead letters more than spark.driver.maxResultSize lets one job return: both runs
    failed with only a Py4JJavaError ("Total size of serialized results ... is bigger than
    spark.driver.maxResultSize"), on every retry: the pipeline stopped for good. Now they are
    fetched one Spark task at a time when one job's are refused."""
    from confluent_kafka import Producer

    url = f"sqlite:///{tmp_path / 'big.db'}"
    spec = make_spec(transforms_from(f"names_{unique.replace('-', '_')}", NAMES_OR_DEAD) + ":names", "sql", "atomic",
                     table="names", url=url, key_columns=["topic", "partition", "offset"])
    producer = Producer(kafka_settings.client_config(**{"linger.ms": 20}))
    for i in range(900):
        producer.produce(spec.source.topics[0], value=(("dead-" if i % 2 else "") + "x" * 300).encode(),
                         partition=i % 3)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    max_result_size("100k")  # about 50 KB of results and 50 KB of dead letters per task, 150 KB of each in all
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 450, 450)
    verify(spec, kafka_settings, plan)
    with create_engine(url).connect() as conn:
        assert conn.execute(text("select count(*) from names")).scalar() == 450


NAMES_OR_DEAD = '''
from pyspark.sql import functions as F

def names(df):
    value = F.col("value").cast("string")
    return df.select("topic", "partition", "offset", value.alias("name"),
                     F.when(value.startswith("dead-"), F.lit("a dead letter")).alias("dlq_reason"))
'''


def test_a_refresh_never_moves_a_sql_sinks_mirror_back_behind_a_concurrent_run(spark, kafka_settings, make_spec,
                                                                               monkeypatch):
    """The refresh (and a drift repair) republished a SQL checkpoint it had read before a run's
    commit; landing after that run's own mirror, it moved the Kafka group offsets back (the run's
    final check then failed: "the mirror was not updated"). Now it reads and publishes while the
    offsets rows are locked: the run's commit waits for it, and its mirror comes last."""
    import threading

    from kafka_eos import kafka_admin, pipeline
    from kafka_eos.sinks import sql_store as sql

    spec = make_spec("spark_apps.transforms.revenue:revenue_per_minute", "sql", "atomic",
                     key_columns=["minute", "category"], merge="add")
    produce_orders(kafka_settings, spec.source.topics[0], 100, abort_every=0, malformed_every=0)
    first = prepare_plan(spec, kafka_settings, "run-1")
    run_batch(spark, spec, first, kafka_settings)
    produce_orders(kafka_settings, spec.source.topics[0], 100, first_seq=100, abort_every=0, malformed_every=0,
                   transactional_id="second")
    second = prepare_plan(spec, kafka_settings, "run-2")

    refresh_publishing, run_mirrored = threading.Event(), threading.Event()
    real = kafka_admin.alter_group_offsets

    def alter(settings, group_id, offsets, planned_ms=None):
        if threading.current_thread().name == "refresh":
            refresh_publishing.set()
            run_mirrored.wait(5)  # the run's mirror first, if the run can get there meanwhile
            return real(settings, group_id, offsets, planned_ms)
        real(settings, group_id, offsets, planned_ms)
        run_mirrored.set()

    for module in (sql, pipeline):
        monkeypatch.setattr(module, "alter_group_offsets", alter, raising=False)
    refresh = threading.Thread(target=pipeline.refresh_checkpoints, args=(spec, kafka_settings),
                               kwargs={"every": True}, name="refresh")
    refresh.start()
    assert refresh_publishing.wait(30)
    run_batch(spark, spec, second, kafka_settings)
    refresh.join(60)
    tps = [r.tp for r in second.ranges]
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == {
        r.tp: r.until for r in second.ranges}
    verify(spec, kafka_settings, second)


TYPED = '''
from pyspark.sql import functions as F

def typed(df):
    o = F.col("offset")
    text = (F.when(o % 5 == 0, F.lit(None)).when(o % 5 == 1, F.lit(""))
            .otherwise(F.concat(F.lit('comma, "quote"\\nline '), F.col("value").cast("string"))))
    return df.select("topic", "partition", "offset", text.alias("text"),
                     (o.cast("decimal(18,2)") / 4).cast("decimal(18,2)").alias("amount"),
                     F.timestamp_seconds(o + 1700000000).alias("at"),
                     F.to_date(F.timestamp_seconds(o * 86400)).alias("day"),
                     (o % 2 == 0).alias("even"), (o / 3).alias("ratio"),
                     F.when(o % 7 == 0, F.lit(None)).otherwise(o * 1000).alias("big"),
                     F.lit(None).cast("string").alias("dlq_reason"))
'''


def test_rows_reach_postgresql_by_copy_value_for_value(spark, kafka_settings, make_spec, postgres_url,
                                                       transforms_from, unique, monkeypatch):
    """The results go to PostgreSQL by COPY (as Arrow writes them in CSV), not row by row: texts
    with commas, quotes and line breaks, empty texts and nulls, decimals, timestamps (UTC), dates,
    booleans, doubles and big integers come back exactly; a second run of the same keys upserts."""
    from datetime import date, datetime, timedelta
    from decimal import Decimal

    from confluent_kafka import Producer

    from kafka_eos.sinks.sql_store import SqlStore

    row_by_row = []
    real = SqlStore._upsert_refusing
    monkeypatch.setattr(SqlStore, "_upsert_refusing", lambda self, conn, table, rows: row_by_row.append(len(rows))
                        or real(self, conn, table, rows))
    table = f"typed_{unique.replace('-', '_')}"[:60]
    spec = make_spec(transforms_from("typed_transform", TYPED) + ":typed", "sql", "atomic", partitions=2,
                     table=table, url=postgres_url, key_columns=["topic", "partition", "offset"])
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(3000):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    verify(spec, kafka_settings, plan)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 3000, 0)
    assert row_by_row == []  # all by COPY

    def expected(partition: int, offset: int) -> tuple:
        value = f"v{2 * offset + partition}"
        text = None if offset % 5 == 0 else "" if offset % 5 == 1 else f'comma, "quote"\nline {value}'
        return (text, (Decimal(offset) / 4).quantize(Decimal("0.01")),
                datetime(2023, 11, 14, 22, 13, 20) + timedelta(seconds=offset),
                date(1970, 1, 1) + timedelta(days=offset), offset % 2 == 0, offset / 3,
                None if offset % 7 == 0 else offset * 1000)

    def stored() -> list:
        with create_engine(postgres_url).connect() as conn:
            return conn.execute(text(f'select partition, "offset", text, amount, at, day, even, ratio, big from {table}'
                                     ' order by partition, "offset"')).all()

    rows = stored()
    assert len(rows) == 3000
    assert [tuple(r[2:]) for r in rows] == [expected(r.partition, r.offset) for r in rows]

    # Another pipeline over the same topic into the same table (a record more): the 3,000 keys there
    # are upserted through the staging table, not refused or doubled.
    producer.produce(topic, value=b"v3000", partition=0)
    assert producer.flush(30) == 0
    from kafka_eos.spec import parse_spec, spec_document

    doc = spec_document(spec)
    doc["name"] = f"{spec.name}-again"
    doc["source"] = {"topics": [topic]}
    again = parse_spec(doc, spec.path.replace(".yaml", "-again.yaml"))
    plan = prepare_plan(again, kafka_settings, "run-2")
    assert run_batch(spark, again, plan, kafka_settings).records_out == 3001
    assert row_by_row == []
    rows = stored()
    assert len(rows) == 3001
    assert [tuple(r[2:]) for r in rows] == [expected(r.partition, r.offset) for r in rows]


KEYED = '''
from pyspark.sql import functions as F

def keyed(df):
    results = df.select((F.col("offset") % 3).alias("k"), F.lit(1).cast("bigint").alias("n"), F.lit(2.5).alias("x"))
    dead_letters = df.where(F.lit(False)).select("topic", "partition", "offset", "key", "value",
                                                 F.lit(None).cast("string").alias("dlq_reason"))
    return results, dead_letters
'''


LATEST = '''
import time

from pyspark.sql import functions as F
from pyspark.sql import types as T


@F.udf(T.LongType())
def _first_task_slow(offset):
    if offset == 0:
        time.sleep(3)  # the task of offsets [0, 10) ends after those of [10, 20) and [20, 30)
    return offset


def latest(df):
    offset = _first_task_slow(F.col("offset"))
    results = df.select(F.when(offset.isin(5, 25), F.lit(0)).otherwise(offset + 100).cast("bigint").alias("k"),
                        offset.alias("v"))
    dead_letters = df.where(F.lit(False)).select("topic", "partition", "offset", "key", "value",
                                                 F.lit(None).cast("string").alias("dlq_reason"))
    return results, dead_letters
'''


def test_merge_replace_keeps_the_row_of_a_keys_latest_record_whichever_task_ends_first(
        spark, kafka_settings, make_spec, transforms_from, unique, monkeypatch):
    """A key a run gives twice (offsets 5 and 25 of one partition, read by three tasks) keeps the
    row of its later record under ``merge: replace``, row by row in the partition's order, though
    the task that read the earlier one ends last (SQLite: the rows path)."""
    from confluent_kafka import Producer

    from kafka_eos import batch

    monkeypatch.setattr(batch, "DRIVER_TASK_RECORDS", 10)  # three read tasks of ten offsets
    table = f"latest_{unique.replace('-', '_')}"[:60]
    spec = make_spec(transforms_from(f"latest_{unique.replace('-', '_')}", LATEST) + ":latest", "sql", "atomic",
                     partitions=1, table=table, key_columns=["k"], merge="replace")
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(30):
        producer.produce(spec.source.topics[0], value=b"x", partition=0)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    run_batch(spark, spec, plan, kafka_settings)
    verify(spec, kafka_settings, plan)
    with create_engine(spec.sink.url).connect() as conn:
        assert conn.execute(text(f"select v from {table} where k = 0")).all() == [(25,)]
        assert conn.execute(text(f"select count(*) from {table}")).scalar() == 29


@pytest.mark.parametrize("merge,path", [("add", "copy"), ("replace", "copy"), ("add", "rows")])
def test_a_key_a_run_gives_twice_is_summed_under_merge_add_and_refused_under_replace(
        spark, kafka_settings, make_spec, postgres_url, transforms_from, unique, merge, path, monkeypatch):
    """PostgreSQL's ON CONFLICT merges a key once per statement. ``merge: add`` sums a run's rows of
    one key first (as merging them one by one would); ``replace`` has no last row to keep: a
    one-line error naming the table and the key columns, and nothing committed. Rows that do not go
    by COPY go a batch per INSERT; a batch that holds a key twice goes row by row, in order."""
    from confluent_kafka import Producer

    from kafka_eos import kafka_admin
    from kafka_eos.errors import SpecError
    from kafka_eos.sinks.sql_store import ArrowSpool

    if path == "rows":
        monkeypatch.setattr(ArrowSpool, "copyable", property(lambda self: False))
    table = f"keyed_{merge}_{path}_{unique.replace('-', '_')}"[:60]
    spec = make_spec(transforms_from(f"keyed_{merge}", KEYED) + ":keyed", "sql", "atomic", partitions=1,
                     table=table, url=postgres_url, key_columns=["k"], merge=merge)
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(30):
        producer.produce(topic, value=b"x", partition=0)
    assert producer.flush(30) == 0
    plan = prepare_plan(spec, kafka_settings, "run-1")
    if merge == "replace":
        with pytest.raises(SpecError, match=rf"sink.key_columns: the run's rows for table {table} hold a key \(k\) "
                                            r"more than once, and merge: replace keeps one row per key"):
            run_batch(spark, spec, plan, kafka_settings)
        assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(topic, 0)]) == {(topic, 0): None}
        return
    run_batch(spark, spec, plan, kafka_settings)
    verify(spec, kafka_settings, plan)
    for i in range(6):
        producer.produce(topic, value=b"x", partition=0)
    assert producer.flush(30) == 0
    run_batch(spark, spec, prepare_plan(spec, kafka_settings, "run-2"), kafka_settings)
    with create_engine(postgres_url).connect() as conn:
        assert conn.execute(text(f"select k, n, x from {table} order by k")).all() == [(0, 12, 30.0), (1, 12, 30.0),
                                                                                        (2, 12, 30.0)]


def test_rows_and_dead_letters_go_a_batch_per_insert(spark, kafka_settings, make_spec, postgres_url,
                                                     transforms_from, unique, monkeypatch):
    """Where rows cannot go by COPY (the database refused one, or a column COPY's CSV cannot carry),
    and for dead letters, each INSERT … ON CONFLICT carries a batch of rows: SQLAlchemy sent such a
    statement row by row, a round trip each (24,000 dead letters took 4.2 s)."""
    from confluent_kafka import Producer
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from kafka_eos.sinks.sql_store import BATCH_ROWS, ArrowSpool

    monkeypatch.setattr(ArrowSpool, "copyable", property(lambda self: False))  # the rows' path
    table = f"batched_{unique.replace('-', '_')}"[:60]
    spec = make_spec(transforms_from("batched_transform", BATCHED) + ":batched", "sql", "atomic", partitions=2,
                     table=table, url=postgres_url, key_columns=["partition", "offset"])
    topic = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"enable.idempotence": True}))
    for i in range(3 * BATCH_ROWS):
        producer.produce(topic, value=b"bad" if i % 3 == 0 else b"ok", partition=i % 2)
    assert producer.flush(30) == 0

    inserts = []  # (table, statements the database ran): the driver's executemany runs one per row

    def seen(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith("INSERT INTO"):
            rows = executemany and isinstance(parameters, (list, tuple))  # one parameter set per row
            inserts.append((statement.split()[2].strip('"'), len(parameters) if rows else 1))

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        plan = prepare_plan(spec, kafka_settings, "run-1")
        summary = run_batch(spark, spec, plan, kafka_settings)
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    verify(spec, kafka_settings, plan)
    assert (summary.status, summary.records_out, summary.dead_letters) == ("committed", 2 * BATCH_ROWS, BATCH_ROWS)
    assert sorted(i for i in inserts if i[0] != "kafka_eos_offsets") == [(table, 1), (table, 1),
                                                                         ("kafka_eos_dead_letters", 1)]
    with create_engine(postgres_url).connect() as conn:
        assert conn.execute(text(f"select count(*), sum(n) from {table}")).one() == (2 * BATCH_ROWS, 2 * BATCH_ROWS)
        assert conn.execute(text("select count(*) from kafka_eos_dead_letters where pipeline = :p"),
                            {"p": spec.name}).scalar() == BATCH_ROWS


BATCHED = '''
from pyspark.sql import functions as F

def batched(df):
    bad = F.col("value") == F.lit(b"bad")
    return (df.where(~bad).select("partition", "offset", F.lit(1).cast("bigint").alias("n")),
            df.where(bad).select("topic", "partition", "offset", "key", "value",
                                 F.lit("bad record").alias("dlq_reason")))
'''


COIN = '''
import random

from pyspark.sql import functions as F
from pyspark.sql import types as T

# A dead-letter rule that gives another answer each time it is asked, as one on the clock
# (current_timestamp() is fixed per Spark job, not per run) or an outside service may.
_coin = F.udf(lambda: "tails" if random.random() < 0.5 else None, T.StringType()).asNondeterministic()


def coin(df):
    return df.select("topic", "partition", "offset", F.col("value").cast("string").alias("name"),
                     _coin().alias("dlq_reason"))
'''


def produce_coin_source(settings, topic: str) -> None:
    """400 records, 200 on each of partitions 0 and 1, for the COIN transform."""
    from confluent_kafka import Producer

    producer = Producer(settings.client_config(**{"linger.ms": 20}))
    for i in range(400):
        producer.produce(topic, value=f"n{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0


def coin_places(url: str, pipeline: str) -> tuple[set, set]:
    """(partition, offset) of the SQL table ``coin``'s rows, and of ``pipeline``'s dead letters."""
    with create_engine(url).connect() as conn:
        rows = {(r.partition, r.offset) for r in conn.execute(text('select partition, "offset" from coin'))}
        dead = {(r.partition, r.offset) for r in conn.execute(
            text('select partition, "offset" from kafka_eos_dead_letters where pipeline = :p'), {"p": pipeline})}
    return rows, dead


def assert_each_record_in_one_place(rows: set, dead: set, counts: tuple[int, int, int]) -> None:
    """Each of produce_coin_source's records a row or a dead letter, never both, never neither, and
    the run's (in, out, dead letters) saying so; the COIN rule gave both answers."""
    assert not rows & dead, f"{len(rows & dead)} record(s) both a row and a dead letter"
    assert rows | dead == {(p, o) for p in (0, 1) for o in range(200)}, f"{400 - len(rows | dead)} record(s) lost"
    assert counts == (400, len(rows), len(dead))
    assert 100 < len(dead) < 300  # the rule gave both answers


def test_each_record_is_a_row_or_a_dead_letter_even_where_the_transforms_rule_changes_its_mind(
        spark, kafka_settings, make_spec, transforms_from, unique, tmp_path):
    """The results and the dead letters were two Spark jobs, each computing the transform: a record
    whose dead-letter rule answered otherwise in the second job was in both tables, or in neither
    (lost, its offset committed). Now the transform's output is computed once for both."""
    url = f"sqlite:///{tmp_path / 'coin.db'}"
    spec = make_spec(transforms_from(f"coin_{unique.replace('-', '_')}", COIN) + ":coin", "sql", "atomic",
                     partitions=2, table="coin", url=url, key_columns=["topic", "partition", "offset"])
    produce_coin_source(kafka_settings, spec.source.topics[0])
    plan = prepare_plan(spec, kafka_settings, "run-1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    rows, dead = coin_places(url, spec.name)
    assert_each_record_in_one_place(rows, dead, (summary.records_in, summary.records_out, summary.dead_letters))
