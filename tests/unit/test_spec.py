"""Pipeline specs: every malformed field is a one-line error naming the file and the field."""

from __future__ import annotations

import pytest
import yaml

from kafka_eos.errors import SpecError
from kafka_eos.spec import load_spec, parse_spec

GOOD = {
    "name": "p1",
    "source": {"topics": ["orders"]},
    "transform": "identity",
    "sink": {"kind": "kafka", "topic": "out", "dlq_topic": "dlq"},
}


def _with(path: str, value) -> dict:
    import copy

    doc = copy.deepcopy(GOOD)
    node = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return doc


def test_defaults_follow_the_design():
    spec = parse_spec(GOOD, "p1.yaml")
    assert spec.source.group_id == "kafka-eos.p1"
    assert spec.source.starting_offsets == "earliest"
    assert spec.source.on_data_loss == "fail"
    assert spec.sink.commit == "atomic"
    assert spec.source.freshness_limit_s is None  # no freshness alert unless the spec asks
    assert spec.transactional_id() == "kafka-eos.p1"
    assert spec.transactional_id("orders", 3) == "kafka-eos.p1|orders|3"


@pytest.mark.parametrize("path,value,needle", [
    ("source.colour", "red", "source.colour: unknown field"),
    ("sinks", {}, "sinks: unknown field"),
    ("source.topics", [], "source.topics: a non-empty list"),
    ("source.topics", ["bad topic!"], "source.topics[0]: 'bad topic!' is not a valid topic name"),
    ("sink.topic", KeyError, "sink.topic: required for a kafka sink"),
    ("sink.dlq_topic", "bad topic!", "sink.dlq_topic: 'bad topic!' is not a valid topic name"),
    ("sink.kind", "s3", "sink.kind: 's3' is not one of kafka, sql"),
    ("sink.commit", "sometimes", "sink.commit: 'sometimes' is not one of atomic, per_partition"),
    ("source.max_records_per_partition", 0, "source.max_records_per_partition: must be a positive integer"),
    ("source.on_data_loss", "ignore", "source.on_data_loss: 'ignore' is not one of fail, skip"),
    ("source.freshness_limit_s", "30m", "source.freshness_limit_s: must be a positive integer, got '30m'"),
    ("sink.backfill_topic", "out", "sink.backfill_topic: 'out' must differ from the live output, dead-letter and "
                                   "source topics"),
    ("sink.backfill_topic", "orders", "sink.backfill_topic: 'orders' must differ from the live output"),
    ("sink.topic", "orders", "sink.topic: 'orders' is also a source topic: a pipeline must not read what it writes"),
    ("sink.dlq_topic", "out", "sink.dlq_topic: 'out' must differ from the output and source topics"),
    ("sink.dlq_topic", "orders", "sink.dlq_topic: 'orders' must differ from the output and source topics"),
    ("manifest_topic", "orders", "manifest_topic: 'orders' is also a data topic of the pipeline"),
    ("manifest_topic", "dlq", "manifest_topic: 'dlq' is also a data topic of the pipeline"),
    ("source.group_id", "team|x", "source.group_id: 'team|x' must not contain '|'"),
    ("name", "has space", "name: 'has space' must be"),
])
def test_malformed_field_names_file_and_field(path, value, needle):
    with pytest.raises(SpecError) as err:
        parse_spec(_with(path, value), "/x/p1.yaml")
    message = str(err.value)
    assert message.startswith("/x/p1.yaml: ")
    assert needle in message
    assert "\n" not in message


def test_kafka_sink_needs_no_dead_letter_topic():
    spec = parse_spec(_with("sink.dlq_topic", KeyError), "p1.yaml")
    assert spec.sink.dlq_topic is None


