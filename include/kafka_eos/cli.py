"""``kafka-eos``: the command line (docs/cli.md).

Exit code 0 on success, else non-zero with a one-line reason on stderr. Results go to stdout
(``--json`` for scripts); steps and progress go to stderr; librdkafka's and Spark's own log lines
go to files under .local/logs/ (``-v`` shows them).
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import logging
import os
import re
import sys
import time
from datetime import datetime, timezone
from importlib import metadata

# The modules each command runs are imported in its function, not here: every command, `--help`
# and the quick ones (status, checkpoint, pipelines) included, would otherwise load them all,
# SQLAlchemy and the local Airflow's and Spark's helpers among them (0.5 s a start instead of 0.15 s).
from kafka_eos.console import Console, ReaderMayGo, elapsed_since, seconds, table
from kafka_eos.errors import EXIT_HELD, KafkaEosError, PipelineHeld, RangeMismatch, task_traceback
from kafka_eos.kafka_admin import shared_admin_clients
from kafka_eos.local.kafka import SUPER_USER, LocalBroker, LocalCluster
from kafka_eos.settings import BOOTSTRAP_ENV, CONNECT_TIMEOUT_ENV, KafkaSettings
from kafka_eos.spec import PipelineSpec, load_spec, spec_paths, specs_folder
from kafka_eos.stream import DEFAULT_INTERVAL_S

log = logging.getLogger("kafka_eos.cli")

#: Exit codes: 1 a kafka-eos error (bad input, Kafka refused, a check failed), 2 anything else;
#: 3 ``txn hanging`` found partitions held by open transactions (and the like: docs/cli.md);
#: 4 a range committed short, or a pipeline held for one: a person must act, a retry cannot.
EXIT_ERROR, EXIT_UNEXPECTED, EXIT_FOUND = 1, 2, 3


def _settings(args) -> KafkaSettings:
    """Kafka settings of this command, checked to answer within the connect timeout."""
    from kafka_eos.kafka_admin import check_reachable

    local = LocalBroker.default()
    settings = KafkaSettings.from_environ(os.environ, args.bootstrap, local.bootstrap, _local_registry_url())
    named = args.bootstrap or os.environ.get(BOOTSTRAP_ENV)  # a cluster named is asked, whatever runs here
    if not named and not local.is_running():
        raise KafkaEosError(f"the local broker is not running: `kafka-eos kafka start` (or pass --bootstrap "
                            f"or set {BOOTSTRAP_ENV})")
    check_reachable(settings)
    return settings


def _local_registry_url() -> str:
    """The embedded registry's URL: where the CLI finds a Schema Registry when none is named."""
    from kafka_eos.local.registry import LocalRegistry

    return LocalRegistry.default().url


def _spec(args, import_transform: bool = True) -> PipelineSpec:
    spec = load_spec(args.pipeline, import_transform=import_transform)
    if getattr(args, "max_records", None):
        spec = dataclasses.replace(spec, source=dataclasses.replace(
            spec.source, max_records_per_partition=args.max_records))
    return spec


#: A look's line where the group's offsets are pending in an open transaction.
_PENDING = ("PENDING: the offsets of group {group!r} are held by an open transaction (an attempt killed between "
            "sending its offsets and its commit, or one committing now): shown as they were before it; the next "
            "`kafka-eos run` fences it and goes on (else it ends at its transaction timeout)")


def _print_drift(drift) -> None:
    for d in drift:
        print(f"  DRIFT {d.topic}-{d.partition}: the sink's own checkpoint at {d.sink}, Kafka mirror at {d.kafka} "
              "(`kafka-eos run` repairs it)")


def _pinned(settings: KafkaSettings, tps, spec: PipelineSpec) -> list:
    """The partitions of ``tps`` whose LSO an open transaction holds now (any age), with their
    holder where Kafka's admin API says: committed records behind it wait."""
    from kafka_eos.health.attribute import attribute
    from kafka_eos.health.detect import find_stalls

    return attribute(settings, find_stalls(settings, tps, older_than_s=0), [spec])


def _print_pinned(stalls) -> None:
    for s in stalls:
        print(f"  PINNED {s.summary()}")


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, default=str))


def cmd_kafka(args) -> int:
    broker, cluster = LocalBroker.default(), LocalCluster.default()
    if args.secure or args.action == "user":
        return _secure_broker(args)
    if args.action == "start":
        if args.brokers == 1:
            Console().step(f"starting the local broker (data and logs under {broker.home})")
            print(broker.start())
        else:
            Console().step(f"starting a local cluster of {cluster.size} brokers (data and logs under {cluster.home})")
            print(cluster.start())
    elif args.action == "stop":
        stopped = [what for what, thing in (("the broker", broker), ("the cluster", cluster)) if thing.stop()]
        print(f"stopped {' and '.join(stopped)}" if stopped else "not running")
    else:
        running = [thing.bootstrap for thing in (broker, cluster) if thing.is_running()]
        if not running:
            print(f"not running ({broker.bootstrap}; cluster {cluster.bootstrap})", file=sys.stderr)
            return 3
        print("\n".join(running))
    return 0


def _secure_broker(args) -> int:
    broker = LocalBroker.secure_default()
    if args.action == "start":
        Console().step(f"starting the secured local broker: SASL_SSL (SCRAM-SHA-512), ACLs required "
                       f"(data, logs, certificates and users under {broker.home})")
        print(broker.start())
        print(f"super user {SUPER_USER} (set-up only): "
              f"KAFKA_EOS_CLIENT_CONFIG_FILE={broker.user_config_file(SUPER_USER)}", file=sys.stderr)
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running")
    elif args.action == "user":
        if not args.name or args.name == SUPER_USER:
            raise KafkaEosError(f"kafka user: name a user other than the super user {SUPER_USER!r} "
                                "(kafka-eos kafka user NAME)")
        if not broker.is_running():
            raise KafkaEosError(f"the secured broker is not running ({broker.bootstrap}): "
                                "kafka-eos kafka start --secure")
        path = broker.add_user(args.name)
        print(path)
        print(f"user User:{args.name} may do nothing until ACLs allow it: kafka-eos acls PIPELINE "
              f"--principal User:{args.name} --apply (as {SUPER_USER})", file=sys.stderr)
    else:
        if not broker.is_running():
            print(f"not running ({broker.bootstrap})", file=sys.stderr)
            return 3
        print(broker.bootstrap)
    return 0


def cmd_airflow(args) -> int:
    from kafka_eos.local.airflow import ADMIN, LocalAirflow

    # Only a start needs the cluster to answer: stop and status work without it.
    airflow = LocalAirflow.default(_settings(args) if args.action == "start" else
                                   KafkaSettings.from_environ(os.environ, args.bootstrap, LocalBroker.default().bootstrap,
                                                              _local_registry_url()),
                                   args.executor if args.action == "start" else None)
    if args.action == "start":
        Console().step(f"starting Airflow ({', '.join(airflow.components)}; state under {airflow.home})")
        print(f"{airflow.start()}  (login {ADMIN}, password in {airflow.home / 'simple_auth_manager_passwords.json.generated'})")
    elif args.action == "stop":
        airflow.stop()
        print("stopped")
    elif args.action == "trigger":
        return _trigger(airflow, args)
    else:
        if not airflow.healthy():
            print(f"not running ({airflow.url})", file=sys.stderr)
            return 3
        print(airflow.url)
    return 0


