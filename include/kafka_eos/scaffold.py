"""``kafka-eos new NAME``: the files of a new pipeline, in a project folder of your own.

    pipelines/NAME.yaml          the spec (KAFKA_EOS_PIPELINES_DIR names this folder)
    PACKAGE/__init__.py          the package of your transforms (importable: see below)
    PACKAGE/NAME.py              the transform: JSON values in, the fields you keep out, bad
                                 records to the dead letters
    tests/test_NAME.py           a unit test of the transform on a local SparkSession

The spec names the transform ``PACKAGE.NAME:transform``. kafka-eos imports it from the installed
packages first, then from the spec's project folder (the parent of ``pipelines/``), so the
project folder works as it is; install it (``pip install -e .``) where Spark's executors must
import it too (Python UDFs on a cluster).

Nothing is overwritten: a file that exists stops the command before anything is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kafka_eos.errors import SpecError

#: A pipeline name: also a Python module name and part of topic, group and DAG names.
NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class NewPipeline:
    """What ``kafka-eos new`` writes (paths relative to the project folder)."""

    name: str
    spec: dict
    files: dict[Path, str]


def _transform_module(name: str) -> str:
    return f'''"""The transform of pipeline ``{name}``: JSON records in, the fields kept out.

The input has one row per committed source record, as Spark's Kafka connector reads it: ``key``,
``value`` (binary), ``headers``, ``topic``, ``partition``, ``offset``, ``timestamp``. The output
keeps ``topic``, ``partition`` and ``offset`` (the source coordinates), sets ``key`` and ``value``
(the record written) and ``dlq_reason``: null for a result, else why the source record is a dead
letter (it then carries the source key and value). Built from Spark SQL functions only (no Python
UDF): executors never need to import this module.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

#: from_json puts the text of a value that is not a JSON object here (PERMISSIVE mode).
CORRUPT = "_corrupt_record"
#: The fields read from each JSON value; a record without ``id`` is a dead letter.
SCHEMA = T.StructType([T.StructField("id", T.StringType()), T.StructField("payload", T.StringType()),
                       T.StructField(CORRUPT, T.StringType())])


def transform(df: DataFrame) -> DataFrame:
    parsed = F.from_json(F.col("value").cast("string"), SCHEMA, {{"columnNameOfCorruptRecord": CORRUPT}})
    out = df.withColumn("_parsed", parsed)
    malformed = F.col("_parsed").isNull() | F.col(f"_parsed.{{CORRUPT}}").isNotNull()
    reason = (F.when(malformed, F.lit("malformed JSON"))
              .when(F.col("_parsed.id").isNull(), F.lit("missing field: id")))
    kept = F.to_json(F.struct(F.col("_parsed.id").alias("id"), F.col("_parsed.payload").alias("payload")))
    return out.select(
        "topic", "partition", "offset",
        F.when(reason.isNull(), F.col("_parsed.id").cast("binary")).otherwise(F.col("key")).alias("key"),
        F.when(reason.isNull(), kept.cast("binary")).otherwise(F.col("value")).alias("value"),
        reason.alias("dlq_reason"),
    )
'''


def _structured_transform_module(name: str, fmt: str) -> str:
    return f'''"""The transform of pipeline ``{name}``: {fmt} records in, {fmt} records out (docs/formats.md).

kafka-eos decodes each record's value with the source subject's latest schema (its writer schema
resolved to it): ``value`` is a struct of the schema's fields, ``key`` the key's text. The output's
``value`` is a struct too: kafka-eos derives its schema, registers it under the output topic's
subject (refused before anything is written if the subject's compatibility rule refuses it) and
encodes it. ``dlq_reason`` is null for a result, else why the record is a dead letter (its value
is then written to the dead letters as JSON text). Records that do not decode never reach the
transform: kafka-eos writes them as dead letters itself. Built from Spark SQL functions only.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def transform(df: DataFrame) -> DataFrame:
    record = F.col("value")
    reason = F.when(record.isNull(), F.lit("no value (a tombstone)"))
    # Keep every field of the reader schema; add, rename or drop fields here.
    kept = F.struct(*(record[f].alias(f) for f in df.schema["value"].dataType.fieldNames()))
    return df.select("topic", "partition", "offset", F.col("key"), kept.alias("value"), reason.alias("dlq_reason"))
'''


def _structured_test_module(name: str, package: str) -> str:
    return f'''"""Unit test of the transform of pipeline ``{name}``: rows as kafka-eos hands them over, decoded."""

import pytest
from pyspark.sql import SparkSession

from {package}.{name} import transform


@pytest.fixture(scope="module")
def spark():
    session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    yield session
    session.stop()


def test_records_keep_their_fields_and_tombstones_are_dead_letters(spark):
    df = spark.createDataFrame(
        [("c-1", ("o-1", 12.5), "in", 0, 0), ("c-2", None, "in", 0, 1)],
        "key string, value struct<order_id: string, amount: double>, topic string, partition int, offset long")
    rows = sorted(transform(df).collect(), key=lambda r: r.offset)
    assert [r.dlq_reason for r in rows] == [None, "no value (a tombstone)"]
    assert rows[0].value.asDict() == {{"order_id": "o-1", "amount": 12.5}}
'''


def _test_module(name: str, package: str) -> str:
    return f'''"""Unit test of the transform of pipeline ``{name}``: rows as Spark's Kafka connector reads them."""

