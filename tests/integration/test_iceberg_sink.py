"""The Iceberg table sink, exactly once: every committed source record once in the table (read back
with PyIceberg's own scan, not kafka-eos's reader), none of an aborted transaction, the offsets in
the snapshot summary at the LSO and mirrored to the group; a retry and a caught-up run commit
nothing; a crash before and after the catalog commit; a compaction between two runs loses no
offset; dead letters once in their table, a crash between their snapshot and the table's included.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
import yaml

from kafka_eos import kafka_admin, probes
from kafka_eos.batch import run_batch
from kafka_eos.cli import main
from kafka_eos.errors import CheckpointConflict, SpecError
from kafka_eos.pipeline import prepare_plan, verify
from kafka_eos.sample_data import produce_orders
from kafka_eos.spec import spec_document
from test_exactly_once import capped, run_once

pytestmark = pytest.mark.integration


@pytest.fixture
def iceberg_spec(make_spec, tmp_path, unique):
    """An Iceberg pipeline (orders as rows, dead letters apart) on a SQLite catalog of its own."""

    def build(**sink):
        sink = {"url": f"sqlite:///{tmp_path / 'catalog.db'}", **sink}
        return make_spec("spark_apps.transforms.orders:as_rows", "iceberg", "atomic",
                         table=f"lake.orders_{unique.replace('-', '_')}", warehouse=(tmp_path / "warehouse").as_uri(),
                         **sink)

    return build


def catalog(spec):
    """The pipeline's catalog, opened by PyIceberg directly."""
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(spec.sink.catalog, uri=spec.sink.url, warehouse=spec.sink.warehouse)


def table_rows(spec, name=None) -> list[dict]:
    from kafka_eos.sinks.iceberg_store import identifier

    return catalog(spec).load_table(identifier(name or spec.sink.table)).scan().to_arrow().to_pylist()


def snapshot_offsets(spec) -> dict:
    from kafka_eos.sinks.iceberg_store import identifier

    summary = catalog(spec).load_table(identifier(spec.sink.table)).current_snapshot().summary
    raw = json.loads(summary[f"kafka-eos.{spec.name}.offsets"])
    return {(t, int(p)): o for t, parts in raw.items() for p, o in parts.items()}


def assert_exactly_once(spec, settings, truth):
    rows = table_rows(spec)
    assert Counter(r["order_id"] for r in rows) == Counter(o["order_id"] for o in truth.committed)
    assert not {r["order_id"] for r in rows} & set(truth.aborted)
    dead = table_rows(spec, spec.sink.dead_letters_table)
    assert all(n == 1 for n in Counter((d["partition"], d["offset"]) for d in dead).values())  # none twice
    assert len(dead) == truth.malformed
    offsets = snapshot_offsets(spec)
    lso = kafka_admin.partition_offsets(settings, list(offsets))
    mirror = kafka_admin.committed_offsets(settings, spec.source.group_id, list(offsets))
    assert offsets == {tp: lso[tp].lso for tp in offsets} == mirror


def more_then_run(spark, spec, settings, truth, count, first_seq, run_id, malformed_every=0):
    """``count`` more orders (every third transaction aborted), a run over them, then every record
    of ``truth`` and of them exactly once."""
    more = produce_orders(settings, spec.source.topics[0], count, first_seq=first_seq, abort_every=3,
                          malformed_every=malformed_every, transactional_id=f"more-{spec.name}-{first_seq}")
    run_once(spark, spec, settings, run_id)
    truth.committed += more.committed
    truth.aborted += more.aborted
    truth.malformed += more.malformed
    assert_exactly_once(spec, settings, truth)
    return more


class Died(BaseException):
    """What a SIGKILL at a point leaves: nothing after it ran."""


def stopped_at(spark, spec, settings, run_id, at, monkeypatch):
    """A run of ``spec`` that stops dead at probe point ``at`` (in process: nothing after it runs).
    Returns its plan."""

    class Kill:
        def point(self, name):
            if name == at:
                raise Died(name)

        def armed(self, name):
            return name == at

        def carried(self):
            return {}

    monkeypatch.setattr(probes, "_probe", Kill())
    plan = prepare_plan(spec, settings, run_id)
    with pytest.raises(Died):
        run_batch(spark, spec, plan, settings)
    monkeypatch.setattr(probes, "_probe", None)
    return plan


