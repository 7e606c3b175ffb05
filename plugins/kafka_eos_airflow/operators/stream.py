"""A stream under Airflow: one long-running task that runs ``kafka-eos stream`` and stays up as long
as the stream does (docs/stream.md). The task's retries restart a stream that died (from its
checkpoint); its failure callbacks alert when it stays down. Killing the task (mark failed, clear)
sends the stream SIGTERM: the batch in flight finishes and nothing stays open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from kafka_eos.errors import EXIT_HELD
from kafka_eos.spec import load_spec
from kafka_eos.stream import DEFAULT_INTERVAL_S, PARENT_PID_ENV
from kafka_eos.stream.figures import parse_figures_line

from kafka_eos_airflow import config
from kafka_eos_airflow.hooks.kafka import KafkaEosHook
from kafka_eos_airflow.operators.pipeline import executor_python

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

#: How long a stream may take to finish its batch in flight after SIGTERM before it is killed.
STOP_GRACE_S = 120.0


#: A stream's lineage every 5 minutes: a catalogue sees it alive and what it read, without an
#: event per batch (at a batch a second, 86,400 runs a day of one unchanged job).
LINEAGE_PERIOD_S = 300.0


class StreamPeriods:
    """A stream task's batches, reported to OpenLineage once per ``lineage_period_s``."""

    def __init__(self, task: "KafkaEosStreamOperator", context: Any, settings: Any) -> None:
        self.task, self.context, self.settings = task, context, settings
        self.spec = load_spec(task.pipeline, import_transform=False)
        self.started = self.period_started = _now()
        self.began = time.monotonic()
        self.all: list[dict[str, Any]] = []
        self.period: list[dict[str, Any]] = []

    def add(self, figures: dict[str, Any]) -> None:
        from kafka_eos_airflow import lineage

        self.all.append(figures)
        self.period.append(figures)
        if time.monotonic() - self.began < self.task.lineage_period_s:
            return
        now = _now()
        try:
            lineage.emit_stream_period(self.context, self.spec, self.settings,
                                       lineage.stream_facet(self.spec, self.period, self.period_started, now))
        except Exception as exc:  # noqa: BLE001 - lineage must never stop a stream
            self.task.log.warning("stream lineage not reported: %s", exc)
        self.period, self.period_started, self.began = [], now, time.monotonic()

    def whole(self):
        """The whole stream's lineage (its task's COMPLETE event)."""
        from kafka_eos_airflow import lineage

        facet = lineage.stream_facet(self.spec, self.all, self.started, _now())
        facet.status = "stopped"
        return lineage.stream_lineage(self.spec, self.settings, facet)


def _now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def stream_metrics(figures: dict[str, Any]) -> None:
    """A stream batch's figures (:mod:`kafka_eos.stream.figures`) through Airflow's metrics: batches
    committed and failed, records in/out/dead-lettered and the batch's latency (plan start to commit)."""
    from kafka_eos_airflow import metrics

    pipeline = figures["pipeline"]
    if figures["status"] == "failed":
        metrics.count("stream.failed_batches", 1, pipeline)
        return
    metrics.count("stream.batches", 1, pipeline)
    for k in ("records_in", "records_out", "dead_letters"):
        metrics.count(f"stream.{k}", figures[k], pipeline)
    metrics.timing("stream.batch_latency", figures["latency_s"] * 1000, pipeline)


