"""``make bench``: kafka-eos's throughput beside plain at-least-once Spark and the broker's own
ceiling, its fixed costs, its planner, and its memory.

    python -m kafka_eos_lab.bench.throughput [--records 300000] [--sizes 1,4] [--repeat 3] [--skip airflow,postgres]

On the local broker (started if needed) unless ``KAFKA_BOOTSTRAP_SERVERS`` is set, one after
another on the same generated orders (about 200-byte JSON values, 6 partitions, transactions of
1,000 records with every 3rd aborted, every 50th record malformed):

- ceiling: Kafka's perf tools from the broker's jars (``ProducerPerformance`` with a
  transactional id, ``ConsumerPerformance`` read_committed);
- baseline: plain Spark, the same plan and transform, Spark's own at-least-once Kafka sink;
- kafka-eos: the same, exactly-once, Kafka sink ``atomic`` and ``per_partition``; the SQL sink
  (SQLite, PostgreSQL) with the ``revenue_per_minute`` aggregation;
- the SQL sink at every size with a row per order (``orders:as_rows``, keyed by source
  coordinates) into PostgreSQL, beside Spark's own JDBC writer (``df.write.jdbc``, append,
  at-least-once) appending the same rows to a table of the same definition;
- fixed costs: ``kafka-eos run`` with an empty plan and with a handful of records, and an Airflow
  DAG run (``airflow dags test``) of each;
- the planner over a topic of 1,000 partitions;
- peak RSS of the driver (JVM, Python) and the Python workers, at each input size.

Spark runs are whole ``spark-submit`` processes (``local[2]``, JVM start included), as a DAG's
Spark task runs them. Every kafka-eos run is checked: its read_committed output must be exactly
the committed valid input and its dead letters the committed malformed input; the bench exits 1
otherwise. Written to ``.local/bench/throughput.json`` and ``throughput.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Callable

from confluent_kafka import Producer

from kafka_eos.kafka_admin import create_topics
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.paths import PROJECT_ROOT, jars_dir, local_dir
from kafka_eos.sample_data import _poison, make_order
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec, parse_spec, spec_document

#: Source partitions (as in the issue's measurements: a few per core).
PARTITIONS = 6
#: Default input size (1x): a kafka-eos run takes tens of seconds on 2 cores.
DEFAULT_RECORDS = 300_000
#: Records per source transaction; every ABORT_EVERY-th transaction is aborted.
PER_TRANSACTION = 1000
ABORT_EVERY = 3
#: Every this-many-th record is malformed (a dead letter of the orders transform).
MALFORMED_EVERY = 50
#: Padding that brings an order's JSON to about 200 bytes.
NOTE = "gift wrap; leave at the door; ring twice" + "." * 16
#: The Kafka-sink transform (JSON parse, validation, enrichment: Spark SQL only).
ORDERS_TRANSFORM = "spark_apps.transforms.orders:enrich"
#: The SQL-sink transform (per-minute revenue: an aggregation).
REVENUE_TRANSFORM = "spark_apps.transforms.revenue:revenue_per_minute"
#: The SQL-sink transform of a row per order (the one measured against Spark's JDBC writer).
ROWS_TRANSFORM = "spark_apps.transforms.orders:as_rows"
#: Spark master of every run: the machine's two cores.
MASTER = "local[2]"
#: How often the process tree's memory is sampled.
SAMPLE_EVERY_S = 0.2
#: Partitions of the planner's topic.
PLANNER_PARTITIONS = 1000
#: Targets on this machine: the throughput of both Kafka-sink scopes over Spark's at-least-once sink
#: (spark-submit and Connect alike) at the smallest input size and at the largest; the planner's and
#: an empty run's seconds (docs/performance.md).
SCOPE_TARGETS = {"smallest": 1.1, "largest": 1.3}
TARGETS = {"plan_1000_s": 2.0, "empty_run_s": 3.0,
           # Small runs through the Spark Connect server (no JVM start per run).
           "few_run_connect_s": 8.0, "few_dag_connect_s": 20.0,
           # The Avro pipeline against the same transform on JSON (docs/formats.md).
           "avro_x_json": 0.9,
           # The SQL sink (a row per order, PostgreSQL) over Spark's own JDBC writer.
           "sql_rows": 1.0}


@dataclass
class Input:
    """Ground truth of a generated topic."""

    topic: str
    records: int  # committed records (valid + malformed)
    valid: int
    malformed: int
    aborted: int
    value_bytes: int  # total bytes of committed values

    @property
    def mean_value_bytes(self) -> float:
        return self.value_bytes / max(self.records, 1)


def generate(settings: KafkaSettings, topic: str, count: int, seed: int = 11) -> Input:
    """``count`` committed orders in ``topic`` (plus aborted ones: every ABORT_EVERY-th
    transaction of PER_TRANSACTION records is aborted, on top of the count)."""
    create_topics(settings, {topic: PARTITIONS})
    rng = random.Random(seed)
    start = datetime.now(timezone.utc).replace(microsecond=0)
    producer = Producer(settings.client_config(**{
        "transactional.id": f"kafka-eos.bench.{topic}", "partitioner": "murmur2_random",
        "linger.ms": 20, "compression.type": "lz4", "queue.buffering.max.messages": 500_000}))
    producer.init_transactions(30)
    truth = Input(topic, 0, 0, 0, 0, 0)
    seq = txn = 0
    while truth.records < count:
        txn += 1
        abort = txn % ABORT_EVERY == 0
        n = PER_TRANSACTION if abort else min(PER_TRANSACTION, count - truth.records)
        producer.begin_transaction()
        valid = malformed = size = 0
        for _ in range(n):
            order = make_order(seq, rng, start)
            if seq % MALFORMED_EVERY == MALFORMED_EVERY - 1:
                value = _poison(seq % 4, order)
                malformed += 1
            else:
                value = json.dumps({**order, "note": NOTE}).encode()
                valid += 1
            size += len(value or b"")
            _produce(producer, topic, order["customer_id"].encode(), value)
            seq += 1
        if abort:
            producer.flush(60)
            producer.abort_transaction(60)
            truth.aborted += n
        else:
            producer.commit_transaction(60)
            truth.records += n
            truth.valid += valid
            truth.malformed += malformed
            truth.value_bytes += size
    return truth


def _produce(producer: Producer, topic: str, key: bytes, value: bytes | None) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            producer.poll(0.1)


def count_committed(settings: KafkaSettings, topic: str) -> int:
    """Records of ``topic`` a read_committed consumer sees, up to each partition's LSO now."""
    from kafka_eos.readers import committed_messages

    return sum(1 for _ in committed_messages(settings, topic))


# -- processes and their memory ----------------------------------------------------------------

@dataclass
class Measured:
    """One whole process: wall seconds, exit code, the peak RSS (MiB) of its parts, and the CPU
    seconds of its parts and of the services it used (:data:`WATCHED`) while it ran."""

    seconds: float
    returncode: int
    peak_mib: dict = field(default_factory=dict)
    stdout: str = ""
    cpu_s: dict = field(default_factory=dict)


#: Services whose CPU seconds each measured run reports beside its own (name: process id of the
#: service's root): the local broker, the bench's Spark Connect server (its Python workers apart,
#: as ``<name>_workers``). Set by :func:`main`.
WATCHED: dict[str, int] = {}


