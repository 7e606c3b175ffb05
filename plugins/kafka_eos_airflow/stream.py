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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from kafka_eos.stream.figures import parse_figures_line

from kafka_eos_airflow import config
from kafka_eos_airflow.hooks import KafkaEosHook

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

#: How long a stream may take to finish its batch in flight after SIGTERM before it is killed.
STOP_GRACE_S = 120.0


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
    ``until_caught_up``) is success; anything else fails the task with the stream's last line.

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param kafka_conn_id: the ``kafka`` connection (see :class:`KafkaEosHook`). (templated)
    :param interval_s: least time between two batches' starts. (templated)
    :param until_caught_up: stop at the first batch with nothing to read (drain and stop);
        the run's ``until_caught_up`` param sets it too.
    :param spark_conn_id: the Spark connection whose master the stream's Spark application uses
        (the one the pipeline's batch DAG submits to); without that connection, ``SPARK_MASTER``
        or local mode. The driver runs in this task.
    """

    template_fields: Sequence[str] = ("pipeline", "kafka_conn_id", "interval_s")

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = None,
                 interval_s: float | str = 1.0, until_caught_up: bool = False,
                 spark_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()
        self.spark_conn_id = spark_conn_id or config.spark_conn_id()
        self.interval_s = interval_s
        self.until_caught_up = until_caught_up
        self._proc: subprocess.Popen | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        interval = float(self.interval_s)
        drain = self.until_caught_up or bool(context["params"].get("until_caught_up"))
        settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings(registry=True)
        command = [sys.executable, "-m", "kafka_eos.cli", "stream", self.pipeline, "--interval", f"{interval:g}",
                   "--figures", *(["--until-caught-up"] if drain else [])]
        with tempfile.TemporaryDirectory(prefix="kafka-eos-stream-") as tmp:
            env = {**os.environ, **settings.to_environ(Path(tmp) / "client.json"), **self._spark_master()}
            self.log.info("starting: %s", " ".join(command))
            self._proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True)
            last = ""
            for line in self._proc.stdout:
                figures = parse_figures_line(line)
                if figures is not None:  # a batch's figures: to Airflow's metrics, not to the log
                    stream_metrics(figures)
                    continue
                last = line.rstrip() or last
                self.log.info("%s", last)
            code = self._proc.wait()
        if code != 0:
            raise AirflowException(f"kafka-eos stream {self.pipeline} exited with {code}: {last}")
        return {"pipeline": self.pipeline, "stopped": last}

    def _spark_master(self) -> dict[str, str]:
        """``SPARK_MASTER`` from the Spark connection, resolved as Airflow's spark-submit hook does."""
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
        return {"SPARK_MASTER": master}

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

