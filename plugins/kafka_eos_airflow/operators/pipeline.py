"""Thin, templated operators for one kafka-eos run: plan -> Spark -> verify (docs/architecture.md).

Every operator takes the pipeline (a spec name under include/pipelines/ or a YAML path) and a
Kafka connection id, builds its hook in ``execute()`` and calls the library. The plan lives in
the run manifest under the run id: the Spark task reads it from there (never from XCom, which
Airflow clears when a task is retried).

Library errors become task failures with the library's one-line message; the ones a retry
cannot fix (a bad spec, data loss, a recreated topic, a missing plan) fail without retrying.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import (AirflowException, AirflowFailException, AirflowNotFoundException,
                                     AirflowSkipException)

from kafka_eos.backfill.places import promote_caveat, side_branch, writes_to
from kafka_eos.errors import (DataLossError, KafkaEosError, PipelineHeld, PlanError, RangeMismatch, SpecError,
                              TopicRecreated)
from kafka_eos.paths import spark_app
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec, load_spec

from kafka_eos_airflow import config
from kafka_eos_airflow.hooks.kafka import KafkaEosHook
from kafka_eos_airflow.notes import ranges_text, record_note
from kafka_eos_airflow.notifications.alerts import send_alert
from kafka_eos_airflow.params import RunOptions

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

    from kafka_eos.plan import Plan

#: The spark-submit entry point that runs one stored plan to its transactional commit.
RUN_PIPELINE_APP = str(spark_app("run_pipeline"))

#: Failures a retry cannot fix: a person has to change the spec, reset a group, re-plan, or repair
#: and acknowledge a range committed short.
_NOT_RETRIABLE = (SpecError, DataLossError, TopicRecreated, RangeMismatch, PipelineHeld)


@contextmanager
def task_errors() -> Iterator[None]:
    """Turn a :class:`KafkaEosError` into a task failure that carries its one-line message. Inside,
    a token callback's AdminClients are shared (:func:`kafka_eos.kafka_admin.shared_admin_clients`).

    :raises AirflowFailException: for errors a retry cannot fix (no retries are spent).
    :raises AirflowException: for every other kafka-eos error (the task is retried).
    """
    # Here, not at the top: a DAG's parse imports no Kafka client (tests/dags/test_dagbag.py).
    from kafka_eos.kafka_admin import shared_admin_clients

    try:
        with shared_admin_clients():
            yield
    except _NOT_RETRIABLE as exc:
        raise AirflowFailException(str(exc)) from exc
    except KafkaEosError as exc:
        raise AirflowException(str(exc)) from exc


def run_spec(pipeline: str, context: Context) -> tuple[RunOptions, PipelineSpec]:
    """The run's options (its params) and the spec as this run reads it.

    :raises SpecError: a bad spec or a bad param, naming the field.
    """
    spec = load_spec(pipeline)
    options = RunOptions.of(context.get("params"), spec)
    return options, options.apply(spec)


def skip_unless_spark_runs(options: RunOptions) -> None:
    """The tasks after the plan do nothing in a dry run or a reset (the plan task did it all).

    :raises AirflowSkipException: then.
    """
    if options.dry_run:
        raise AirflowSkipException("dry run: the plan task showed what would happen; nothing is read, written "
                                   "or committed")
    if options.reset_to:
        raise AirflowSkipException("checkpoint reset: the plan task moved the checkpoint; nothing is read")


@dataclass(frozen=True)
class SideRequest:
    """A run that is a side run (:mod:`kafka_eos.backfill.side`): a replay asked for in the
    params, or a run of Airflow's backfill (its data interval)."""

    kind: str
    key: str
    #: Tells a retry (the same attempt) from a rerun of a cleared run (Airflow's reprocessing).
    attempt: str
    replay: tuple[str, str] | None = None
    interval: tuple[datetime, datetime] | None = None

    @classmethod
    def of(cls, options: RunOptions, context: Context) -> "SideRequest | None":
        from kafka_eos.backfill.side import BACKFILL, REPLAY, interval_key, replay_key

        run_id, dag_run = context["run_id"], context.get("dag_run")
        attempt = f"{run_id}#{getattr(dag_run, 'clear_number', 0) or 0}"
        if options.replay_from:
            return cls(REPLAY, replay_key(options.replay_from, options.replay_until), attempt,
                       replay=(options.replay_from, options.replay_until))
        if getattr(dag_run, "run_type", None) == "backfill":  # DagRunType is a str enum
            start, end = context["data_interval_start"], context["data_interval_end"]
            return cls(BACKFILL, interval_key(start, end), attempt, interval=(start, end))
        return None

    def ranges(self, spec: PipelineSpec, settings: KafkaSettings):
        """The side run's ranges, computed now (see :func:`kafka_eos.backfill.side.prepare`)."""
        from kafka_eos.backfill.side import interval_ranges, replay_ranges

        if self.replay is not None:
            return replay_ranges(spec, settings, *self.replay)
        return interval_ranges(spec, settings, *self.interval)

    def find(self, spec: PipelineSpec, settings: KafkaSettings, run_id: str,
             remaining: bool = True) -> tuple[PipelineSpec, Plan, str]:
        """The side run the plan task prepared: its spec, its plan (what remains to commit, or
        all of it) and its JSON (for Spark)."""
        from kafka_eos.backfill.side import find, side_spec

        side, plan = find(spec, settings, run_id, self.kind, self.key, self.attempt, remaining)
        return side_spec(spec, side), plan, side.to_json()