def _trigger(airflow, args) -> int:
    """``kafka-eos airflow trigger DAG_ID``: a run of the DAG on the local Airflow (unpaused first);
    with --wait, until it ends: its state and its tasks' states."""
    import urllib.parse

    if not args.dag_id:
        raise KafkaEosError("airflow trigger: name the DAG to run (kafka_eos__<pipeline>)")
    if not airflow.healthy():
        raise KafkaEosError(f"airflow trigger: no local Airflow answers at {airflow.url}: `kafka-eos airflow start`")
    try:
        conf = json.loads(args.conf) if args.conf else {}
    except ValueError as exc:
        raise KafkaEosError(f"--conf: not a JSON object ({exc})") from None
    airflow.wait_for_dag(args.dag_id)
    run = airflow.api("POST", f"/api/v2/dags/{args.dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    print(f"{args.dag_id}: run {run['dag_run_id']} {run['state']}  ({airflow.url}/dags/{args.dag_id})")
    if not args.wait:
        return 0
    path = f"/api/v2/dags/{args.dag_id}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
    while (run := airflow.api("GET", path))["state"] not in ("success", "failed"):
        time.sleep(2)
    tasks = airflow.api("GET", f"{path}/taskInstances")["task_instances"]
    print(f"{args.dag_id}: run {run['dag_run_id']} {run['state']}: "
          + ", ".join(f"{t['task_id']} {t['state']}" for t in tasks)
          + (f"; {note}" if (note := airflow.run_note(args.dag_id, run["dag_run_id"])) else ""))
    # Unpausing lets the scheduler start the DAG's latest scheduled run at the same moment; when
    # that run committed the records, this one found nothing new: say so, with what it committed.
    triggered = datetime.fromisoformat(run["run_after"])  # a manual run's: when it was triggered
    for other in airflow.api("GET", f"/api/v2/dags/{args.dag_id}/dagRuns?limit=100")["dag_runs"]:
        ended = other.get("end_date")
        if other["dag_run_id"] == run["dag_run_id"] or (ended and datetime.fromisoformat(ended) < triggered):
            continue  # this run, or one that ended before it was triggered
        print(f"{args.dag_id}: meanwhile run {other['dag_run_id']} {other['state']}"
              + (f"; {note}" if (note := airflow.run_note(args.dag_id, other["dag_run_id"])) else ""))
    return 0 if run["state"] == "success" else EXIT_ERROR


def cmd_spark(args) -> int:
    from kafka_eos.local.spark import LocalSparkCluster

    if args.connect:
        return _spark_connect(args.action)
    if args.action == "jars":
        from kafka_eos.paths import jars_dir
        from kafka_eos.spark_io import connector_package, fetch_connector

        dest = jars_dir("spark")
        Console().step(f"fetching {connector_package()} and its dependencies from Maven Central into {dest}")
        jars = fetch_connector(dest)
        print(f"{len(jars)} jar(s) in {dest}")
        return 0
    cluster = LocalSparkCluster.default()
    if args.action == "start":
        Console().step(f"starting a Spark master and {cluster.workers} workers on {cluster.master_url} "
                       f"(UI {cluster.ui_url}; logs and work dirs under {cluster.home})")
        print(cluster.start())
    elif args.action == "stop":
        print("stopped" if cluster.stop() else "not running")
    else:
        workers = cluster.alive_workers()
        if cluster.status() is None:
            print(f"not running ({cluster.master_url})", file=sys.stderr)
            return 3
        print(f"{cluster.master_url}  ({len(workers)} worker(s) alive, "
              f"{sum(w['cores'] for w in workers)} core(s); UI {cluster.ui_url})")
    return 0


def cmd_registry(args) -> int:
    from kafka_eos.local.registry import LocalRegistry

    registry = LocalRegistry.default()
    return _local_service(args.action, registry, registry.url, f"starting the local Schema Registry (Apicurio "
                          f"Registry; data and log under {registry.home})", registry.url)


def _spark_connect(action: str) -> int:
    from kafka_eos.local.spark_connect import LocalSparkConnect

    server = LocalSparkConnect.default()
    return _local_service(action, server, server.url, f"starting a Spark Connect server on {server.url} (master "
                          f"{server.master}; log {server.log_file})",
                          f"{server.url}  (master {server.master}; log {server.log_file})")


def _local_service(action: str, service, address: str, starting: str, status: str) -> int:
    """start, stop or status of a local service (``start()`` returns its address, ``stop()``
    whether it ran, ``is_running()``); status exits 3 when it is not running."""
    if action == "start":
        Console().step(starting)
        print(service.start())
    elif action == "stop":
        print("stopped" if service.stop() else "not running")
    elif not service.is_running():
        print(f"not running ({address})", file=sys.stderr)
        return 3
    else:
        print(status)
    return 0


def cmd_plan(args) -> int:
    from kafka_eos.manifest import ManifestStore
    from kafka_eos.pipeline import looked_plan

    spec, settings = _spec(args, import_transform=False), _settings(args)
    plan, drift, pending = looked_plan(spec, settings, args.run_id or "next")
    held = ManifestStore.of(spec, settings).state().held  # no run takes this plan while held
    if args.json:
        _print_json({"plan": json.loads(plan.to_json()), "drift": [dataclasses.asdict(d) for d in drift],
                     "held": held, "pending": pending})
        return 0
    if pending:
        print(_PENDING.format(group=spec.source.group_id) + "; this plan starts from them, and a run plans again")
    if held is not None:
        print(f"HELD since {held['found_at']}: {held['mismatch']}; no run takes this plan until an operator "
              f"acknowledges it (kafka-eos acknowledge {spec.name})")
    offsets = plan.offsets
    print(f"pipeline {spec.name}: " + ("nothing to do, every checkpoint is at its partition's LSO"
                                       if plan.is_empty else
                                       f"{len(plan.active)} partition(s), up to {offsets} offsets"))
    if plan.ranges:
        print(table([(f"{r.topic}-{r.partition}", r.expected, r.from_offset, r.until, r.until - r.from_offset)
                     for r in plan.ranges], ("partition", "checkpoint", "from", "until", "offsets")))
    for s in plan.skipped:
        print(f"  SKIPPED (data loss) {s.topic}-{s.partition}: [{s.from_offset}, {s.until})")
    _print_drift(drift)
    return 0


def cmd_run(args) -> int:
    from kafka_eos import acls
    from kafka_eos.batch import RunSummary, run_batch
    from kafka_eos.lease import refuse_if_streaming
    from kafka_eos.logs import child_stderr_to, pyspark_loggers_to_cli_log, spark_log4j_options, spark_log_file
    from kafka_eos.manifest import ManifestStore
    from kafka_eos.pipeline import prepare_plan, verify
    from kafka_eos.spark_io import check_reachable, end_session, get_session

    console = Console(quiet=args.json)
    started = time.monotonic()
    if args.spark_remote:
        # The transform's module is imported with the spec, before the session: a UDF it makes on
        # import (`@F.udf`) must be a Spark Connect one, which PySpark makes where this is set (as
        # its own remote sessions set it). Classic ones need a SparkContext this process never has.
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    spec, settings = _spec(args), _settings(args)
    console.step(f"kafka-eos run {spec.name}: Kafka at {settings.bootstrap_servers}, "
                 f"{spec.sink.kind} sink, {spec.sink.commit} commit")
    if args.spark_remote:
        check_reachable(args.spark_remote)  # before the plan is stored, not after
    # Before anything is written: every permission a run of this pipeline needs.
    acls.check(spec, settings, spec_ref=args.pipeline)
    refuse_if_streaming(spec, settings)
    run_id = args.run_id or "manual__" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    # A run id given again: is its stored plan the one that applies (said below when it is empty)?
    stored = ManifestStore.of(spec, settings).stored_plan(run_id) if args.run_id else None
    plan = prepare_plan(spec, settings, run_id)
    if plan.is_empty:
        summary = RunSummary(spec.name, run_id, "empty", spec.sink.kind, 0, 0, 0, 0,
                             round(time.monotonic() - started, 3))
    else:
        offsets = plan.offsets
        console.step(f"  plan   {len(plan.active)} partition(s), up to {offsets} offsets (run {run_id})")
        console.step("  spark  reading, transforming and committing " +
                     (f"(Spark Connect server {args.spark_remote})" if args.spark_remote else
                      f"(Spark's log: {spark_log_file()})"))
        with child_stderr_to(spark_log_file(), enabled=not args.verbose):
            spark = get_session(f"kafka-eos {spec.name}", driver_java_options=spark_log4j_options(args.verbose),
                                remote=args.spark_remote, conf=spec.spark_conf, pipeline=spec.name)
        if not args.verbose:
            pyspark_loggers_to_cli_log()
        try:
            with console.spark_progress(spark):
                summary = run_batch(spark, spec, plan, settings)
        finally:
            if args.spark_remote:
                end_session(spark)  # the pipeline's session of the server waits for its next run
        console.step("  verify every checkpoint is at its range's end")
        verify(spec, settings, plan)
    pinned = _pinned(settings, [r.tp for r in plan.ranges], spec)
    if args.json:
        _print_json({**summary.as_dict(), "pinned": [s.as_dict() for s in pinned]})
        return 0
    if summary.status == "empty":
        if stored is not None and stored.created_at == plan.created_at:  # an earlier attempt's plan applies
            made_at = datetime.fromisoformat(plan.created_at)
            print(f"run {run_id}: nothing to do: its plan, made at {made_at.strftime('%Y-%m-%d %H:%M:%S')} UTC by an "
                  f"earlier attempt, is empty (a run keeps its plan; records since then go to the next run) "
                  f"({elapsed_since(started)})")
        else:
            print(f"run {run_id}: nothing to do, every checkpoint is at its partition's LSO "
                  f"({elapsed_since(started)})")
        _print_pinned(pinned)
        return 0
    verb = {"committed": "committed", "noop": "already committed by an earlier attempt"}[summary.status]
    print(f"run {run_id}: {verb} in {elapsed_since(started)} ({seconds(summary.seconds)} in Spark and "
          f"commit): in {summary.records_in}, out {summary.records_out}, dead letters {summary.dead_letters}")
    print(table([(f"{r['topic']}-{r['partition']}", r["from"], r["until"], r.get("records_in"),
                  r.get("records_out"), r.get("dead_letters")) for r in summary.ranges],
                ("partition", "from", "until", "in", "out", "dead")))
    _print_pinned(pinned)
    return 0


def cmd_stream(args) -> int:
    import signal

    from kafka_eos.logs import child_stderr_to, pyspark_loggers_to_cli_log, spark_log4j_options, spark_log_file
    from kafka_eos.manifest import ManifestStore
    from kafka_eos.pipeline import refuse_if_held
    from kafka_eos.spark_io import get_session
    from kafka_eos.stream import PARENT_PID_ENV, session_conf
    from kafka_eos.stream.loop import StreamRunner

    console = Console()
    spec, settings = _spec(args), _settings(args)
    refuse_if_held(spec, ManifestStore.of(spec, settings).state())  # before Spark starts (its first plan would)
    console.step(f"kafka-eos stream {spec.name}: Kafka at {settings.bootstrap_servers}, {spec.sink.kind} sink, "
                 f"{spec.sink.commit} commit, a batch at most every {args.interval:g} s "
                 f"(Spark's log: {spark_log_file()}); SIGTERM or Ctrl-C stops it after the batch in flight")
    with child_stderr_to(spark_log_file(), enabled=not args.verbose):
        spark = get_session(f"kafka-eos stream {spec.name}", driver_java_options=spark_log4j_options(args.verbose),
                            conf=session_conf(spec.spark_conf))
    if not args.verbose:
        pyspark_loggers_to_cli_log()

    def report(line: str) -> None:
        print(f"{datetime.now(timezone.utc).strftime('%H:%M:%S.%f')[:-3]} {line}", flush=True)

    observers: list = []
    if args.metrics_port is not None:
        from kafka_eos.stream.figures import PrometheusFigures

        prometheus = PrometheusFigures(spec.name, args.metrics_port, args.metrics_addr)
        observers.append(prometheus)
        console.step(f"metrics for Prometheus at http://{args.metrics_addr}:{args.metrics_port}/metrics")
    if args.figures:
        from kafka_eos.stream.figures import figures_line

        observers.append(lambda figures: print(figures_line(figures), flush=True))

    def observe(figures: dict) -> None:
        for observer in observers:
            observer(figures)

    runner = StreamRunner(spark, spec, settings, interval_s=args.interval, report=report,
                          max_batches=args.max_batches, stop_when_caught_up=args.until_caught_up, force=args.force,
                          observe=observe)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: runner.stop(signal.Signals(signum).name))
    parent = os.environ.get(PARENT_PID_ENV)
    if parent:  # started by a task (the stream DAG's): it ends when that task's process is gone
        runner.stop_with_parent(int(parent))
    stats = runner.run()
    console.step(f"stream {spec.name} stopped ({stats.stopped_by}): {stats.batches} batch(es), in {stats.records_in}, "
                 f"out {stats.records_out}, dead letters {stats.dead_letters}, failed batches {stats.failed_batches}")
    return 0


