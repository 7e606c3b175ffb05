"""The project's dags/ folder parses into one well-formed DAG per bundled pipeline spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DAGS_DIR = ROOT / "dags"
PLUGINS_DIR = ROOT / "plugins"

BUNDLED = ("kafka_eos__orders_enriched", "kafka_eos__revenue_per_minute")


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    # Airflow 3's DagBag has no include_examples: examples are a separate bundle (load_examples).
    # (dagbag.dags, not get_dag(): get_dag() reads the metadata DB.)
    return DagBag(dag_folder=str(DAGS_DIR))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}


def test_every_bundled_spec_has_a_dag(dagbag):
    from kafka_eos.paths import pipelines_dir

    specs = sorted(p.stem for p in pipelines_dir().glob("*.yaml"))
    assert sorted(dagbag.dag_ids) == sorted([*(f"kafka_eos__{s}" for s in specs),
                                             *(f"kafka_eos_stream__{s}" for s in specs), "kafka_eos_watchdog",
                                             "kafka_eos_runbook_abort_transaction"])
    assert set(BUNDLED) <= set(dagbag.dag_ids)


@pytest.mark.parametrize("dag_id", BUNDLED)
def test_dag_is_well_formed(dagbag, dag_id):
    from airflow.sdk import CronDataIntervalTimetable

    dag = dagbag.dags[dag_id]
    assert dag is not None
    assert "kafka-eos" in dag.tags and len(dag.tags) == 3
    assert dag.doc_md and dag_id.removeprefix("kafka_eos__") in dag.doc_md
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    # Data intervals, not CronTriggerTimetable (what a bare cron string means in Airflow 3).
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable == CronDataIntervalTimetable("*/5 * * * *", timezone="UTC")
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "spark", "verify"]
    for task in dag.tasks:
        assert task.retries >= 1, task.task_id
        assert task.retry_delay.total_seconds() == 30
    # The trigger form: every field titled, described and in a section; defaults for scheduled runs.
    form = {name: dag.params.get_param(name) for name in dag.params}
    assert sorted(form) == ["dry_run", "max_records_per_partition", "replay_from", "replay_until", "reprocess",
                            "reset_checkpoint_to", "reset_confirm"]
    assert all(p.schema["title"] and p.schema["description_md"] and p.schema["section"] for p in form.values())
    assert dag.params.validate() == {"dry_run": False, "max_records_per_partition": 100000, "replay_from": None,
                                     "replay_until": None, "reprocess": False, "reset_checkpoint_to": None,
                                     "reset_confirm": None}


def test_the_replay_field_says_where_results_go_never_the_live_place(dagbag):
    sql = dagbag.dags["kafka_eos__revenue_per_minute"].params.get_param("replay_from").schema["description_md"]
    assert "Results go to table `revenue_per_minute_backfill` in the sink's database" in sql
    assert "dead letters to `revenue_per_minute_backfill_dead_letters`" in sql and "copies a checked replay" in sql
    assert "replaced" not in sql
    kafka = dagbag.dags["kafka_eos__orders_enriched"].params.get_param("replay_from").schema["description_md"]
    assert "Results go to topic `orders.backfill`" in kafka and "dead letters to `orders.backfill`" in kafka


def test_the_watchdog_watches_every_pipeline_and_alerts(dagbag):
    from kafka_eos.spec import spec_paths
    from kafka_eos_airflow.notifications.alerts import KafkaEosEmailNotifier, KafkaEosWebhookNotifier

    dag = dagbag.dags["kafka_eos_watchdog"]
    assert dag.doc_md and "kafka-eos" in dag.tags and dag.max_active_runs == 1 and dag.catchup is False
    assert sorted(t.task_id for t in dag.tasks) == ["freshness", "hung_transactions", "refresh_checkpoints"]
    # Refreshed before the next run could come late: the offsets retention never catches an idle pipeline.
    assert dag.get_task("refresh_checkpoints").next_in_s >= 2 * 300
    for task in dag.tasks:  # each looks at every pipeline, alerts, and does not retry into a second alert
        assert task.pipelines == [str(p) for p in spec_paths()] and task.retries == 0
        assert sorted(type(n).__name__ for n in task.on_failure_callback) == sorted(
            [KafkaEosEmailNotifier.__name__, KafkaEosWebhookNotifier.__name__])
    for pipeline_task in dagbag.dags["kafka_eos__orders_enriched"].tasks:  # every pipeline task alerts too
        assert len(pipeline_task.on_failure_callback) == 2


def test_tags_name_sink_and_commit_scope(dagbag):
    assert set(dagbag.dags["kafka_eos__orders_enriched"].tags) == {"kafka-eos", "kafka", "per_partition"}
    assert set(dagbag.dags["kafka_eos__revenue_per_minute"].tags) == {"kafka-eos", "sql", "atomic"}


def test_tasks_load_the_spec_by_path_and_spark_runs_the_entry_point(dagbag):
    from kafka_eos.paths import PROJECT_ROOT, pipelines_dir

    dag = dagbag.dags["kafka_eos__orders_enriched"]
    spec_path = str(pipelines_dir() / "orders_enriched.yaml")
    assert {t.pipeline for t in dag.tasks} == {spec_path}
    assert {t.kafka_conn_id for t in dag.tasks} == {"kafka_eos_kafka"}
    spark = dag.get_task("spark")
    assert spark.application == str(PROJECT_ROOT / "spark_apps" / "run_pipeline.py")
    assert spark._conn_id == "spark_default"


def test_parsing_imports_neither_pyspark_nor_kafka_clients():
    """Parse time stays light: no transform import (pyspark), no Kafka client, no network."""
    code = (
        "import sys, runpy; runpy.run_path(sys.argv[1]);"
        "print(json.dumps([m for m in ('pyspark', 'confluent_kafka')"
        " if m in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS_DIR), str(DAGS_DIR)]),
           # Unroutable: a parse that tried to reach Kafka would hang or fail here.
           "KAFKA_BOOTSTRAP_SERVERS": "192.0.2.1:9"}
    for dag_file in ("kafka_eos_pipelines.py", "kafka_eos_watchdog.py", "kafka_eos_runbooks.py"):
        res = subprocess.run([sys.executable, "-c", "import json;" + code, str(DAGS_DIR / dag_file)],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        assert json.loads(res.stdout.strip().splitlines()[-1]) == [], dag_file


def test_a_bad_spec_is_skipped_and_the_others_still_get_dags(pipelines_module, tmp_path, caplog):
    from kafka_eos.paths import pipelines_dir

    good = yaml.safe_load((pipelines_dir() / "orders_enriched.yaml").read_text())
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "bad_field.yaml").write_text(yaml.safe_dump({**good, "name": "other", "sink": {"kind": "s3"}}))
    (tmp_path / "bad_yaml.yaml").write_text("name: [unclosed\n")
    dags = pipelines_module.dags_from_folder(tmp_path)
    assert list(dags) == ["kafka_eos__orders_enriched", "kafka_eos_stream__orders_enriched"]
    assert "bad_field.yaml" in caplog.text and "sink.kind" in caplog.text
    assert "bad_yaml.yaml" in caplog.text


def test_a_spec_without_schedule_is_manual_only(pipelines_module, tmp_path):
    from kafka_eos.spec import parse_spec

    spec = parse_spec({"name": "adhoc", "source": {"topics": ["t"]},
                       "sink": {"kind": "kafka", "topic": "o", "dlq_topic": "d"}}, str(tmp_path / "adhoc.yaml"))
    dag = pipelines_module.build_dag(spec)
    assert dag.dag_id == "kafka_eos__adhoc"
    assert dag.schedule is None
    assert not dag.timetable.can_be_scheduled


def test_a_stream_spec_is_scheduled_on_its_source_asset_watched_by_a_read_only_trigger(pipelines_module, tmp_path):
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

    from kafka_eos.spec import parse_spec, spec_document
    from kafka_eos_airflow.triggers.kafka import CommittedDataEventTrigger

    spec = parse_spec({"name": "ev", "source": {"topics": ["t"]}, "sink": {"kind": "kafka", "topic": "o"},
                       "schedule": "stream"}, str(tmp_path / "ev.yaml"))
    dag = pipelines_module.build_dag(spec)
    assert isinstance(dag.timetable, AssetTriggeredTimetable)
    (asset,) = dag.timetable.asset_condition.objects
    assert (asset.name, asset.uri) == ("kafka-eos.ev.source", "kafka-eos://ev/source")
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, CommittedDataEventTrigger)
    assert watcher.trigger.serialize() == ("kafka_eos_airflow.triggers.kafka.CommittedDataEventTrigger", {
        "pipeline": str(tmp_path / "ev.yaml"), "kafka_conn_id": "kafka_eos_kafka", "poll_interval_s": 5.0,
        "refire_after_s": 300.0, "spec": spec_document(spec)})  # the triggerer reads no spec file
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "spark", "verify"]


def test_every_pipeline_has_a_stream_dag_that_restarts_and_alerts(dagbag):
    from kafka_eos_airflow.operators.stream import KafkaEosStreamOperator

    dag = dagbag.dags["kafka_eos_stream__orders_enriched"]
    assert dag.schedule is None and dag.max_active_runs == 1 and "stream" in dag.tags and dag.doc_md
    (task,) = dag.tasks
    assert isinstance(task, KafkaEosStreamOperator) and task.retries == 3 and len(task.on_failure_callback) == 2
    assert dag.params.validate() == {"interval_s": 0.1, "until_caught_up": False}  # a stream's default


# --- the hook: Connection -> KafkaSettings -----------------------------------------------------

def _hook_with(monkeypatch, conn, registry=None):
    """A hook whose Kafka connection is ``conn`` and registry connection ``registry`` (None: not defined)."""
    from kafka_eos_airflow.hooks.kafka import KafkaEosHook

    hook = KafkaEosHook("some_kafka")

    def get_connection(conn_id):
        assert conn_id in ("some_kafka", "kafka_eos_schema_registry")
        found = conn if conn_id == "some_kafka" else registry
        if found is None:
            from airflow.sdk.exceptions import AirflowNotFoundException

            raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")
        return found

    monkeypatch.setattr(hook, "get_connection", get_connection)
    return hook


def test_hook_reads_bootstrap_extras_and_credentials(monkeypatch):
    from airflow.sdk import Connection

    conn = Connection(conn_id="some_kafka", conn_type="kafka", login="svc", password="s3cret",
                      extra=json.dumps({"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL",
                                        "sasl.mechanism": "SCRAM-SHA-512"}))
    settings = _hook_with(monkeypatch, conn).get_settings()
    assert settings.bootstrap_servers == "b1:9092,b2:9092"
    assert dict(settings.extra) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                    "sasl.username": "svc", "sasl.password": "s3cret"}


def test_hook_needs_bootstrap_servers(monkeypatch):
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowException

    conn = Connection(conn_id="some_kafka", conn_type="kafka", extra=json.dumps({"security.protocol": "SSL"}))
    with pytest.raises(AirflowException, match="bootstrap.servers"):
        _hook_with(monkeypatch, conn).get_settings()


def test_hook_without_connection_uses_environment_then_local_broker(monkeypatch):
    from kafka_eos.local.kafka import LocalBroker

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("KAFKA_EOS_CLIENT_CONFIG", raising=False)
    assert _hook_with(monkeypatch, None).get_settings().bootstrap_servers == LocalBroker.default().bootstrap
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "elsewhere:9092")
    assert _hook_with(monkeypatch, None).get_settings().bootstrap_servers == "elsewhere:9092"


def test_the_registry_comes_from_its_connection_else_the_environment_with_the_fallback(monkeypatch):
    from airflow.sdk import Connection

    from kafka_eos.local.registry import LocalRegistry

    kafka = Connection(conn_id="some_kafka", conn_type="kafka", extra=json.dumps({"bootstrap.servers": "b:9092"}))
    registry = Connection(conn_id="kafka_eos_schema_registry", conn_type="http", host="sr", port=8081,
                          login="u", password="p")
    found = _hook_with(monkeypatch, kafka, registry).get_settings(registry=True).schema_registry
    assert (found.url, dict(found.extra)) == ("http://sr:8081", {"basic.auth.user.info": "u:p"})
    monkeypatch.delenv("KAFKA_EOS_SCHEMA_REGISTRY_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "True")
    assert _hook_with(monkeypatch, kafka).get_settings(registry=True).schema_registry.url == LocalRegistry.default().url
    monkeypatch.setenv("AIRFLOW__KAFKA_EOS__LOCAL_BROKER_FALLBACK", "False")
    assert _hook_with(monkeypatch, kafka).get_settings(registry=True).schema_registry is None


def test_plan_file_path_is_never_needed_at_parse(dagbag):
    """The Spark task's arguments are computed at run time from the stored plan."""
    spark = dagbag.dags["kafka_eos__revenue_per_minute"].get_task("spark")
    assert not spark.application_args
    assert not spark.env_vars
    assert Path(spark.application).is_file()


def test_specs_sharing_a_group_get_no_dag(pipelines_module, tmp_path, caplog):
    from kafka_eos.paths import pipelines_dir

    good = yaml.safe_load((pipelines_dir() / "orders_enriched.yaml").read_text())
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**good, "name": "a"}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({**good, "name": "b"}))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**good, "name": "c",
                                                     "source": {**good["source"], "group_id": "kafka-eos.c"}}))
    assert list(pipelines_module.dags_from_folder(tmp_path)) == ["kafka_eos__c", "kafka_eos_stream__c"]
    assert caplog.text.count("is also the group of pipeline") == 2
