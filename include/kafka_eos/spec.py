"""Pipeline specs (docs/configuration.md): YAML files loaded into frozen settings.

Every problem is a one-line :class:`SpecError` naming the file and the field.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from kafka_eos.errors import SpecError
from kafka_eos.paths import pipelines_dir
from kafka_eos.transforms import identity

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: Each pipeline's run manifest is a topic of its own, this prefix + the pipeline's name
#: (docs/architecture.md, "Run manifest"): no other pipeline's transaction can hide its records.
MANIFEST_TOPIC_PREFIX = "kafka-eos.manifest."


@dataclass(frozen=True)
class SourceSpec:
    topics: tuple[str, ...]
    group_id: str
    starting_offsets: str = "earliest"  # earliest | latest
    max_records_per_partition: int = 100_000
    on_data_loss: str = "fail"  # fail | skip
    #: Cap of one run over all partitions (an offset span, shared in proportion to each
    #: partition's backlog): an atomic transaction stays small enough to commit in its timeout.
    max_records_per_run: int = 1_000_000
    #: Alert when the oldest committed record not yet processed is older than this (seconds);
    #: None: no freshness alert. Checked by the watchdog DAG (kafka_eos.health.backlog).
    freshness_limit_s: int | None = None
    #: How the records' values and keys are encoded (docs/formats.md): ``json`` and ``raw`` hand the
    #: transform the bytes (today's behaviour), ``string`` their UTF-8 text, ``avro``, ``protobuf`` and
    #: ``json_schema`` (Confluent wire format, schemas in the Schema Registry) a decoded struct.
    format: str = "json"
    key_format: str = "raw"
    #: The registry subject whose latest (or ``reader_version``) schema the values are decoded to;
    #: None: ``{topic}-value`` of the first source topic (TopicNameStrategy).
    subject: str | None = None
    key_subject: str | None = None
    #: The version of ``subject`` to decode to; None: its latest when the run starts.
    reader_version: int | None = None
    #: Protobuf: the message of the reader schema the values are (its full or short name); None:
    #: the schema's first message. A record that names another message is a dead letter.
    message: str | None = None


#: The formats of a source's or a Kafka sink's values and keys (docs/formats.md).
FORMATS = ("json", "raw", "string", "avro", "protobuf", "json_schema")
#: The formats whose schemas live in a Schema Registry (Confluent wire format).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
#: How a Kafka sink names the subject of its output's schema (Confluent's subject name strategies).
SUBJECT_STRATEGIES = ("topic_name", "record_name", "topic_record_name")


@dataclass(frozen=True)
class SinkSpec:
    kind: str  # kafka | sql | iceberg
    commit: str = "atomic"  # atomic | per_partition
    topic: str | None = None  # kafka
    dlq_topic: str | None = None  # kafka (and optional for sql: dead letters also to a table)
    table: str | None = None  # sql; iceberg: ``namespace.table`` (namespace ``default`` when none)
    key_columns: tuple[str, ...] = ()  # sql, iceberg (merge: upsert): the upsert key
    #: sql: replace | add (add sums the non-key columns on conflict); iceberg: append | upsert
    #: (a run's rows replace the table's rows of their keys)
    merge: str = "replace"
    #: iceberg: where the catalog puts new tables' files (a folder or an object store URI); None:
    #: kafka-eos's local folder (``.local/iceberg/warehouse``) for the embedded catalog (``url: local``).
    warehouse: str | None = None
    #: iceberg: a new table's partition fields, Spark SQL's words (``days(ts)``, ``bucket(16, id)``,
    #: ``truncate(4, name)``, ``hours``/``months``/``years``, a bare column: identity).
    partition_by: tuple[str, ...] = ()
    #: iceberg: the catalog's name, as the other engines that share the catalog's database name it
    #: (Spark's ``spark.sql.catalog.<name>``, Trino's): a SQL catalog's rows are per name.
    catalog: str = "kafka_eos"
    # sql: SQLAlchemy URL, or ``local`` (kafka-eos's development SQLite file under .local/sql/):
    # for the CLI outside Airflow. Not in repr: once ${VAR} is expanded it can hold a password,
    # and reprs end up in logs and tracebacks.
    url: str | None = field(default=None, repr=False)
    #: sql: the Airflow connection of the database (its secrets in Airflow's connections or its
    #: secrets backend): what Airflow's tasks use; the CLI too where Airflow is installed.
    conn_id: str | None = None
    transaction_timeout_s: int = 300  # kafka: how long one transaction may stay open
    #: kafka: where replays and backfills write (never the live output topic: a consumer of it
    #: would see a range twice); None: they are refused for this pipeline.
    backfill_topic: str | None = None
    #: kafka: where replays' and backfills' dead letters go (never the live dead-letter topic);
    #: None: to ``backfill_topic``, told apart by their ``kafka-eos.reason`` header.
    backfill_dlq_topic: str | None = None
    #: sql: the table replays and backfills write, in the sink's database (never the live table):
    #: the live table's columns plus the range key and the generation; None: side runs are refused.
    backfill_table: str | None = None
    #: Headers added to every record written (set for replays and backfills, not in YAML).
    headers: tuple[tuple[str, bytes], ...] = ()
    #: sql: columns of constant value added to every result row (set for replays and backfills,
    #: not in YAML): ``((name, value), ...)``.
    columns: tuple[tuple[str, Any], ...] = ()
    #: sql: the table of dead letters (a side run's go to a table of its own; not in YAML).
    dead_letters_table: str = "kafka_eos_dead_letters"
    #: iceberg: the branch of the tables a run commits to: ``main``, a side run's own (not in YAML).
    branch: str = "main"
    #: A record (kafka) or row (sql) the sink refuses for its own sake (too large for the topic or
    #: the producer, a value the database's column or constraint refuses): ``dead_letter`` (a
    #: dead letter holding a reference to the source record, in the same transaction) or ``fail``
    #: (the run fails, naming topic, partition, offset and why; nothing is committed).
    on_refused_record: str = "dead_letter"
    #: kafka: the largest record each written topic takes, ``((topic, bytes, why), ...)``: read
    #: from the cluster when a run starts (:mod:`kafka_eos.sinks.limits`; not in YAML).
    record_limits: tuple[tuple[str, int, str], ...] = ()
    #: kafka: how the output's values and keys are encoded (``FORMATS``; docs/formats.md).
    format: str = "json"
    key_format: str = "raw"
    #: kafka: the subject of the output's schema: ``{topic}-value`` (topic_name), the record's full
    #: name (record_name), or ``{topic}-{full name}`` (topic_record_name).
    subject_strategy: str = "topic_name"
    #: kafka: a schema file for the output's values (.avsc, .proto, .json); None: the schema is
    #: derived from the transform's output (Avro, JSON Schema) or is the subject's latest (Protobuf).
    schema: str | None = None
    key_schema: str | None = None
    #: kafka: register the output's schema under its subject (refused when the subject's
    #: compatibility rule refuses it); False: it must be registered already.
    auto_register: bool = True

    @property
    def about(self) -> "SinkKind":
        """What this kind of sink is (:data:`SINK_KINDS`)."""
        return SINK_KINDS[self.kind]

    @property
    def target(self) -> str:
        """Where results go: the topic or the table."""
        return getattr(self, self.about.target)

    @property
    def dead_letters(self) -> str | None:
        """Where dead letters go: the dead-letter topic (None: a dead letter fails the run) or table."""
        return getattr(self, self.about.dead_letters)

    @property
    def backfill_target(self) -> str | None:
        """Where side runs' results go (None: side runs are refused)."""
        return getattr(self, self.about.backfill)

    @property
    def topics(self) -> tuple[str, ...]:
        """The Kafka topics a live run writes: its output and dead-letter topics, where set."""
        return tuple(t for t in (self.topic, self.dlq_topic) if t)

    def describe(self) -> str:
        """The place, in words (a DAG's page)."""
        return self.about.described.format(**{k: getattr(self, k) for k in (
            "topic", "dlq_topic", "table", "merge", "dead_letters_table")})