def _service_cpu(name: str, pid: int) -> dict[int, tuple[str, float]]:
    """``{pid: (part, own CPU seconds)}`` of a watched service's processes (its root and every
    descendant; its Python workers as ``<name>_workers``), none if it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    seen = {}
    for p in tree:
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        seen[p.pid] = (f"{name}_workers" if _role(p) == "python_workers" else name, times.user + times.system)
    return seen


def _role(proc) -> str | None:
    try:  # a process of the tree may end while it is looked at
        cmd, name = " ".join(proc.cmdline()), proc.name()
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess, AccessDenied, ZombieProcess
        return None
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd or "pyspark/daemon" in cmd:
        return "python_workers"
    if name.startswith("java") or cmd.startswith("java") or "/java " in cmd:
        return "driver_jvm"
    if "python" in name or "python" in cmd.split(" ")[0]:
        return "driver_python"
    return None


def run_measured(argv: list[str], env: dict, log: Path, timeout_s: float = 3600) -> Measured:
    """Run ``argv`` to its end, sampling the RSS of its process tree (driver JVM, driver Python,
    Python workers summed) and the CPU seconds of its parts and of the :data:`WATCHED` services
    every SAMPLE_EVERY_S."""
    import psutil

    peaks: dict[str, float] = {}
    # Each process's own CPU seconds when last seen, by pid (a process that ends between two samples
    # loses its last SAMPLE_EVERY_S at most; a parent's children's times are not added: no double
    # count); the watched services' from what they had used before the run.
    cpu: dict[int, tuple[str, float]] = {}
    jit: dict[tuple[int, int], float] = {}  # the driver JVM's compiler threads', by (pid, thread id)
    before = {pid: seconds for name, service in WATCHED.items()
              for pid, (_part, seconds) in _service_cpu(name, service).items()}
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=out, text=True,
                                start_new_session=True)
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.extend(proc.stdout), daemon=True)
        reader.start()
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            if time.monotonic() - started > timeout_s:
                os.killpg(proc.pid, signal.SIGKILL)  # the JVM and its Python workers too
                break
            now: dict[str, float] = {}
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                tree = []
            for p in tree:
                role = _role(p)
                try:
                    rss = p.memory_info().rss / 2**20
                    times = p.cpu_times()
                except psutil.Error:
                    continue
                if role:
                    now[role] = now.get(role, 0.0) + rss
                    cpu[p.pid] = (role, times.user + times.system)
                if role == "driver_jvm":
                    jit.update(_jit_threads(p.pid))
            for name, service in WATCHED.items():
                cpu.update(_service_cpu(name, service))
            for role, mib in now.items():
                peaks[role] = max(peaks.get(role, 0.0), mib)
            time.sleep(SAMPLE_EVERY_S)
        proc.wait()
        reader.join(10)
    for name, service in WATCHED.items():
        cpu.update(_service_cpu(name, service))
    cpu_s: dict[str, float] = {}
    for pid, (part, seconds) in cpu.items():
        cpu_s[part] = cpu_s.get(part, 0.0) + seconds - before.get(pid, 0.0)
    if jit:
        cpu_s[JIT_PART] = sum(jit.values())  # part of driver_jvm's, not added to the total
    return Measured(round(time.monotonic() - started, 2), proc.returncode,
                    {k: round(v) for k, v in peaks.items()}, "".join(stdout),
                    {k: round(v, 1) for k, v in cpu_s.items()})


#: The driver JVM's JIT compiler threads' CPU seconds: a part of ``driver_jvm``'s.
JIT_PART = "driver_jvm_jit"


def _jit_threads(pid: int) -> dict[tuple[int, int], float]:
    """CPU seconds of the JVM ``pid``'s JIT compiler threads (HotSpot's C1 and C2, by the names in
    ``/proc/<pid>/task/<tid>/comm``), by thread: a short run's JVM spends a third of its CPU there.
    Empty where the process or ``/proc`` is not there to read."""
    import psutil

    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return {}
    found = {}
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread.id}/comm") as f:
                if not f.read().startswith(("C1 CompilerThre", "C2 CompilerThre")):
                    continue
        except OSError:
            continue  # the thread ended (HotSpot starts and stops compiler threads as it needs)
        found[(pid, thread.id)] = thread.user_time + thread.system_time
    return found


def spark_submit(app: Path, args: list[str], jars: list[Path] = ()) -> list[str]:
    """A spark-submit of ``app`` the way a DAG's Spark task runs it (client mode, local[2]), with
    ``jars`` beside the connector's."""
    from kafka_eos.spark_io import local_master_conf, session_conf

    conf = {**session_conf(), **local_master_conf(MASTER)}
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER,
            "--jars", ",".join([conf.pop("spark.jars"), *map(str, jars)])]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, str(app), *args]


def spark_env(settings: KafkaSettings, folder: Path) -> dict:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
            **settings.to_environ(folder / f"client-{uuid.uuid4().hex[:6]}.json")}


# -- pipelines ---------------------------------------------------------------------------------

def bench_spec(work: Path, settings: KafkaSettings, source: Input, label: str, *, kind: str = "kafka",
               commit: str = "atomic", url: str | None = None) -> PipelineSpec:
    """A pipeline over ``source`` with new output topics (or a new SQL table), in a spec file."""
    name = f"bench_{label}_{uuid.uuid4().hex[:6]}"
    # One run reads the whole input: no per-partition or per-run cap.
    raw = {"name": name, "source": {"topics": [source.topic], "max_records_per_partition": 10**12,
                                    "max_records_per_run": 10**12}}
    if kind == "kafka":
        create_topics(settings, {f"{name}.out": PARTITIONS, f"{name}.dlq": 1})
        raw.update(transform=ORDERS_TRANSFORM,
                   sink={"kind": "kafka", "topic": f"{name}.out", "dlq_topic": f"{name}.dlq", "commit": commit})
    elif kind == "sql_rows":
        raw.update(transform=ROWS_TRANSFORM,
                   sink={"kind": "sql", "table": name, "key_columns": ["topic", "partition", "offset"], "url": url})
    elif kind == "iceberg_rows":  # a catalog in SQLite, its warehouse a folder of the bench's
        raw.update(transform=ROWS_TRANSFORM,
                   sink={"kind": "iceberg", "table": f"bench.{name}", "url": f"sqlite:///{work / 'iceberg.db'}",
                         "warehouse": (work / "warehouse").as_uri()})
    else:
        raw.update(transform=REVENUE_TRANSFORM,
                   sink={"kind": "sql", "table": name, "key_columns": ["minute", "category"], "merge": "add",
                         "url": url})
    path = work / f"{name}.yaml"
    spec = parse_spec(raw, str(path))
    path.write_text(json.dumps(spec_document(spec)))
    return spec


def _plan_file(work: Path, plan) -> Path:
    path = work / f"{plan.pipeline}.{uuid.uuid4().hex[:6]}.plan.json"
    path.write_text(plan.to_json())
    return path


def run_baseline(work: Path, settings: KafkaSettings, source: Input, remote: str | None = None,
                 label: str | None = None, noop: bool = False, lz4: bool = False) -> dict:
    """Plain Spark: the orders transform over the whole topic, Spark's own Kafka sink (through the
    Spark Connect server ``remote``, if given: the app as a plain Python process, in a session of
    its own unless ``remote`` names one). With ``noop``, the floor: the same rows written nowhere
    (Spark's ``noop`` format), counted. With ``lz4``, Spark's sink with kafka-eos's producer
    settings (compressed, larger batches): what a JVM writer would cost, transactions aside."""
    from kafka_eos.pipeline import compute_plan

    spec = bench_spec(work, settings, source, "floor" if noop else "lz4" if lz4 else "baseline")
    plan, _drift = compute_plan(spec, settings, "bench")
    app, args = Path(__file__).with_name("baseline_app.py"), ["--spec", spec.path, "--plan", str(_plan_file(work, plan))]
    args += (["--noop"] if noop else []) + (["--lz4"] if lz4 else [])
    argv = [sys.executable, str(app), *args, "--spark-remote", remote] if remote else spark_submit(app, args)
    m = run_measured(argv, spark_env(settings, work), work / f"{spec.name}.log")
    if m.returncode != 0:
        raise RuntimeError(f"baseline run failed (exit {m.returncode}): see {work / spec.name}.log")
    name = label or ("baseline_connect" if remote else "baseline")
    if noop:
        summary = next(json.loads(line.split(" ", 1)[1]) for line in m.stdout.splitlines()
                       if line.startswith("BASELINE_SUMMARY "))
        what = ("the floor: Spark's read of the same ranges and the same transform, the rows written nowhere "
                "(format noop)" + ("" if not remote else ", through the Spark Connect server, its runs in one session"
                                   if label == "floor_connect" else ", through the Spark Connect server, a session each"))
        row = _row(name, what, source, m, summary["rows"], 0)
        if summary["rows"] != source.records:
            row["anomalies"] = [f"computed {summary['rows']} rows for {source.records} committed inputs"]
        return row
    out, dead = count_committed(settings, spec.sink.topic), count_committed(settings, spec.sink.dlq_topic)
    what = ("Spark's Kafka sink (at-least-once)" + (" with kafka-eos's producer settings (lz4, 20 ms linger, 1 MB "
                                                   "batches)" if lz4 else "")
            + (", through the Spark Connect server" if remote else ""))
    if label == "baseline_connect_session":
        what += ", its runs in one session (as kafka-eos's; x base: against a session each)"
    row = _row(name, what, source, m, out, dead)
    if out + dead < source.records:
        row["anomalies"] = [f"wrote {out} results and {dead} dead letters for {source.records} committed inputs"]
    return row


