"""Where side runs (replays, backfills) write, and how their results reach the live place: what
a Kafka sink's records and a SQL sink's rows carry to tell ranges and generations apart, the
branch an Iceberg side run writes, the checks that a spec has places of its own for them, and
the statement that promotes a checked SQL side run into the live table.

No Kafka client here: the DAG factory and the trigger form read it at parse time.
"""

from __future__ import annotations

from kafka_eos.errors import SpecError
from kafka_eos.spec import PipelineSpec

#: Header names of side-run records: which range (or interval) and which generation wrote them.
RANGE_HEADER, GENERATION_HEADER = "kafka-eos.range", "kafka-eos.generation"
#: Columns a SQL side run's table has beyond the live table's: which range and which generation.
RANGE_COLUMN, GENERATION_COLUMN = "kafka_eos_range", "kafka_eos_generation"
#: An Iceberg side run's branch of the live table (and of its dead letters' table):
#: ``kafka-eos.<pipeline>.<kind>.<key>.g<generation>`` (pipelines may share a table).
BRANCH_PREFIX = "kafka-eos."


def side_branch(pipeline: str, suffix: str) -> str:
    """The Iceberg branch of pipeline ``pipeline``'s side run ``suffix`` (``backfill.<key>.g1``)."""
    return f"{BRANCH_PREFIX}{pipeline}.{suffix}"


def check_side_runs(spec: PipelineSpec, kind: str = "side run") -> None:
    """:raises SpecError: ``spec`` has no place of its own for side runs' results (a Kafka sink
        without ``sink.backfill_topic``, a SQL sink without ``sink.backfill_table``)."""
    if spec.sink.about.no_side_runs:
        raise SpecError(f"{spec.path}: a {kind} of a {spec.sink.kind} sink is refused: {spec.sink.about.no_side_runs}")
    if not spec.sink.backfill_target:
        raise SpecError(f"{spec.path}: sink.{spec.sink.about.backfill}: required for a {kind} of a {spec.sink.kind} "
                        f"sink (its results never go to the live output {spec.sink.about.target})")


def writes_to(spec: PipelineSpec) -> str:
    """Where side runs of ``spec`` write, in words (the trigger form, a run's summary)."""
    s = spec.sink
    if s.about.promoted_by == "branch":
        return (f"a branch of Iceberg table `{s.table}` of its own, `{side_branch(spec.name, '<kind>.<key>.g<generation>')}` "
                f"(dead letters: that branch of `{s.dead_letters_table}`)")
    if s.about.promoted_by is None:
        dlq = f"; dead letters to `{s.backfill_dlq_topic or s.backfill_topic}`" if s.dlq_topic else ""
        return f"topic `{s.backfill_topic}` (headers {RANGE_HEADER}, {GENERATION_HEADER}){dlq}"
    return (f"table `{s.backfill_table}` in the sink's database (columns {RANGE_COLUMN}, {GENERATION_COLUMN}); "
            f"dead letters to `{s.backfill_table}_dead_letters`")


def promote_caveat(spec: PipelineSpec) -> str:
    """What a person must know before running :func:`promote_sql` of ``spec`` ("" when nothing)."""
    if spec.sink.merge == "add":  # a sql sink's (a kafka sink has no merge)
        return ("merge: add: each key's live row is set to this range's total; promote ranges holding all of a "
                "key's records")
    return ""


def promote_sql(spec: PipelineSpec, key: str, generation: int, columns: list[str]) -> str:
    """The SQL statement that copies the rows of a side run (its ``key`` and ``generation``, see
    :class:`kafka_eos.backfill.side.Side`) from the backfill table into the
    live table (PostgreSQL and SQLite alike): for a keyed table each live row of a key the side
    run produced is replaced by the side run's (with ``merge: add`` that is its total over the
    side run's range: promote ranges that cover every record of their keys, e.g. whole
    intervals of a time-bucketed aggregate); an unkeyed table gets the rows appended.

    :param columns: the live table's columns (the backfill table's, less range and generation).
    """
    s = spec.sink
    q = lambda name: '"' + name.replace('"', '""') + '"'  # noqa: E731
    cols = ", ".join(q(c) for c in columns)
    sql = (f"INSERT INTO {q(s.table)} ({cols}) SELECT {cols} FROM {q(s.backfill_table)} "
           f"WHERE {q(RANGE_COLUMN)} = '{key}' AND {q(GENERATION_COLUMN)} = {int(generation)}")
    if s.key_columns:
        values = [c for c in columns if c not in s.key_columns]
        conflict = f" ON CONFLICT ({', '.join(q(c) for c in s.key_columns)}) "
        sql += conflict + ("DO UPDATE SET " + ", ".join(f"{q(c)} = excluded.{q(c)}" for c in values)
                           if values else "DO NOTHING")
    return sql + ";"
