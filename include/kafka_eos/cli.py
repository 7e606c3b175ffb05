"""``kafka-eos``: the command line of DESIGN.md §6. Exit 0 on success, else non-zero with a
one-line reason on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from datetime import datetime, timezone

from kafka_eos.errors import KafkaEosError
from kafka_eos.local_kafka import LocalBroker
from kafka_eos.settings import BOOTSTRAP_ENV, KafkaSettings
from kafka_eos.spec import PipelineSpec, load_spec


def _settings(args) -> KafkaSettings:
    local = LocalBroker.default()
    settings = KafkaSettings.from_environ(os.environ, args.bootstrap, local.bootstrap)
    if settings.bootstrap_servers == local.bootstrap and not local.is_running():
        raise KafkaEosError(f"the local broker is not running: `kafka-eos kafka start` (or pass --bootstrap "
                            f"or set {BOOTSTRAP_ENV})")
    return settings


def _spec(args) -> PipelineSpec:
    spec = load_spec(args.pipeline)
    if getattr(args, "max_records", None):
        spec = dataclasses.replace(spec, source=dataclasses.replace(
            spec.source, max_records_per_partition=args.max_records))
    return spec


def cmd_kafka(args) -> int:
    broker = LocalBroker.default()
    if args.action == "start":
        print(broker.start())
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running")
    else:
        if not broker.is_running():
            print(f"not running ({broker.bootstrap})", file=sys.stderr)
            return 3
        print(broker.bootstrap)
    return 0


def cmd_plan(args) -> int:
    from kafka_eos.pipeline import compute_plan

    spec = _spec(args)
    plan, drift = compute_plan(spec, _settings(args), args.run_id or "next")
    if args.json:
        print(json.dumps({"plan": json.loads(plan.to_json()),
                          "drift": [dataclasses.asdict(d) for d in drift]}, indent=2))
        return 0
    print(f"pipeline {spec.name}: {len(plan.active)} partition(s) to run"
          + (" (empty plan: nothing to do)" if plan.is_empty else ""))
    for r in plan.ranges:
        n = "" if r.empty else f"  up to {r.until - r.from_offset} offsets"
        print(f"  {r.topic}-{r.partition}: [{r.from_offset}, {r.until}) checkpoint={r.expected}{n}")
    for s in plan.skipped:
        print(f"  SKIPPED (data loss) {s.topic}-{s.partition}: [{s.from_offset}, {s.until})")
    for d in drift:
        print(f"  DRIFT {d.topic}-{d.partition}: SQL sink at {d.sink}, Kafka mirror at {d.kafka} "
              "(`kafka-eos run` repairs it)")
    return 0


def cmd_run(args) -> int:
    from kafka_eos.batch import run_batch
    from kafka_eos.pipeline import prepare_plan, verify
    from kafka_eos.spark_io import get_session

    spec, settings = _spec(args), _settings(args)
    run_id = args.run_id or "manual__" + datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    plan = prepare_plan(spec, settings, run_id)
    if plan.is_empty:
        print(json.dumps({"pipeline": spec.name, "run_id": run_id, "status": "empty"}))
        return 0
    summary = run_batch(get_session(f"kafka-eos {spec.name}"), spec, plan, settings)
    verify(spec, settings, plan)
    print(json.dumps(summary.as_dict()))
    return 0


def cmd_checkpoint(args) -> int:
    from kafka_eos.kafka_admin import admin_client, partition_offsets
    from kafka_eos.pipeline import checkpoints, source_partitions

    spec, settings = _spec(args), _settings(args)
    tps = source_partitions(spec, settings)
    cks, drift = checkpoints(spec, settings, tps)
    offs = partition_offsets(admin_client(settings), tps)
    rows = []
    for tp in tps:
        ck, o = cks[tp], offs[tp]
        rows.append({"topic": tp[0], "partition": tp[1], "checkpoint": ck, "lso": o.lso,
                     "high_watermark": o.high_watermark, "log_start": o.log_start,
                     "lag": o.lso - (ck if ck is not None else o.log_start)})
    if args.json:
        print(json.dumps({"pipeline": spec.name, "group_id": spec.source.group_id, "partitions": rows,
                          "drift": [dataclasses.asdict(d) for d in drift]}, indent=2))
    else:
        print(f"pipeline {spec.name} (group {spec.source.group_id})")
        print(f"  {'partition':<30} {'checkpoint':>10} {'LSO':>10} {'HW':>10} {'lag':>8}")
        for r in rows:
            print(f"  {r['topic'] + '-' + str(r['partition']):<30} {str(r['checkpoint']):>10} "
                  f"{r['lso']:>10} {r['high_watermark']:>10} {r['lag']:>8}")
    return 0


def cmd_demo(args) -> int:
    from kafka_eos.demo import run_demo

    return run_demo(bootstrap=args.bootstrap)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kafka-eos", description=__doc__)
    parser.add_argument("--bootstrap", help=f"Kafka bootstrap servers (default ${BOOTSTRAP_ENV}, "
                                            "else the local broker)")
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kafka", help="the local single-node broker under .local/")
    k.add_argument("action", choices=["start", "stop", "status"])
    k.set_defaults(func=cmd_kafka)
    for name, func, help_ in (("plan", cmd_plan, "the next plan, no side effects"),
                              ("run", cmd_run, "one batch: plan + Spark + transactional commit"),
                              ("checkpoint", cmd_checkpoint, "per partition: checkpoint, LSO, HW, lag")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("pipeline", help="a name under include/pipelines/ or a path to a YAML file")
        p.set_defaults(func=func)
        if name in ("plan", "checkpoint"):
            p.add_argument("--json", action="store_true")
        if name in ("plan", "run"):
            p.add_argument("--run-id", help="the run's id (a retried run passes the same id)")
        if name == "run":
            p.add_argument("--max-records", type=int, help="cap per partition (offset span) for this run")
    d = sub.add_parser("demo", help="the main job on the embedded default")
    d.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KafkaEosError as exc:
        print(f"kafka-eos: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the contract is one line; KAFKA_EOS_DEBUG=1 shows all
        if os.environ.get("KAFKA_EOS_DEBUG") == "1":
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        print(f"kafka-eos: {type(exc).__name__}: {first} (KAFKA_EOS_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