def cmd_checkpoint(args) -> int:
    from kafka_eos.health.backlog import backlog

    spec, settings = _spec(args, import_transform=False), _settings(args)
    if args.refresh:
        from kafka_eos.pipeline import refresh_checkpoints

        done = refresh_checkpoints(spec, settings, every=True)
        Console(quiet=args.json).step(
            f"{spec.name}: refresh skipped: {done.skipped}; the stream commits its own checkpoints again"
            if done.skipped else
            f"refreshed {len(done.partitions)} checkpoint(s) of {spec.name}, unchanged: the brokers' offsets "
            "retention counts from now" if done.partitions else f"{spec.name} has no checkpoint to refresh")
    rows, drift = backlog(spec, settings)
    pinned = _pinned(settings, [(r["topic"], r["partition"]) for r in rows], spec)
    lost = _lost_checkpoints(spec, settings, rows)
    if args.json:
        _print_json({"pipeline": spec.name, "group_id": spec.source.group_id, "partitions": rows,
                     "drift": [dataclasses.asdict(d) for d in drift], "pinned": [s.as_dict() for s in pinned],
                     "lost": lost})
        return 0
    print(f"pipeline {spec.name} (group {spec.source.group_id}); lag is counted to the LSO; oldest: age of the "
          "oldest committed record not processed yet")
    print(table([(f"{r['topic']}-{r['partition']}", r["checkpoint"], r["lso"], r["high_watermark"], r["lag"],
                  f"{r['oldest_unprocessed']['age_s']:g}s" if r["oldest_unprocessed"] else "-")
                 for r in rows], ("partition", "checkpoint", "LSO", "HW", "lag", "oldest")))
    _print_pinned(pinned)
    _print_drift(drift)
    group = spec.source.group_id
    if any(r["pending"] for r in rows):
        print("  " + _PENDING.format(group=group))
    for r in lost:
        where = f"{r['topic']}-{r['partition']}: group {group!r} has no committed offset"
        if r["offset"] is None:
            print(f"  LOST {where}, and the run manifest's memory of earlier checkpoints was cut by retention (a lost "
                  f"checkpoint or a new partition): runs refuse to plan; set its offset: kafka-consumer-groups --group "
                  f"{group} --topic {r['topic']}:{r['partition']} --reset-offsets --to-offset N --execute")
        else:
            held = (f"the group held {r['offset']} when the run manifest remembered it again at {r['committed_at']}"
                    if r["restored"] else f"run {r['run_id']!r} committed {r['offset']} at {r['committed_at']}")
            print(f"  LOST {where}, but {held} (the broker "
                  f"expired it, or the group was deleted): runs refuse to plan; restore it: kafka-consumer-groups "
                  f"--group {group} --topic {r['topic']}:{r['partition']} --reset-offsets --to-offset {r['offset']} "
                  "--execute")
    return 0


