"""The Kafka sink's transactions with the records produced from the JVM (``io.kafkaeos.writer`` in
kafka-eos's jar, jvm/connect).

**per_partition** (:func:`commits`): the commit job's tasks in the executors' JVM, the same transactions as the Python
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

**atomic** (:func:`atomic`): the whole plan's transaction in the driver's JVM, the steps of
:mod:`kafka_eos.txn` as :func:`kafka_eos.sinks.atomic.write_atomic` takes them in one pass, with the
rows handed from the job's tasks to the driver as Spark's own binary rows, not as Arrow batches for
the driver's Python; each source partition's rows in their order (the tasks ordered as
:func:`kafka_eos.sinks.batches.turns` orders them, from the lineage of the job the writer runs). By
Py4J the driver's JVM; through a Spark Connect server, the server's (the relation
``kafka_eos.AtomicCommit``; a server whose plugin predates it refuses it, and the client's Python
producer takes the run). A stream's batches (a kept producer) and every run where
``KAFKA_EOS_WRITER=python`` is set keep the driver's Python producer.

The tests' fault points (:func:`kafka_eos.probes.carried`, else the executor's own environment) act
in the writer too: a crash SIGKILLs the JVM that produces (the executor; in local mode the driver),
except in a Spark Connect server's own JVM, where it kills the task alone and leaves its transaction
open (the server every session shares lives on, as it does when a Python task's worker is killed).
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import uuid
import logging
from collections import Counter
from typing import TYPE_CHECKING

from kafka_eos import errors, probes
from kafka_eos.kafka_admin import TP
from kafka_eos.manifest import run_key
from kafka_eos.plan import Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.limits import DEFAULT_BATCH_SIZE, DEFAULT_PRODUCER_MAX, producer_batch_bytes
from kafka_eos.spark_io import is_connect
from kafka_eos.spec import PipelineSpec
from kafka_eos.txn import CommitResult

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: ``python``: every per_partition commit job takes the Python commit task; ``jvm`` (the default):
#: the JVM writer where it applies (the module's docstring).
WRITER_ENV = "KAFKA_EOS_WRITER"
#: The writer's entry point in kafka-eos's jar.
ENTRY = "io.kafkaeos.writer.PartitionCommits"
#: The atomic scope's entry point (the driver's JVM).
ATOMIC_ENTRY = "io.kafkaeos.writer.AtomicTransaction"
#: The Java class of a kafka-eos error raised by the writer (its message: ``kafka_eos.errors.<Class>: …``).
COMMIT_FAILED = "io.kafkaeos.writer.Transaction$CommitFailed"


#: The relation kafka-eos's Spark Connect server plugin answers by running the commit job.
COMMIT_TYPE = "type.googleapis.com/kafka_eos.PartitionCommits"
#: The relation it answers by running an atomic run's transaction in the server's driver JVM.
ATOMIC_TYPE = "type.googleapis.com/kafka_eos.AtomicCommit"
#: Connect sessions whose server refused a relation (an older plugin), by relation: asked once a session.
_no_commit_plugin: dict[str, set[str]] = {COMMIT_TYPE: set(), ATOMIC_TYPE: set()}


def applies(df: "DataFrame", one_pass: bool, keep: bool, dead: dict | None) -> bool:
    """Whether the commit job of ``df`` takes the JVM writer (the module's docstring)."""
    if _python_asked():
        return False
    if not one_pass or keep or any(dead.values() if dead else ()):
        return False
    if is_connect(df):
        return df.sparkSession.session_id not in _no_commit_plugin[COMMIT_TYPE]
    return _entry(df) is not None


def _python_asked() -> bool:
    """Whether ``KAFKA_EOS_WRITER=python`` (:data:`WRITER_ENV`) sends every commit to the Python writers."""
    return os.environ.get(WRITER_ENV, "jvm").strip().lower() == "python"


def _entry(df: "DataFrame", name: str = ENTRY):
    """The writer's class ``name`` through Py4J, or None where the session's class path lacks it."""
    jvm = df.sparkSession.sparkContext._jvm
    try:
        jvm.java.lang.Class.forName(name, False, jvm.Thread.currentThread().getContextClassLoader())
    except Exception:  # noqa: BLE001 - an older jar, or none: the Python writer
        return None
    return getattr(jvm, name)


def _common(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings) -> dict:
    """What either scope's Java transaction needs: the Java client's settings (secrets among them:
    this text goes to the executors, as the Kafka read's options do, and is never logged), the
    group, the sink's topics, headers and record limits, the manifest's names, the fault points."""
    from kafka_eos.spark_io import _executor_python

    sink = spec.sink
    client = {key[len("kafka."):]: str(value)
              for key, value in settings.spark_options(python=_executor_python(df.sparkSession)).items()}
    return {
        "client": client, "group_id": spec.source.group_id, "sink_topic": sink.topic, "dlq_topic": sink.dlq_topic,
        "headers": [[name, base64.b64encode(value).decode()] for name, value in sink.headers],
        "timeout_ms": sink.transaction_timeout_s * 1000,
        "batch_bytes": producer_batch_bytes(spec) or DEFAULT_BATCH_SIZE,
        "producer_max": int(settings.extra.get("message.max.bytes", DEFAULT_PRODUCER_MAX)),
        "limits": {topic: [producer_max, topic_max] for topic, producer_max, topic_max in sink.record_limits},
        "on_refused_record": sink.on_refused_record, "spec_path": str(spec.path), "transform": spec.transform,
        "manifest_topic": spec.manifest_topic, "pipeline": plan.pipeline, "spec_name": spec.name, "run_id": plan.run_id,
        "planned_ms": plan.planned_ms, "probes": probes.carried(),
    }


def job(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, owner: dict[int, TP]) -> str:
    """What every task of the per_partition commit job needs, as JSON (:func:`_common`), with the
    ids and each task's range."""
    ranges = {r.tp: r for r in plan.active}
    tasks = {str(index): {"topic": tp[0], "partition": tp[1], "from": ranges[tp].from_offset,
                          "until": ranges[tp].until, "expected": ranges[tp].expected,
                          "transactional_id": spec.transactional_id(tp[0], tp[1])}
             for index, tp in owner.items()}
    return json.dumps({
        **_common(df, spec, plan, settings), "fences": [spec.transactional_id()], "tasks": tasks,
        "job_id": _job_id(),  # a new request each time: no cache of planned relations answers it
    })


def atomic_applies(df: "DataFrame") -> bool:
    """Whether an atomic run's one pass over ``df`` takes the JVM writer (the module's docstring;
    the caller has left out a stream's kept commit)."""
    if _python_asked():
        return False
    if is_connect(df):
        return df.sparkSession.session_id not in _no_commit_plugin[ATOMIC_TYPE]
    return _entry(df, ATOMIC_ENTRY) is not None


def atomic(df: "DataFrame", spec: PipelineSpec, plan: Plan, settings: KafkaSettings, summary: dict,
           tally: Counter | None = None) -> CommitResult | None:
    """The whole plan's transaction over ``df`` (:func:`kafka_eos.sinks.batches.prepared` columns)
    in the driver's JVM, as :func:`kafka_eos.sinks.atomic.write_atomic` commits one pass: the
    fencing and the checkpoint check beside the job (a no-op or a conflict cancels it), every row,
    the offsets, the run's manifest record (``summary`` and the counts) and the checkpoint records.

    :param tally: filled with per-source-partition counts (as :func:`kafka_eos.sinks.batches.records`).
    :returns: None where a Spark Connect server's plugin does not run it (nothing ran: the
        driver's Python producer takes the run).
    :raises KafkaEosError: the writer's, as the Python writer raises it (``CheckpointConflict``,
        ``TransactionTimedOut``, ``DeadLetterWithoutTopic``, …); a failed job's own error as it is.
    """
    job_id = _job_id()  # a new request each time: no cache of planned relations answers it
    text = json.dumps({
        **_common(df, spec, plan, settings), "transactional_id": spec.transactional_id(),
        "fences": [spec.transactional_id(r.topic, r.partition) for r in plan.active],
        "ranges": [{"topic": r.topic, "partition": r.partition, "from": r.from_offset, "until": r.until,
                    "expected": r.expected} for r in plan.active],
        "run_key": run_key(plan.pipeline, plan.run_id), "summary": summary, "job_id": job_id,
    })
    try:
        if is_connect(df):
            answer = _through_connect(df, text, ATOMIC_TYPE)
            if answer is None:
                return None
            result = answer[0]
        else:
            entry = _entry(df, ATOMIC_ENTRY)
            try:
                result = json.loads(entry.commit(df._jdf, text))
            except BaseException as exc:
                if not _answered(exc):  # interrupted here (a signal, a task's timeout) while the JVM goes on:
                    _cancel(entry, job_id)  # its transaction must not commit after this process gave up on it
                raise
    except Exception as exc:  # noqa: BLE001 - the writer's own errors as kafka-eos's; the rest as raised
        raised = commit_failed(exc)
        if raised is None:
            raise
        raise raised from None
    log.info("%s: atomic, the records produced from the %s JVM", spec.name,
             "Spark Connect server's" if is_connect(df) else "driver's")
    if tally is not None:
        for topic, partition, out, dead in result["tally"]:
            tally[((topic, partition), "out")] += out
            if dead:
                tally[((topic, partition), "dead")] += dead
    return CommitResult(result["status"], result["records_out"], result["dead_letters"], "built")


def _job_id() -> str:
    """A new job's id: the JVM writer's name of it (``AtomicTransaction.cancel`` takes it)."""
    return uuid.uuid4().hex


def _answered(exc: BaseException) -> bool:
    """Whether ``exc`` is the JVM's own answer to a Py4J call (its call has ended), not this process's."""
    from pyspark.errors.exceptions.captured import CapturedException

    return getattr(exc, "java_exception", None) is not None or isinstance(exc, CapturedException)


def _cancel(entry, job_id: str) -> None:
    """Tell the driver's JVM writer to give up job ``job_id``: it aborts instead of beginning or committing."""
    try:
        entry.cancel(job_id)
    except Exception:  # noqa: BLE001 - a gateway that is gone has no JVM left to commit
        log.info("could not cancel the JVM writer's transaction (job %s)", job_id, exc_info=True)


_COMMIT_FAILED_TEXT = re.compile(r"kafka_eos\.errors\.(\w+): (.*)", re.S)


def commit_failed(exc: BaseException) -> "errors.KafkaEosError | None":
    """The kafka-eos error the JVM writer raised where the transaction runs (the driver's JVM: a Py4J
    error of its ``CommitFailed``; a Spark Connect server: the client's error, whose text is
    ``(io.kafkaeos.writer.Transaction$CommitFailed) kafka_eos.errors.<Class>: …``), or None."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        if java.getClass().getName() != COMMIT_FAILED:
            return None
        message = java.getMessage() or ""
    else:
        text = str(exc)
        if COMMIT_FAILED not in text:
            return None
        message = text.split(COMMIT_FAILED, 1)[1].lstrip(":) ")
    found = _COMMIT_FAILED_TEXT.match(message)
    kind = getattr(errors, found.group(1), None) if found else None
    if not (isinstance(kind, type) and issubclass(kind, errors.KafkaEosError)):
        return None
    return kind(found.group(2).split("\n", 1)[0].strip())


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
        return _through_connect(df, text, COMMIT_TYPE)
    return [json.loads(result) for result in _entry(df).commit(df._jdf, text)]


def _through_connect(df: "DataFrame", text: str, kind: str) -> list[dict] | None:
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    from pyspark.sql.connect.plan import CachedRelation
    from pyspark.sql.connect.proto import Relation

    session = df.sparkSession
    relation = df._plan.plan(session.client).SerializeToString()
    ask = Relation()
    ask.extension.type_url = kind
    ask.extension.value = struct.pack(">i", len(relation)) + relation + text.encode()
    tag = f"kafka-eos-commit-{uuid.uuid4().hex}"
    session.addTag(tag)
    settled = False
    try:
        rows = ConnectDataFrame(CachedRelation(ask), session).collect()
        settled = True
    except Exception as exc:  # noqa: BLE001 - only a server without the relation is not a failure of the job
        if not any(m in str(exc) for m in ("NO_HANDLER_FOR_EXTENSION", "No handler found for extension")):
            raise
        settled = True  # nothing ran
        _no_commit_plugin[kind].add(session.session_id)
        log.info("the Spark Connect server's kafka-eos plugin does not run %s (%s): the Python writer does",
                 "per_partition commit jobs" if kind == COMMIT_TYPE else "atomic transactions",
                 str(exc).splitlines()[0][:200])
        return None
    finally:
        session.removeTag(tag)
        if not settled:
            # Left without the answer (an error, a timeout, an interrupt): the server's work is stopped,
            # so that it cannot go on to commit after this process has failed (stopping a finished
            # operation does nothing).
            try:
                session.interruptTag(tag)
            except Exception:  # noqa: BLE001 - a server out of reach: the error that brought us here is raised
                log.info("could not interrupt the Spark Connect server's work (%s)", tag, exc_info=True)
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