def step_aside_for_a_stream(spec: PipelineSpec, settings: KafkaSettings) -> None:
    """A pipeline runs in one mode at a time: while ``kafka-eos stream`` owns it, a live run's task
    (or a reset) skips itself and the tasks behind it, rather than fence the stream's producer.
    Replays, backfills and dry runs go on (they never touch the live checkpoint).

    :raises AirflowSkipException: a stream owns the pipeline.
    """
    from kafka_eos.errors import PipelineBusy
    from kafka_eos.lease import refuse_if_streaming

    try:
        refuse_if_streaming(spec, settings)
    except PipelineBusy as exc:
        raise AirflowSkipException(str(exc)) from None


def _moved(moves: dict[str, list]) -> str:
    """``orders-0 6 -> 3, …`` from ``{"orders-0": [6, 3], …}``."""
    return ", ".join(f"{tp} {a} -> {b}" for tp, (a, b) in moves.items())


def stored_plan(settings: KafkaSettings, spec: PipelineSpec, run_id: str) -> Plan:
    """The plan the plan task stored for ``run_id`` in the run manifest.

    :raises PlanError: no plan is stored for the run.
    """
    from kafka_eos.manifest import ManifestStore, run_key

    plan = ManifestStore.of(spec, settings).stored_plan(run_id)
    if plan is None:
        raise PlanError(f"manifest {spec.manifest_topic!r}: the newest plan is not the one of "
                        f"{run_key(spec.name, run_id)!r}: run the plan task of this run first")
    return plan


def plan_summary(plan: Plan) -> dict[str, Any]:
    """A small, JSON-friendly view of a plan (the plan task's XCom, for people and the UI)."""
    summary: dict[str, Any] = {
        "pipeline": plan.pipeline,
        "run_id": plan.run_id,
        "partitions": len(plan.active),
        "empty": plan.is_empty,
        "ranges": [[r.topic, r.partition, r.from_offset, r.until] for r in plan.active],
    }
    if plan.skipped:
        summary["skipped"] = [[s.topic, s.partition, s.from_offset, s.until] for s in plan.skipped]
    return summary


class _PipelineOperator(BaseOperator):
    """Base of the operators that act on one pipeline through one Kafka connection."""

    template_fields: Sequence[str] = ("pipeline", "kafka_conn_id")

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()