class KafkaEosStreamOperator(BaseOperator):
    """Run ``kafka-eos stream PIPELINE`` in a process of its own until it stops.

    Kafka settings reach it through the environment and a private file it names (never argv);
    each line it logs per batch goes to the task's log. Exit 0 (stopped, or caught up with
    ``until_caught_up``) is success; anything else fails the task with the stream's last line, and
    exit 4 (a range committed short: the pipeline is held until acknowledged) without retries.

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param kafka_conn_id: the ``kafka`` connection (see :class:`KafkaEosHook`). (templated)
    :param interval_s: least time between two batches' starts. (templated)
    :param until_caught_up: stop at the first batch with nothing to read (drain and stop);
        the run's ``until_caught_up`` param sets it too.
    :param spark_conn_id: the Spark connection whose master the stream's Spark application uses
        (the one the pipeline's batch DAG submits to); without that connection, ``SPARK_MASTER``
        or local mode. The driver runs in this task.
    :param lineage_period_s: how often the task reports the stream's lineage (an OpenLineage
        RUNNING event of its run: the period's batches, records and offset ranges); its COMPLETE
        event has the whole stream's.

    Each batch's figures also go to Airflow's metrics (:func:`stream_metrics`).
    """

    template_fields: Sequence[str] = ("pipeline", "kafka_conn_id", "interval_s")

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = None,
                 interval_s: float | str = DEFAULT_INTERVAL_S, until_caught_up: bool = False,
                 spark_conn_id: str | None = None, lineage_period_s: float = LINEAGE_PERIOD_S,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.lineage_period_s = lineage_period_s
        self._lineage = None
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()
        self.spark_conn_id = spark_conn_id or config.spark_conn_id()
        self.interval_s = interval_s
        self.until_caught_up = until_caught_up
        self._proc: subprocess.Popen | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        interval = float(self.interval_s)
        drain = self.until_caught_up or bool(context["params"].get("until_caught_up"))
        spec = load_spec(self.pipeline, import_transform=False)
        settings = KafkaEosHook(self.kafka_conn_id).get_pipeline_settings(spec, registry=True)
        command = [sys.executable, "-m", "kafka_eos.cli", "stream", self.pipeline, "--interval", f"{interval:g}",
                   "--figures", *(["--until-caught-up"] if drain else [])]
        with tempfile.TemporaryDirectory(prefix="kafka-eos-stream-") as tmp:
            # The stream's own session (on_kill signals it alone), but not its own life: it stops
            # once this task's process is gone (a worker killed under it), not as an orphan that
            # holds the pipeline's lease while the task's retry waits for it.
            env = {**os.environ, **settings.to_environ(Path(tmp) / "client.json"), **self._spark_master(spec),
                   PARENT_PID_ENV: str(os.getpid())}
            self.log.info("starting: %s", " ".join(command))
            self._proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True)
            last = ""
            period = StreamPeriods(self, context, settings)
            for line in self._proc.stdout:
                figures = parse_figures_line(line)
                if figures is not None:  # a batch's figures: to Airflow's metrics and lineage, not to the log
                    stream_metrics(figures)
                    period.add(figures)
                    continue
                last = line.rstrip() or last
                self.log.info("%s", last)
            code = self._proc.wait()
            self._lineage = period.whole()
        if code == EXIT_HELD:  # a range committed short: restarting the stream cannot help
            raise AirflowFailException(f"kafka-eos stream {self.pipeline} exited with {code}: {last}")
        if code != 0:
            raise AirflowException(f"kafka-eos stream {self.pipeline} exited with {code}: {last}")
        return {"pipeline": self.pipeline, "stopped": last}

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """The stream's lineage over its whole life (apache-airflow-providers-openlineage calls it
        after :meth:`execute`)."""
        return self._lineage

    def _spark_master(self, spec) -> dict[str, str]:
        """``SPARK_MASTER`` from the Spark connection, resolved as Airflow's spark-submit hook does,
        and on a cluster master the executors' Python, named (:func:`executor_python`)."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        try:
            conn = BaseHook.get_connection(self.spark_conn_id)
        except AirflowNotFoundException:
            return {}  # the hook would fall back to YARN: keep SPARK_MASTER, or local mode
        if conn.conn_type == "spark_connect":
            # A stream is one long Spark application already: it pays its start once per stream.
            self.log.info("Spark connection %s is a Spark Connect server: the stream runs a Spark of its own "
                          "(SPARK_MASTER, or local mode)", self.spark_conn_id)
            return {}
        master = SparkSubmitHook(conn_id=self.spark_conn_id)._connection["master"]
        self.log.info("Spark master %s (connection %s)", master, self.spark_conn_id)
        return {"SPARK_MASTER": master, "PYSPARK_PYTHON": executor_python(spec, {}, {}, master, self.spark_conn_id)}

    def on_kill(self) -> None:
        """SIGTERM: the stream finishes its batch in flight and exits; killed after a grace period."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the next start aborts what it left open