def run_jdbc_baseline(work: Path, settings: KafkaSettings, source: Input, url: str, like: str) -> dict:
    """Plain Spark: the rows transform over the whole topic, written with Spark's own JDBC writer
    (append: at-least-once) into a new table of the same definition as ``like`` (kafka-eos's:
    columns, types, primary key), dead letters into a table of their own."""
    from sqlalchemy import create_engine, text

    spec = bench_spec(work, settings, source, "baseline_jdbc", kind="sql_rows", url=url)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE TABLE "{spec.sink.table}" (LIKE "{like}" INCLUDING ALL)'))
    engine.dispose()
    driver = sorted(jars_dir("jdbc").glob("*.jar"))
    if not driver:
        raise RuntimeError(f"no PostgreSQL JDBC driver in {jars_dir('jdbc')}: make bench resolves it")
    m = _run_baseline_app(work, settings, spec, ["--table", spec.sink.table], driver, "JDBC")
    out, dead = table_rows(url, spec.sink.table, f"{spec.sink.table}_dead")
    return _rows_row("baseline_jdbc", "Spark's JDBC writer into PostgreSQL (append, at-least-once), a row per order",
                     source, m, out, dead)


def _run_baseline_app(work: Path, settings: KafkaSettings, spec: PipelineSpec, args: list[str],
                      jars: list[Path] | None, what: str) -> Measured:
    """baseline_app.py over ``spec``'s whole plan, by spark-submit."""
    from kafka_eos.pipeline import compute_plan

    plan, _drift = compute_plan(spec, settings, "bench")
    app = Path(__file__).with_name("baseline_app.py")
    m = run_measured(spark_submit(app, ["--spec", spec.path, "--plan", str(_plan_file(work, plan)), *args],
                                  jars or ()),
                     spark_env(settings, work), work / f"{spec.name}.log")
    if m.returncode != 0:
        raise RuntimeError(f"{what} baseline run failed (exit {m.returncode}): see {work / spec.name}.log")
    return m


def _rows_row(name: str, what: str, source: Input, m: Measured, out: int, dead: int) -> dict:
    """A baseline's row of a row-per-order transform, with its anomalies (rows or dead letters off)."""
    row = _row(name, what, source, m, out, dead)
    if (out, dead) != (source.valid, source.malformed):
        row["anomalies"] = [f"wrote {out} rows and {dead} dead letters for {source.valid} valid and "
                            f"{source.malformed} malformed inputs"]
    return row


def run_parquet_baseline(work: Path, settings: KafkaSettings, source: Input) -> dict:
    """Plain Spark: the rows transform over the whole topic, written with Spark's own
    ``df.write.parquet`` (append, into a folder: at-least-once, no table, no offsets) — the floor
    the Iceberg sink is measured against."""
    import pyarrow.parquet as pq

    spec = bench_spec(work, settings, source, "baseline_parquet", kind="iceberg_rows")
    folder = work / f"{spec.name}.parquet"
    m = _run_baseline_app(work, settings, spec, ["--parquet", str(folder)], None, "Parquet")
    out, dead = (sum(pq.read_metadata(f).num_rows for f in Path(d).glob("*.parquet"))
                 for d in (folder, f"{folder}_dead"))
    return _rows_row("baseline_parquet", "Spark's df.write.parquet into a folder (append, at-least-once), a row per "
                     "order", source, m, out, dead)


