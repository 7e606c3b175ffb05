"""Spark Connect: ``kafka-eos run --spark-remote`` through a long-lived server (``kafka-eos spark
start --connect``) is exactly once in both scopes, and so are the fault matrix's crash cells
(the run's process, or in per_partition scope the server's Python worker, killed mid-commit)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest

from kafka_eos import kafka_admin
from kafka_eos_lab.chaos.scenarios import SCENARIOS, run_matrix
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders

from integration.test_faults import write_spec_file

pytestmark = pytest.mark.integration


def kafka_eos_run(spec_file, settings, remote: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kafka_eos.cli", "run", str(spec_file), "--bootstrap",
                           settings.bootstrap_servers, "--spark-remote", remote, *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_a_run_through_the_connect_server_is_exactly_once_and_starts_no_jvm(connect_server, kafka_settings,
                                                                            make_spec, tmp_path, commit):
    spec = make_spec("identity", "kafka", commit)
    truth = produce_orders(kafka_settings, spec.source.topics[0], 300, abort_every=4, malformed_every=0)
    spec_file = write_spec_file(spec, tmp_path / "spec.yaml")
    # No Java for the run's own process: a run that started a JVM of its own would fail here.
    no_java = {"JAVA_HOME": str(tmp_path / "no-java"), "SPARK_HOME": str(tmp_path / "no-spark")}

    run = kafka_eos_run(spec_file, kafka_settings, connect_server.url, "--json", "-v", env=no_java)
    assert run.returncode == 0, run.stderr[-3000:]
    if commit == "per_partition":  # the server's plugin (jvm/connect) proved each task's source partition,
        # and ran the commit job: its records produced from the server's JVM
        assert f"{spec.name}: per_partition in one pass" in run.stderr, run.stderr[-3000:]
        assert f"{spec.name}: per_partition, the records produced from the JVM (3 tasks)" in run.stderr, \
            run.stderr[-3000:]
    else:  # the plugin ran the whole plan's transaction in the server's JVM
        assert f"{spec.name}: atomic, the records produced from the Spark Connect server's JVM" in run.stderr, \
            run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert (summary["status"], summary["records_in"]) == ("committed", len(truth.committed))
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert Counter(out) == Counter(o["order_id"] for o in truth.committed)  # none lost, none twice, none aborted
    ends = kafka_admin.partition_offsets(kafka_settings, [(spec.source.topics[0], p) for p in range(3)])
    checkpoints = kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends))
    assert checkpoints == {tp: o.lso for tp, o in ends.items()}

    again = kafka_eos_run(spec_file, kafka_settings, connect_server.url, env=no_java)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr[-2000:]
    assert len(read_committed(kafka_settings, spec.sink.topic)) == len(out)

    # The run left the pipeline's session of the server open for its next run; no Python daemon
    # started for it in either scope (per_partition's tasks produce from the server's JVM).
    session, daemons = pipeline_session(connect_server.url, spec)
    assert not daemons

    # As a person runs it (steps and Spark's progress on stderr): the next records, exactly once.
    more = produce_orders(kafka_settings, spec.source.topics[0], 60, first_seq=300, abort_every=4,
                          malformed_every=0, transactional_id=f"more-{spec.name}")
    shown = kafka_eos_run(spec_file, kafka_settings, connect_server.url, env=no_java)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "committed in " in shown.stdout and f"in {len(more.committed)}, out {len(more.committed)}" in shown.stdout
    assert "(Spark Connect server sc://127.0.0.1:" in shown.stderr
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert Counter(out) == Counter(o["order_id"] for o in truth.committed + more.committed)
    # The same session on the server, and still no Python daemon.
    assert pipeline_session(connect_server.url, spec) == (session, daemons)

    # The server closed that session (here released; else idle past its timeout): Spark refuses its
    # id from then on, and the next run takes a session of its own, exactly once all the same.
    close_pipeline_session(connect_server.url, spec)
    last = produce_orders(kafka_settings, spec.source.topics[0], 20, first_seq=360, abort_every=0,
                          malformed_every=0, transactional_id=f"last-{spec.name}")
    own = kafka_eos_run(spec_file, kafka_settings, connect_server.url, "-v", env=no_java)
    assert own.returncode == 0, own.stderr[-3000:]
    assert f"pipeline {spec.name}'s session of today was closed by the server" in own.stderr, own.stderr[-3000:]
    out = [json.loads(m.value)["order_id"] for m in read_committed(kafka_settings, spec.sink.topic)]
    assert Counter(out) == Counter(o["order_id"] for o in truth.committed + more.committed + last.committed)


def pipeline_session(url: str, spec) -> tuple[str, set[int]]:
    """The pipeline's session of the server at ``url``, taken up as its runs take it: the server's
    own id of it, and the Python daemons the server started for it (Spark gives them the id as
    ``SPARK_JOB_ARTIFACT_UUID``)."""
    import psutil

    server_id = in_a_session_of_the_pipeline(url, spec, SERVER_ID)
    daemons = set()
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        if "pyspark.daemon" not in " ".join(proc.info["cmdline"] or []):
            continue
        try:
            parent = " ".join(psutil.Process(proc.info["ppid"]).cmdline())
            if "pyspark.daemon" not in parent and proc.environ().get("SPARK_JOB_ARTIFACT_UUID") == server_id:
                daemons.add(proc.pid)  # a daemon (its workers are its children)
        except psutil.Error:
            continue
    return server_id, daemons


def close_pipeline_session(url: str, spec) -> None:
    in_a_session_of_the_pipeline(url, spec, RELEASE)


# What the helpers do in the pipeline's session: a round trip (the server says its session's id),
# then close without releasing it, as a run does; or release it.
SERVER_ID = """
spark.conf.get("spark.sql.session.timeZone")
print(spark.client._server_session_id)
spark.stop()
"""
RELEASE = """
spark.release_session_on_close = True
spark.stop()
"""


def in_a_session_of_the_pipeline(url: str, spec, code: str) -> str:
    """Runs ``code`` with ``spark``, the pipeline's session as its runs take it, in a process of its
    own: a Connect client in the pytest worker would leave gRPC's threads in it (under the forks of
    later tests) and SPARK_CONNECT_MODE_ENABLED in its environment (turning its classic Spark, and
    every process it starts, into Connect clients). Returns what ``code`` printed."""
    script = ("import json, sys\n"
              "from kafka_eos.spark_io import connect_session, connect_session_conf\n"
              "spark = connect_session(sys.argv[1], connect_session_conf(json.loads(sys.argv[2])), sys.argv[3])\n"
              + code)
    run = subprocess.run([sys.executable, "-c", script, url, json.dumps(dict(spec.spark_conf)), spec.name],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_a_run_through_an_unreachable_server_fails_in_one_line_and_commits_nothing(kafka_settings, make_spec,
                                                                                   tmp_path, free_ports):
    spec = make_spec("identity", "kafka", "atomic")
    produce_orders(kafka_settings, spec.source.topics[0], 20, abort_every=0, malformed_every=0)
    spec_file = write_spec_file(spec, tmp_path / "spec.yaml")
    run = kafka_eos_run(spec_file, kafka_settings, f"sc://127.0.0.1:{free_ports(1)}")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith("kafka-eos: "), run.stderr[-2000:]
    assert "Spark Connect" in run.stderr.strip().splitlines()[-1], run.stderr[-2000:]
    ends = kafka_admin.partition_offsets(kafka_settings, [(spec.source.topics[0], p) for p in range(3)])
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, list(ends)).values()) == {None}


SHUFFLING = '''
from pyspark.sql import functions as F

def shuffled(df):
    return df.repartition(2, "key").withColumn("dlq_reason", F.lit(None).cast("string"))
'''


def test_per_partition_refuses_a_shuffling_transform_through_the_connect_server(connect_server, kafka_settings,
                                                                                make_spec, tmp_path):
    """Through Connect the server explains the plan: the transform's Exchange refuses the run in one line
    before the lineage is asked for (with adaptive execution, planning the RDD of a plan with an Exchange
    runs its stages), with nothing committed."""
    spec = make_spec("identity", "kafka", "per_partition")
    module = f"shuffling_{spec.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(SHUFFLING)
    produce_orders(kafka_settings, spec.source.topics[0], 20, abort_every=0, malformed_every=0)
    spec_file = write_spec_file(dataclasses.replace(spec, transform=f"{module}:shuffled"), tmp_path / "spec.yaml")
    run = kafka_eos_run(spec_file, kafka_settings, connect_server.url,
                        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 1, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "shuffles (an Exchange in its plan)" in last and "use commit: atomic" in last, run.stderr[-2000:]
    tps = [(spec.source.topics[0], p) for p in range(3)]
    assert set(kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, tps).values()) == {None}
    assert read_committed(kafka_settings, spec.sink.topic) == []


def test_the_fault_matrix_crash_cells_through_the_connect_server(connect_server, kafka_settings, tmp_path):
    """The driver (the run's process) killed before its commit; a per_partition task's Python worker
    (on the server) killed after it produced; a SQL run killed before its database commit. Each cell's
    checkers: nothing lost, nothing twice, nothing aborted visible, checkpoints at the LSO."""
    by_name = {s.name: s for s in SCENARIOS}
    cells = [(by_name["process SIGKILL at commit"], "atomic"), (by_name["process SIGKILL at produce"], "per_partition"),
             (by_name["process SIGKILL at produce"], "sql")]
    # Crash cells hit no broker: the session's broker serves as the "cluster".
    outcomes = run_matrix(SimpleNamespace(bootstrap=kafka_settings.bootstrap_servers), cells, tmp_path,
                          spark_remote=connect_server.url)
    for o in outcomes:
        assert o.anomalies == 0 and o.exits[0] != 0 and o.exits[-1] == 0, (o, tmp_path)
    assert connect_server.is_running()  # a killed Python worker is the server's task failure, not its end


#: Records per source partition of the read-fault cells through the server: its Arrow batches hold
#: Spark's default 10,000 rows, so the range crosses two batch boundaries.
CONNECT_RECORDS = 25_000
CONNECT_POINTS = {"first": 0, "boundary": 10_000, "mid": 15_000, "last": CONNECT_RECORDS - 1}

RAISING = '''
from pyspark.sql import functions as F

def raising(df):
    hit = (F.col("partition") == 0) & (F.col("offset") == {at})
    return df.where(F.when(hit, F.raise_error(F.lit("a JVM exception in the transform"))).otherwise(F.lit(True))) \\
        .select("key", "value", "topic", "partition", "offset", F.lit(None).cast("string").alias("dlq_reason"))
'''


def _read_fault_through(server_url, kafka_settings, make_spec, tmp_path, commit, point):
    """A JVM exception in the transform at ``point`` of partition 0's input, through the server: the
    run fails with nothing of partition 0 committed; the run again without it: every record once."""
    from confluent_kafka import Producer

    spec = make_spec("identity", "kafka", commit, partitions=2)
    module = f"raising_{spec.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(RAISING.format(at=CONNECT_POINTS[point]))
    src = spec.source.topics[0]
    producer = Producer(kafka_settings.client_config(**{"linger.ms": 20}))
    for i in range(CONNECT_RECORDS):
        for p in (0, 1):
            producer.produce(src, value=f"{p}:{i}".encode(), partition=p)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    faulty = write_spec_file(dataclasses.replace(spec, transform=f"{module}:raising"), tmp_path / "faulty.yaml")
    failed = kafka_eos_run(faulty, kafka_settings, server_url, env=env)
    assert failed.returncode != 0, failed.stdout[-2000:]
    # (A task's Python worker may still be at work after the job failed: what it commits later is
    # caught below, where the run again would find partition 0 committed and write nothing.)
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(src, 0)])[(src, 0)] is None
    assert not [m for m in read_committed(kafka_settings, spec.sink.topic) if m.value.startswith(b"0:")]

    fixed = kafka_eos_run(write_spec_file(spec, tmp_path / "fixed.yaml"), kafka_settings, server_url, env=env)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    out = [m.value.decode() for m in read_committed(kafka_settings, spec.sink.topic)]
    assert len(out) == 2 * CONNECT_RECORDS and len(set(out)) == 2 * CONNECT_RECORDS


def test_a_fault_inside_the_read_through_the_connect_server_commits_nothing_of_its_partition(
        connect_server, kafka_settings, make_spec, tmp_path):
    """The proof of read holds on the server's Python workers (kafka_eos.sinks.proof)."""
    _read_fault_through(connect_server.url, kafka_settings, make_spec, tmp_path, "per_partition", "mid")


@pytest.fixture(scope="module")
def connect_server_without_plugin(tmp_path_factory, free_ports):
    """A Spark Connect server without kafka-eos's plugin, as a managed service runs one: per_partition
    commits in two passes through it."""
    from kafka_eos.local.spark_connect import LocalSparkConnect

    server = LocalSparkConnect(tmp_path_factory.mktemp("spark-connect-bare"), port=free_ports(1), plugin=False)
    server.start()
    yield server
    server.stop()


@pytest.mark.chaos
@pytest.mark.parametrize("point", list(CONNECT_POINTS))
@pytest.mark.parametrize("commit,plugin", [("per_partition", True), ("per_partition", False), ("atomic", True)])
def test_the_grid_of_read_faults_through_connect_servers(commit, plugin, point, kafka_settings, make_spec, tmp_path,
                                                         request):
    server = request.getfixturevalue("connect_server" if plugin else "connect_server_without_plugin")
    _read_fault_through(server.url, kafka_settings, make_spec, tmp_path, commit, point)


def test_a_sql_sinks_row_or_dead_letter_is_one_answer_through_the_connect_server(connect_server, kafka_settings,
                                                                                make_spec, tmp_path):
    """The SQL sink's two Spark jobs (dead letters, results) read the transform's output persisted
    on the server too: a dead-letter rule that answers otherwise each time it is asked (a
    nondeterministic UDF) still gives each record one place."""
    from integration.test_sql_sink import COIN, assert_each_record_in_one_place, coin_places, produce_coin_source

    url = f"sqlite:///{tmp_path / 'coin.db'}"
    spec = make_spec("identity", "sql", "atomic", partitions=2, table="coin", url=url,
                     key_columns=["topic", "partition", "offset"])
    module = f"coin_{spec.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(COIN)
    produce_coin_source(kafka_settings, spec.source.topics[0])
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    spec_file = write_spec_file(dataclasses.replace(spec, transform=f"{module}:coin"), tmp_path / "coin.yaml")
    run = kafka_eos_run(spec_file, kafka_settings, connect_server.url, "--json", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    rows, dead = coin_places(url, spec.name)
    assert_each_record_in_one_place(rows, dead, (summary["records_in"], summary["records_out"],
                                                 summary["dead_letters"]))
