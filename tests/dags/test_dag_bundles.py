"""Specs in a versioned DAG bundle: Airflow's GitDagBundle over a local git repository, two versions
of one spec. The DAG file names its specs folder relative to itself, so each version's DAG (parsed
as a task parses it, from that version's checkout) runs that version's spec; the source asset's
watcher carries the spec's document, so the triggerer (which has no checkout) needs no file."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.pipeline import compute_plan
from kafka_eos.spec import load_spec

pytestmark = pytest.mark.integration

DAG_FILE = 'from kafka_eos_airflow.dag_factory import kafka_eos_dags\n\nglobals().update(kafka_eos_dags("pipelines"))\n'


def test_each_bundle_version_runs_its_own_spec_and_the_watcher_needs_no_checkout(
        tmp_path, monkeypatch, kafka_settings, unique):
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.providers.git.bundles.git import GitDagBundle

    from kafka_eos_airflow.triggers.kafka import committed_data_waiting

    name = f"bundled_{unique.replace('-', '_')}"
    topics = {"v1": f"{name}.v1", "v2": f"{name}.v2", "out": f"{name}.out"}
    kafka_admin.create_topics(kafka_settings, {topics["v1"]: 1, topics["v2"]: 2, topics["out"]: 1})
    producer = Producer(kafka_settings.client_config())
    for i in range(3):
        producer.produce(topics["v1"], value=f"{i}".encode())
    for p in (0, 1):
        producer.produce(topics["v2"], value=b"x", partition=p)
    assert producer.flush(30) == 0
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_STORAGE_PATH", str(tmp_path / "bundles"))
    monkeypatch.setenv("AIRFLOW_CONN_GIT_DEFAULT", json.dumps({"conn_type": "git"}))  # a local repository
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": kafka_settings.bootstrap_servers}}))

    repo = tmp_path / "repo"
    (repo / "dags" / "pipelines").mkdir(parents=True)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                              timeout=60).stdout.strip()

    git("init", "-q", "-b", "main")
    git("config", "user.email", "test@example.com")
    git("config", "user.name", "test")
    (repo / "dags" / "kafka_eos_pipelines.py").write_text(DAG_FILE)
    versions = {}
    for version in ("v1", "v2"):
        (repo / "dags" / "pipelines" / f"{name}.yaml").write_text(json.dumps({
            "name": name, "source": {"topics": [topics[version]]}, "schedule": "stream",
            "sink": {"kind": "kafka", "topic": topics["out"]}}))
        git("add", "-A")
        git("commit", "-q", "-m", version)
        versions[version] = git("rev-parse", "HEAD")

    watchers = {}
    for version, sha in versions.items():
        bundle = GitDagBundle(name="pipelines", tracking_ref="main", repo_url=str(repo), subdir="dags", version=sha)
        bundle.initialize()
        bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name="pipelines")
        assert bag.import_errors == {}, bag.import_errors
        dag = bag.dags[f"kafka_eos__{name}"]
        # The run's tasks read this version's spec, from this version's checkout.
        pipeline = dag.get_task("plan").pipeline
        assert pipeline.startswith(f"{bundle.path}/"), pipeline
        spec = load_spec(pipeline, import_transform=False)
        plan, _skipped = compute_plan(spec, kafka_settings, run_id=f"run-of-{version}")
        ranges = sorted((r.topic, r.partition, r.from_offset, r.until) for r in plan.active)
        assert ranges == ([(topics["v1"], 0, 0, 3)] if version == "v1" else
                          [(topics["v2"], 0, 0, 1), (topics["v2"], 1, 0, 1)])
        (asset,) = dag.timetable.asset_condition.objects
        watchers[version] = asset.watchers[0].trigger

    # The triggerer has no checkout: every bundle version's files gone, each watcher still looks
    # at its own version's source.
    shutil.rmtree(tmp_path / "bundles")
    for version, trigger in watchers.items():
        _classpath, kwargs = trigger.serialize()
        assert kwargs["spec"]["source"]["topics"] == [topics[version]]
        found = committed_data_waiting(kwargs["pipeline"], kwargs["kafka_conn_id"], kwargs["spec"])
        assert sorted((p["topic"], p["partition"], p["lag"]) for p in found) == (
            [(topics["v1"], 0, 3)] if version == "v1" else [(topics["v2"], 0, 1), (topics["v2"], 1, 1)])
