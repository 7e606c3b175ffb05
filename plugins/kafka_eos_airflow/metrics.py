"""kafka-eos's figures through Airflow's own metrics (``airflow.sdk.observability.stats``), so whatever a
deployment configured in ``[metrics]`` (StatsD, Datadog, OpenTelemetry) carries them.

Every figure is sent twice, as Airflow does with its own metrics: once named ``kafka_eos.<metric>``
with tags (``pipeline`` and more; OpenTelemetry, Datadog and StatsD with InfluxDB tags keep them),
and once named ``kafka_eos.<metric>.<pipeline>`` without tags (plain StatsD drops tags: the
pipeline has to be in the name). Names, tags and meanings: docs/operations.md ("Metrics").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk.observability import stats

PREFIX = "kafka_eos"


def _send(kind: str, metric: str, value: float, pipeline: str, tags: dict[str, Any]) -> None:
    send = getattr(stats, kind)
    tagged = {"pipeline": pipeline, **{k: str(v) for k, v in tags.items()}}
    send(f"{PREFIX}.{metric}", value, tags=tagged)
    send(f"{PREFIX}.{metric}.{stats.normalize_name_for_stats(pipeline, log_warning=False)}", value)


def count(metric: str, n: int, pipeline: str, **tags: Any) -> None:
    """A counter: ``n`` more (records, refreshes)."""
    _send("incr", metric, n, pipeline, tags)


def gauge(metric: str, value: float, pipeline: str, **tags: Any) -> None:
    """A gauge: the value now (lag, age, partitions held)."""
    _send("gauge", metric, value, pipeline, tags)


def timing(metric: str, ms: float, pipeline: str, **tags: Any) -> None:
    """A duration in milliseconds (commit, plan to commit, stream batch)."""
    _send("timing", metric, ms, pipeline, tags)


def _ms_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() * 1000


def run_metrics(summary: dict[str, Any], record: dict[str, Any], plan_created_at: str | None, mode: str,
                scope: str) -> None:
    """A verified run's figures: records in, out and dead-lettered; the commit's duration (the Spark
    run's start to its commit) and the plan's age at the commit. ``record``: the run's manifest record."""
    pipeline, tags = summary["pipeline"], {"mode": mode, "scope": scope, "sink": summary["sink"]}
    for metric in ("records_in", "records_out", "dead_letters"):
        count(f"run.{metric}", summary[metric], pipeline, **tags)
    if record.get("status") != "committed":
        return  # an empty run, or one an earlier attempt committed: no commit of this run to time
    commit_ms = _ms_between(record.get("started_at"), record.get("committed_at"))
    if commit_ms is not None:
        timing("run.commit_duration", commit_ms, pipeline, **tags)
    plan_ms = _ms_between(plan_created_at, record.get("committed_at"))
    if plan_ms is not None:
        timing("run.plan_to_commit", plan_ms, pipeline, **tags)
