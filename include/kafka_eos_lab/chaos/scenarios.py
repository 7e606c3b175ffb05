"""The scenarios, and running one: fresh topics on the cluster, input with every 3rd transaction
aborted, a ``kafka-eos run`` process that meets the fault, the retries a scheduler would make
(same run id), then the checkers.

Faults are placed with the fail points of :mod:`kafka_eos_lab.faults`: the run pauses at a step of its
commit, the fault is injected (a broker hit, a newer attempt run to its end, time passing), the run
goes on. Crashes kill the process at the step itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kafka_eos import kafka_admin
from kafka_eos_lab.chaos import brokers
from kafka_eos_lab.chaos.checks import Counts, Verifier, count, iceberg_writes, sql_writes, wait_settled
from kafka_eos.local.kafka import LocalCluster
from kafka_eos.sample_data import produce_orders
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec, parse_spec

#: The sinks every scenario runs against.
SINKS = ("atomic", "per_partition", "sql", "iceberg")
#: The sinks whose checkpoint is their own store's, mirrored to the Kafka group after their commit.
MIRRORED = ("sql", "iceberg")
#: The steps of a commit a fault can hit, and the fail point that marks each per sink (None: the
#: sink has no such step). A SQL or Iceberg sink writes no records to Kafka: its "produce" is the
#: database transaction (the catalog commit, its dead letters' snapshot committed before), its
#: "offsets" the Kafka mirror after that commit ("committed" too: the mirror is the run's last step).
STEPS = {
    "produce": {"atomic": "after_produce", "per_partition": "after_produce", "sql": "before_sql_commit",
                "iceberg": "before_iceberg_commit"},
    "offsets": {"atomic": "before_offsets", "per_partition": "before_offsets", "sql": "after_sql_commit",
                "iceberg": "after_iceberg_commit"},
    "commit": {"atomic": "before_commit", "per_partition": "before_commit", "sql": None, "iceberg": None},
    "committed": {"atomic": "after_commit", "per_partition": "after_commit", "sql": None, "iceberg": None},
}
#: Input: transactions of 50 records, every 3rd aborted; 400 of 600 records committed.
RECORDS, PER_TRANSACTION, ABORT_EVERY = 600, 50, 3
#: A stopped broker stays stopped longer than the clients' request timeout (30 s) and the
#: controller's session timeout (9 s): its requests time out and its partitions move.
STOP_S = 40.0
#: The stall scenario's transaction timeout, and how long the producer stalls past it.
STALL_TIMEOUT_S, STALL_S = 15, 25.0
#: A killed or terminated broker comes back this long after the fault, while the run goes on.
DOWN_S = 8.0
#: Retries with the same run id after a failed attempt (Airflow's retries of the Spark task).
RETRIES = 3
#: Every attempt of a cell's run has this run id: a retry of the same run, as a task's retry.
RUN_ID = "chaos-run"
#: One ``kafka-eos run`` at most: Spark's start, the faults' timeouts, a coordinator moving.
RUN_TIMEOUT_S = 600.0
#: How long a paused run may take to reach its fail point.
REACH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Scenario:
    """A fault and where it lands.

    :param kind: ``broker`` (``target`` hit with ``action`` at ``step``), ``crash`` (the process
        that commits is SIGKILLed at ``step``: the driver, or in per_partition scope an executor's
        Python worker), ``zombie`` (paused at ``step`` while a newer attempt runs; then resumed),
        ``stall`` (paused at ``step`` past the transaction timeout).
    :param target: ``leader`` (of output partition 0; SQL, Iceberg: of source partition 0) or
        ``coordinator`` (the transaction coordinator; SQL, Iceberg: the group coordinator that the
        mirror writes to).
    """

    name: str
    kind: str
    step: str
    target: str | None = None
    action: str | None = None
    sinks: tuple[str, ...] = SINKS

    def point(self, sink: str) -> str | None:
        return STEPS[self.step][sink] if sink in self.sinks else None


def _broker_scenarios() -> list[Scenario]:
    found = []
    for target in ("leader", "coordinator"):
        for action, word in (("kill", "SIGKILL"), ("term", "SIGTERM")):
            for step in ("produce", "offsets", "commit"):
                found.append(Scenario(f"{target} {word} during {step}", "broker", step, target, action))
    return found


SCENARIOS: list[Scenario] = [
    *_broker_scenarios(),
    Scenario("leader SIGSTOP past the request timeout at commit", "broker", "commit", "leader", "stop"),
    Scenario("coordinator SIGSTOP past the request timeout at commit", "broker", "commit", "coordinator", "stop"),
    *[Scenario(f"process SIGKILL at {step}", "crash", step) for step in ("produce", "offsets", "commit", "committed")],
    Scenario("zombie resumes after a newer attempt committed", "zombie", "commit",
             sinks=("atomic", "per_partition")),
    Scenario("zombie resumes after a newer attempt committed", "zombie", "offsets", sinks=MIRRORED),
    Scenario("producer stalled past transaction.timeout.ms", "stall", "produce", sinks=("atomic", "per_partition")),
]
#: The few that ``make test`` runs: one per sink and kind of fault, and the driver killed between
#: sending the offsets and committing (the matrix found planning stuck behind that transaction).
QUICK = [("coordinator SIGKILL during commit", "atomic"), ("process SIGKILL at produce", "per_partition"),
         ("leader SIGTERM during offsets", "sql"), ("process SIGKILL at commit", "atomic")]


@dataclass
class Outcome:
    scenario: str
    sink: str
    exits: list[int] = field(default_factory=list)
    fault: str = ""
    seconds: float = 0.0
    counts: Counts | None = None
    error: str = ""

    @property
    def anomalies(self) -> int:
        if self.error or self.counts is None:
            return 1
        return self.counts.anomalies() + (self.exits[-1] != 0)


def spec_for(name: str, sink: str, folder: Path, transaction_timeout_s: int = 300) -> PipelineSpec:
    """A pipeline over fresh topics for one cell of the matrix, its spec file written to ``folder``."""
    source = {"topics": [f"{name}.in"]}
    if sink == "sql":
        doc = {"name": name, "source": source, "transform": "kafka_eos_lab.chaos.transforms:times_per_id",
               "sink": {"kind": "sql", "table": "chaos_times", "key_columns": ["order_id"], "merge": "add",
                        "url": f"sqlite:///{folder / 'sink.db'}"}}
    elif sink == "iceberg":  # appended rows: a duplicate shows as an order id's second row
        doc = {"name": name, "source": source, "transform": "kafka_eos_lab.chaos.transforms:times_per_id",
               "sink": {"kind": "iceberg", "table": "chaos.times", "url": f"sqlite:///{folder / 'catalog.db'}",
                        "warehouse": (folder / "warehouse").as_uri()}}
    else:
        doc = {"name": name, "source": source, "transform": "identity",
               "sink": {"kind": "kafka", "commit": sink, "topic": f"{name}.out", "dlq_topic": f"{name}.dlq",
                        "transaction_timeout_s": transaction_timeout_s}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return parse_spec(doc, str(path))


class Cell:
    """One scenario on one sink: its topics, its run processes and its fault."""

    def __init__(self, cluster: LocalCluster, scenario: Scenario, sink: str, name: str, folder: Path,
                 spark_remote: str | None = None,
                 retry: Callable[[PipelineSpec, KafkaSettings, str], None] | None = None) -> None:
        self.cluster, self.scenario, self.sink = cluster, scenario, sink
        self.spark_remote, self.retry = spark_remote, retry
        self.settings = KafkaSettings(cluster.bootstrap)
        self.folder = folder
        self.pauses = folder / "pauses"
        self.pauses.mkdir(parents=True)
        timeout = STALL_TIMEOUT_S if scenario.kind == "stall" else 300
        self.spec = spec_for(name, sink, folder, timeout)
        self.outcome = Outcome(scenario.name, sink)
        self._started = 0  # run processes started (each logs to run-<n>.log)

    def run(self) -> Outcome:
        started = time.monotonic()
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - a cell that broke is an anomaly in the table
            self.outcome.error = f"{type(exc).__name__}: {exc}"
        self.outcome.seconds = round(time.monotonic() - started, 1)
        return self.outcome

    def _run(self) -> None:
        spec, settings = self.spec, self.settings
        topics = {spec.source.topics[0]: 3}
        if spec.sink.kind == "kafka":
            topics.update({spec.sink.topic: 3, spec.sink.dlq_topic: 1})
        kafka_admin.create_topics(settings, topics)
        truth = produce_orders(settings, spec.source.topics[0], RECORDS, per_transaction=PER_TRANSACTION,
                               abort_every=ABORT_EVERY, malformed_every=0, transactional_id=f"{spec.name}.input")
        verifier = None
        if spec.sink.kind == "kafka":
            verifier = Verifier(settings, spec.sink.topic, 3)
            verifier.start()
        healer = self._attempt_with_fault()
        while self.outcome.exits[-1] != 0 and len(self.outcome.exits) <= RETRIES:
            self.outcome.exits.append(self._retried())
        if healer is not None:
            healer.join()
        brokers.wait_in_sync(settings)
        wait_settled(settings, spec, timeout_s=10)
        written = verifier.finish() if verifier is not None else \
            iceberg_writes(spec) if spec.sink.kind == "iceberg" else sql_writes(spec)
        self.outcome.counts = count(settings, spec, truth, written)

    # -- attempts and faults -----------------------------------------------------------------
    def _kafka_eos_run(self, **fault_env: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_EOS_CRASH", "KAFKA_EOS_PAUSE"))}
        env.update(fault_env, SPARK_LOCAL_IP="127.0.0.1")
        # The child writes to its own copy of the file; this one closes at once.
        self._started += 1
        with open(self.folder / f"run-{self._started}.log", "w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "kafka_eos.cli", "run", str(Path(self.spec.path)), "--run-id", RUN_ID,
                 "--bootstrap", self.settings.bootstrap_servers, "--json",
                 *(["--spark-remote", self.spark_remote] if self.spark_remote else [])],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _retried(self) -> int:
        """A retry of the run (its run id, as a task's retry): a ``kafka-eos run`` process, or
        ``retry`` in this process (the quick cells in ``make test``: the fault is in the first
        attempt's process; the retry needs no JVM of its own). Its exit code."""
        if self.retry is None:
            return self._kafka_eos_run().wait(RUN_TIMEOUT_S)
        self._started += 1
        try:
            self.retry(self.spec, self.settings, RUN_ID)
        except Exception as exc:  # noqa: BLE001 - a failed retry is an exit code, as a process's
            (self.folder / f"run-{self._started}.log").write_text(f"in-process retry: {type(exc).__name__}: {exc}\n")
            return 1
        return 0

    def _attempt_with_fault(self) -> threading.Thread | None:
        """The first attempt, meeting the scenario's fault; returns the thread that heals a broker."""
        s, point = self.scenario, self.scenario.point(self.sink)
        if s.kind == "crash":
            self.outcome.fault = f"SIGKILL at {point}"
            self.outcome.exits.append(self._kafka_eos_run(KAFKA_EOS_CRASH_AT=point).wait(RUN_TIMEOUT_S))
            return None
        first = self._kafka_eos_run(KAFKA_EOS_PAUSE_AT=point, KAFKA_EOS_PAUSE_DIR=str(self.pauses))
        self._wait_reached(point, first)
        healer = None
        if s.kind == "broker":
            node = self._target()
            brokers.hit(self.cluster, node, s.action)
            self.outcome.fault = f"{s.action} node {node} at {point}"
            healer = threading.Thread(target=self._heal, args=(node, s.action), daemon=True)
            healer.start()
        elif s.kind == "zombie":
            newer = self._kafka_eos_run().wait(RUN_TIMEOUT_S)
            self.outcome.fault = f"paused at {point}; a newer attempt exited {newer}"
            if newer != 0:  # it must take over from the paused one, not wait for it
                self.outcome.error = f"the newer attempt failed (exit {newer}) while the older one was paused"
        elif s.kind == "stall":
            time.sleep(STALL_S)
            self.outcome.fault = f"paused {STALL_S:g}s at {point} (timeout {STALL_TIMEOUT_S}s)"
        (self.pauses / f"{point}.go").touch()
        self.outcome.exits.append(first.wait(RUN_TIMEOUT_S))
        return healer

    def _wait_reached(self, point: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + REACH_TIMEOUT_S
        while not (self.pauses / f"{point}.reached").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"the run exited ({proc.returncode}) before it reached {point}; see {self.folder}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not reach {point} within {REACH_TIMEOUT_S:g}s; see {self.folder}")
            time.sleep(0.1)

    def _target(self) -> int:
        spec, settings = self.spec, self.settings
        if self.scenario.target == "leader":
            topic = spec.sink.topic if spec.sink.kind == "kafka" else spec.source.topics[0]
            return brokers.leader_of(settings, topic, 0)
        if spec.sink.kind != "kafka":
            return brokers.coordinator_of(settings, brokers.CONSUMER_OFFSETS, spec.source.group_id)
        txid = spec.transactional_id() if spec.sink.commit == "atomic" else \
            spec.transactional_id(spec.source.topics[0], 0)
        return brokers.coordinator_of(settings, brokers.TRANSACTION_STATE, txid)

    def _heal(self, node: int, action: str) -> None:
        time.sleep(STOP_S if action == "stop" else DOWN_S)
        brokers.heal(self.cluster, node, action)


def run_matrix(cluster: LocalCluster, cells: list[tuple[Scenario, str]], folder: Path | None = None,
               on_outcome=lambda o: None, spark_remote: str | None = None, retry=None) -> list[Outcome]:
    """Run each (scenario, sink) on the cluster, one after another; ``on_outcome`` sees each as it ends.

    :param retry: runs a cell's retries in this process (``retry(spec, settings, run_id)``, raising
        if the run fails) instead of in ``kafka-eos run`` processes; the attempt that meets the
        fault is always a process of its own.
    :param spark_remote: the runs' Spark Connect server (``kafka-eos run --spark-remote``); None:
        each run's own in-process Spark. A crash in per_partition scope then kills the server's
        Python worker that commits, not the server.
    """
    folder = folder or Path(tempfile.mkdtemp(prefix="kafka-eos-chaos-"))
    outcomes = []
    stamp = time.strftime("%H%M%S")
    for i, (scenario, sink) in enumerate(cells):
        name = f"chaos-{stamp}-{i:02d}-{sink.replace('_', '-')}"
        outcome = Cell(cluster, scenario, sink, name, folder / name, spark_remote, retry).run()
        outcomes.append(outcome)
        on_outcome(outcome)
    return outcomes


def cells_of(names: list[str] | None = None, sinks: list[str] | None = None, quick: bool = False):
    """The (scenario, sink) pairs to run: all of them, the quick few, or those named."""
    if quick:
        by_name = {s.name: s for s in SCENARIOS}
        return [(by_name[n], sink) for n, sink in QUICK]
    return [(s, sink) for s in SCENARIOS if not names or any(n in s.name for n in names)
            for sink in (sinks or SINKS) if s.point(sink) is not None]


def outcome_json(outcome: Outcome) -> str:
    return json.dumps({**outcome.__dict__, "counts": outcome.counts.__dict__ if outcome.counts else None})
