"""The watchdog: every 5 minutes, every bundled pipeline's topics (sources, sink, dead letters,
run manifest) are watched for an open transaction that holds a partition's LSO longer than a
kafka-eos transaction may last (the longest ``sink.transaction_timeout_s`` of the pipelines plus a
minute, at least 360 s; the age is the coordinator's, the broker's clock, wherever it can say). A held partition fails the run and alerts (webhook, e-mail)
with the partition, its holder and the command that aborts it.

Beside it, a freshness check: a pipeline whose oldest unprocessed committed record is older
than its spec's ``source.freshness_limit_s`` fails that task and alerts, naming the partitions.
And a checkpoint refresh: a pipeline that has not run for a long time (event-driven, manual) has
its checkpoints committed again, unchanged, before the brokers' offsets retention would expire them.

DAG wiring only: the sensor and its read-only trigger live in plugins/kafka_eos_airflow/.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, CronTriggerTimetable

from kafka_eos.spec import spec_paths
from kafka_eos_airflow.checks import CheckpointRefreshOperator, FreshnessCheckOperator
from kafka_eos_airflow.notifiers import failure_notifiers
from kafka_eos_airflow.sensors import HungTransactionSensor

#: A run watches for 4 of its 5 minutes, then makes room for the next one.
WATCH_S = 240
#: How long until the next watchdog run may refresh a checkpoint: its interval, twice (one run late).
REFRESH_AHEAD_S = 2 * 300

with DAG(
    dag_id="kafka_eos_watchdog",
    schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    default_args={"owner": "kafka-eos", "retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": failure_notifiers()},
    tags=["kafka-eos", "watchdog"],
    doc_md=__doc__,
) as dag:
    pipelines = [str(p) for p in spec_paths()]
    HungTransactionSensor(
        task_id="hung_transactions",
        pipelines=pipelines,
        healthy_for_s=WATCH_S,
        poll_interval_s=30,
        # One alert per problem and run: a failed watch is not retried into a second alert.
        retries=0,
    )
    FreshnessCheckOperator(task_id="freshness", pipelines=pipelines, retries=0)
    # A failed refresh alerts; the next watchdog run (within REFRESH_AHEAD_S) tries again.
    CheckpointRefreshOperator(task_id="refresh_checkpoints", pipelines=pipelines, next_in_s=REFRESH_AHEAD_S,
                              retries=0)
