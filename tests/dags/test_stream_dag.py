"""Event-driven runs in a real Airflow deployment (scheduler, triggerer, Celery workers, PostgreSQL):
a spec with ``schedule: stream`` gets a DAG scheduled on its source asset; the asset's watcher runs
in the triggerer and a run commits the committed records exactly once, without a clock. While a
stream owns the pipeline, a run steps aside (its tasks are skipped) and commits nothing."""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections import Counter

import pytest
import yaml
from confluent_kafka import Producer
from test_backfill import _wait
from waiting import wait_until

from kafka_eos import kafka_admin
from kafka_eos.readers import read_committed
from kafka_eos.spec import load_spec
from kafka_eos.lease import StreamLease

pytestmark = pytest.mark.integration


DOWNSTREAM_DAG = '''
from datetime import datetime
from airflow.providers.apache.kafka.assets.kafka import create_asset
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG({dag_id!r}, schedule=[create_asset(server={server!r}, topic={topic!r})],
         start_date=datetime(2026, 1, 1), catchup=False, tags=["test"]) as dag:
    EmptyOperator(task_id="read_it")
'''


def _asset_runs(airflow, dag_id: str, count: int) -> list[dict] | None:
    runs = [r for r in airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]
            if r["run_type"] == "asset_triggered"]
    if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
        return sorted(runs, key=lambda r: r["queued_at"])
    return None