@pytest.mark.quick
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_runs_commit_one_snapshot_each_with_their_offsets_exactly_once_over_aborted_input(
        spark, kafka_settings, iceberg_spec, tmp_path, monkeypatch, capsys, backend, request):
    """On a SQL catalog in SQLite and in PostgreSQL."""
    spec = iceberg_spec(**({"url": request.getfixturevalue("postgres_url")} if backend == "postgres" else {}))
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 240, abort_every=3, malformed_every=11)
    assert truth.aborted and truth.malformed

    run_once(spark, capped(spec, 30), kafka_settings, "run-1")
    first = catalog(spec).load_table(("lake", spec.sink.table.split(".")[1])).current_snapshot().snapshot_id
    run_once(spark, spec, kafka_settings, "run-2")
    _, again = run_once(spark, spec, kafka_settings, "run-2")  # a retried task: same run id
    assert again.status in ("noop", "empty")
    _, caught_up = run_once(spark, spec, kafka_settings, "run-3")
    assert caught_up.status == "empty"
    table = catalog(spec).load_table(("lake", spec.sink.table.split(".")[1]))
    # One snapshot per committing run (the retry and the caught-up run added none).
    assert [s.snapshot_id for s in table.snapshots()][0] == first and len(table.snapshots()) == 2
    assert table.current_snapshot().summary[f"kafka-eos.{spec.name}.run"] == "run-2"
    assert_exactly_once(spec, kafka_settings, truth)

    # `kafka-eos checkpoint` reads the table's offsets beside the group's and reports a mirror left
    # behind (as a crash between the catalog commit and the mirror leaves it); the next run repairs it.
    offsets = snapshot_offsets(spec)
    behind = next(iter(offsets))
    kafka_admin.alter_group_offsets(kafka_settings, spec.source.group_id, {behind: 0})
    path = tmp_path / "lake.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    capsys.readouterr()
    assert main(["checkpoint", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {(r["topic"], r["partition"]): r["checkpoint"] for r in report["partitions"]} == offsets
    assert report["drift"] == [{"topic": behind[0], "partition": behind[1], "sink": offsets[behind], "kafka": 0}]
    run_once(spark, spec, kafka_settings, "run-4")
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(offsets)) == offsets


@pytest.mark.parametrize("at,then,backend", [("before_iceberg_commit", "same plan", "sqlite"),
                                             ("before_iceberg_commit", "new plan", "postgres"),
                                             ("after_iceberg_commit", "same plan", "postgres")])
def test_a_run_that_dies_before_or_after_the_catalog_commit_is_finished_once(
        spark, kafka_settings, iceberg_spec, at, then, backend, monkeypatch, request):
    """In process, the run stops dead at the point (nothing after it runs); then the same plan again
    (Airflow's retry) or a new plan over more records (the CLI's next run): every record once. Before
    the catalog commit the dead letters are committed already (their own snapshot), the table not. On
    a SQLite catalog and on PostgreSQL's."""
    spec = iceberg_spec(**({"url": request.getfixturevalue("postgres_url")} if backend == "postgres" else {}))
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 150, abort_every=4, malformed_every=9)

    plan = stopped_at(spark, spec, kafka_settings, "run-1", at, monkeypatch)
    if at == "before_iceberg_commit":
        assert table_rows(spec) == [] and len(table_rows(spec, spec.sink.dead_letters_table)) == truth.malformed
    if then == "same plan":
        done = run_batch(spark, spec, plan, kafka_settings)
        if at == "before_iceberg_commit":  # its dead letters written by the attempt that died: counted all the same
            assert (done.records_in, done.records_out, done.dead_letters) == (
                len(truth.committed) + truth.malformed, len(truth.committed), truth.malformed)
    else:  # a new plan over the same range and more records: the earlier attempt's dead letters are its too
        more = produce_orders(kafka_settings, topic, 60, first_seq=150, abort_every=3, malformed_every=7,
                              transactional_id=f"more-{spec.name}-150")
        _plan, done = run_once(spark, spec, kafka_settings, "run-2")
        assert (done.records_in, done.records_out, done.dead_letters) == (
            len(truth.committed) + len(more.committed) + truth.malformed + more.malformed,
            len(truth.committed) + len(more.committed), truth.malformed + more.malformed)
        truth.committed += more.committed
        truth.aborted += more.aborted
        truth.malformed += more.malformed
        assert_exactly_once(spec, kafka_settings, truth)
        return
    more_then_run(spark, spec, kafka_settings, truth, 60, 150, "run-2", malformed_every=7)


