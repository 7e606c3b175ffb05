"""``kafka-eos validate PIPELINE``: check a pipeline before it runs, without running it.

The spec (fields, the transform imports, no other spec owns its group or manifest) is checked by
loading it; then, against the cluster: its topics exist (sources, sink, dead letters, backfill;
the manifest and audit topics are created on first use), the principal holds the ACLs a run
needs, the brokers accept its transaction timeout, its checkpoints are still readable (not behind
the log start), and a SQL sink's database answers. Nothing is written anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_eos import kafka_admin
from kafka_eos.acls import PermissionMissing, check, required_acls
from kafka_eos.errors import RegistryError, SpecError
from kafka_eos.formats import sink_subject, source_decoders
from kafka_eos.formats.registry import Registry, SCHEMA_TYPES
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.kafka import check_transaction_timeout
from kafka_eos.sinks.sql_store import database_url, make_engine
from kafka_eos.spec import PipelineSpec, REGISTRY_FORMATS
from kafka_eos.topics import pipeline_topics

#: Topics kafka-eos creates itself when it first writes them.
_CREATED_ON_USE = ("manifest", "audit")


@dataclass(frozen=True)
class Check:
    ok: bool
    what: str
    detail: str


def validate(spec: PipelineSpec, settings: KafkaSettings, ref: str | None = None) -> list[Check]:
    """The checks of ``spec`` against the cluster of ``settings`` (the spec itself was checked by
    loading it). ``ref``: how the user named the pipeline (in the advice given)."""
    checks = [Check(True, "spec", f"{spec.path}: fields, transform {spec.transform!r}, owners")]
    plans = pipeline_topics(spec, settings)
    for plan in plans:
        if not plan.missing:
            checks.append(Check(True, f"topic {plan.name}", f"{plan.role}, {plan.existing} partition(s)"))
        elif plan.role in _CREATED_ON_USE:
            checks.append(Check(True, f"topic {plan.name}", f"{plan.role}, created on first use"))
        else:
            checks.append(Check(False, f"topic {plan.name}",
                                f"{plan.role}: missing (`kafka-eos topics create {ref or spec.name} --yes` creates it)"))
    if "transaction timeout" in spec.sink.about.checks:
        checks.append(_transaction_timeout(spec, settings))
    checks.append(_permissions(spec, settings, ref))
    checks += _checkpoints(spec, settings, [p for p in plans if p.role == "source" and not p.missing])
    if "database" in spec.sink.about.checks:
        checks.append(_database(spec, settings))
    checks += _registry(spec, settings)
    return checks


def _registry(spec: PipelineSpec, settings: KafkaSettings) -> list[Check]:
    """A formatted pipeline's Schema Registry: it answers, the source's subjects hold schemas of
    the format, and a sink's schema file is one its subject's compatibility rule takes."""
    checks = []
    try:
        for d in source_decoders(spec, settings):
            if d.reader is not None:
                checks.append(Check(True, f"source {d.column} schema",
                                    f"{d.format}: decoded to subject {d.reader.subject!r} version {d.reader.version}; "
                                    f"{len(d.writers)} writer schema(s) under {d.subjects}"))
    except RegistryError as exc:
        checks.append(Check(False, "source schemas", str(exc)))
    sink = spec.sink
    for column, fmt, schema_file in (("key", sink.key_format, sink.key_schema), ("value", sink.format, sink.schema)):
        if "output schemas" not in sink.about.checks or fmt not in REGISTRY_FORMATS:
            continue
        try:
            registry = Registry.of(settings, f"{spec.path}: sink format {fmt}")
            text = open(schema_file).read() if schema_file else None
            subject = sink_subject(spec, column, text, SCHEMA_TYPES[fmt])
            if subject is None:  # record_name strategies need the schema, derived at run time
                checks.append(Check(True, f"sink {column} schema", f"{fmt}: derived from the transform's output and "
                                                                   "registered by the first run"))
                continue
            latest = registry.latest(subject)
            at = f"subject {subject!r} ({f'version {latest.version}' if latest else 'no version yet'}, " \
                 f"compatibility {registry.compatibility(subject)})"
            if text is None:
                checks.append(Check(True, f"sink {column} schema", f"{fmt}: {at}; the output's schema is derived "
                                                                   "from the transform and checked at each run"))
            elif registry.compatible(subject, text, SCHEMA_TYPES[fmt]):
                checks.append(Check(True, f"sink {column} schema", f"{fmt}: {at} takes {schema_file}"))
            else:
                checks.append(Check(False, f"sink {column} schema", f"{fmt}: {at} refuses {schema_file}"))
        except RegistryError as exc:
            checks.append(Check(False, f"sink {column} schema", str(exc)))
    return checks


def _permissions(spec: PipelineSpec, settings: KafkaSettings, ref: str | None) -> Check:
    try:
        check(spec, settings, spec_ref=ref)
    except PermissionMissing as e:
        return Check(False, "permissions", str(e))
    return Check(True, "permissions", f"the {len(required_acls(spec))} ACLs a run needs (kafka-eos acls "
                                      f"{ref or spec.name})")


def _transaction_timeout(spec: PipelineSpec, settings: KafkaSettings) -> Check:
    try:
        check_transaction_timeout(spec, settings)
    except SpecError as e:
        return Check(False, "transaction timeout", str(e))
    return Check(True, "transaction timeout",
                 f"sink.transaction_timeout_s {spec.sink.transaction_timeout_s} s, within the brokers' limit")


def _checkpoints(spec: PipelineSpec, settings: KafkaSettings, sources) -> list[Check]:
    tps = [(p.name, i) for p in sources for i in range(p.existing)]
    if not tps:
        return []
    committed = kafka_admin.committed_offsets(settings, spec.source.group_id, tps)
    offsets = kafka_admin.partition_offsets(settings, tps)
    behind = [f"{t}-{p}: checkpoint {committed[(t, p)]} < log start {offsets[(t, p)].log_start}"
              for t, p in tps if committed.get((t, p)) is not None and committed[(t, p)] < offsets[(t, p)].log_start]
    have = sum(1 for tp in tps if committed.get(tp) is not None)
    if behind:
        return [Check(spec.source.on_data_loss != "fail", "checkpoints",
                      f"records deleted by retention before they were read (on_data_loss: "
                      f"{spec.source.on_data_loss}): {'; '.join(behind)}")]
    return [Check(True, "checkpoints", f"group {spec.source.group_id}: {have} of {len(tps)} partition(s) "
                                       f"checkpointed, none behind the log start")]


def _database(spec: PipelineSpec, settings: KafkaSettings) -> Check:
    from sqlalchemy import text

    try:
        url = database_url(spec, settings)
    except SpecError as exc:
        return Check(False, "database", str(exc))
    if url.startswith(("http://", "https://")):  # a REST catalog (an Iceberg sink's)
        from kafka_eos.sinks.iceberg_store import _redacted, open_catalog, rest_properties

        try:
            properties = rest_properties(url)
            open_catalog(spec, url).list_namespaces()
        except SpecError as exc:  # said without the URL's secrets
            return Check(False, "database", str(exc))
        except Exception as exc:  # noqa: BLE001 - the catalog's answer, its secrets left out
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return Check(False, "database", f"Iceberg REST catalog {properties['uri']}: {_redacted(first, properties)}")
        return Check(True, "database", f"Iceberg REST catalog {properties['uri']}")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:  # noqa: BLE001 - any driver's error is the answer
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Check(False, "database", f"{engine.url.render_as_string(hide_password=True)}: {first}")
    finally:
        engine.dispose()
    return Check(True, "database", engine.url.render_as_string(hide_password=True))