@dataclass(frozen=True)
class SinkKind:
    """What differs between the kinds of sink, as data: a place that must tell the kinds apart
    reads it here (``spec.sink.about``) instead of comparing ``sink.kind``. How each kind commits
    is its sink's type (:func:`kafka_eos.sinks.scope.sink_of`)."""

    #: The spec's fields naming where results go, where dead letters go, where side runs' results go.
    target: str
    dead_letters: str
    backfill: str
    #: Commits are Kafka transactions under the pipeline's transactional ids and the checkpoints
    #: are the group's offsets committed in them (the manifest remembers them); else the sink's
    #: database holds its own checkpoints and the group mirrors them.
    transactional: bool
    #: How a checked side run's results reach the live place: ``sql`` (a statement the run's note
    #: gives, ``kafka-eos backfill promote`` runs it), ``branch`` (the side run's branch of the live
    #: table, fast-forwarded or appended onto ``main`` by ``kafka-eos backfill promote``), None
    #: (they stay where they are: consumers read the backfill topic).
    promoted_by: str | None
    #: How a DAG's page names the place (``str.format`` over the sink's fields).
    described: str
    #: What ``kafka-eos validate`` checks of this kind beyond what every pipeline needs.
    checks: tuple[str, ...]
    #: Fields :func:`spec_document` always writes for this kind, and those it writes when not default.
    fields: tuple[str, ...]
    optional_fields: tuple[tuple[str, Any], ...] = ()
    #: ``url: local``: the development database under ``.local/`` (``{name}``: the pipeline's).
    local_database: str = "sql/{name}.db"
    #: The resolver of ``sink.conn_id`` (:data:`kafka_eos.sinks.sql_store.CONNECTIONS_GROUP`): ``sql``
    #: (a database's SQLAlchemy URL), ``iceberg`` (a catalog's: a database's, or a REST catalog's).
    connection: str = "sql"
    #: Why side runs (replays, backfills) of this kind are refused whatever the spec says; None:
    #: they need only the spec's place for them.
    no_side_runs: str | None = None


