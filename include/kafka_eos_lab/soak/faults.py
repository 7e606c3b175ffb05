"""The soak's fault driver: at times drawn from the seed, one fault at a time, each healed the way
it heals in production (a node restarted, a component started again, a retry, an operator).

Every fault is one entry of the event log: its kind, target, when it was injected and healed, and
what it saw. The schedule cycles through every kind in a seeded order, so an hour meets each
several times; a fault that could not end inside the soak (a stranger's transaction is alerted
only after the watchdog's threshold) is not drawn near the end.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from kafka_eos_lab.chaos import brokers
from kafka_eos.errors import BrokerError
from kafka_eos.health import watch_threshold_s
from kafka_eos.kafka_admin import admin_client, admin_result, partition_offsets, partitions_of
from kafka_eos.pipeline import checkpoints
from kafka_eos.sample_data import make_order
from kafka_eos_lab.soak import load
from kafka_eos_lab.soak.world import SOURCE, STREAM, World, pipeline_dag

KINDS = ("broker_kill", "broker_term", "broker_stop", "task_kill", "scheduler_kill", "triggerer_kill",
         "worker_kill", "stream_restart", "stranger", "replay", "backfill", "add_partition")
#: No fault in the first minute (every pipeline's first run) or the last (the soak settles).
QUIET_S = 60.0
#: Between two faults' starts: from the seed, in this range.
GAP_S = (60.0, 150.0)
#: A killed or terminated node stays down this long; a stopped one longer than the clients'
#: request timeout (30 s), so its partitions move.
DOWN_S, STOPPED_S = 15.0, 40.0
#: A killed Airflow component is started again after this long (a supervisor's restart).
RESTART_AFTER_S = 5.0
#: How long an armed crash point may wait for a DAG run's commit (one per minute, or a retry).
ARMED_FOR_S = 240.0
#: The source never grows beyond this many partitions.
MAX_SOURCE_PARTITIONS = 6
#: How long a replay waits to read orders_enriched's checkpoints: an attempt killed inside its commit
#: leaves its transactional offset commit pending (the group's offsets unreadable, as stable offsets)
#: until the retry fences it: a heartbeat timeout, a retry delay and the retry's start.
CHECKPOINTS_WITHIN_S = 240.0
#: How long after the watchdog's threshold an alert may come (the issue's bound), plus the
#: runbook's dry run and abort: a stranger is drawn only if this fits before the soak ends.
ALERT_WITHIN_S, RUNBOOK_S = 60.0, 90.0


def schedule(seed: int, minutes: float) -> list[tuple[float, str]]:
    """``(seconds after the start, kind)`` of every fault of a soak of ``minutes``."""
    rng = random.Random(seed)
    end = minutes * 60 - QUIET_S
    stranger_needs = watch_threshold_s([]) + ALERT_WITHIN_S + RUNBOOK_S
    faults, cycle, t = [], [], QUIET_S
    while t < end:
        if not cycle:
            cycle = list(KINDS)
            rng.shuffle(cycle)
        kind = cycle.pop()
        if kind == "stranger" and t + stranger_needs > end:
            continue  # too late to see it alerted and cleared
        faults.append((round(t, 1), kind))
        t += rng.uniform(*GAP_S)
    return faults


@dataclass
class Event:
    kind: str
    at: float  # seconds after the soak's start, as scheduled
    injected: float = 0.0  # wall clock
    healed: float | None = None  # wall clock: the fault is over (the node back, the component started)
    target: str = ""
    note: str = ""
    #: The source's LSOs when the fault was healed: recovered when every pipeline's checkpoint passed them.
    lso_at_heal: dict[str, int] = field(default_factory=dict)
    #: What the audit needs of side runs and strangers.
    details: dict = field(default_factory=dict)


class FaultDriver(threading.Thread):
    """Runs :func:`schedule`'s faults against ``world``; ``events`` is the log (also JSON lines in ``log_path``)."""

    def __init__(self, world: World, seed: int, minutes: float, log_path: Path, say=print) -> None:
        super().__init__(name="soak faults", daemon=True)
        self.world, self.rng = world, random.Random(seed + 1)
        self.plan = schedule(seed, minutes)
        self.log_path, self.say = log_path, say
        self.events: list[Event] = []
        self.strangers: list[Producer] = []
        self.began = time.time()
        self._halt = threading.Event()

    def stop(self, timeout_s: float = 300.0) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        for at, kind in self.plan:
            if self._halt.wait(max(0.0, self.began + at - time.time())):
                return
            event = Event(kind, at, injected=time.time())
            self.say(f"fault at {at:.0f}s: {kind}")
            try:
                getattr(self, kind)(event)
            except Exception as exc:  # noqa: BLE001 - a fault that failed is logged, and the soak goes on
                event.note = f"{event.note} ERROR {type(exc).__name__}: {exc}".strip()
            if event.healed is None:
                event.healed = time.time()
            event.lso_at_heal = self._source_lsos()
            self.events.append(event)
            with self.log_path.open("a") as out:
                out.write(json.dumps(event.__dict__) + "\n")
            self.say(f"  {kind} {event.target}: {event.note or 'done'} ({event.healed - event.injected:.0f}s)")

    def _source_lsos(self) -> dict[str, int]:
        settings = self.world.settings
        n = partitions_of(settings, [SOURCE])[SOURCE]
        return {f"{t}-{p}": o.lso for (t, p), o in partition_offsets(settings, [(SOURCE, p) for p in range(n)]).items()}

    # --- brokers ---------------------------------------------------------------------------------

    def _broker_target(self, event: Event) -> int:
        settings, choice = self.world.settings, self.rng.randrange(4)
        if choice == 0:
            event.target = f"leader of {SOURCE}-0"
            return brokers.leader_of(settings, SOURCE, 0)
        if choice == 1:
            event.target = "leader of orders.enriched-0"
            return brokers.leader_of(settings, "orders.enriched", 0)
        if choice == 2:
            event.target = f"transaction coordinator of {load.TRANSACTIONAL_ID}"
            return brokers.coordinator_of(settings, brokers.TRANSACTION_STATE, load.TRANSACTIONAL_ID)
        group = self.world.spec(STREAM).source.group_id
        event.target = f"group coordinator of {group}"
        return brokers.coordinator_of(settings, brokers.CONSUMER_OFFSETS, group)

    def _broker(self, event: Event, action: str) -> None:
        node = self._broker_target(event)
        event.target += f" (node {node})"
        brokers.hit(self.world.cluster, node, action)
        time.sleep(STOPPED_S if action == "stop" else DOWN_S)
        brokers.heal(self.world.cluster, node, action)
        event.healed = time.time()
        brokers.wait_in_sync(self.world.settings)
        event.note = f"in sync {time.time() - event.healed:.0f}s after"

    def broker_kill(self, event: Event) -> None:
        self._broker(event, "kill")

    def broker_term(self, event: Event) -> None:
        self._broker(event, "term")

    def broker_stop(self, event: Event) -> None:
        self._broker(event, "stop")

    # --- Spark, Airflow, the stream ----------------------------------------------------------------

    def task_kill(self, event: Event) -> None:
        """Arm the crash point: the next per_partition commit in the Spark Connect server (a DAG
        run of orders_enriched) is SIGKILLed before its commit."""
        token = self.world.crash_token
        event.target = f"the next Spark task at {self.world.fail_points['KAFKA_EOS_CRASH_AT']}"
        token.unlink(missing_ok=True)
        deadline = time.time() + ARMED_FOR_S
        while not token.exists() and time.time() < deadline and not self._halt.is_set():
            time.sleep(1)
        if token.exists():
            event.note = f"killed: {token.read_text().strip()}"
        else:
            token.write_text("disarmed\n")
            event.note = f"no commit passed the point within {ARMED_FOR_S:g}s (disarmed)"

    def _component(self, event: Event, component: str) -> None:
        airflow = self.world.airflow
        pid = airflow.pid(component)
        event.target = f"airflow {component} (pid {pid})"
        if pid is None:
            event.note = "was not running"
        else:
            # The whole process group, as a host or container losing it would: its task processes too.
            os.killpg(pid, signal.SIGKILL)
        time.sleep(RESTART_AFTER_S)
        airflow.launch(component)
        event.healed = time.time()

    def scheduler_kill(self, event: Event) -> None:
        self._component(event, "scheduler")

    def triggerer_kill(self, event: Event) -> None:
        self._component(event, "triggerer")

    def worker_kill(self, event: Event) -> None:
        """A Celery worker's process group, the two in turn: its tasks' processes die with it (a
        stream's process, in a session of its own, is left an orphan and must stop by itself)."""
        workers = [c for c in self.world.airflow.components if c.startswith("celery-worker-")]
        self._workers_killed = getattr(self, "_workers_killed", 0) + 1
        self._component(event, workers[self._workers_killed % len(workers)])

    def stream_restart(self, event: Event) -> None:
        """SIGKILL the stream's process; the stream DAG's task fails and its retry starts it again."""
        pids = stream_pids(STREAM)
        event.target = f"kafka-eos stream {STREAM} (pids {pids or 'none'})"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        if not pids:
            event.note = "no stream process was running"

    # --- the data ------------------------------------------------------------------------------------

    def stranger(self, event: Event) -> None:
        """A producer of nobody's pipeline opens a transaction on a source partition and leaves it
        open (its timeout is the brokers' longest): the watchdog must alert, the runbook abort it."""
        settings, n = self.world.settings, partitions_of(self.world.settings, [SOURCE])[SOURCE]
        partition = self.rng.randrange(n)
        tid = f"soak.stranger.{len(self.strangers) + 1}"
        producer = Producer(settings.client_config(**{"transactional.id": tid, "transaction.timeout.ms": 900_000}))
        producer.init_transactions(60)
        producer.begin_transaction()
        order = make_order(0, self.rng, datetime.now(timezone.utc))
        order["order_id"] = f"{tid}.o-1"
        offsets: list[int] = []
        producer.produce(SOURCE, value=json.dumps(order).encode(), partition=partition,
                         on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None else None)
        producer.flush(60)
        self.strangers.append(producer)  # held open: never committed, never closed until the end
        event.target = f"{SOURCE}-{partition} by {tid}"
        event.details = {"topic": SOURCE, "partition": partition, "offset": offsets[0] if offsets else None,
                         "transactional_id": tid, "order_id": order["order_id"], "opened": time.time(),
                         "threshold_s": watch_threshold_s([s.sink.transaction_timeout_s for s in
                                                           map(self.world.spec, self.world.pipelines)])}

    def replay(self, event: Event) -> None:
        """Replay a past range of orders_enriched (below its checkpoint) through its DAG's trigger form."""
        spec = self.world.spec("orders_enriched")
        n = partitions_of(self.world.settings, [SOURCE])[SOURCE]
        cks = self._checkpoints(spec, [(SOURCE, p) for p in range(n)], event)
        until = {f"{SOURCE}-{p}": ck for (_, p), ck in cks.items() if ck}
        if not until:
            event.note = "nothing committed yet to replay"
            return
        frm = {tp: max(0, ck - self.rng.randrange(20, 200)) for tp, ck in until.items()}
        conf = {"replay_from": json.dumps(frm), "replay_until": json.dumps(until)}
        run = self.world.airflow.api("POST", f"/api/v2/dags/{pipeline_dag(spec.name)}/dagRuns",
                                     {"logical_date": None, "conf": conf})
        event.target = f"{spec.name} {conf['replay_from']} .. {conf['replay_until']}"
        event.details = {"pipeline": spec.name, "run_id": run["dag_run_id"], **conf}

    def _checkpoints(self, spec, partitions, event: Event) -> dict:
        """The pipeline's checkpoints, waiting (up to CHECKPOINTS_WITHIN_S) while an attempt killed
        inside its commit holds the group's offsets; how long it waited goes in the event's note."""
        began, deadline = time.time(), time.time() + CHECKPOINTS_WITHIN_S
        while True:
            try:
                cks, _drift = checkpoints(spec, self.world.settings, partitions)
            except BrokerError:
                if time.time() >= deadline or self._halt.is_set():
                    raise
                time.sleep(10)
                continue
            if time.time() - began > 1:
                event.note = f"checkpoints readable after {time.time() - began:.0f}s (a pending offset commit)"
            return cks

    def backfill(self, event: Event) -> None:
        """Backfill one past minute of revenue_per_minute with Airflow's backfill (REST)."""
        spec = self.world.spec("revenue_per_minute")
        start = (datetime.now(timezone.utc) - timedelta(minutes=3)).replace(second=0, microsecond=0)
        # Every past minute had its scheduled run: Airflow's backfill runs it again only when asked to
        # reprocess completed intervals (a backfill run is a side run: its own table, its own checkpoint).
        body = {"dag_id": pipeline_dag(spec.name), "from_date": start.isoformat(), "to_date": start.isoformat(),
                "max_active_runs": 1, "reprocess_behavior": "completed"}
        created = self.world.airflow.api("POST", "/api/v2/backfills", body)
        event.target = f"{spec.name} [{start:%H:%M}, {start + timedelta(minutes=1):%H:%M})"
        event.details = {"pipeline": spec.name, "backfill_id": created["id"], "start": start.isoformat(),
                         "end": (start + timedelta(minutes=1)).isoformat()}

    def add_partition(self, event: Event) -> None:
        n = partitions_of(self.world.settings, [SOURCE])[SOURCE]
        if n >= MAX_SOURCE_PARTITIONS:
            event.note = f"{SOURCE} has {n} partitions already"
            return
        admin = admin_client(self.world.settings)  # alive until its answer is read
        admin_result(admin.create_partitions([NewPartitions(SOURCE, n + 1)])[SOURCE], f"adding a partition to {SOURCE}")
        event.target = f"{SOURCE}: {n} -> {n + 1} partitions"

    def close(self) -> None:
        """The strangers' producers go (their transactions stay as the runbook left them)."""
        for producer in self.strangers:
            producer.flush(5)
        self.strangers.clear()


def stream_pids(pipeline: str) -> list[int]:
    """The processes running ``kafka-eos stream`` of ``pipeline`` (the stream DAG's child)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka_eos.cli" in args and b"stream" in args and any(pipeline.encode() in a for a in args):
            pids.append(int(proc.name))
    return pids

