"""spark-submit entry point: run one stored plan of one pipeline to its transactional commit.

    spark-submit --jars <Spark's Kafka connector jars> spark_apps/run_pipeline.py \
        --spec orders_enriched --plan /path/plan.json

(``make jars`` resolves the connector into .local/jars/spark/; Airflow's operator passes them.)

The plan arrives verbatim as a file (never on the command line); Kafka settings through the
environment (KAFKA_BOOTSTRAP_SERVERS), secrets in a file it names (KAFKA_EOS_CLIENT_CONFIG_FILE)
or in KAFKA_EOS_CLIENT_CONFIG.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _unshadow() -> None:
    """Run as a script, Python puts this file's folder first on sys.path: its ``transforms``
    package (the examples) would shadow a top-level ``transforms`` of the user's. The entry point
    imports everything by its package name, so the folder goes."""
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)


def main(argv: list[str] | None = None) -> int:
    _unshadow()
    # Imported once the script's own folder no longer shadows the packages it imports.
    from kafka_eos.batch import run_batch
    from kafka_eos.errors import KafkaEosError
    from kafka_eos.kafka_admin import shared_admin_clients
    from kafka_eos.plan import Plan
    from kafka_eos.settings import KafkaSettings
    from kafka_eos.spark_io import get_session
    from kafka_eos.spec import load_spec

    parser = argparse.ArgumentParser(prog="run_pipeline")
    parser.add_argument("--spec", required=True, help="pipeline name or spec path")
    parser.add_argument("--plan", required=True, help="file holding the plan JSON")
    parser.add_argument("--side", help="a replay or backfill: its JSON (kafka_eos.backfill.side.Side)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if args.side:
            from kafka_eos.backfill.side import Side, side_spec

            spec = side_spec(spec, Side.from_json(args.side))
        plan = Plan.from_json(Path(args.plan).read_text(), args.plan)
        if plan.pipeline != spec.name:
            raise KafkaEosError(f"{args.plan}: plan of pipeline {plan.pipeline!r}, not {spec.name!r}")
        settings = KafkaSettings.from_environ(os.environ)
        spark = get_session(f"kafka-eos {spec.name} {plan.run_id}", conf=spec.spark_conf)
        with shared_admin_clients():  # a token callback's clients cost a second each to build
            summary = run_batch(spark, spec, plan, settings)
    except KafkaEosError as exc:
        print(f"run_pipeline: {exc}", file=sys.stderr)
        return 1
    print("KAFKA_EOS_SUMMARY " + json.dumps(summary.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
