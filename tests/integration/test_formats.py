"""Avro, Protobuf and JSON Schema through a real Schema Registry (Apicurio Registry, started here),
exactly once: records of two schema versions in one range decode to the reader schema; records
that do not decode are dead letters with their reasons, in the same transaction; an output schema
the subject refuses is refused before anything is written; the registry down fails the run before
it writes. Records are produced and read back with confluent-kafka's own serializers."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import RegistryError, SchemaRefused
from kafka_eos.local.registry import LocalRegistry
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import ORDER_AVRO_V1, ORDER_AVRO_V2, produce_avro_orders
from kafka_eos.settings import RegistrySettings

pytestmark = [pytest.mark.integration]

TRANSFORM = "spark_apps.transforms.orders_avro:enrich"


@pytest.fixture(scope="module")
def registry(tmp_path_factory, free_ports):
    server = LocalRegistry(home=tmp_path_factory.mktemp("registry"), port=free_ports(1))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(kafka_settings, registry):
    return dataclasses.replace(kafka_settings, schema_registry=RegistrySettings(registry.url))


@pytest.fixture
def client(registry):
    return SchemaRegistryClient({"url": registry.url})


def _avro_spec(make_spec, commit="atomic", kind="kafka", partitions=3, **sink):
    source = {"format": "avro", "key_format": "string"}
    if kind == "kafka":
        sink = {"format": "avro", **sink}
    return make_spec(TRANSFORM, kind, commit, partitions, source=source, **sink)


def _raw(settings, topic, values, partition=0):
    """Records written as they are (a producer that is not the Confluent serializer)."""
    producer = Producer(settings.client_config())
    for value in values:
        producer.produce(topic, key=b"c-1", value=value, partition=partition)
    producer.flush(30)


def _bad_records(settings, topic, known_id):
    """One record of each kind that does not decode, in partition 0: a wrong magic byte, an id the
    registry does not know, a payload of a known id that is not Avro, and one shorter than the header."""
    _raw(settings, topic, [b"\x01" + b"\x00\x00\x00\x01" + b"junk", b"\x00" + (987654).to_bytes(4, "big") + b"\x02",
                           b"\x00" + known_id.to_bytes(4, "big") + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                           b"\x00\x01"])


def _reasons(settings, dlq):
    return sorted(dict(m.headers).get("kafka-eos.reason", b"").decode() for m in read_committed(settings, dlq))


@pytest.mark.parametrize("commit", ["atomic", "per_partition", "per_partition-two-passes"])
def test_two_schema_versions_in_one_range_decode_to_the_reader_schema_exactly_once(
        spark, settings, client, make_spec, commit, request):
    """per_partition in two passes (a Connect server without kafka-eos's plugin, say): before, the
    undecodable records' dead letters were dropped while the checkpoint moved past them."""
    if commit.endswith("two-passes"):
        request.getfixturevalue("two_passes")
    spec = _avro_spec(make_spec, commit.split("-")[0])
    src = spec.source.topics[0]
    produced = produce_avro_orders(settings, src, 120, evolve_at=60)
    v1_id = client.get_version(f"{src}-value", 1).schema_id
    _bad_records(settings, src, v1_id)

    plan = prepare_plan(spec, settings, "run-1")
    summary = run_batch(spark, spec, plan, settings)
    good = [r for r in produced if r["currency"] != "XXX"]
    assert (summary.records_in, summary.records_out, summary.dead_letters) == (124, len(good), 124 - len(good))
    # Per range too: a partition the aborted one-pass attempt had committed counts from its manifest record.
    assert sum(r["records_in"] for r in summary.ranges) == 124
    assert sum(r["records_out"] for r in summary.ranges) == len(good)

    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(spec.sink.topic, MessageField.VALUE)
    out = {o["order_id"]: o for o in (deserialize(m.value, ctx) for m in read_committed(settings, spec.sink.topic))}
    assert sorted(out) == sorted(r["order_id"] for r in good)  # each once
    for r in good:  # v1 records read with v2's default; v2 records keep theirs
        assert out[r["order_id"]]["channel"] == r.get("channel", "web")
        assert out[r["order_id"]]["amount"] == pytest.approx(r["amount"])
    written = json.loads(client.get_latest_version(f"{spec.sink.topic}-value").schema.schema_str)
    assert [f["name"] for f in written["fields"]] == [f["name"] for f in ORDER_AVRO_V2["fields"]] + ["amount_eur"]

    reasons = _reasons(settings, spec.sink.dlq_topic)
    assert len(reasons) == 124 - len(good)
    assert sum(r.startswith("bad currency: XXX") for r in reasons) == 120 - len(good)
    decoding = [r for r in reasons if not r.startswith("bad currency")]
    assert decoding == sorted([
        f"value: magic byte 0x01 is not 0 (not the Confluent wire format) ({src}-0 offset {_offset(settings, src, 0)})",
        f"value: schema id 987654 is not a version of subject {src}-value ({src}-0 offset {_offset(settings, src, 1)})",
        f"value: payload of schema id {v1_id} does not decode as Avro ({src}-0 offset {_offset(settings, src, 2)})",
        f"value: 2 bytes, shorter than the Confluent wire format's 5-byte header ({src}-0 offset {_offset(settings, src, 3)})",
    ])
    # The dead letters of records that did not decode carry the bytes as read.
    raw = [m.value for m in read_committed(settings, spec.sink.dlq_topic) if b"schema id 987654" in
           dict(m.headers)["kafka-eos.reason"]]
    assert raw == [b"\x00" + (987654).to_bytes(4, "big") + b"\x02"]

    ends = {r.tp: r.until for r in plan.active}
    assert kafka_admin.committed_offsets(settings, spec.source.group_id, list(ends)) == ends
    again = run_batch(spark, spec, plan, settings)  # a retry of the same run: nothing twice
    assert again.status == "noop"
    assert len(read_committed(settings, spec.sink.topic)) == len(good)


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_an_undecodable_record_mid_range_fails_the_one_pass_and_loses_nothing(spark, settings, make_spec,
                                                                             small_batches, commit):
    """An Avro record that does not decode in the third Arrow batch of a range: the one-pass
    guard fails the Spark task mid-read. Before the proof of read, the per_partition task committed
    the two batches it had seen and moved the checkpoint to the range's end (the run exited 0, its
    verify passed): 2,000 rows written, the rest and the dead letter lost for good. Now the
    partition's transaction aborts, the run goes again in two passes, and every record is written
    once: the good ones as results, the bad one as a dead letter."""
    spec = _avro_spec(make_spec, commit, partitions=1)
    src = spec.source.topics[0]
    produced = produce_avro_orders(settings, src, 1250, per_transaction=250)
    _raw(settings, src, [b"\x01not avro"])
    produced += produce_avro_orders(settings, src, 1250, per_transaction=250, first_seq=1250)

    plan = prepare_plan(spec, settings, "run-1")
    summary = run_batch(spark, spec, plan, settings)
    good = [r for r in produced if r["currency"] != "XXX"]
    assert (summary.records_out, summary.dead_letters) == (len(good), len(produced) - len(good) + 1)
    out = read_committed(settings, spec.sink.topic)
    assert len(out) == len(good)
    assert len(read_committed(settings, spec.sink.dlq_topic)) == len(produced) - len(good) + 1
    ends = {r.tp: r.until for r in plan.active}
    assert kafka_admin.committed_offsets(settings, spec.source.group_id, list(ends)) == ends


def _offset(settings, topic, nth_bad):
    """The offset of the ``nth_bad`` record :func:`_bad_records` wrote (read back: the transaction
    markers of the producer before it may land among them)."""
    bad = [m.offset for m in read_committed(settings, topic) if m.partition == 0 and
           (m.value[:1] != b"\x00" or len(m.value) < 5 or m.value[1:5] == (987654).to_bytes(4, "big")
            or m.value.endswith(b"\xff\x01"))]
    return bad[nth_bad]


def test_the_sql_sink_decodes_and_dead_letters_in_its_own_transaction(spark, settings, client, make_spec):
    from sqlalchemy import create_engine, text

    spec = _avro_spec(make_spec, kind="sql", key_columns=["order_id"])
    spec = dataclasses.replace(spec, transform="spark_apps.transforms.orders_avro:as_rows")
    src = spec.source.topics[0]
    produced = produce_avro_orders(settings, src, 50, evolve_at=25)
    _bad_records(settings, src, client.get_version(f"{src}-value", 1).schema_id)
    summary = run_batch(spark, spec, prepare_plan(spec, settings, "run-1"), settings)
    good = [r for r in produced if r["currency"] != "XXX"]
    assert (summary.records_in, summary.records_out, summary.dead_letters) == (54, len(good), 54 - len(good))
    engine = create_engine(spec.sink.url)
    with engine.connect() as conn:
        rows = {r.order_id: r.channel for r in conn.execute(text("select order_id, channel from results"))}
        reasons = [r[0] for r in conn.execute(text("select reason from kafka_eos_dead_letters"))]
    assert rows == {r["order_id"]: r.get("channel", "web") for r in good}
    assert sum("does not decode as Avro" in r for r in reasons) == 1
    assert sum("is not a version of subject" in r for r in reasons) == 1
    assert len(reasons) == 54 - len(good)


def test_an_output_schema_the_subject_refuses_is_refused_before_anything_is_written(
        spark, settings, client, make_spec):
    spec = _avro_spec(make_spec)
    produce_avro_orders(settings, spec.source.topics[0], 20)
    out_subject = f"{spec.sink.topic}-value"
    client.register_schema(out_subject, Schema(json.dumps(
        {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "order_id", "type": "int"}]}),
        "AVRO"))
    plan = prepare_plan(spec, settings, "run-1")
    with pytest.raises(SchemaRefused) as refused:
        run_batch(spark, spec, plan, settings)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"subject {out_subject!r} (version 1, compatibility BACKWARD) refuses the output schema")
    assert read_committed(settings, spec.sink.topic) == [] and read_committed(settings, spec.sink.dlq_topic) == []
    assert set(kafka_admin.committed_offsets(settings, spec.source.group_id, [r.tp for r in plan.active]).values()) \
        == {None}
    assert client.get_versions(out_subject) == [1]