@pytest.mark.parametrize("at", ["after_iceberg_commit", pytest.param("before_iceberg_commit", marks=pytest.mark.chaos)])
def test_a_spark_job_sigkilled_at_the_catalog_commit_then_retried_is_exactly_once(
        spark, kafka_settings, iceberg_spec, tmp_path, at):
    """The Spark task as Airflow runs it (spark-submit), SIGKILLed at the point, then its retry."""
    from test_faults import spark_submit, write_spec_file

    spec = iceberg_spec()
    truth = produce_orders(kafka_settings, spec.source.topics[0], 200, abort_every=4, malformed_every=9)
    plan = prepare_plan(spec, kafka_settings, "run-1")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    killed = spark_submit(write_spec_file(spec, tmp_path / "spec.yaml"), plan_file, kafka_settings, at)
    assert killed.returncode != 0, killed.stdout[-2000:]
    committed = snapshot_offsets(spec) if table_rows(spec) else {}
    assert bool(committed) == (at == "after_iceberg_commit")
    # Killed after the catalog commit: the table holds the run, the mirror and the record do not yet.
    mirror = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [r.tp for r in plan.active])
    assert all(mirror[r.tp] is None for r in plan.active)

    again = prepare_plan(spec, kafka_settings, "run-1")
    assert again.ranges == plan.ranges
    retried = run_batch(spark, spec, again, kafka_settings)
    assert retried.status == ("noop" if at == "after_iceberg_commit" else "committed")
    verify(spec, kafka_settings, again)
    assert_exactly_once(spec, kafka_settings, truth)


def test_a_compaction_between_two_runs_keeps_the_offsets_and_a_stale_plan_is_refused(
        spark, kafka_settings, iceberg_spec):
    from pyiceberg.expressions import AlwaysTrue

    spec = iceberg_spec()
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 120, abort_every=5, malformed_every=0)
    stale = prepare_plan(spec, kafka_settings, "stale")
    run_once(spark, spec, kafka_settings, "run-1")

    # A maintenance rewrite of every data file (what compaction commits: an overwrite whose summary
    # has none of kafka-eos's properties).
    table = catalog(spec).load_table(("lake", spec.sink.table.split(".")[1]))
    whole = table.scan().to_arrow()
    table.overwrite(whole, overwrite_filter=AlwaysTrue())
    assert f"kafka-eos.{spec.name}.offsets" not in catalog(spec).load_table(
        ("lake", spec.sink.table.split(".")[1])).current_snapshot().summary.additional_properties

    more_then_run(spark, spec, kafka_settings, truth, 80, 120, "run-2")  # planned from before the rewrite
    # A plan made before run 1 expected the first offsets: refused, nothing written.
    with pytest.raises(CheckpointConflict, match=r"Iceberg table .* is at \d+, the plan of run 'stale' expected"):
        run_batch(spark, spec, stale, kafka_settings)
    assert_exactly_once(spec, kafka_settings, truth)


def compact_and_expire(spec, refresh_between: bool, settings) -> None:
    """A rewrite of every data file (what compaction commits: a snapshot with none of kafka-eos's
    summary properties), then every snapshot before the newest expired."""
    from pyiceberg.expressions import AlwaysTrue

    from kafka_eos.pipeline import refresh_checkpoints
    from kafka_eos.sinks.iceberg_store import identifier

    table = catalog(spec).load_table(identifier(spec.sink.table))
    table.overwrite(table.scan().to_arrow(), overwrite_filter=AlwaysTrue())
    if refresh_between:
        refresh_checkpoints(spec, settings)  # the watchdog's: no checkpoint is due
    table = catalog(spec).load_table(identifier(spec.sink.table))
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != table.current_snapshot().snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()


def test_offsets_outlive_a_compaction_and_the_expiry_of_older_snapshots_once_a_refresh_carried_them(
        spark, kafka_settings, iceberg_spec):
    """A compaction's snapshot holds no kafka-eos offsets: expiring every snapshot before it would
    leave the table without them. The pipeline's refresh (the watchdog's) carries them into a
    snapshot of no files first."""
    spec = iceberg_spec()
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 90, abort_every=4, malformed_every=0)
    run_once(spark, spec, kafka_settings, "run-1")
    compact_and_expire(spec, True, kafka_settings)
    more_then_run(spark, spec, kafka_settings, truth, 40, 90, "run-2")


