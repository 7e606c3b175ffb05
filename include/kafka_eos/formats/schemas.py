"""Schemas between Spark and the registry's three languages: the Spark type of a reader schema
(what the transform receives), and the schema of a transform's output (what the sink registers).
Avro's Spark type is spark-avro's own (``from_avro`` gives it); JSON Schema's and Protobuf's are
derived here, as are the output schemas when a spec names no schema file."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from kafka_eos.errors import RegistryError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import DataType, StructType

#: The namespace (Avro), package (Protobuf) of output schemas kafka-eos derives.
NAMESPACE = "kafka_eos"


def record_name(text: str) -> str:
    """A valid Avro/Protobuf name from a pipeline's name: ``orders-avro.v2`` -> ``OrdersAvroV2``."""
    name = "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", text) if part)
    return name if name and not name[0].isdigit() else f"R{name}"


# --- Avro ---------------------------------------------------------------------------------------


def avro_schema(dt: "DataType", name: str, namespace: str = NAMESPACE) -> dict | str:
    """The Avro schema Spark's ``to_avro`` writes ``dt`` with; a nullable field is a union with
    null whose default is null (adding one is a BACKWARD-compatible change)."""
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        fields = []
        for f in dt.fields:
            t = avro_schema(f.dataType, f"{name}_{f.name}", namespace)
            fields.append({"name": f.name, "type": ["null", t], "default": None} if f.nullable
                          else {"name": f.name, "type": t})
        return {"type": "record", "name": name, "namespace": namespace, "fields": fields}
    if isinstance(dt, T.ArrayType):
        items = avro_schema(dt.elementType, f"{name}_item", namespace)
        return {"type": "array", "items": ["null", items] if dt.containsNull else items}
    if isinstance(dt, T.MapType):
        if not isinstance(dt.keyType, T.StringType):
            raise RegistryError(f"{name}: an Avro map needs string keys, not {dt.keyType.simpleString()}")
        values = avro_schema(dt.valueType, f"{name}_value", namespace)
        return {"type": "map", "values": ["null", values] if dt.valueContainsNull else values}
    if isinstance(dt, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dt.precision, "scale": dt.scale}
    simple = {T.StringType: "string", T.BinaryType: "bytes", T.BooleanType: "boolean", T.IntegerType: "int",
              T.ShortType: "int", T.ByteType: "int", T.LongType: "long", T.FloatType: "float",
              T.DoubleType: "double", T.NullType: "null"}
    for kind, avro in simple.items():
        if isinstance(dt, kind):
            return avro
    if isinstance(dt, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(dt, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(dt, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    raise RegistryError(f"{name}: no Avro type for Spark's {dt.simpleString()}")


def full_name(schema: str, schema_type: str) -> str:
    """The record's full name (RecordNameStrategy's subject): Avro ``namespace.name``, Protobuf
    ``package.Message`` (the first message), JSON Schema its ``title``."""
    if schema_type == "AVRO":
        parsed = json.loads(schema)
        if not isinstance(parsed, dict) or "name" not in parsed:
            raise RegistryError("record_name subjects need an Avro record schema")
        name = parsed["name"]
        return name if "." in name or not parsed.get("namespace") else f"{parsed['namespace']}.{name}"
    if schema_type == "JSON":
        title = json.loads(schema).get("title")
        if not title:
            raise RegistryError("record_name subjects need a JSON Schema with a title")
        return title
    package = re.search(r"^\s*package\s+([\w.]+)\s*;", schema, re.M)
    message = re.search(r"^\s*message\s+(\w+)", schema, re.M)
    if message is None:
        raise RegistryError("record_name subjects need a Protobuf schema with a message")
    return f"{package.group(1)}.{message.group(1)}" if package else message.group(1)


def avro_null_record(schema: str) -> bytes | None:
    """The encoding of a record whose every field is null under ``schema`` (None when some field
    cannot be null, or the schema is not a record): a payload Spark decodes to all nulls is a
    valid record only if it is these bytes."""
    import io

    import fastavro

    parsed = json.loads(schema)
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    buf = io.BytesIO()
    try:
        fastavro.schemaless_writer(buf, fastavro.parse_schema(parsed), {f["name"]: None for f in parsed["fields"]})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return buf.getvalue()


# --- JSON Schema --------------------------------------------------------------------------------


def spark_of_json_schema(schema: dict, where: str, root: dict | None = None) -> "DataType":
    """The Spark type a JSON Schema describes (objects with properties as structs; ``$ref`` within
    the document followed)."""
    from pyspark.sql import types as T

    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise RegistryError(f"{where}: $ref {ref!r}: only references within the schema are followed")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        return spark_of_json_schema(target, where, root)
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            options = [o for o in schema[combinator] if o.get("type") != "null"]
            if len(options) == 1:
                return spark_of_json_schema(options[0], where, root)
            return T.StringType()  # a real union: its JSON text
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else "string"
    if kind == "object":
        props = schema.get("properties")
        if not props:
            extra = schema.get("additionalProperties")
            value = spark_of_json_schema(extra, where, root) if isinstance(extra, dict) else T.StringType()
            return T.MapType(T.StringType(), value)
        return T.StructType([T.StructField(name, spark_of_json_schema(p, where, root), True)
                             for name, p in props.items()])
    if kind == "array":
        items = schema.get("items", {})
        return T.ArrayType(spark_of_json_schema(items if isinstance(items, dict) else {}, where, root))
    return {"integer": T.LongType(), "number": T.DoubleType(), "boolean": T.BooleanType()}.get(kind, T.StringType())


def json_schema_of(dt: "DataType", title: str | None = None) -> dict:
    """The JSON Schema of what Spark's ``to_json`` writes for ``dt`` (a nullable field may be null
    or absent; the others are required)."""
    from pyspark.sql import types as T

    def of(t: "DataType", nullable: bool) -> dict:
        if isinstance(t, T.StructType):
            out = {"type": "object", "properties": {f.name: of(f.dataType, f.nullable) for f in t.fields},
                   "required": [f.name for f in t.fields if not f.nullable]}
        elif isinstance(t, T.ArrayType):
            out = {"type": "array", "items": of(t.elementType, t.containsNull)}
        elif isinstance(t, T.MapType):
            out = {"type": "object", "additionalProperties": of(t.valueType, t.valueContainsNull)}
        elif isinstance(t, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
            out = {"type": "integer"}
        elif isinstance(t, (T.FloatType, T.DoubleType, T.DecimalType)):
            out = {"type": "number"}
        elif isinstance(t, T.BooleanType):
            out = {"type": "boolean"}
        elif isinstance(t, (T.TimestampType, T.TimestampNTZType)):
            out = {"type": "string", "format": "date-time"}
        elif isinstance(t, T.DateType):
            out = {"type": "string", "format": "date"}
        else:
            out = {"type": "string"}
        if nullable:
            out["type"] = [out["type"], "null"]
        return out

    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **of(dt, False)}
    if title:
        schema["title"] = title
    return schema


# --- Protobuf -----------------------------------------------------------------------------------


def spark_of_message(desc, where: str, depth: int = 0) -> "StructType":
    """The Spark struct of a Protobuf message (enums as their names, maps as maps, repeated as
    arrays, 64-bit unsigned as decimal(20,0)); a message that contains itself is refused."""
    from google.protobuf.descriptor import FieldDescriptor as FD
    from pyspark.sql import types as T

    if depth > 32:
        raise RegistryError(f"{where}: message {desc.full_name} nests itself: no Spark type for a recursive message")

    def field_type(f) -> "DataType":
        if f.type == FD.TYPE_MESSAGE:
            return spark_of_message(f.message_type, where, depth + 1)
        if f.type == FD.TYPE_ENUM:
            return T.StringType()
        return {FD.TYPE_DOUBLE: T.DoubleType(), FD.TYPE_FLOAT: T.FloatType(), FD.TYPE_INT64: T.LongType(),
                FD.TYPE_UINT64: T.DecimalType(20, 0), FD.TYPE_FIXED64: T.DecimalType(20, 0),
                FD.TYPE_INT32: T.IntegerType(), FD.TYPE_FIXED32: T.LongType(), FD.TYPE_UINT32: T.LongType(),
                FD.TYPE_BOOL: T.BooleanType(), FD.TYPE_STRING: T.StringType(), FD.TYPE_BYTES: T.BinaryType(),
                FD.TYPE_SFIXED32: T.IntegerType(), FD.TYPE_SFIXED64: T.LongType(), FD.TYPE_SINT32: T.IntegerType(),
                FD.TYPE_SINT64: T.LongType()}[f.type]

    fields = []
    for f in desc.fields:
        if f.type == FD.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            t: DataType = T.MapType(field_type(key), field_type(value))
        elif _repeated(f):
            t = T.ArrayType(field_type(f))
        else:
            t = field_type(f)
        fields.append(T.StructField(f.name, t, True))
    return T.StructType(fields)


def _repeated(f) -> bool:
    from confluent_kafka.schema_registry.common.protobuf import _is_repeated

    return _is_repeated(f)


def proto_of(dt: "StructType", name: str) -> str:
    """A proto3 file with one top-level message ``name`` for the struct ``dt`` (fields numbered in
    order; nullable scalars ``optional``; timestamps as int64 microseconds, dates as int32 days,
    decimals as strings)."""
    from pyspark.sql import types as T

    nested: list[str] = []

    def scalar(t: "DataType", hint: str) -> str:
        if isinstance(t, T.StructType):
            nested.append(message(t, hint))
            return hint
        return next((p for k, p in ((T.StringType, "string"), (T.BinaryType, "bytes"), (T.BooleanType, "bool"),
                                    (T.IntegerType, "int32"), (T.ShortType, "int32"), (T.ByteType, "int32"),
                                    (T.LongType, "int64"), (T.FloatType, "float"), (T.DoubleType, "double"),
                                    (T.DateType, "int32"), (T.TimestampType, "int64"), (T.TimestampNTZType, "int64"),
                                    (T.DecimalType, "string")) if isinstance(t, k)), None) or _no_proto(t, hint)

    def message(t: "StructType", msg: str) -> str:
        lines = [f"message {msg} {{"]
        for number, f in enumerate(t.fields, start=1):
            hint = record_name(f.name)
            if isinstance(f.dataType, T.ArrayType):
                decl = f"repeated {scalar(f.dataType.elementType, hint)}"
            elif isinstance(f.dataType, T.MapType):
                decl = f"map<{scalar(f.dataType.keyType, hint + 'Key')}, {scalar(f.dataType.valueType, hint)}>"
            else:
                kind = scalar(f.dataType, hint)
                decl = f"optional {kind}" if f.nullable and not isinstance(f.dataType, T.StructType) else kind
            lines.append(f"  {decl} {f.name} = {number};")
        lines.append("}")
        return "\n".join(lines)

    top = message(dt, name)
    return "\n\n".join([f'syntax = "proto3";\npackage {NAMESPACE};', top, *nested]) + "\n"


def _no_proto(t: "DataType", hint: str) -> str:
    raise RegistryError(f"{hint}: no Protobuf type for Spark's {t.simpleString()}")
