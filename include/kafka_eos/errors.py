"""One error hierarchy for kafka-eos. Every message is one line that names the thing."""

from __future__ import annotations


def mentions(exc: BaseException | None, text: str) -> bool:
    """Whether ``exc``, or an error it was raised from (its cause or context, ten deep), says
    ``text``: how a failure inside Spark is known by its message (a Py4J or Spark Connect error
    carries the JVM's or the task's text)."""
    seen = 0
    while exc is not None and seen < 10:
        if text in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def task_traceback(exc: BaseException) -> tuple[str, list[str]] | None:
    """The last Python traceback in ``exc``'s text (a Spark task's Python error reaches the driver
    as the text of a PythonException or Py4JJavaError, whose first line says only that there was
    one): its exception line and its frames' files, innermost last; None where there is none."""
    text = str(exc)
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    files = []
    for line in text[at:].splitlines()[1:]:
        if line.startswith("  File \""):
            files.append(line[len("  File \""):].split("\"", 1)[0])
        elif line.strip() and not line.startswith((" ", "\t")):
            return line.strip(), files
    return None


class KafkaEosError(Exception):
    """Base of every error kafka-eos raises on purpose."""


class SpecError(KafkaEosError):
    """A pipeline spec is malformed (names the file and the field)."""


class TopicMissing(KafkaEosError):
    """A source, sink or dead-letter topic does not exist."""


class DataLossError(KafkaEosError):
    """A checkpoint points below the partition's log start: records were deleted unread."""


class CheckpointLost(KafkaEosError):
    """A partition has no committed offset, but the run manifest shows kafka-eos committed one."""


class TopicRecreated(KafkaEosError):
    """A checkpoint points beyond the partition's high watermark."""


class CheckpointConflict(KafkaEosError):
    """The committed offset is neither the plan's expected checkpoint nor its end."""


class TransactionFailed(KafkaEosError):
    """A Kafka transaction was aborted or could not be committed; nothing of it is visible."""


class ProducerFenced(TransactionFailed):
    """A newer attempt of the same work called init_transactions(): this attempt must stop."""


class TransactionTimedOut(TransactionFailed):
    """The transaction coordinator aborted a transaction that stayed open past its timeout."""


class BrokerError(KafkaEosError):
    """The local broker cannot be started, or a Kafka call failed (keeps the Kafka error code)."""


class BrokerUnreachable(BrokerError):
    """No broker of the bootstrap list answered within the connect timeout."""


class DeadLetterWithoutTopic(KafkaEosError):
    """A transform dead-lettered a record but the Kafka sink has no ``dlq_topic``."""


class RecordRefused(KafkaEosError):
    """A record (or row) the sink cannot take for its own sake, with ``sink.on_refused_record: fail``:
    names topic, partition, offset and why; the transaction it was part of is aborted."""


class IntervalNotStable(KafkaEosError):
    """A backfill's interval (or a replay's end, by time) may have records in a transaction still
    open: not readable yet."""


class PlanError(KafkaEosError):
    """A stored plan cannot be used (missing, malformed, or for another pipeline)."""


class NoOpenTransaction(KafkaEosError):
    """An abort names a partition and start offset where no open transaction starts."""


class AbortRefused(KafkaEosError):
    """An abort's guards refused it before anything was changed: the transaction is younger than
    its threshold, or only a partition marker could end it and the coordinator may still track it."""


class AbortFailed(KafkaEosError):
    """An abort ran, and the transaction is still open on the partition (or fencing its
    transactional.id failed)."""


class PipelineBusy(KafkaEosError):
    """A pipeline runs in one mode at a time: a stream owns it, or a batch run is in flight."""


class RegistryError(KafkaEosError):
    """The Schema Registry is unreachable, or refused or lacks what a pipeline needs; the run
    fails before it writes anything."""


class SchemaRefused(RegistryError):
    """An output schema the subject's compatibility rule refuses: nothing was written."""


class TransformFailed(KafkaEosError):
    """The pipeline's transform raised while it built the run's DataFrame (an unknown column, its
    own error), or its code raised in a Spark task (a UDF on a record); names the spec and the
    transform. Retried like any run error: building may read (a Connect server's round trip, a job
    the transform runs) and a UDF may call a service, and fail for a passing reason."""


class InputTruncated(KafkaEosError):
    """A Spark task's input ended without Spark's own end of input (the read or the transform
    failed on the JVM, or the executor was lost): its partition's transaction was aborted,
    nothing of the range is committed."""


class RangeMismatch(KafkaEosError):
    """A committed range's records do not add up: what the range holds against the results, dead
    letters (and filtered records) its run committed; names the partition and the numbers."""


class PipelineHeld(KafkaEosError):
    """A run found a range committed short (:class:`RangeMismatch`): the pipeline plans nothing
    more, batch or stream, until an operator acknowledges the finding (``kafka-eos acknowledge``);
    names the partition, the run and the command."""


#: The CLI's exit code for :class:`RangeMismatch` and :class:`PipelineHeld`: a person must act (repair
#: the range, then acknowledge it); a retry or a restarted stream cannot help.
EXIT_HELD = 4


class ResultTooLarge(KafkaEosError):
    """One Spark task's output is more than ``spark.driver.maxResultSize`` lets the driver take:
    names the setting and what to change."""