SINK_KINDS: dict[str, SinkKind] = {
    "kafka": SinkKind("topic", "dlq_topic", "backfill_topic", transactional=True, promoted_by=None,
                      described="Kafka topic `{topic}` (dead letters: topic `{dlq_topic}`)",
                      checks=("transaction timeout", "output schemas"),
                      fields=("transaction_timeout_s",),
                      optional_fields=(("format", "json"), ("key_format", "raw"), ("subject_strategy", "topic_name"),
                                       ("schema", None), ("key_schema", None), ("auto_register", True))),
    "sql": SinkKind("table", "dead_letters_table", "backfill_table", transactional=False, promoted_by="sql",
                    described="SQL table `{table}` (merge `{merge}`; dead letters: table `{dead_letters_table}`)",
                    checks=("database",),
                    fields=("key_columns", "merge")),
    # Side runs write a branch of the live table (and of its dead letters' table) of their own.
    "iceberg": SinkKind("table", "dead_letters_table", "table", transactional=False, promoted_by="branch",
                        described="Iceberg table `{table}` (dead letters: table `{dead_letters_table}`)",
                        checks=("database",), fields=("merge",),
                        optional_fields=(("warehouse", None), ("catalog", "kafka_eos"), ("partition_by", ()),
                                         ("key_columns", ())),
                        local_database="iceberg/catalog.db", connection="iceberg"),
}


#: ``schedule: stream``: the pipeline's DAG runs whenever committed records wait beyond its
#: checkpoint (an Airflow asset watched by a trigger), not on a clock.
STREAM_SCHEDULE = "stream"


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    source: SourceSpec
    transform: str
    sink: SinkSpec
    schedule: str | None = None
    manifest_topic: str = ""  # "" -> MANIFEST_TOPIC_PREFIX + name
    path: str = "<inline>"
    #: The spec's ``spark:`` section: Spark settings of this pipeline's Spark applications (executor
    #: memory and cores, packages, dynamic allocation ...), merged over kafka-eos's own
    #: (:func:`kafka_eos.spark_io.merged_conf`).
    spark_conf: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.manifest_topic:
            object.__setattr__(self, "manifest_topic", MANIFEST_TOPIC_PREFIX + self.name)

    def transactional_id(self, topic: str | None = None, partition: int | None = None) -> str:
        """The stable transactional.id of this pipeline's work (docs/architecture.md, "Commit protocol", step 1).

        Derived from the group id, the checkpoint the commit checks: every writer of one
        checkpoint fences every other, whatever the pipeline is called. ``|`` cannot occur in a
        topic name, so per-partition ids never collide with another group's.
        """
        base = self.source.group_id
        return base if topic is None else f"{base}|{topic}|{partition}"

    def load_transform(self) -> Callable:
        """Import the transform function (``module:function`` or ``identity``)."""
        return resolve_transform(self.transform, self.path)


def spec_document(spec: PipelineSpec) -> dict:
    """The YAML document of ``spec`` (what :func:`parse_spec` reads back to the same spec)."""
    s = spec.sink
    sink = {"kind": s.kind, "commit": s.commit}
    for key in ("topic", "dlq_topic", "backfill_topic", "backfill_dlq_topic", "table", "backfill_table", "url", "conn_id"):
        if getattr(s, key) is not None:
            sink[key] = getattr(s, key)
    for key in s.about.fields:
        value = getattr(s, key)
        sink[key] = list(value) if isinstance(value, tuple) else value
    if s.on_refused_record != "dead_letter":
        sink["on_refused_record"] = s.on_refused_record
    for key, default in s.about.optional_fields:
        value = getattr(s, key)
        if value != default:
            sink[key] = list(value) if isinstance(value, tuple) else value
    src = spec.source
    doc = {"name": spec.name, "transform": spec.transform, "sink": sink, "manifest_topic": spec.manifest_topic,
           "source": {"topics": list(src.topics), "group_id": src.group_id,
                      "starting_offsets": src.starting_offsets,
                      "max_records_per_partition": src.max_records_per_partition,
                      "max_records_per_run": src.max_records_per_run,
                      "on_data_loss": src.on_data_loss}}
    if src.freshness_limit_s is not None:
        doc["source"]["freshness_limit_s"] = src.freshness_limit_s
    for key, default in (("format", "json"), ("key_format", "raw"), ("subject", None), ("key_subject", None),
                         ("reader_version", None), ("message", None)):
        if getattr(src, key) != default:
            doc["source"][key] = getattr(src, key)
    if spec.schedule is not None:
        doc["schedule"] = spec.schedule
    if spec.spark_conf:
        doc["spark"] = dict(spec.spark_conf)
    return doc


