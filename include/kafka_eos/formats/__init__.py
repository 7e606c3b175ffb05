"""Record formats (docs/formats.md): Avro, Protobuf and JSON Schema in the Confluent wire format
(byte 0 = 0, bytes 1-4 = the schema id, big-endian, then the payload; Protobuf adds message indexes)
with schemas in a Schema Registry, decoded before the transform and encoded after it.

The driver reads the schemas before Spark starts (:func:`source_decoders`, :func:`sink_encoders`):
a registry that does not answer fails the run before anything is written, and an output schema the
subject's compatibility rule refuses is refused before the first commit. Executors never call the
registry: the schemas travel in the plan.

Decoding runs on the JVM where Spark can: Avro with spark-avro's ``from_avro``, once per writer
schema (every version of the source's subjects), each resolved to the reader schema with Avro's
rules (``avroSchema``); JSON Schema with ``from_json``. Protobuf is decoded in Python
(:mod:`kafka_eos.formats.protobuf`). A record that does not decode (a wrong magic byte, a schema id
not among the subjects' versions, a payload that does not decode) is a dead letter with its
reason, in the run's own transaction.

One pass when every record decodes: a guard in the read fails the job at the first record that
does not (:data:`UNDECODABLE`), and the run is done again in two passes — the decoded records
cached, the transform run over those that decoded, the others written as dead letters
(:func:`decoded`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kafka_eos.errors import RegistryError, mentions
from kafka_eos.formats import protobuf, schemas
from kafka_eos.formats.columns import DECODED, REASON
from kafka_eos.formats.registry import SCHEMA_TYPES, Registered, Registry
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import REGISTRY_FORMATS, PipelineSpec
from kafka_eos.transforms import DLQ_REASON

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import Column, DataFrame

#: The error a one-pass run's guard raises at the first record that does not decode.
UNDECODABLE = "kafka-eos: a record does not decode: "


@dataclass(frozen=True)
class Decoder:
    """How the source's ``key`` or ``value`` is decoded."""

    column: str  # key | value
    format: str
    reader: Registered | None = None  # the schema the transform receives (registry formats)
    writers: tuple[Registered, ...] = ()  # every schema the records may have been written with
    message: str | None = None  # Protobuf: the reader schema's message the records are (source.message)

    @property
    def subjects(self) -> str:
        return ", ".join(sorted({w.subject for w in self.writers} | ({self.reader.subject} if self.reader else set())))


def source_decoders(spec: PipelineSpec, settings: KafkaSettings) -> list[Decoder]:
    """The decoders of a run's source, their schemas read from the registry now.

    :raises RegistryError: no registry, the registry unreachable (naming its URL), the reader's
        subject or version missing, or a subject holding schemas of another format.
    """
    src = spec.source
    decoders = []
    for column, fmt, subject, version in (("key", src.key_format, src.key_subject, None),
                                          ("value", src.format, src.subject, src.reader_version)):
        if fmt in ("json", "raw"):
            continue  # the bytes, as read
        if fmt == "string":
            decoders.append(Decoder(column, fmt))
            continue
        field = "source.format" if column == "value" else "source.key_format"
        registry = Registry.of(settings, f"{spec.path}: {field} {fmt}")
        subjects = list(dict.fromkeys([subject or f"{src.topics[0]}-{column}",
                                       *(f"{t}-{column}" for t in src.topics)]))
        reader = registry.version(subjects[0], version)
        writers = {w.schema_id: w for s in subjects for w in registry.versions(s)}
        for schema in (reader, *writers.values()):
            if schema.schema_type != SCHEMA_TYPES[fmt]:
                raise RegistryError(f"{spec.path}: {field}: {fmt}, but subject {schema.subject!r} version "
                                    f"{schema.version} holds a {schema.schema_type} schema")
        decoders.append(Decoder(column, fmt, reader, tuple(writers.values()), src.message if column == "value" else None))
    return decoders