def test_sql_sink_needs_a_table_and_atomic_scope():
    doc = {**GOOD, "sink": {"kind": "sql"}}
    with pytest.raises(SpecError, match=r"sink.table: required"):
        parse_spec(doc, "s.yaml")
    doc = {**GOOD, "sink": {"kind": "sql", "table": "t", "commit": "per_partition", "url": "local"}}
    with pytest.raises(SpecError, match=r"sink.commit: a sql sink commits on the driver"):
        parse_spec(doc, "s.yaml")


def test_sql_sink_takes_no_topics():
    doc = {**GOOD, "sink": {"kind": "sql", "table": "t", "dlq_topic": "d"}}
    with pytest.raises(SpecError, match=r"sink.dlq_topic: not for a sql sink"):
        parse_spec(doc, "s.yaml")


def test_sql_url_expands_environment_variables():
    doc = {**GOOD, "sink": {"kind": "sql", "table": "t", "url": "${DB_URL}"}}
    assert parse_spec(doc, "s.yaml", {"DB_URL": "postgresql://h/db"}).sink.url == "postgresql://h/db"
    # Unset: an error naming the variable, never a silent local SQLite file.
    with pytest.raises(SpecError, match=r"^s.yaml: sink.url: environment variable DB_URL is not set"):
        parse_spec(doc, "s.yaml", {})
    fallback = {**GOOD, "sink": {"kind": "sql", "table": "t", "url": "${DB_URL:-local}"}}
    assert parse_spec(fallback, "s.yaml", {}).sink.url == "local"  # said so: the development SQLite file
    # Parsing a DAG file resolves nothing: the template stays as written.
    assert parse_spec(doc, "s.yaml").sink.url == "${DB_URL}"


def test_a_sql_sink_names_its_database_there_is_no_default():
    from kafka_eos.sinks.sql_store import database_url, local_url

    bare = {**GOOD, "sink": {"kind": "sql", "table": "t"}}
    with pytest.raises(SpecError, match=r"^s.yaml: sink: a sql sink needs its database: sink.conn_id \(an Airflow "
                                        r"connection\) or sink.url \(a SQLAlchemy URL; 'local'"):
        parse_spec(bare, "s.yaml", {})
    with pytest.raises(SpecError, match=r"^s.yaml: sink: .* or sink.url \(a SQLAlchemy URL, which expanded to nothing"):
        parse_spec({**GOOD, "sink": {"kind": "sql", "table": "t", "url": "${DB_URL:-}"}}, "s.yaml", {})
    with pytest.raises(SpecError, match=r"^s.yaml: sink.conn_id: not for a kafka sink"):
        parse_spec({**GOOD, "sink": {**GOOD["sink"], "conn_id": "warehouse"}}, "s.yaml", {})
    named = parse_spec({**GOOD, "sink": {"kind": "sql", "table": "t", "conn_id": "warehouse"}}, "s.yaml", {})
    assert (named.sink.conn_id, named.sink.url) == ("warehouse", None)
    local = parse_spec({**GOOD, "sink": {"kind": "sql", "table": "t", "url": "local"}}, "s.yaml", {})
    assert database_url(local) == local_url(local) and local_url(local).endswith(f"/sql/{local.name}.db")


def test_unknown_transform_is_a_spec_error(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "transform": "no_such_module_xyz:f"}))
    with pytest.raises(SpecError, match=r"p.yaml: transform: cannot import module 'no_such_module_xyz'"):
        load_spec(str(path))
    path.write_text(yaml.safe_dump({**GOOD, "transform": "json:no_such_function"}))
    with pytest.raises(SpecError, match=r"transform: module 'json' has no function 'no_such_function'"):
        load_spec(str(path))
    path.write_text(yaml.safe_dump({**GOOD, "transform": "nocolon"}))
    with pytest.raises(SpecError, match=r"transform: 'nocolon' is not 'module:function'"):
        load_spec(str(path))


