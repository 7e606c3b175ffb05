"""spark-submit entry point of ``make bench``'s baseline: the same plan and transform as a
kafka-eos run, written with Spark's own Kafka sink (at-least-once: no transaction, no offsets),
or, for a spec with a SQL sink, with Spark's own JDBC writer (``df.write.jdbc(mode="append")``:
results into ``--table``, dead letters into ``<table>_dead``; PostgreSQL's JDBC driver on
``--jars``), or, for a spec with an Iceberg sink, with ``df.write.parquet(mode="append")`` into the
folder ``--parquet`` (dead letters into ``<folder>_dead``). With ``--noop`` it writes the Kafka sink's
rows nowhere (Spark's ``noop`` format), counting them: the floor of any sink that reads through Spark.
With ``--lz4`` it writes them with Spark's Kafka sink as above, but with kafka-eos's producer settings
(:data:`KAFKA_EOS_PRODUCER`): what a producer in the JVM costs beyond the floor when it batches and
compresses as kafka-eos does, transactions aside.

    spark-submit --jars <connector jars> include/kafka_eos_lab/bench/baseline_app.py --spec S --plan P
    python include/kafka_eos_lab/bench/baseline_app.py --spec S --plan P --spark-remote sc://127.0.0.1:15002

It reads the plan's ranges exactly as kafka-eos does (:func:`kafka_eos.spark_io.read_ranges`),
applies the spec's transform, and writes results to the sink topic and dead letters to the
dead-letter topic in one ``df.write.format("kafka")``. It is what a pipeline without
exactly-once would run; never use it for results (a retry duplicates its output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: kafka-eos's producer settings (``kafka_eos.txn``: lz4, a 20 ms linger, librdkafka's 1 MB batches)
#: as the Java producer under Spark's Kafka sink names them.
KAFKA_EOS_PRODUCER = {"kafka.compression.type": "lz4", "kafka.linger.ms": "20", "kafka.batch.size": "1000000"}


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import functions as F

    from kafka_eos.batch import transformed
    from kafka_eos.plan import Plan
    from kafka_eos.settings import KafkaSettings
    from kafka_eos.spark_io import get_session
    from kafka_eos.spec import load_spec
    from kafka_eos.transforms import DLQ_REASON

    parser = argparse.ArgumentParser(prog="baseline_app")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--spark-remote", help="run on this Spark Connect server (a plain Python process)")
    parser.add_argument("--table", help="a SQL sink's spec: the table the results are appended to (default: "
                                        "the spec's sink.table)")
    parser.add_argument("--noop", action="store_true",
                        help="a Kafka sink's spec: read and transform as for Spark's Kafka sink, write the rows "
                             "nowhere (format noop), and print how many there were")
    parser.add_argument("--lz4", action="store_true",
                        help="a Kafka sink's spec: Spark's Kafka sink with kafka-eos's producer settings")
    parser.add_argument("--parquet", help="an Iceberg sink's spec: the folder the results are appended to as "
                                          "Parquet files (dead letters: <folder>_dead)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    spec = load_spec(args.spec)
    plan = Plan.from_json(Path(args.plan).read_text(), args.plan)
    settings = KafkaSettings.from_environ(os.environ)
    spark = get_session(f"bench baseline {spec.name}", remote=args.spark_remote)
    if spec.sink.kind == "iceberg":
        out = transformed(spark, spec, plan, settings)
        out.results.write.mode("append").parquet(args.parquet)
        out.dead_letters.write.mode("append").parquet(f"{args.parquet}_dead")
        print("BASELINE_SUMMARY " + json.dumps({"seconds_in_app": round(time.monotonic() - started, 3)}))
        return 0
    if spec.sink.kind == "sql":
        out = transformed(spark, spec, plan, settings)
        url, props = jdbc_of(spec.sink.url)
        table = args.table or spec.sink.table
        out.results.write.jdbc(url, table, mode="append", properties=props)
        out.dead_letters.write.jdbc(url, f"{table}_dead", mode="append", properties=props)
        print("BASELINE_SUMMARY " + json.dumps({"seconds_in_app": round(time.monotonic() - started, 3)}))
        return 0
    results = transformed(spark, spec, plan, settings).results
    dlq = spec.sink.dlq_topic or spec.sink.topic
    out = results.select(
        F.when(F.col(DLQ_REASON).isNull(), F.lit(spec.sink.topic)).otherwise(F.lit(dlq)).alias("topic"),
        "key", "value", *(["headers"] if "headers" in results.columns else []))
    if args.noop:  # the floor: the same rows, computed in full, written nowhere
        from pyspark.sql import Observation

        seen = Observation("floor")
        out.observe(seen, F.count(F.lit(1)).alias("rows")).write.format("noop").mode("overwrite").save()
        print("BASELINE_SUMMARY " + json.dumps({"seconds_in_app": round(time.monotonic() - started, 3),
                                                "rows": seen.get["rows"]}))
        return 0
    writer = out.write.format("kafka")
    for key, value in {**settings.spark_options(), **(KAFKA_EOS_PRODUCER if args.lz4 else {})}.items():
        writer = writer.option(key, value)
    writer.save()
    print("BASELINE_SUMMARY " + json.dumps({"seconds_in_app": round(time.monotonic() - started, 3)}))
    return 0


def jdbc_of(url: str) -> tuple[str, dict]:
    """PostgreSQL's JDBC URL and connection properties of a SQLAlchemy URL (its password, if any,
    in the properties, never on a command line)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "postgresql":
        raise SystemExit(f"bench baseline: a JDBC baseline needs a PostgreSQL sink.url, not {u.get_backend_name()}")
    props = {"driver": "org.postgresql.Driver", "user": u.username or ""}
    if u.password:
        props["password"] = u.password
    return f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}", props


if __name__ == "__main__":
    sys.exit(main())