def test_offsets_expired_from_the_table_stop_the_pipeline_instead_of_starting_it_over(
        spark, kafka_settings, iceberg_spec):
    from kafka_eos.errors import CheckpointLost

    spec = iceberg_spec()
    produce_orders(kafka_settings, spec.source.topics[0], 60, abort_every=4, malformed_every=0)
    run_once(spark, spec, kafka_settings, "run-1")
    compact_and_expire(spec, False, kafka_settings)
    with pytest.raises(CheckpointLost, match=r"its offsets are gone from the table"):
        prepare_plan(spec, kafka_settings, "run-2")


def test_an_output_with_a_column_the_table_lacks_fails_the_run_naming_it_and_commits_nothing(
        spark, kafka_settings, iceberg_spec, transforms_from):
    spec = iceberg_spec()
    produce_orders(kafka_settings, spec.source.topics[0], 30, abort_every=0, malformed_every=0)
    run_once(spark, capped(spec, 3), kafka_settings, "run-1")
    before = snapshot_offsets(spec)
    module = transforms_from("wider_orders", "from pyspark.sql import functions as F\n"
                             "from spark_apps.transforms.orders import as_rows\n\n"
                             "def wider(df):\n"
                             "    results, dead = as_rows(df)\n"
                             "    return results.withColumn('note', F.lit('new')), dead\n")
    wider = dataclasses.replace(spec, transform=f"{module}:wider")
    with pytest.raises(SpecError, match=rf"^Iceberg table {spec.sink.table}: the transform's output does not fit its "
                                        r"schema .*note.*; evolve the table's schema first"):
        run_once(spark, wider, kafka_settings, "run-2")
    assert snapshot_offsets(spec) == before


def test_a_new_table_takes_the_specs_partition_fields_and_each_file_holds_one_partition(
        spark, kafka_settings, iceberg_spec):
    from kafka_eos.sinks.iceberg_store import identifier

    spec = iceberg_spec(partition_by=["days(event_time)", "bucket(4, customer_id)"])
    truth = produce_orders(kafka_settings, spec.source.topics[0], 120, abort_every=4, malformed_every=10)
    run_once(spark, capped(spec, 20), kafka_settings, "run-1")
    run_once(spark, spec, kafka_settings, "run-2")
    assert_exactly_once(spec, kafka_settings, truth)
    table = catalog(spec).load_table(identifier(spec.sink.table))
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("event_time_day", "day"), ("customer_id_bucket_4", "bucket[4]")]
    partitions = {tuple(task.file.partition) for task in table.scan().plan_files()}
    assert len(partitions) > 1 and all(None not in p for p in partitions)
    # A partition filter prunes to the files of that day: every row it gives is of that day.
    day = table.scan().to_arrow().column("event_time")[0].as_py().date()
    rows = table.scan(row_filter=f"event_time >= '{day}T00:00:00+00:00' and event_time < "
                                 f"'{day}T23:59:59.999999+00:00'").to_arrow().to_pylist()
    assert rows and {r["event_time"].date() for r in rows} == {day}


