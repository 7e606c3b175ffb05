"""per_partition scope's commit job with the records produced from the executors' JVM
(``io.kafkaeos.writer`` in kafka-eos's jar, jvm/connect): the same transactions as the Python
commit task (:func:`kafka_eos.sinks.per_partition._commit_task`), one per source partition under its
own transactional.id, the steps of :mod:`kafka_eos.txn` — fencing, the checkpoint check, results and
dead letters, the offsets and the manifest's records inside the transaction — with the rows never
leaving the JVM: no Python worker to start, no Arrow hand-off, and no input that can end early
unseen (a failed read or transform throws through Spark's own iterator into the task, whose
transaction then aborts).

It takes a run's commit job where the driver has already proven the task layout from the lineage
(one pass: each Spark task holds one whole planned range): by spark-submit, ``kafka-eos run`` or an
in-process session, the job runs from this process through Py4J; through a Spark Connect server,
kafka-eos's server plugin runs it (the relation ``kafka_eos.PartitionCommits``; a server whose
plugin predates it refuses the relation, and the run takes the Python commit task). A stream's
batches (kept producers), records that did not decode (written beside the rows from the driver's
Arrow batches), and every run where ``KAFKA_EOS_WRITER=python`` is set (:data:`WRITER_ENV`) take
the Python commit task.

The tests' fault points (:func:`kafka_eos.probes.carried`, else the executor's own environment) act
in the writer too: a crash SIGKILLs the JVM that produces (the executor; in local mode the driver),
except in a Spark Connect server's own JVM, where it kills the task alone and leaves its transaction
open (the server every session shares lives on, as it does when a Python task's worker is killed).
"""

from __future__ import annotations

import base64
import json
import os
import struct
import uuid
import logging
from typing import TYPE_CHECKING

from kafka_eos import probes
from kafka_eos.kafka_admin import TP
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.limits import DEFAULT_BATCH_SIZE, DEFAULT_PRODUCER_MAX, producer_batch_bytes
from kafka_eos.spark_io import is_connect
from kafka_eos.spec import PipelineSpec

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: ``python``: every per_partition commit job takes the Python commit task; ``jvm`` (the default):
#: the JVM writer where it applies (the module's docstring).
WRITER_ENV = "KAFKA_EOS_WRITER"
#: The writer's entry point in kafka-eos's jar.
ENTRY = "io.kafkaeos.writer.PartitionCommits"


#: The relation kafka-eos's Spark Connect server plugin answers by running the commit job.
COMMIT_TYPE = "type.googleapis.com/kafka_eos.PartitionCommits"
#: Connect sessions whose server refused :data:`COMMIT_TYPE` (an older plugin): asked once a session.
_no_commit_plugin: set[str] = set()


def applies(df: "DataFrame", one_pass: bool, keep: bool, dead: dict | None) -> bool:
    """Whether the commit job of ``df`` takes the JVM writer (the module's docstring)."""
    if os.environ.get(WRITER_ENV, "jvm").strip().lower() == "python":
        return False
    if not one_pass or keep or any(dead.values() if dead else ()):
        return False
    if is_connect(df):
        return df.sparkSession.session_id not in _no_commit_plugin
    return _entry(df) is not None


def _entry(df: "DataFrame"):
    """The writer's class through Py4J, or None where the session's class path lacks it."""
    jvm = df.sparkSession.sparkContext._jvm
    try:
        jvm.java.lang.Class.forName(ENTRY, False, jvm.Thread.currentThread().getContextClassLoader())
    except Exception:  # noqa: BLE001 - an older jar, or none: the Python commit task
        return None
    return getattr(jvm, ENTRY)