import json

import pytest
from pyspark.sql import SparkSession

from {package}.{name} import transform


@pytest.fixture(scope="module")
def spark():
    session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    yield session
    session.stop()


def test_valid_records_pass_and_bad_ones_are_dead_letters(spark):
    values = [json.dumps({{"id": "a", "payload": "x"}}), "not json", json.dumps({{"payload": "y"}})]
    df = spark.createDataFrame(
        [(None, v.encode(), "in", 0, i) for i, v in enumerate(values)],
        "key binary, value binary, topic string, partition int, offset long")
    rows = sorted(transform(df).collect(), key=lambda r: r.offset)
    assert [r.dlq_reason for r in rows] == [None, "malformed JSON", "missing field: id"]
    assert json.loads(rows[0].value) == {{"id": "a", "payload": "x"}}
    assert rows[0].key == b"a"
'''


def new_pipeline(name: str, *, package: str = "transforms", source: str | None = None,
                 sink_topic: str | None = None, schedule: str | None = "*/5 * * * *",
                 commit: str = "atomic", fmt: str = "json") -> NewPipeline:
    """The spec and files of a new Kafka-to-Kafka pipeline ``name``.

    :param source: the topic it reads (default ``NAME.in``); sink ``NAME.out``, dead letters
        ``NAME.dlq``, side runs ``NAME.backfill`` unless given.
    :param fmt: the records' format in and out: ``json`` (the transform parses the bytes), or
        ``avro``, ``protobuf``, ``json_schema`` (decoded and encoded through the Schema Registry).
    :raises SpecError: the name or package is not usable.
    """
    if not NAME.match(name):
        raise SpecError(f"{name!r}: a pipeline name is lower case letters, digits and '_', starting with a letter")
    if not NAME.match(package):
        raise SpecError(f"--package {package!r}: a package name is lower case letters, digits and '_'")
    spec = {
        "name": name,
        "source": {"topics": [source or f"{name}.in"], "starting_offsets": "earliest",
                   "max_records_per_partition": 100000, "on_data_loss": "fail"},
        "transform": f"{package}.{name}:transform",
        "sink": {"kind": "kafka", "topic": sink_topic or f"{name}.out", "dlq_topic": f"{name}.dlq",
                 "backfill_topic": f"{name}.backfill", "commit": commit},
    }
    if fmt != "json":
        spec["source"].update(format=fmt, key_format="string")
        spec["sink"].update(format=fmt)
    if schedule:
        spec["schedule"] = schedule
    header = (f"# Pipeline {name}: committed records of {spec['source']['topics'][0]} -> {package}.{name}:transform"
              f" -> {spec['sink']['topic']}, exactly once.\n# Topics: kafka-eos topics create {name} (a dry run; "
              "--yes creates them). Checks: kafka-eos validate " + name + ".\n")
    files = {
        Path("pipelines") / f"{name}.yaml": header + yaml.safe_dump(spec, sort_keys=False),
        Path(package) / "__init__.py": f'"""Transforms of the kafka-eos pipelines in ../pipelines/."""\n',
        Path(package) / f"{name}.py": _transform_module(name) if fmt == "json" else
        _structured_transform_module(name, fmt),
        Path("tests") / f"test_{name}.py": _test_module(name, package) if fmt == "json" else
        _structured_test_module(name, package),
    }
    return NewPipeline(name, spec, files)


def write(project: Path, pipeline: NewPipeline) -> list[Path]:
    """Write the pipeline's files under ``project``; an ``__init__.py`` that exists is kept.

    :raises SpecError: one of its files exists already (nothing is written then).
    """
    targets = {project / rel: text for rel, text in pipeline.files.items()}
    taken = [p for p in targets if p.exists() and p.name != "__init__.py"]
    if taken:
        raise SpecError(f"{taken[0]}: exists already; nothing was written (choose another name or remove it)")
    written = []
    for path, text in targets.items():
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