def _import_transform_module(module_name: str, where: str):
    """Import a transform's module: from the installed packages, else from the spec's project
    folder (the parent of the folder holding the spec, as ``kafka-eos new`` lays it out, or the
    spec's own folder), which is then put on ``sys.path``."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        parts = module_name.split(".")
        missing = exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if not missing or not where.endswith((".yaml", ".yml")):
            raise
        top = parts[0]
        spec_folder = Path(where).resolve().parent
        for folder in (spec_folder.parent, spec_folder):
            if (folder / top / "__init__.py").is_file() or (folder / f"{top}.py").is_file():
                sys.path.insert(0, str(folder))
                # Another package of the same top-level name may have been imported (it lacked
                # the module): the project's own is the one the spec means.
                for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
                    del sys.modules[name]
                importlib.invalidate_caches()
                return importlib.import_module(module_name)
        raise


def resolve_transform(ref: str, where: str = "<inline>") -> Callable:
    """Import ``module:function``; ``identity`` is kafka-eos's own copy transform.

    :raises SpecError: naming the file, the field and what failed to import.
    """
    if ref == "identity":
        return identity
    module_name, _, func_name = ref.partition(":")
    if not module_name or not func_name:
        raise SpecError(f"{where}: transform: {ref!r} is not 'module:function' or 'identity'")
    try:
        module = _import_transform_module(module_name, where)
    except ImportError as exc:
        raise SpecError(f"{where}: transform: cannot import module {module_name!r} ({exc})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise SpecError(f"{where}: transform: module {module_name!r} has no function {func_name!r}")
    return func


def load_spec(name_or_path: str, environ: Mapping[str, str] | None = None,
              import_transform: bool = True) -> PipelineSpec:
    """Load a spec by name (a file under include/pipelines/) or by path.

    :param import_transform: import the transform now, so a broken one is a spec error up front.
        Commands that only read offsets (``plan``, ``checkpoint``) pass False: they work where
        the transform's module is not importable.
    :raises SpecError: the file is missing or any field is wrong.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = pipelines_dir() / f"{name_or_path}.yaml"
    if Path(name_or_path).is_dir():
        raise SpecError(f"{name_or_path}: a folder, not a pipeline spec (a spec's .yaml file, or a pipeline's name)")
    if not path.is_file():
        raise SpecError(f"{path}: no such pipeline spec")
    try:
        raw = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None
    spec = parse_spec(raw, str(path), os.environ if environ is None else environ)
    # The pipelines a spec could collide with: those of its own folder (the set the DAG factory
    # makes DAGs of, wherever that folder is) and those of the pipelines folder.
    folders = sorted({path.parent.resolve(), pipelines_dir().resolve()})
    check_owners(spec, [other for folder in folders for other in bundled_specs(exclude=path, folder=folder)])
    if import_transform:
        spec.load_transform()  # a transform that does not import is a spec error, found up front
    return spec


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong, in one line, with the line and column where it found it."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["invalid YAML"])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def check_owners(spec: PipelineSpec, others: Iterable[PipelineSpec]) -> None:
    """A consumer group and a manifest topic belong to one pipeline. The group holds that
    pipeline's checkpoint and is the base of its transactional ids: two pipelines sharing one
    would overwrite each other's checkpoint and fence each other's transactions. The manifest
    topic is written inside the pipeline's transactions: a shared one lets one pipeline's open
    transaction hide the other's plans (read_committed stops at its LSO).

    :raises SpecError: naming both specs and the group or topic.
    """
    for other in others:
        if other.name == spec.name:
            continue  # the same pipeline in another file is not another owner
        if other.source.group_id == spec.source.group_id:
            raise SpecError(f"{spec.path}: source.group_id: {spec.source.group_id!r} is also the group of pipeline "
                            f"{other.name!r} ({other.path}); each pipeline needs a group of its own")
        if other.manifest_topic == spec.manifest_topic:
            raise SpecError(f"{spec.path}: manifest_topic: {spec.manifest_topic!r} is also the manifest of pipeline "
                            f"{other.name!r} ({other.path}); each pipeline needs a manifest topic of its own")


def bundled_specs(exclude: Path | None = None, folder: Path | str | None = None) -> list[PipelineSpec]:
    """The parsable specs of ``folder`` (default :func:`~kafka_eos.paths.pipelines_dir`) other than
    ``exclude`` (transforms not imported)."""
    found = []
    excluded = exclude.resolve() if exclude is not None else None
    # The folder resolved once, not each of its files (a hundred specs, each loaded against the
    # others: 10,000 resolves were half of `kafka-eos pipelines`); a file that is a link, itself.
    for path in spec_paths(Path(folder if folder is not None else pipelines_dir()).resolve()):
        if excluded is not None and (path.resolve() if path.is_symlink() else path) == excluded:
            continue
        spec = _parsed(path)
        if spec is not None:  # a broken spec is reported when it is loaded itself
            found.append(spec)
    return found


#: Specs parsed without an environment, by (path, mtime, size): loading each of a hundred specs
#: checks it against every other one of its folder; parsing them all again for each would be
#: 10,000 YAML parses for one pass of the watchdog.
_PARSED: dict[tuple[str, int, int], PipelineSpec | None] = {}


