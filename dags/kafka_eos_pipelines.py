"""One DAG per pipeline spec in include/pipelines/*.yaml: plan >> spark >> verify.

Parse time only reads the YAML files (``kafka_eos.spec.parse_spec``): no transform import (that
would import pyspark), no Kafka, no metadata DB, no Variables. Everything else happens when the
tasks run. A spec that does not parse is logged and skipped, so one bad file never takes the
other pipelines' DAGs down.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from kafka_eos.errors import SpecError
from kafka_eos.paths import pipelines_dir
from kafka_eos.spec import STREAM_SCHEDULE, PipelineSpec, check_owners, parse_spec
from kafka_eos_airflow.assets import source_asset
from kafka_eos_airflow.hooks import KafkaEosHook
from kafka_eos_airflow.notifiers import failure_notifiers
from kafka_eos_airflow.operators import (KafkaEosPlanOperator, KafkaEosSparkSubmitOperator,
                                         KafkaEosVerifyOperator)
from kafka_eos_airflow.params import pipeline_params
from kafka_eos_airflow.stream import KafkaEosStreamOperator

log = logging.getLogger(__name__)

DAG_ID_PREFIX = "kafka_eos__"
STREAM_DAG_ID_PREFIX = "kafka_eos_stream__"
#: A fixed start: with catchup off only the latest interval runs; a moving start (``now()``)
#: would make every parse a different DAG.
START_DATE = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: Tasks are idempotent (a retry reuses the stored plan and no-ops a landed commit), so retrying
#: is safe; 30 s lets a coordinator move or a leader election settle.
DEFAULT_ARGS = {"owner": "kafka-eos", "retries": 2, "retry_delay": timedelta(seconds=30),
                # Alerts go to the kafka_eos_alerts_webhook / _smtp connections, where defined.
                "on_failure_callback": failure_notifiers()}


def _doc_md(spec: PipelineSpec) -> str:
    src = spec.source
    sink = spec.sink
    if sink.kind == "kafka":
        target = f"Kafka topic `{sink.topic}` (dead letters: topic `{sink.dlq_topic}`)"
    else:
        target = f"SQL table `{sink.table}` (merge `{sink.merge}`; dead letters: table `{sink.dead_letters_table}`)"
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


def build_dag(spec: PipelineSpec, *, kafka_conn_id: str = KafkaEosHook.default_conn_name,
              spark_conn_id: str = "spark_default") -> DAG:
    """The DAG of one pipeline spec (``kafka_eos__<name>``): plan >> spark >> verify.

    :param spec: a parsed spec; its ``path`` is what the tasks load at run time.
    :param kafka_conn_id: the ``kafka`` connection of the cluster (see ``KafkaEosHook``).
    :param spark_conn_id: the Spark connection spark-submit uses.
    """
    if spec.schedule == STREAM_SCHEDULE:
        # Event-driven: a run whenever committed records wait beyond the checkpoint.
        schedule = [source_asset(spec, kafka_conn_id)]
    elif spec.schedule:
        schedule = CronDataIntervalTimetable(spec.schedule, timezone="UTC")
    else:
        schedule = None
    with DAG(
        dag_id=DAG_ID_PREFIX + spec.name,
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        # Runs of one pipeline must not overlap: each plan starts at the previous run's end.
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        # The trigger form (max records, dry run); scheduled runs take its defaults.
        params=pipeline_params(spec),
        tags=["kafka-eos", spec.sink.kind, spec.sink.commit],
        doc_md=_doc_md(spec),
    ) as dag:
        plan = KafkaEosPlanOperator(task_id="plan", pipeline=spec.path, kafka_conn_id=kafka_conn_id)
        spark = KafkaEosSparkSubmitOperator(task_id="spark", pipeline=spec.path, kafka_conn_id=kafka_conn_id,
                                            conn_id=spark_conn_id)
        verify = KafkaEosVerifyOperator(task_id="verify", pipeline=spec.path, kafka_conn_id=kafka_conn_id)
        plan >> spark >> verify
    return dag


def build_stream_dag(spec: PipelineSpec, *, kafka_conn_id: str = KafkaEosHook.default_conn_name,
                     spark_conn_id: str = "spark_default") -> DAG:
    """The DAG that runs a pipeline as a stream (``kafka_eos_stream__<name>``): triggered by hand,
    one long-running task; its retries restart a stream that died, its failure alerts."""
    with DAG(
        dag_id=STREAM_DAG_ID_PREFIX + spec.name,
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        # A stream that died restarts from its checkpoint after 30 s, three times, then alerts.
        default_args={**DEFAULT_ARGS, "retries": 3},
        params={
            "interval_s": Param(1.0, type="number", minimum=0, title="Interval (seconds)",
                                description="Least time between the starts of two batches."),
            "until_caught_up": Param(False, type="boolean", title="Stop when caught up",
                                     description="Drain the backlog, then stop (instead of running until "
                                                 "the task is stopped)."),
        },
        tags=["kafka-eos", "stream", spec.sink.kind, spec.sink.commit],
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
        KafkaEosStreamOperator(task_id="stream", pipeline=spec.path, kafka_conn_id=kafka_conn_id,
                               spark_conn_id=spark_conn_id, interval_s="{{ params.interval_s }}")
    return dag


def dags_from_folder(folder: str | Path, **kwargs) -> dict[str, DAG]:
    """One DAG per ``*.yaml`` spec in ``folder`` (dag_id -> DAG); unparsable specs are logged and
    skipped, and so are all the specs that share a pipeline name or a consumer group (a group
    holds one pipeline's checkpoint). ``kwargs`` go to :func:`build_dag`."""
    specs: list[PipelineSpec] = []
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            raw = yaml.safe_load(path.read_text())
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
        dags[DAG_ID_PREFIX + spec.name] = build_dag(spec, **kwargs)
        dags[STREAM_DAG_ID_PREFIX + spec.name] = build_stream_dag(spec, **kwargs)
    return dags


globals().update(dags_from_folder(pipelines_dir()))