def iceberg_rows(spec: PipelineSpec) -> int:
    """The rows of an Iceberg bench run's table (its current snapshot's count, read by PyIceberg)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from kafka_eos.sinks.iceberg_store import identifier

    table = SqlCatalog(spec.sink.catalog, uri=spec.sink.url, warehouse=spec.sink.warehouse).load_table(
        identifier(spec.sink.table))
    return int(table.current_snapshot().summary["total-records"])


def table_rows(url: str, *tables: str) -> list[int]:
    """How many rows each of ``tables`` holds (a SQL bench run's results and dead letters)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [conn.execute(text(f'SELECT count(*) FROM "{t}"')).scalar() for t in tables]
    finally:
        engine.dispose()


def run_kafka_eos(work: Path, settings: KafkaSettings, source: Input, kind: str, commit: str = "atomic",
                  url: str | None = None, label: str | None = None, remote: str | None = None,
                  python_writer: bool = False) -> dict:
    """kafka-eos on the whole topic: the plan stored (as the DAG's plan task does), then a
    spark-submit of the Spark task's entry point, or, given the Spark Connect server ``remote``,
    ``kafka-eos run --spark-remote`` on the stored plan; the output checked against the input.
    (Through Connect the memory columns are the client's: the server is not in its process tree.)

    Through Connect, a row's runs share one session of the server, named in ``remote``, as a deployed
    pipeline's runs share its session (:func:`kafka_eos.spark_io.connect_session`); each run is a new
    pipeline here (new outputs, new checkpoints), which would otherwise take a session of its own.

    ``python_writer``: the Python writer (``KAFKA_EOS_WRITER=python``), not the JVM writer
    (:mod:`kafka_eos.sinks.jvm_writer`): per_partition's commit job through the Python commit task (Arrow
    to Spark's Python workers, confluent-kafka), atomic's transaction through the driver's Python producer."""
    from kafka_eos.pipeline import prepare_plan
    from kafka_eos.sinks.jvm_writer import WRITER_ENV

    spec = bench_spec(work, settings, source, label or commit, kind=kind, commit=commit, url=url)
    plan = prepare_plan(spec, settings, "bench")
    if remote:
        # -v: the run's log on stderr (the bench's log file), where per_partition says its passes
        m = run_measured(_kafka_eos("run", spec.path, "--run-id", "bench", "--bootstrap", settings.bootstrap_servers,
                                    "--spark-remote", remote, "--json", "-v"),
                         {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, work / f"{spec.name}.log")
        summary = json.loads(m.stdout) if m.returncode == 0 else None
    else:
        m = run_measured(spark_submit(PROJECT_ROOT / "spark_apps" / "run_pipeline.py",
                                      ["--spec", spec.path, "--plan", str(_plan_file(work, plan))]),
                         {**spark_env(settings, work), **({WRITER_ENV: "python"} if python_writer else {})},
                         work / f"{spec.name}.log")
        summary = next((json.loads(line.split(" ", 1)[1]) for line in m.stdout.splitlines()
                        if line.startswith("KAFKA_EOS_SUMMARY ")), None)
    if m.returncode != 0 or summary is None:
        raise RuntimeError(f"kafka-eos run {spec.name} failed (exit {m.returncode}): see {work / spec.name}.log")
    if kind == "kafka":
        out, dead = count_committed(settings, spec.sink.topic), count_committed(settings, spec.sink.dlq_topic)
    else:
        out, dead = summary["records_out"], summary["dead_letters"]
    python = (", the Python commit task" if commit == "per_partition" else ", the driver's Python producer") \
        if python_writer else ""
    what = (f"kafka-eos, Kafka sink ({commit}{python})" if kind == "kafka"
            else "kafka-eos, SQL sink into PostgreSQL, a row per order (x base: Spark's JDBC writer)"
            if kind == "sql_rows"
            else "kafka-eos, Iceberg sink (SQLite catalog, a row per order; x base: Spark's df.write.parquet)"
            if kind == "iceberg_rows"
            else "kafka-eos, SQL sink (revenue_per_minute: another transform; x base is indicative)")
    what += ", through the Spark Connect server" if remote else ""
    if remote:  # like with like: x base against Spark's sink in a session each, or in one session too
        what += ", a session each run" if (label or "").endswith("_fresh") else ", its runs in one session"
    if remote and commit == "per_partition":  # one pass where the server's plugin proved the layout
        log_text = (work / f"{spec.name}.log").read_text(errors="replace")
        what += ", one pass" if "per_partition in one pass" in log_text else ", two passes"
    row = _row(label or commit, what, source, m, out, dead)
    row["summary_in"] = summary["records_in"]
    row["spec"] = spec.path
    row["anomalies"] = _anomalies(row, source, kind, summary)
    if kind == "sql_rows":
        row["table"] = spec.sink.table
        if (written := table_rows(url, spec.sink.table)[0]) != source.valid:
            row["anomalies"].append(f"{written} rows in the table for {source.valid} valid inputs")
    if kind == "iceberg_rows" and (written := iceberg_rows(spec)) != source.valid:
        row["anomalies"].append(f"{written} rows in the Iceberg table for {source.valid} valid inputs")
    return row


def _anomalies(row: dict, source: Input, kind: str, summary: dict) -> list[str]:
    """What an exactly-once run got wrong (nothing, when it is right)."""
    found = []
    if summary["records_in"] != source.records:
        found.append(f"read {summary['records_in']} committed input records, the topic has {source.records}")
    if kind in ("kafka", "sql_rows", "iceberg_rows") and row["records_out"] != source.valid:
        found.append(f"{row['records_out']} output records for {source.valid} valid inputs")
    if row["dead_letters"] != source.malformed:
        found.append(f"{row['dead_letters']} dead letters for {source.malformed} malformed inputs")
    return found


def median_run(tries: list[dict]) -> dict:
    """The median of a row's runs by seconds (of an even number, the slower of the middle two), with
    every run's seconds and every run's anomalies."""
    median = dict(sorted(tries, key=lambda r: r["seconds"])[len(tries) // 2])
    median["all_seconds"] = [r["seconds"] for r in tries]
    median["anomalies"] = [a for r in tries for a in r.get("anomalies", [])]
    return median


def _row(name: str, what: str, source: Input, m: Measured, out: int, dead: int) -> dict:
    return {"name": name, "what": what, "records_in": source.records, "records_out": out, "dead_letters": dead,
            "seconds": m.seconds, "records_per_s": round(source.records / m.seconds),
            "mb_per_s": round(source.value_bytes / m.seconds / 1e6, 2), "peak_mib": m.peak_mib, "cpu_s": m.cpu_s}


# -- the broker's ceiling ----------------------------------------------------------------------

def _kafka_tool(main_class: str, args: list[str], log: Path) -> str:
    argv = ["java", "-Xmx1g", "-cp", str(jars_dir("kafka") / "*"), main_class, *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise RuntimeError(f"{main_class} failed (exit {res.returncode}): see {log}")
    return res.stdout


def run_ceiling(work: Path, settings: KafkaSettings, source: Input) -> list[dict]:
    """Kafka's own perf tools on the same broker: a transactional producer of records the size
    of the input's, and a read_committed consumer of the input topic itself."""
    topic = f"bench.ceiling.{uuid.uuid4().hex[:6]}"
    create_topics(settings, {topic: PARTITIONS})
    size = round(source.mean_value_bytes)
    out = _kafka_tool("org.apache.kafka.tools.ProducerPerformance", [
        "--topic", topic, "--num-records", str(source.records), "--record-size", str(size), "--throughput", "-1",
        "--transactional-id", f"kafka-eos.bench.ceiling.{topic}", "--transaction-duration-ms", "1000",
        "--producer-props", f"bootstrap.servers={settings.bootstrap_servers}", "acks=all", "linger.ms=20",
        "compression.type=lz4"], work / "producer-performance.log")
    # "300000 records sent, 181818.2 records/sec (34.68 MB/sec), 12.3 ms avg latency, ..."
    last = [line for line in out.splitlines() if "records sent" in line][-1]
    produce_rps = float(last.split(" records/sec")[0].split(", ")[-1])
    props = work / "consumer.properties"
    props.write_text("isolation.level=read_committed\nauto.offset.reset=earliest\n")
    out = _kafka_tool("org.apache.kafka.tools.ConsumerPerformance", [
        "--bootstrap-server", settings.bootstrap_servers, "--topic", source.topic,
        "--messages", str(source.records), "--consumer.config", str(props), "--timeout", "60000",
        "--group", f"kafka-eos.bench.ceiling.{uuid.uuid4().hex[:6]}"], work / "consumer-performance.log")
    # CSV: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    # rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    fields = [line for line in out.splitlines() if line.strip() and line[0].isdigit()][-1].split(", ")
    consumed, fetch_mbps, consume_rps = int(fields[4]), float(fields[8]), float(fields[9])
    if consumed < source.records:
        raise RuntimeError(f"ConsumerPerformance read {consumed} of {source.records} committed records of {source.topic}")
    return [
        {"name": "ceiling_produce", "what": f"ProducerPerformance, transactional, {size}-byte records",
         "records_in": source.records, "records_per_s": round(produce_rps),
         "mb_per_s": round(produce_rps * size / 1e6, 2)},
        {"name": "ceiling_consume", "what": "ConsumerPerformance, read_committed, the input topic",
         "records_in": consumed, "records_per_s": round(consume_rps), "mb_per_s": round(fetch_mbps * 2**20 / 1e6, 2)},
    ]


# -- fixed costs and the planner ---------------------------------------------------------------

def _kafka_eos(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "kafka-eos"), *args]


def run_cli(work: Path, settings: KafkaSettings, spec: PipelineSpec, label: str, remote: str | None = None) -> dict:
    """One whole ``kafka-eos run`` process (through the Spark Connect server ``remote``, if given)."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    m = run_measured(_kafka_eos("run", spec.path, "--bootstrap", settings.bootstrap_servers,
                                *(["--spark-remote", remote] if remote else [])), env,
                     work / f"{spec.name}.{label}.log")
    if m.returncode != 0:
        raise RuntimeError(f"kafka-eos run {spec.path} failed (exit {m.returncode}): see {work / spec.name}.{label}.log")
    return {"name": label, "what": "kafka-eos run (whole process)", "seconds": m.seconds, "peak_mib": m.peak_mib,
            "output": m.stdout.strip().splitlines()[-1:]}


def run_dags(work: Path, settings: KafkaSettings, specs: dict[str, PipelineSpec],
             remote: str | None = None) -> list[dict]:
    """An Airflow DAG run (``airflow dags test``: plan, Spark and verify tasks, spark-submit
    included) of each spec, in an Airflow home of the bench's own; given the Spark Connect server
    ``remote``, the Spark connection is of type ``spark_connect`` and the Spark task runs through it."""
    from kafka_eos.demo import airflow_env
    from kafka_eos.local.airflow import write_specs_dag_file

    home = work / f"airflow-{uuid.uuid4().hex[:6]}"
    for folder in ("specs", "dags"):
        (home / folder).mkdir(parents=True)
    for spec in specs.values():
        shutil.copy(spec.path, home / "specs" / Path(spec.path).name)
    write_specs_dag_file(home / "dags", home / "specs")
    env = {**airflow_env(settings), "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}
    if remote:
        from kafka_eos.local.airflow import connections_environ

        env["AIRFLOW_CONN_SPARK_DEFAULT"] = connections_environ(settings, spark_remote=remote)["AIRFLOW_CONN_SPARK_DEFAULT"]
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
    rows = []
    for label, spec in specs.items():
        m = run_measured([airflow, "dags", "test", f"kafka_eos__{spec.name}"], env, work / f"{spec.name}.dag.log")
        if m.returncode != 0:
            raise RuntimeError(f"DAG run of {spec.name} failed (exit {m.returncode}): see {work / spec.name}.dag.log")
        rows.append({"name": label, "what": "Airflow DAG run (airflow dags test)", "seconds": m.seconds})
    return rows


def run_planner(work: Path, settings: KafkaSettings) -> list[dict]:
    """Planning a pipeline whose source topic has PLANNER_PARTITIONS partitions: the first plan
    (no checkpoints), a plan over committed checkpoints (stored, as a run's plan task does), and
    ``kafka-eos plan`` as a whole process."""
    from kafka_eos.kafka_admin import alter_group_offsets
    from kafka_eos.pipeline import compute_plan, prepare_plan

    topic = f"bench.planner.{uuid.uuid4().hex[:6]}"
    create_topics(settings, {topic: PLANNER_PARTITIONS})
    producer = Producer(settings.client_config(**{"transactional.id": f"kafka-eos.bench.{topic}"}))
    producer.init_transactions(60)
    producer.begin_transaction()
    for p in range(PLANNER_PARTITIONS):
        for i in range(3):
            producer.produce(topic, value=b"x" * 10, partition=p)
    producer.commit_transaction(120)
    name = f"bench_planner_{uuid.uuid4().hex[:6]}"
    create_topics(settings, {f"{name}.out": PARTITIONS})
    path = work / f"{name}.yaml"
    spec = parse_spec({"name": name, "source": {"topics": [topic]}, "transform": "identity",
                       "sink": {"kind": "kafka", "topic": f"{name}.out"}}, str(path))
    path.write_text(json.dumps(spec_document(spec)))
    started = time.monotonic()
    first, _drift = compute_plan(spec, settings, "bench-first")
    first_s = time.monotonic() - started
    alter_group_offsets(settings, spec.source.group_id, {(topic, p): 1 for p in range(PLANNER_PARTITIONS)})
    started = time.monotonic()
    stored = prepare_plan(spec, settings, "bench-stored")
    stored_s = time.monotonic() - started
    if len(first.active) != PLANNER_PARTITIONS or sum(1 for r in stored.active if not r.empty) != PLANNER_PARTITIONS:
        raise RuntimeError(f"planner: {len(first.active)} and {len(stored.active)} ranges for {PLANNER_PARTITIONS} partitions")
    m = run_measured(_kafka_eos("plan", spec.path, "--bootstrap", settings.bootstrap_servers, "--json"), dict(os.environ),
                     work / f"{name}.plan.log")
    if m.returncode != 0:
        raise RuntimeError(f"kafka-eos plan {spec.path} failed: see {work / name}.plan.log")
    return [
        {"name": "plan_1000_first", "what": f"first plan, {PLANNER_PARTITIONS} partitions (in-process)",
         "seconds": round(first_s, 3)},
        {"name": "plan_1000_s", "what": f"plan over {PLANNER_PARTITIONS} checkpoints, stored (in-process)",
         "seconds": round(stored_s, 3)},
        {"name": "plan_1000_cli", "what": f"kafka-eos plan --json, {PLANNER_PARTITIONS} partitions (whole process)",
         "seconds": m.seconds},
    ]


# -- the report --------------------------------------------------------------------------------

def _baseline_of(name: str) -> str:
    """The row a throughput row ``name`` is compared with. Through Spark Connect, Spark's own sink
    through the same server (neither pays a JVM start), like with like: runs in one session against
    Spark's in one session too, a session each against a session each (and Spark's one-session row
    against its own each)."""
    return ("baseline_connect_session" if name.endswith("_connect") and name != "baseline_connect"
            else "baseline_connect" if "_connect" in name
            else "baseline_jdbc" if name == "sql_rows" else "baseline_parquet" if name == "iceberg" else "baseline")


def _ratios(rows: list[dict]) -> None:
    """``x_baseline`` and ``x_ceiling`` of every throughput row, against the baseline of the same
    input size and the slower of the two ceilings."""
    ceiling = min((r["records_per_s"] for r in rows if r["name"].startswith("ceiling")), default=None)
    for r in rows:
        if "size" not in r:
            continue
        base = next((b for b in rows if b["name"] == _baseline_of(r["name"]) and b.get("size") == r["size"]), None)
        r["x_baseline"] = round(r["records_per_s"] / base["records_per_s"], 2) if base else None
        # Each turn's ratio (the compared rows take their runs in turns: run i of each, one after another).
        if base and r is not base and len(r.get("all_seconds", ())) == len(base.get("all_seconds", ())) > 1:
            r["x_turns"] = [round(b / s, 2) for b, s in zip(base["all_seconds"], r["all_seconds"])]
        r["x_ceiling"] = round(r["records_per_s"] / ceiling, 3) if ceiling else None


def print_table(rows: list[dict]) -> None:
    print(f"\n{'run':<16} {'size':>4} {'records':>9} {'s':>7} {'rec/s':>8} {'MB/s':>6} {'x base':>6} {'x ceil':>6} "
          f"{'JVM MiB':>7} {'drv Py':>6} {'workers':>7}  what")
    for r in rows:
        if "records_per_s" not in r:
            continue
        mib = r.get("peak_mib", {})
        print(f"{r['name']:<16} {str(r.get('size', '')):>4} {r['records_in']:>9} {r.get('seconds', ''):>7} "
              f"{r['records_per_s']:>8} {r['mb_per_s']:>6} {r.get('x_baseline') or '':>6} {r.get('x_ceiling') or '':>6} "
              f"{mib.get('driver_jvm', ''):>7} {mib.get('driver_python', ''):>6} {mib.get('python_workers', ''):>7}  "
              f"{r['what']}")
    print_cpu(rows)
    print(f"\n{'fixed cost / planner':<20} {'s':>7}  what")
    for r in rows:
        if "records_per_s" not in r:
            print(f"{r['name']:<20} {r['seconds']:>7}  {r['what']}")


#: The parts of a run whose CPU seconds are shown, in the order shown.
CPU_PARTS = (("driver_jvm", "JVM"), (JIT_PART, "its JIT"), ("driver_python", "drv Py"),
             ("python_workers", "workers"), ("broker", "broker"), ("connect_server", "server"),
             ("connect_server_workers", "srv Py"))


def print_cpu(rows: list[dict]) -> None:
    """Where each throughput row's time went: CPU seconds of the run's JVM (in local mode the
    executors too; of them, its JIT compiler threads'), its driver Python, its Python workers, and
    of the broker and the Connect server (its JVM, its Python workers) while it ran; and the cores
    all of them kept busy (the machine has 2; the JIT's seconds are in the JVM's, counted once).
    Through Connect the run's own parts are the client's."""
    print(f"\n{'CPU seconds':<16} {'size':>4} {'s':>7} " + " ".join(f"{label:>7}" for _, label in CPU_PARTS)
          + f" {'total':>7} {'cores':>5}")
    for r in rows:
        cpu = r.get("cpu_s")
        if "records_per_s" not in r or not cpu:
            continue
        total = sum(v for part, v in cpu.items() if part != JIT_PART)
        print(f"{r['name']:<16} {str(r.get('size', '')):>4} {r['seconds']:>7} "
              + " ".join(f"{cpu.get(part, ''):>7}" for part, _ in CPU_PARTS)
              + f" {round(total, 1):>7} {round(total / r['seconds'], 2):>5}")


def _floor_note(row: dict, rows: list[dict]) -> str:
    """What the floor of ``row``'s kind (the same read and transform, written nowhere) says: the most
    any sink reading through Spark could be ahead of Spark's own, and the seconds ``row``'s writing
    took beyond the floor against those of Spark's sink (medians)."""
    kind = "floor_connect_fresh" if row["name"].endswith("_connect_fresh") else \
        "floor_connect" if row["name"].endswith("_connect") else "floor"
    floor = next((r for r in rows if r["name"] == kind and r.get("size") == row["size"]), None)
    base = next((r for r in rows if r["name"] == _baseline_of(kind) and r.get("size") == row["size"]), None)
    if not floor or not base or not floor.get("x_baseline"):
        return ""
    return (f"; the floor (the same read and transform, written nowhere) is {floor['x_baseline']}x, so the "
            f"writing took {round(row['seconds'] - floor['seconds'], 2)} s beyond it against Spark's sink's "
            f"{round(base['seconds'] - floor['seconds'], 2)} s")


def verdicts(rows: list[dict]) -> list[str]:
    """One line per target: the figure, the target, met or not."""
    def find(name, size=None):
        return next((r for r in rows if r["name"] == name and (size is None or r.get("size") == size)), None)

    lines = []
    largest = max((r["size"] for r in rows if "size" in r), default=1)
    for scope in ("per_partition", "atomic"):
        for r in (r for r in rows if r["name"] in (scope, f"{scope}_connect", f"{scope}_connect_fresh")):
            target = SCOPE_TARGETS["largest" if r["size"] == largest and largest > 1 else "smallest"]
            ok = r["x_baseline"] is not None and r["x_baseline"] >= target
            spread = f" (runs {min(r['all_seconds'])}-{max(r['all_seconds'])} s" if r.get("all_seconds") else ""
            if spread and r.get("x_turns"):
                spread += f"; turn by turn {' / '.join(f'{x}x' for x in r['x_turns'])}"
            spread += ")" if spread else ""
            lines.append(f"{r['name']} at {r['size']}x: {r['x_baseline']}x the at-least-once baseline, medians{spread} "
                         f"(target >= {target}x): {'met' if ok else 'NOT met'}{_floor_note(r, rows)}")
    for r in (r for r in rows if r["name"] in ("spark_sink_lz4", "spark_sink_lz4_connect_fresh")):
        lines.append(f"{r['name']} at {r['size']}x: {r['x_baseline']}x the baseline — Spark's sink with kafka-eos's "
                     f"producer settings: its producer's work, transactions aside (no target){_floor_note(r, rows)}")
    for r in (r for r in rows if r["name"] == "per_partition_python"):
        lines.append(f"per_partition_python at {r['size']}x: {r['x_baseline']}x the baseline — per_partition through "
                     f"its Python commit task (a stream's, KAFKA_EOS_WRITER=python; no target){_floor_note(r, rows)}")
    for r in (r for r in rows if r["name"] == "atomic_python"):
        lines.append(f"atomic_python at {r['size']}x: {r['x_baseline']}x the baseline — atomic through the driver's "
                     f"Python producer (a stream's, KAFKA_EOS_WRITER=python; no target){_floor_note(r, rows)}")
    for r in (r for r in rows if r["name"] == "sql_rows"):
        ok = r["x_baseline"] is not None and r["x_baseline"] >= TARGETS["sql_rows"]
        lines.append(f"SQL sink at {r['size']}x: {r['x_baseline']}x Spark's JDBC writer (target >= "
                     f"{TARGETS['sql_rows']}x): {'met' if ok else 'NOT met'}")
    for r in (r for r in rows if r["name"] == "iceberg"):
        lines.append(f"Iceberg sink at {r['size']}x: {r['x_baseline']}x Spark's df.write.parquet into a folder (the "
                     f"at-least-once floor; no target), driver Python peak {r['peak_mib'].get('driver_python')} MiB")
    sizes = sorted({r["size"] for r in rows if r["name"] == "iceberg"})
    if len(sizes) > 1:
        a, b = (find("iceberg", z)["peak_mib"].get("driver_python") for z in (sizes[0], sizes[-1]))
        if a and b:
            lines.append(f"Iceberg sink driver_python peak RSS {a} MiB at {sizes[0]}x, {b} MiB at {sizes[-1]}x "
                         f"(target: flat): {'met' if b <= a * 1.25 else 'NOT met'}")
    sizes = sorted({r["size"] for r in rows if r["name"] == "sql_rows"})
    if len(sizes) > 1:
        small, large = (next(r for r in rows if r["name"] == "sql_rows" and r["size"] == z) for z in (sizes[0], sizes[-1]))
        a, b = small["peak_mib"].get("driver_python"), large["peak_mib"].get("driver_python")
        if a and b:
            lines.append(f"SQL sink driver_python peak RSS {a} MiB at {sizes[0]}x, {b} MiB at {sizes[-1]}x "
                         f"(target: flat): {'met' if b <= a * 1.25 else 'NOT met'}")
    sizes = sorted({r["size"] for r in rows if r["name"] == "atomic"})
    if len(sizes) > 1:
        small, large = find("atomic", sizes[0]), find("atomic", sizes[-1])
        for part in ("driver_python", "driver_jvm"):
            a, b = small["peak_mib"].get(part), large["peak_mib"].get(part)
            if a and b:
                ok = b <= a * 1.25
                lines.append(f"atomic {part} peak RSS {a} MiB at {sizes[0]}x, {b} MiB at {sizes[-1]}x "
                             f"(target: flat): {'met' if ok else 'NOT met'}")
    avro = find("avro")
    if avro and avro.get("x_json") is not None:
        ok = avro["x_json"] >= TARGETS["avro_x_json"]
        lines.append(f"Avro pipeline: {avro['x_json']}x the same transform on JSON (target >= "
                     f"{TARGETS['avro_x_json']}x): {'met' if ok else 'NOT met'}")
    for name in ("plan_1000_s", "empty_run_s", "few_run_connect_s", "few_dag_connect_s"):
        r = find(name)
        if r:
            ok = r["seconds"] <= TARGETS[name]
            lines.append(f"{r['what']}: {r['seconds']} s (target <= {TARGETS[name]:g} s): {'met' if ok else 'NOT met'}")
    return lines


def chart(rows: list[dict], path: Path) -> None:
    """Records/s of every Spark run beside the baseline of its size; fixed costs beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in rows if "size" in r]
    fixed = [r for r in rows if "records_per_s" not in r]
    if fixed:
        fig, (left, right) = plt.subplots(1, 2, figsize=(max(13, 0.45 * len(runs) + 6), 6),
                                          gridspec_kw={"width_ratios": [3, 2]})
    else:
        fig, left = plt.subplots(1, 1, figsize=(max(10, 0.45 * len(runs)), 6))
    labels = [("floor, 1 session" if r["name"] == "floor_connect" else
               r["name"].replace("_connect_session", ", 1 session").replace("_connect_fresh", ", fresh").removesuffix("_connect"))
              + f"\n{r['size']}x" + ("\nConnect" if "_connect" in r["name"] else "") for r in runs]
    colors = ["#888888" if r["name"].startswith("baseline") else "#cccccc" if r["name"].startswith("floor")
              else "#2a6fbb" if r["name"] in ("atomic", "per_partition")
              else "#7a4fbf" if r["name"].endswith("_connect") else "#3a9a5b" for r in runs]
    bars = left.bar(labels, [r["records_per_s"] for r in runs], color=colors)
    for bar, r in zip(bars, runs):
        if r.get("x_baseline"):
            left.annotate(f"{r['x_baseline']}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                          ha="center", va="bottom", fontsize=8)
    ceilings = {r["name"]: r["records_per_s"] for r in rows if r["name"].startswith("ceiling")}
    left.set_title("records/s, whole processes (spark-submit, or through a Spark Connect server; local[2])"
                   + ("; ceiling: " + ", ".join(f"{k.split('_')[1]} {v:,}/s" for k, v in ceilings.items())
                      if ceilings else ""), fontsize=9)
    left.tick_params(axis="x", labelsize=7, labelrotation=90)
    left.set_ylabel("committed input records / s")
    if fixed:
        right.barh([r["name"] for r in fixed], [r["seconds"] for r in fixed], color="#c07a2a")
        right.set_xlabel("seconds")
        right.set_title("fixed costs and planning", fontsize=9)
        right.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _connect_server(work: Path):
    """The bench's own Spark Connect server (local[2], as the spark-submit runs), on a free port."""
    import socket

    from kafka_eos.local.spark_connect import LocalSparkConnect

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = LocalSparkConnect(work / "spark-connect", port=port, master=MASTER)
    started = time.monotonic()
    print(f"  starting a Spark Connect server on {server.url} ...", end="", flush=True)
    server.start()
    print(f" {time.monotonic() - started:.0f} s", flush=True)
    return server


def _measure(args, skip: set, settings: KafkaSettings, work: Path, rows: list[dict], inputs: dict,
             connect) -> None:
    """Every part of the bench not skipped, its rows appended to ``rows``."""
    remote = connect.url if connect is not None else None

    def step(what: str, fn, *a, **kw):
        started = time.monotonic()
        print(f"  {what} ...", end="", flush=True)
        result = fn(*a, **kw)
        print(f" {time.monotonic() - started:.0f} s", flush=True)
        return result

    def median_of(n: int, runs: list[tuple[str, Callable[[], dict]]]) -> list[dict]:
        """Of each run, the median of ``n`` tries (each on new output topics), with every try's
        seconds and every try's anomalies. The runs compared with each other take their tries in
        turns (A B A B, not A A B B): a machine that slows down over minutes slows them alike."""
        tries: dict[str, list[dict]] = {what: [] for what, _fn in runs}
        for i in range(n):
            for what, fn in runs:
                tries[what].append(step(f"{what} ({i + 1}/{n})" if n > 1 else what, fn))
        return [median_run(tries[what]) for what, _fn in runs]

    print(f"orders (~{len(NOTE) + 150}-byte JSON), {PARTITIONS} partitions, transactions of {PER_TRANSACTION} with every "
          f"{ABORT_EVERY}rd aborted, every {MALFORMED_EVERY}th record malformed; Spark {MASTER}; logs in {work}")
    postgres = None
    if "postgres" not in skip:
        from kafka_eos.local.postgres import LocalPostgres

        postgres = LocalPostgres()
    try:
        pg_url = postgres.start() if postgres else None
        _sizes(args, skip, settings, work, rows, inputs, remote, pg_url, step, median_of)
    finally:
        if postgres:
            postgres.stop()
    _fixed(skip, settings, work, rows, inputs, remote, step)
    if "planner" not in skip:
        rows += step(f"planner, {PLANNER_PARTITIONS} partitions", run_planner, work, settings)
    if "avro" not in skip:
        rows += step(f"Avro and JSON, the same transform ({args.records} records each)", run_formats, work, settings,
                     args.records, args.repeat)


def _sizes(args, skip: set, settings: KafkaSettings, work: Path, rows: list[dict], inputs: dict, remote, pg_url,
           step, median_of) -> None:
    """The throughput rows of every input size."""
    from kafka_eos.spark_io import with_session_id

    for size in (int(s) for s in args.sizes.split(",")):
        source = inputs[size] = step(f"generating {size}x ({args.records * size} committed records)", generate,
                                     settings, f"bench.orders.{size}x.{uuid.uuid4().hex[:6]}", args.records * size)
        if not rows and "ceiling" not in skip:
            rows += step("ceiling (Kafka's perf tools)", run_ceiling, work, settings, source)
        runs = []
        if "kafka" not in skip:
            runs += median_of(args.repeat, [(f"baseline {size}x", partial(run_baseline, work, settings, source))] + [
                (f"kafka-eos {commit} {size}x", partial(run_kafka_eos, work, settings, source, "kafka", commit))
                for commit in ("atomic", "per_partition")] + [
                (f"the floor {size}x (written nowhere)", partial(run_baseline, work, settings, source, noop=True,
                                                                 label="floor")),
                (f"Spark's sink, lz4 {size}x", partial(run_baseline, work, settings, source, lz4=True,
                                                       label="spark_sink_lz4")),
                (f"kafka-eos per_partition {size}x, the Python commit task",
                 partial(run_kafka_eos, work, settings, source, "kafka", "per_partition",
                         label="per_partition_python", python_writer=True)),
                (f"kafka-eos atomic {size}x, the driver's Python producer",
                 partial(run_kafka_eos, work, settings, source, "kafka", "atomic",
                         label="atomic_python", python_writer=True))])
        if remote:
            # Like with like: each side's runs of one row in one session of the server (as a
            # deployed pipeline's runs are), and each side in a session of its own every run (as
            # Spark's sink runs as a job is written; a bench run is a new pipeline each time).
            runs += median_of(args.repeat, [(f"baseline {size}x, Spark Connect",
                                           partial(run_baseline, work, settings, source, remote))] + [
                (f"kafka-eos {commit} {size}x, Spark Connect",
                 partial(run_kafka_eos, work, settings, source, "kafka", commit, label=f"{commit}_connect",
                         remote=with_session_id(remote, str(uuid.uuid4()))))
                for commit in ("atomic", "per_partition")] + [
                (f"the floor {size}x, Spark Connect, a session each", partial(
                    run_baseline, work, settings, source, remote, label="floor_connect_fresh", noop=True)),
                (f"Spark's sink, lz4 {size}x, Spark Connect, a session each", partial(
                    run_baseline, work, settings, source, remote, label="spark_sink_lz4_connect_fresh", lz4=True))] + [
                (f"baseline {size}x, Spark Connect, one session",
                 partial(run_baseline, work, settings, source, with_session_id(remote, str(uuid.uuid4())),
                         label="baseline_connect_session"))] + [
                (f"the floor {size}x, Spark Connect, one session", partial(
                    run_baseline, work, settings, source, with_session_id(remote, str(uuid.uuid4())),
                    label="floor_connect", noop=True))] + [
                (f"kafka-eos {commit} {size}x, Spark Connect, a session each",
                 partial(run_kafka_eos, work, settings, source, "kafka", commit, label=f"{commit}_connect_fresh",
                         remote=remote))
                for commit in ("atomic", "per_partition")])
        if pg_url:
            tables: list[str] = []  # the JDBC writer appends to a table defined as kafka-eos's first one

            def sql_rows() -> dict:
                row = run_kafka_eos(work, settings, source, "sql_rows", url=pg_url, label="sql_rows")
                tables.append(row["table"])
                return row

            sql_median, jdbc_median = median_of(args.repeat, [
                (f"kafka-eos SQL sink {size}x, a row per order, PostgreSQL", sql_rows),
                (f"Spark's JDBC writer {size}x, PostgreSQL", lambda: run_jdbc_baseline(work, settings, source, pg_url,
                                                                                        tables[0]))])
            runs += [jdbc_median, sql_median]  # the baseline's row first, as the Kafka sink's
        if "iceberg" not in skip:
            iceberg_median, parquet_median = median_of(args.repeat, [
                (f"kafka-eos Iceberg sink {size}x, a row per order", partial(
                    run_kafka_eos, work, settings, source, "iceberg_rows", label="iceberg")),
                (f"Spark's df.write.parquet {size}x", partial(run_parquet_baseline, work, settings, source))])
            runs += [parquet_median, iceberg_median]
        if size == 1 and "sql" not in skip:
            runs.append(step("kafka-eos SQL sink, SQLite", run_kafka_eos, work, settings, source, "sql",
                             url=f"sqlite:///{work / 'bench.db'}", label="sql_sqlite"))
            if pg_url:
                runs.append(step("kafka-eos SQL sink, PostgreSQL", run_kafka_eos, work, settings, source, "sql",
                                 url=pg_url, label="sql_postgres"))
        for r in runs:
            r["size"] = size
        rows += runs


def _fixed(skip: set, settings: KafkaSettings, work: Path, rows: list[dict], inputs: dict, remote, step) -> None:
    """The fixed costs: an empty run, a handful of records, Airflow DAG runs."""
    if "fixed" not in skip:
        from kafka_eos.spec import load_spec

        # The atomic pipeline of the first size has read everything: its next plan is empty.
        caught_up = load_spec(next(r["spec"] for r in rows if r["name"] == "atomic" and r["size"] == min(inputs)))
        empty = step("kafka-eos run, empty plan", run_cli, work, settings, caught_up, "empty_run_s")
        empty["what"] = "kafka-eos run, empty plan (whole process)"
        few = generate(settings, f"bench.few.{uuid.uuid4().hex[:6]}", 10)
        handful = step("kafka-eos run, 10 records", run_cli, work, settings, bench_spec(work, settings, few, "few"),
                       "few_run_s")
        handful["what"] = "kafka-eos run, 10 records (whole process)"
        rows += [empty, handful]
        if remote:
            # Twice: the first run through a fresh server pays its first query's set-up.
            for label in ("few_run_connect_first_s", "few_run_connect_s"):
                row = step(f"kafka-eos run, 10 records, Spark Connect ({label})", run_cli, work, settings,
                           bench_spec(work, settings, few, "fewc"), label, remote)
                row["what"] = "kafka-eos run, 10 records, through the Spark Connect server (whole process)" + \
                    (", the server's first run" if "first" in label else "")
                rows.append(row)
        if "airflow" not in skip:
            dag_rows = step("Airflow DAG runs", run_dags, work, settings,
                            {"empty_dag_s": caught_up, "few_dag_s": bench_spec(work, settings, few, "fewdag")})
            for r in dag_rows:
                r["what"] = ("Airflow DAG run, empty plan" if r["name"] == "empty_dag_s"
                             else "Airflow DAG run, 10 records") + " (airflow dags test)"
            rows += dag_rows
            if remote:
                dag_rows = step("Airflow DAG run, Spark Connect", run_dags, work, settings,
                                {"few_dag_connect_s": bench_spec(work, settings, few, "fewdagc")}, remote)
                dag_rows[0]["what"] = "Airflow DAG run, 10 records, Spark connection of type spark_connect " \
                                      "(airflow dags test)"
                rows += dag_rows


def run_formats(work: Path, settings: KafkaSettings, records: int, repeat: int) -> list[dict]:
    """The Avro example's transform on Avro orders (decoded and encoded through the embedded Schema
    Registry; half written with schema version 1, half with version 2) and on the same orders as
    JSON text (parsed and written by the transform), each a whole spark-submit, atomic scope."""
    import dataclasses

    from kafka_eos.local.registry import LocalRegistry
    from kafka_eos.settings import RegistrySettings

    registry = LocalRegistry.default()
    started = not registry.is_running()  # one already running (the Avro demo's) keeps running
    settings = dataclasses.replace(settings, schema_registry=RegistrySettings(registry.start()))
    try:
        return _run_formats(work, settings, records, repeat)
    finally:
        if started:
            registry.stop()


def _run_formats(work: Path, settings: KafkaSettings, records: int, repeat: int) -> list[dict]:
    """:func:`run_formats` with the registry running."""
    from kafka_eos.pipeline import prepare_plan
    from kafka_eos.sample_data import produce_avro_orders

    tag = uuid.uuid4().hex[:6]
    avro_topic, json_topic = f"bench.orders.avro.{tag}", f"bench.orders.json.{tag}"
    create_topics(settings, {avro_topic: PARTITIONS, json_topic: PARTITIONS})
    orders = produce_avro_orders(settings, avro_topic, records, evolve_at=records // 2, per_transaction=PER_TRANSACTION)
    producer = Producer(settings.client_config(**{"linger.ms": 20, "partitioner": "murmur2_random"}))
    json_bytes = 0
    for order in orders:
        value = json.dumps({**order, "ts": order["ts"].isoformat()}).encode()
        json_bytes += len(value)
        _produce(producer, json_topic, order["customer_id"].encode(), value)
    producer.flush(60)
    valid = sum(1 for o in orders if o["currency"] != "XXX")
    formats = (("avro", avro_topic, "enrich", "avro"), ("avro_json", json_topic, "enrich_json", None))
    tries: dict[str, list[dict]] = {label: [] for label, *_rest in formats}
    for _ in range(repeat):  # in turns, as the other compared rows
        for label, topic, transform, fmt in formats:
            name = f"bench_{label}_{uuid.uuid4().hex[:6]}"
            create_topics(settings, {f"{name}.out": PARTITIONS, f"{name}.dlq": 1})
            source = {"topics": [topic], "max_records_per_partition": 10**12, "max_records_per_run": 10**12}
            sink = {"kind": "kafka", "topic": f"{name}.out", "dlq_topic": f"{name}.dlq", "commit": "atomic"}
            if fmt:
                source.update(format=fmt, key_format="string")
                sink["format"] = fmt
            path = work / f"{name}.yaml"
            spec = parse_spec({"name": name, "source": source, "sink": sink,
                               "transform": f"spark_apps.transforms.orders_avro:{transform}"}, str(path))
            path.write_text(json.dumps(spec_document(spec)))
            plan = prepare_plan(spec, settings, "bench")
            m = run_measured(spark_submit(PROJECT_ROOT / "spark_apps" / "run_pipeline.py",
                                          ["--spec", spec.path, "--plan", str(_plan_file(work, plan))]),
                             spark_env(settings, work), work / f"{name}.log")
            if m.returncode != 0:
                raise RuntimeError(f"kafka-eos run {name} failed (exit {m.returncode}): see {work / name}.log")
            out, dead = count_committed(settings, spec.sink.topic), count_committed(settings, spec.sink.dlq_topic)
            # MB/s of both rows counts the JSON text's bytes: the same orders, one measure.
            source_input = Input(topic, records, valid, records - valid, 0, json_bytes)
            row = _row(label, "kafka-eos, the Avro example's transform on Avro (registry, schema evolved mid-topic)"
                       if fmt else "kafka-eos, the same transform on the same orders as JSON text", source_input,
                       m, out, dead)
            row["anomalies"] = [] if (out, dead) == (valid, records - valid) else [
                f"{out} results and {dead} dead letters for {valid} valid and {records - valid} invalid orders"]
            tries[label].append(row)
    rows = [median_run(tries[label]) for label, *_rest in formats]
    rows[0]["x_json"] = round(rows[0]["records_per_s"] / rows[1]["records_per_s"], 2)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS, help="committed input records at 1x")
    parser.add_argument("--sizes", default="1,4", help="input sizes, as multiples of --records (comma-separated)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each compared Spark job (the rows compared take them in turns); the table shows "
                             "the median (a 1x run on 2 shared cores varies by 10-25%% from run to run)")
    parser.add_argument("--skip", default="",
                        help="parts to leave out: ceiling, kafka (the Kafka-sink rows; not with fixed), sql (the "
                             "revenue_per_minute rows), postgres (every PostgreSQL row), iceberg (the Iceberg sink "
                             "and its Parquet baseline), fixed, airflow, planner, connect, avro")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or LocalBroker.default().start()
    settings = KafkaSettings(bootstrap)
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS") and (broker_pid := LocalBroker.default().pid()):
        WATCHED["broker"] = broker_pid
    out_dir = local_dir() / "bench"
    work = out_dir / f"throughput-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    work.mkdir(parents=True)
    rows: list[dict] = []
    inputs: dict[int, Input] = {}
    connect = None if "connect" in skip else _connect_server(work)
    if connect is not None and (server_pid := connect.pid()):
        WATCHED["connect_server"] = server_pid
    try:
        _measure(args, skip, settings, work, rows, inputs, connect)
    finally:
        if connect is not None:
            connect.stop()
    _ratios(rows)

    print_table(rows)
    print()
    for line in verdicts(rows):
        print(line)
    anomalies = [f"{r['name']} {r.get('size')}x: {a}" for r in rows for a in r.get("anomalies", [])]
    for a in anomalies:
        print(f"ANOMALY {a}")
    (out_dir / "throughput.json").write_text(json.dumps(
        {"records": args.records, "inputs": {str(k): v.__dict__ for k, v in inputs.items()}, "rows": rows,
         "verdicts": verdicts(rows), "anomalies": anomalies}, indent=2))
    print(f"written: {out_dir / 'throughput.json'}")
    try:
        chart(rows, out_dir / "throughput.png")
        print(f"written: {out_dir / 'throughput.png'}")
    except ImportError:
        print("no chart: matplotlib is not installed (make bench installs requirements-bench.txt)")
    return 1 if anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