def test_the_registry_down_fails_the_run_before_it_writes(spark, settings, make_spec, free_ports):
    spec = _avro_spec(make_spec)
    produce_avro_orders(settings, spec.source.topics[0], 10)
    down = f"http://127.0.0.1:{free_ports(1)}/apis/ccompat/v7"
    plan = prepare_plan(spec, settings, "run-1")
    with pytest.raises(RegistryError) as failed:
        run_batch(spark, spec, plan, dataclasses.replace(settings, schema_registry=RegistrySettings(down)))
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"Schema Registry {down} unreachable")
    assert read_committed(settings, spec.sink.topic) == []
    assert set(kafka_admin.committed_offsets(settings, spec.source.group_id, [r.tp for r in plan.active]).values()) \
        == {None}


PROTO = """syntax = "proto3";
package shop;
message Order {
  string order_id = 1;
  double amount = 2;
  repeated string tags = 3;
  Address address = 4;
}
message Address { string city = 1; }
"""


def test_protobuf_end_to_end(spark, settings, client, make_spec):
    from confluent_kafka.schema_registry.common.serde import SchemaId

    from kafka_eos.formats import protobuf

    spec = make_spec("identity", "kafka", "per_partition", source={"format": "protobuf"}, format="protobuf")
    src = spec.source.topics[0]
    schema_id = client.register_schema(f"{src}-value", Schema(PROTO, "PROTOBUF"))
    order = protobuf.message_class(protobuf.message_descriptor(PROTO, [0]))
    header = SchemaId("PROTOBUF", schema_id, message_indexes=[0]).id_to_bytes()
    sent = [order(order_id=f"o-{i}", amount=i * 1.5, tags=["a"] * (i % 3), address={"city": f"x{i}"})
            for i in range(30)]
    _raw(settings, src, [header + m.SerializeToString() for m in sent] + [header + b"\xff\xff"])

    summary = run_batch(spark, spec, prepare_plan(spec, settings, "run-1"), settings)
    assert (summary.records_out, summary.dead_letters) == (30, 1)
    out = read_committed(settings, spec.sink.topic)
    written = client.get_latest_version(f"{spec.sink.topic}-value")
    back_cls = protobuf.message_class(protobuf.message_descriptor(written.schema.schema_str, [0]))
    back = []
    for m in out:
        sid = SchemaId("PROTOBUF")
        payload = sid.from_bytes(io.BytesIO(m.value))
        assert sid.id == written.schema_id
        back.append(back_cls.FromString(payload.read()))
    assert sorted((b.order_id, b.amount, list(b.tags), b.address.city) for b in back) == \
        sorted((m.order_id, m.amount, list(m.tags), m.address.city) for m in sent)
    assert "does not decode as Protobuf" in _reasons(settings, spec.sink.dlq_topic)[0]


