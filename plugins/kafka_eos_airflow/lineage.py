"""What a pipeline run read and wrote, in the terms of Airflow's lineage and assets.

- **OpenLineage** (apache-airflow-providers-openlineage): :func:`run_lineage` is what the verify task's
  ``get_openlineage_facets_on_complete`` returns: the source topics as inputs, the sink (topic or
  table) and the dead-letter place as outputs, named by the OpenLineage naming spec (Kafka: namespace
  ``kafka://{host}:{port}`` of the first bootstrap server, name = topic; PostgreSQL:
  ``postgres://{host}:{port}``, name ``{database}.{schema}.{table}``; MySQL ``mysql://{host}:{port}``,
  ``{database}.{table}``; SQLite ``sqlite://{file}``, ``{table}``), with the counts as the datasets'
  statistics facets and a ``kafkaEos`` run facet (:class:`KafkaEosRunFacet`): mode (live, replay,
  backfill), side key, commit scope, status, counts and the offset ranges read, per partition.
- **Streams**: the stream DAG's task reports its lineage per period (:func:`emit_stream_period`, an
  OpenLineage RUNNING event of its run: the period's batches, counts and ranges, :func:`stream_facet`)
  and over its whole life (:func:`stream_lineage`, its COMPLETE event).
- **Assets**: :func:`output_places` gives each place's asset URI too, by the URI schemes of Airflow's
  providers (:func:`kafka_eos_airflow.assets.kafka.sink_asset`).

Imported by the tasks only: OpenLineage's client takes most of a second to import, which a DAG file's
parse must not pay. Without apache-airflow-providers-openlineage (the ``openlineage`` extra) the tasks
report no OpenLineage (:func:`run_lineage` and :func:`stream_lineage` answer None); the assets and
their events are Airflow's own and do not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

try:  # apache-airflow-providers-openlineage: the `openlineage` extra
    from airflow.providers.openlineage.extractors import OperatorLineage
except ImportError:  # not installed: the tasks report no OpenLineage (assets and their extra still)
    OperatorLineage = None
if OperatorLineage is not None:
    from airflow.providers.common.compat.openlineage.facet import (InputDataset, OutputDataset,
                                                                   OutputStatisticsOutputDatasetFacet, RunFacet)
else:
    RunFacet = object

from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

if TYPE_CHECKING:  # pragma: no cover
    from kafka_eos.plan import Plan

#: The ``kafkaEos`` facet's schema: described in docs/operations.md ("Lineage"); a URN, as kafka-eos
#: publishes no schema document at a URL of its own.
FACET_SCHEMA_URL = "urn:kafka-eos:openlineage:KafkaEosRunFacet:1"


@attr.define
class KafkaEosRunFacet(RunFacet):
    """A kafka-eos run: what it read (the offset ranges, per partition), how it committed and what
    came of it. ``mode`` is ``live``, ``replay`` or ``backfill`` (side runs write to their own places)."""

    pipeline: str
    mode: str
    commitScope: str  # noqa: N815 - OpenLineage facets' field names are camelCase
    sink: str
    status: str | None
    recordsIn: int  # noqa: N815
    recordsOut: int  # noqa: N815
    deadLetters: int  # noqa: N815
    ranges: list[dict[str, Any]] = attr.field(factory=list)
    skipped: list[dict[str, Any]] = attr.field(factory=list)
    sideKey: str | None = None  # noqa: N815
    #: A stream's: its batches committed, and the period they are counted over (ISO times).
    batches: int | None = None
    periodStart: str | None = None  # noqa: N815
    periodEnd: str | None = None  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return FACET_SCHEMA_URL


def kafka_server(settings: KafkaSettings) -> str:
    """The first bootstrap server, ``host:port``: what OpenLineage's Kafka namespace and Airflow's
    ``kafka://`` asset URIs name a cluster by."""
    return settings.bootstrap_servers.split(",")[0].strip()