class KafkaEosPlanOperator(_PipelineOperator):
    """Compute the run's plan once and store it in the run manifest (status ``planned``).

    A retried task gets the stored plan back while it still applies
    (:func:`kafka_eos.pipeline.prepare_plan`). Returns :func:`plan_summary`.

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param kafka_conn_id: the ``kafka`` connection (see :class:`KafkaEosHook`). (templated)
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos import acls
        from kafka_eos.pipeline import looked_plan, prepare_plan

        with task_errors():
            options, spec = run_spec(self.pipeline, context)
            settings = KafkaEosHook(self.kafka_conn_id).get_pipeline_settings(spec)
            # Before anything is written: every permission the pipeline's runs need.
            acls.check(spec, settings)
            side = SideRequest.of(options, context)
            if options.reset_to or (side is None and not options.dry_run):
                step_aside_for_a_stream(spec, settings)
            if options.reset_to:
                return self._reset(spec, settings, options, context)
            if side is not None:
                return self._side(spec, settings, options, side, context)
            if options.dry_run:
                return self._dry_run(spec, settings, looked_plan(spec, settings, run_id=context["run_id"]), context)
            plan = prepare_plan(spec, settings, run_id=context["run_id"])
        for r in plan.active:
            self.log.info("%s-%d: [%d, %d) checkpoint=%s", r.topic, r.partition, r.from_offset, r.until,
                          r.expected)
        self._alert_skipped(spec, plan, context)
        self.log.info("pipeline %s run %s: %d partition(s) to run%s", spec.name, plan.run_id,
                      len(plan.active), " (empty plan: Spark is skipped)" if plan.is_empty else "")
        return plan_summary(plan)

    def _alert_skipped(self, spec: PipelineSpec, plan: Plan, context: Context) -> None:
        for s in plan.skipped:
            self.log.warning("DATA LOSS skipped %s-%d: [%d, %d) (on_data_loss: skip)", s.topic, s.partition,
                             s.from_offset, s.until)
        if plan.skipped:
            # The run goes on without them (the spec says so); a person must still hear of it.
            # A retried plan task reuses the stored plan and alerts again: alerts are at least once.
            send_alert(context, f"pipeline {spec.name}: records deleted by retention before they were read "
                       f"were skipped in {len(plan.skipped)} partition(s) (on_data_loss: skip): "
                       + ", ".join(f"{s.topic}-{s.partition} [{s.from_offset}, {s.until})" for s in plan.skipped),
                       skipped=[{"pipeline": spec.name, "topic": s.topic, "partition": s.partition,
                                 "from": s.from_offset, "until": s.until} for s in plan.skipped])

    def _side(self, spec: PipelineSpec, settings: KafkaSettings, options: RunOptions, side: SideRequest,
              context: Context) -> dict[str, Any]:
        from kafka_eos.backfill import side as sides

        compute = lambda: side.ranges(spec, settings)  # noqa: E731
        if options.dry_run:
            shown = sides.preview(spec, settings, side.kind, side.key, compute)
            for t, p, a, b in shown["ranges"]:
                self.log.info("DRY RUN %s %s %s-%d: would read [%d, %d)%s", side.kind, side.key, t, p, a, b,
                              " (recorded)" if shown["recorded"] else "")
            record_note(context, f"DRY RUN {side.kind} {side.key}: would read {ranges_text(shown['ranges'])}"
                                  f"{' (recorded)' if shown['recorded'] else ''}. Nothing was written.")
            return {"pipeline": spec.name, "dry_run": True, side.kind: side.key, "ranges": shown["ranges"],
                    "recorded": shown["recorded"]}
        found, plan, mapping = sides.prepare(spec, settings, context["run_id"], side.kind, side.key, side.attempt,
                                             compute, options.reprocess)
        for r in plan.ranges:
            self.log.info("%s %s generation %d %s-%d: [%d, %d)%s", side.kind, side.key, found.generation, r.topic,
                          r.partition, r.from_offset, r.until, "" if r in plan.active else " (written already)")
        self._alert_skipped(spec, plan, context)
        sink = sides.side_spec(spec, found).sink
        if spec.sink.about.promoted_by == "branch":  # a branch of the live tables: table@branch
            writes_to, dead_to = f"{sink.table}@{sink.branch}", f"{sink.dead_letters_table}@{sink.branch}"
        else:
            writes_to, dead_to = spec.sink.backfill_topic or spec.sink.backfill_table, \
                sink.dlq_topic or sink.dead_letters_table
        return {**plan_summary(plan), side.kind: side.key, "generation": found.generation,
                "writes_to": writes_to, "dead_letters_to": dead_to, "recorded_at": mapping["created_at"]}

    def _dry_run(self, spec: PipelineSpec, settings: KafkaSettings, planned: tuple[Plan, list, bool],
                 context: Context) -> dict[str, Any]:
        from kafka_eos.manifest import ManifestStore

        plan, drift, pending = planned
        held = ManifestStore.of(spec, settings).state().held  # no run takes this plan while held
        if pending:
            self.log.warning("DRY RUN pipeline %s: the offsets of group %s are held by an open transaction (an "
                             "attempt killed between sending its offsets and its commit, or one committing now): "
                             "planned from the offsets before it; a real run fences it and plans again", spec.name,
                             spec.source.group_id)
        if held is not None:
            self.log.warning("DRY RUN pipeline %s is HELD since %s: %s; no run takes this plan until an operator "
                             "acknowledges it (kafka-eos acknowledge %s --yes)", spec.name, held["found_at"],
                             held["mismatch"], spec.name)
        for r in plan.active:
            self.log.info("DRY RUN %s-%d: would read [%d, %d) (checkpoint %s)", r.topic, r.partition,
                          r.from_offset, r.until, r.expected)
        for s in plan.skipped:
            self.log.warning("DRY RUN %s-%d: would skip [%d, %d), deleted by retention (on_data_loss: skip)",
                             s.topic, s.partition, s.from_offset, s.until)
        for d in drift:
            self.log.warning("DRY RUN %s-%d: the Kafka mirror of the SQL checkpoint is at %s, the sink at %s; a "
                             "real run republishes it", d.topic, d.partition, d.kafka, d.sink)
        self.log.info("DRY RUN pipeline %s: %d partition(s) would be read; nothing was stored, read, written or "
                      "committed", spec.name, len(plan.active))
        summary = {**plan_summary(plan), "dry_run": True, "held": held, "pending": pending}
        record_note(context, (f"HELD since {held['found_at']}: no run takes this plan until an operator acknowledges "
                              f"it (kafka-eos acknowledge {spec.name} --yes). " if held is not None else "")
                    + f"DRY RUN: would read {ranges_text(summary['ranges'])}. Nothing was stored, read, written or "
                    "committed.")
        return summary

    def _reset(self, spec: PipelineSpec, settings: KafkaSettings, options: RunOptions,
               context: Context) -> dict[str, Any]:
        from kafka_eos.backfill import positions
        from kafka_eos.backfill.reset import confirmation, reset_checkpoint
        from kafka_eos.pipeline import checkpoints

        targets, _ends = positions.resolve(spec, settings, options.reset_to, "params.reset_checkpoint_to")
        if options.dry_run:
            before, _drift = checkpoints(spec, settings, sorted(targets))
            moves = {f"{t}-{p}": [before[(t, p)], offset] for (t, p), offset in sorted(targets.items())}
            self._log_moves("DRY RUN", moves)
            record_note(context, f"DRY RUN checkpoint reset: {_moved(moves)}. Nothing was changed.")
            return {"pipeline": spec.name, "dry_run": True, "reset": moves}
        if options.reset_confirm != confirmation(spec):
            raise SpecError(f"params.reset_confirm: type exactly {confirmation(spec)!r} to reset the checkpoint "
                            f"(got {options.reset_confirm!r}); nothing was changed")
        dag_run = context.get("dag_run")
        record = reset_checkpoint(spec, settings, targets, run_id=context["run_id"], asked=options.reset_to,
                                  who=getattr(dag_run, "triggering_user_name", None) or "unknown",
                                  via=f"{self.dag_id} run {context['run_id']}")
        # What the reset itself found and set (its audit record), not a read of our own before it.
        moves = {tp: [record["before"][tp], record["after"][tp]] for tp in record["after"]}
        self._log_moves("RESET", moves)
        self.log.info("checkpoint of %s reset (%s); recorded in kafka-eos.audit", spec.name, record["status"])
        record_note(context, f"Checkpoint reset ({record['status']}): {_moved(moves)}; recorded in kafka-eos.audit "
                              f"by {record['who']}.")
        return {"pipeline": spec.name, "dry_run": False, "reset": moves, "audit": record}

    def _log_moves(self, what: str, moves: dict[str, list]) -> None:
        for tp, (before, after) in moves.items():
            self.log.info("%s %s: checkpoint %s -> %s", what, tp, before, after)


class KafkaEosSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit ``spark_apps/run_pipeline.py`` on the run's stored plan, or, where the Spark
    connection has the type ``spark_connect``, run that plan from this task through a long-lived
    Spark Connect server (no JVM starts for the run).

    The plan comes from the run manifest (never XCom) and reaches Spark verbatim in a file;
    Kafka settings reach it through the environment (``env_vars``) and secrets through a file
    of the task's own that the environment names: never argv, never an environment variable.
    An empty plan skips Spark and the task succeeds. The plan file is local to the Airflow
    worker: use client deploy mode (the default).

    Through Spark Connect the task is the Spark application's client: it plans nothing anew, reads
    and transforms on the server, and commits as spark-submit's driver would (atomic scope here,
    per_partition scope in the server's Python workers, which must run the same kafka_eos).

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param kafka_conn_id: the ``kafka`` connection (see :class:`KafkaEosHook`). (templated)
    :param conn_id: the Spark connection (``spark_default``): type ``spark`` (spark-submit) or
        ``spark_connect`` (Airflow's Spark Connect connection: host, port, token, use_ssl).
    :param kwargs: any other :class:`SparkSubmitOperator` argument; ``conf`` is merged over
        kafka-eos's session settings (connector jars, interpreter), ``env_vars`` under the Kafka
        settings.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "pipeline", "kafka_conn_id")

    def __init__(self, *, pipeline: str, kafka_conn_id: str | None = None,
                 application: str = RUN_PIPELINE_APP, conn_id: str | None = None,
                 name: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("deploy_mode") == "cluster":  # at DAG parse time, in one line
            raise ValueError(f"{kwargs.get('task_id', 'spark')}: {CLUSTER_MODE_REFUSED}")
        super().__init__(application=application, conn_id=conn_id or config.spark_conn_id(), name=name, **kwargs)
        self.pipeline = pipeline
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def check_cluster_settings(self, spec: PipelineSpec) -> str:
        """Before anything runs: the Spark connection's deploy mode is client's, and the executors'
        Python is named where they are not this machine. Returns that interpreter.

        :raises AirflowFailException: one line naming the connection and the setting.
        """
        connection = self._get_hook()._connection
        if connection["deploy_mode"] == "cluster":
            raise AirflowFailException(f"Spark connection {self._conn_id!r}: {CLUSTER_MODE_REFUSED}")
        return executor_python(spec, self.conf or {}, self.env_vars or {}, connection["master"], self._conn_id)

    @staticmethod
    def plan_to_run(settings: KafkaSettings, spec: PipelineSpec, run_id: str) -> Plan:
        """The run's plan: the one the plan task stored while it still applies. A retried Spark
        task may come after retention deleted part of the stored range: then the run is planned
        anew, so ``on_data_loss`` decides (``skip`` records the gap) instead of Spark's reader
        failing on the missing records every retry."""
        from kafka_eos.pipeline import prepare_plan

        stored_plan(settings, spec, run_id)  # the plan task ran: a plan is stored under this run
        return prepare_plan(spec, settings, run_id)

    def submit_conf(self, spec: PipelineSpec) -> dict[str, str]:
        """What spark-submit gets as ``--conf``: kafka-eos's session settings (connector, interpreter,
        loopback for a local master), the spec's ``spark:`` section over them, the operator's own
        ``conf`` over both; the jar and package lists are joined (:func:`kafka_eos.spark_io.merged_conf`)."""
        from kafka_eos.spark_io import local_master_conf, merged_conf, session_conf

        # A local master keeps the driver on loopback, as the CLI's in-process runs do; on a
        # cluster the executors must reach the driver at the address Spark picks.
        python = self.check_cluster_settings(spec)
        ours = {**session_conf(), **local_master_conf(self._get_hook()._connection["master"]),
                "spark.pyspark.python": python}
        return merged_conf(merged_conf(ours, spec.spark_conf), self.conf or {})

    def execute(self, context: Context) -> None:
        run_id = context["run_id"]
        with task_errors():
            options, spec = run_spec(self.pipeline, context)
            skip_unless_spark_runs(options)
            settings = KafkaEosHook(self.kafka_conn_id).get_pipeline_settings(spec, registry=True)
            side = SideRequest.of(options, context)
            if side is None:
                # A stream that started after the plan task (a retry, a slow queue) is not fenced.
                step_aside_for_a_stream(spec, settings)
                plan, side_json = self.plan_to_run(settings, spec, run_id), None
            else:
                spec, plan, side_json = side.find(spec, settings, run_id)
            remote = self.connect_url()
            if not remote:
                spark_conf = self.submit_conf(spec)
        if plan.is_empty:
            self.log.info("pipeline %s run %s: empty plan, nothing to read: Spark is not started",
                          spec.name, run_id)
            return
        if remote:
            with task_errors():
                self.run_on_connect(remote, spec, plan, settings)
            return
        self.log.info("pipeline %s run %s: %d partition(s), plan created at %s", spec.name, run_id,
                      len(plan.active), plan.created_at)
        self.name = self.name or f"kafka-eos-{spec.name}"
        self.conf = spark_conf
        # A private folder (mode 0700): the plan, and the Kafka client settings in a file of
        # their own, which the environment only names.
        with tempfile.TemporaryDirectory(prefix="kafka-eos-plan-") as tmp:
            self.env_vars = self.spark_environ(settings, Path(tmp))
            plan_file = Path(tmp) / f"{spec.name}.plan.json"
            plan_file.write_text(plan.to_json())
            self.application_args = ["--spec", spec.path, "--plan", str(plan_file),
                                     *(["--side", side_json] if side_json else [])]
            super().execute(context)

    def connect_url(self) -> str | None:
        """The Spark Connect URL of the Spark connection, or None for a spark-submit connection."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        try:
            conn = SparkConnectHook.get_connection(self._conn_id)
        except AirflowNotFoundException:
            return None  # spark-submit's hook has its own default (YARN)
        if conn.conn_type != SparkConnectHook.conn_type:
            return None
        return SparkConnectHook(self._conn_id).get_connection_url()

    def run_on_connect(self, remote: str, spec: PipelineSpec, plan: "Plan", settings: KafkaSettings) -> None:
        """Run ``plan`` to its commit through the Spark Connect server at ``remote``. The URL may hold
        the connection's token: it is never logged."""
        from kafka_eos.batch import run_batch
        from kafka_eos.spark_io import end_session, get_session

        self.log.info("pipeline %s run %s: %d partition(s) through Spark connection %r (Spark Connect)",
                      spec.name, plan.run_id, len(plan.active), self._conn_id)
        spark = get_session(remote=remote, conf=spec.spark_conf, pipeline=spec.name)
        try:
            summary = run_batch(spark, spec, plan, settings)
        finally:
            try:
                end_session(spark)  # the pipeline's session of the server waits for its next run
            except Exception as exc:  # noqa: BLE001 - the run's own outcome is what the task reports
                self.log.warning("Spark Connect session not closed: %s", exc)
        self.log.info("KAFKA_EOS_SUMMARY %s", json.dumps(summary.as_dict()))

    def spark_environ(self, settings: KafkaSettings, folder: Path) -> dict[str, str]:
        """The environment of spark-submit: the operator's ``env_vars``, the interpreter, and the
        Kafka settings with their secrets in a file under ``folder`` (see
        :meth:`KafkaSettings.to_environ`). Nothing secret is in it: Airflow's Spark hook turns
        it into ``--conf`` arguments on YARN and Kubernetes masters."""
        # The executors' Python: submit_conf put check_cluster_settings' choice in the conf.
        python = (self.conf or {}).get("spark.pyspark.python", sys.executable)
        return {**(self.env_vars or {}), "PYSPARK_PYTHON": python, **settings.to_environ(folder / "kafka-client.json")}


