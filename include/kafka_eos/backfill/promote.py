"""``kafka-eos backfill promote``: a checked side run's results moved into the live place, as an
explicit operator step (a side run itself never writes the live place: :mod:`kafka_eos.backfill.side`).

- Iceberg sinks: the side run's branch of the live table (and of its dead letters' table) onto
  ``main``: a fast-forward where ``main`` has not moved since the branch was cut, else one snapshot
  appending the branch's own data files; once, and one generation of a side run only
  (:meth:`kafka_eos.sinks.iceberg_store.IcebergStore.promote`). With ``merge: append``, a side run
  whose range reaches where the live pipeline started on its partition (records ``main`` holds or
  will hold: a replay of what the live pipeline wrote) or meets a range promoted before is refused
  unless ``overlap`` (the operator deleted them from ``main`` first); a backfill of history from
  before the live pipeline's start is promoted as it is.
- SQL sinks: the statement of :func:`kafka_eos.backfill.side.promote_statement`, run in one
  database transaction for a keyed table (an upsert: running it again sets the same rows); an
  unkeyed table's would append the rows again, so it is printed for a person to run once.
- Kafka sinks: refused (the backfill topic is where its consumers read a side run).

A side run is promoted only when every range it recorded is committed (its checkpoints at their
ends): a side run half done, or one never run, is refused naming the partition.
"""

from __future__ import annotations

import re

from kafka_eos.backfill.places import promote_caveat, side_branch
from kafka_eos.backfill.side import Side, mapping_key, plan_of, side_spec
from kafka_eos.errors import PlanError, SpecError
from kafka_eos.manifest import ManifestStore
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

#: A side run's name, as its run's note and summary give it: ``<kind>.<key>.g<generation>``.
SIDE_NAME = re.compile(r"^(replay|backfill)\.([A-Za-z0-9-]+)\.g([1-9][0-9]*)$")


def parse_side(text: str, pipeline: str) -> Side:
    """``backfill.20260301T120000Z-20260301T120500Z.g1`` (or its branch,
    ``kafka-eos.<pipeline>.<that>``) as a :class:`Side`.

    :raises PlanError: not a side run's name.
    """
    m = SIDE_NAME.match(text.removeprefix(side_branch(pipeline, "")))
    if m is None:
        raise PlanError(f"side run {text!r}: not a side run's name (<replay|backfill>.<key>.g<generation>, as the "
                        "run's note gives it)")
    return Side(m.group(1), m.group(2), int(m.group(3)))


def check_done(spec: PipelineSpec, settings: KafkaSettings, side: Side) -> dict[tuple[str, int], tuple[int, int]]:
    """The ranges of ``side``, every one committed.

    :raises PlanError: ``side`` was never prepared, or a range of it is not committed yet.
    """
    mapping = ManifestStore.of(spec, settings).find(mapping_key(spec, side.kind, side.key))
    if mapping is None or side.generation not in mapping["generations"].values():
        raise PlanError(f"manifest {spec.manifest_topic!r}: no {side.kind} {side.key!r} generation {side.generation} "
                        "was run")
    plan = plan_of(spec, settings, side, "promote", mapping)
    if plan.active:
        r = plan.active[0]
        raise PlanError(f"{r.topic}-{r.partition}: {side.kind} {side.key} generation {side.generation} has not "
                        f"committed its range [{r.from_offset}, {r.until}) yet: run it to its end before promoting")
    return {(t, p): (a, b) for t, p, a, b in mapping["ranges"]}


def promote(spec: PipelineSpec, settings: KafkaSettings, side: Side, apply: bool, overlap: bool = False) -> dict:
    """Promote side run ``side`` of ``spec`` (the module's rules).

    :param apply: False: what it would do (a dry run).
    :param overlap: an Iceberg append table: promote even where ``main`` may hold the range.
    :returns: ``{"pipeline", "side", "sink", "applied", ...}``: an Iceberg sink's ``tables``
        (:meth:`IcebergStore.promote`), a SQL sink's ``statement`` and ``caveat``.
    """
    how = spec.sink.about.promoted_by
    if how is None:
        raise SpecError(f"{spec.path}: a {spec.sink.kind} sink's side runs are not promoted: they stay in "
                        f"sink.{spec.sink.about.backfill} {spec.sink.backfill_target!r}, where its consumers read them")
    ranges = check_done(spec, settings, side)
    out = {"pipeline": spec.name, "side": side.suffix, "sink": spec.sink.kind, "applied": False}
    if how == "branch":
        from kafka_eos.sinks.iceberg_store import IcebergStore
        from kafka_eos.sinks.sql_store import database_url

        store = IcebergStore(spec, database_url(spec, settings))
        out["branch"] = side_branch(spec.name, side.suffix)
        out["tables"] = store.promote(out["branch"], f"{spec.name}.{side.kind}.{side.key}", apply, ranges, overlap)
        out["applied"] = apply
        return out
    from kafka_eos.backfill.side import promote_statement

    out["statement"] = promote_statement(spec, side, settings)
    out["caveat"] = promote_caveat(spec)
    if apply:
        if not spec.sink.key_columns:
            raise SpecError(f"{spec.path}: SQL table {spec.sink.table!r} has no sink.key_columns: promoting appends "
                            "the side run's rows, and a second promote would append them again; run the statement "
                            "once yourself (without --yes it is printed)")
        from sqlalchemy import text

        from kafka_eos.sinks.sql_store import database_url, make_engine

        engine = make_engine(database_url(side_spec(spec, side), settings))
        try:
            with engine.begin() as conn:
                out["rows"] = conn.execute(text(out["statement"])).rowcount
        finally:
            engine.dispose()
        out["applied"] = True
    return out