def _sql_place(url: str, table: str) -> tuple[str, str, str]:
    """(OpenLineage namespace, OpenLineage name, asset URI) of ``table`` in the database at ``url``;
    the URL's credentials never appear."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    backend = u.get_backend_name()
    schema, _, name = table.rpartition(".")
    if backend == "sqlite":
        path = u.database or ":memory:"
        return f"sqlite://{path}", table, f"sqlite:///{path.lstrip('/')}/{table}"
    host = f"{u.host or 'localhost'}:{u.port or {'postgresql': 5432, 'mysql': 3306}.get(backend, 0)}"
    if backend == "postgresql":
        schema = schema or "public"
        return f"postgres://{host}", f"{u.database}.{schema}.{name}", f"postgres://{host}/{u.database}/{schema}/{name}"
    return f"{backend}://{host}", f"{u.database}.{table}", f"{backend}://{host}/{u.database}/{table}"


def output_places(spec: PipelineSpec, settings: KafkaSettings) -> list[tuple[str, str, str, str]]:
    """``(role, namespace, name, asset URI)`` of what a run of ``spec`` writes: its sink (``output``)
    and its dead-letter places (``dead_letters``). ``spec`` is the run's own: a side run's writes
    to the side places."""
    sink, server = spec.sink, kafka_server(settings)
    places = []
    if sink.kind == "kafka":
        places.append(("output", f"kafka://{server}", sink.topic, f"kafka://{server}/{sink.topic}"))
    elif sink.kind == "iceberg":
        from kafka_eos.sinks.iceberg_store import IcebergStore
        from kafka_eos.sinks.sql_store import database_url

        places += IcebergStore(spec, database_url(spec, settings)).places()
    else:
        from kafka_eos.sinks.sql_store import database_url

        url = database_url(spec, settings)  # the database the sink wrote (its credentials never shown)
        places.append(("output", *_sql_place(url, sink.table)))
        places.append(("dead_letters", *_sql_place(url, sink.dead_letters_table)))
    if sink.dlq_topic and sink.dlq_topic != sink.topic:
        places.append(("dead_letters", f"kafka://{server}", sink.dlq_topic, f"kafka://{server}/{sink.dlq_topic}"))
    return places


def run_facet(spec: PipelineSpec, plan: Plan, summary: dict[str, Any], mode: str,
              side_key: str | None) -> KafkaEosRunFacet:
    """The ``kafkaEos`` run facet of a verified run (``summary``: the verify task's)."""
    return KafkaEosRunFacet(
        pipeline=spec.name, mode=mode, commitScope=spec.sink.commit, sink=spec.sink.kind,
        status=summary.get("status"), recordsIn=summary["records_in"], recordsOut=summary["records_out"],
        deadLetters=summary["dead_letters"], sideKey=side_key,
        ranges=[{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until}
                for r in plan.active],
        skipped=[{"topic": s.topic, "partition": s.partition, "from": s.from_offset, "until": s.until}
                 for s in plan.skipped])


def asset_extra(summary: dict[str, Any], plan: Plan, mode: str, side_key: str | None) -> dict[str, Any]:
    """The extra of a sink's asset event: the run, its counts and the ranges it read."""
    return {"pipeline": summary["pipeline"], "run_id": summary["run_id"], "mode": mode, "side_key": side_key,
            "records_in": summary["records_in"], "records_out": summary["records_out"],
            "dead_letters": summary["dead_letters"],
            "ranges": [[r.topic, r.partition, r.from_offset, r.until] for r in plan.active]}


def datasets(spec: PipelineSpec, settings: KafkaSettings, records_out: int,
             dead_letters: int) -> tuple[list[InputDataset], list[OutputDataset]]:
    """The OpenLineage inputs (the source topics) and outputs (the sink and the dead-letter places,
    with the rows written to each) of a run of ``spec``."""
    server = kafka_server(settings)
    inputs = [InputDataset(namespace=f"kafka://{server}", name=t) for t in spec.source.topics]
    counts = {"output": records_out, "dead_letters": dead_letters}
    outputs = [OutputDataset(namespace=ns, name=name, outputFacets={
                   "outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=counts[role])})
               for role, ns, name, _uri in output_places(spec, settings)]
    return inputs, outputs


def run_lineage(spec: PipelineSpec, settings: KafkaSettings, plan: Plan, summary: dict[str, Any], mode: str,
                side_key: str | None):
    """The OpenLineage of a verified run: inputs, outputs (with their row counts) and the run facet;
    None without the OpenLineage provider."""
    if OperatorLineage is None:
        return None
    inputs, outputs = datasets(spec, settings, summary["records_out"], summary["dead_letters"])
    return OperatorLineage(inputs=inputs, outputs=outputs,
                           run_facets={"kafkaEos": run_facet(spec, plan, summary, mode, side_key)})


def stream_facet(spec: PipelineSpec, figures: list[dict[str, Any]], period_start: str,
                 period_end: str) -> KafkaEosRunFacet:
    """The ``kafkaEos`` facet of a stream over a period: its batches' counts (``mode`` ``stream``) and
    the ranges they read, joined per partition (the first batch's start to the last one's end)."""
    spans: dict[tuple[str, int], list[int]] = {}
    for f in figures:
        for topic, partition, start, until in f.get("ranges", []):
            span = spans.setdefault((topic, partition), [start, until])
            span[0], span[1] = min(span[0], start), max(span[1], until)
    done = [f for f in figures if f["status"] != "failed"]
    return KafkaEosRunFacet(
        pipeline=spec.name, mode="stream", commitScope=spec.sink.commit, sink=spec.sink.kind, status="running",
        recordsIn=sum(f["records_in"] for f in done), recordsOut=sum(f["records_out"] for f in done),
        deadLetters=sum(f["dead_letters"] for f in done), batches=len(done), periodStart=period_start,
        periodEnd=period_end,
        ranges=[{"topic": t, "partition": p, "from": a, "until": b} for (t, p), (a, b) in sorted(spans.items())])


def stream_lineage(spec: PipelineSpec, settings: KafkaSettings, facet: KafkaEosRunFacet):
    """The OpenLineage of a stream task (its whole life: the COMPLETE event's); None without the
    OpenLineage provider."""
    if OperatorLineage is None:
        return None
    inputs, outputs = datasets(spec, settings, facet.recordsOut, facet.deadLetters)
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets={"kafkaEos": facet})


def emit_stream_period(context: Any, spec: PipelineSpec, settings: KafkaSettings, facet: KafkaEosRunFacet) -> None:
    """A RUNNING event of the stream task's OpenLineage run, for one period of its batches: what the
    provider's listener sends at the task's start and end, with the period's datasets and facet in
    between. Nothing when the provider is disabled (no transport configured) or not installed."""
    if OperatorLineage is None:
        return
    from datetime import datetime, timezone

    from airflow.providers.openlineage import conf as ol_conf
    from airflow.providers.openlineage.plugins.adapter import _PRODUCER, OpenLineageAdapter
    from airflow.providers.openlineage.plugins.listener import get_openlineage_listener
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState

    if ol_conf.is_disabled():
        return
    ti, dag_run = context["ti"], context["dag_run"]
    run_id = OpenLineageAdapter.build_task_instance_run_id(
        dag_id=ti.dag_id, task_id=ti.task_id, try_number=ti.try_number,
        logical_date=dag_run.logical_date or dag_run.run_after, map_index=ti.map_index)
    inputs, outputs = datasets(spec, settings, facet.recordsOut, facet.deadLetters)
    get_openlineage_listener().adapter.emit(RunEvent(
        eventType=RunState.RUNNING, eventTime=datetime.now(timezone.utc).isoformat(),
        run=Run(runId=run_id, facets={"kafkaEos": facet}),
        job=Job(namespace=ol_conf.namespace(), name=f"{ti.dag_id}.{ti.task_id}"),
        inputs=inputs, outputs=outputs, producer=_PRODUCER))
