"""The group id of Spark's consumers in kafka-eos's reads: one per option set in a process (Spark
pools its consumers by group id and partition, and refuses other Kafka parameters under one key),
and no secret in it."""

from __future__ import annotations

from kafka_eos.kafka_admin import READER_GROUP_PREFIX
from kafka_eos.settings import KafkaSettings
from kafka_eos.spark_io import spark_reader_group


def test_one_option_set_one_group_and_another_set_another():
    plain = KafkaSettings("b:9092").spark_options()
    secured = KafkaSettings("b:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                       "sasl.username": "u", "sasl.password": "hunter2"}).spark_options()
    rotated = KafkaSettings("b:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                       "sasl.username": "u", "sasl.password": "hunter3"}).spark_options()
    assert spark_reader_group(plain) == spark_reader_group(dict(reversed(list(plain.items()))))
    ids = {spark_reader_group(o) for o in (plain, secured, rotated)}
    assert len(ids) == 3
    for group in ids:
        assert group.startswith(f"{READER_GROUP_PREFIX}spark.")  # the readers' ACL prefix covers it
        assert "hunter" not in group and "b:9092" not in group
