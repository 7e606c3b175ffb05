"""How long the operator page's read of the cluster takes at scale:

    python -m kafka_eos_lab.bench.overview [--pipelines 50] [--partitions 20]

Creates ``--pipelines`` pipelines, each over a source topic of its own with ``--partitions``
partitions (50 × 20 = 1,000 partitions by default): a few committed records in every partition, a
run committed for every pipeline (checkpoints and a run manifest, written as a run writes them), and
an open transaction of a killed producer pinning one partition. Then times
:func:`kafka_eos.overview.snapshot.snapshot` (what a page load past the cache costs) three times,
and a cached read. Runs on the local broker (started if needed) unless ``KAFKA_BOOTSTRAP_SERVERS``
is set; topics are new for each run. Prints the figures and writes ``.local/bench/overview.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid

from confluent_kafka import Producer

from kafka_eos.kafka_admin import create_topics
from kafka_eos.local.kafka import LocalBroker
from kafka_eos.manifest import COMMITTED, now_iso, run_key
from kafka_eos.overview.snapshot import CachedOverview, snapshot
from kafka_eos.paths import local_dir
from kafka_eos.pipeline import prepare_plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import parse_spec
from kafka_eos.sinks.atomic import atomic_commit

#: A producer that opens a transaction on a partition and is killed: the pinned partition.
_OPEN_AND_DIE = """
import os, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 600000})
p.init_transactions(30); p.begin_transaction(); p.produce(sys.argv[3], b"open", partition=0); p.flush(30)
os._exit(0)
"""


def build(settings: KafkaSettings, pipelines: int, partitions: int) -> list:
    tag = uuid.uuid4().hex[:6]
    specs = []
    create_topics(settings, {**{f"ov{tag}.{i}.in": partitions for i in range(pipelines)}, f"ov{tag}.out": 1})
    producer = Producer(settings.client_config(**{"linger.ms": 20}))
    for i in range(pipelines):
        for p in range(partitions):
            for n in range(3):
                producer.produce(f"ov{tag}.{i}.in", value=f"{i}-{p}-{n}".encode(), partition=p)
    producer.flush(60)
    for i in range(pipelines):
        specs.append(parse_spec({"name": f"ov{tag}_{i}", "source": {"topics": [f"ov{tag}.{i}.in"]},
                                 "transform": "identity", "sink": {"kind": "kafka", "topic": f"ov{tag}.out"}},
                                f"ov{tag}_{i}.yaml"))
    for spec in specs:
        # An offsets-only committed run per pipeline, without Spark: the checkpoints and the manifest, as a run commits them.
        plan = prepare_plan(spec, settings, f"bench-{uuid.uuid4().hex[:6]}")
        atomic_commit(spec, plan, settings).run(iter(()), lambda out, dead, plan=plan, spec=spec: _summary(spec, plan))
    # Another producer then writes past an open transaction of a killed producer on pipeline 0's partition 0.
    subprocess.run([sys.executable, "-c", _OPEN_AND_DIE, settings.bootstrap_servers, f"ov{tag}-stranger",
                    f"ov{tag}.0.in"], check=True, timeout=60)
    producer.produce(f"ov{tag}.0.in", value=b"behind", partition=0)
    producer.flush(30)
    return specs


def _summary(spec, plan) -> list:
    return [(spec.manifest_topic, run_key(spec.name, plan.run_id),
             {"plan": json.loads(plan.to_json()), "status": COMMITTED, "records_in": 0, "records_out": 0,
              "dead_letters": 0, "committed_at": now_iso()})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_eos_lab.bench.overview", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=20, help="source partitions per pipeline")
    args = parser.parse_args(argv)
    settings = KafkaSettings(os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or LocalBroker.default().start())
    started = time.monotonic()
    specs = build(settings, args.pipelines, args.partitions)
    print(f"set up {len(specs)} pipelines x {args.partitions} partitions in {time.monotonic() - started:.0f}s")
    times, last = [], None
    for _ in range(3):
        t = time.monotonic()
        last = snapshot(settings, specs)
        times.append(round(time.monotonic() - t, 2))
    cache = CachedOverview(lambda: (settings, specs, []))
    cache.get()
    t = time.monotonic()
    cache.get()
    cached_s = time.monotonic() - t
    partitions = sum(len(e["partitions"]) for e in last)
    pinned = sum(len(e["pinned"]) for e in last)
    errors = [e["error"] for e in last if e["error"]]
    runs = sum(len(e["runs"]) for e in last)
    result = {"pipelines": len(last), "partitions": partitions, "pinned": pinned, "runs": runs, "errors": errors,
              "snapshot_s": times, "cached_ms": round(cached_s * 1000, 3)}
    print(f"snapshot of {len(last)} pipelines, {partitions} partitions ({pinned} pinned, {runs} runs read from the "
          f"manifests): {', '.join(f'{s:.2f}s' for s in times)}; from the cache: {cached_s * 1000:.3f} ms")
    out = local_dir() / "bench" / "overview.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    ok = partitions == args.pipelines * args.partitions and pinned == 1 and runs == args.pipelines and not errors
    if not ok:
        print(f"ANOMALY: expected {args.pipelines * args.partitions} partitions, 1 pinned, {args.pipelines} runs, "
              f"no errors: {result}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
