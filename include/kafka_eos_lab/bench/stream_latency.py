"""Latency and throughput of continuous mode (``kafka-eos stream``) and of event-driven runs
(``schedule: stream`` under a local Airflow deployment), end to end:

    python -m kafka_eos_lab.bench.stream_latency [--forms continuous,event] [--rates 1000,10000] [--seconds 60]

A producer commits records at a fixed rate (a transaction every 100 ms; every 4th tick one more
transaction, aborted); each committed transaction's commit time is noted when ``commit_transaction()`` returns. A
``kafka-eos stream`` process (its own process, as in production) copies the source to the sink
(``identity``). A read_committed reader of the sink notes when each record becomes visible: its
latency is that minus its transaction's commit time. Printed per rate: p50/p95/p99 latency, the
rate produced, the largest backlog seen (committed input the pipeline had not committed yet) and
how long it took to catch up once the producer stopped. Event-driven runs: the same over a DAG
scheduled on the source asset (a DAG run per event), at a low rate. Written to
``.local/bench/stream_latency.json``.

Runs on the local broker (started if needed) unless ``KAFKA_BOOTSTRAP_SERVERS`` is set; topics are
new for each run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_eos.kafka_admin import committed_offsets, create_topics, partition_offsets
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.paths import local_dir
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec, spec_document
from kafka_eos.stream import DEFAULT_INTERVAL_S

#: Source partitions (``--partitions``): a few per core, like a small production topic.
PARTITIONS = 3
#: One producer transaction this often: input arrives in small committed steps.
TXN_EVERY_S = 0.1
#: Every this-many-th producer transaction is aborted (its records must never show).
ABORT_EVERY = 4
#: Targets, p95 end-to-end latency in both commit scopes, by rate (records/s on 3 partitions): at
#: most 1,000/s within half a second, more (10,000/s) within a second. Kafka Streams under
#: exactly_once_v2 commits every 100 ms by default.
TARGET_P95_S = {1000: 0.5, 10000: 1.0}
#: Target for event-driven runs (a DAG run per event: scheduling, three tasks, a spark-submit).
TARGET_EVENT_P95_S = 60.0
#: Kept up: the backlog is gone this soon after the producer stops (about two batches).
CAUGHT_UP_S = 5.0


def target_p95_s(rate: int) -> float:
    """The p95 target of a continuous stream at ``rate`` records/s: the first rate's at or above it."""
    return next((t for r, t in sorted(TARGET_P95_S.items()) if rate <= r), max(TARGET_P95_S.values()))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class RateProducer(threading.Thread):
    """Commits ``rate`` records/s (and aborts a quarter as many) for ``warmup + seconds``, noting each
    committed transaction's commit time."""

    def __init__(self, settings: KafkaSettings, topic: str, rate: int, seconds: float, warmup: float) -> None:
        super().__init__(daemon=True)
        self.settings, self.topic, self.rate, self.seconds, self.warmup = settings, topic, rate, seconds, warmup
        #: Transactions committed after the warm-up (the measured ones).
        self.measured: set[int] = set()
        self.committed_at: dict[int, float] = {}
        self.committed_records = 0
        self.aborted: set[int] = set()

    def run(self) -> None:
        producer = Producer(self.settings.client_config(**{
            "transactional.id": f"kafka-eos.bench.{self.topic}", "linger.ms": 5, "partitioner": "murmur2_random"}))
        producer.init_transactions(30)
        per_txn = max(1, int(self.rate * TXN_EVERY_S))
        started = time.monotonic()
        tick = txn = 0
        while time.monotonic() - started < self.warmup + self.seconds:
            tick += 1
            # Every ABORT_EVERY-th tick an aborted transaction comes first, on top of the rate.
            for abort in ((True, False) if tick % ABORT_EVERY == 0 else (False,)):
                txn += 1
                producer.begin_transaction()
                for i in range(per_txn):
                    producer.produce(self.topic, key=str(i).encode(), value=f"{txn}:{i}".encode())
                if abort:
                    producer.flush(30)
                    producer.abort_transaction(30)
                    self.aborted.add(txn)
                    continue
                producer.commit_transaction(30)
                self.committed_at[txn] = time.time()
                self.committed_records += per_txn
                if time.monotonic() - started >= self.warmup:
                    self.measured.add(txn)
            # A fixed rate: the next tick starts on time, not after this one.
            time.sleep(max(0.0, started + tick * TXN_EVERY_S - time.monotonic()))


