"""``python -m kafka_eos_lab.chaos`` (``make chaos``): the fault matrix on the local three-node cluster.

Prints a row per scenario and sink as each ends, then the table; exits 1 on any anomaly (a
checker above zero, a pipeline that did not get through its retries, a scenario that broke).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kafka_eos_lab.chaos.scenarios import SINKS, Outcome, cells_of, run_matrix
from kafka_eos.console import table
from kafka_eos.local.kafka import LocalCluster
from kafka_eos.paths import local_dir

HEADER = ("scenario", "sink", "fault", "runs", "s", "lost", "dup", "aborted", "uncommitted", "ckpt", "open txn",
          "drift", "result")


def row(o: Outcome) -> tuple:
    c = o.counts
    numbers = (c.lost, c.duplicated, c.aborted_visible, c.uncommitted_visible, c.checkpoint_gap,
               c.open_transactions, c.sql_drift) if c else (None,) * 7
    result = "ok" if o.anomalies == 0 else ("ERROR (below)" if o.error else "ANOMALY")
    return (o.scenario, o.sink, o.fault, " ".join(map(str, o.exits)), o.seconds, *numbers, result)


def render(outcomes: list[Outcome]) -> str:
    return table([row(o) for o in outcomes], HEADER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kafka_eos_lab.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", help="run the scenarios whose name contains this (repeatable)")
    parser.add_argument("--sink", action="append", choices=SINKS, help="only this sink (repeatable)")
    parser.add_argument("--quick", action="store_true", help="only the few scenarios `make test` runs")
    parser.add_argument("--spark-remote", metavar="URL",
                        help="run every attempt through this Spark Connect server (kafka-eos spark start --connect)")
    args = parser.parse_args(argv)
    cells = cells_of(args.scenario, args.sink, args.quick)
    if not cells:
        parser.error("no scenario matches")
    cluster = LocalCluster.default()
    started_here = not cluster.is_running()
    print(f"starting the local cluster of {cluster.size} brokers under {cluster.home}" if started_here
          else f"using the running local cluster at {cluster.bootstrap}", file=sys.stderr, flush=True)
    cluster.start()
    folder = local_dir() / "chaos" / time.strftime("%Y%m%dT%H%M%S")
    began = time.monotonic()
    try:
        outcomes = run_matrix(cluster, cells, folder, on_outcome=lambda o: print(
            f"  {'  '.join('-' if c is None else str(c) for c in row(o))}{f': {o.error}' if o.error else ''}",
            file=sys.stderr, flush=True), spark_remote=args.spark_remote)
    finally:
        if started_here:
            cluster.stop()
    print(render(outcomes))
    for o in outcomes:
        if o.error:
            print(f"ERROR {o.scenario} / {o.sink}: {o.error}")
    bad = sum(o.anomalies > 0 for o in outcomes)
    print(f"{len(outcomes)} scenario(s) in {(time.monotonic() - began) / 60:.1f} min: "
          f"{'no anomaly' if not bad else f'{bad} with anomalies'}; runs' logs under {Path(folder)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
