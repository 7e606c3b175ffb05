"""Checks that fail a task, and so alert (the DAG's failure notifiers), when a pipeline falls
behind: the freshness of its unprocessed committed records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from kafka_eos.errors import KafkaEosError, TopicMissing
from kafka_eos.spec import load_spec

from kafka_eos_airflow import config
from kafka_eos_airflow.hooks.kafka import KafkaEosHook
from kafka_eos_airflow.notifications.alerts import StaleDataFound

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context


class FreshnessCheckOperator(BaseOperator):
    """Fail when a pipeline's oldest unprocessed committed record is older than its spec's
    ``source.freshness_limit_s``, naming each such partition: its checkpoint, LSO, lag, and the
    record's offset and age; every pipeline's lag and oldest age go to the metrics
    (``kafka_eos.source.*``). Pipelines without a limit are not checked; a pipeline whose source
    topic does not exist yet has nothing to be late with. Returns the pipelines checked.

    :param pipelines: spec names or paths. (templated)
    :param kafka_conn_id: the ``kafka`` connection. (templated)
    """

    template_fields: Sequence[str] = ("pipelines", "kafka_conn_id")

    def __init__(self, *, pipelines: Sequence[str], kafka_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipelines = list(pipelines)
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def execute(self, context: Context) -> list[str]:
        from kafka_eos.health.backlog import backlog, stale

        settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings()
        found, errors, checked = [], [], []
        for pipeline in self.pipelines:
            try:
                spec = load_spec(pipeline, import_transform=False)
                rows, _drift = backlog(spec, KafkaEosHook.with_database(settings, spec))
            except TopicMissing as exc:
                self.log.info("%s: not checked: %s", pipeline, exc)
                continue
            except KafkaEosError as exc:  # one broken pipeline does not hide another's lateness
                errors.append(f"{pipeline}: {str(exc).splitlines()[0]}")
                continue
            backlog_metrics(spec.name, rows)
            if spec.source.freshness_limit_s is None:
                continue
            checked.append(spec.name)
            late = stale(spec, rows)
            found += late
            self.log.info("%s: %s", spec.name, "; ".join(s.summary() for s in late) or
                          f"fresh (limit {spec.source.freshness_limit_s}s)")
        if found:
            raise StaleDataFound(
                f"{len(found)} partition(s) hold committed records older than their pipeline's freshness limit: "
                + " | ".join(s.summary() for s in found) + "".join(f" | not checked: {e}" for e in errors),
                [s.as_dict() for s in found])
        if errors:
            raise AirflowException("freshness not checked: " + " | ".join(errors))
        return checked


def backlog_metrics(pipeline: str, rows: list[dict[str, Any]]) -> None:
    """A pipeline's lag to the LSO (committed records not processed yet, all partitions) and the age
    of its oldest unprocessed committed record (0 when none waits)."""
    from kafka_eos_airflow import metrics

    metrics.gauge("source.lag", sum(r["lag"] for r in rows), pipeline)
    metrics.gauge("source.oldest_unprocessed_age_s",
                  max((r["oldest_unprocessed"]["age_s"] for r in rows if r["oldest_unprocessed"]), default=0), pipeline)


class CheckpointRefreshOperator(BaseOperator):
    """Commit again, unchanged, every checkpoint of the pipelines that the brokers' offsets
    retention could expire before this task's next run: pipelines that run seldom (event-driven,
    manual) keep their checkpoints however long they wait. A pipeline that runs often refreshes
    its own checkpoints and is left alone, and so is a pipeline a stream owns (``"skipped:
    streaming (…)"``). Returns the partitions refreshed, per pipeline.

    :param pipelines: spec names or paths. (templated)
    :param next_in_s: how long until this task runs again (its DAG's interval, with room for a
        run that is late).
    :param kafka_conn_id: the ``kafka`` connection. (templated)
    """

    template_fields: Sequence[str] = ("pipelines", "kafka_conn_id")

    def __init__(self, *, pipelines: Sequence[str], next_in_s: float,
                 kafka_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipelines = list(pipelines)
        self.next_in_s = next_in_s
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def execute(self, context: Context) -> dict[str, list[str] | str]:
        from kafka_eos.pipeline import refresh_checkpoints

        from kafka_eos_airflow import metrics

        settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings()
        done, errors = {}, []
        for pipeline in self.pipelines:
            try:
                spec = load_spec(pipeline, import_transform=False)
                refreshed = refresh_checkpoints(spec, KafkaEosHook.with_database(settings, spec),
                                                next_in_s=self.next_in_s)
            except TopicMissing as exc:
                self.log.info("%s: not refreshed: %s", pipeline, exc)
                continue
            except KafkaEosError as exc:  # one broken pipeline does not keep another's checkpoints from refresh
                errors.append(f"{pipeline}: {str(exc).splitlines()[0]}")
                continue
            if refreshed.skipped:  # a stream owns it: its offsets are the stream's to commit
                done[spec.name] = f"skipped: {refreshed.skipped}"
                self.log.info("%s: %s", spec.name, done[spec.name])
                continue
            done[spec.name] = [f"{t}-{p}" for t, p in refreshed.partitions]
            metrics.count("checkpoint.refreshes", len(refreshed.partitions), spec.name)
            self.log.info("%s: %s", spec.name, f"refreshed {', '.join(done[spec.name])}" if refreshed.partitions
                          else "every checkpoint lives past the next refresh")
        if errors:
            raise AirflowException("checkpoints not refreshed: " + " | ".join(errors))
        return done