def _lost_checkpoints(spec: PipelineSpec, settings: KafkaSettings, rows: list[dict]) -> list[dict]:
    """The partitions of ``rows`` with no checkpoint in the group that runs refuse to plan (a Kafka
    sink's: the group's offsets are its checkpoints): ``topic``, ``partition``, and the last
    checkpoint kafka-eos committed there from the run manifest (``offset``, ``run_id``,
    ``committed_at``), or ``offset`` None where retention cut the manifest's memory."""
    if not spec.sink.about.transactional or all(r["checkpoint"] is not None for r in rows):
        return []
    from kafka_eos.manifest import ManifestStore

    state = ManifestStore.of(spec, settings).state()
    lost = []
    for r in rows:
        last = state.checkpoints.get((r["topic"], r["partition"]))
        if r["checkpoint"] is None and (last is not None or not state.complete):
            lost.append({"topic": r["topic"], "partition": r["partition"], "offset": last and last["offset"],
                         "run_id": last and last.get("run_id"), "committed_at": last and last.get("committed_at"),
                         "restored": bool(last and last.get("restored"))})
    return lost


def cmd_acknowledge(args) -> int:
    from kafka_eos.audit import AUDIT_TOPIC, write_audit
    from kafka_eos.manifest import ManifestStore, now_iso

    spec, settings = _spec(args, import_transform=False), _settings(args)
    store = ManifestStore.of(spec, settings)
    state = store.state()
    held = state.held
    if held is None or not args.yes:
        if args.json:
            _print_json({"pipeline": spec.name, "held": held, "acknowledged": None})
        elif held is None:
            print(f"pipeline {spec.name} is not held")
        else:
            print(f"pipeline {spec.name} is held since {held['found_at']}: {held['mismatch']}")
            print(f"dry run: nothing changed. Repair the range first (kafka-eos audit {spec.name} --run-id "
                  f"{held['run_id']} says where its missing records start), then add --yes: the pipeline plans "
                  "again from its checkpoint")
        return 0 if held is None else EXIT_FOUND
    who, at = getpass.getuser(), now_iso()
    # The audit record first: a hold is never released without one.
    write_audit(settings, f"acknowledge:{spec.name}:{at}", {
        "action": "acknowledge_hold", "pipeline": spec.name, "who": who, "via": "kafka-eos acknowledge", "at": at,
        "run_id": held["run_id"], "mismatch": held["mismatch"], "found_at": held["found_at"], "note": args.note})
    record, newer = store.acknowledge(held, state.read_upto, who=who, at=at, note=args.note)
    if args.json:
        _print_json({"pipeline": spec.name, "held": newer, "acknowledged": record})
    elif newer is None:
        print(f"acknowledged: pipeline {spec.name} plans again from its checkpoint; the finding of run "
              f"{held['run_id']!r} stays in its manifest, and this acknowledgement in {AUDIT_TOPIC}")
    else:
        print(f"acknowledged the finding of run {held['run_id']!r}, but another came in meanwhile: pipeline "
              f"{spec.name} stays held since {newer['found_at']}: {newer['mismatch']}; repair it too, then "
              f"kafka-eos acknowledge {spec.name} --yes")
    return 0 if newer is None else EXIT_FOUND


def cmd_audit(args) -> int:
    from kafka_eos.run_audit import audit_runs, partition_name, suspects

    spec, settings = _spec(args, import_transform=False), _settings(args)
    audits = audit_runs(spec, settings, args.run_id, args.last)
    short = suspects(audits)
    if args.json:
        _print_json({"pipeline": spec.name, "ranges": [a.as_dict() for a in audits],
                     "short": [a.as_dict() for a in short]})
    else:
        print(f"pipeline {spec.name}: committed runs' ranges counted again on the source (read_committed) against "
              "what each commit wrote (results + dead letters)")
        print(table([(a.run_id, partition_name(a), "-" if a.from_offset is None else f"[{a.from_offset}, {a.until})",
                      "-" if a.holds is None else a.holds, a.written, a.verdict, "yes" if a.proven else "no")
                     for a in audits], ("run", "partition", "range", "holds", "written", "verdict", "proof")))
        for a in short:
            resume = f"; the first of them is at offset {a.resume_at}" if a.resume_at is not None else ""
            print(f"kafka-eos: {a.run_id}: {partition_name(a)}: {a.holds - a.written} of {a.holds} committed records "
                  f"of [{a.from_offset}, {a.until}) are not in the output and its commit has no proof of read{resume} "
                  "(docs/operations.md, \"Auditing committed runs\")", file=sys.stderr)
    return EXIT_FOUND if short else 0


