"""The DAG factory: kafka-eos's DAGs from a folder of pipeline specs, for any Airflow.

A DAG file of your own needs two lines (``dags_folder/kafka_eos.py``)::

    from kafka_eos_airflow.dag_factory import kafka_eos_dags

    globals().update(kafka_eos_dags())  # the specs of [kafka_eos] pipelines_folder

which gives one DAG per spec (``kafka_eos__<name>``: plan >> spark >> verify), its stream DAG
(``kafka_eos_stream__<name>``), the watchdog over those pipelines and the abort runbook. What teams
set on their DAGs goes in as keywords (:class:`DagOptions`): a DAG id prefix, ``default_args``,
tags, the Spark tasks' pool and queue, notifiers of any provider, stream DAGs on or off, other
DAG arguments (e.g. ``deadline``)::

    globals().update(kafka_eos_dags("/opt/pipelines/payments", dag_id_prefix="payments__",
                                    default_args={"owner": "payments", "retries": 4},
                                    notifiers=[SlackNotifier(slack_conn_id="slack", text="...")],
                                    pool="spark", queue="spark", stream_dags=False))

Parse time only reads the YAML files (``kafka_eos.spec.parse_spec``): no transform import (that
would import pyspark), no Kafka, no metadata DB, no Variables. Everything else happens when the
tasks run. A spec that does not parse is logged and skipped, so one bad file never takes the
other pipelines' DAGs down.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from airflow.sdk import DAG, CronDataIntervalTimetable, CronTriggerTimetable, Param

from kafka_eos.errors import SpecError
from kafka_eos.spec import STREAM_SCHEDULE, YAML_LOADER, PipelineSpec, check_owners, parse_spec, spec_paths
from kafka_eos.stream import DEFAULT_INTERVAL_S
from kafka_eos_airflow import config
from kafka_eos_airflow.assets.kafka import sink_alias, source_asset
from kafka_eos_airflow.operators.checks import CheckpointRefreshOperator, FreshnessCheckOperator
from kafka_eos_airflow.notifications.alerts import (PIPELINE_DAG_PREFIX, RUNBOOK_DAG_ID, WATCHDOG_DAG_ID, KafkaEosAlertRouter,
                                         deadline_missed, failure_notifiers)
from kafka_eos_airflow.operators.pipeline import (KafkaEosPlanOperator, KafkaEosSparkSubmitOperator,
                                         KafkaEosVerifyOperator)
from kafka_eos_airflow.params import pipeline_params
from kafka_eos_airflow.operators.runbook import PARAMS as RUNBOOK_PARAMS
from kafka_eos_airflow.operators.runbook import AbortApprovalOperator, AbortTransactionOperator, InspectTransactionOperator
from kafka_eos_airflow.sensors.kafka import HungTransactionSensor
from kafka_eos_airflow.operators.stream import KafkaEosStreamOperator

log = logging.getLogger(__name__)

DAG_ID_PREFIX = PIPELINE_DAG_PREFIX
STREAM_DAG_ID_PREFIX = "kafka_eos_stream__"
#: A fixed start: with catchup off only the latest interval runs; a moving start (``now()``)
#: would make every parse a different DAG.
START_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: Tasks are idempotent (a retry reuses the stored plan and no-ops a landed commit), so retrying
#: is safe; 30 s lets a coordinator move or a leader election settle. (Failure alerts are added
#: per DAG: :meth:`DagOptions.args`.)
DEFAULT_ARGS = {"owner": "kafka-eos", "retries": 2, "retry_delay": timedelta(seconds=30)}


@dataclass(frozen=True)
class DagOptions:
    """What a team sets on the DAGs the factory makes (every field optional).

    :param dag_id_prefix: put before every DAG id (pipelines, streams, watchdog, runbook), so the
        DAGs of two folders never collide; e.g. ``"payments__"``.
    :param default_args: over kafka-eos's own (owner ``kafka-eos``, 2 retries after 30 s): owner,
        retries, ``on_retry_callback``, ``email`` ...; an ``on_failure_callback`` here is called
        besides the notifiers.
    :param tags: added to each DAG's kafka-eos tags.
    :param pool: the Airflow pool of the Spark tasks (the pipelines' ``spark`` and the streams' task).
    :param queue: the executor queue of the Spark tasks (e.g. Celery workers with Spark and Java).
    :param notifiers: Airflow notifiers (any provider's, e.g. Slack's ``SlackNotifier``) called when
        a task fails and for the alerts a task sends while it goes on (records skipped by retention).
    :param bundled_notifiers: also the webhook and e-mail notifiers of kafka-eos (each sends only
        where its connection exists).
    :param stream_dags: make the stream DAGs (``kafka_eos_stream__<name>``): True, False, or a
        function of the spec (per pipeline).
    :param dag_kwargs: further ``DAG`` arguments for every DAG (``deadline``, ``max_active_tasks``,
        ``access_control`` ...).
    :param deadlines: give each pipeline DAG whose spec sets ``source.freshness_limit_s`` a
        ``DeadlineAlert``: a run not finished that long after it was queued alerts (a ``deadline`` in
        ``dag_kwargs`` replaces it). None: ``[kafka_eos] deadlines`` (off by default: Airflow 3.3's
        ``airflow dags test`` fails on a DAG that has a deadline).
    :param deadline_notifiers: where a missed deadline alerts: Airflow notifier classes (or their
        import paths) with their keyword arguments, e.g. ``[(SlackWebhookNotifier, {"slack_webhook_conn_id":
        "slack", "text": "{{ kafka_eos_alert.text }}"})]`` — Airflow runs deadline callbacks in the
        triggerer from an import path and plain arguments, so these cannot be notifier objects; None:
        the bundled webhook and e-mail notifiers.
    :param kafka_conn_id: the ``kafka`` connection; None: ``[kafka_eos] kafka_conn_id``.
    :param spark_conn_id: the Spark connection; None: ``[kafka_eos] spark_conn_id``.
    """

    dag_id_prefix: str = ""
    default_args: Mapping[str, Any] = field(default_factory=dict)
    tags: Sequence[str] = ()
    pool: str | None = None
    queue: str | None = None
    notifiers: Sequence[Callable] = ()
    bundled_notifiers: bool = True
    stream_dags: bool | Callable[[PipelineSpec], bool] = True
    dag_kwargs: Mapping[str, Any] = field(default_factory=dict)
    deadlines: bool | None = None
    deadline_notifiers: Sequence[tuple[type | str, Mapping[str, Any]]] | None = None
    kafka_conn_id: str | None = None
    spark_conn_id: str | None = None

    def dag_id(self, base: str) -> str:
        return self.dag_id_prefix + base

    @property
    def runbook_dag_id(self) -> str:
        return self.dag_id(RUNBOOK_DAG_ID)

    def on_failure(self) -> list[Callable]:
        """The failure callbacks: the bundled notifiers (naming this prefix's runbook), the team's
        notifiers, and an ``on_failure_callback`` of ``default_args``."""
        callbacks = list(failure_notifiers(self.runbook_dag_id)) if self.bundled_notifiers else []
        if self.notifiers:  # with kafka-eos's alert in their template context (kafka_eos_alert)
            callbacks.append(KafkaEosAlertRouter(self.notifiers, self.runbook_dag_id))
        theirs = self.default_args.get("on_failure_callback")
        callbacks += list(theirs) if isinstance(theirs, (list, tuple)) else [theirs] if theirs else []
        return callbacks

    def args(self, **ours: Any) -> dict[str, Any]:
        """A DAG's ``default_args``: kafka-eos's, ``ours`` (the DAG's own), the team's, the failure callbacks."""
        return {**DEFAULT_ARGS, **ours, **self.default_args, "on_failure_callback": self.on_failure()}

    def spark_task(self) -> dict[str, Any]:
        """Pool and queue of a Spark task, where set."""
        return {k: v for k, v in (("pool", self.pool), ("queue", self.queue)) if v}

    def dag(self, dag_id: str, tags: Sequence[str], **kwargs: Any) -> DAG:
        return DAG(dag_id=self.dag_id(dag_id), tags=[*tags, *self.tags], **{**kwargs, **self.dag_kwargs})

    def deadline(self, spec: PipelineSpec) -> dict[str, Any]:
        """The pipeline DAG's ``deadline`` argument, from the spec's freshness limit (none without one)."""
        limit = spec.source.freshness_limit_s
        wanted = config.deadlines() if self.deadlines is None else self.deadlines
        if limit is None or not wanted or "deadline" in self.dag_kwargs:
            return {}
        from airflow.sdk.definitions.callback import AsyncCallback
        from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

        kwargs: dict[str, Any] = {"pipeline": spec.name, "limit_s": limit}
        if self.deadline_notifiers is not None:
            kwargs["notifiers"] = [{"classpath": c if isinstance(c, str) else f"{c.__module__}.{c.__qualname__}",
                                    "kwargs": dict(k)} for c, k in self.deadline_notifiers]
        return {"deadline": DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT,
                                          interval=timedelta(seconds=limit),
                                          callback=AsyncCallback(deadline_missed, kwargs=kwargs))}

    def wants_stream(self, spec: PipelineSpec) -> bool:
        return self.stream_dags(spec) if callable(self.stream_dags) else bool(self.stream_dags)


def _options(options: DagOptions | None, kwargs: dict[str, Any]) -> DagOptions:
    if options is not None and kwargs:
        raise TypeError("pass DagOptions or keywords, not both")
    return options if options is not None else DagOptions(**kwargs)


def _doc_md(spec: PipelineSpec) -> str:
    src = spec.source
    sink = spec.sink
    target = sink.describe()
    return "\n".join([
        f"### kafka-eos pipeline `{spec.name}`",
        "",
        f"Reads the committed records of {', '.join(f'`{t}`' for t in src.topics)} by explicit offset "
        f"ranges (checkpoint: consumer group `{src.group_id}`, at most {src.max_records_per_partition} "
        f"offsets per partition and {src.max_records_per_run} in all per run), applies `{spec.transform}` and writes {target} exactly once, "
        f"commit scope `{sink.commit}`.",
        "",
        "| task | does |",
        "|---|---|",
        "| `plan` | computes the run's offset ranges once and stores them in the run manifest "
        f"(`{spec.manifest_topic}`, key `{spec.name}:<run id>`); a retry reuses them |",
        "| `spark` | spark-submits `spark_apps/run_pipeline.py` on the stored plan; an empty plan skips Spark |",
        "| `verify` | checks that every checkpoint reached the plan's end and logs the run summary |",
        "",
        (f"Schedule: `stream`: a run whenever committed records wait beyond the checkpoint (asset "
         f"`kafka-eos://{spec.name}/source`, watched by the triggerer). " if spec.schedule == STREAM_SCHEDULE else
         f"Schedule: `{spec.schedule or 'manual only'}` (UTC, data intervals). ") +
        f"While `kafka-eos stream {spec.name}` runs, live runs skip themselves (one mode at a time). On data loss: "
        f"`{src.on_data_loss}`. Spec: `{spec.path}`.",
        "",
        "Trigger with config: **Max records per partition** caps this run; **Dry run** shows the plan and "
        "stops (the Spark and verify tasks are skipped; nothing is stored, written or committed). "
        "**Reset the checkpoint to** a timestamp or JSON offsets moves the checkpoint instead of running, "
        f"once confirmed with `RESET {spec.name}`; the reset is recorded in the topic `kafka-eos.audit`.",
    ])


def build_dag(spec: PipelineSpec, options: DagOptions | None = None, **kwargs: Any) -> DAG:
    """The DAG of one pipeline spec (``kafka_eos__<name>``): plan >> spark >> verify.

    :param spec: a parsed spec; its ``path`` is what the tasks load at run time.
    :param options: what the team sets on its DAGs (:class:`DagOptions`), or its fields as keywords
        (e.g. ``kafka_conn_id``, ``spark_conn_id``).
    """
    options = _options(options, kwargs)
    kafka_conn_id = options.kafka_conn_id or config.kafka_conn_id()
    if spec.schedule == STREAM_SCHEDULE:
        # Event-driven: a run whenever committed records wait beyond the checkpoint.
        schedule = [source_asset(spec, kafka_conn_id)]
    elif spec.schedule:
        schedule = CronDataIntervalTimetable(spec.schedule, timezone="UTC")
    else:
        schedule = None
    with options.dag(
        DAG_ID_PREFIX + spec.name,
        ["kafka-eos", spec.sink.kind, spec.sink.commit],
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        # Runs of one pipeline must not overlap: each plan starts at the previous run's end.
        max_active_runs=1,
        default_args=options.args(),
        # The trigger form (max records, dry run); scheduled runs take its defaults.
        params=pipeline_params(spec),
        doc_md=_doc_md(spec),
        **options.deadline(spec),
    ) as dag:
        plan = KafkaEosPlanOperator(task_id="plan", pipeline=spec.path, kafka_conn_id=kafka_conn_id)
        spark = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, kafka_conn_id=kafka_conn_id,
                                            conn_id=options.spark_conn_id, **options.spark_task())
        # Its outlet: the sink's asset, resolved when the task knows the cluster (an event per
        # committed run, for the DAGs scheduled on it).
        verify = KafkaEosVerifyOperator(task_id="verify", pipeline=spec.path, kafka_conn_id=kafka_conn_id,
                                        outlets=[sink_alias(spec.name)])
        plan >> spark >> verify
    return dag


def build_stream_dag(spec: PipelineSpec, options: DagOptions | None = None, **kwargs: Any) -> DAG:
    """The DAG that runs a pipeline as a stream (``kafka_eos_stream__<name>``): triggered by hand,
    one long-running task; its retries restart a stream that died, its failure alerts."""
    options = _options(options, kwargs)
    with options.dag(
        STREAM_DAG_ID_PREFIX + spec.name,
        ["kafka-eos", "stream", spec.sink.kind, spec.sink.commit],
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        # A stream that died restarts from its checkpoint after 30 s, three times, then alerts.
        default_args=options.args(retries=3),
        params={
            "interval_s": Param(DEFAULT_INTERVAL_S, type="number", minimum=0, title="Interval (seconds)",
                                description="Least time between the starts of two batches."),
            "until_caught_up": Param(False, type="boolean", title="Stop when caught up",
                                     description="Drain the backlog, then stop (instead of running until "
                                                 "the task is stopped)."),
        },
        doc_md="\n".join([
            f"### kafka-eos stream `{spec.name}`",
            "",
            f"Runs `kafka-eos stream {spec.name}`: one Spark application that plans, reads, transforms and "
            "commits one small range after another, each exactly once, and logs one line per batch. "
            "Trigger it to start the stream; mark the task failed (or clear it) to stop it: the stream "
            "finishes its batch in flight. A stream that dies is restarted from its checkpoint (3 retries), "
            "then the failure alerts. While it runs, the scheduled DAG's runs of this pipeline skip themselves.",
        ]),
    ) as dag:
        KafkaEosStreamOperator(task_id="stream", pipeline=spec.path, kafka_conn_id=options.kafka_conn_id,
                               spark_conn_id=options.spark_conn_id, interval_s="{{ params.interval_s }}",
                               **options.spark_task())
    return dag


def beside_dag_file(folder: str | Path, depth: int = 2) -> Path:
    """``folder`` as the DAG file calling the factory sees it: a relative folder is relative to
    that file's own folder (in a DAG bundle, the bundle's checkout of this version: the DAG
    processor's, and each task's, which parses the DAG file again from the run's bundle version),
    never to the process's working directory."""
    path = Path(folder)
    if path.is_absolute():
        return path
    caller = sys._getframe(depth).f_globals.get("__file__")
    return Path(caller).resolve().parent / path if caller else path.resolve()


def dags_from_folder(folder: str | Path, options: DagOptions | None = None, **kwargs: Any) -> dict[str, DAG]:
    """One DAG per ``*.yaml`` spec in ``folder`` (dag_id -> DAG), and its stream DAG where
    ``options.stream_dags`` wants it; unparsable specs are logged and skipped, and so are all the
    specs that share a pipeline name or a consumer group (a group holds one pipeline's checkpoint).
    A relative ``folder`` is relative to the calling DAG file (:func:`beside_dag_file`).
    ``options`` or ``kwargs``: :class:`DagOptions`."""
    folder = beside_dag_file(folder)
    return _dags_from_folder(folder, _options(options, kwargs))


def _dags_from_folder(folder: Path, options: DagOptions) -> dict[str, DAG]:
    specs: list[PipelineSpec] = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            raw = yaml.load(path.read_text(), Loader=YAML_LOADER)
            # No environ: ${VAR} in a SQL URL stays unresolved here (the tasks resolve it), so
            # no secret ends up in the serialized DAG.
            specs.append(parse_spec(raw, str(path.resolve())))
        except (SpecError, yaml.YAMLError, OSError) as exc:
            log.error("kafka-eos: skipping pipeline spec %s: %s", path, str(exc).splitlines()[0])
    dags: dict[str, DAG] = {}
    for spec in specs:
        others = [o for o in specs if o is not spec]
        try:
            if any(o.name == spec.name for o in others):
                raise SpecError(f"{spec.path}: name: pipeline name {spec.name!r} is used by another spec too")
            check_owners(spec, others)
        except SpecError as exc:
            log.error("kafka-eos: skipping pipeline spec %s", exc)
            continue
        dag = build_dag(spec, options)
        dags[dag.dag_id] = dag
        if options.wants_stream(spec):
            stream = build_stream_dag(spec, options)
            dags[stream.dag_id] = stream
    return dags


#: A watchdog run watches for 4 of its 5 minutes, then makes room for the next one.
WATCH_S = 240
#: How long until the next watchdog run may refresh a checkpoint: its interval, twice (one run late).
REFRESH_AHEAD_S = 2 * 300

WATCHDOG_DOC = """The watchdog: every 5 minutes, every pipeline's topics (sources, sink, dead letters,
run manifest) are watched for an open transaction that holds a partition's LSO longer than a
kafka-eos transaction may last (the longest ``sink.transaction_timeout_s`` of the pipelines plus a
minute, at least 360 s; the age is the coordinator's, the broker's clock, wherever it can say). A held partition fails the run and alerts (webhook, e-mail)
with the partition, its holder and the command that aborts it.

Beside it, a freshness check: a pipeline whose oldest unprocessed committed record is older
than its spec's ``source.freshness_limit_s`` fails that task and alerts, naming the partitions.
And a checkpoint refresh: a pipeline that has not run for a long time (event-driven, manual) has
its checkpoints committed again, unchanged, before the brokers' offsets retention would expire them.
"""

RUNBOOK_DOC = """Runbooks: DAGs an operator triggers from the UI to fix what an alert reported.

``kafka_eos_runbook_abort_transaction``: abort the open transaction that holds a partition's LSO.
Fill in topic, partition and start offset from the alert (or `kafka-eos txn hanging`). The first
run is a dry run that shows the transaction and changes nothing; a real run needs `dry_run` off and
the typed confirmation `ABORT <topic>-<partition>@<start offset>`. A transaction that is no known
pipeline's own then waits for a person's approval (task `approve`, under Required actions: it shows
the producer, its age, the partitions it holds and its coordinator; Reject or no answer within 8 h
changes nothing). The abort checks that the LSO moved and records who asked, who approved and what
was aborted in the `kafka-eos.audit` topic.
"""


def watchdog_dag(pipelines: Sequence[str], options: DagOptions | None = None, **kwargs: Any) -> DAG:
    """The watchdog over ``pipelines`` (spec paths), every 5 minutes: hung transactions, freshness,
    checkpoint refresh. ``options`` or ``kwargs``: :class:`DagOptions`."""
    options = _options(options, kwargs)
    kafka_conn_id = options.kafka_conn_id
    with options.dag(
        WATCHDOG_DAG_ID,
        ["kafka-eos", "watchdog"],
        schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC"),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=options.args(retries=1),
        doc_md=WATCHDOG_DOC,
    ) as dag:
        pipelines = list(pipelines)
        HungTransactionSensor(
            task_id="hung_transactions",
            pipelines=pipelines,
            kafka_conn_id=kafka_conn_id,
            healthy_for_s=WATCH_S,
            poll_interval_s=30,
            # One alert per problem and run: a failed watch is not retried into a second alert.
            retries=0,
        )
        FreshnessCheckOperator(task_id="freshness", pipelines=pipelines, kafka_conn_id=kafka_conn_id, retries=0)
        # A failed refresh alerts; the next watchdog run (within REFRESH_AHEAD_S) tries again.
        CheckpointRefreshOperator(task_id="refresh_checkpoints", pipelines=pipelines, kafka_conn_id=kafka_conn_id,
                                  next_in_s=REFRESH_AHEAD_S, retries=0)
    return dag


#: How long the runbook waits for a person to approve an abort before it counts as rejected: a
#: working day's shift; the held partition has waited for its alert already.
APPROVAL_TIMEOUT = timedelta(hours=8)


def runbook_dag(options: DagOptions | None = None, *, pipelines_folder: str | Path | None = None,
                **kwargs: Any) -> DAG:
    """``kafka_eos_runbook_abort_transaction``: the operator's abort of a held partition's
    transaction, knowing the pipelines of ``pipelines_folder`` (default ``[kafka_eos]
    pipelines_folder``). ``options`` or ``kwargs``: :class:`DagOptions`."""
    options = _options(options, kwargs)
    with options.dag(
        RUNBOOK_DAG_ID,
        ["kafka-eos", "runbook"],
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        params=RUNBOOK_PARAMS,
        default_args=options.args(),
        doc_md=RUNBOOK_DOC,
    ) as dag:
        folder = None if pipelines_folder is None else str(pipelines_folder)
        # No retries: a refused or failed abort needs a person, not a second try.
        inspect = InspectTransactionOperator(task_id="inspect", kafka_conn_id=options.kafka_conn_id,
                                             pipelines_folder=folder, retries=0)
        # Unanswered for APPROVAL_TIMEOUT: rejected (nothing changes; trigger the runbook again).
        approve = AbortApprovalOperator(task_id="approve", kafka_conn_id=options.kafka_conn_id, retries=0,
                                        response_timeout=APPROVAL_TIMEOUT, defaults="Reject")
        abort = AbortTransactionOperator(task_id="abort_transaction", kafka_conn_id=options.kafka_conn_id,
                                         pipelines_folder=folder, retries=0)
        inspect >> approve >> abort
    return dag


def kafka_eos_dags(folder: str | Path | None = None, options: DagOptions | None = None,
                   **kwargs: Any) -> dict[str, DAG]:
    """Every kafka-eos DAG for the specs in ``folder`` (default: ``[kafka_eos] pipelines_folder``):
    each pipeline's DAG and stream DAG (:func:`dags_from_folder`), the watchdog over them and the
    runbook. A relative folder is relative to the calling DAG file (:func:`beside_dag_file`): in
    a versioned DAG bundle, keep the specs in the bundle and each run reads its own version's.
    ``options`` or ``kwargs``: what the team sets on the DAGs (:class:`DagOptions`)."""
    options = _options(options, kwargs)
    folder = beside_dag_file(folder if folder is not None else config.pipelines_folder())
    dags = _dags_from_folder(folder, options)
    watchdog = watchdog_dag([str(p.resolve()) for p in spec_paths(folder)], options)
    runbook = runbook_dag(options, pipelines_folder=folder.resolve())
    return {**dags, watchdog.dag_id: watchdog, runbook.dag_id: runbook}