def decoded(df: "DataFrame", decoders: list[Decoder],
            guard: bool) -> tuple["DataFrame", "DataFrame | None", "DataFrame"]:
    """The source with its key and value decoded, and the records that did not decode.

    :param guard: one pass: the returned source fails its Spark job at the first record that does
        not decode (:data:`UNDECODABLE`), and there are no dead letters; else (two passes) the
        decoded source is cached and split into the records that decoded and the dead letters
        (``key``, ``value`` as read, ``headers``, source coordinates, ``dlq_reason``).
    :returns: ``(source for the transform, dead letters or None, every record)`` (the last is
        what a SQL sink counts as read); :func:`release` unpersists what was cached when the run is
        done.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if not decoders:
        return df, None, df
    for d in decoders:
        if d.format == "protobuf":
            df = _protobuf_decoded(df, d)
        else:
            value, reason = _jvm_decoded(df, d)
            df = df.select("*", value.alias(DECODED + d.column), reason.alias(DECODED + d.column + REASON))
    reason = F.coalesce(*(F.col(DECODED + d.column + REASON) for d in decoders))
    raw = [c for c in df.columns if not c.startswith(DECODED)]
    source = [F.col(DECODED + c).alias(c) if any(d.column == c for d in decoders) else F.col(c) for c in raw]
    if guard:
        guarded = df.where(F.when(reason.isNotNull(), F.raise_error(F.concat(F.lit(UNDECODABLE), reason)))
                           .otherwise(F.lit(True))).select(*source)
        return guarded, None, guarded
    df = df.select(*raw, *(F.col(DECODED + d.column) for d in decoders), reason.alias(DLQ_REASON))
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    good = df.where(F.col(DLQ_REASON).isNull()).select(*source)
    dead = df.where(F.col(DLQ_REASON).isNotNull()).select(
        "key", "value", *(["headers"] if "headers" in raw else []), "topic", "partition", "offset", DLQ_REASON)
    _cached.append(df)
    return good, dead, df


#: DataFrames :func:`decoded` cached, unpersisted by :func:`release`.
_cached: list = []


def release() -> None:
    """Unpersist what :func:`decoded` cached for a two-pass run."""
    while _cached:
        _cached.pop().unpersist()


def undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a one-pass guard's: a record did not decode."""
    return mentions(exc, UNDECODABLE)


def _at() -> "Column":
    from pyspark.sql import functions as F

    return F.concat(F.lit(" ("), F.col("topic"), F.lit("-"), F.col("partition").cast("string"),
                    F.lit(" offset "), F.col("offset").cast("string"), F.lit(")"))


def _header(column: str):
    """The wire header's parts: the magic byte (hex), the schema id, the payload after 5 bytes."""
    from pyspark.sql import functions as F

    b = F.col(column)
    return F.hex(F.substring(b, 1, 1)), F.conv(F.hex(F.substring(b, 2, 4)), 16, 10).cast("long"), \
        F.expr(f"substring(`{column}`, 6)")


def _jvm_decoded(df: "DataFrame", d: Decoder) -> tuple["Column", "Column"]:
    """The decoded column and the dead-letter reason, as Spark expressions (string, Avro, JSON Schema)."""
    from pyspark.sql import functions as F

    b = F.col(d.column)
    if d.format == "string":
        return b.cast("string"), F.lit(None).cast("string")
    magic, sid, payload = _header(d.column)
    ids = sorted({w.schema_id for w in d.writers})
    if d.format == "avro":
        value, broken = _avro(d, sid, payload)
        language = "Avro"
    else:
        value, broken = _json_schema(d, payload)
        language = "JSON"
    why = (F.when(b.isNull(), F.lit(None))
           .when(F.length(b) < 5, F.concat(F.lit(f"{d.column}: "), F.length(b).cast("string"),
                                           F.lit(" bytes, shorter than the Confluent wire format's 5-byte header")))
           .when(magic != "00", F.concat(F.lit(f"{d.column}: magic byte 0x"), magic,
                                         F.lit(" is not 0 (not the Confluent wire format)")))
           .when(~sid.isin(ids) if ids else F.lit(True),
                 F.concat(F.lit(f"{d.column}: schema id "), sid.cast("string"),
                          F.lit(f" is not a version of subject {d.subjects}")))
           .when(broken, F.concat(F.lit(f"{d.column}: payload of schema id "), sid.cast("string"),
                                  F.lit(f" does not decode as {language}"))))
    return value, F.when(why.isNotNull(), F.concat(why, _at()))