def test_a_replay_writes_a_branch_of_its_own_and_main_changes_only_when_it_is_promoted(
        spark, kafka_settings, iceberg_spec, tmp_path, monkeypatch, capsys):
    """A replay of a committed range commits to a branch of the live table (its dead letters to that
    branch of their table), its offsets under its own name there: ``main`` is unchanged, a retry
    adds nothing. ``kafka-eos backfill promote`` moves it onto ``main``: an append of the branch's
    files where ``main`` moved since the branch was cut, a fast-forward where it did not; once."""
    from kafka_eos.backfill.side import REPLAY, prepare, side_spec
    from kafka_eos.sinks.iceberg_store import identifier

    spec = iceberg_spec()
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 120, abort_every=4, malformed_every=10)
    run_once(spark, spec, kafka_settings, "run-1")
    live = snapshot_offsets(spec)
    name = identifier(spec.sink.table)
    before = catalog(spec).load_table(name).current_snapshot().snapshot_id

    def replay(key, attempt, reprocess=False):
        side, plan, _ = prepare(spec, kafka_settings, f"replay-{attempt}", REPLAY, key, attempt,
                                lambda: ({tp: (0, end) for tp, end in live.items()}, []), reprocess)
        return side, run_batch(spark, side_spec(spec, side), plan, kafka_settings)

    def branch_rows(table_name, branch):
        table = catalog(spec).load_table(identifier(table_name))
        return table.scan(snapshot_id=table.snapshot_by_name(branch).snapshot_id).to_arrow().to_pylist()

    side, summary = replay("all", "r#0")
    assert (summary.status, summary.records_out) == ("committed", len(truth.committed))
    branch = f"kafka-eos.{spec.name}.{side.suffix}"
    table = catalog(spec).load_table(name)
    assert table.current_snapshot().snapshot_id == before  # main: unchanged
    assert_exactly_once(spec, kafka_settings, truth)
    on_branch = Counter(r["order_id"] for r in branch_rows(spec.sink.table, branch))
    assert on_branch == Counter({o["order_id"]: 2 for o in truth.committed})  # main's at the cut + the replay's
    side_offsets = json.loads(table.snapshot_by_name(branch).summary[f"kafka-eos.{spec.name}.{side.suffix}.offsets"])
    assert {(t, int(p)): o for t, parts in side_offsets.items() for p, o in parts.items()} == live
    dead = branch_rows(spec.sink.dead_letters_table, branch)
    assert Counter(d["pipeline"] for d in dead) == {spec.name: truth.malformed,
                                                    f"{spec.name}.{side.suffix}": truth.malformed}
    assert replay("all", "r#0")[1].status in ("empty", "noop")  # a retry: done, nothing added
    assert len(catalog(spec).load_table(name).snapshots()) == 2
    replayed = Counter(o["order_id"] for o in truth.committed)

    # The live pipeline goes on: main moves past the branch's cut.
    more_then_run(spark, spec, kafka_settings, truth, 40, 120, "run-2")

    path = tmp_path / "lake.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)

    def promote(*flags, name=side.suffix, code=0):
        capsys.readouterr()
        assert main(["backfill", "promote", str(path), name, "--json", *flags]) == code
        out, err = capsys.readouterr()
        return {t["table"]: t for t in json.loads(out)["tables"]} if code == 0 else err

    # The replay's range is main's too (the live run wrote it): an append would add it twice.
    first_tp = sorted(live)[0]
    assert f"{first_tp[0]}-{first_tp[1]}: the side run's range [0, {live[first_tp]}) reaches past 0, where the live " \
           "pipeline started on it" in promote("--yes", code=1)
    assert_exactly_once(spec, kafka_settings, truth)
    dry = promote("--overlap")
    assert (dry[spec.sink.table]["action"], dry[spec.sink.table]["rows"]) == ("append", sum(replayed.values()))
    assert_exactly_once(spec, kafka_settings, truth)  # a dry run changed nothing
    done = promote("--yes", "--overlap")  # as if main lacked them (it does not: the rows double)
    # The results table's main moved (run 2), the dead letters' did not (run 2 had none).
    assert [done[t]["action"] for t in (spec.sink.table, spec.sink.dead_letters_table)] == ["append", "fast-forward"]
    assert Counter(d["pipeline"] for d in table_rows(spec, spec.sink.dead_letters_table)) == Counter(
        d["pipeline"] for d in dead)
    rows = Counter(r["order_id"] for r in table_rows(spec))
    assert rows == Counter(o["order_id"] for o in truth.committed) + replayed
    lso = kafka_admin.partition_offsets(kafka_settings, list(live))
    assert snapshot_offsets(spec) == {tp: lso[tp].lso for tp in live}  # main's offsets carried
    assert promote("--yes", "--overlap")[spec.sink.table]["action"] == "promoted before"
    assert Counter(r["order_id"] for r in table_rows(spec)) == rows
    assert run_once(spark, spec, kafka_settings, "run-3")[1].status == "empty"

    # A second generation of the same replay is never promoted too (its rows are the first's again).
    side2, summary2 = replay("all", "r#1", reprocess=True)
    assert (side2.generation, summary2.status) == (2, "committed")
    assert "replay.all.g1 of this side run was promoted already" in promote("--yes", "--overlap", name=side2.suffix,
                                                                            code=1).replace(spec.name + ".", "")
    # Another replay, cut from main as it is now and promoted while main stays there: a fast-forward.
    side3, _ = replay("again", "a#0")
    head = catalog(spec).load_table(name).snapshot_by_name(f"kafka-eos.{spec.name}.{side3.suffix}").snapshot_id
    forwarded = promote("--yes", "--overlap", name=f"kafka-eos.{spec.name}.{side3.suffix}")[spec.sink.table]
    assert (forwarded["action"], forwarded["snapshot"]) == ("fast-forward", head)
    assert Counter(r["order_id"] for r in table_rows(spec)) == rows + replayed
    # The live offsets survived the fast-forward: the next live run reads only what is new.
    last = produce_orders(kafka_settings, topic, 30, first_seq=160, abort_every=3, malformed_every=0,
                          transactional_id=f"last-{spec.name}")
    run_once(spark, spec, kafka_settings, "run-4")
    assert Counter(r["order_id"] for r in table_rows(spec)) == rows + replayed + Counter(
        o["order_id"] for o in last.committed)
    lso = kafka_admin.partition_offsets(kafka_settings, list(live))
    assert snapshot_offsets(spec) == {tp: lso[tp].lso for tp in live}


