"""``make demo-avro`` (``kafka-eos demo --format avro``): the Avro example pipeline
(include/examples/orders_avro.yaml) on the local broker and the embedded Schema Registry.

Orders are produced in Avro by confluent-kafka's ``AvroSerializer``: 600 with schema version 1,
then a run; then 400 more of version 1, 1,000 of version 2 (the producer evolved its schema: a
``channel`` field with a default) and three records that do not decode, then a run whose range
holds both versions; then a run with nothing new. The output is read back with
``AvroDeserializer`` and checked against what was produced: every valid order once, version 1's
orders with version 2's default, every other record a dead letter with its reason.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.demo import Report, reset
from kafka_eos.errors import KafkaEosError
from kafka_eos.formats.registry import Registry
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.local.registry import LocalRegistry
from kafka_eos.paths import PROJECT_ROOT
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_avro_orders
from kafka_eos.settings import KafkaSettings, RegistrySettings
from kafka_eos.spark_io import get_session
from kafka_eos.spec import load_spec

EXAMPLE = PROJECT_ROOT / "include" / "examples" / "orders_avro.yaml"
#: Records that do not decode, written to partition 0 before the second run.
UNDECODABLE = (b"\x01\x00\x00\x00\x01not-confluent", b"\x00\x00\x0f\x42\x3f\x02", b"\x00\x01")


def run_avro_demo(bootstrap: str | None = None) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    broker = LocalBroker.default()
    if bootstrap and bootstrap != broker.bootstrap:
        raise KafkaEosError("the demo resets its topics and groups: it runs on the local broker only")
    print(f"== kafka-eos Avro demo: local broker {broker.start()}, Schema Registry {LocalRegistry.default().start()}")
    settings = KafkaSettings(broker.bootstrap, schema_registry=RegistrySettings(LocalRegistry.default().url))
    spec = load_spec(str(EXAMPLE), environ=os.environ)
    src, out, dlq = spec.source.topics[0], spec.sink.topic, spec.sink.dlq_topic
    reset(settings, [spec], {src: 3, out: 3, dlq: 1})
    spark = get_session("kafka-eos Avro demo")

    produced, runs = [], []
    rounds = [("version 1", 600, None, ()), ("both versions", 1400, 1000, UNDECODABLE), ("nothing new", 0, None, ())]
    first = 0
    for label, count, evolve_at, bad in rounds:
        if count:
            produced += produce_avro_orders(settings, src, count, evolve_at=evolve_at, first_seq=first)
            first += count
        if bad:
            producer = Producer(settings.client_config())
            for value in bad:
                producer.produce(src, key=b"c-0", value=value, partition=0)
            producer.flush(30)
        summary = run_batch(spark, spec, prepare_plan(spec, settings, f"avro-demo-{len(runs) + 1}"), settings)
        runs.append(summary)
        print(f"   {label:<14} run {summary.run_id}: {summary.status}, in {summary.records_in}, out "
              f"{summary.records_out}, dead-lettered {summary.dead_letters} ({summary.seconds:.1f}s)")

    report = Report()
    good = [r for r in produced if r["currency"] != "XXX"]
    client = Registry(settings.schema_registry).client
    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(out, MessageField.VALUE)
    written = [deserialize(m.value, ctx) for m in read_committed(settings, out)]
    ids = [o["order_id"] for o in written]
    report.check("every valid order written once", sorted(ids) == sorted(r["order_id"] for r in good),
                 f"{len(ids)} written, {len(set(ids))} distinct, {len(good)} valid produced")
    by_id = {o["order_id"]: o for o in written}
    # The second run's range holds both versions: it decodes them to version 2.
    second = [r for r in good if int(r["order_id"][2:]) >= 600]
    defaults = sum(1 for r in second if "channel" not in r and by_id.get(r["order_id"], {}).get("channel") == "web")
    kept = sum(1 for r in second if "channel" in r and by_id.get(r["order_id"], {}).get("channel") == r["channel"])
    report.check("in the range of both versions, version 1's orders read with version 2's default, version 2's "
                 "keep theirs", defaults + kept == len(second), f"{defaults} defaulted, {kept} kept, of {len(second)}")
    reasons = [dict(m.headers).get("kafka-eos.reason", b"").decode() for m in read_committed(settings, dlq)]
    undecoded = [r for r in reasons if not r.startswith("bad currency")]
    report.check("every other record a dead letter with its reason",
                 len(reasons) == len(produced) - len(good) + len(UNDECODABLE) and len(undecoded) == len(UNDECODABLE),
                 "; ".join(undecoded))
    report.check("the last run found nothing new", runs[-1].status == "empty", runs[-1].status)
    tps = [(src, p) for p in range(3)]
    ends = {tp: o.lso for tp, o in kafka_admin.partition_offsets(settings, tps).items()}
    report.check("checkpoints at the LSO", kafka_admin.committed_offsets(settings, spec.source.group_id, tps) == ends,
                 str(ends))
    latest = client.get_latest_version(f"{out}-value")
    print(f"\n   output schema: subject {out}-value version {latest.version} (id {latest.schema_id}), "
          f"written {datetime.now(timezone.utc):%H:%M:%S}")
    passed = sum(c.ok for c in report.checks)
    print(f"\n== {passed} passed, {len(report.checks) - passed} failed")
    print("The broker and the registry keep running: `.venv/bin/kafka-eos kafka stop`, "
          "`.venv/bin/kafka-eos registry stop`.")
    return 0 if report.ok else 1

