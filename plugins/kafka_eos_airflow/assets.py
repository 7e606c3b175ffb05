"""The Airflow asset of a pipeline's source: committed records waiting beyond its checkpoint.

A spec with ``schedule: stream`` gets a DAG scheduled on this asset; the asset's watcher is a
:class:`~kafka_eos_airflow.triggers.CommittedDataEventTrigger` that the triggerer runs as long as
the DAG exists. Built at parse time: nothing here touches Kafka.
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetWatcher

from kafka_eos.spec import PipelineSpec
from kafka_eos_airflow.triggers import CommittedDataEventTrigger

#: How often the watcher looks for committed records beyond the checkpoint: a few seconds keeps
#: the event-driven latency well under a minute (a DAG run's own start-up takes longer).
WATCH_INTERVAL_S = 5.0


def source_asset(spec: PipelineSpec, kafka_conn_id: str) -> Asset:
    """``kafka-eos://<pipeline>/source``, watched for committed records to process."""
    trigger = CommittedDataEventTrigger(spec.path, kafka_conn_id, poll_interval_s=WATCH_INTERVAL_S)
    return Asset(name=f"kafka-eos.{spec.name}.source", uri=f"kafka-eos://{spec.name}/source",
                 group="kafka-eos", watchers=[AssetWatcher(name=f"kafka-eos.{spec.name}.committed", trigger=trigger)])