def _parsed(path: Path) -> PipelineSpec | None:
    """``path`` parsed without an environment (None: it does not parse), from the cache while the
    file is unchanged."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        try:
            spec = parse_spec(yaml.load(path.read_text(), Loader=YAML_LOADER), str(path))
        except (SpecError, yaml.YAMLError, OSError):
            spec = None
        if len(_PARSED) > 10_000:
            _PARSED.clear()
        _PARSED[key] = spec
    return _PARSED[key]


#: YAML's merge key (``<<``) and value key (``=``): the base class resolves them, they are no keys.
_MERGE_TAGS = ("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value")


class YAML_LOADER(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # noqa: N801 - a loader, named as PyYAML's
    """libyaml's safe loader where PyYAML was built with it (a tenth of the pure-Python parser's
    time), which refuses a key given twice in one mapping: YAML keeps the last silently, and a
    second ``sink:`` would drop the first whole."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _value in node.value:
                if key_node.tag in _MERGE_TAGS:  # `<<: *anchor` (merged by the base class), not a key
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if first != key_node.start_mark.line + 1:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping (lines {first} and "
                        f"{key_node.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep)


def specs_folder() -> Path:
    """The folder of the pipeline specs (:func:`~kafka_eos.paths.pipelines_dir`), which must exist.

    :raises SpecError: it does not: a mistyped setting, not an empty estate."""
    folder = Path(pipelines_dir())
    if not folder.is_dir():
        raise SpecError(f"{folder}: no such folder of pipeline specs (KAFKA_EOS_PIPELINES_DIR, or "
                        "./pipelines outside a checkout)")
    return folder


def spec_paths(folder: Path | str | None = None) -> list[Path]:
    """The pipeline specs (``*.yaml``) of ``folder``, by name; default: :func:`~kafka_eos.paths.pipelines_dir`."""
    return sorted(Path(folder if folder is not None else pipelines_dir()).glob("*.yaml"))


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_url(value: Any, where: str, environ: Mapping[str, str] | None) -> str | None:
    """Expand ``${VAR}`` and ``${VAR:-default}`` in a SQL URL from the environment; a URL that
    expands to nothing is None (then the sink needs ``sink.conn_id``). With no environment
    (parsing a DAG file) the URL stays a template: secrets are resolved only where the pipeline runs.

    :raises SpecError: ``${VAR}`` names a variable that is not set (it never silently becomes
        some other database).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(f"{where}: sink.url: must be a string (a SQLAlchemy URL)")
    if environ is None:
        return value

    def lookup(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is None:
            raise SpecError(f"{where}: sink.url: environment variable {name} is not set "
                            f"(write ${{{name}:-local}} to fall back to kafka-eos's development SQLite file)")
        return default

    return _VAR.sub(lookup, value).strip() or None


def parse_spec(raw: Any, where: str = "<inline>", environ: Mapping[str, str] | None = None) -> PipelineSpec:
    """Validate a parsed YAML document into a :class:`PipelineSpec` (the transform is not imported).

    :param environ: where ``${VAR}`` in ``sink.url`` is looked up; None (parsing a DAG file)
        leaves the URL unexpanded.
    """
    top = _mapping(raw, where, "")
    _known(top, where, "", {"name", "source", "transform", "sink", "schedule", "manifest_topic", "spark"})
    name = _str(top, where, "name")
    if not _NAME_RE.match(name):
        raise SpecError(f"{where}: name: {name!r} must be letters, digits, '.', '_' or '-'")

    src = _mapping(top.get("source"), where, "source")
    _known(src, where, "source.", {"topics", "group_id", "starting_offsets",
                                   "max_records_per_partition", "max_records_per_run", "on_data_loss",
                                   "freshness_limit_s", "format", "key_format", "subject", "key_subject",
                                   "reader_version", "message"})
    topics = src.get("topics")
    if not isinstance(topics, list) or not topics:
        raise SpecError(f"{where}: source.topics: a non-empty list of topic names is required")
    for i, topic in enumerate(topics):
        _topic_name(topic, where, f"source.topics[{i}]")
    if "|" in str(src.get("group_id", "")):
        raise SpecError(f"{where}: source.group_id: {src['group_id']!r} must not contain '|' (it separates the "
                        "parts of the pipeline's transactional ids)")
    source = SourceSpec(
        topics=tuple(topics),
        group_id=_str(src, where, "group_id", f"kafka-eos.{name}", "source."),
        starting_offsets=_choice(src, where, "starting_offsets", ("earliest", "latest"), "source."),
        max_records_per_partition=_positive_int(src, where, "max_records_per_partition", 100_000),
        max_records_per_run=_positive_int(src, where, "max_records_per_run", 1_000_000),
        on_data_loss=_choice(src, where, "on_data_loss", ("fail", "skip"), "source."),
        freshness_limit_s=(_positive_int(src, where, "freshness_limit_s", 0)
                           if src.get("freshness_limit_s") is not None else None),
        format=_choice(src, where, "format", FORMATS, "source."),
        key_format=_choice(src, where, "key_format", ("raw", *FORMATS[:1], *FORMATS[2:]), "source."),
        subject=_opt_str(src, where, "subject", "source."),
        key_subject=_opt_str(src, where, "key_subject", "source."),
        reader_version=(_positive_int(src, where, "reader_version", 0)
                        if src.get("reader_version") not in (None, "latest") else None),
        message=_opt_str(src, where, "message", "source."),
    )

    transform = top.get("transform", "identity")
    if not isinstance(transform, str) or not transform:
        raise SpecError(f"{where}: transform: must be 'module:function' or 'identity'")

    snk = _mapping(top.get("sink"), where, "sink")
    _known(snk, where, "sink.", {"kind", "topic", "dlq_topic", "commit", "table",
                                 "key_columns", "merge", "url", "conn_id", "transaction_timeout_s", "backfill_topic",
                                 "backfill_dlq_topic", "backfill_table", "on_refused_record", "format",
                                 "key_format", "subject_strategy", "schema", "key_schema", "auto_register",
                                 "warehouse", "catalog", "partition_by"})
    kind = _choice(snk, where, "kind", ("kafka", "sql", "iceberg"), "sink.", required=True)
    commit = _choice(snk, where, "commit", ("atomic", "per_partition"), "sink.")
    key_columns = snk.get("key_columns", [])
    if not isinstance(key_columns, list) or not all(isinstance(c, str) for c in key_columns):
        raise SpecError(f"{where}: sink.key_columns: must be a list of column names")
    sink = SinkSpec(
        kind=kind, commit=commit,
        topic=_opt_topic(snk, where, "topic"),
        dlq_topic=_opt_topic(snk, where, "dlq_topic"),
        table=snk.get("table"), key_columns=tuple(key_columns),
        merge=_choice(snk, where, "merge", ("append", "upsert") if kind == "iceberg" else ("replace", "add"), "sink."),
        warehouse=_opt_str(snk, where, "warehouse", "sink."),
        catalog=_opt_str(snk, where, "catalog", "sink.") or "kafka_eos",
        partition_by=_partition_by(snk, where),
        url=_expand_url(snk.get("url"), where, environ),
        conn_id=_opt_str(snk, where, "conn_id", "sink."),
        transaction_timeout_s=_positive_int(snk, where, "transaction_timeout_s", 300, "sink."),
        backfill_topic=_opt_topic(snk, where, "backfill_topic"),
        backfill_dlq_topic=_opt_topic(snk, where, "backfill_dlq_topic"),
        backfill_table=_opt_table(snk, where, "backfill_table"),
        on_refused_record=_choice(snk, where, "on_refused_record", ("dead_letter", "fail"), "sink."),
        format=_choice(snk, where, "format", FORMATS, "sink."),
        key_format=_choice(snk, where, "key_format", ("raw", *FORMATS[:1], *FORMATS[2:]), "sink."),
        subject_strategy=_choice(snk, where, "subject_strategy", SUBJECT_STRATEGIES, "sink."),
        schema=_schema_file(snk, where, "schema"),
        key_schema=_schema_file(snk, where, "key_schema"),
        auto_register=_bool(snk, where, "auto_register", True, "sink."),
    )
    if sink.partition_by and kind != "iceberg":
        raise SpecError(f"{where}: sink.partition_by: only for an iceberg sink")
    if kind == "kafka":
        if not sink.topic:
            raise SpecError(f"{where}: sink.topic: required for a kafka sink")
        if sink.topic in topics:
            raise SpecError(f"{where}: sink.topic: {sink.topic!r} is also a source topic: a pipeline must not read "
                            "what it writes")
        if sink.dlq_topic is not None and sink.dlq_topic in (sink.topic, *topics):
            raise SpecError(f"{where}: sink.dlq_topic: {sink.dlq_topic!r} must differ from the output and source "
                            "topics")
        if sink.backfill_topic is not None and sink.backfill_topic in (sink.topic, sink.dlq_topic, *topics):
            raise SpecError(f"{where}: sink.backfill_topic: {sink.backfill_topic!r} must differ from the live "
                            "output, dead-letter and source topics")
        if sink.backfill_dlq_topic is not None:
            if sink.backfill_topic is None:
                raise SpecError(f"{where}: sink.backfill_dlq_topic: needs sink.backfill_topic (side runs write there)")
            if sink.backfill_dlq_topic in (sink.topic, sink.dlq_topic, *topics):
                raise SpecError(f"{where}: sink.backfill_dlq_topic: {sink.backfill_dlq_topic!r} must differ from the "
                                "live output, dead-letter and source topics")
        if sink.backfill_table is not None:
            raise SpecError(f"{where}: sink.backfill_table: not for a kafka sink (use sink.backfill_topic)")
        for field_ in ("url", "conn_id"):
            if field_ in snk:
                raise SpecError(f"{where}: sink.{field_}: not for a kafka sink (it writes to the pipeline's Kafka "
                                "cluster)")
        for field_, fmt in (("schema", sink.format), ("key_schema", sink.key_format)):
            if getattr(sink, field_) is not None and fmt not in REGISTRY_FORMATS:
                raise SpecError(f"{where}: sink.{field_}: a schema file needs sink.{'format' if field_ == 'schema' else 'key_format'} "
                                f"{' or '.join(REGISTRY_FORMATS)}")
        # dlq_topic is optional: without it, a dead letter fails the batch (nothing is committed).
    elif kind == "iceberg":
        sink = _iceberg_sink(sink, snk, where, environ)
    else:
        if not sink.table or not isinstance(sink.table, str):
            raise SpecError(f"{where}: sink.table: required for a sql sink")
        if commit != "atomic":
            raise SpecError(f"{where}: sink.commit: a sql sink commits on the driver: use 'atomic'")
        if "transaction_timeout_s" in snk:
            raise SpecError(f"{where}: sink.transaction_timeout_s: not for a sql sink (its database transaction "
                            "starts after Spark has computed the rows)")
        if sink.dlq_topic or sink.topic:
            raise SpecError(f"{where}: sink.{'dlq_topic' if sink.dlq_topic else 'topic'}: not for a sql sink "
                            "(dead letters go to the kafka_eos_dead_letters table)")
        if sink.backfill_topic or sink.backfill_dlq_topic:
            field_ = "backfill_topic" if sink.backfill_topic else "backfill_dlq_topic"
            raise SpecError(f"{where}: sink.{field_}: not for a sql sink (use sink.backfill_table: side runs "
                            "write a table of their own)")
        for field_ in ("format", "key_format", "schema", "key_schema", "subject_strategy", "auto_register"):
            if field_ in snk:
                raise SpecError(f"{where}: sink.{field_}: not for a sql sink (the table's columns are the transform's "
                                "output)")
        if sink.merge == "add" and not sink.key_columns:
            raise SpecError(f"{where}: sink.merge: 'add' needs sink.key_columns (the key whose rows a run adds to)")
        if sink.backfill_table is not None and sink.backfill_table in (
                sink.table, "kafka_eos_offsets", "kafka_eos_dead_letters"):
            raise SpecError(f"{where}: sink.backfill_table: {sink.backfill_table!r} must differ from the live table "
                            "and kafka-eos's own tables")
        if sink.conn_id is None and (snk.get("url") is None or (environ is not None and sink.url is None)):
            raise SpecError(f"{where}: sink: a sql sink needs its database: sink.conn_id (an Airflow connection) "
                            f"or sink.url (a SQLAlchemy URL{'' if snk.get('url') is None else ', which expanded to nothing'}"
                            "; 'local' for kafka-eos's development SQLite file)")
    manifest = top.get("manifest_topic", MANIFEST_TOPIC_PREFIX + name)
    _topic_name(manifest, where, "manifest_topic")
    if manifest in (*topics, sink.topic, sink.dlq_topic, sink.backfill_topic, sink.backfill_dlq_topic):
        raise SpecError(f"{where}: manifest_topic: {manifest!r} is also a data topic of the pipeline: the run "
                        "manifest needs a topic of its own")
    schedule = top.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise SpecError(f"{where}: schedule: must be a cron string, or {STREAM_SCHEDULE!r}")
    return PipelineSpec(name=name, source=source, transform=transform, sink=sink,
                        schedule=schedule, manifest_topic=manifest, path=where,
                        spark_conf=_spark_conf(top.get("spark"), where))


#: ``sink.partition_by``'s words: ``transform(column)``, ``transform(n, column)`` or a bare column.
PARTITION_FIELD = re.compile(r"^\s*(?:(years|months|days|hours|identity)\(\s*(\w+)\s*\)"
                             r"|(bucket|truncate)\(\s*(\d+)\s*,\s*(\w+)\s*\)|(\w+))\s*$")


def partition_field(text: str) -> tuple[str, str]:
    """``days(ts)`` as (``ts``, Iceberg's ``day``); ``bucket(16, id)`` as (``id``, ``bucket[16]``);
    ``col`` as (``col``, ``identity``)."""
    m = PARTITION_FIELD.match(text)
    if m is None:
        raise ValueError(text)
    if m.group(6):
        return m.group(6), "identity"
    if m.group(1):
        return m.group(2), {"years": "year", "months": "month", "days": "day", "hours": "hour"}.get(
            m.group(1), m.group(1))
    return m.group(5), f"{m.group(3)}[{int(m.group(4))}]"


def _partition_by(snk: dict, where: str) -> tuple[str, ...]:
    raw = snk.get("partition_by", [])
    if not isinstance(raw, list) or not all(isinstance(f, str) and PARTITION_FIELD.match(f) for f in raw):
        raise SpecError(f"{where}: sink.partition_by: must be a list of partition fields: days(col), hours(col), "
                        "months(col), years(col), bucket(n, col), truncate(n, col) or col")
    return tuple(raw)


def _iceberg_sink(sink: SinkSpec, snk: dict, where: str, environ) -> SinkSpec:
    """An Iceberg sink's checks; its dead letters go to the table ``<table>_dead_letters``."""
    if not sink.table or not isinstance(sink.table, str) or not all(sink.table.split(".")):
        raise SpecError(f"{where}: sink.table: required for an iceberg sink ('namespace.table', or 'table' in "
                        "namespace 'default')")
    if sink.commit != "atomic":
        raise SpecError(f"{where}: sink.commit: an iceberg sink commits one snapshot on the driver: use 'atomic'")
    for field_ in ("topic", "dlq_topic", "backfill_topic", "backfill_dlq_topic", "backfill_table",
                   "transaction_timeout_s", "format", "key_format", "schema", "key_schema", "subject_strategy",
                   "auto_register"):
        if field_ in snk:
            raise SpecError(f"{where}: sink.{field_}: not for an iceberg sink (results go to sink.table, dead letters "
                            "to its table <table>_dead_letters; side runs to a branch of both)")
    if sink.merge == "upsert" and not sink.key_columns:
        raise SpecError(f"{where}: sink.merge: 'upsert' needs sink.key_columns (the key whose rows a run replaces)")
    if sink.merge == "append" and sink.key_columns:
        raise SpecError(f"{where}: sink.key_columns: only with merge: upsert (an append adds every row)")
    if sink.conn_id is None and (snk.get("url") is None or (environ is not None and sink.url is None)):
        raise SpecError(f"{where}: sink: an iceberg sink needs its catalog's database: sink.conn_id (an Airflow "
                        "connection) or sink.url (a SQLAlchemy URL; 'local' for kafka-eos's embedded catalog)")
    # A REST catalog places tables itself; a URL still a template (a DAG's parse) or a connection's is
    # checked where the catalog is opened.
    if sink.warehouse is None and sink.url not in (None, "local") and "${" not in sink.url \
            and not sink.url.startswith(("http://", "https://")):
        raise SpecError(f"{where}: sink.warehouse: required for an iceberg sink on a SQL catalog other than the "
                        "embedded one (url: local): where the catalog puts the table's files")
    return replace(sink, dead_letters_table=f"{sink.table}_dead_letters")


def _spark_conf(raw: Any, where: str) -> dict[str, str]:
    """The ``spark:`` section: Spark setting -> value (``spark.executor.memory: 4g``); a value may be
    a string, a number or a boolean, or a list (joined with commas: ``spark.jars.packages``)."""
    if raw is None:
        return {}
    conf = _mapping(raw, where, "spark")
    out = {}
    for key, value in conf.items():
        if not isinstance(key, str) or not key.startswith("spark."):
            raise SpecError(f"{where}: spark: {key!r}: not a Spark setting (the keys are Spark's own, e.g. "
                            "spark.executor.memory)")
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            value = ",".join(str(v) for v in value)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)) or value == "":
            raise SpecError(f"{where}: spark: {key!r}: must be a string, a number, a boolean or a list")
        out[key] = str(value)
    return out