def cmd_pipelines(args) -> int:
    from kafka_eos.overview.snapshot import one_line, snapshot
    from kafka_eos.lease import stream_owners

    folder = specs_folder()  # before the broker is reached
    settings = _settings(args)
    found, specs = [], {}
    for path in spec_paths(folder):
        row: dict = {"name": path.stem, "spec": str(path)}
        found.append(row)
        try:
            spec = specs[str(path)] = load_spec(str(path), import_transform=False)
        except Exception as exc:  # noqa: BLE001 - a broken spec gets its own row, hides no other
            row["error"] = one_line(exc)
            continue
        row.update(name=spec.name, sink=spec.sink.kind, target=spec.sink.target,
                   commit=spec.sink.commit)
    # What the operator page reads, in its batched reads (one offsets query for every partition of
    # every pipeline), with the newest run of each; and every stream's lease, in one request.
    entries = dict(zip(specs, snapshot(settings, specs.values(), runs=1)))
    owners = stream_owners(specs.values(), settings)
    for row in found:
        entry = entries.get(row["spec"])
        if entry is None:
            continue
        owner = owners[row["name"]]
        if entry["error"] or isinstance(owner, Exception):
            row["error"] = entry["error"] or one_line(owner)
            continue
        row["lag"] = entry["lag"]
        last = entry["runs"][0] if entry["runs"] else None
        row["last_run"] = None if last is None else {
            "run_id": last["run_id"], "status": last["status"], "at": last["at"],
            **({"stream_batch": last["stream_batch"]} if "stream_batch" in last else {})}
        row["streaming"] = None if owner is None else owner.client_id
        row["held"] = entry["held"]
        row["pending"] = any(p["pending"] for p in entry.get("partitions") or [])
    if args.json:
        _print_json({"pipelines": found})
        return 0
    def last_run(r: dict) -> str:
        if "error" in r:
            return "error (below)"
        last = r.get("last_run")
        text = "none" if last is None else f"{last['status']} {(last['at'] or '')[:16].replace('T', ' ')}"
        if last is not None and "stream_batch" in last:
            text += f" (stream batch {last['stream_batch']})"
        if r.get("held"):
            text += ", HELD (below)"
        return text + (f", streaming now in {r['streaming']}" if r.get("streaming") else "")

    print(table([(r["name"], r.get("sink"), r.get("target"), r.get("commit"), r.get("lag"), last_run(r))
                 for r in found], ("pipeline", "sink", "writes to", "commit", "lag", "last run (UTC)")))
    for r in found:
        if "error" in r:
            print(f"  {r['name']}: {r['error']}")
        elif r.get("held"):
            print(f"  {r['name']}: held since {r['held']['found_at']}: {r['held']['mismatch']}; "
                  f"kafka-eos acknowledge {r['name']} --yes ends it")
        if r.get("pending"):
            print(f"  {r['name']}: " + _PENDING.format(group=specs[r["spec"]].source.group_id))
    return 0


def cmd_txn_hanging(args) -> int:
    from kafka_eos.health import abort_command
    from kafka_eos.health.attribute import attribute
    from kafka_eos.health.detect import find_stalls, topic_partitions
    from kafka_eos.spec import bundled_specs

    from kafka_eos.health import watch_threshold_s

    settings = _settings(args)
    specs = bundled_specs()
    if args.older_than is None:
        args.older_than = watch_threshold_s(s.sink.transaction_timeout_s for s in specs)
    tps = topic_partitions(settings, args.topic)
    stalls = attribute(settings, find_stalls(settings, tps, args.older_than), specs)
    if args.json:
        _print_json({"older_than_s": args.older_than, "partitions_checked": len(tps),
                     "stalled": [s.as_dict() for s in stalls]})
        return EXIT_FOUND if stalls else 0
    if not stalls:
        print(f"no partition held by an open transaction for longer than {seconds(args.older_than)} "
              f"({len(tps)} partitions checked)")
        return 0
    print(f"{len(stalls)} partition(s) held by an open transaction for longer than {seconds(args.older_than)} "
          f"({len(tps)} checked); read_committed readers stop at the LSO:")
    rows = []
    for s in stalls:
        c = s.culprit or {}
        rows.append((f"{s.topic}-{s.partition}", s.lso, s.high_watermark, s.waiting,
                     "?" if s.stuck_s is None else seconds(s.stuck_s), c.get("producer_id", "?"),
                     c.get("transactional_id") or "-", c.get("pipeline") or "-", c.get("verdict", "?")))
    print(table(rows, ("partition", "LSO", "HW", "waiting", "open for", "producer", "transactional.id",
                       "pipeline", "verdict")))
    for s in stalls:
        if s.attribution_error:
            print(f"  {s.topic}-{s.partition}: attribution unavailable: {s.attribution_error}")
        elif s.culprit and s.culprit["verdict"] == "long-running" and s.culprit["transaction_timeout_s"]:
            print(f"  {s.topic}-{s.partition}: the coordinator aborts it at its "
                  f"{seconds(s.culprit['transaction_timeout_s'])} timeout unless it commits first")
    first = stalls[0]
    print(f"To abort one (a dry run first): {abort_command(first.topic, first.partition, first.lso)}")
    return EXIT_FOUND


def cmd_txn_abort(args) -> int:
    from kafka_eos.audit import AUDIT_TOPIC
    from kafka_eos.health.abort import attempt_abort, check_abort, find_open_transaction, outcome_text
    from kafka_eos.spec import bundled_specs

    settings = _settings(args)
    specs = bundled_specs()
    if not args.yes:
        txn = find_open_transaction(settings, args.topic, args.partition, args.start_offset, specs)
        _print_open_transaction(args.topic, args.partition, txn)
        guard = check_abort(settings, args.topic, args.partition, txn, older_than_s=args.older_than,
                            force=args.force, specs=specs)
        how = "fencing its transactional.id" if guard["method"] == "fence" else "an abort marker on this partition"
        age = "an unknown time" if guard["age_s"] is None else seconds(guard["age_s"])
        print(f"open for {age} (by {guard['age_from']}), threshold "
              f"{seconds(guard['threshold_s'])}{' (forced)' if guard['forced'] else ''}: it would be aborted by {how}")
        print("dry run: nothing changed. Add --yes to abort it.")
        return 0
    record = attempt_abort(settings, args.topic, args.partition, args.start_offset, who=getpass.getuser(),
                           via="kafka-eos txn abort", specs=specs, older_than_s=args.older_than, force=args.force)
    _print_open_transaction(args.topic, args.partition, record["transaction"])
    print(f"aborted: {outcome_text(record)}; recorded in {AUDIT_TOPIC}")
    return 0


def _print_open_transaction(topic: str, partition: int, txn: dict) -> None:
    owner = f", pipeline {txn['pipeline']}" if txn["pipeline"] else ""
    print(f"{topic}-{partition}: open transaction starting at offset {txn['start_offset']}: producer "
          f"{txn['producer_id']} epoch {txn['producer_epoch']}, transactional.id {txn['transactional_id'] or '?'}"
          f"{owner}, {txn['verdict']}, last write {txn['last_write']}")