def _avro(d: Decoder, sid: "Column", payload: "Column") -> tuple["Column", "Column"]:
    """spark-avro's ``from_avro``, one branch per writer schema, each resolved to the reader; a
    payload that does not decode comes back (PERMISSIVE) as a record of nulls, told apart from a
    real record of nulls by its bytes (:func:`~kafka_eos.formats.schemas.avro_null_record`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader = json.loads(d.reader.schema)
    fields = [f["name"] for f in reader["fields"]] if isinstance(reader, dict) and reader.get("type") == "record" \
        else None
    value = broken = None
    for w in d.writers:
        branch = from_avro(payload, w.schema, {"avroSchema": d.reader.schema, "mode": "PERMISSIVE"})
        if fields:
            nulls = F.lit(True)
            for name in fields:
                nulls = nulls & branch.getField(name).isNull()
            valid_nulls = schemas.avro_null_record(w.schema)
            bad = nulls & (payload != F.lit(valid_nulls)) if valid_nulls is not None else nulls
        else:
            bad = branch.isNull()
        value = F.when(sid == w.schema_id, branch) if value is None else value.when(sid == w.schema_id, branch)
        broken = F.when(sid == w.schema_id, bad) if broken is None else broken.when(sid == w.schema_id, bad)
    if value is None:  # a subject with no versions: every record is a dead letter
        empty = from_avro(payload, d.reader.schema, {"mode": "PERMISSIVE"})
        return F.when(F.lit(False), empty), F.lit(True)
    return value, broken


def _json_schema(d: Decoder, payload: "Column") -> tuple["Column", "Column"]:
    """``from_json`` with the reader schema's Spark type: text that is not JSON, or whose values
    are not of their fields' types, is corrupt; a required field missing is too."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    reader = json.loads(d.reader.schema)
    dt = schemas.spark_of_json_schema(reader, f"subject {d.reader.subject!r} version {d.reader.version}")
    if not isinstance(dt, T.StructType):
        dt = T.StructType([T.StructField("value", dt)])
    corrupt = "_corrupt_record"
    parsed = F.from_json(payload.cast("string"), T.StructType([*dt.fields, T.StructField(corrupt, T.StringType())]),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt})
    value = F.struct(*(parsed.getField(f.name).alias(f.name) for f in dt.fields))
    broken = parsed.getField(corrupt).isNotNull()
    for name in reader.get("required", []) if isinstance(reader, dict) else []:
        if name in dt.fieldNames():
            broken = broken | parsed.getField(name).isNull()
    return value, broken


def _protobuf_decoded(df: "DataFrame", d: Decoder) -> "DataFrame":
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    where = f"subject {d.reader.subject!r} version {d.reader.version}"
    dt = schemas.spark_of_message(protobuf.reader_message(d.reader.schema, d.message), where)
    schema = T.StructType([*df.schema.fields, T.StructField(DECODED + d.column, dt),
                           T.StructField(DECODED + d.column + REASON, T.StringType())])
    fn = protobuf.decoder(d.column, d.reader.schema, {w.schema_id: w.schema for w in d.writers}, d.subjects,
                          to_arrow_type(dt), d.message)
    return df.mapInArrow(fn, schema)


# --- the sink -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoder:
    """How the output's ``key`` or ``value`` is encoded: with ``schema``, its id in the header."""

    column: str
    format: str
    schema_id: int
    schema: str


def sink_encoders(spec: PipelineSpec, settings: KafkaSettings, output: "DataFrame") -> list[Encoder]:
    """The output's schemas, registered (or looked up) under their subjects now: before anything
    of the run is written.

    :raises SchemaRefused: a subject's compatibility rule refuses the output's schema (naming
        subject, latest version and rule).
    :raises RegistryError: no registry, or it does not answer.
    """
    sink = spec.sink
    encoders = []
    for column, fmt, schema_file in (("key", sink.key_format, sink.key_schema), ("value", sink.format, sink.schema)):
        if fmt not in REGISTRY_FORMATS:
            continue
        field = "sink.format" if column == "value" else "sink.key_format"
        registry = Registry.of(settings, f"{spec.path}: {field} {fmt}")
        schema_type = SCHEMA_TYPES[fmt]
        topic_subject = f"{sink.topic}-{column}"
        if schema_file:
            text = Path(schema_file).read_text()
        else:
            text = _derived(spec, fmt, output.schema[column].dataType, registry, topic_subject)
        subject = sink_subject(spec, column, text, schema_type)
        encoders.append(Encoder(column, fmt, registry.register(subject, text, schema_type, sink.auto_register), text))
    return encoders


