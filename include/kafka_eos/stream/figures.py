"""A stream's figures per batch, for whoever watches it.

:class:`~kafka_eos.stream.loop.StreamRunner` hands each batch's :func:`batch_figures` to an observer:

- outside Airflow, ``kafka-eos stream --metrics-port PORT`` serves them to Prometheus
  (:class:`PrometheusFigures`, prometheus-client): a stream is one long-lived process, which is what
  Prometheus scrapes; nothing else (no collector, no push gateway) has to run beside it;
- under Airflow, the stream DAG's task reads the lines :func:`figures_line` prints (``--figures``) and
  sends them through Airflow's own metrics (StatsD or OpenTelemetry, as the deployment set), so the
  stream's process never imports Airflow.

Names and meanings: docs/operations.md ("Metrics").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kafka_eos.errors import KafkaEosError

if TYPE_CHECKING:  # pragma: no cover
    from kafka_eos.batch import RunSummary

#: What starts a figures line in the stream's output (:func:`figures_line`, :func:`parse_figures_line`).
FIGURES_PREFIX = "KAFKA_EOS_FIGURES "
#: Batch latency buckets (seconds): a stream's batch takes from a fraction of a second to tens.
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


def batch_figures(pipeline: str, batch: int, summary: RunSummary, plan_s: float) -> dict[str, Any]:
    """One committed batch: its counts, its latency (plan start to commit) in seconds, and the
    ranges it read (``[topic, partition, from, until]``)."""
    return {"pipeline": pipeline, "batch": batch, "status": summary.status, "records_in": summary.records_in,
            "records_out": summary.records_out, "dead_letters": summary.dead_letters,
            "latency_s": round(summary.seconds + plan_s, 4), "plan_s": round(plan_s, 4),
            "ranges": [[r["topic"], r["partition"], r["from"], r["until"]] for r in summary.ranges
                       if r["until"] != r["from"]]}


def failed_figures(pipeline: str, batch: int) -> dict[str, Any]:
    """A batch that failed (it is planned and run again)."""
    return {"pipeline": pipeline, "batch": batch, "status": "failed"}


def figures_line(figures: dict[str, Any]) -> str:
    """The figures as one line of the stream's output, for the Airflow task that runs it."""
    return FIGURES_PREFIX + json.dumps(figures, sort_keys=True)


def parse_figures_line(line: str) -> dict[str, Any] | None:
    """The figures of a :func:`figures_line`; None for any other line."""
    if not line.startswith(FIGURES_PREFIX):
        return None
    return json.loads(line[len(FIGURES_PREFIX):])


class PrometheusFigures:
    """The stream's figures on an HTTP endpoint Prometheus scrapes (``/metrics``), with the label
    ``pipeline``:

    - ``kafka_eos_stream_batches_total{status}`` (committed, noop, failed),
    - ``kafka_eos_stream_records_in_total``, ``_records_out_total``, ``_dead_letters_total``,
    - ``kafka_eos_stream_batch_latency_seconds`` (a histogram: plan start to commit),
    - ``kafka_eos_stream_last_commit_timestamp_seconds``.

    :param port: the port to listen on; :param addr: the address (loopback unless told otherwise:
        an endpoint on every interface is a deployment's choice).
    """

    def __init__(self, pipeline: str, port: int, addr: str = "127.0.0.1") -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
        except ImportError:
            raise KafkaEosError("--metrics-port: needs prometheus-client (pip install 'kafka-eos[metrics]')") from None

        self.pipeline = pipeline
        self.registry = CollectorRegistry()
        labels = ["pipeline"]
        self.batches = Counter("kafka_eos_stream_batches", "Batches of the stream, by outcome",
                               [*labels, "status"], registry=self.registry)
        self.records = {k: Counter(f"kafka_eos_stream_{k}", f"Records: {k.replace('_', ' ')}", labels,
                                   registry=self.registry) for k in ("records_in", "records_out", "dead_letters")}
        self.latency = Histogram("kafka_eos_stream_batch_latency_seconds", "A batch's plan start to its commit",
                                 labels, buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.last_commit = Gauge("kafka_eos_stream_last_commit_timestamp_seconds", "When a batch last committed",
                                 labels, registry=self.registry)
        self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)

    def __call__(self, figures: dict[str, Any]) -> None:
        p = self.pipeline
        self.batches.labels(p, figures["status"]).inc()
        if figures["status"] == "failed":
            return
        for k, counter in self.records.items():
            counter.labels(p).inc(figures[k])
        self.latency.labels(p).observe(figures["latency_s"])
        self.last_commit.labels(p).set_to_current_time()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