def cmd_new(args) -> int:
    from pathlib import Path

    from kafka_eos.scaffold import new_pipeline, write

    pipeline = new_pipeline(args.name, package=args.package, source=args.source, commit=args.commit, fmt=args.format)
    project = Path(args.dir)
    for path in write(project, pipeline):
        print(f"wrote {path}")
    spec = project / "pipelines" / f"{args.name}.yaml"
    print(f"next: kafka-eos topics create {spec}   (a dry run; --yes creates them)")
    print(f"      kafka-eos validate {spec}")
    print(f"      kafka-eos run {spec}   (in Airflow: [kafka_eos] pipelines_folder = {spec.parent.resolve()})")
    return 0


def cmd_topics(args) -> int:
    from kafka_eos.topics import create_missing, pipeline_topics

    spec, settings = _spec(args, import_transform=False), _settings(args)
    plans = pipeline_topics(spec, settings, args.partitions)
    created = {p.name for p in create_missing(settings, plans)} if args.yes else set()
    if args.json:
        _print_json([{**dataclasses.asdict(p), "created": p.name in created} for p in plans])
        return 0
    state = {True: "created", False: "would create"}
    rows = [[p.name, p.role, p.partitions, p.replication, "exists" if not p.missing else state[p.name in created]]
            for p in plans]
    print(table(rows, ["topic", "role", "partitions", "replication", "state"]))
    for p in plans:
        if p.missing and p.config:
            print(f"  {p.name}: {', '.join(f'{k}={v}' for k, v in p.config.items())}")
    if not args.yes and any(p.missing for p in plans):
        print(f"dry run: nothing was created; `kafka-eos topics create {args.pipeline} --yes` creates them")
    return 0


def cmd_backfill(args) -> int:
    from kafka_eos.backfill.promote import parse_side, promote

    spec, settings = _spec(args, import_transform=False), _settings(args)
    done = promote(spec, settings, parse_side(args.side, spec.name), apply=args.yes, overlap=args.overlap)
    if args.json:
        _print_json(done)
        return 0
    if "tables" in done:
        print(table([[t["table"], t["action"], t["files"], t["rows"], t["snapshot"] if t["snapshot"] is not None else "-"]
                     for t in done["tables"]], ["table", "action", "files", "rows", "main's snapshot"]))
        if not args.yes:
            print(f"dry run: nothing was promoted; `kafka-eos backfill promote {args.pipeline} {args.side} --yes` "
                  f"promotes branch {done['branch']} onto main")
        return 0
    print(done["statement"])
    if done["caveat"]:
        print(f"  note: {done['caveat']}")
    print(f"promoted: {done['rows']} row(s) upserted into the live table" if args.yes else
          f"dry run: nothing was promoted; `kafka-eos backfill promote {args.pipeline} {args.side} --yes` runs it "
          "(keyed tables)")
    return 0


def cmd_validate(args) -> int:
    from kafka_eos.validate import validate

    spec, settings = _spec(args), _settings(args)
    checks = validate(spec, settings, ref=args.pipeline)
    if args.json:
        _print_json([dataclasses.asdict(c) for c in checks])
    else:
        for check in checks:
            print(f"{'ok  ' if check.ok else 'FAIL'}  {check.what}: {check.detail}")
    failed = [c for c in checks if not c.ok]
    if failed:
        raise KafkaEosError(f"{spec.name}: {len(failed)} check(s) failed, first: {failed[0].what}: {failed[0].detail}")
    return 0


def cmd_acls(args) -> int:
    from kafka_eos import acls

    spec = _spec(args, import_transform=False)
    needed = acls.required_acls(spec, args.role)
    settings = _settings(args) if args.apply else None
    principal = args.principal or (acls.principal_of(settings) if settings else None)
    if args.apply:
        if not principal:
            raise KafkaEosError("acls --apply: name the principal the ACLs are for (--principal User:NAME)")
        acls.apply(settings, needed, principal)
    if args.json:
        _print_json({"pipeline": spec.name, "role": args.role, "principal": principal, "applied": args.apply,
                     "acls": acls.as_json(needed, principal)})
        return 0
    print(f"pipeline {spec.name}, role {args.role}: {len(needed)} ACL(s) for {principal or 'its principal'} "
          f"(ALLOW, any host){'; created' if args.apply else ''}")
    print(table([(a.resource_type, a.name, a.pattern, a.operation, a.why) for a in needed],
                ("resource", "name", "pattern", "operation", "needed for"), left=5))
    return 0


def cmd_demo(args) -> int:
    if args.format == "avro":
        from kafka_eos.demo_avro import run_avro_demo

        return run_avro_demo(bootstrap=args.bootstrap)
    from kafka_eos.demo import run_demo

    return run_demo(bootstrap=args.bootstrap)


