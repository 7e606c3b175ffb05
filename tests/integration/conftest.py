"""Integration fixtures: topics on the real broker, example pipelines."""

from __future__ import annotations

import shutil

import pytest

from kafka_eos import kafka_admin
from kafka_eos.spec import PipelineSpec, parse_spec

@pytest.fixture
def admin(kafka_settings):
    return kafka_admin.admin_client(kafka_settings)


@pytest.fixture
def make_spec(kafka_settings, unique, tmp_path):
    """Build a spec over fresh topics: ``make_spec(transform, sink_kind, commit, partitions=3, **sink)``."""

    def build(transform: str = "identity", kind: str = "kafka", commit: str = "atomic",
              partitions: int = 3, source: dict | None = None, **sink) -> PipelineSpec:
        src, out, dlq = f"in-{unique}", f"out-{unique}", f"dlq-{unique}"
        kafka_admin.create_topics(kafka_settings, {src: partitions, out: 3, dlq: 1})
        if kind == "kafka":
            sink = {"topic": out, "dlq_topic": dlq, **sink}
        else:
            sink = {"table": "results", "url": f"sqlite:///{tmp_path / 'sink.db'}", **sink}
        doc = {"name": unique, "source": {"topics": [src], **(source or {})}, "transform": transform,
               "sink": {"kind": kind, "commit": commit, **sink}}
        return parse_spec(doc, str(tmp_path / f"{unique}.yaml"))

    return build


@pytest.fixture
def transforms_from(tmp_path, monkeypatch):
    """``transforms_from(module_name, source)``: a transform module of this test's own, importable
    by the driver and by Spark's local Python workers. Returns the module name."""

    def write(module: str, source: str) -> str:
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return module

    return write


@pytest.fixture
def max_result_size(spark):
    """Set Spark's ``spark.driver.maxResultSize`` for the jobs this test starts (each job's task set
    reads it from the live SparkContext's conf)."""
    conf = spark.sparkContext._jsc.sc().conf()
    before = conf.get("spark.driver.maxResultSize", "1g")
    yield lambda size: conf.set("spark.driver.maxResultSize", size)
    conf.set("spark.driver.maxResultSize", before)


@pytest.fixture
def small_batches(spark):
    """Arrow batches of 1,000 rows for the test (Spark's default is 10,000), Spark's own size after
    it: a test's few thousand records then cross batch boundaries, as a run's millions do."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "1000")
    yield
    spark.conf.set(key, before)


@pytest.fixture
def two_passes(monkeypatch):
    """per_partition scope as where Spark's lineage proves nothing: the output is cached and
    scanned before any partition commits (kafka_eos.sinks.per_partition, step 1)."""
    from kafka_eos.sinks import per_partition

    monkeypatch.setattr(per_partition, "lineage_owner", lambda df, plan: None)


@pytest.fixture
def private_broker(tmp_path, free_ports):
    """``private_broker(**settings)``: a broker of this test's own (cold, under tmp_path, on free
    ports), with broker settings of its own; stopped at the end of the test."""
    from kafka_eos.local.kafka import LocalBroker

    started = []

    def start(**overrides) -> LocalBroker:
        broker = LocalBroker(home=tmp_path / f"kafka-{len(started)}", port=free_ports(2),
                             overrides=tuple((k.replace("_", "."), str(v)) for k, v in overrides.items()))
        started.append(broker)
        broker.start()
        return broker

    yield start
    for broker in started:
        broker.stop()
        shutil.rmtree(broker.home, ignore_errors=True)