#: Why the Spark task runs spark-submit in client mode only.
CLUSTER_MODE_REFUSED = ("deploy mode 'cluster' is not supported: the run's plan and its secrets are files on the "
                        "Airflow worker that the driver reads; use client mode (the default)")


def executor_python(spec: PipelineSpec, conf: dict, env_vars: dict, master: str, conn_id: str) -> str:
    """The Python the executors run kafka-eos's code with: ``spark.pyspark.python`` of the
    operator's ``conf``, else of the spec's ``spark:`` section, else ``PYSPARK_PYTHON`` of the
    operator's ``env_vars`` or of the worker's environment (an image's), else the Spark
    connection's extra ``spark.pyspark.python``; on a
    ``local[...]`` master, this worker's own interpreter. Never silently this worker's on a cluster,
    whose executors may not have it.

    :raises AirflowFailException: a cluster master and no interpreter named.
    """
    named = conf.get("spark.pyspark.python") or spec.spark_conf.get("spark.pyspark.python") \
        or env_vars.get("PYSPARK_PYTHON") or os.environ.get("PYSPARK_PYTHON")
    if named:
        return named
    if master.startswith("local"):
        return sys.executable
    try:
        named = BaseHook.get_connection(conn_id).extra_dejson.get("spark.pyspark.python")
    except Exception:  # noqa: BLE001 - the Spark hook found the connection; a lookup error names nothing new
        named = None
    if named:
        return str(named)
    raise AirflowFailException(
        f"Spark connection {conn_id!r}: master {master}: the executors' Python is not named: set spark.pyspark.python "
        f"in the pipeline's spark: section, the operator's conf or the connection's extra (an interpreter with "
        f"kafka-eos installed on every executor; this worker's {sys.executable} is not assumed to be there)")