def test_an_upsert_replaces_the_rows_of_a_runs_keys_in_one_snapshot_and_a_replay_promoted_changes_nothing(
        spark, kafka_settings, iceberg_spec):
    """``merge: upsert`` by ``order_id``: records of orders the table holds replace their rows (the
    files holding them rewritten without them, in the run's one snapshot); a key twice in one run
    fails it, naming the key, with nothing committed; a replay of the last run's range, promoted,
    leaves each key's row as it was."""
    from kafka_eos.backfill.side import REPLAY, prepare, side_spec
    from kafka_eos.errors import SpecError
    from kafka_eos.sinks.iceberg_store import IcebergStore, identifier

    spec = iceberg_spec(merge="upsert", key_columns=["order_id"])
    topic = spec.source.topics[0]
    first = produce_orders(kafka_settings, topic, 150, abort_every=4, malformed_every=10)
    run_once(spark, capped(spec, 20), kafka_settings, "run-1")
    run_once(spark, spec, kafka_settings, "run-2")
    expected = {o["order_id"]: float(o["amount"]) for o in first.committed}
    # The same orders again, other amounts (a later state of each): some committed, some aborted.
    second = produce_orders(kafka_settings, topic, 60, per_transaction=20, abort_every=3, malformed_every=7,
                            seed=99, transactional_id=f"second-{spec.name}")
    assert second.committed and second.aborted
    at_second = snapshot_offsets(spec)
    run_once(spark, spec, kafka_settings, "run-3")
    expected.update({o["order_id"]: float(o["amount"]) for o in second.committed})

    def rows():
        got = table_rows(spec)
        assert len(got) == len({r["order_id"] for r in got})  # one row per key
        return {r["order_id"]: round(float(r["amount"]), 2) for r in got}

    assert rows() == expected
    table = catalog(spec).load_table(identifier(spec.sink.table))
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert int(table.current_snapshot().summary["deleted-data-files"]) >= 1
    assert len(table.snapshots()) == 3  # one per run
    lso = kafka_admin.partition_offsets(kafka_settings, list(snapshot_offsets(spec)))
    assert snapshot_offsets(spec) == {tp: v.lso for tp, v in lso.items()}

    # A key twice in one run: refused naming it, nothing committed.
    before = table.current_snapshot().snapshot_id
    produce_orders(kafka_settings, topic, 5, abort_every=0, malformed_every=0, seed=5,
                   transactional_id=f"third-{spec.name}")
    produce_orders(kafka_settings, topic, 5, abort_every=0, malformed_every=0, seed=6,
                   transactional_id=f"fourth-{spec.name}")
    with pytest.raises(SpecError, match=r"hold the key \{\"order_id\": \"[^\"]+\"\} more than once"):
        run_once(spark, spec, kafka_settings, "run-4")
    assert catalog(spec).load_table(identifier(spec.sink.table)).current_snapshot().snapshot_id == before
    assert rows() == expected

    # A replay of run 3's range (the later state of its keys) into a branch, promoted (main did not
    # move: a fast-forward): each key's row as it was.
    store = IcebergStore(spec, spec.sink.url)
    ranges = {tp: (at_second[tp], end) for tp, end in snapshot_offsets(spec).items()}
    side, plan, _ = prepare(spec, kafka_settings, "replay-1", REPLAY, "all", "r#0", lambda: (ranges, []))
    assert run_batch(spark, side_spec(spec, side), plan, kafka_settings).status == "committed"
    assert rows() == expected
    promoted = store.promote(f"kafka-eos.{spec.name}.{side.suffix}", f"{spec.name}.replay.all", apply=True,
                             ranges=ranges)
    assert promoted[0]["action"] == "fast-forward"
    assert rows() == expected


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory):
    """Iceberg's own REST catalog server on 127.0.0.1 (a JdbcCatalog behind the REST protocol) that
    asks every request for a bearer token: (its URI, the token)."""
    import secrets

    from kafka_eos_lab.iceberg_rest import RestCatalogServer

    server = RestCatalogServer(tmp_path_factory.mktemp("rest-catalog"), token=secrets.token_hex(16))
    uri = server.start()
    yield uri, server.token
    server.stop()


