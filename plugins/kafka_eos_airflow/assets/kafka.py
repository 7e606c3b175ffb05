"""A pipeline's Airflow assets.

- Its source: committed records waiting beyond its checkpoint. A spec with ``schedule: stream`` gets
  a DAG scheduled on this asset; the asset's watcher is a
  :class:`~kafka_eos_airflow.triggers.kafka.CommittedDataEventTrigger` that the triggerer runs as long as
  the DAG exists.
- Its sink: the place its runs write, by the URI schemes of Airflow's providers:
  ``kafka://{bootstrap server}/{topic}`` (apache-airflow-providers-apache-kafka's ``create_asset``),
  ``postgres://{host}:{port}/{database}/{schema}/{table}`` (the Postgres provider's),
  ``mysql://{host}:{port}/{database}/{table}``, ``sqlite:///{file}/{table}``. The cluster's address
  is known only when a task runs (it comes from the Airflow connection), so the pipeline DAG declares
  an asset alias (:func:`sink_alias`) and its verify task adds the resolved asset (:func:`sink_asset`).

Built at parse time: nothing here touches Kafka.
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias, AssetWatcher

from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec, spec_document
from kafka_eos_airflow.triggers.kafka import CommittedDataEventTrigger

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

#: How often the watcher looks for committed records beyond the checkpoint: a few seconds keeps
#: the event-driven latency well under a minute (a DAG run's own start-up takes longer).
WATCH_INTERVAL_S = 5.0


def source_asset(spec: PipelineSpec, kafka_conn_id: str) -> Asset:
    """``kafka-eos://<pipeline>/source``, watched for committed records to process."""
    # The spec's document, not only its path: the triggerer has no checkout of a versioned bundle.
    trigger = CommittedDataEventTrigger(spec.path, kafka_conn_id, poll_interval_s=WATCH_INTERVAL_S,
                                        spec=spec_document(spec))
    return Asset(name=f"kafka-eos.{spec.name}.source", uri=f"kafka-eos://{spec.name}/source",
                 group="kafka-eos", watchers=[AssetWatcher(name=f"kafka-eos.{spec.name}.committed", trigger=trigger)])


def sink_alias(pipeline: str) -> AssetAlias:
    """The alias the pipeline DAG declares as its outlet: its verify task adds the sink's asset."""
    return AssetAlias(name=f"kafka-eos.{pipeline}.sink", group="kafka-eos")


def sink_asset(spec: PipelineSpec, settings: KafkaSettings) -> Asset:
    """The Airflow asset of the place a run of ``spec`` writes its results to."""
    from kafka_eos_airflow.lineage import kafka_server, output_places

    if spec.sink.kind == "kafka":
        from airflow.providers.apache.kafka.assets.kafka import create_asset

        return create_asset(server=kafka_server(settings), topic=spec.sink.topic)
    _role, _ns, _name, uri = output_places(spec, settings)[0]
    return Asset(uri=uri)
