"""Every path on the secured broker (TLS, SCRAM-SHA-512, StandardAuthorizer, nothing allowed without
an ACL), as principals that hold exactly what `kafka-eos acls` computes: runs in both commit scopes,
a SQL sink, a stream, `txn hanging` and the operator page's read. Without any one of the ACLs a run
fails before it writes anything, naming the permission and the command that grants it.
(The DAG run through Airflow on this broker: tests/dags/test_secrets.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from kafka_eos import acls, kafka_admin
from kafka_eos.cli import EXIT_FOUND, main
from kafka_eos.paths import pipelines_dir
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders
from kafka_eos.spec import load_spec
from kafka_eos.topics import create_missing, pipeline_topics

pytestmark = pytest.mark.integration

ORDERS = 60


@pytest.fixture(scope="module")
def secured(secure_broker):
    """The session's secured broker (this module's tests run on one worker, which starts it once)."""
    return secure_broker


def as_principal(monkeypatch, secured, config_file: Path) -> None:
    """Let the CLI connect to the secured broker with the settings in ``config_file``."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", secured.bootstrap)
    monkeypatch.setenv("KAFKA_EOS_CLIENT_CONFIG_FILE", str(config_file))
    monkeypatch.delenv("KAFKA_EOS_CLIENT_CONFIG", raising=False)


def new_pipeline(secured, tmp_path: Path, name: str, bundled: str, **sink) -> tuple[Path, object]:
    """A copy of a bundled pipeline with topics, group and manifest of its own, its topics made by
    the super user (what `kafka-eos topics create --yes` does) and committed orders on its source."""
    raw = yaml.safe_load((pipelines_dir() / f"{bundled}.yaml").read_text())
    raw.update(name=name, manifest_topic=f"{name}.manifest")
    raw["source"].update(topics=[f"{name}.orders"], group_id=f"kafka-eos.{name}")
    if raw["sink"]["kind"] == "kafka":
        raw["sink"].update(topic=f"{name}.out", dlq_topic=f"{name}.dlq", backfill_topic=f"{name}.backfill")
    else:
        raw["sink"].update(url=f"sqlite:///{tmp_path / name}.db")
    raw["sink"].update(sink)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = load_spec(str(path))
    create_missing(secured.admin, pipeline_topics(spec, secured.admin, partitions=2))
    produce_orders(secured.admin, spec.source.topics[0], ORDERS)
    return path, spec


def grant(monkeypatch, secured, spec_path: Path, user: str, role: str = "pipeline") -> list[dict]:
    """`kafka-eos acls PIPELINE --principal User:user --apply --json`, as the super user; returns
    the ACLs it printed."""
    import contextlib
    import io

    out = io.StringIO()
    with monkeypatch.context() as m, contextlib.redirect_stdout(out):
        m.setenv("KAFKA_BOOTSTRAP_SERVERS", secured.bootstrap)
        m.setenv("KAFKA_EOS_CLIENT_CONFIG", json.dumps(dict(secured.admin.extra)))
        m.delenv("KAFKA_EOS_CLIENT_CONFIG_FILE", raising=False)
        code = main(["acls", str(spec_path), "--principal", f"User:{user}", "--role", role, "--apply", "--json"])
    assert code == 0
    return json.loads(out.getvalue())["acls"]


def end_offsets(settings, topics: list[str]) -> dict:
    tps = [(t, p) for t in topics for p in range(2 if not t.endswith(".manifest") else 1)]
    return {tp: o.high_watermark for tp, o in kafka_admin.partition_offsets(settings, tps).items()}