def _produce(settings, topic: str, txid: str, values: list[str], abort: bool = False) -> None:
    producer = Producer(settings.client_config(**{"transactional.id": txid}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, value=v.encode(), key=v.encode())
    producer.flush(30)
    (producer.abort_transaction if abort else producer.commit_transaction)(30)


@pytest.fixture
def deployed_webhook(airflow_deployment, alert_receivers):
    """The kafka-eos webhook connection, to the test's receiver, defined in the deployment (through
    its REST API: its triggerer sends the deadline alerts). Yields the receiver's bodies."""
    receiver = json.loads(os.environ["AIRFLOW_CONN_KAFKA_EOS_ALERTS_WEBHOOK"])
    airflow_deployment.api("POST", "/api/v2/connections", {
        "connection_id": "kafka_eos_alerts_webhook", "conn_type": "http", "host": receiver["host"],
        "port": receiver["port"], "schema": "http"})
    yield alert_receivers[0]
    airflow_deployment.api("DELETE", "/api/v2/connections/kafka_eos_alerts_webhook")


def test_a_stream_scheduled_dag_runs_on_committed_data_and_steps_aside_for_a_stream(airflow_deployment,
                                                                                    kafka_settings, deployed_webhook,
                                                                                    unique):
    airflow = airflow_deployment
    name = f"ev_{unique.replace('-', '_')}"
    topic, out = f"{name}.in", f"{name}.out"
    kafka_admin.create_topics(kafka_settings, {topic: 2, out: 2})
    spec_path = airflow.dags_folder.parent / "specs" / f"{name}.yaml"
    # A freshness limit of 1 s: every run misses the deadline the DAG derives from it.
    spec_path.write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topic], "freshness_limit_s": 1}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": out, "commit": "atomic"}, "schedule": "stream"}))
    spec = load_spec(str(spec_path), import_transform=False)
    dag_id = f"kafka_eos__{name}"
    # A team's DAG downstream, scheduled on the pipeline's output topic by the Kafka provider's asset.
    downstream = f"after_{name}"
    (airflow.dags_folder / f"{downstream}.py").write_text(DOWNSTREAM_DAG.format(
        dag_id=downstream, server=kafka_settings.bootstrap_servers.split(",")[0], topic=out))
    airflow.wait_for_dag(downstream)
    airflow.wait_for_dag(dag_id)

    _produce(kafka_settings, topic, f"{name}-aborted", ["x1", "x2"], abort=True)  # no data: no run
    time.sleep(15)
    assert _asset_runs(airflow, dag_id, 1) is None
    committed = [f"a{i}" for i in range(10)]
    produced_at = time.monotonic()
    _produce(kafka_settings, topic, f"{name}-writer", committed)
    (first,) = _wait("a run on the asset", lambda: _asset_runs(airflow, dag_id, 1))
    latency = time.monotonic() - produced_at
    assert first["state"] == "success", first
    assert Counter(m.value.decode() for m in read_committed(kafka_settings, out)) == Counter(committed)
    print(f"event-driven run: committed records to committed output in {latency:.1f} s")
    # The run's verify task emitted the output topic's asset event: the downstream DAG ran on it,
    # and the event carries the run's counts and ranges.
    (after,) = _wait("the downstream DAG's run on the sink asset", lambda: _asset_runs(airflow, downstream, 1))
    assert after["state"] == "success", after
    events = airflow.api("GET", f"/api/v2/dags/{downstream}/dagRuns/"
                                f"{urllib.parse.quote(after['dag_run_id'], safe='')}/upstreamAssetEvents")
    (event,) = events["asset_events"]
    assert event["uri"] == f"kafka://{kafka_settings.bootstrap_servers.split(',')[0]}/{out}"
    assert (event["source_dag_id"], event["source_run_id"]) == (dag_id, first["dag_run_id"])
    assert (event["extra"]["records_in"], event["extra"]["records_out"], event["extra"]["mode"]) == (10, 10, "live")
    assert sorted(tuple(r[:2]) for r in event["extra"]["ranges"]) == [(topic, 0), (topic, 1)]
    # The run's figures went to the deployment's StatsD, sent by the worker's task process.
    sent = {n: v for n, v, _k in airflow.statsd.named("airflow.kafka_eos.run.")}
    assert (sent[f"airflow.kafka_eos.run.records_in.{name}"], sent[f"airflow.kafka_eos.run.records_out.{name}"],
            sent[f"airflow.kafka_eos.run.dead_letters.{name}"]) == (10, 10, 0)
    assert 0 < sent[f"airflow.kafka_eos.run.commit_duration.{name}"] <= sent[f"airflow.kafka_eos.run.plan_to_commit.{name}"]
    # The run missed its deadline (1 s after it was queued): the triggerer sent the deadline's alert.
    missed = _wait("the deadline's alert", lambda: [b for _p, _t, b in deployed_webhook
                                                     if b["run_id"] == first["dag_run_id"]] or None)
    (finding,) = missed[0]["findings"]
    assert (finding["what"], finding["pipeline"], finding["limit_s"]) == ("deadline_missed", name, 1)
    assert missed[0]["text"].startswith(f"kafka-eos: {dag_id} missed its deadline (run {first['dag_run_id']})")
    assert finding["since"] and finding["runbook"].endswith(f"/dags/{dag_id}/runs/"
                                                            f"{urllib.parse.quote(first['dag_run_id'], safe='')}")

    # A stream owns the pipeline: the next run skips itself and commits nothing.
    lease = StreamLease(spec, kafka_settings)
    lease.acquire()
    try:
        _produce(kafka_settings, topic, f"{name}-writer", ["b0", "b1"])
        runs = _wait("a second run on the asset", lambda: _asset_runs(airflow, dag_id, 2))
        tis = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{runs[1]['dag_run_id']}/taskInstances")
        assert {t["task_id"]: t["state"] for t in tis["task_instances"]} == {
            "plan": "skipped", "spark": "skipped", "verify": "skipped"}
        assert len(read_committed(kafka_settings, out)) == len(committed)
    finally:
        lease.release()

    # The stream gone, new records fire the watcher again; the run reads everything waiting.
    _produce(kafka_settings, topic, f"{name}-writer", ["c0"])
    runs = _wait("a third run on the asset", lambda: _asset_runs(airflow, dag_id, 3))
    assert runs[2]["state"] == "success", runs[2]
    assert Counter(m.value.decode() for m in read_committed(kafka_settings, out)) == Counter(
        committed + ["b0", "b1", "c0"])
    tps = [(topic, 0), (topic, 1)]
    lso = kafka_admin.partition_offsets(kafka_settings, tps)
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps) == {
        tp: lso[tp].lso for tp in tps}