def _opt_str(mapping: dict, where: str, field: str, prefix: str) -> str | None:
    value = mapping.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError(f"{where}: {prefix}{field}: must be a non-empty string")
    return value


def _bool(mapping: dict, where: str, field: str, default: bool, prefix: str) -> bool:
    value = mapping.get(field, default)
    if not isinstance(value, bool):
        raise SpecError(f"{where}: {prefix}{field}: must be true or false")
    return value


def _schema_file(mapping: dict, where: str, field: str) -> str | None:
    """A schema file's path, relative to the spec's folder; it must exist."""
    value = _opt_str(mapping, where, field, "sink.")
    if value is None:
        return None
    path = Path(value) if Path(value).is_absolute() or not where.endswith((".yaml", ".yml")) else \
        Path(where).resolve().parent / value
    if not path.is_file():
        raise SpecError(f"{where}: sink.{field}: no such schema file {path}")
    return str(path)


def _mapping(value: Any, where: str, field: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: {field or 'top level'}: must be a mapping")
    return value


def _known(mapping: dict, where: str, prefix: str, allowed: set[str]) -> None:
    for key in mapping:
        if key not in allowed:
            raise SpecError(f"{where}: {prefix}{key}: unknown field (known: {', '.join(sorted(allowed))})")


def _str(mapping: dict, where: str, field: str, default: str | None = None, prefix: str = "") -> str:
    value = mapping.get(field, default)
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}: {prefix}{field}: a non-empty string is required")
    return value