def test_malformed_yaml_and_missing_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML \(line 2, column 1: "):
        load_spec(str(path))
    # A key given twice: YAML would keep the second silently (a second sink: drops the first).
    path.write_text(yaml.safe_dump(GOOD) + "name: another\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML \(line \d+, column 1: key 'name' appears "
                                        r"twice in one mapping \(lines 1 and \d+\)\)$"):
        load_spec(str(path))
    # YAML's merge key is no duplicate: its keys are overridden by the mapping's own.
    path.write_text("name: merged\nsource:\n  topics: [orders]\nsink:\n  <<: {kind: kafka, topic: t}\n  topic: u\n")
    assert load_spec(str(path)).sink.topic == "u"
    path.write_text("name: a\nsink:\n  kind: kafka\n  topic: t\n  topic: u\n")
    with pytest.raises(SpecError, match=r"line 5, column 3: key 'topic' appears twice in one mapping \(lines 4 and 5\)"):
        load_spec(str(path))
    with pytest.raises(SpecError, match=r"no such pipeline spec"):
        load_spec("no_such_pipeline_name")
    with pytest.raises(SpecError, match=rf"^{tmp_path}: a folder, not a pipeline spec"):
        load_spec(str(tmp_path))


def test_bundled_specs_load():
    assert load_spec("orders_enriched").sink.commit == "per_partition"
    revenue = load_spec("revenue_per_minute", environ={})
    assert revenue.sink.kind == "sql" and revenue.sink.merge == "add"
    assert revenue.sink.key_columns == ("minute", "category")


def test_spec_document_round_trips():
    from kafka_eos.spec import spec_document

    for doc in (GOOD, _with("source.freshness_limit_s", 600), _with("sink.backfill_topic", "bf"), {**GOOD, "sink": {"kind": "sql", "table": "t", "key_columns": ["a"], "merge": "add",
                                        "url": "sqlite:///x.db"}, "schedule": "@hourly"}):
        spec = parse_spec(doc, "p.yaml")
        assert parse_spec(spec_document(spec), "p.yaml") == spec


def test_a_group_belongs_to_one_pipeline(tmp_path):
    from kafka_eos.spec import check_owners, load_spec

    a = parse_spec({**GOOD, "name": "a", "source": {"topics": ["in"], "group_id": "shared"}}, "a.yaml")
    b = parse_spec({**GOOD, "name": "b", "source": {"topics": ["in"], "group_id": "shared"}}, "b.yaml")
    with pytest.raises(SpecError, match=r"^b.yaml: source.group_id: 'shared' is also the group of pipeline 'a'"):
        check_owners(b, [a])
    check_owners(a, [a])  # the same pipeline in another file is not another owner

    # A spec anywhere may not take a bundled pipeline's group.
    taker = tmp_path / "taker.yaml"
    taker.write_text(yaml.safe_dump({**GOOD, "name": "taker", "transform": "identity",
                                     "source": {"topics": ["orders"], "group_id": "kafka-eos.orders_enriched"}}))
    with pytest.raises(SpecError, match=r"is also the group of pipeline 'orders_enriched'"):
        load_spec(str(taker))


def test_a_manifest_topic_belongs_to_one_pipeline():
    from kafka_eos.spec import check_owners

    a = parse_spec({**GOOD, "name": "a"}, "a.yaml")
    b = parse_spec({**GOOD, "name": "b", "source": {"topics": ["in"], "group_id": "b"}}, "b.yaml")
    assert (a.manifest_topic, b.manifest_topic) == ("kafka-eos.manifest.a", "kafka-eos.manifest.b")
    check_owners(b, [a])
    shared = parse_spec({**GOOD, "name": "b", "source": {"topics": ["in"], "group_id": "b"},
                         "manifest_topic": "kafka-eos.manifest.a"}, "b.yaml")
    with pytest.raises(SpecError, match=r"^b.yaml: manifest_topic: 'kafka-eos.manifest.a' is also the manifest "
                                        r"of pipeline 'a' \(a.yaml\); each pipeline needs a manifest topic"):
        check_owners(shared, [a])


def test_transaction_timeout_is_a_kafka_sink_setting():
    assert parse_spec(GOOD, "p.yaml").sink.transaction_timeout_s == 300
    doc = {**GOOD, "sink": {**GOOD["sink"], "transaction_timeout_s": 600}}
    assert parse_spec(doc, "p.yaml").sink.transaction_timeout_s == 600
    with pytest.raises(SpecError, match=r"sink.transaction_timeout_s: must be a positive integer"):
        parse_spec({**GOOD, "sink": {**GOOD["sink"], "transaction_timeout_s": 0}}, "p.yaml")
    with pytest.raises(SpecError, match=r"sink.transaction_timeout_s: not for a sql sink"):
        parse_spec({**GOOD, "sink": {"kind": "sql", "table": "t", "transaction_timeout_s": 60}}, "p.yaml")


SQL = {"name": "p2", "source": {"topics": ["orders"]}, "transform": "identity",
       "sink": {"kind": "sql", "table": "t", "key_columns": ["a"], "merge": "add", "url": "local"}}


@pytest.mark.parametrize("sink, message", [
    ({"backfill_dlq_topic": "bfd"}, "sink.backfill_dlq_topic: needs sink.backfill_topic"),
    ({"backfill_topic": "bf", "backfill_dlq_topic": "dlq"},
     "sink.backfill_dlq_topic: 'dlq' must differ from the live output, dead-letter and source topics"),
    ({"backfill_topic": "bf", "backfill_dlq_topic": "orders"}, "sink.backfill_dlq_topic: 'orders' must differ"),
    ({"backfill_table": "t_bf"}, "sink.backfill_table: not for a kafka sink (use sink.backfill_topic)"),
])
def test_side_run_places_of_a_kafka_sink_are_checked(sink, message):
    with pytest.raises(SpecError, match="^spec.yaml: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec({**GOOD, "sink": {**GOOD["sink"], **sink}}, "spec.yaml")


@pytest.mark.parametrize("sink, message", [
    ({"backfill_table": "t"}, "sink.backfill_table: 't' must differ from the live table"),
    ({"backfill_table": "kafka_eos_offsets"}, "sink.backfill_table: 'kafka_eos_offsets' must differ"),
    ({"backfill_table": "bad name;"}, "sink.backfill_table: 'bad name;' is not a valid table name"),
    ({"backfill_topic": "bf"}, "sink.backfill_topic: not for a sql sink (use sink.backfill_table"),
])
def test_the_backfill_table_of_a_sql_sink_is_checked(sink, message):
    with pytest.raises(SpecError, match="^spec.yaml: " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec({**SQL, "sink": {**SQL["sink"], **sink}}, "spec.yaml")


def test_side_run_places_parse():
    kafka = parse_spec({**GOOD, "sink": {**GOOD["sink"], "backfill_topic": "bf", "backfill_dlq_topic": "bfd"}})
    assert (kafka.sink.backfill_topic, kafka.sink.backfill_dlq_topic) == ("bf", "bfd")
    sql = parse_spec({**SQL, "sink": {**SQL["sink"], "backfill_table": "t_backfill"}})
    assert sql.sink.backfill_table == "t_backfill" and sql.sink.dead_letters_table == "kafka_eos_dead_letters"


def test_a_side_run_of_a_sql_sink_keeps_the_live_database_and_keys_its_rows_by_range():
    from kafka_eos.backfill.side import Side, promote_sql, side_spec
    from kafka_eos.sinks.sql_store import local_url

    spec = parse_spec({**SQL, "sink": {**SQL["sink"], "backfill_table": "t_bf"}})
    side = side_spec(spec, Side("replay", "abc", 2))
    assert (side.sink.table, side.sink.url, side.sink.dead_letters_table) == ("t_bf", local_url(spec), "t_bf_dead_letters")
    assert side.sink.key_columns == ("a", "kafka_eos_range", "kafka_eos_generation")
    assert side.sink.columns == (("kafka_eos_range", "abc"), ("kafka_eos_generation", 2))
    assert promote_sql(spec, "abc", 2, ["a", "b"]) == (
        'INSERT INTO "t" ("a", "b") SELECT "a", "b" FROM "t_bf" WHERE "kafka_eos_range" = \'abc\' AND '
        '"kafka_eos_generation" = 2 ON CONFLICT ("a") DO UPDATE SET "b" = excluded."b";')
    from kafka_eos.backfill.places import promote_caveat

    assert promote_caveat(spec).startswith("merge: add: each key's live row is set to this range's total")
    replaced = parse_spec({**SQL, "sink": {**SQL["sink"], "backfill_table": "t_bf", "merge": "replace"}})
    assert promote_caveat(replaced) == ""  # the backfill's rows are the rows


def test_an_additive_sql_sink_needs_its_key_columns():
    doc = {"name": "s", "source": {"topics": ["orders"]}, "sink": {"kind": "sql", "table": "t", "merge": "add",
                                                                   "url": "local"}}
    with pytest.raises(SpecError, match=r"^s.yaml: sink.merge: 'add' needs sink.key_columns"):
        parse_spec(doc, "s.yaml")
    doc["sink"]["key_columns"] = ["k"]
    assert parse_spec(doc, "s.yaml").sink.merge == "add"


def test_a_manifest_topic_equal_to_a_backfill_topic_is_refused():
    doc = _with("sink.backfill_topic", "side")
    doc["manifest_topic"] = "side"
    with pytest.raises(SpecError, match=r"manifest_topic: 'side' is also a data topic"):
        parse_spec(doc, "p1.yaml")


def test_formats_are_checked_and_round_trip(tmp_path):
    from kafka_eos.spec import spec_document

    schema = tmp_path / "out.avsc"
    schema.write_text('{"type": "string"}')
    doc = {**GOOD, "source": {"topics": ["orders"], "format": "avro", "key_format": "string", "subject": "s-value",
                              "reader_version": 2},
           "sink": {**GOOD["sink"], "format": "avro", "schema": "out.avsc", "subject_strategy": "record_name",
                    "auto_register": False}}
    spec = parse_spec(doc, str(tmp_path / "p.yaml"))
    assert (spec.source.format, spec.source.key_format, spec.source.subject, spec.source.reader_version) == (
        "avro", "string", "s-value", 2)
    assert (spec.sink.schema, spec.sink.subject_strategy, spec.sink.auto_register) == (
        str(schema), "record_name", False)
    assert parse_spec(spec_document(spec), str(tmp_path / "p.yaml")) == spec
    assert parse_spec(_with("source.reader_version", "latest"), "p.yaml").source.reader_version is None
    for path, value, message in [
        ("source.format", "xml", r"p\.yaml: source\.format: 'xml' is not one of json, raw, string, avro"),
        ("sink.schema", str(schema), r"p\.yaml: sink\.schema: a schema file needs sink\.format avro"),
        ("sink.auto_register", "yes", r"p\.yaml: sink\.auto_register: must be true or false"),
    ]:
        with pytest.raises(SpecError, match=message):
            parse_spec(_with(path, value), "p.yaml")
    with pytest.raises(SpecError, match=r"sink\.schema: no such schema file .*nope\.avsc"):
        parse_spec(_with("sink", {**GOOD["sink"], "format": "avro", "schema": "nope.avsc"}), str(tmp_path / "p.yaml"))
    with pytest.raises(SpecError, match=r"sink\.format: not for a sql sink"):
        parse_spec({**GOOD, "sink": {"kind": "sql", "table": "t", "format": "avro"}}, "p.yaml")


def test_an_iceberg_sink_names_its_table_catalog_and_warehouse_and_commits_atomically():
    from kafka_eos.backfill.places import check_side_runs
    from kafka_eos.spec import spec_document

    spec = parse_spec({**GOOD, "sink": {"kind": "iceberg", "table": "lake.orders", "url": "local"}}, "s.yaml")
    assert (spec.sink.merge, spec.sink.catalog, spec.sink.warehouse) == ("append", "kafka_eos", None)
    assert spec.sink.dead_letters_table == "lake.orders_dead_letters"
    assert parse_spec(spec_document(spec), "s.yaml") == spec
    for sink, needle in (
            ({"table": "lake.orders"}, r"sink: an iceberg sink needs its catalog's database"),
            ({"table": "lake.orders", "url": "postgresql://h/cat"}, r"sink.warehouse: required"),
            ({"table": "lake..orders", "url": "local"}, r"sink.table: required for an iceberg sink"),
            ({"table": "o", "url": "local", "commit": "per_partition"}, r"sink.commit: an iceberg sink commits one"),
            ({"table": "o", "url": "local", "merge": "upsert"}, r"sink.merge: 'upsert' needs sink.key_columns"),
            ({"table": "o", "url": "local", "key_columns": ["id"]}, r"sink.key_columns: only with merge: upsert"),
            ({"table": "o", "url": "local", "merge": "replace"}, r"sink.merge: 'replace' is not one of append, upsert"),
            ({"table": "o", "url": "local", "topic": "t"}, r"sink.topic: not for an iceberg sink")):
        with pytest.raises(SpecError, match=rf"^s.yaml: {needle}"):
            parse_spec({**GOOD, "sink": {"kind": "iceberg", **sink}}, "s.yaml")
    # Side runs commit to a branch of the live table of their own (and of its dead letters' table).
    check_side_runs(spec, "backfill")
    from kafka_eos.backfill.promote import parse_side
    from kafka_eos.backfill.side import Side, side_spec
    from kafka_eos.errors import PlanError

    side = parse_side(f"kafka-eos.{spec.name}.backfill.20260301T120000Z-20260301T120500Z.g2", spec.name)
    assert side == Side("backfill", "20260301T120000Z-20260301T120500Z", 2) == parse_side(side.suffix, spec.name)
    sspec = side_spec(spec, side)
    assert (sspec.sink.table, sspec.sink.dead_letters_table, sspec.sink.branch) == (
        spec.sink.table, spec.sink.dead_letters_table, f"kafka-eos.{spec.name}.{side.suffix}")
    assert spec.sink.branch == "main" and parse_spec(spec_document(sspec), "s.yaml").sink.branch == "main"
    for bad in ("backfill.k", "live.k.g1", "replay.k.g0", "replay.a.b.g1"):
        with pytest.raises(PlanError, match=rf"side run {bad!r}: not a side run's name"):
            parse_side(bad, spec.name)
    parted = parse_spec({**GOOD, "sink": {"kind": "iceberg", "table": "t", "url": "local",
                                          "partition_by": ["days(ts)", "bucket(16, id)", "region"]}}, "s.yaml")
    assert parse_spec(spec_document(parted), "s.yaml").sink.partition_by == ("days(ts)", "bucket(16, id)", "region")
    keyed = parse_spec({**GOOD, "sink": {"kind": "iceberg", "table": "t", "url": "local", "merge": "upsert",
                                         "key_columns": ["id", "day"]}}, "s.yaml")
    assert parse_spec(spec_document(keyed), "s.yaml") == keyed and keyed.sink.key_columns == ("id", "day")
    for bad in (["weeks(ts)"], "days(ts)", ["bucket(id)"]):
        with pytest.raises(SpecError, match=r"^s.yaml: sink.partition_by: must be a list of partition fields"):
            parse_spec({**GOOD, "sink": {"kind": "iceberg", "table": "t", "url": "local", "partition_by": bad}},
                       "s.yaml")
    with pytest.raises(SpecError, match=r"^s.yaml: sink.partition_by: only for an iceberg sink"):
        parse_spec({**GOOD, "sink": {**GOOD["sink"], "partition_by": ["x"]}}, "s.yaml")