def test_the_stream_dag_runs_a_stream_until_caught_up(airflow_db, kafka_connection, kafka_settings, pipelines_module,
                                                      statsd, lineage_events, unique):
    import os
    from pathlib import Path

    from kafka_eos.sample_data import produce_orders

    name = f"sd_{unique.replace('-', '_')}"
    topic, out = f"{name}.in", f"{name}.out"
    kafka_admin.create_topics(kafka_settings, {topic: 2, out: 2})
    truth = produce_orders(kafka_settings, topic, 300, abort_every=3, malformed_every=0)
    specs = Path(os.environ["AIRFLOW_HOME"]) / "specs"  # the tests' DAG file builds DAGs from here
    (specs / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topic], "max_records_per_partition": 40}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": out, "commit": "per_partition"}}))
    dag = pipelines_module.dags_from_folder(specs)[f"kafka_eos_stream__{name}"]
    dag.tasks[0].retries = 0
    dag.tasks[0].lineage_period_s = 0  # a lineage event per batch here (every 5 minutes by default)
    dag_run = dag.test(run_conf={"until_caught_up": True, "interval_s": 0.2})
    assert {ti.task_id: ti.state for ti in dag_run.get_task_instances()} == {"stream": "success"}

    out_ids = [m.value for m in read_committed(kafka_settings, out)]
    assert Counter(out_ids) == Counter(json.dumps(o).encode() for o in truth.committed)  # exactly once
    tps = [(topic, 0), (topic, 1)]
    lso = kafka_admin.partition_offsets(kafka_settings, tps)
    assert kafka_admin.committed_offsets(kafka_settings, f"kafka-eos.{name}", tps) == {tp: lso[tp].lso for tp in tps}
    # Each batch's figures reached Airflow's metrics (StatsD here): batches, records and latency.
    batches = statsd.named(f"airflow.kafka_eos.stream.batches.{name}")
    assert len(batches) >= 300 / 2 / 40 and {(v, k) for _n, v, k in batches} == {(1, "c")}
    records_out = sum(v for _n, v, _k in statsd.named(f"airflow.kafka_eos.stream.records_out.{name}"))
    assert records_out == len(truth.committed)
    latencies = statsd.named(f"airflow.kafka_eos.stream.batch_latency.{name}")
    assert len(latencies) == len(batches) and all(k == "ms" and v > 0 for _n, v, k in latencies)
    # Its lineage: a RUNNING event per period (here: per batch) with the period's ranges and counts,
    # and the task's COMPLETE event with the whole stream's, naming the source and the sink.
    job = f"kafka_eos_stream__{name}.stream"
    server = kafka_settings.bootstrap_servers.split(",")[0]
    running = [e for e in lineage_events(job_name=job) if e["eventType"] == "RUNNING"
               and "kafkaEos" in e["run"]["facets"]]
    assert len(running) == len(batches)
    assert sum(e["run"]["facets"]["kafkaEos"]["recordsOut"] for e in running) == len(truth.committed)
    covered = sorted((r["partition"], r["from"], r["until"]) for e in running
                     for r in e["run"]["facets"]["kafkaEos"]["ranges"])
    assert {(p, until) for p, _f, until in covered} >= {(p, lso[(topic, p)].lso) for p in (0, 1)}
    # The provider emits off the task's thread: waited for.
    (complete,) = wait_until("the stream task's COMPLETE event", lambda: [
        e for e in lineage_events(dag_run.run_id, job) if e["eventType"] == "COMPLETE"] or None, 60, every_s=0.5)
    facet = complete["run"]["facets"]["kafkaEos"]
    assert (facet["mode"], facet["batches"], facet["recordsOut"]) == ("stream", len(batches), len(truth.committed))
    assert {r["partition"]: (r["from"], r["until"]) for r in facet["ranges"]} == {
        p: (0, lso[(topic, p)].lso) for p in (0, 1)}
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [(f"kafka://{server}", topic)]
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [(f"kafka://{server}", out)]
    assert running[0]["run"]["runId"] == complete["run"]["runId"]  # the same OpenLineage run
