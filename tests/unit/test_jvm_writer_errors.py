"""How the JVM writer's errors reach kafka-eos's callers as kafka-eos's own error classes, from
the exceptions Py4J and a Spark Connect client raise (built here as those libraries build them; the
writer itself is proved against a real broker in tests/integration)."""

from __future__ import annotations

import pytest
from pyspark.errors.exceptions.connect import UnknownException

from kafka_eos import errors
from kafka_eos.sinks.jvm_writer import COMMIT_FAILED, commit_failed

LINE = "orders-0: group 'kafka-eos.p' is at 5, the plan expected 0 (ends at 10): a concurrent or stale plan"


class JavaClass:
    def __init__(self, name: str):
        self.name = name

    def getName(self) -> str:  # noqa: N802 - Py4J's spelling
        return self.name


class JavaException:
    def __init__(self, name: str, message: str):
        self.cls, self.message = JavaClass(name), message

    def getClass(self) -> JavaClass:  # noqa: N802
        return self.cls

    def getMessage(self) -> str:  # noqa: N802
        return self.message


class Py4JLike(Exception):
    def __init__(self, java: JavaException):
        super().__init__(f"An error occurred while calling z:io.kafkaeos.writer.AtomicTransaction.commit.\n: "
                         f"{java.cls.name}: {java.message}\n\tat io.kafkaeos.writer.AtomicTransaction.run")
        self.java_exception = java


@pytest.mark.parametrize("kind", ["CheckpointConflict", "CheckpointLost", "TransactionTimedOut", "ProducerFenced",
                                  "DeadLetterWithoutTopic", "RecordRefused", "BrokerError", "TransactionFailed"])
def test_a_writer_error_by_py4j_is_raised_as_its_kafka_eos_class(kind):
    found = commit_failed(Py4JLike(JavaException(COMMIT_FAILED, f"kafka_eos.errors.{kind}: {LINE}")))
    assert type(found) is getattr(errors, kind) and str(found) == LINE


def test_a_writer_error_through_spark_connect_is_raised_as_its_kafka_eos_class():
    raised = UnknownException(f"kafka_eos.errors.TransactionTimedOut: {LINE}", reason=COMMIT_FAILED)
    assert str(raised).startswith(f"({COMMIT_FAILED}) kafka_eos.errors.")  # the client's own form
    found = commit_failed(raised)
    assert type(found) is errors.TransactionTimedOut and str(found) == LINE


def test_other_errors_are_left_as_they_were_raised():
    # A failed Spark job (its text may quote a kafka-eos error of a task), another Java class, no Java at all.
    job = Py4JLike(JavaException("org.apache.spark.SparkException", f"Job aborted: kafka_eos.errors.SpecError: {LINE}"))
    assert commit_failed(job) is None
    assert commit_failed(UnknownException(f"kafka_eos.errors.SpecError: {LINE}", reason="java.lang.RuntimeException")) \
        is None
    assert commit_failed(ValueError(LINE)) is None
    # A class kafka-eos does not have: left as raised, not guessed.
    assert commit_failed(Py4JLike(JavaException(COMMIT_FAILED, f"kafka_eos.errors.NoSuchError: {LINE}"))) is None
