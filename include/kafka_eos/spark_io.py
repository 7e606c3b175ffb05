"""Spark side of a run: the session (with Spark's own Kafka connector) and the exact-range read."""

from __future__ import annotations

import hmac
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from kafka_eos.errors import KafkaEosError
from kafka_eos.kafka_admin import READER_GROUP_PREFIX
from kafka_eos.paths import jars_dir
from kafka_eos.plan import PartitionRange
from kafka_eos.settings import KafkaSettings

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from datetime import date

    from pyspark.sql import DataFrame, SparkSession

#: Comma-separated jar paths, or a folder of jars, holding Spark's Kafka connector.
SPARK_JARS_ENV = "KAFKA_EOS_SPARK_JARS"
#: Timestamps (Kafka's, the manifest's) are UTC; so are the transforms' time functions.
SESSION_TIME_ZONE = "UTC"


def connector_jars(environ=os.environ) -> list[str]:
    """Jars of spark-sql-kafka-0-10 and its dependencies (``make jars`` resolves them), and
    kafka-eos's own where it is built (the wheel carries it)."""
    raw = environ.get(SPARK_JARS_ENV)
    if raw and not Path(raw).is_dir():
        named = [j for j in raw.split(",") if j]
        return [*named, *_own_jar(named)]
    folder = Path(raw) if raw else jars_dir("spark")
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise KafkaEosError(f"no Spark Kafka connector (spark-sql-kafka jar) in {folder}: `kafka-eos spark jars` "
                            f"fetches it from Maven Central once (`make jars` in a checkout), or set {SPARK_JARS_ENV} "
                            "to a folder of them (an image's)")
    return [*jars, *_own_jar(jars)]


def _own_jar(jars: Sequence[str]) -> list[str]:
    """kafka-eos's own jar (jvm/connect: the Java client's login through a Python token callback,
    the Connect plugin) where it is built and not among ``jars`` already."""
    own = connect_plugin_jar()
    return [str(own)] if own is not None and not any(Path(j).name == own.name for j in jars) else []


def connector_package() -> str:
    """The Maven coordinates of Spark's Kafka connector and Avro functions matching the installed
    pyspark (``org.apache.spark:spark-sql-kafka-0-10_2.13:<version>,...spark-avro...``), for
    ``spark.jars.packages``."""
    from importlib.metadata import version

    return ",".join(f"org.apache.spark:{name}_2.13:{version('pyspark')}" for name in ("spark-sql-kafka-0-10", "spark-avro"))


def connector_conf(environ=os.environ) -> dict[str, str]:
    """How Spark gets the Kafka connector: the jars of ``KAFKA_EOS_SPARK_JARS`` (an image's folder),
    else of ``$KAFKA_EOS_HOME/jars/spark`` (``make jars``, ``kafka-eos spark jars``), as
    ``spark.jars``. Never a download at run time: a cluster without Maven Central (air-gapped)
    runs as one with it.

    :raises KafkaEosError: no connector jar there, naming the folder and how to fill it.
    """
    return {"spark.jars": ",".join(connector_jars(environ))}


def fetch_connector(dest: Path) -> list[Path]:
    """Fetch Spark's Kafka connector and Avro functions for the installed pyspark, with their
    dependencies, from Maven Central into ``dest`` (what ``kafka-eos spark jars`` does, once,
    when asked): Spark's own resolver (``spark.jars.packages``, its Ivy cache) in a short local
    session, the resolved jars copied. Returns the jars now in ``dest``."""
    import shutil
    from urllib.parse import unquote, urlparse

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("kafka-eos-spark-jars")
             .config("spark.jars.packages", connector_package()).config("spark.ui.enabled", "false")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    try:
        resolved = [Path(unquote(urlparse(j).path)) for j in spark.sparkContext.getConf().get("spark.jars").split(",") if j]
    finally:
        spark.stop()
    dest.mkdir(parents=True, exist_ok=True)
    for jar in resolved:
        shutil.copy2(jar, dest / jar.name)
    return sorted(dest / jar.name for jar in resolved)


def session_conf() -> dict[str, str]:
    """Settings every kafka-eos Spark application needs, in-process or through spark-submit."""
    return {
        **connector_conf(),
        # A speculative copy of a per_partition task would race its twin for the same
        # transactional.id; the fencing keeps it correct but the work is wasted.
        "spark.speculation": "false",
        "spark.sql.session.timeZone": SESSION_TIME_ZONE,
        "spark.ui.showConsoleProgress": "false",
        # Executors run kafka_eos's commit code: the interpreter PYSPARK_PYTHON names (an image's,
        # or the Airflow task's choice for a cluster), else the driver's own.
        "spark.pyspark.python": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }


