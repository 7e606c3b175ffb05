"""Protobuf in Python: Spark has no Protobuf functions here (spark-protobuf is not on Maven Central
for Scala 2.13), so records are decoded and encoded in Arrow batches (``mapInArrow``) with the
protobuf runtime's message classes, built from the registry's schemas; the wire header (magic
byte, schema id, message indexes) is read and written by confluent-kafka's ``SchemaId``.

A registry that answers a schema as .proto text (Apicurio) has it compiled by protoc (grpcio-tools);
one that answers a serialized descriptor (Confluent's ``format=serialized``) has it parsed.
"""

from __future__ import annotations

import functools
import io
import tempfile
from pathlib import Path
from typing import Iterator

from kafka_eos.errors import RegistryError
from kafka_eos.formats.columns import DECODED, REASON
from kafka_eos.formats.schemas import _repeated
from kafka_eos.transforms import DLQ_REASON


@functools.lru_cache(maxsize=64)
def file_descriptor(schema: str, name: str = "schema.proto"):
    """The FileDescriptor of a Protobuf schema (.proto text, or a base64 FileDescriptorProto), in a
    pool of its own (cached per process: executors build each class once)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    from confluent_kafka.schema_registry.common.protobuf import _init_pool

    pool = descriptor_pool.DescriptorPool()
    _init_pool(pool)  # the well-known types
    if "syntax" in schema or "message" in schema:
        files = _compiled(schema, name)
    else:
        proto = descriptor_pb2.FileDescriptorProto()
        import base64

        proto.ParseFromString(base64.standard_b64decode(schema))
        files = [proto]
    for proto in files:
        try:
            pool.FindFileByName(proto.name)
        except KeyError:
            pool.Add(proto)
    return pool.FindFileByName(files[-1].name)


def _compiled(text: str, name: str) -> list:
    """.proto text compiled by protoc into FileDescriptorProtos (imports of well-known types resolved)."""
    from importlib.resources import files

    from google.protobuf import descriptor_pb2

    try:
        from grpc_tools import protoc
    except ImportError:
        raise RegistryError(f"the registry answered the Protobuf schema {name} as .proto text: compiling it needs "
                            "protoc (pip install 'kafka-eos[protoc]')") from None

    with tempfile.TemporaryDirectory(prefix="kafka-eos-proto-") as tmp:
        (Path(tmp) / name).write_text(text)
        out = Path(tmp) / "set.pb"
        include = str(files("grpc_tools") / "_proto")
        code = protoc.main(["protoc", f"-I{tmp}", f"-I{include}", f"--descriptor_set_out={out}",
                            "--include_imports", str(Path(tmp) / name)])
        if code != 0 or not out.exists():
            raise RegistryError(f"protoc could not compile the Protobuf schema ({name}); see its message above")
        found = descriptor_pb2.FileDescriptorSet()
        found.ParseFromString(out.read_bytes())
    return list(found.file)


def message_descriptor(schema: str, indexes: list[int] | tuple[int, ...] = (0,)):
    """The message a Confluent message-index path names in ``schema`` (``[0]``: the first)."""
    fd = file_descriptor(schema)
    indexes = list(indexes) or [0]
    desc = fd.message_types_by_name[list(fd.message_types_by_name)[indexes[0]]]
    for i in indexes[1:]:
        desc = desc.nested_types[i]
    return desc


def reader_message(schema: str, name: str | None = None):
    """The message of ``schema`` a pipeline reads: the one named ``name`` (its full name, or its
    short name at any depth), else the schema's first message.

    :raises RegistryError: no message of that name.
    """
    fd = file_descriptor(schema)
    if name is None:
        return message_descriptor(schema, [0])
    found, todo = [], list(fd.message_types_by_name.values())
    while todo:
        desc = todo.pop(0)
        if name in (desc.full_name, desc.name):
            found.append(desc)
        todo.extend(desc.nested_types)
    if not found:
        names = ", ".join(d.full_name for d in fd.message_types_by_name.values())
        raise RegistryError(f"source.message: {name!r} is not a message of the schema (its messages: {names})")
    if len(found) > 1:
        raise RegistryError(f"source.message: {name!r} names {len(found)} messages of the schema "
                            f"({', '.join(d.full_name for d in found)}): give the full name")
    return found[0]


def message_class(desc):
    from google.protobuf.message_factory import GetMessageClass

    return GetMessageClass(desc)


def to_python(msg) -> dict:
    """A message as the row of its Spark struct (:func:`kafka_eos.formats.schemas.spark_of_message`)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    row = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            vf = f.message_type.fields_by_name["value"]
            row[f.name] = [(k, _scalar(v, vf)) for k, v in value.items()]
        elif _repeated(f):
            row[f.name] = [_scalar(v, f) for v in value]
        elif f.has_presence and not msg.HasField(f.name):
            row[f.name] = None
        else:
            row[f.name] = _scalar(value, f)
    return row


def _scalar(value, f):
    from decimal import Decimal

    from google.protobuf.descriptor import FieldDescriptor as FD

    if f.type == FD.TYPE_MESSAGE:
        return to_python(value)
    if f.type == FD.TYPE_ENUM:
        known = f.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)
    if f.type in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return Decimal(value)
    return value


