"""The SQL sink's database transaction is short: Spark computes first, the database writes after."""

from __future__ import annotations

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