#: Settings that hold a comma-separated list: a pipeline's own entries are added to kafka-eos's
#: (the Kafka connector stays), not put in their place.
LIST_SETTINGS = ("spark.jars", "spark.jars.packages", "spark.jars.repositories", "spark.submit.pyFiles",
                 "spark.files", "spark.jars.excludes")


def merged_conf(base: Mapping[str, str], pipeline: Mapping[str, str]) -> dict[str, str]:
    """``pipeline``'s Spark settings (a spec's ``spark:`` section) over kafka-eos's ``base``: a
    pipeline's value wins (``spark.pyspark.python`` included: the interpreter is set only where the
    pipeline did not set one), except for :data:`LIST_SETTINGS`, whose entries are joined."""
    out = dict(base)
    for key, value in pipeline.items():
        if key in LIST_SETTINGS and out.get(key):
            entries = [e for e in out[key].split(",") if e]
            out[key] = ",".join(entries + [e for e in value.split(",") if e and e not in entries])
        else:
            out[key] = value
    return out


def local_master_conf(master: str) -> dict[str, str]:
    """For a ``local[...]`` master: keep the driver on loopback. Spark binds the address the
    host name resolves to, which on many machines is a LAN interface."""
    if not master.startswith("local"):
        return {}
    return {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


def under_spark_submit() -> bool:
    """Whether spark-submit started this Python process (and the driver JVM it talks to). Before
    the context starts, ``SparkConf()`` cannot tell: it sees spark-submit's settings (``--master``
    among them) only once the gateway is up."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def is_connect(obj: object) -> bool:
    """Whether ``obj`` (a SparkSession or a DataFrame) is a Spark Connect client's: no JVM in this
    process, so no ``_jdf``, no SparkContext; the server plans and runs it."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


#: Spark Connect's default port, where a URL names none.
CONNECT_DEFAULT_PORT = 15002


def check_reachable(remote: str, timeout_s: float = 10.0) -> None:
    """Fail in one line when nothing listens at the Spark Connect URL ``remote`` (the client
    would retry for minutes before it says so).

    :raises KafkaEosError: not an ``sc://`` URL, or the server does not accept a connection.
    """
    import socket
    from urllib.parse import urlparse

    url = urlparse(remote)
    if url.scheme != "sc" or not url.hostname:
        raise KafkaEosError(f"Spark Connect URL {remote.split(';')[0]!r}: expected sc://host[:port]")
    address = (url.hostname, url.port or CONNECT_DEFAULT_PORT)
    try:
        socket.create_connection(address, timeout=timeout_s).close()
    except OSError as exc:
        raise KafkaEosError(f"Spark Connect server at {address[0]}:{address[1]} is not reachable "
                            f"({exc.strerror or exc}): start one with `kafka-eos spark start --connect`") from None


def get_session(app_name: str = "kafka-eos", master: str | None = None,
                driver_java_options: str | None = None, remote: str | None = None,
                conf: Mapping[str, str] | None = None, pipeline: str | None = None) -> "SparkSession":
    """The SparkSession of this process (``local[2]`` unless a master is given or configured), or
    a Spark Connect client's session of the server at ``remote``.

    :param driver_java_options: ``spark.driver.extraJavaOptions`` for a session this call starts
        (e.g. where Spark's log4j writes, see :func:`kafka_eos.logs.spark_log4j_options`).
    :param remote: a Spark Connect URL (``sc://host:port``, see
        :class:`kafka_eos.local.spark_connect.LocalSparkConnect`): the server has the connector
        and the interpreter (its own settings); the session gets the settings a session may set.
    :param conf: the pipeline's Spark settings (a spec's ``spark:`` section), merged over kafka-eos's
        (:func:`merged_conf`) for a session this call starts. Through Spark Connect only the
        ``spark.sql.*`` ones reach the session; the others are the server's.
    :param pipeline: through Spark Connect, the pipeline whose runs share one session of the
        server (:func:`connect_session`); None: a session of its own. End it with :func:`end_session`.
    """
    from pyspark.sql import SparkSession

    pipeline_conf = dict(conf or {})
    if remote:
        check_reachable(remote)
        server_side = sorted(k for k in pipeline_conf if not k.startswith("spark.sql."))
        if server_side:
            log.info("Spark Connect: %s are the server's settings, not the session's: left out",
                     ", ".join(server_side))
        return connect_session(remote, connect_session_conf(pipeline_conf), pipeline)

    # A Spark Connect session made in this process (or in the one that started it) leaves
    # SPARK_CONNECT_MODE_ENABLED set, which turns every later builder into a Connect one: this
    # session is a classic one.
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    # PySpark reads the workers' interpreter from PYSPARK_PYTHON when the context starts in
    # this process (spark.pyspark.python only reaches spark-submit): they run kafka_eos code.
    os.environ.setdefault("PYSPARK_PYTHON", pipeline_conf.get("spark.pyspark.python", sys.executable))
    from pyspark import SparkConf

    builder = SparkSession.builder.appName(app_name)
    conf = merged_conf(session_conf(), pipeline_conf)
    if master or not (under_spark_submit() or SparkConf().contains("spark.master")):
        # Under spark-submit the master is already set (--master): never override it.
        master = master or os.environ.get("SPARK_MASTER") or "local[2]"
        builder = builder.master(master)
        conf.update(local_master_conf(master))
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if driver_java_options:
        conf["spark.driver.extraJavaOptions"] = driver_java_options
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    bound_result_size(session)
    quiet_group_id_warning(session)
    return session


#: A named Spark Connect session whose runs are done is left to the server's idle timeout
#: (``spark.connect.session.manager.defaultSessionTimeout``, 60 minutes by default), not released:
#: the pipeline's next run takes it up again.
_KEPT_SESSION = "_kafka_eos_kept"


def connect_session_conf(pipeline_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a Spark Connect session of a pipeline is given: kafka-eos's time zone and the pipeline's
    ``spark.sql.*`` settings (the others are the server's)."""
    return {"spark.sql.session.timeZone": SESSION_TIME_ZONE,
            **{k: v for k, v in (pipeline_conf or {}).items() if k.startswith("spark.sql.")}}


def connect_session(remote: str, conf: Mapping[str, str], pipeline: str | None = None,
                    today: "date | None" = None) -> "SparkSession":
    """A Spark Connect client's session of the server at ``remote``, with the session settings ``conf``.

    Where the URL names no ``session_id``, a pipeline's runs share one session of the server a day
    (:func:`pipeline_session_id`): what the server builds per session stays warm from one run to the
    next — the session's state, and the Python daemon and workers of its tasks (Spark keys them by
    the session): about a second of each run on a server of two cores (docs/performance.md).
    Runs do not release that session (:func:`end_session`); the server ends it after its idle
    timeout, and a session the server has closed (Spark then refuses its id) gives way to a session
    of the run's own. A URL that names a ``session_id`` is its caller's: used as it is, not released.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    named = _connect_url_params(remote).get("session_id")
    kept = named is not None or pipeline is not None
    url = remote if named is not None or pipeline is None else \
        with_session_id(remote, pipeline_session_id(remote, pipeline, conf, today))

    def build(url: str) -> "SparkSession":
        builder = SparkSession.builder.remote(url)
        for key, value in conf.items():
            builder = builder.config(key, value)
        # A new client (getOrCreate would hand back this process's active one, whatever its URL);
        # setting the conf asks the server, so a closed session says so here.
        return builder.create()

    try:
        session = build(url)
    except PySparkException as exc:
        if named is not None or pipeline is None or exc.getCondition() != "INVALID_HANDLE.SESSION_CLOSED":
            raise
        # Made, and refused by the server: its channel closed (this process's classic session, if
        # any, is not touched).
        refused = ConnectSession.getActiveSession()
        if refused is not None:
            refused.release_session_on_close = False
            refused.stop()
        log.info("Spark Connect: pipeline %s's session of today was closed by the server (idle past its "
                 "timeout): this run takes a session of its own", pipeline)
        kept, session = False, build(remote)
    setattr(session, _KEPT_SESSION, kept)
    session.release_session_on_close = not kept
    return session


def end_session(spark: "SparkSession") -> None:
    """End this process's use of ``spark``: a Spark Connect session of the run's own is released on
    the server (with anything it cached); a pipeline's shared session (:func:`connect_session`) is
    left for its next run, without its temporary views (a transform's, which its next run makes
    again); a classic session stops."""
    if is_connect(spark) and getattr(spark, _KEPT_SESSION, False):
        try:
            for view in spark.catalog.listTables():
                if view.isTemporary:
                    spark.catalog.dropTempView(view.name)
        except Exception as exc:  # noqa: BLE001 - the next run replaces them, or fails on its own
            log.debug("temporary views of the shared Spark Connect session not dropped: %s", exc)
    spark.stop()


def pipeline_session_id(remote: str, pipeline: str, conf: Mapping[str, str], today: "date | None" = None) -> str:
    """The Spark Connect session id of ``pipeline``'s runs on ``today`` (UTC): a UUID derived from the
    server's URL (with its ``user_id`` and ``token``: nobody without the token can compute it), the
    pipeline, the session settings (changed settings: another session, none left over from before)
    and the day (a session the server has closed is not asked for again the next day)."""
    import hashlib
    import uuid
    from datetime import datetime, timezone

    day = (today or datetime.now(timezone.utc).date()).isoformat()
    digest = hashlib.sha256(json.dumps([remote, pipeline, sorted(conf.items()), day]).encode())
    return str(uuid.UUID(bytes=digest.digest()[:16], version=4))


def _connect_url_params(remote: str) -> dict[str, str]:
    """The ``;key=value`` parameters of a Spark Connect URL (``sc://host:port/;token=...;user_id=...``)."""
    _base, _sep, params = remote.partition(";")
    return dict(p.split("=", 1) for p in params.split(";") if "=" in p)


def with_session_id(remote: str, session_id: str) -> str:
    """The Spark Connect URL ``remote`` naming the session ``session_id``."""
    if ";" in remote:
        return f"{remote.rstrip(';')};session_id={session_id}"
    return f"{remote.rstrip('/')}/;session_id={session_id}"


#: What share of the driver's heap one job may return to it (``spark.driver.maxResultSize``) where
#: nobody set it: an atomic commit in one pass returns every task's result through the driver, and
#: Spark's default (1 GiB, with a 1 GiB heap by default) lets them fill the heap before Spark's own
#: limit stops the job (an OutOfMemoryError instead of a fallback to two passes).
RESULT_HEAP_SHARE = 0.4
#: Above this share of the heap, an atomic commit does not try one pass (see :func:`result_limits`).
ONE_PASS_HEAP_SHARE = 0.5


def bound_result_size(session: "SparkSession") -> None:
    """Set ``spark.driver.maxResultSize`` to :data:`RESULT_HEAP_SHARE` of the driver's heap on a
    classic session where it was not set (a setting of the user's, or of spark-submit's, stays)."""
    if is_connect(session):
        return
    conf = session.sparkContext._jsc.sc().conf()
    if not conf.contains("spark.driver.maxResultSize"):
        heap = session.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
        conf.set("spark.driver.maxResultSize", str(int(heap * RESULT_HEAP_SHARE)))


def result_limits(session: "SparkSession") -> tuple[int, int]:
    """``spark.driver.maxResultSize`` and the driver's heap, in bytes (0: no limit). Through Spark
    Connect, the server's settings (its heap as ``spark.driver.memory`` says)."""
    if is_connect(session):
        limit = size_bytes(session.conf.get("spark.driver.maxResultSize", "1g"), "b")
        return limit, size_bytes(session.conf.get("spark.driver.memory", "1g"), "m")
    sc = session.sparkContext
    limit = sc._jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(
        sc._jsc.sc().conf().get("spark.driver.maxResultSize", "1g"))
    return int(limit), int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())


def size_bytes(text: str, bare: str) -> int:
    """Bytes of a Spark size (``512m``, ``1g``, ``400k``; a bare number in unit ``bare``)."""
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower()
    if len(text) > 1 and text[-1] == "b" and text[-2] in units:  # "512mb"
        text = text[:-1]
    unit = text[-1] if text[-1:] in units else bare
    return int(float(text.rstrip("bkmgt") or 0) * units[unit])


#: ``fetch.max.wait.ms`` of Spark's consumers in kafka-eos's reads (Kafka's default: 500 ms). A range
#: of transactional input ends in a commit marker, past which the broker has nothing to send until a
#: new record comes: a task reading its range's end waited for that fetch (up to the default's half
#: second, or until the producers' next record), in every read. And a pooled consumer keeps a fetch
#: in flight past the range it read: the next read's task on it waits for that one first (up to this
#: long). Planned ranges end at offsets the broker already has, so a short wait loses nothing; a long
#: range's fetches return as soon as they have a byte, as before. 1 ms, not 0: a fetch where the
#: broker has nothing yet (a leader moving) is still parked by the broker, not sent again at once.
FETCH_MAX_WAIT_MS = 1
#: A key of this process's own for :func:`spark_reader_group` (never written anywhere).
_GROUP_KEY = os.urandom(16)


def spark_reader_group(options: Mapping[str, str]) -> str:
    """The group id of Spark's Kafka consumers in the reads of this process with ``options``.

    Spark gives each read a new group id unless one is set, and keys its executors' pool of
    consumers by group id and partition: a new group id is a new ``KafkaConsumer`` per task per
    read (connect, metadata, first fetch), most of a small stream batch's job. One id per option
    set keeps them pooled from one batch to the next. Spark requires the same Kafka parameters
    under one pool key, so the id is a keyed digest of the options (other credentials: another id;
    the key is this process's: no digest of a secret can be tried offline, and another process's
    reads never share its consumers). The consumers are assigned their partitions and never join
    the group or commit to it, so no read interferes with another (Spark's warning about a set
    group id is about subscribing queries; :func:`quiet_group_id_warning`).
    """
    text = json.dumps(sorted(options.items()))
    return f"{READER_GROUP_PREFIX}spark.{hmac.new(_GROUP_KEY, text.encode(), 'sha256').hexdigest()[:16]}"


#: Spark's logger that warns, at each read, that ``kafka.group.id`` is set.
_GROUP_ID_WARNER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


#: Log4j levels of a Spark JVM's configuration that quiet :func:`spark_reader_group`'s warning.
QUIET_LOGGERS = {_GROUP_ID_WARNER: "ERROR"}


def quiet_group_id_warning(session: "SparkSession") -> None:
    """Raise the level of the Spark logger that warns of :func:`spark_reader_group`'s id at each read
    (a line per stream batch) to ERROR, in this driver's JVM."""
    try:
        jvm = session.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            _GROUP_ID_WARNER, jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception as exc:  # noqa: BLE001 - another logging backend: the warning stays
        log.debug("could not quiet %s: %s", _GROUP_ID_WARNER, exc)


def read_ranges(spark: "SparkSession", settings: KafkaSettings,
                ranges: Sequence[PartitionRange], max_records_per_task: int | None = None) -> "DataFrame":
    """Read exactly ``[from, until)`` of each non-empty range, committed records only.

    ``assign`` (not ``subscribe``) and no ``minPartitions``: one Spark task holds one source
    partition, which per_partition scope relies on.

    :param max_records_per_task: split ranges longer than this (in offsets) over several tasks
        (work that commits on the driver: the driver then holds one small task's rows at a time,
        however large the run).
    """
    ranges = [r for r in ranges if not r.empty]
    if not ranges:
        raise ValueError("read_ranges needs at least one non-empty range")
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.from_offset
        ending.setdefault(r.topic, {})[str(r.partition)] = r.until
    if settings.token_callback is not None and connect_plugin_jar() is None:
        raise KafkaEosError(f"the Kafka settings log in through a token callback ({settings.token_callback}), which "
                            "Spark's Java client calls through kafka-eos's jar, and it is not built: `make jars` in a "
                            "checkout (an installed wheel carries it)")
    kafka = {**settings.spark_options(python=_executor_python(spark)), "kafka.isolation.level": "read_committed",
             "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS)}
    kafka["kafka.group.id"] = spark_reader_group(kafka)
    return (spark.read.format("kafka")
            .options(**kafka)
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("includeHeaders", "true")
            # Records vanishing between planning and reading is data loss: fail the run.
            .option("failOnDataLoss", "true")
            .options(**({"maxRecordsPerPartition": str(max_records_per_task)} if max_records_per_task else {}))
            .load())


#: The columns of Spark's Kafka source with headers (:func:`read_ranges`), for a read of nothing.
KAFKA_SOURCE_SCHEMA = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
                       "timestampType INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")


def _executor_python(spark: "SparkSession") -> str | None:
    """The executors' Python: ``spark.pyspark.python`` where the session names one, else
    ``$PYSPARK_PYTHON``; None: this process's (a local session's executors run it)."""
    try:
        named = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # noqa: BLE001 - a session that cannot say
        named = None
    return named or os.environ.get("PYSPARK_PYTHON") or None


#: Spark's classes the lineage walk of :func:`read_layout` goes through.
_ONE_TO_ONE = "org.apache.spark.OneToOneDependency"
_KAFKA_READ = "org.apache.spark.sql.kafka010.KafkaSourceRDD"


def read_layout(df: "DataFrame") -> dict[int, tuple[tuple[str, int], int, int]] | None:
    """What each Spark task of ``df`` reads, proven from the lineage of the RDD Spark runs for it,
    before any task runs: ``{task index: ((topic, partition), from offset, until offset)}``.

    None where it cannot be proven: some dependency from ``df``'s RDD back to the Kafka read is not
    one-to-one (task *i*'s rows come from read task *i* only: no union, no coalesce, no shuffle),
    or the data is not a Kafka read, or (Spark Connect) the server has no kafka-eos plugin to ask.
    """
    if is_connect(df):
        return _connect_read_layout(df)
    try:
        rdd = df._jdf.queryExecution().toRdd()
        while rdd.getClass().getName() != _KAFKA_READ:
            dependencies = rdd.dependencies()
            if dependencies.size() != 1 or dependencies.head().getClass().getName() != _ONE_TO_ONE:
                return None
            rdd = dependencies.head().rdd()
        read = {}
        for task in rdd.partitions():
            offsets = task.offsetRange()
            tp = (offsets.topicPartition().topic(), offsets.topicPartition().partition())
            read[task.index()] = (tp, offsets.fromOffset(), offsets.untilOffset())
        return read
    except Exception:  # noqa: BLE001 - no JVM DataFrame (Spark Connect), another reader: not proven
        return None


#: kafka-eos's Spark Connect server plugin (jvm/connect): :func:`read_layout` on the server's side,
#: for a Connect client's DataFrame, which has no JVM plan in the client's process.
CONNECT_PLUGIN_CLASS = "io.kafkaeos.connect.ReadLayoutPlugin"
#: The relation it answers: a ``Relation.extension`` whose value is the DataFrame's own ``Relation``.
READ_LAYOUT_TYPE = "type.googleapis.com/kafka_eos.ReadLayout"
#: Connect sessions whose server did not answer :data:`READ_LAYOUT_TYPE` (asked once a session).
_no_layout_plugin: set[str] = set()


#: The package's copy of the plugin (the wheel carries it).
PACKAGED_JARS = Path(__file__).parent / "jars"


def connect_plugin_jar() -> Path | None:
    """The plugin's jar: ``make jars`` builds it into .local/jars/connect and into the package
    (:data:`PACKAGED_JARS`); None where it is not built."""
    for folder in (jars_dir("connect"), PACKAGED_JARS):
        if (folder / "kafka-eos-connect.jar").is_file():
            return folder / "kafka-eos-connect.jar"
    return None


def connect_plugin_conf() -> dict[str, str]:
    """The settings that load the plugin into a Spark Connect server kafka-eos starts; none where
    it is not built (the server then answers no layout: two passes)."""
    jar = connect_plugin_jar()
    if jar is None:
        return {}
    return {"spark.jars": str(jar), "spark.connect.extensions.relation.classes": CONNECT_PLUGIN_CLASS}


def _connect_read_layout(df: "DataFrame") -> dict[int, tuple[tuple[str, int], int, int]] | None:
    """:func:`read_layout` asked of the Spark Connect server: its plugin plans ``df`` (nothing runs)
    and walks the lineage there. None where the lineage proves nothing, or the server has no plugin
    (it refuses the unknown relation: then not asked again in the session)."""
    from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    from pyspark.sql.connect.plan import CachedRelation
    from pyspark.sql.connect.proto import Relation

    session = df.sparkSession
    if session.session_id in _no_layout_plugin:
        return None
    ask = Relation()
    ask.extension.type_url = READ_LAYOUT_TYPE
    ask.extension.value = df._plan.plan(session.client).SerializeToString()
    try:
        rows = ConnectDataFrame(CachedRelation(ask), session).collect()
    except Exception as exc:  # noqa: BLE001 - not proven; the commit's own jobs meet a real failure again
        if not any(m in str(exc) for m in ("NO_HANDLER_FOR_EXTENSION", "No handler found for extension")):
            log.info("no read layout from the Spark Connect server: %s", str(exc).splitlines()[0][:300])
            return None
        _no_layout_plugin.add(session.session_id)  # a server without the plugin: asked once a session
        log.info("the Spark Connect server does not answer kafka-eos's read layout (%s): per_partition scope "
                 "takes two passes; load %s into it (docs/architecture.md, \"Through a Spark Connect server\")",
                 str(exc).splitlines()[0][:200], CONNECT_PLUGIN_CLASS)
        return None
    return {r["task"]: ((r["topic"], r["partition"]), r["from_offset"], r["until_offset"]) for r in rows} or None
