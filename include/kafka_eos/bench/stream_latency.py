"""Latency and throughput of continuous mode (``kafka-eos stream``), end to end:

    python -m kafka_eos.bench.stream_latency [--rates 1000,10000] [--seconds 60] [--commit atomic]

A producer commits records at a fixed rate (a transaction every 100 ms; every 4th tick one more
transaction, aborted); each committed transaction's commit time is noted when ``commit_transaction()`` returns. A
``kafka-eos stream`` process (its own process, as in production) copies the source to the sink
(``identity``). A read_committed reader of the sink notes when each record becomes visible: its
latency is that minus its transaction's commit time. Printed per rate: p50/p95/p99 latency, the
rate produced and the rate committed by the stream, the largest backlog seen (committed input the
stream had not committed yet) and how long it took to catch up once the producer stopped. Written
to ``.local/bench/stream_latency.json``.

Runs on the local broker (started if needed) unless ``KAFKA_BOOTSTRAP_SERVERS`` is set; topics are
new for each run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kafka_eos.kafka_admin import committed_offsets, create_topics, partition_offsets
from kafka_eos.local_kafka import LocalBroker
from kafka_eos.paths import local_dir
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec, spec_document

#: Source partitions: a few per core, like a small production topic.
PARTITIONS = 6
#: One producer transaction this often: input arrives in small committed steps.
TXN_EVERY_S = 0.1
#: Every this-many-th producer transaction is aborted (its records must never show).
ABORT_EVERY = 4
#: Target on this machine (2 cores): p95 end-to-end latency at 1,000 records/s.
TARGET_P95_S = 5.0
#: Kept up: the backlog is gone this soon after the producer stops (about two batches).
CAUGHT_UP_S = 5.0


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


def run_rate(settings: KafkaSettings, rate: int, seconds: float, commit: str, interval: float, work: Path,
             warmup: float) -> dict:
    """One measurement: a stream over new topics, fed at ``rate`` records/s for ``warmup`` seconds
    (not measured: the JVM compiles, Spark's first jobs are slow) and then ``seconds``."""
    name = f"bench_{rate}_{uuid.uuid4().hex[:6]}"
    source, sink = f"{name}.in", f"{name}.out"
    create_topics(settings, {source: PARTITIONS, sink: PARTITIONS})
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
        reader, producer = SinkReader(settings, sink), RateProducer(settings, source, rate, seconds, warmup)
        reader.start()
        producer.start()
        max_backlog = 0
        measuring_from = time.monotonic() + warmup
        while producer.is_alive():
            if time.monotonic() >= measuring_from:
                max_backlog = max(max_backlog, _backlog(settings, source, spec.source.group_id))
            time.sleep(1.0)
        stopped = time.monotonic()
        while _backlog(settings, source, spec.source.group_id) > 0 and time.monotonic() - stopped < 300:
            time.sleep(0.2)
        catch_up_s = time.monotonic() - stopped
        time.sleep(1.0)  # the reader sees the last commit
        reader.stop.set()
        reader.join(30)
    finally:
        stream.send_signal(signal.SIGTERM)
        try:
            stream.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(stream.pid, signal.SIGKILL)
        log.close()
    latencies = [at - producer.committed_at[txn] for txn, at in reader.seen if txn in producer.measured]
    warm = [at - producer.committed_at[txn] for txn, at in reader.seen
            if txn in producer.committed_at and txn not in producer.measured]
    leaked = sum(1 for txn, _at in reader.seen if txn in producer.aborted)
    batches = sum(1 for line in open(log.name) if " batch " in line and " committed: " in line)
    return {
        "rate": rate, "seconds": seconds, "commit": commit, "interval_s": interval,
        "records_committed_in": producer.committed_records, "records_out": len(reader.seen),
        "aborted_visible": leaked, "batches": batches,
        "p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "p95_s": round(percentile(latencies, 95), 3) if latencies else None,
        "p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "warmup_s": warmup, "warmup_max_latency_s": round(max(warm), 3) if warm else None,
        "produced_per_s": round(producer.committed_records / (warmup + seconds)),
        "max_backlog": max_backlog, "catch_up_s": round(catch_up_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stream_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="1000,10000", help="records/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each rate is measured")
    parser.add_argument("--warmup", type=float, default=20.0,
                        help="seconds produced at the rate before measuring (its worst latency is shown apart)")
    parser.add_argument("--commit", default="atomic", choices=["atomic", "per_partition"])
    parser.add_argument("--interval", type=float, default=0.5, help="the stream's --interval")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or LocalBroker.default().start()
    settings = KafkaSettings(bootstrap)
    work = local_dir() / "bench"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    print(f"continuous mode, identity, {PARTITIONS} partitions, {args.commit} commit, --interval {args.interval:g}; "
          f"a committed producer transaction every {TXN_EVERY_S:g} s and an aborted one every "
          f"{ABORT_EVERY * TXN_EVERY_S:g} s; measured for "
          f"{args.seconds:g} s after a {args.warmup:g} s warm-up at the same rate")
    print(f"{'rate/s':>8} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7} {'in/s':>7} {'out':>8} {'batches':>7} "
          f"{'max backlog':>11} {'catch-up s':>10} {'aborted seen':>12} {'warm-up max s':>13}")
    for rate in (int(r) for r in args.rates.split(",")):
        r = run_rate(settings, rate, args.seconds, args.commit, args.interval, work, args.warmup)
        results.append(r)
        print(f"{r['rate']:>8} {r['p50_s']:>7} {r['p95_s']:>7} {r['p99_s']:>7} {r['produced_per_s']:>7} "
              f"{r['records_out']:>8} {r['batches']:>7} {r['max_backlog']:>11} {r['catch_up_s']:>10} "
              f"{r['aborted_visible']:>12} {r['warmup_max_latency_s']:>13}", flush=True)
    for r in results:
        kept_up = r["records_out"] == r["records_committed_in"] and r["catch_up_s"] <= CAUGHT_UP_S
        print(f"rate {r['rate']}/s: p95 {r['p95_s']} s (target <= {TARGET_P95_S:g} s: "
              f"{'met' if r['p95_s'] is not None and r['p95_s'] <= TARGET_P95_S else 'NOT met'}); "
              f"{r['records_out']}/{r['records_committed_in']} committed records out, {r['aborted_visible']} aborted "
              f"visible, caught up {r['catch_up_s']} s after the producer stopped: "
              f"{'kept up' if kept_up else 'FELL BEHIND'}")
    out = work / "stream_latency.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
