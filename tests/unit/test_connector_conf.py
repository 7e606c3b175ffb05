"""How Spark gets its Kafka connector: the resolved jars where there are some, else (an installed
wheel, no checkout) the connector's Maven coordinates for the installed pyspark."""

from __future__ import annotations

from importlib.metadata import version

from kafka_eos.spark_io import SPARK_JARS_ENV, connector_conf


def test_without_jars_spark_resolves_the_connector_matching_pyspark(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_EOS_HOME", str(tmp_path))  # no jars/spark/ there
    assert connector_conf({}) == {
        "spark.jars.packages": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version('pyspark')},"
                               f"org.apache.spark:spark-avro_2.13:{version('pyspark')}"}


def test_resolved_or_named_jars_are_used_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_EOS_HOME", str(tmp_path))
    jars = tmp_path / "jars" / "spark"
    jars.mkdir(parents=True)
    for name in ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar"):
        (jars / name).write_bytes(b"")
    assert connector_conf({}) == {"spark.jars": f"{jars / 'kafka-clients-3.9.2.jar'},"
                                                f"{jars / 'spark-sql-kafka-0-10_2.13-4.2.0.jar'}"}
    assert connector_conf({SPARK_JARS_ENV: "/a.jar,/b.jar"}) == {"spark.jars": "/a.jar,/b.jar"}