#: A .proto that declares a message before the one its records are (as .proto files often do).
ADDRESS_FIRST = """syntax = "proto3";
package shop;
message Address { string city = 1; }
message Customer { string id = 1; string name = 2; Address address = 3; }
"""
CUSTOMER_FIRST = """syntax = "proto3";
package shop;
message Customer { string id = 1; string name = 2; Address address = 3; }
message Address { string city = 1; }
"""


@pytest.mark.parametrize("named", [False, True])
def test_protobuf_records_decode_as_the_message_they_name(spark, settings, client, make_spec, named):
    """Customer records (message indexes [1], as confluent-kafka's ProtobufSerializer writes them)
    of a schema that declares Address first. Before: decoded as Address (the schema's first
    message), re-encoded from its fields: exit 0, no dead letter, every id lost. Now a record is
    decoded as the message it names, when that is the one the pipeline reads (``source.message``),
    and is a dead letter naming both otherwise."""
    from confluent_kafka.schema_registry.common.serde import SchemaId

    from kafka_eos.formats import protobuf

    source = {"format": "protobuf", **({"message": "Customer"} if named else {})}
    spec = make_spec("identity", "kafka", "per_partition", source=source, format="protobuf")
    src = spec.source.topics[0]
    schema_id = client.register_schema(f"{src}-value", Schema(ADDRESS_FIRST, "PROTOBUF"))
    client.register_schema(f"{spec.sink.topic}-value", Schema(CUSTOMER_FIRST, "PROTOBUF"))
    customer = protobuf.message_class(protobuf.message_descriptor(ADDRESS_FIRST, [1]))
    header = SchemaId("PROTOBUF", schema_id, message_indexes=[1]).id_to_bytes()
    sent = [customer(id=f"c-{i}", name=f"n{i}", address={"city": f"x{i}"}) for i in range(300)]
    _raw(settings, src, [header + m.SerializeToString() for m in sent])

    summary = run_batch(spark, spec, prepare_plan(spec, settings, "run-1"), settings)
    if not named:
        assert (summary.records_out, summary.dead_letters) == (0, 300)
        reasons = set(_reasons(settings, spec.sink.dlq_topic))
        assert {r.split(" (")[0] for r in reasons} == {
            f"value: message indexes [1] of schema id {schema_id} name shop.Customer, not shop.Address, the message "
            "the pipeline reads"}
        return
    assert (summary.records_out, summary.dead_letters) == (300, 0)
    back_cls = protobuf.message_class(protobuf.message_descriptor(CUSTOMER_FIRST, [0]))
    back = []
    for m in read_committed(settings, spec.sink.topic):
        payload = SchemaId("PROTOBUF").from_bytes(io.BytesIO(m.value))
        back.append(back_cls.FromString(payload.read()))
    assert sorted((b.id, b.name, b.address.city) for b in back) == sorted((m.id, m.name, m.address.city) for m in sent)