def from_python(msg, row: dict):
    """Fill ``msg`` from a row of its Spark struct (the inverse of :func:`to_python`)."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    for f in msg.DESCRIPTOR.fields:
        value = row.get(f.name)
        if value is None:
            continue
        if f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            target = getattr(msg, f.name)
            vf = f.message_type.fields_by_name["value"]
            for k, v in (value.items() if isinstance(value, dict) else value):
                if vf.type == FD.TYPE_MESSAGE:
                    from_python(target[k], v)
                else:
                    target[k] = _plain(v, vf)
        elif _repeated(f):
            target = getattr(msg, f.name)
            for v in value:
                if f.type == FD.TYPE_MESSAGE:
                    from_python(target.add(), v)
                else:
                    target.append(_plain(v, f))
        elif f.type == FD.TYPE_MESSAGE:
            from_python(getattr(msg, f.name), value)
        else:
            setattr(msg, f.name, _plain(value, f))
    return msg


def _plain(value, f):
    from datetime import date, datetime, timezone

    from google.protobuf.descriptor import FieldDescriptor as FD

    if f.type == FD.TYPE_ENUM and isinstance(value, str):
        return f.enum_type.values_by_name[value].number
    if isinstance(value, datetime):  # int64 microseconds since the epoch
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(aware.timestamp() * 1_000_000)
    if isinstance(value, date):
        return (value - date(1970, 1, 1)).days
    if f.type == FD.TYPE_STRING and not isinstance(value, str):
        return str(value)
    if f.type in (FD.TYPE_UINT64, FD.TYPE_FIXED64):
        return int(value)
    return value


def decoder(column: str, reader: str, writers: dict[int, str], subjects: str, arrow_type, message: str | None = None):
    """The ``mapInArrow`` function adding ``_kafka_eos_<column>`` (the decoded struct, or null) and
    ``_kafka_eos_<column>_reason`` (why the record is a dead letter, or null) to every batch.

    Each record names its message (the Confluent message indexes, in its writer's schema): one
    that names another message than the one the pipeline reads (:func:`reader_message`) is a dead
    letter, never decoded as the wrong message.

    :param writers: every schema the records may have been written with, by id."""
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from google.protobuf.message import DecodeError

        from confluent_kafka.schema_registry.common.serde import SchemaId

        wanted = reader_message(reader, message)
        cls = message_class(wanted)
        named: dict[tuple, str] = {}  # (schema id, message indexes) -> the message's full name
        for batch in batches:
            raw = batch.column(column).to_pylist()
            topics, partitions, offsets = (batch.column(c).to_pylist() for c in ("topic", "partition", "offset"))
            values, reasons = [], []
            for data, t, p, o in zip(raw, topics, partitions, offsets):
                at = f" ({t}-{p} offset {o})"
                if data is None:
                    values.append(None)
                    reasons.append(None)
                    continue
                why = None
                if len(data) < 5:
                    why = f"{column}: {len(data)} bytes, shorter than the Confluent wire format's 5-byte header"
                elif data[0] != 0:
                    why = f"{column}: magic byte {data[0]} is not 0 (not the Confluent wire format)"
                else:
                    sid = SchemaId("PROTOBUF")
                    try:
                        payload = sid.from_bytes(io.BytesIO(data))
                    except Exception as exc:  # noqa: BLE001 - any malformed header
                        why = f"{column}: malformed message indexes ({exc})"
                    else:
                        indexes = tuple(sid.message_indexes or (0,))
                        if sid.id not in writers:
                            why = f"{column}: schema id {sid.id} is not a version of subject {subjects}"
                        elif (name := _named(named, writers, sid.id, indexes)) != wanted.full_name:
                            why = (f"{column}: message indexes {list(indexes)} of schema id {sid.id} name "
                                   f"{name}, not {wanted.full_name}, the message the pipeline reads (source.message)")
                        else:
                            try:
                                values.append(to_python(cls.FromString(payload.read())))
                                reasons.append(None)
                                continue
                            except (DecodeError, ValueError) as exc:
                                why = f"{column}: payload of schema id {sid.id} does not decode as Protobuf ({exc})"
                values.append(None)
                reasons.append(why + at)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(values, type=arrow_type), pa.array(reasons, type=pa.string())],
                names=[*batch.schema.names, DECODED + column, DECODED + column + REASON])

    return run


def _named(cache: dict, writers: dict[int, str], schema_id: int, indexes: tuple) -> str:
    """The full name of the message ``indexes`` name in the schema of ``schema_id`` (or why none)."""
    key = (schema_id, indexes)
    if key not in cache:
        try:
            cache[key] = message_descriptor(writers[schema_id], indexes).full_name
        except (IndexError, KeyError):
            cache[key] = "no message of that schema"
        except Exception as exc:  # noqa: BLE001 - a writer schema this process cannot read: a dead letter
            cache[key] = f"a message of a schema that does not compile here ({type(exc).__name__})"
    return cache[key]


def encoder(column: str, schema: str, schema_id: int):
    """The ``mapInArrow`` function replacing ``column`` (a struct) by its wire-format bytes on
    result rows (dead letters keep their value: :func:`kafka_eos.formats.dead_letter_bytes`)."""
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa

        from confluent_kafka.schema_registry.common.serde import SchemaId

        cls = message_class(message_descriptor(schema, [0]))
        header = SchemaId("PROTOBUF", schema_id, message_indexes=[0]).id_to_bytes()
        for batch in batches:
            rows = batch.column(column).to_pylist()
            reasons = batch.column(DLQ_REASON).to_pylist()
            out = [None if row is None or reason is not None else
                   header + from_python(cls(), row).SerializeToString() for row, reason in zip(rows, reasons)]
            i = batch.schema.names.index(column)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns[:i], pa.array(out, type=pa.binary()), *batch.columns[i + 1:]],
                names=batch.schema.names)

    return run