def test_a_rest_catalog_from_an_airflow_connection_commits_each_run_once(
        spark, kafka_settings, make_spec, unique, rest_catalog, monkeypatch):
    """The catalog is a REST catalog (Iceberg's own server, as Polaris or Nessie serve the protocol),
    named by an Airflow connection of the Iceberg provider's type whose extra holds the bearer
    token: runs over aborted input, a retry, a run stopped after the catalog commit and retried —
    every committed record once, read back through the REST protocol by PyIceberg directly; the
    server's compare-and-set refuses nothing twice. A wrong token fails in one line naming the
    catalog, never the token."""
    from pyiceberg.catalog.rest import RestCatalog

    from kafka_eos.sinks.iceberg_store import identifier

    uri, token = rest_catalog
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_REST", json.dumps({"conn_type": "iceberg", "host": uri,
                                                             "extra": {"token": token}}))
    table = f"lake.orders_{unique.replace('-', '_')}"
    spec = make_spec("spark_apps.transforms.orders:as_rows", "iceberg", "atomic", table=table, conn_id="lake_rest",
                     url=None)
    truth = produce_orders(kafka_settings, spec.source.topics[0], 160, abort_every=4, malformed_every=9)
    run_once(spark, capped(spec, 25), kafka_settings, "run-1")

    plan = stopped_at(spark, spec, kafka_settings, "run-2", "after_iceberg_commit", monkeypatch)
    assert run_batch(spark, spec, plan, kafka_settings).status == "noop"
    verify(spec, kafka_settings, plan)
    assert run_once(spark, spec, kafka_settings, "run-3")[1].status == "empty"

    rest = RestCatalog("check", uri=uri, token=token)
    loaded = rest.load_table(identifier(table))
    rows = loaded.scan().to_arrow().to_pylist()
    assert Counter(r["order_id"] for r in rows) == Counter(o["order_id"] for o in truth.committed)
    assert not {r["order_id"] for r in rows} & set(truth.aborted)
    assert len(rest.load_table(identifier(f"{table}_dead_letters")).scan().to_arrow()) == truth.malformed
    raw = json.loads(loaded.current_snapshot().summary[f"kafka-eos.{spec.name}.offsets"])
    offsets = {(t, int(p)): o for t, parts in raw.items() for p, o in parts.items()}
    lso = kafka_admin.partition_offsets(kafka_settings, list(offsets))
    assert offsets == {tp: v.lso for tp, v in lso.items()} == kafka_admin.committed_offsets(
        kafka_settings, spec.source.group_id, list(offsets))
    assert len(loaded.snapshots()) == 2

    wrong = "0" * 32
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_REST", json.dumps({"conn_type": "iceberg", "host": uri,
                                                             "extra": {"token": wrong}}))
    with pytest.raises(SpecError, match=rf"Iceberg REST catalog {uri}: \w+: ") as refused:
        prepare_plan(spec, kafka_settings, "run-4")
    assert wrong not in str(refused.value) and "\n" not in str(refused.value)


