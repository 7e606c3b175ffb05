"""Triggers of kafka-eos's deferrable sensors. They only read (a trigger may run twice): offsets,
checkpoints, the first record at an offset, and the transaction admin API's descriptions."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from kafka_eos.errors import BrokerError, BrokerUnreachable
from kafka_eos.health import DEFAULT_OLDER_THAN_S
from kafka_eos.spec import PipelineSpec, load_spec, parse_spec
from kafka_eos_airflow.hooks.kafka import KafkaEosHook

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

#: A look that fails because the cluster did not answer (a broker restarting, a leader moving) is
#: tried again at the next poll; a watchdog reports the cluster unreachable only when its looks have
#: failed this long in a row. Found by the soak: a killed partition leader made one look time out,
#: and the trigger's exception failed the watchdog with Airflow's bare "Trigger failure".
UNREACHABLE_AFTER_S = 300.0


def cluster_away(exc: BaseException) -> bool:
    """True for an error of a look that clears by itself: no answer in time, or a retriable Kafka
    error. A topic that does not exist, a refused authorization, a bad spec: raised as they are."""
    # Imported here: DAG files import this module, and parsing them must not load the Kafka client.
    from confluent_kafka import KafkaException

    from kafka_eos.kafka_admin import is_transient, is_transient_error

    if isinstance(exc, KafkaException):
        err = exc.args[0]
        return is_transient_error(err) or err.name() in ("_TRANSPORT", "_ALL_BROKERS_DOWN")
    return isinstance(exc, BrokerUnreachable) or (isinstance(exc, BrokerError) and is_transient(exc))


def spec_of(pipeline: str, document: dict | None) -> PipelineSpec:
    """The spec a trigger watches: parsed from the document it carries (its DAG's own version: the
    triggerer has no checkout of a versioned DAG bundle), else read from ``pipeline`` (a trigger
    serialized by kafka-eos 0.2)."""
    if document is not None:
        # Schema files are the Spark task's (it encodes the output); a look at offsets needs none.
        sink = {k: v for k, v in document["sink"].items() if k not in ("schema", "key_schema")}
        return parse_spec({**document, "sink": sink}, pipeline)
    return load_spec(pipeline, import_transform=False)


class Outage:
    """Looks that failed in a row: since when, and the last error."""

    def __init__(self, log) -> None:
        self.log = log
        self.since: float | None = None
        self.error = ""

    def failed(self, exc: Exception, poll_interval_s: float) -> float:
        """Note a failed look; returns how long looks have been failing.

        :raises Exception: ``exc`` itself, when it is no sign of the cluster being away."""
        if not cluster_away(exc):
            raise exc
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        self.error = str(exc)
        self.log.warning("the cluster did not answer (%s); looking again in %gs", self.error, poll_interval_s)
        return now - self.since

    def ended(self) -> None:
        if self.since is not None:
            self.log.info("the cluster answers again after %.0fs", time.monotonic() - self.since)
        self.since = None


class HungTransactionTrigger(BaseTrigger):
    """Watch partitions for an open transaction that holds their LSO longer than ``older_than_s``.

    Fires ``{"status": "stalled", "stalls": [...]}`` at the first such partition (attributed where
    the admin API allows), or ``{"status": "healthy", "partitions": n}`` once the partitions have
    stayed clear for ``healthy_for_s``. Between looks it keeps only its last observation. A look
    the cluster does not answer is tried again at the next poll; ``{"status": "unreachable"}`` once
    looks have failed for ``unreachable_after_s`` in a row.

    :param topics: the topics to watch (all their partitions).
    :param kafka_conn_id: the ``kafka`` connection (see :class:`~kafka_eos_airflow.hooks.kafka.KafkaEosHook`).
    :param missing_ok: those of ``topics`` that may not exist yet (a pipeline's topics before its
        first run: its run manifest, its backfill topic); watched once they do.
    """

    def __init__(self, topics: list[str], kafka_conn_id: str, older_than_s: float = DEFAULT_OLDER_THAN_S,
                 healthy_for_s: float = 300.0, poll_interval_s: float = 30.0,
                 pipelines: list[str] | None = None, missing_ok: list[str] | None = None,
                 unreachable_after_s: float = UNREACHABLE_AFTER_S, specs: list[dict] | None = None) -> None:
        super().__init__()
        self.topics = list(topics)
        self.unreachable_after_s = unreachable_after_s
        self.kafka_conn_id = kafka_conn_id
        self.older_than_s = older_than_s
        self.healthy_for_s = healthy_for_s
        self.poll_interval_s = poll_interval_s
        self.pipelines = list(pipelines or [])
        self.missing_ok = list(missing_ok or [])
        #: The pipelines' spec documents, in the order of ``pipelines`` (see :func:`spec_of`).
        self.specs = list(specs) if specs is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("kafka_eos_airflow.triggers.kafka.HungTransactionTrigger", {
            "topics": self.topics, "kafka_conn_id": self.kafka_conn_id, "older_than_s": self.older_than_s,
            "healthy_for_s": self.healthy_for_s, "poll_interval_s": self.poll_interval_s,
            "pipelines": self.pipelines, "missing_ok": self.missing_ok,
            "unreachable_after_s": self.unreachable_after_s, "specs": self.specs})

    def look(self, previous: dict[str, dict] | None) -> tuple[list, dict[str, dict], int]:
        """One look (blocking): the stalls found, the observation to keep, partitions checked."""
        from kafka_eos.health.attribute import attribute
        from kafka_eos.health.detect import observe, topic_partitions

        settings = KafkaEosHook(self.kafka_conn_id).get_settings()
        tps = topic_partitions(settings, self.topics, self.missing_ok)
        stalls, seen = observe(settings, tps, self.older_than_s, previous)
        documents = self.specs if self.specs is not None else [None] * len(self.pipelines)
        specs = [spec_of(p, d) for p, d in zip(self.pipelines, documents)]
        return attribute(settings, stalls, specs), seen, len(tps)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # {} not None: a partition whose age cannot be read is timed from this first look.
        started, previous, outage = time.monotonic(), {}, Outage(self.log)
        while True:
            try:
                # The clients block: off the event loop.
                stalls, previous, checked = await asyncio.to_thread(self.look, previous)
            except Exception as exc:  # noqa: BLE001 - failed() raises all but a cluster away
                # The last observation is kept: ages go on from it.
                failing_s = outage.failed(exc, self.poll_interval_s)
                if failing_s >= self.unreachable_after_s:
                    yield TriggerEvent({"status": "unreachable", "failing_s": round(failing_s), "error": outage.error})
                    return
                await asyncio.sleep(self.poll_interval_s)
                continue
            outage.ended()
            if stalls:
                yield TriggerEvent({"status": "stalled", "older_than_s": self.older_than_s,
                                    "stalls": [s.as_dict() for s in stalls],
                                    "summaries": [s.summary() for s in stalls]})
                return
            if time.monotonic() - started >= self.healthy_for_s:
                yield TriggerEvent({"status": "healthy", "partitions": checked, "healthy_for_s": self.healthy_for_s})
                return
            await asyncio.sleep(self.poll_interval_s)


def committed_data_waiting(pipeline: str, kafka_conn_id: str, spec: dict | None = None) -> list[dict]:
    """One look (blocking, read-only): the partitions of ``pipeline``'s source where committed
    records wait beyond its checkpoint, with checkpoint, LSO, lag and oldest unprocessed record
    (``spec``: its document, see :func:`spec_of`)."""
    from kafka_eos.health.backlog import backlog, waiting

    spec = spec_of(pipeline, spec)
    # A SQL sink's checkpoints from its Kafka mirror: the triggerer opens no sink's database.
    rows, _drift = backlog(spec, KafkaEosHook(kafka_conn_id).get_settings(), mirror=True)
    return waiting(rows)


class CommittedDataTrigger(BaseTrigger):
    """Fire when committed records wait beyond a pipeline's checkpoint: ``{"status": "available",
    "partitions": [...]}`` with each such partition's checkpoint, LSO, lag and oldest unprocessed
    record (:func:`kafka_eos.health.backlog.backlog`), or ``{"status": "timeout"}`` after
    ``timeout_s`` without any (with the last error when the cluster was not answering then); a look
    the cluster does not answer is tried again at the next poll. Aborted records and transaction
    markers are not data: a range that holds only those does not fire.

    :param pipeline: the pipeline (spec name or path).
    :param kafka_conn_id: the ``kafka`` connection (see :class:`~kafka_eos_airflow.hooks.kafka.KafkaEosHook`).
    :param spec: the spec's document (:func:`kafka_eos.spec.spec_document`), so the triggerer needs
        no file of the DAG's bundle.
    """

    def __init__(self, pipeline: str, kafka_conn_id: str, poll_interval_s: float = 30.0,
                 timeout_s: float | None = None, spec: dict | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.spec = spec

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("kafka_eos_airflow.triggers.kafka.CommittedDataTrigger", {
            "pipeline": self.pipeline, "kafka_conn_id": self.kafka_conn_id,
            "poll_interval_s": self.poll_interval_s, "timeout_s": self.timeout_s, "spec": self.spec})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started, outage = time.monotonic(), Outage(self.log)
        while True:
            try:
                found = await asyncio.to_thread(committed_data_waiting, self.pipeline, self.kafka_conn_id, self.spec)
            except Exception as exc:  # noqa: BLE001 - failed() raises all but a cluster away
                outage.failed(exc, self.poll_interval_s)
                found = []
            else:
                outage.ended()
            if found:
                yield TriggerEvent({"status": "available", "pipeline": self.pipeline, "partitions": found})
                return
            if self.timeout_s is not None and time.monotonic() - started >= self.timeout_s:
                away = {"error": outage.error} if outage.since is not None else {}
                yield TriggerEvent({"status": "timeout", "pipeline": self.pipeline, "timeout_s": self.timeout_s,
                                    **away})
                return
            await asyncio.sleep(self.poll_interval_s)


class CommittedDataEventTrigger(BaseEventTrigger):
    """The watcher of a pipeline's source asset (``schedule: stream``): fires
    ``{"status": "available", "pipeline": …, "partitions": [...]}`` whenever committed records wait
    beyond the pipeline's checkpoint, each time they wait up to a new LSO; the same backlog fires
    again only after ``refire_after_s`` (a run that failed is given another chance). Runs as long as
    the asset is watched.

    It only reads (offsets, the group's checkpoint, the first record after it, read_committed):
    aborted records and commit markers are offsets but not data and never fire it, records behind
    an open transaction are not readable yet, and it never commits offsets (the Kafka provider's
    message-queue triggers consume and commit, which would move no checkpoint of ours but could
    not tell committed data from the pipeline's progress).

    :param pipeline: the pipeline (spec name or path).
    :param kafka_conn_id: the ``kafka`` connection (see :class:`~kafka_eos_airflow.hooks.kafka.KafkaEosHook`).
    :param poll_interval_s: how often it looks; the asset's latency is about this plus a DAG run.
    :param spec: the spec's document (see :class:`CommittedDataTrigger`).
    """

    def __init__(self, pipeline: str, kafka_conn_id: str, poll_interval_s: float = 5.0,
                 refire_after_s: float = 300.0, spec: dict | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id
        self.poll_interval_s = poll_interval_s
        self.refire_after_s = refire_after_s
        self.spec = spec

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("kafka_eos_airflow.triggers.kafka.CommittedDataEventTrigger", {
            "pipeline": self.pipeline, "kafka_conn_id": self.kafka_conn_id,
            "poll_interval_s": self.poll_interval_s, "refire_after_s": self.refire_after_s, "spec": self.spec})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        fired: dict[str, int] = {}  # how far (LSO) each partition's backlog reached when it last fired
        fired_at, outage = 0.0, Outage(self.log)
        while True:
            try:
                found = await asyncio.to_thread(committed_data_waiting, self.pipeline, self.kafka_conn_id, self.spec)
            except Exception as exc:  # noqa: BLE001 - failed() raises all but a cluster away
                # A watcher runs as long as its asset is watched: a cluster away never ends it.
                outage.failed(exc, self.poll_interval_s)
                await asyncio.sleep(self.poll_interval_s)
                continue
            outage.ended()
            reach = {f"{p['topic']}-{p['partition']}": p["lso"] for p in found}
            new_data = any(lso > fired.get(tp, -1) for tp, lso in reach.items())
            if found and (new_data or time.monotonic() - fired_at >= self.refire_after_s):
                fired, fired_at = {**fired, **reach}, time.monotonic()
                yield TriggerEvent({"status": "available", "pipeline": self.pipeline, "partitions": found})
            await asyncio.sleep(self.poll_interval_s)
