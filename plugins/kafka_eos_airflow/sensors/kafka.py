"""Deferrable sensors over Kafka partitions. They defer to read-only triggers
(:mod:`kafka_eos_airflow.triggers.kafka`) and decide in ``execute_complete``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSensorTimeout, AirflowSkipException

from kafka_eos.health import spec_topics, watch_threshold_s
from kafka_eos.spec import load_spec, spec_document

from kafka_eos_airflow import config
from kafka_eos_airflow.notifications.alerts import HungTransactionsFound
from kafka_eos_airflow.triggers.kafka import CommittedDataTrigger, HungTransactionTrigger

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context


def pipeline_topics(pipeline: str) -> list[str]:
    """Every topic a pipeline reads or writes: sources, sink, dead letters, backfills, its manifest."""
    return spec_topics(load_spec(pipeline, import_transform=False))




class HungTransactionSensor(BaseSensorOperator):
    """Fail when an open transaction holds a watched partition's LSO longer than ``older_than_s``;
    succeed when the partitions stay clear for ``healthy_for_s``.

    The failure names every held partition: LSO and high watermark, how long, the producer and
    transactional.id holding it (where Kafka's admin API permits), and the command that aborts it.

    :param topics: topics to watch. (templated)
    :param pipelines: pipelines (spec names or paths) whose topics are watched too; their own
        transactions are named as theirs. (templated)
    :param older_than_s: how long a transaction may hold a partition (default: the longest
        ``sink.transaction_timeout_s`` of ``pipelines`` plus a minute, at least 360 s: longer than a
        kafka-eos transaction of theirs may stay open).
    :param healthy_for_s: how long the partitions must stay clear for success.
    :param poll_interval_s: seconds between two looks.
    :param kafka_conn_id: the ``kafka`` connection. (templated)
    """

    template_fields: Sequence[str] = ("topics", "pipelines", "kafka_conn_id")

    def __init__(self, *, topics: Sequence[str] = (), pipelines: Sequence[str] = (),
                 older_than_s: float | None = None, healthy_for_s: float = 300.0,
                 poll_interval_s: float = 30.0, kafka_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topics = list(topics)
        self.pipelines = list(pipelines)
        self.older_than_s = older_than_s
        self.healthy_for_s = healthy_for_s
        self.poll_interval_s = poll_interval_s
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def execute(self, context: Context) -> None:
        specs = [load_spec(p, import_transform=False) for p in self.pipelines]  # each file read once
        derived = [t for spec in specs for t in spec_topics(spec)]
        topics = list(dict.fromkeys([*self.topics, *derived]))
        # A pipeline's topics may not exist before its first run (its manifest is made by the first
        # commit): watched once they do. A topic named in ``topics`` must exist.
        missing_ok = [t for t in dict.fromkeys(derived) if t not in self.topics]
        if not topics:
            raise AirflowFailException(f"{self.task_id}: no topics to watch (give topics or pipelines)")
        older_than_s = self.older_than_s
        if older_than_s is None:
            older_than_s = watch_threshold_s(spec.sink.transaction_timeout_s for spec in specs)
        self.log.info("watching %d topic(s) for transactions open longer than %gs", len(topics), older_than_s)
        self.defer(
            trigger=HungTransactionTrigger(topics, self.kafka_conn_id, older_than_s, self.healthy_for_s,
                                           self.poll_interval_s, self.pipelines, missing_ok,
                                           specs=[spec_document(spec) for spec in specs]),
            method_name="execute_complete",
            # The trigger ends by itself after healthy_for_s; the margin covers slow looks.
            timeout=timedelta(seconds=self.healthy_for_s + 10 * self.poll_interval_s + 600))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        stalls = event.get("stalls", [])
        self._pinned_metrics(stalls, event["status"])
        if event["status"] == "unreachable":
            raise AirflowException(f"{self.task_id}: the cluster of connection {self.kafka_conn_id!r} did not answer for "
                                   f"{event['failing_s']}s; no partition could be checked: {event['error']}")
        if event["status"] == "stalled":
            raise HungTransactionsFound(
                f"{len(event['stalls'])} partition(s) held by an open transaction for longer than "
                f"{event['older_than_s']:g}s (read_committed readers stop there): " + " | ".join(event["summaries"]),
                event["stalls"])
        self.log.info("%d partition(s) clear of long open transactions for %ss", event["partitions"],
                      event["healthy_for_s"])
        return event

    def _pinned_metrics(self, stalls: list[dict[str, Any]], status: str) -> None:
        """Per pipeline: how many of its partitions an open transaction holds and for how long the
        oldest has been held (0 when none); each stall learns the pipelines that use its topic."""
        from kafka_eos_airflow import metrics

        for pipeline in self.pipelines:
            try:
                spec = load_spec(pipeline, import_transform=False)  # once: its name and its topics
                name, topics = spec.name, set(spec_topics(spec))
            except Exception as exc:  # noqa: BLE001 - a spec changed since the watch began: the alert goes on
                self.log.warning("%s: not counted in the metrics: %s", pipeline, exc)
                continue
            held = [s for s in stalls if s["topic"] in topics]
            for s in held:
                s.setdefault("pipelines", []).append(name)
            if status != "unreachable":  # an unanswered look measured nothing
                metrics.gauge("watchdog.pinned_partitions", len(held), name)
                metrics.gauge("watchdog.pinned_max_age_s", max((s["stuck_s"] or 0 for s in held), default=0), name)

    def poke(self, context: Context) -> bool:  # pragma: no cover - execute() defers instead
        raise NotImplementedError("HungTransactionSensor is deferrable only")


class CommittedDataSensor(BaseSensorOperator):
    """Wait until committed records wait beyond a pipeline's checkpoint; a gate in front of a run
    that would otherwise start Spark for nothing.

    Succeeds with the partitions that hold such records (their checkpoint, LSO, lag and the
    oldest unprocessed record, as XCom). After ``timeout`` seconds without any it fails, or is
    skipped with ``soft_fail=True`` (and so are the tasks behind it). Records of aborted
    transactions do not count; neither do records held behind an open transaction (the LSO).

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param poll_interval_s: seconds between two looks.
    :param kafka_conn_id: the ``kafka`` connection. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "kafka_conn_id")

    def __init__(self, *, pipeline: str, poll_interval_s: float = 30.0,
                 kafka_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.poll_interval_s = poll_interval_s
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def execute(self, context: Context) -> None:
        timeout_s = float(self.timeout)
        spec = spec_document(load_spec(self.pipeline, import_transform=False))  # the triggerer reads no file
        self.defer(trigger=CommittedDataTrigger(self.pipeline, self.kafka_conn_id, self.poll_interval_s, timeout_s,
                                                spec=spec),
                   method_name="execute_complete",
                   # The trigger times out by itself; this margin only covers slow looks.
                   timeout=timedelta(seconds=timeout_s + 10 * self.poll_interval_s + 600))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> list[dict[str, Any]]:
        if event["status"] == "timeout":
            message = (f"pipeline {event['pipeline']}: no committed records beyond its checkpoint within "
                       f"{event['timeout_s']:g}s")
            if event.get("error"):
                message += f" (the cluster was not answering: {event['error']})"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        for r in event["partitions"]:
            self.log.info("%s-%d: committed records wait from offset %s (checkpoint %s, LSO %s, lag %s, oldest %ss)",
                          r["topic"], r["partition"], r["oldest_unprocessed"]["offset"], r["checkpoint"], r["lso"],
                          r["lag"], r["oldest_unprocessed"]["age_s"])
        return event["partitions"]

    def poke(self, context: Context) -> bool:  # pragma: no cover - execute() defers instead
        raise NotImplementedError("CommittedDataSensor is deferrable only")
