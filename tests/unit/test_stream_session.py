"""A stream's own Spark session: PySpark's DataFrame call-site capture off (Py4J round trips in
every batch), unless the pipeline's ``spark:`` section says otherwise; kafka-eos's other settings
and the pipeline's own are kept."""

from __future__ import annotations

from kafka_eos.spark_io import merged_conf, session_conf as base_conf
from kafka_eos.stream import session_conf

DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


def test_a_stream_turns_the_call_site_capture_off():
    conf = session_conf({"spark.sql.shuffle.partitions": "3"})
    assert conf[DEBUGGING] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "3"


def test_the_pipeline_may_turn_it_back_on():
    assert session_conf({DEBUGGING: "true"})[DEBUGGING] == "true"


def test_the_session_gets_kafka_eos_settings_under_the_streams():
    # What get_session builds from a stream's settings: the connector and the rest of kafka-eos's.
    built = merged_conf(base_conf(), session_conf({}))
    assert built[DEBUGGING] == "false"
    assert built["spark.speculation"] == "false"