def test_json_schema_end_to_end(spark, settings, client, make_spec):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    spec = make_spec("identity", "kafka", "atomic", source={"format": "json_schema"}, format="json_schema")
    src = spec.source.topics[0]
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
              "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"},
                             "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["order_id", "amount"]}
    serialize = JSONSerializer(json.dumps(schema), client)
    ctx = SerializationContext(src, MessageField.VALUE)
    sent = [{"order_id": f"o-{i}", "amount": i * 2.5, "tags": ["x"] * (i % 2)} for i in range(20)]
    values = [serialize(o, ctx) for o in sent]
    schema_id = int.from_bytes(values[0][1:5], "big")
    _raw(settings, src, values + [b"\x00" + schema_id.to_bytes(4, "big") + b"{not json",
                                  b"\x00" + schema_id.to_bytes(4, "big") + json.dumps({"amount": 1}).encode()])

    summary = run_batch(spark, spec, prepare_plan(spec, settings, "run-1"), settings)
    assert (summary.records_out, summary.dead_letters) == (20, 2)
    deserialize = JSONDeserializer(None, schema_registry_client=client)
    out_ctx = SerializationContext(spec.sink.topic, MessageField.VALUE)
    back = [deserialize(m.value, out_ctx) for m in read_committed(settings, spec.sink.topic)]
    assert sorted((b["order_id"], b["amount"], b.get("tags") or []) for b in back) == \
        sorted((o["order_id"], o["amount"], o["tags"]) for o in sent)
    assert all("does not decode as JSON" in r for r in _reasons(settings, spec.sink.dlq_topic))