def test_a_backfill_of_history_from_before_the_live_start_is_promoted_once_and_exactly(
        spark, kafka_settings, iceberg_spec):
    """A pipeline that starts at the latest offsets: its first run reads nothing and commits where it
    starts (a snapshot of no files: the table is made from the transform's output of no records).
    A backfill of the history before that start, cut while main is there; the live pipeline goes on,
    so main moves; the history lies below the live start, so the promote appends the branch's files
    with no --overlap, and main then holds every committed record exactly once. Another side run
    over the same history is refused: it meets the range promoted before."""
    from kafka_eos.backfill.promote import parse_side, promote
    from kafka_eos.backfill.side import BACKFILL, prepare, side_spec
    from kafka_eos.errors import PlanError

    spec = iceberg_spec()
    spec = dataclasses.replace(spec, source=dataclasses.replace(spec.source, starting_offsets="latest"))
    topic = spec.source.topics[0]
    truth = produce_orders(kafka_settings, topic, 90, abort_every=3, malformed_every=8)
    ends = kafka_admin.partition_offsets(kafka_settings, [(topic, p) for p in range(3)])
    first = run_once(spark, spec, kafka_settings, "live-1")[1]  # starts at the end: reads nothing
    assert (first.status, first.records_in, first.records_out) == ("committed", 0, 0)
    assert table_rows(spec) == [] and snapshot_offsets(spec) == {tp: o.lso for tp, o in ends.items()}

    def backfill(key):
        side, plan, _ = prepare(spec, kafka_settings, f"bf-{key}", BACKFILL, key, f"{key}#0",
                                lambda: ({tp: (0, o.lso) for tp, o in ends.items()}, []))
        assert run_batch(spark, side_spec(spec, side), plan, kafka_settings).status == "committed"
        return parse_side(side.suffix, spec.name)

    side = backfill("history")
    assert table_rows(spec) == []  # main: untouched
    live = produce_orders(kafka_settings, topic, 30, first_seq=90, abort_every=3, malformed_every=0,
                          transactional_id=f"live-{spec.name}")
    run_once(spark, spec, kafka_settings, "live-2")
    done = promote(spec, kafka_settings, side, apply=True)
    assert done["tables"][0]["action"] == "append"  # main moved since the cut
    truth.committed += live.committed
    truth.aborted += live.aborted
    assert_exactly_once(spec, kafka_settings, truth)

    # Again: done already (not a meeting with its own range).
    assert {t["action"] for t in promote(spec, kafka_settings, side, apply=True)["tables"]} == {"promoted before"}
    again = backfill("history-again")
    with pytest.raises(PlanError, match=r"meets \[0, \d+\), promoted before"):
        promote(spec, kafka_settings, again, apply=True)
    assert_exactly_once(spec, kafka_settings, truth)

    # A reset below where the live pipeline started moves the recorded start down with it: a later
    # side run's range there is what the live pipeline writes again.
    from kafka_eos.backfill.reset import reset_checkpoint
    from kafka_eos.sinks.iceberg_store import MARKER_KEY, identifier

    tp = (topic, 0)
    reset_checkpoint(spec, kafka_settings, {tp: 1}, run_id="reset-1", asked="1", who="test", via="test")
    marker = catalog(spec).load_table(identifier(spec.sink.table)).properties[MARKER_KEY.format(pipeline=spec.name)]
    assert json.loads(marker)["from"][topic]["0"] == 1 and json.loads(marker)["from"][topic]["1"] == ends[(topic, 1)].lso


def test_each_record_is_a_row_or_a_dead_letter_even_where_the_transforms_rule_changes_its_mind(
        spark, kafka_settings, make_spec, transforms_from, unique, tmp_path):
    """The dead letters' snapshot and the results' were two Spark jobs, each computing the
    transform: a record whose dead-letter rule answered otherwise the second time was in both
    tables, or in neither (lost). Now the transform's output is computed once for both."""
    from test_sql_sink import COIN, assert_each_record_in_one_place, produce_coin_source

    spec = make_spec(transforms_from(f"coin_{unique.replace('-', '_')}", COIN) + ":coin", "iceberg", "atomic",
                     partitions=2, table=f"lake.coin_{unique.replace('-', '_')}",
                     url=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "warehouse").as_uri())
    produce_coin_source(kafka_settings, spec.source.topics[0])
    summary = run_batch(spark, spec, prepare_plan(spec, kafka_settings, "run-1"), kafka_settings)
    rows = {(r["partition"], r["offset"]) for r in table_rows(spec)}
    dead = {(d["partition"], d["offset"]) for d in table_rows(spec, spec.sink.dead_letters_table)}
    assert_each_record_in_one_place(rows, dead, (summary.records_in, summary.records_out, summary.dead_letters))