def sink_subject(spec: PipelineSpec, column: str, schema: str | None, schema_type: str) -> str | None:
    """The subject of the output's ``column`` by ``sink.subject_strategy``: ``{topic}-{column}``, the
    record's full name, or ``{topic}-{full name}`` (None: the schema is not known yet)."""
    sink = spec.sink
    if sink.subject_strategy == "topic_name":
        return f"{sink.topic}-{column}"
    if schema is None:
        return None
    name = schemas.full_name(schema, schema_type)
    return name if sink.subject_strategy == "record_name" else f"{sink.topic}-{name}"


def _derived(spec: PipelineSpec, fmt: str, dt, registry: Registry, subject: str) -> str:
    """The output schema a spec without a schema file gets: derived from the transform's output
    type (Avro keeps the subject's record name, so evolving it stays compatible), or for Protobuf
    the subject's latest schema when there is one."""
    latest = registry.latest(subject)
    name = schemas.record_name(spec.name)
    if fmt == "avro":
        namespace = schemas.NAMESPACE
        if latest:
            parsed = json.loads(latest.schema)
            if isinstance(parsed, dict) and parsed.get("type") == "record":
                name, namespace = parsed["name"].rsplit(".", 1)[-1], parsed.get("namespace") or (
                    parsed["name"].rsplit(".", 1)[0] if "." in parsed["name"] else "")
        avro = schemas.avro_schema(dt, name, namespace)
        if isinstance(avro, dict) and not namespace:
            avro.pop("namespace", None)
        return json.dumps(avro)
    if fmt == "json_schema":
        return json.dumps(schemas.json_schema_of(dt, name))
    if latest:
        return latest.schema
    from pyspark.sql import types as T

    if not isinstance(dt, T.StructType):
        raise RegistryError(f"{spec.path}: sink.format: protobuf needs a struct output value (or sink.schema)")
    return schemas.proto_of(dt, name)


def dead_letter_bytes(column: str, dt) -> "Column":
    """A dead letter's key or value as bytes: a struct (or array, map) as its JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dt, (T.StructType, T.ArrayType, T.MapType)):
        return F.to_json(F.col(column)).cast("binary")
    return F.col(column) if isinstance(dt, T.BinaryType) else F.col(column).cast("string").cast("binary")


def encoded(df: "DataFrame", encoders: list[Encoder]) -> "DataFrame":
    """The transform's output with each encoded column in the wire format (results), or as JSON
    text (dead letters: nothing was registered for them)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.avro.functions import to_avro

    for e in encoders:
        dt = df.schema[e.column].dataType
        header = F.lit(b"\x00" + e.schema_id.to_bytes(4, "big"))
        dead = dead_letter_bytes(e.column, dt)
        if e.format == "protobuf":
            spare = DECODED + e.column + "_dead"
            df = df.withColumn(spare, F.when(F.col(DLQ_REASON).isNotNull(), dead))
            schema = T.StructType([T.StructField(f.name, T.BinaryType() if f.name == e.column else f.dataType,
                                                 f.nullable) for f in df.schema.fields])
            df = df.mapInArrow(protobuf.encoder(e.column, e.schema, e.schema_id), schema)
            df = df.withColumn(e.column, F.coalesce(F.col(e.column), F.col(spare))).drop(spare)
            continue
        body = to_avro(F.col(e.column), e.schema) if e.format == "avro" else F.to_json(F.col(e.column))
        result = F.concat(header, body.cast("binary"))
        df = df.withColumn(e.column, F.when(F.col(e.column).isNull(), F.lit(None).cast("binary"))
                           .when(F.col(DLQ_REASON).isNull(), result).otherwise(dead))
    return df