def test_a_v1_reader_reads_v2_records_too(spark, settings, client, make_spec):
    """source.reader_version pins the reader schema: records of a later version resolve to it."""
    spec = make_spec("identity", "kafka", "atomic", source={"format": "avro", "reader_version": 1}, format="avro")
    src = spec.source.topics[0]
    produce_avro_orders(settings, src, 10, evolve_at=5)
    run_batch(spark, spec, prepare_plan(spec, settings, "run-1"), settings)
    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(spec.sink.topic, MessageField.VALUE)
    back = [deserialize(m.value, ctx) for m in read_committed(settings, spec.sink.topic)]
    assert len(back) == 10 and all(set(b) == {f["name"] for f in ORDER_AVRO_V1["fields"]} for b in back)


def test_validate_checks_the_registry_the_subjects_and_a_schema_files_compatibility(
        settings, client, make_spec, tmp_path):
    from kafka_eos.validate import validate

    src_schema = json.dumps(ORDER_AVRO_V1)
    kept = tmp_path / "out.avsc"
    kept.write_text(json.dumps({**ORDER_AVRO_V1, "fields": ORDER_AVRO_V1["fields"][:2]}))
    spec = _avro_spec(make_spec, schema=str(kept))
    client.register_schema(f"{spec.source.topics[0]}-value", Schema(src_schema, "AVRO"))
    client.register_schema(f"{spec.sink.topic}-value", Schema(src_schema, "AVRO"))
    checks = {c.what: c for c in validate(spec, settings)}
    assert checks["source value schema"].ok and "version 1" in checks["source value schema"].detail
    assert checks["sink value schema"].ok, checks["sink value schema"].detail  # dropping fields: BACKWARD takes it

    kept.write_text(json.dumps({**ORDER_AVRO_V1, "fields": [{"name": "order_id", "type": "int"}]}))
    refused = {c.what: c for c in validate(spec, settings)}["sink value schema"]
    assert not refused.ok
    assert refused.detail == f"avro: subject '{spec.sink.topic}-value' (version 1, compatibility BACKWARD) refuses {kept}"

    down = dataclasses.replace(settings, schema_registry=RegistrySettings("http://127.0.0.1:9/apis/ccompat/v7"))
    failed = {c.what: c for c in validate(spec, down)}["source schemas"]
    assert not failed.ok and failed.detail.startswith("Schema Registry http://127.0.0.1:9/apis/ccompat/v7 unreachable")
