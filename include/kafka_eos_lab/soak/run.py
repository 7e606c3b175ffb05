"""One soak from start to report: the world up, the load, the stream, the faults and the operator
for ``minutes``; then the load stops, every pipeline catches up, and the audit runs."""

from __future__ import annotations

import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kafka_eos.kafka_admin import partition_offsets, partitions_of
from kafka_eos.pipeline import checkpoints
from kafka_eos_lab.soak import report
from kafka_eos_lab.soak.audit import Check, audit
from kafka_eos_lab.soak.faults import FaultDriver
from kafka_eos_lab.soak.lag import LagSampler
from kafka_eos_lab.soak.load import Load
from kafka_eos_lab.soak.operator import Operator
from kafka_eos_lab.soak.world import RUNBOOK_DAG, SOURCE, STREAM, STREAM_DAG, WATCHDOG_DAG, World, pipeline_dag

#: After the load stops: the minute's runs, a retry's delay, a stream's restart, a stranger's abort.
CATCH_UP_S = 900.0


@dataclass
class Result:
    report: Path
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return not any(c.number for c in self.checks)


def wait_for(what: str, check, timeout_s: float, every_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001 - a broker or the API busy: look again
            pass
        time.sleep(every_s)
    return False


def caught_up(world: World, events) -> bool:
    """Every pipeline's checkpoint at the source's LSO, nothing open on the source, every side run ended."""
    settings = world.settings
    tps = [(SOURCE, p) for p in range(partitions_of(settings, [SOURCE])[SOURCE])]
    offsets = partition_offsets(settings, tps)
    if any(o.lso != o.high_watermark for o in offsets.values()):
        return False
    for name in world.pipelines:
        cks, _ = checkpoints(world.spec(name), settings, tps)
        if any(cks[tp] != offsets[tp].lso for tp in tps):
            return False
    return side_runs_ended(world, events)


def side_runs_ended(world: World, events) -> bool:
    airflow = world.airflow
    for e in events:
        if e.kind == "replay" and e.details:
            run_id = urllib.parse.quote(e.details["run_id"], safe="")
            run = airflow.api("GET", f"/api/v2/dags/{pipeline_dag(e.details['pipeline'])}/dagRuns/{run_id}")
            if run["state"] not in ("success", "failed"):
                return False
        if e.kind == "backfill" and e.details:
            if not airflow.api("GET", f"/api/v2/backfills/{e.details['backfill_id']}").get("completed_at"):
                return False
    return True


def run_stats(world: World) -> tuple[dict[str, Counter], int]:
    """Runs per DAG by state, and the task tries beyond each task's first."""
    airflow, runs, tries = world.airflow, {}, 0
    for dag_id in (*(pipeline_dag(n) for n in world.pipelines if n != STREAM), STREAM_DAG, WATCHDOG_DAG,
                   RUNBOOK_DAG):
        runs[dag_id] = Counter(r["state"] for r in airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"])
        tis = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances?limit=1000")["task_instances"]
        tries += sum(max(0, (t.get("try_number") or 1) - 1) for t in tis)
    return runs, tries


def run(home: Path, minutes: float, seed: int, base_port: int = 19600, say=print) -> Result:
    """A soak of ``minutes`` under ``home`` (its report in ``home/report``)."""
    world = World(home, base_port)
    load = faults = operator = sampler = None
    try:
        world.start(log=lambda line: say(f"soak: starting {line}"))
        load = Load(world.settings, SOURCE, home / "load.jsonl", seed=seed)
        load.start()
        world.airflow.api("POST", f"/api/v2/dags/{STREAM_DAG}/dagRuns", {"logical_date": None, "conf": {}})
        sampler, operator = LagSampler(world), Operator(world, say)
        faults = FaultDriver(world, seed, minutes, home / "faults.jsonl", say)
        began = faults.began
        say(f"soak: {minutes:g} min, seed {seed}, faults: {', '.join(f'{t:.0f}s {k}' for t, k in faults.plan)}")
        for thread in (sampler, operator, faults):
            thread.start()
        time.sleep(max(0.0, began + minutes * 60 - time.time()))
        say("soak: the load stops; waiting for every pipeline to catch up")
        faults.stop()
        load.stop()
        if not wait_for("catch-up", lambda: caught_up(world, faults.events), CATCH_UP_S):
            say(f"soak: not caught up within {CATCH_UP_S:g}s (the audit says where)")
        operator.stop()
        sampler.stop()
        ended = time.time()
        checks = audit(world, faults.events, operator.actions, home / "load.jsonl")
        runs, tries = run_stats(world)
        path = report.write(home / "report", seed=seed, minutes=minutes, began=began, ended=ended, checks=checks,
                            events=faults.events, actions=operator.actions, alerts=list(world.inbox.alerts),
                            runs=runs, tries=tries, samples=sampler.samples, load_stats=load.stats,
                            operator_errors=operator.errors)
        return Result(path, checks)
    finally:
        try:
            for thread in (faults, load, operator, sampler):
                if thread is not None and thread.is_alive():
                    thread.stop()
            if faults is not None:
                faults.close()
        finally:
            world.stop()  # whatever failed above: no broker, server or scheduler outlives the soak