def _choice(mapping: dict, where: str, field: str, choices: tuple[str, ...], prefix: str = "",
            required: bool = False) -> str:
    if field not in mapping and required:
        raise SpecError(f"{where}: {prefix}{field}: required (one of {', '.join(choices)})")
    value = mapping.get(field, choices[0])
    if value not in choices:
        raise SpecError(f"{where}: {prefix}{field}: {value!r} is not one of {', '.join(choices)}")
    return value


def _positive_int(mapping: dict, where: str, field: str, default: int, prefix: str = "source.") -> int:
    value = mapping.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{where}: {prefix}{field}: must be a positive integer, got {value!r}")
    return value


def _topic_name(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str) or not _TOPIC_RE.match(value):
        raise SpecError(f"{where}: {field}: {value!r} is not a valid topic name")
    return value


_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _opt_table(mapping: dict, where: str, field: str) -> str | None:
    """An optional SQL table name: letters, digits and '_' (it is also quoted into a promote
    statement), at most 63 characters (PostgreSQL's limit)."""
    value = mapping.get(field)
    if value is not None and (not isinstance(value, str) or not _TABLE_RE.match(value)):
        raise SpecError(f"{where}: sink.{field}: {value!r} is not a valid table name (letters, digits, '_')")
    return value


def _opt_topic(mapping: dict, where: str, field: str) -> str | None:
    value = mapping.get(field)
    return None if value is None else _topic_name(value, where, f"sink.{field}")
