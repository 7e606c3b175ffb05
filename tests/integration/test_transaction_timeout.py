"""An atomic Kafka transaction that outlasts its timeout while Spark computes is not the end of
the run, the timeout is a spec setting the brokers must accept, and it counts from the
transaction's first record."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, Producer

from kafka_eos import kafka_admin
from kafka_eos.batch import run_batch
from kafka_eos.errors import SpecError
from kafka_eos.pipeline import prepare_plan
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders
from kafka_eos.sinks import jvm_writer
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.waits]

SLOW = '''
import time
from pyspark.sql import functions as F

@F.udf("binary")
def _slowly(value):
    time.sleep(0.25)
    return value + b" " * 200_000  # 200 records: 40 MB of output

def slow_identity(df):
    return df.select("key", _slowly("value").alias("value"), "headers", "topic", "partition", "offset",
                     F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.fixture
def slow_transform(transforms_from):
    return transforms_from("slow_transforms", SLOW) + ":slow_identity"


@pytest.mark.parametrize("writer", ["jvm", pytest.param("python", marks=pytest.mark.chaos)])
def test_spark_time_longer_than_an_atomic_transaction_timeout_is_not_fatal(spark, kafka_settings, make_spec,
                                                                          slow_transform, capfd, monkeypatch, writer):
    """Three tasks of about 17 s of UDF time each on two cores, against a transaction timeout of 4 s
    (the coordinator looks every 5 s).

    ``jvm`` (a batch run's atomic writer, :func:`kafka_eos.sinks.jvm_writer.atomic`): the transaction
    opens only once the job has ended, so Spark's time does not count against it; one pass commits.

    ``python`` (the driver's Python producer: a stream's, an older Connect server's): one pass keeps
    the transaction open while Spark computes. The first task's rows go to the producer after about
    17 s and the last task ends about 17 s later, so the coordinator aborts the transaction before
    the job can end. The run then computes the output first and commits it after, instead of failing
    on every try; the second pass's transaction is open only while its 40 MB stream to the producer
    (3 s on a busy machine). (Tasks of 8 s and a 1 s timeout: the second pass's transaction was
    aborted too, once.) 40 MB of output: the one-pass job's results that nobody read any more once
    its transaction was aborted filled the socket to the driver, and Spark's scheduler, blocked on
    it, never started the fallback's job (a hang) until the one-pass job was cancelled by the garbage
    collector. 85 s: in ``make chaos``."""
    if writer == "python":
        monkeypatch.setenv(jvm_writer.WRITER_ENV, "python")
    spec = make_spec(slow_transform, "kafka", "atomic", transaction_timeout_s=4)
    produce_orders(kafka_settings, spec.source.topics[0], 200, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    summary = run_batch(spark, spec, plan, kafka_settings)
    assert (summary.status, summary.records_out) == ("committed", 200)
    out = read_committed(kafka_settings, spec.sink.topic)
    assert len(out) == 200 and all(len(m.value) > 200_000 for m in out)
    err = capfd.readouterr().err
    if writer == "python":
        assert "aborted by the transaction coordinator after the transaction timeout of 4s" in err
        assert "computing the output first, then committing it" in err
    else:
        assert "transaction timeout" not in err and "computing the output first" not in err, err[-3000:]


def test_a_timeout_above_the_brokers_limit_fails_before_spark(spark, kafka_settings, make_spec):
    spec = make_spec("identity", "kafka", "atomic", transaction_timeout_s=3600)
    produce_orders(kafka_settings, spec.source.topics[0], 10, abort_every=0, malformed_every=0)
    plan = prepare_plan(spec, kafka_settings, "r1")
    with pytest.raises(SpecError, match=r"sink.transaction_timeout_s: 3600 is above the brokers' "
                                        r"transaction.max.timeout.ms \(900 s\)"):
        run_batch(spark, spec, plan, kafka_settings)
    tps = [r.tp for r in plan.ranges]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}


#: The transaction timeout of the test below (6 s: a commit right after a record stays well within
#: it on a busy machine), and how long its late first record waits after ``begin_transaction``: past
#: the timeout and the coordinator's next look (every 5 s on the test brokers,
#: ``transaction.abort.timed.out.transaction.cleanup.interval.ms``), with 5 s to spare.
CLOCK_TIMEOUT_S, LATE_FIRST_RECORD_S = 6, 16


def test_the_transaction_timeout_counts_from_the_first_record_not_from_begin(kafka_settings, unique):
    """What ``sink.transaction_timeout_s`` counts (docs/configuration.md): at the coordinator a
    transaction starts with its first record, not with ``begin_transaction``
    (librdkafka, without KIP-890's second transaction protocol, adds a partition with its first
    record; ``begin_transaction`` sends nothing). So a one-pass atomic run's timeout runs from the
    first rows the driver produces, not from its Spark job's start."""
    topic = f"{unique}.out"
    kafka_admin.create_topics(kafka_settings, {topic: 1})

    def producer(name: str) -> Producer:
        p = Producer({**kafka_settings.client_config(), "transactional.id": f"{unique}-{name}",
                      "transaction.timeout.ms": CLOCK_TIMEOUT_S * 1000})
        p.init_transactions(30)
        return p

    # Begun long before its first record, committed right after it: within its timeout.
    late = producer("late")
    late.begin_transaction()
    time.sleep(LATE_FIRST_RECORD_S)
    late.produce(topic, b"late")
    late.commit_transaction(30)

    # Its first record long before the commit: the coordinator aborts it (and bumps its epoch).
    early = producer("early")
    early.begin_transaction()
    early.produce(topic, b"early")
    assert early.flush(30) == 0
    admin = kafka_admin.transaction_admin(kafka_settings)
    try:
        txid = f"{unique}-early"

        def ended() -> bool:
            state = admin.describe_transactions([txid])[txid].state
            return getattr(state, "value", str(state)) in ("PrepareAbort", "CompleteAbort")

        wait_until("the coordinator's abort of the early transaction", ended, 60, every_s=0.5)
    finally:
        admin.close()
    with pytest.raises(KafkaException) as failed:
        early.commit_transaction(30)
    assert failed.value.args[0].fatal(), failed.value  # fenced by its coordinator's epoch bump

    assert [m.value for m in read_committed(kafka_settings, topic)] == [b"late"]