def job(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, owner: dict[int, TP]) -> str:
    """What every task of the commit job needs, as JSON: the Java client's settings (secrets
    among them: this text goes to the executors, as the Kafka read's options do, and is never
    logged), the ids, each task's range, the sink's topics, headers and record limits."""
    from kafka_eos.spark_io import _executor_python

    sink = spec.sink
    ranges = {r.tp: r for r in plan.active}
    client = {key[len("kafka."):]: str(value)
              for key, value in settings.spark_options(python=_executor_python(df.sparkSession)).items()}
    tasks = {str(index): {"topic": tp[0], "partition": tp[1], "from": ranges[tp].from_offset,
                          "until": ranges[tp].until, "expected": ranges[tp].expected,
                          "transactional_id": spec.transactional_id(tp[0], tp[1])}
             for index, tp in owner.items()}
    return json.dumps({
        "client": client, "group_id": spec.source.group_id, "sink_topic": sink.topic, "dlq_topic": sink.dlq_topic,
        "headers": [[name, base64.b64encode(value).decode()] for name, value in sink.headers],
        "timeout_ms": sink.transaction_timeout_s * 1000, "fences": [spec.transactional_id()],
        "batch_bytes": producer_batch_bytes(spec) or DEFAULT_BATCH_SIZE,
        "producer_max": int(settings.extra.get("message.max.bytes", DEFAULT_PRODUCER_MAX)),
        "limits": {topic: [producer_max, topic_max] for topic, producer_max, topic_max in sink.record_limits},
        "on_refused_record": sink.on_refused_record, "spec_path": str(spec.path), "transform": spec.transform,
        "manifest_topic": spec.manifest_topic, "pipeline": plan.pipeline, "spec_name": spec.name, "run_id": plan.run_id,
        "planned_ms": plan.planned_ms, "tasks": tasks, "probes": probes.carried(),
        "job_id": uuid.uuid4().hex,  # a new request each time: no cache of planned relations answers it
    })


def commits(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings,
            owner: dict[int, TP]) -> list[dict] | None:
    """Run the commit job of ``df`` (:func:`kafka_eos.sinks.batches.prepared` columns; by Py4J, as
    one SQL execution of ``df``'s query, which fills its :class:`kafka_eos.sinks.proof.RowCount`) in
    the JVM: each task's result, as the Python commit task returns it, with the rows it took from
    Spark's iterator (``rows``: :func:`rows_of`, through Connect). A task's kafka-eos
    error fails the job with ``kafka_eos.errors.<Class>: …`` in its text, as a Python task's does.
    None: the Spark Connect server's plugin does not run the job (nothing ran; the Python commit
    task takes it)."""
    log.info("%s: per_partition, the records produced from the JVM (%d tasks)", spec.name, len(owner))
    text = job(df, spec, plan, settings, owner)
    if is_connect(df):
        return _through_connect(df, text)
    return [json.loads(result) for result in _entry(df).commit(df._jdf, text)]


def _through_connect(df: "DataFrame", text: str) -> list[dict] | None:
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    from pyspark.sql.connect.plan import CachedRelation
    from pyspark.sql.connect.proto import Relation

    session = df.sparkSession
    relation = df._plan.plan(session.client).SerializeToString()
    ask = Relation()
    ask.extension.type_url = COMMIT_TYPE
    ask.extension.value = struct.pack(">i", len(relation)) + relation + text.encode()
    try:
        rows = ConnectDataFrame(CachedRelation(ask), session).collect()
    except Exception as exc:  # noqa: BLE001 - only a server without the relation is not a failure of the job
        if not any(m in str(exc) for m in ("NO_HANDLER_FOR_EXTENSION", "No handler found for extension")):
            raise
        _no_commit_plugin.add(session.session_id)
        log.info("the Spark Connect server's kafka-eos plugin does not run per_partition commit jobs (%s): its "
                 "Python commit task does", str(exc).splitlines()[0][:200])
        return None
    return [json.loads(row["result"]) for row in rows]


def rows_of(results: list[dict], plan: Plan) -> dict[TP, int] | int:
    """The rows each task took from Spark, by its partition, in the form of
    :meth:`kafka_eos.sinks.proof.RowCount.counts` (above :data:`kafka_eos.sinks.proof.COUNTED_RANGES`
    ranges, their total), for :func:`kafka_eos.sinks.proof.check_rows` of a run through Spark
    Connect, whose server sends back no observation of the job it runs for the plugin. The tasks'
    own count, so a check of the JVM writer's bookkeeping, not of Spark's hand-off (there is none)."""
    from kafka_eos.sinks.proof import COUNTED_RANGES

    counts = {(r["topic"], r["partition"]): r["rows"] for r in results}
    if sum(1 for r in plan.active if not r.empty) > COUNTED_RANGES:
        return sum(counts.values())
    return counts