def test_both_commit_scopes_a_sql_sink_and_a_stream_run_with_exactly_the_printed_acls(
        secured, spark, tmp_path, unique, monkeypatch, capsys):
    per_partition, pp_spec = new_pipeline(secured, tmp_path, f"pp-{unique}", "orders_enriched")
    atomic, at_spec = new_pipeline(secured, tmp_path, f"at-{unique}", "orders_enriched", commit="atomic")
    sql, sql_spec = new_pipeline(secured, tmp_path, f"sql-{unique}", "revenue_per_minute")
    user, settings, config_file = secured.user("etl")
    for path in (per_partition, atomic, sql):
        printed = grant(monkeypatch, secured, path, user)
        spec = load_spec(str(path))
        # What was printed is what was created, and it is the computed set.
        assert [(a["resource_type"], a["name"], a["pattern"], a["operation"]) for a in printed] == \
            [(a.resource_type, a.name, a.pattern, a.operation) for a in acls.required_acls(spec)]
    as_principal(monkeypatch, secured, config_file)

    for path, spec in ((per_partition, pp_spec), (atomic, at_spec)):
        assert main(["run", str(path)]) == 0
        assert main(["run", str(path)]) == 0  # caught up: nothing to do, nothing written twice
        assert_exactly_once(secured.admin, spec)

    assert main(["run", str(sql)]) == 0
    import sqlalchemy

    engine = sqlalchemy.create_engine(sql_spec.sink.url)
    with engine.connect() as conn:
        counted = conn.execute(sqlalchemy.text(f"select sum(order_count) from {sql_spec.sink.table}")).scalar()
        dead = conn.execute(sqlalchemy.text(f"select count(*) from {sql_spec.sink.dead_letters_table}")).scalar()
    engine.dispose()
    assert counted + dead == len(_read(secured.admin, sql_spec.source.topics[0]))

    # A stream of the per-partition pipeline picks up what arrives next, as the same principal.
    produce_orders(secured.admin, pp_spec.source.topics[0], 20, first_seq=ORDERS)
    assert main(["stream", str(per_partition), "--until-caught-up", "--interval", "0.5"]) == 0
    assert_exactly_once(secured.admin, pp_spec)

    # The watchdog's read-only principal: `txn hanging` names the pipeline's open transaction, and
    # the operator page reads every figure.
    watcher, watch_settings, watch_file = secured.user("watch")
    grant(monkeypatch, secured, per_partition, watcher, role="watchdog")
    holder = Producer(secured.admin.client_config(**{"transactional.id": pp_spec.transactional_id(
        pp_spec.source.topics[0], 0), "transaction.timeout.ms": 600000}))
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(pp_spec.source.topics[0], value=b"open", partition=0)
    holder.flush(30)
    try:
        as_principal(monkeypatch, secured, watch_file)
        monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(tmp_path))  # the pipelines it attributes to
        capsys.readouterr()
        assert main(["txn", "hanging", "--topic", pp_spec.source.topics[0], "--older-than", "0", "--json"]) \
            == EXIT_FOUND
        held = [s for s in json.loads(capsys.readouterr().out)["stalled"] if s["partition"] == 0]
        assert held and held[0]["culprit"]["transactional_id"] == pp_spec.transactional_id(pp_spec.source.topics[0], 0)
        assert held[0]["culprit"]["pipeline"] == pp_spec.name

        from kafka_eos.overview.snapshot import snapshot

        [row] = snapshot(watch_settings, [pp_spec])
        assert row["error"] is None
        assert {(p["topic"], p["partition"]) for p in row["partitions"]} == \
            {(pp_spec.source.topics[0], 0), (pp_spec.source.topics[0], 1)}
        assert row["runs"] and row["pinned"]

        # The runbook's abort, as the on-call principal with the abort role's set: the pipeline's
        # transactional id is fenced, the partition is readable again, the attempt audited.
        oncall, _settings, oncall_file = secured.user("oncall")
        grant(monkeypatch, secured, per_partition, oncall, role="abort")
        as_principal(monkeypatch, secured, oncall_file)
        start = held[0]["lso"]
        assert main(["txn", "abort", "--topic", pp_spec.source.topics[0], "--partition", "0",
                     "--start-offset", str(start), "--force", "--yes"]) == 0
        offsets = kafka_admin.partition_offsets(secured.admin, [(pp_spec.source.topics[0], 0)])
        assert offsets[(pp_spec.source.topics[0], 0)].lso == offsets[(pp_spec.source.topics[0], 0)].high_watermark
    finally:
        try:
            holder.abort_transaction(30)
        except Exception:  # noqa: BLE001 - fenced by the abort above: nothing left to end
            pass


def _read(settings, topic: str) -> list[bytes]:
    """Every committed record value of ``topic``."""
    return [m.value for m in read_committed(settings, topic)]


def assert_exactly_once(settings, spec) -> None:
    """Each committed source record is in the output or the dead letters, once."""
    source = _read(settings, spec.source.topics[0])
    out = [json.loads(v)["order_id"] for v in _read(settings, spec.sink.topic)]
    dead = _read(settings, spec.sink.dlq_topic)
    assert len(out) == len(set(out)), "an output record written twice"
    assert len(out) + len(dead) == len(source), (len(out), len(dead), len(source))