class SinkReader(threading.Thread):
    """Reads the sink read_committed, noting when each record becomes visible."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        super().__init__(daemon=True)
        self.settings, self.topic = settings, topic
        self.seen: list[tuple[int, float]] = []  # (producer transaction, visible at)
        self.stop = threading.Event()

    def run(self) -> None:
        consumer = Consumer(self.settings.client_config(**{
            "group.id": f"kafka-eos.bench-reader.{uuid.uuid4()}", "isolation.level": "read_committed",
            "enable.auto.commit": False, "fetch.wait.max.ms": 10}))
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(1000, 0.1):
                    if msg.error() is None:
                        self.seen.append((int(msg.value().split(b":")[0]), time.time()))
                    elif msg.error().code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(msg.error().str())
        finally:
            consumer.close()


def _backlog(settings: KafkaSettings, topic: str, group: str) -> int:
    tps = [(topic, p) for p in range(PARTITIONS)]
    lso = partition_offsets(settings, tps)
    cks = committed_offsets(settings, group, tps)
    return sum(lso[tp].lso - (cks[tp] or 0) for tp in tps)


def _measure(settings: KafkaSettings, source: str, sink: str, group: str, rate: int, seconds: float,
             warmup: float, catch_up_limit_s: float) -> dict:
    """Feed ``source`` at ``rate`` for ``warmup + seconds`` while reading ``sink``; wait for the
    pipeline to catch up. The latencies, counts and backlog of the measured part."""
    reader, producer = SinkReader(settings, sink), RateProducer(settings, source, rate, seconds, warmup)
    reader.start()
    producer.start()
    max_backlog = 0
    measuring_from = time.monotonic() + warmup
    while producer.is_alive():
        if time.monotonic() >= measuring_from:
            max_backlog = max(max_backlog, _backlog(settings, source, group))
        time.sleep(1.0)
    stopped = time.monotonic()
    while _backlog(settings, source, group) > 0 and time.monotonic() - stopped < catch_up_limit_s:
        time.sleep(0.2)
    catch_up_s = time.monotonic() - stopped
    time.sleep(1.0)  # the reader sees the last commit
    reader.stop.set()
    reader.join(30)
    latencies = [at - producer.committed_at[txn] for txn, at in reader.seen if txn in producer.measured]
    warm = [at - producer.committed_at[txn] for txn, at in reader.seen
            if txn in producer.committed_at and txn not in producer.measured]
    return {
        "rate": rate, "seconds": seconds, "records_committed_in": producer.committed_records,
        "records_out": len(reader.seen), "aborted_visible": sum(1 for txn, _at in reader.seen if txn in producer.aborted),
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p95_s": round(percentile(latencies, 95), 3) if latencies else None,
        "p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "warmup_s": warmup, "warmup_max_latency_s": round(max(warm), 3) if warm else None,
        "produced_per_s": round(producer.committed_records / (warmup + seconds)),
        "max_backlog": max_backlog, "catch_up_s": round(catch_up_s, 1),
    }


def _topics(settings: KafkaSettings, name: str) -> tuple[str, str]:
    source, sink = f"{name}.in", f"{name}.out"
    create_topics(settings, {source: PARTITIONS, sink: PARTITIONS})
    return source, sink


def run_continuous(settings: KafkaSettings, rate: int, seconds: float, commit: str, interval: float, work: Path,
                   warmup: float) -> dict:
    """Continuous mode: a ``kafka-eos stream`` process over new topics, fed at ``rate`` records/s
    for ``warmup`` seconds (not measured: the JVM compiles, Spark's first jobs are slow) and then
    ``seconds``."""
    name = f"bench_{rate}_{uuid.uuid4().hex[:6]}"
    source, sink = _topics(settings, name)
    spec = parse_spec({"name": name, "source": {"topics": [source]}, "transform": "identity",
                       "sink": {"kind": "kafka", "topic": sink, "commit": commit}}, str(work / f"{name}.yaml"))
    spec_file = work / f"{name}.yaml"
    spec_file.write_text(json.dumps(spec_document(spec)))
    log = open(work / f"{name}.stream.log", "w")
    stream = subprocess.Popen([str(Path(sys.executable).parent / "kafka-eos"), "stream", str(spec_file),
                               "--bootstrap", settings.bootstrap_servers, "--interval", str(interval)],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                              start_new_session=True)
    try:
        # Started when its first (empty-topic) batch has committed the partitions' first checkpoints.
        deadline = time.monotonic() + 180
        while committed_offsets(settings, spec.source.group_id, [(source, 0)])[(source, 0)] is None:
            if stream.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stream did not start: see {log.name}")
            time.sleep(0.5)
        result = _measure(settings, source, sink, spec.source.group_id, rate, seconds, warmup, 300)
    finally:
        stream.send_signal(signal.SIGTERM)
        try:
            stream.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(stream.pid, signal.SIGKILL)
        log.close()
    batches = sum(1 for line in open(log.name) if " batch " in line and " committed: " in line)
    return {"form": "continuous", "commit": commit, "interval_s": interval, "batches": batches, **result}


def run_event_driven(settings: KafkaSettings, rate: int, seconds: float, commit: str, work: Path) -> dict:
    """Event-driven runs: a local Airflow deployment (scheduler, triggerer, LocalExecutor) with a
    ``schedule: stream`` DAG over new topics, fed at ``rate`` records/s for ``seconds``. Each DAG
    run starts cold (a spark-submit): nothing to warm up."""
    from kafka_eos.local.airflow import LocalAirflow, connections_environ, write_specs_dag_file

    name = f"bench_event_{uuid.uuid4().hex[:6]}"
    source, sink = _topics(settings, name)
    home = work / name
    for folder in ("dags", "specs"):
        (home / folder).mkdir(parents=True)
    write_specs_dag_file(home / "dags", home / "specs")
    (home / "specs" / f"{name}.yaml").write_text(json.dumps({
        "name": name, "source": {"topics": [source]}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": sink, "commit": commit}, "schedule": "stream"}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    airflow = LocalAirflow(home / "airflow", port, home / "dags", connections_environ(settings, "local[2]"))
    airflow.start()
    dag_id = f"kafka_eos__{name}"
    try:
        airflow.wait_for_dag(dag_id)
        result = _measure(settings, source, sink, f"kafka-eos.{name}", rate, seconds, 0.0, 600)
        runs = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"]
    finally:
        airflow.stop()
    return {"form": "event-driven", "commit": commit, "dag_runs": len(runs),
            "failed_runs": sum(1 for r in runs if r["state"] == "failed"), **result}


def _print_row(r: dict) -> None:
    print(f"{r['form']:>12} {r['rate']:>7} {r['p50_s']!s:>7} {r['p95_s']!s:>7} {r['p99_s']!s:>7} "
          f"{r['produced_per_s']:>6} {r['records_out']:>8} {r.get('batches', r.get('dag_runs'))!s:>8} "
          f"{r['max_backlog']:>11} {r['catch_up_s']:>10} {r['aborted_visible']:>8} {r['warmup_max_latency_s']!s:>10}",
          flush=True)


def _exactly_once(r: dict) -> bool:
    """Every committed input record out once, no aborted one visible."""
    return r["records_out"] == r["records_committed_in"] and r["aborted_visible"] == 0


def _verdict(r: dict) -> str:
    target = target_p95_s(r["rate"]) if r["form"] == "continuous" else TARGET_EVENT_P95_S
    met = r["p95_s"] is not None and r["p95_s"] <= target
    kept_up = _exactly_once(r) and (r["catch_up_s"] <= CAUGHT_UP_S or r["form"] != "continuous")
    return (f"{r['form']} at {r['rate']}/s: p95 {r['p95_s']} s (target <= {target:g} s: {'met' if met else 'NOT met'}); "
            f"{r['records_out']}/{r['records_committed_in']} committed records out, {r['aborted_visible']} aborted "
            f"visible, caught up {r['catch_up_s']} s after the producer stopped: "
            f"{'exactly once, kept up' if kept_up else 'FELL BEHIND or LOST/DUPLICATED'}")


def main(argv: list[str] | None = None) -> int:
    global PARTITIONS  # noqa: PLW0603 - the topics' partitions for this invocation (--partitions)
    parser = argparse.ArgumentParser(prog="stream_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--forms", default="continuous,event", help="continuous, event (comma-separated)")
    parser.add_argument("--rates", default="1000,10000", help="continuous mode: records/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="continuous mode: how long each rate is measured")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="continuous mode: seconds produced before measuring (its worst latency is shown apart)")
    parser.add_argument("--event-rate", type=int, default=20, help="event-driven runs: records/s")
    parser.add_argument("--event-seconds", type=float, default=240.0, help="event-driven runs: how long")
    parser.add_argument("--commit", default="atomic", choices=["atomic", "per_partition"])
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                        help="the stream's --interval (default: the stream's own)")
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="partitions of the source and sink topics")
    args = parser.parse_args(argv)
    PARTITIONS = args.partitions
    forms = args.forms.split(",")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or LocalBroker.default().start()
    settings = KafkaSettings(bootstrap)
    work = local_dir() / "bench"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"identity pipeline, {PARTITIONS} partitions, {args.commit} commit; a committed producer transaction every "
          f"{TXN_EVERY_S:g} s and an aborted one every {ABORT_EVERY * TXN_EVERY_S:g} s. Continuous: --interval "
          f"{args.interval:g}, measured for {args.seconds:g} s after a {args.warmup:g} s warm-up at the same rate. "
          f"Event-driven: a local Airflow deployment (LocalExecutor), {args.event_seconds:g} s.")
    print(f"{'form':>12} {'rate/s':>7} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7} {'in/s':>6} {'out':>8} "
          f"{'batches':>8} {'max backlog':>11} {'catch-up s':>10} {'aborted':>8} {'warm-up s':>10}")
    if "continuous" in forms:
        for rate in (int(r) for r in args.rates.split(",")):
            results.append(run_continuous(settings, rate, args.seconds, args.commit, args.interval, work, args.warmup))
            _print_row(results[-1])
    if "event" in forms:
        results.append(run_event_driven(settings, args.event_rate, args.event_seconds, args.commit, work))
        _print_row(results[-1])
    print("(batches: stream batches, or DAG runs for the event-driven form; aborted: records of aborted "
          "transactions seen by the read_committed reader)")
    for r in results:
        print(_verdict(r))
    out = work / "stream_latency.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"written: {out}")
    # An output that is not the committed input is an anomaly (exit 1); a latency target missed is
    # a figure, said in the verdict.
    return 0 if all(_exactly_once(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