def _common_flags(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Flags every command takes, before or after its name. On subcommands they default to
    SUPPRESS, so a flag given before the command is not overwritten by the subcommand's default."""
    default = argparse.SUPPRESS
    parser.add_argument("--bootstrap", default=default if suppress else None,
                        help=f"Kafka bootstrap servers (default ${BOOTSTRAP_ENV}, else the local broker; "
                             f"${CONNECT_TIMEOUT_ENV} sets how long to wait for an answer, 10 s by default)")
    parser.add_argument("-v", "--verbose", action="store_true", default=default if suppress else False,
                        help="also show librdkafka's and kafka-eos's log lines on stderr "
                             "(they always go to logs/kafka-eos.log under KAFKA_EOS_HOME: .local/ in a checkout, "
                             "~/.kafka-eos installed)")


def _bounded(kind: type, least: float, words: str):
    """An argparse type: ``kind`` of at least ``least``; argparse's error names the flag and value."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}") from None
        if value < least or value != value:  # NaN too
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}")
        return value
    parse.__name__ = words
    return parse


positive_int = _bounded(int, 1, "a positive integer")
non_negative_int = _bounded(int, 0, "an integer of 0 or more")
positive_float = _bounded(float, 1e-9, "a positive number")
non_negative_float = _bounded(float, 0, "a number of 0 or more")


def build_parser() -> argparse.ArgumentParser:
    from kafka_eos.health import DEFAULT_OLDER_THAN_S

    parser = argparse.ArgumentParser(
        prog="kafka-eos", description="Exactly-once Kafka -> Spark pipelines: plan, run and inspect them, "
                                      "and run a local broker. Docs: docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _common_flags(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func, help_: str, json_flag: bool = False, pipeline: bool = False):
        p = sub.add_parser(name, help=help_, description=help_)
        _common_flags(p, suppress=True)
        if pipeline:
            p.add_argument("pipeline", help="a name in the pipelines folder (KAFKA_EOS_PIPELINES_DIR) or a path to a "
                                           "YAML file")
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.set_defaults(func=func)
        return p

    k = command("kafka", cmd_kafka, "the local broker under .local/kafka (start, stop, status); with --brokers 3, a "
                                    "cluster of three under .local/kafka-cluster")
    k.add_argument("action", choices=["start", "stop", "status", "user"])
    k.add_argument("name", nargs="?", help="user: the SCRAM user to create on the secured broker (its client "
                                           "settings file is printed; its password is never)")
    k.add_argument("--brokers", type=int, choices=[1, 3], default=1,
                   help="start: one broker (the default), or three with replication factor 3 and min.insync.replicas 2")
    k.add_argument("--secure", action="store_true",
                   help="the secured broker under .local/kafka-secure on 127.0.0.1:19094: SASL_SSL with SCRAM-SHA-512, "
                        "a CA of its own, the StandardAuthorizer (nothing allowed without an ACL), super user admin")
    a = command("airflow", cmd_airflow, "a local Airflow (API and UI, scheduler, dag-processor, triggerer) over "
                                        "the pipelines folder's DAGs, under .local/airflow (start, stop, status; "
                                        "trigger DAG_ID runs a DAG)")
    a.add_argument("action", choices=["start", "stop", "status", "trigger"])
    a.add_argument("dag_id", nargs="?", help="trigger: the DAG to run (kafka_eos__<pipeline>)")
    a.add_argument("--conf", help="trigger: the run's conf, a JSON object (the trigger form's parameters)")
    a.add_argument("--wait", action="store_true", help="trigger: wait until the run ends; exit 1 if it failed")
    a.add_argument("--executor", choices=["local", "celery"],
                   help="start: Airflow's LocalExecutor (SQLite), or its CeleryExecutor: Redis (Debian's redis-server) "
                        "as Celery's broker, a PostgreSQL server of its own as metadata DB and result backend, two "
                        "Celery workers (default: the executor of the last start, else local)")
    s = command("spark", cmd_spark, "a local Spark standalone cluster (a master and two workers on 127.0.0.1) "
                                    "under .local/spark (start, stop, status); jars: fetch Spark's Kafka connector "
                                    "from Maven Central into $KAFKA_EOS_HOME/jars/spark, once")
    s.add_argument("action", choices=["start", "stop", "status", "jars"])
    s.add_argument("--connect", action="store_true",
                   help="a Spark Connect server instead (sc://127.0.0.1:15002, master local[2], under "
                        ".local/spark-connect): runs through it pay no JVM start (kafka-eos run --spark-remote)")
    g = command("registry", cmd_registry, "the local Schema Registry (Apicurio Registry's Confluent-compatible API on "
                                          "127.0.0.1:18081) under .local/registry (start, stop, status)")
    g.add_argument("action", choices=["start", "stop", "status"])
    p = command("plan", cmd_plan, "the next plan of a pipeline, with no side effects", json_flag=True,
                pipeline=True)
    p.add_argument("--run-id", help="plan as this run (default: 'next')")
    r = command("run", cmd_run, "one batch: plan, Spark, transactional commit", json_flag=True, pipeline=True)
    r.add_argument("--run-id", help="the run's id (a retried run passes the same id)")
    r.add_argument("--max-records", type=positive_int, help="cap per partition (offset span) for this run")
    r.add_argument("--spark-remote", metavar="URL", default=os.environ.get("SPARK_REMOTE") or None,
                   help="run Spark on this Spark Connect server (sc://host:port; default $SPARK_REMOTE) "
                        "instead of in this process (see kafka-eos spark start --connect)")
    st = command("stream", cmd_stream, "run a pipeline continuously: one batch after another in one Spark "
                                       "application, each exactly once, until SIGTERM/Ctrl-C", pipeline=True)
    st.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                    help=f"least time between the starts of two batches (default {DEFAULT_INTERVAL_S:g}, "
                         "Kafka Streams' exactly-once commit interval)")
    st.add_argument("--max-records", type=positive_int, help="cap per partition (offset span) of each batch")
    st.add_argument("--max-batches", type=positive_int, help="stop after this many batches that committed")
    st.add_argument("--until-caught-up", action="store_true",
                    help="stop at the first batch with nothing to read (drain the backlog and stop)")
    st.add_argument("--force", action="store_true",
                    help="start even though a batch run's plan has not committed yet (a failed run)")
    st.add_argument("--metrics-port", type=positive_int, metavar="PORT",
                    default=os.environ.get("KAFKA_EOS_METRICS_PORT"),  # a string default is parsed by type
                    help="serve the stream's figures to Prometheus at http://ADDR:PORT/metrics (default "
                         "$KAFKA_EOS_METRICS_PORT; none)")
    st.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                    help="the address of the metrics endpoint (default 127.0.0.1)")
    st.add_argument("--figures", action="store_true",
                    help="print each batch's figures as a line of JSON (what the Airflow task reads)")
    c = command("checkpoint", cmd_checkpoint, "per partition: checkpoint, LSO, HW and lag (to the LSO)",
                json_flag=True, pipeline=True)
    c.add_argument("--refresh", action="store_true",
                   help="first commit every checkpoint again, unchanged, so the broker's offsets retention "
                        "does not expire it (a pipeline that has not run for a while); an attempt of the "
                        "pipeline in flight is fenced and retried")
    command("pipelines", cmd_pipelines, "the pipeline specs in the pipelines folder: sink, scope, lag, last run",
            json_flag=True)
    au = command("audit", cmd_audit, "count committed runs' ranges again on the source and compare them with what "
                                     f"each commit wrote (exit {EXIT_FOUND} when a range is short of records)",
                 json_flag=True, pipeline=True)
    au.add_argument("--run-id", help="audit this run (default: the last runs)")
    au.add_argument("--last", type=positive_int, default=10, help="how many of the newest runs (default 10)")
    ack = command("acknowledge", cmd_acknowledge, "a pipeline held because a run found a range committed short "
                                                  "plans nothing until an operator acknowledges it: show the "
                                                  f"finding (exit {EXIT_FOUND} while held); --yes acknowledges it",
                  json_flag=True, pipeline=True)
    ack.add_argument("--yes", action="store_true", help="really acknowledge it: the pipeline plans again")
    ack.add_argument("--note", help="why (what was repaired, or why the loss is accepted): kept with the "
                                    "acknowledgement")
    d = command("demo", cmd_demo, "the main job on the embedded default (local broker, Spark, Airflow)")
    d.add_argument("--format", choices=["json", "avro"], default="json",
                   help="avro: the Avro example instead (orders in Avro, their schema evolved mid-stream, through "
                        "the embedded Schema Registry; docs/formats.md)")
    n = command("new", cmd_new, "write a new pipeline: its spec (pipelines/NAME.yaml), a transform skeleton "
                                "(PACKAGE/NAME.py) and its unit test (tests/test_NAME.py)")
    n.add_argument("name", help="the pipeline's name (lower case letters, digits, '_')")
    n.add_argument("--dir", default=".", help="the project folder to write into (default: the current one)")
    n.add_argument("--package", default="transforms", help="the Python package of the transform (default transforms)")
    n.add_argument("--source", help="the topic it reads (default NAME.in)")
    n.add_argument("--commit", choices=["atomic", "per_partition"], default="atomic",
                   help="the commit scope (default atomic: one transaction per run)")
    n.add_argument("--format", choices=["json", "avro", "protobuf", "json_schema"], default="json",
                   help="the records' format in and out (default json; the others through a Schema Registry: "
                        "docs/formats.md)")
    tc = command("topics", None, "the topics a pipeline needs (create)")
    topic_actions = tc.add_subparsers(dest="action", required=True, metavar="ACTION")
    tca = topic_actions.add_parser("create", help="create the pipeline's missing topics (sources, sink, dead letters, "
                                                  "backfill, manifest, audit) with their settings; a dry run "
                                                  "without --yes")
    _common_flags(tca, suppress=True)
    tca.add_argument("pipeline", help="a name in the pipelines folder or a path to a YAML file")
    tca.add_argument("--partitions", type=positive_int, default=None,
                     help="partitions of a missing source topic (default 3); the others follow the source")
    tca.add_argument("--yes", action="store_true", help="really create them")
    tca.add_argument("--json", action="store_true", help="print JSON for scripts")
    tca.set_defaults(func=cmd_topics)
    bf = command("backfill", None, "side runs' results into the live place (promote)")
    bf_actions = bf.add_subparsers(dest="action", required=True, metavar="ACTION")
    bfp = bf_actions.add_parser("promote", help="move a finished replay's or backfill's results into the live place: "
                                                "an Iceberg sink's branch onto main (a fast-forward where main has not "
                                                "moved), a keyed SQL table's rows by the run's statement; once; a dry "
                                                "run without --yes")
    _common_flags(bfp, suppress=True)
    bfp.add_argument("pipeline", help="a name in the pipelines folder or a path to a YAML file")
    bfp.add_argument("side", help="the side run, as its run's note names it: <replay|backfill>.<key>.g<generation> "
                                  "(or its Iceberg branch, kafka-eos.<pipeline>.<that>)")
    bfp.add_argument("--overlap", action="store_true",
                     help="an Iceberg table with merge: append: promote even though main's checkpoint was past the "
                          "side run's start when its branch was cut (main lacks those records, or they were deleted)")
    bfp.add_argument("--yes", action="store_true", help="really promote it")
    bfp.add_argument("--json", action="store_true", help="print JSON for scripts")
    bfp.set_defaults(func=cmd_backfill)
    command("validate", cmd_validate, "check a pipeline without running it: its spec and transform, its topics, "
                                      "the brokers' transaction timeout, its checkpoints, its database",
            json_flag=True, pipeline=True)
    ac = command("acls", cmd_acls, "the Kafka ACLs a pipeline's principal needs, computed from its spec "
                                   "(--apply creates them, as a principal allowed to)", json_flag=True, pipeline=True)
    ac.add_argument("--principal", help="who the ACLs are for, e.g. User:orders-etl (default: the SASL user of "
                                        "the client settings)")
    ac.add_argument("--role", choices=["pipeline", "watchdog", "abort"], default="pipeline",
                    help="pipeline: its runs (the default); watchdog: the watchdog's and the operator page's "
                         "read-only set; abort: the runbook's abort")
    ac.add_argument("--apply", action="store_true", help="create them through the Admin API")
    t = command("txn", None, "open transactions that pin partitions: find them (hanging), abort one (abort)")
    actions = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    h = actions.add_parser("hanging", help="partitions held by an open transaction, and who holds them "
                                           f"(exit {EXIT_FOUND} when there are some)")
    _common_flags(h, suppress=True)
    h.add_argument("--topic", action="append", help="a topic to check (repeatable; default: every topic that is "
                                                    "not internal)")
    h.add_argument("--older-than", type=non_negative_float, default=None, metavar="SECONDS",
                   help="report transactions open longer than this (default: the longest transaction_timeout_s "
                        f"of the pipelines plus a minute, at least {DEFAULT_OLDER_THAN_S:g}: longer than a "
                        "kafka-eos transaction may last)")
    h.add_argument("--json", action="store_true", help="print JSON for scripts")
    h.set_defaults(func=cmd_txn_hanging)
    a = actions.add_parser("abort", help="abort the open transaction that starts at an offset (a dry run "
                                         "without --yes)")
    _common_flags(a, suppress=True)
    a.add_argument("--topic", required=True)
    a.add_argument("--partition", type=non_negative_int, required=True)
    a.add_argument("--start-offset", type=non_negative_int, required=True, help="where the transaction starts on the "
                                                                   "partition (its LSO; see `txn hanging`)")
    a.add_argument("--yes", action="store_true", help="really abort it")
    a.add_argument("--older-than", type=non_negative_float, default=None, metavar="SECONDS",
                   help="refuse a transaction open for less than this (default: the larger of the brokers' "
                        "transaction.max.timeout.ms and the owning pipeline's transaction_timeout_s)")
    a.add_argument("--force", action="store_true",
                   help="abort a transaction younger than the threshold (a healthy producer may still commit it)")
    a.set_defaults(func=cmd_txn_abort)
    return parser


def _version() -> str:
    try:
        return metadata.version("kafka-eos")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        from kafka_eos import __version__

        return __version__


#: How a kafka-eos error raised inside a Spark task reaches the driver: in the text of a
#: Py4JJavaError / PythonException, as "kafka_eos.errors.<Class>: <message>".
_REMOTE_ERROR = re.compile(r"kafka_eos\.errors\.(\w+): ([^\n]+)")


def python_error(exc: BaseException) -> str | None:
    """The exception line of the last Python traceback in ``exc``'s text (a Spark task's Python
    error: :func:`kafka_eos.errors.task_traceback`), or None."""
    found = task_traceback(exc)
    return found[0] if found else None


def remote_error(exc: BaseException) -> str | None:
    """The message of a kafka-eos error raised inside a Spark task (found in the text of the
    Py4JJavaError the driver gets), or None."""
    found = _REMOTE_ERROR.findall(str(exc))
    return found[-1][1].strip() if found else None


def main(argv: list[str] | None = None) -> int:
    from kafka_eos.logs import setup_cli_logging

    args = build_parser().parse_args(argv)
    if argv is None and args.func is not cmd_stream:
        # The command itself (not a call in-process): `| head` may end its output, not it. A stream
        # whose reader went (its parent's pipe) stops at its next report, as ever.
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, ReaderMayGo):
                setattr(sys, name, ReaderMayGo(stream))
    log_file = setup_cli_logging(args.verbose)
    log.info("kafka-eos %s", " ".join(sys.argv[1:] if argv is None else argv))
    try:
        with shared_admin_clients():  # a token callback's clients cost a second each to build
            return args.func(args)
    except KafkaEosError as exc:
        log.info("failed", exc_info=True)
        print(f"kafka-eos: {exc}", file=sys.stderr)
        return EXIT_HELD if isinstance(exc, (RangeMismatch, PipelineHeld)) else EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the contract is one line; the log file has the rest
        if os.environ.get("KAFKA_EOS_DEBUG") == "1":
            raise
        log.error("failed", exc_info=True)
        remote = remote_error(exc)
        if remote is not None:
            print(f"kafka-eos: {remote}", file=sys.stderr)
            return EXIT_ERROR
        worker = python_error(exc)
        if worker is not None:
            print(f"kafka-eos: {type(exc).__name__} in a Spark task's Python: {worker} (details: {log_file})",
                  file=sys.stderr)
            return EXIT_UNEXPECTED
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"kafka-eos: {type(exc).__name__}: {first} (details: {log_file})", file=sys.stderr)
        return EXIT_UNEXPECTED


if __name__ == "__main__":
    sys.exit(main())