def test_without_any_one_acl_a_run_fails_before_it_writes_and_names_the_missing_permission(
        secured, tmp_path, unique, monkeypatch, capsys):
    path, spec = new_pipeline(secured, tmp_path, f"minus-{unique}", "orders_enriched")
    user, settings, config_file = secured.user("minus")
    printed = grant(monkeypatch, secured, path, user)
    needed = acls.required_acls(spec)
    assert len(printed) == len(needed) == 14
    outputs = [spec.sink.topic, spec.sink.dlq_topic, spec.manifest_topic]
    before = end_offsets(secured.admin, outputs)
    as_principal(monkeypatch, secured, config_file)
    admin = kafka_admin.admin_client(secured.admin)
    for acl in needed:
        binding = AclBindingFilter(
            ResourceType["BROKER" if acl.resource_type == "CLUSTER" else acl.resource_type], acl.name,
            ResourcePatternType[acl.pattern], f"User:{user}", "*", AclOperation[acl.operation],
            AclPermissionType.ALLOW)
        for future in admin.delete_acls([binding]).values():
            assert len(future.result(30)) == 1, acl
        try:
            capsys.readouterr()
            assert main(["run", str(path)]) != 0, acl
            [err] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kafka-eos:")]
            assert f"lacks {acl.describe()}" in err, (acl, err)
            assert f"kafka-eos acls {path} --principal User:{user} --apply" in err
            if acl is needed[0]:  # `kafka-eos validate` names it too, without running
                assert main(["validate", str(path)]) != 0
                assert f"FAIL  permissions: User:{user} lacks {acl.describe()}" in capsys.readouterr().out
        finally:
            acls.apply(secured.admin, [acl], f"User:{user}")
        # Nothing was written: not a record, not a plan, not a checkpoint.
        assert end_offsets(secured.admin, outputs) == before, acl
        assert not [o for o in kafka_admin.committed_offsets(
            secured.admin, spec.source.group_id, [(spec.source.topics[0], p) for p in range(2)]).values()
            if o is not None]


def test_an_airflow_kafka_connection_logs_every_client_in_through_its_allowlisted_token_callback(
        secured, spark, tmp_path, unique, monkeypatch):
    """The Kafka provider's route, unchanged: a ``kafka`` connection whose extra names an OAUTHBEARER
    token callback (``oauth_cb``, a dotted path the ``[apache_kafka] callback_allowlist`` lists).
    kafka-eos's hook builds its settings through the provider's config and carries the callback to
    the run's every client: the planner's and the producers' confluent-kafka (driver and Spark's
    Python workers), Spark's Java consumer (kafka-eos's login handler runs the same callable) and
    kafka-python's transaction admin API. The principal exists only in the callback's tokens."""
    from airflow.sdk.exceptions import AirflowException

    from kafka_eos.settings import KafkaSettings
    from kafka_eos_airflow.hooks.kafka import KafkaEosHook

    path, spec = new_pipeline(secured, tmp_path, f"oauth-{unique}", "orders_enriched")
    principal = f"oauth-{unique}"
    grant(monkeypatch, secured, path, principal)
    grant(monkeypatch, secured, path, principal, role="watchdog")
    calls = tmp_path / "token-calls.log"
    callback = "kafka_eos_lab.oauth.unsecured_token"
    extra = {"bootstrap.servers": secured.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
             "ssl.ca.location": secured.admin.extra["ssl.ca.location"], "oauth_cb": callback,
             "sasl.oauthbearer.config": f"sub={principal} calls={calls}"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_OAUTH", json.dumps({"conn_type": "kafka", "extra": extra}))

    # Not allowlisted: the provider's refusal, naming the connection and the callback.
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "")
    with pytest.raises(AirflowException, match=rf"^connection 'kafka_oauth': Refusing to resolve Kafka callback "
                                               rf"oauth_cb='{callback}'"):
        KafkaEosHook("kafka_oauth").get_settings()

    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", f"some.other.cb, {callback}")
    settings = KafkaEosHook("kafka_oauth").get_checked_settings()
    assert settings.token_callback == callback
    # What the Airflow task hands its Spark process: the callback's path in the 0600 settings file.
    carried = settings.to_environ(tmp_path / "client.json")
    assert json.loads((tmp_path / "client.json").read_text())["oauth_cb"] == callback
    for name, value in carried.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KAFKA_EOS_CLIENT_CONFIG", raising=False)
    assert KafkaSettings.from_environ(carried).token_callback == callback

    assert main(["run", str(path)]) == 0
    assert main(["run", str(path)]) == 0  # caught up: nothing to do, nothing written twice
    assert_exactly_once(secured.admin, spec)

    # kafka-python's transaction admin API, as the same principal.
    admin = kafka_admin.transaction_admin(settings)
    try:
        listed = admin.list_transactions()
    finally:
        admin.close()
    states = {t.transactional_id: t.state.value for broker in listed.values() for t in broker}
    # The principal sees its pipeline's transactions, each committed.
    assert {states.get(spec.transactional_id(spec.source.topics[0], p)) for p in (0, 1)} == {"CompleteCommit"}

    callers = [json.loads(line) for line in calls.read_text().splitlines()]
    assert {c["sub"] for c in callers} == {principal}
    # Spark's Java consumer logged in through `python -m kafka_eos.oauth` (the login handler).
    assert any(c["argv0"].endswith("kafka_eos/oauth.py") for c in callers), callers
    # And the Python clients in this process called the callback themselves.
    import os

    assert any(c["pid"] == os.getpid() for c in callers), callers
