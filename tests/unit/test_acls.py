"""The ACLs `kafka-eos acls` computes from a spec, per role, and the error a run gives without one."""

from __future__ import annotations

import pytest

from kafka_eos import acls
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import load_spec


def rows(spec, role="pipeline"):
    return [(a.resource_type, a.name, a.pattern, a.operation) for a in acls.required_acls(spec, role)]


def test_a_kafka_sinks_pipeline_needs_its_topics_group_and_transactional_ids_and_nothing_else():
    spec = load_spec("orders_enriched", import_transform=False)
    assert rows(spec) == [
        ("TOPIC", "orders", "LITERAL", "READ"),
        ("TOPIC", "kafka-eos.manifest.orders_enriched", "LITERAL", "READ"),
        ("TOPIC", "kafka-eos.manifest.orders_enriched", "LITERAL", "WRITE"),
        ("TOPIC", "orders.enriched", "LITERAL", "WRITE"),
        ("TOPIC", "orders.dlq", "LITERAL", "WRITE"),
        ("TOPIC", "orders.backfill", "LITERAL", "WRITE"),
        ("TOPIC", "kafka-eos.audit", "LITERAL", "WRITE"),
        ("GROUP", "kafka-eos.orders_enriched", "LITERAL", "READ"),
        ("GROUP", "kafka-eos.orders_enriched.", "PREFIXED", "READ"),
        ("GROUP", "kafka-eos.reader.", "PREFIXED", "DESCRIBE"),
        ("TRANSACTIONAL_ID", "kafka-eos.orders_enriched", "LITERAL", "WRITE"),
        ("TRANSACTIONAL_ID", "kafka-eos.orders_enriched|", "PREFIXED", "WRITE"),
        ("TRANSACTIONAL_ID", "kafka-eos.orders_enriched.", "PREFIXED", "WRITE"),
        ("CLUSTER", "kafka-cluster", "LITERAL", "DESCRIBE_CONFIGS"),
    ]


def test_a_sql_sinks_pipeline_writes_no_topic_but_its_manifest_and_holds_no_transactional_id():
    spec = load_spec("revenue_per_minute", import_transform=False)
    got = rows(spec)
    assert [r for r in got if r[3] == "WRITE"] == [
        ("TOPIC", "kafka-eos.manifest.revenue_per_minute", "LITERAL", "WRITE"),
        ("TOPIC", "kafka-eos.audit", "LITERAL", "WRITE")]
    assert not [r for r in got if r[0] == "TRANSACTIONAL_ID"]
    assert ("GROUP", "kafka-eos.revenue_per_minute", "LITERAL", "READ") in got


def test_the_watchdogs_set_is_read_only():
    for name in ("orders_enriched", "revenue_per_minute"):
        got = rows(load_spec(name, import_transform=False), "watchdog")
        assert got and not [r for r in got if r[3] not in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")]
        # READ only where Kafka asks for it: records of the manifest, DescribeProducers of a source.
        assert {r[1] for r in got if r[3] == "READ"} == {"orders", f"kafka-eos.manifest.{name}"}


def test_the_abort_role_fences_only_the_pipelines_own_transactional_ids():
    got = rows(load_spec("orders_enriched", import_transform=False), "abort")
    assert {r[1] for r in got if r[0] == "TRANSACTIONAL_ID"} == {
        "kafka-eos.orders_enriched", "kafka-eos.orders_enriched|", "kafka-eos.orders_enriched."}
    assert ("TOPIC", "kafka-eos.audit", "LITERAL", "WRITE") in got


def test_no_acl_is_listed_twice_and_an_unknown_role_is_named():
    spec = load_spec("orders_enriched", import_transform=False)
    for role in acls.ROLES:
        got = rows(spec, role)
        assert len(got) == len(set(got))
    with pytest.raises(acls.KafkaEosError, match="role 'admin' is not one of pipeline, watchdog, abort"):
        acls.required_acls(spec, "admin")


def test_a_missing_acl_is_named_with_the_command_that_grants_it(monkeypatch):
    spec = load_spec("orders_enriched", import_transform=False)
    needed = acls.required_acls(spec)
    monkeypatch.setattr(acls, "_missing", lambda _settings, _acls: [needed[-3], needed[-1]])
    settings = KafkaSettings("b:9093", extra={"sasl.username": "etl", "sasl.password": "x"})
    with pytest.raises(acls.PermissionMissing) as failed:
        acls.check(spec, settings, spec_ref="orders_enriched")
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("User:etl lacks WRITE on TRANSACTIONAL_ID prefix 'kafka-eos.orders_enriched|' "
                              "(and 1 more), needed for per-partition commits")
    assert message.endswith("nothing was written; grant the pipeline's ACLs with "
                            "`kafka-eos acls orders_enriched --principal User:etl --apply`")
