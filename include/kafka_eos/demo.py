"""``kafka-eos demo``: the main job on the embedded default.

Starts the local broker, resets the demo's topics, groups and SQLite sink, produces sample
orders with a transactional producer (aborted transactions and poison records included), runs
both example pipelines through Airflow (``airflow dags test``: real SparkSubmitOperator, real
spark-submit; the two side by side) three times — initial, incremental, nothing new — and then
checks exactly-once on a read_committed view of the outputs. Exit 0 only when every check passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path


from kafka_eos import kafka_admin
from kafka_eos.errors import BrokerError, BrokerUnreachable, KafkaEosError
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.local.spark_startup import driver_environ
from kafka_eos.manifest import ManifestStore
from kafka_eos.paths import PROJECT_ROOT, local_dir
from kafka_eos.pipeline import checkpoints, source_partitions
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import Produced, produce_orders
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.sql_store import SqlStore, database_url, local_url
from kafka_eos.spec import PipelineSpec, load_spec

PIPELINES = ("orders_enriched", "revenue_per_minute")
#: How long the reset waits for each admin answer. A cold broker creates and loads its offsets
#: topic on the first group request; on a loaded machine that once took more than 30 s.
RESET_TIMEOUT_S = 120
#: Partitions of the demo's topics: enough for per_partition scope to show one transaction each.
PARTITIONS = {"orders": 3, "orders.enriched": 3, "orders.dlq": 1, "orders.backfill": 3}
#: Orders of the first and the second (incremental) batch.
FIRST_BATCH, SECOND_BATCH = 3000, 1500


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, bool(ok), detail))
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def airflow_env(settings: KafkaSettings) -> dict[str, str]:
    """Environment of the demo's Airflow: SQLite metadata DB under .local/airflow, the project's
    dags/ and plugins/, and connections from the environment (no secrets in code)."""
    home = local_dir() / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    venv_bin = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        # The operator page's plugin loads through the package's entry point.
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The two pipelines' runs write it at the same time: wait up to a minute for SQLite's
        # lock (the driver's default is 5 s) rather than fail with "database is locked".
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=60",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        # The local broker stands in for a Kafka connection that is not defined (as in
        # `kafka-eos airflow start`; off in a deployment).
        "AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK": "True",
        "AIRFLOW_CONN_KAFKA_EOS_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": settings.bootstrap_servers}}),
        "PYSPARK_PYTHON": sys.executable,
        # spark-submit in local mode: keep the driver on loopback.
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def demo_specs() -> list[PipelineSpec]:
    """The demo's pipelines, in the same environment as its runs: with ``KAFKA_EOS_SQL_URL``
    set, the SQL sink (and the demo's checks of it) use that database."""
    return [load_spec(name, environ=os.environ) for name in PIPELINES]


def reset(settings: KafkaSettings, specs: list[PipelineSpec], topics: dict[str, int] | None = None) -> None:
    """Delete and recreate the demo's topics (``topics``: name -> partitions; default the JSON
    demo's), groups and SQL sink (its SQLite file; with ``KAFKA_EOS_SQL_URL``, its table and rows
    there): each demo starts clean."""
    topics = PARTITIONS if topics is None else topics
    admin = kafka_admin.admin_client(settings)
    groups = [s.source.group_id for s in specs]
    for group, fut in admin.delete_consumer_groups(groups).items():
        try:
            kafka_admin.admin_result(fut, f"deleting consumer group {group} on {settings.bootstrap_servers}",
                                     RESET_TIMEOUT_S)
        except BrokerUnreachable:
            raise
        except BrokerError:
            pass  # no such group yet
    for spec in specs:  # a deliberate fresh start: the manifest forgets the old checkpoints too
        ManifestStore.of(spec, settings).forget_checkpoints()
    existing = kafka_admin.topics_metadata(settings, topics).partitions
    doomed = [t for t in topics if t in existing]
    if doomed:
        for topic, fut in admin.delete_topics(doomed).items():
            kafka_admin.admin_result(fut, f"deleting topic {topic} on {settings.bootstrap_servers}", RESET_TIMEOUT_S)
    deadline = time.monotonic() + 60
    while True:  # a deleted topic's name is free again once its deletion completes
        try:
            # Returns once every new partition's leader answers (asked by fresh clients: this
            # admin client still caches the deleted topics' leader epochs).
            kafka_admin.create_topics(settings, topics)
            break
        except KafkaEosError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    for spec in specs:
        if spec.sink.table is None:
            continue  # a Kafka sink: its topics were created anew above
        url = database_url(spec)
        if url == local_url(spec):
            (local_dir() / "sql" / f"{spec.name}.db").unlink(missing_ok=True)
        else:  # KAFKA_EOS_SQL_URL or its connection: the demo's own table and rows only
            SqlStore(spec, url).forget()


def run_dags(specs: list[PipelineSpec], env: dict[str, str]) -> list[float]:
    """One ``airflow dags test`` run of each pipeline's DAG, side by side (both read ``orders``,
    each in its own group, into its own sink; they share the metadata DB, whose DAGs were written
    before: on 2 cores a round takes about 40 s instead of 57). Their wall times in seconds, in
    the order of ``specs``.

    :raises KafkaEosError: once every run has ended, naming each that failed and its log."""
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = [pool.submit(run_dag, spec, env) for spec in specs]
    failed = [str(f.exception()) for f in futures if f.exception() is not None]
    if failed:
        raise KafkaEosError("; ".join(failed))
    return [f.result() for f in futures]


def run_dag(spec: PipelineSpec, env: dict[str, str]) -> float:
    """One ``airflow dags test`` run of the pipeline's DAG. Returns its wall time in seconds."""
    dag_id = f"kafka_eos__{spec.name}"
    logical = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    started = time.monotonic()
    log_file = local_dir() / "airflow" / f"demo-{dag_id}.log"
    with open(log_file, "a") as log:
        res = subprocess.run([str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id, logical],
                             env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    if res.returncode != 0:
        raise KafkaEosError(f"airflow dags test {dag_id} failed (exit {res.returncode}); see {log_file}")
    return time.monotonic() - started


def run_summaries(settings: KafkaSettings, spec: PipelineSpec, since: str) -> list[dict]:
    """The pipeline's runs committed since ``since`` (ISO time), from the manifest, oldest first."""
    return [r for r in ManifestStore.of(spec, settings).runs_since(since)
            if r.get("status") == "committed" and r.get("started_at", "") >= since]


def check_kafka_pipeline(report: Report, settings: KafkaSettings, spec: PipelineSpec, truth: Produced) -> list:
    out = read_committed(settings, spec.sink.topic)
    ids = Counter(json.loads(m.value)["order_id"] for m in out)
    expected = Counter(o["order_id"] for o in truth.committed)
    report.check(f"{spec.name}: nothing lost", not (expected - ids), f"{sum(expected.values())} committed valid "
                 f"orders, {len(expected - ids)} missing from {spec.sink.topic}")
    dupes = sum(n - 1 for n in ids.values() if n > 1)
    report.check(f"{spec.name}: nothing twice", dupes == 0, f"{dupes} duplicates in {len(out)} records")
    leaked = set(ids) & set(truth.aborted)
    report.check(f"{spec.name}: nothing from aborted input", not leaked,
                 f"{len(truth.aborted)} aborted orders, {len(leaked)} in the output")
    dlq = read_committed(settings, spec.sink.dlq_topic)
    report.check(f"{spec.name}: poison records dead-lettered once", len(dlq) == truth.malformed,
                 f"{len(dlq)} in {spec.sink.dlq_topic}, {truth.malformed} produced")
    return out


def check_sql_pipeline(report: Report, spec: PipelineSpec, truth: Produced, enriched: list) -> None:
    from sqlalchemy import text

    sink = SqlStore(spec, database_url(spec))
    with sink.engine.connect() as conn:
        count, revenue = conn.execute(text(f"select sum(order_count), sum(revenue_eur) from {spec.sink.table}")).one()
        dead = conn.execute(text("select count(*) from kafka_eos_dead_letters where pipeline = :p"),
                            {"p": spec.name}).scalar()
    report.check(f"{spec.name}: every committed order counted exactly once", count == len(truth.committed),
                 f"sum(order_count) = {count}, committed valid orders = {len(truth.committed)}")
    cent = Decimal("0.01")
    enriched_total = sum(Decimal(str(json.loads(m.value)["amount_eur"])) for m in enriched).quantize(cent)
    # SQLite sums the column as a double: compare to the cent, not to the last binary digit.
    revenue_total = Decimal(str(revenue)).quantize(cent)
    report.check(f"{spec.name}: revenue agrees with orders_enriched", revenue_total == enriched_total,
                 f"sum(revenue_eur) = {revenue_total}, sum of enriched amount_eur = {enriched_total}")
    report.check(f"{spec.name}: poison records dead-lettered once", dead == truth.malformed,
                 f"{dead} rows in kafka_eos_dead_letters, {truth.malformed} produced")


def check_checkpoints(report: Report, settings: KafkaSettings, spec: PipelineSpec) -> None:
    tps = source_partitions(spec, settings)
    cks, drift = checkpoints(spec, settings, tps)
    offs = kafka_admin.partition_offsets(settings, tps)
    print(f"  {'partition':<12} {'checkpoint':>10} {'LSO':>8} {'HW':>8}")
    for tp in tps:
        print(f"  {tp[0] + '-' + str(tp[1]):<12} {str(cks[tp]):>10} {offs[tp].lso:>8} {offs[tp].high_watermark:>8}")
    report.check(f"{spec.name}: checkpoint == LSO on every partition", all(cks[tp] == offs[tp].lso for tp in tps),
                 ", ".join(f"{t}-{p}: {cks[(t, p)]}/{offs[(t, p)].lso}" for t, p in tps))
    if not spec.sink.about.transactional:  # the group mirrors the sink's own checkpoints
        report.check(f"{spec.name}: Kafka mirror == SQL checkpoint", not drift, f"{len(drift)} partitions drifted")


def run_demo(bootstrap: str | None = None) -> int:
    broker = LocalBroker.default()
    if bootstrap and bootstrap != broker.bootstrap:
        raise KafkaEosError("the demo resets its topics and groups: it runs on the local broker only "
                            "(point real pipelines at a cluster with `kafka-eos run --bootstrap ...`)")
    # The demo's Spark drivers are small and short-lived: started on the JIT's first tier, the
    # serial collector and a class-data archive (kafka_eos.local.spark_startup), each costs about
    # a third of the CPU (7-8 CPU seconds rather than 25-30). A new archive's probe job runs beside
    # the broker's start, the reset and Airflow's DB set-up below.
    drivers, archive = driver_environ()
    print(f"== kafka-eos demo: local broker {broker.start()}")
    demo_started = datetime.now(timezone.utc).isoformat()
    settings = KafkaSettings(broker.bootstrap)
    env = {**airflow_env(settings), **drivers}
    specs = demo_specs()
    reset(settings, specs)
    print("== Airflow metadata DB (SQLite under .local/airflow)")
    # The DAGs are written to it once before the runs: two `dags test` processes that both find
    # a DAG new insert the same rows (UNIQUE constraint failed: asset_alias.name).
    for command in (["db", "migrate"], ["dags", "reserialize"]):
        res = subprocess.run([str(Path(sys.executable).parent / "airflow"), *command], env=env,
                             capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            said = (res.stderr or res.stdout).strip().splitlines() or [f"exit {res.returncode}"]
            raise KafkaEosError(f"airflow {' '.join(command)} failed: {said[-1]}")
    if archive is not None:
        archive.join()  # its drivers would start without it (it appears whole, or not at all)

    rounds = [("initial", FIRST_BATCH, 0), ("incremental", SECOND_BATCH, FIRST_BATCH), ("nothing new", 0, 0)]
    truth = Produced()
    timings: dict[str, list[tuple[str, float]]] = {s.name: [] for s in specs}
    for label, count, first in rounds:
        if count:
            more = produce_orders(settings, "orders", count, first_seq=first, seed=first + 11,
                                  transactional_id=f"kafka-eos.demo-producer.{first}")
            truth.committed += more.committed
            truth.malformed += more.malformed
            truth.aborted += more.aborted
            print(f"== produced {count} orders: {len(more.committed)} valid committed, {more.malformed} poison "
                  f"committed, {len(more.aborted)} in aborted transactions")
        for spec, seconds in zip(specs, run_dags(specs, env)):
            timings[spec.name].append((label, seconds))
            print(f"   {label:<12} airflow dags test kafka_eos__{spec.name}: {seconds:.1f}s")

    report = Report()
    print("\n== results")
    enriched = []
    for spec in specs:
        runs = run_summaries(settings, spec, demo_started)
        print(f"\n-- {spec.name} ({spec.sink.kind} sink, {spec.sink.commit})")
        for r in runs:
            secs = (datetime.fromisoformat(r["committed_at"]) - datetime.fromisoformat(r["started_at"])).total_seconds()
            rate = r["records_in"] / secs if secs > 0 else 0.0
            print(f"  run {r['run_id']}: in {r['records_in']}, out {r['records_out']}, dead-lettered "
                  f"{r['dead_letters']} ({secs:.1f}s in Spark + commit, {rate:.0f} records/s)")
        report.check(f"{spec.name}: three Airflow runs, two committed, the last a no-op", len(runs) == 2,
                     f"{len(runs)} committed runs in the manifest")
        total_in = sum(r["records_in"] for r in runs)
        report.check(f"{spec.name}: in = committed input", total_in == len(truth.committed) + truth.malformed,
                     f"records in {total_in}, committed input {len(truth.committed) + truth.malformed}")
        if spec.sink.table is None:  # the demo's Kafka pipeline, whose output the SQL one aggregates
            enriched = check_kafka_pipeline(report, settings, spec, truth)
        else:
            check_sql_pipeline(report, spec, truth, enriched)
        check_checkpoints(report, settings, spec)

    passed = sum(c.ok for c in report.checks)
    print(f"\n== {passed} passed, {len(report.checks) - passed} failed")
    print("The local broker keeps running: stop it with `.venv/bin/kafka-eos kafka stop`; "
          "`make clean` removes .local/ (broker data, Airflow DB, SQLite sink, jars).")
    return 0 if report.ok else 1
