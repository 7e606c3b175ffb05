"""How Spark gets its Kafka connector: the resolved jars, never a download at run time (an
air-gapped cluster runs as any other); without them, one line saying how to get them."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from kafka_eos.errors import KafkaEosError
from kafka_eos.spark_io import SPARK_JARS_ENV, connector_conf, connector_package


def test_without_jars_nothing_is_downloaded_the_error_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_EOS_HOME", str(tmp_path))  # no jars/spark/ there
    with pytest.raises(KafkaEosError, match=rf"^no Spark Kafka connector \(spark-sql-kafka jar\) in {tmp_path}/jars/spark: "
                                            r"`kafka-eos spark jars` fetches it from Maven Central once"):
        connector_conf({})
    # What `kafka-eos spark jars` fetches, when asked: the connector of the installed pyspark.
    assert connector_package() == (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version('pyspark')},"
                                   f"org.apache.spark:spark-avro_2.13:{version('pyspark')}")


def test_resolved_or_named_jars_are_used_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_EOS_HOME", str(tmp_path))
    jars = tmp_path / "jars" / "spark"
    jars.mkdir(parents=True)
    for name in ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar"):
        (jars / name).write_bytes(b"")
    # kafka-eos's own jar (the Java login through a token callback) goes last, where it is built.
    from kafka_eos.spark_io import PACKAGED_JARS

    own = [str(PACKAGED_JARS / "kafka-eos-connect.jar")] if (PACKAGED_JARS / "kafka-eos-connect.jar").is_file() else []
    assert connector_conf({})["spark.jars"].split(",") == [
        str(jars / "kafka-clients-3.9.2.jar"), str(jars / "spark-sql-kafka-0-10_2.13-4.2.0.jar"), *own]
    assert connector_conf({SPARK_JARS_ENV: "/a.jar,/b.jar"})["spark.jars"].split(",") == ["/a.jar", "/b.jar", *own]
    # An image's folder that has it already: not twice.
    assert connector_conf({SPARK_JARS_ENV: "/a.jar,/opt/kafka-eos-connect.jar"})["spark.jars"] == \
        "/a.jar,/opt/kafka-eos-connect.jar"