class KafkaEosVerifyOperator(_PipelineOperator):
    """Check that the run's commit landed (every active range's checkpoint is at its end) and
    log the run summary from the manifest. Returns the summary.

    :param pipeline: spec name under include/pipelines/ or path to a spec YAML. (templated)
    :param kafka_conn_id: the ``kafka`` connection (see :class:`KafkaEosHook`). (templated)
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lineage = None

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos.manifest import ManifestStore
        from kafka_eos.pipeline import verify

        from kafka_eos_airflow import lineage, metrics
        from kafka_eos_airflow.assets import kafka as assets

        run_id = context["run_id"]
        with task_errors():
            options, spec = run_spec(self.pipeline, context)
            skip_unless_spark_runs(options)
            settings = KafkaEosHook(self.kafka_conn_id).get_pipeline_settings(spec)
            side = SideRequest.of(options, context)
            live_spec = spec
            if side is None:
                plan = stored_plan(settings, spec, run_id)
            else:
                spec, plan, side_json = side.find(spec, settings, run_id, remaining=False)
            checkpoints = verify(spec, settings, plan)
            found, partitions = ManifestStore.of(spec, settings).run_records(run_id, side=side is not None)
            record = found or {}
        summary = {
            "pipeline": spec.name,
            "run_id": run_id,
            "sink": spec.sink.kind,
            # A side run done by an earlier request (the same backfill again) has no record of its own.
            "status": "empty" if plan.is_empty else record.get("status") or ("written before" if side else None),
            "partitions": len(plan.active),
            "records_in": record.get("records_in", 0),
            "records_out": record.get("records_out", 0),
            "dead_letters": record.get("dead_letters", 0),
            "checkpoints": {f"{t}-{p}": offset for (t, p), offset in sorted(checkpoints.items())},
        }
        for name, rec in sorted(partitions.items()):
            self.log.info("  %s: %s [%s, %s) in=%s out=%s dead letters=%s", name, rec.get("status"),
                          rec.get("from"), rec.get("until"), rec.get("records_in"), rec.get("records_out"),
                          rec.get("dead_letters"))
        self.log.info("pipeline %s run %s: %s, %d partition(s), in=%s out=%s dead letters=%s", spec.name,
                      run_id, summary["status"], summary["partitions"], summary["records_in"],
                      summary["records_out"], summary["dead_letters"])
        if side is not None:
            summary["writes_to"] = side_writes_to(live_spec)
            if live_spec.sink.about.promoted_by == "branch":
                from kafka_eos.backfill.side import Side

                name = Side.from_json(side_json).suffix
                summary["writes_to"] = f"branch `{side_branch(live_spec.name, name)}` of Iceberg table " \
                                       f"`{live_spec.sink.table}`"
                summary["promote_command"] = f"kafka-eos backfill promote {live_spec.name} {name} --yes"
                self.log.info("%s %s: written to %s; to promote it onto main, after checking: %s", side.kind,
                              side.key, summary["writes_to"], summary["promote_command"])
            if live_spec.sink.about.promoted_by == "sql":
                summary["promote_sql"] = promote_statement(live_spec, side_json, settings)

                summary["promote_caveat"] = promote_caveat(live_spec)
                self.log.info("%s %s: rows in %s; to promote them into the live table, after checking: %s%s",
                              side.kind, side.key, live_spec.sink.backfill_table, summary["promote_sql"],
                              f" ({summary['promote_caveat']})" if summary["promote_caveat"] else "")
        record_note(context, self._note(summary, plan, side, context))
        mode, side_key = (side.kind, side.key) if side else ("live", None)
        try:
            self._lineage = lineage.run_lineage(spec, settings, plan, summary, mode, side_key)
            metrics.run_metrics(summary, record, plan.created_at, mode, spec.sink.commit)
        except Exception as exc:  # noqa: BLE001 - the run is verified: its report must not fail it
            self.log.warning("run %s: lineage or metrics not reported: %s", run_id, exc)
        if not plan.is_empty and summary["status"] == "committed":
            # "The sink was written": an event of its asset, for the DAGs scheduled on it.
            context["outlet_events"][assets.sink_alias(live_spec.name)].add(
                assets.sink_asset(spec, settings), extra=lineage.asset_extra(summary, plan, mode, side_key))
        if not plan.is_empty and summary["status"] not in ("committed", "noop", "written before"):
            # The checkpoints moved (verified above) but the summary record did not land: the
            # data is committed; only the audit record is missing.
            self.log.warning("manifest record of run %s is %r, not 'committed'", run_id, summary["status"])
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """What the run read and wrote (apache-airflow-providers-openlineage calls it after
        :meth:`execute`): :func:`kafka_eos_airflow.lineage.run_lineage`."""
        return self._lineage

    @staticmethod
    def _note(summary: dict[str, Any], plan: Plan, side: SideRequest | None, context: Context) -> str:
        """The run's note: what it read and what it wrote, and how long the run took."""
        from datetime import timezone

        started = getattr(context.get("dag_run"), "start_date", None)
        took = f" in {(datetime.now(timezone.utc) - started).total_seconds():.0f} s" if started else ""
        what = f"{side.kind} {side.key}: " if side else ""
        where = f" Written to {summary['writes_to']}." if side else ""
        caveat = f" ({summary['promote_caveat']})" if summary.get("promote_caveat") else ""
        promote = f" Promote into the live table, after checking: {summary['promote_sql']}{caveat}" \
            if summary.get("promote_sql") else \
            f" Promote onto main, after checking: {summary['promote_command']}" if summary.get("promote_command") else ""
        if plan.is_empty:
            return f"{what}empty: nothing new to read{took}.{where}{promote}"
        ranges = ranges_text([[r.topic, r.partition, r.from_offset, r.until] for r in plan.active])
        if side:  # where it went and how to promote it first: a note keeps 1,000 characters
            return (f"{what}{summary['status']}: {summary['records_in']} in, {summary['records_out']} out, "
                    f"{summary['dead_letters']} dead-lettered{took}.{where}{promote} Ranges: {ranges}.")
        return (f"{what}{summary['status']}: {summary['records_in']} in, {summary['records_out']} out, "
                f"{summary['dead_letters']} dead-lettered{took}; {ranges}.")


def side_writes_to(spec: PipelineSpec) -> str:
    """Where ``spec``'s side runs write (see :func:`kafka_eos.backfill.side.writes_to`)."""
    return writes_to(spec)


def promote_statement(spec: PipelineSpec, side_json: str, settings: KafkaSettings) -> str:
    """The SQL that copies a SQL side run's rows into the live table (see
    :func:`kafka_eos.backfill.side.promote_statement`)."""
    from kafka_eos.backfill.side import Side, promote_statement as statement

    return statement(spec, Side.from_json(side_json), settings)
