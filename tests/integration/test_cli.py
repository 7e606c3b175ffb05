"""The command line (docs/cli.md): outputs, exit codes, one-line errors, flags anywhere."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos.cli import main
from kafka_eos.spec import spec_document

pytestmark = pytest.mark.integration


def test_kafka_status_prints_the_bootstrap_address(kafka_settings, capsys, monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    from kafka_eos.local.kafka import LocalBroker

    if LocalBroker.default().bootstrap != kafka_settings.bootstrap_servers:
        pytest.skip("tests run against $KAFKA_BOOTSTRAP_SERVERS, not the local broker")
    assert main(["kafka", "status"]) == 0
    assert capsys.readouterr().out.strip() == kafka_settings.bootstrap_servers


def test_plan_and_checkpoint_json(kafka_settings, make_spec, tmp_path, capsys):
    spec = make_spec(partitions=2)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    p = Producer(kafka_settings.client_config())
    written_ms = int(time.time() * 1000) - 90_000  # the backlog is 90 s old
    for i in range(3):
        p.produce(spec.source.topics[0], value=b"x", partition=1, timestamp=written_ms + i)
    p.flush(30)

    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    assert main([*boot, "plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [(r["partition"], r["from_offset"], r["until"]) for r in plan["ranges"]] == [(0, 0, 0), (1, 0, 3)]
    assert main([*boot, "checkpoint", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["partitions"]
    assert [(r["partition"], r["checkpoint"], r["lso"], r["lag"]) for r in rows] == [(0, None, 0, 0), (1, None, 3, 3)]
    assert rows[0]["oldest_unprocessed"] is None
    oldest = rows[1]["oldest_unprocessed"]
    assert (oldest["offset"], oldest["timestamp_ms"]) == (0, written_ms) and 90 <= oldest["age_s"] < 150
    assert main([*boot, "checkpoint", str(path)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.lstrip().startswith(f"{spec.source.topics[0]}-1 ")]
    assert line.split()[-1].endswith("s") and 90 <= float(line.split()[-1][:-1]) < 150  # the oldest column
    (line,) = [ln for ln in out.splitlines() if ln.lstrip().startswith(f"{spec.source.topics[0]}-0 ")]
    assert line.split()[-1] == "-"


def test_errors_are_one_line_on_stderr_with_nonzero_exit(kafka_settings, make_spec, tmp_path, capsys):
    spec = make_spec()
    doc = spec_document(spec)
    doc["source"]["topics"] = ["no-such-topic-cli"]
    path = tmp_path / "missing.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "source topic 'no-such-topic-cli' does not exist" in err

    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "plan", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml: no such pipeline spec" in capsys.readouterr().err


def _spec_file(spec, tmp_path, **changes):
    doc = spec_document(spec)
    for dotted, value in changes.items():
        section, _, field = dotted.rpartition(".")
        (doc[section] if section else doc)[field] = value
    path = tmp_path / f"{spec.name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_global_flags_work_after_the_command_too(kafka_settings, make_spec, tmp_path, capsys):
    path = _spec_file(make_spec(partitions=1), tmp_path)
    assert main(["plan", str(path), "--bootstrap", kafka_settings.bootstrap_servers, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["ranges"][0]["until"] == 0
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "checkpoint", "-v", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partitions"][0]["lag"] == 0


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    # One version: the package's metadata is read from kafka_eos.__version__, which --version prints.
    from importlib import metadata

    assert capsys.readouterr().out.strip() == f"kafka-eos {metadata.version('kafka-eos')}" == "kafka-eos 0.3.0"


def test_unreachable_broker_is_one_line_naming_the_address_within_the_connect_timeout(
        make_spec, tmp_path, capfd, monkeypatch):
    path = _spec_file(make_spec(partitions=1), tmp_path)
    monkeypatch.setenv("KAFKA_EOS_CONNECT_TIMEOUT_S", "3")
    started = time.monotonic()
    assert main(["run", str(path), "--bootstrap", "127.0.0.1:1"]) == 1
    elapsed = time.monotonic() - started
    out, err = capfd.readouterr()  # file descriptors: librdkafka writes to fd 2 unless routed
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("kafka-eos: cannot reach Kafka at 127.0.0.1:1 within 3s")
    assert "Connection refused" in err
    assert elapsed < 3 + 3, elapsed


def test_plan_and_checkpoint_do_not_import_the_transform(kafka_settings, make_spec, tmp_path, capsys):
    path = _spec_file(make_spec(partitions=1), tmp_path, transform="not_installed_anywhere:f")
    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    assert main(["plan", str(path), *boot]) == 0
    assert "1 partition(s), up to 0 offsets" in capsys.readouterr().out
    assert main(["checkpoint", str(path), *boot]) == 0
    assert "lag is counted to the LSO" in capsys.readouterr().out
    assert main(["run", str(path), *boot]) == 1
    assert "transform: cannot import module 'not_installed_anywhere'" in capsys.readouterr().err


def _five_records(kafka_settings, make_spec, tmp_path):
    """An atomic pipeline over two partitions that hold five records (3 and 2), its spec file, its
    producer and the ``--bootstrap`` flag."""
    spec = make_spec(partitions=2, commit="atomic")
    path = _spec_file(spec, tmp_path)
    p = Producer(kafka_settings.client_config())
    for i in range(5):
        p.produce(spec.source.topics[0], value=b"x", partition=i % 2)
    p.flush(30)
    return spec, path, p, ["--bootstrap", kafka_settings.bootstrap_servers]


def test_run_prints_a_summary_per_partition_and_json(spark, kafka_settings, make_spec, tmp_path, capsys):
    spec, path, p, boot = _five_records(kafka_settings, make_spec, tmp_path)

    assert main(["run", str(path), *boot, "--run-id", "r1"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("run r1: committed in ")
    assert "in 5, out 5, dead letters 0" in out.splitlines()[0]
    rows = [line.split() for line in out.splitlines()[2:]]
    assert rows == [[f"{spec.source.topics[0]}-0", "0", "3", "3", "3", "0"],
                    [f"{spec.source.topics[0]}-1", "0", "2", "2", "2", "0"]]
    assert "plan   2 partition(s)" in err and "WARN" not in err

    assert main(["run", str(path), *boot, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "empty"

    # A run's empty plan stays its plan when it is run again: the line says so, not that every
    # checkpoint is at its LSO (records came since); the next run takes them.
    assert main(["run", str(path), *boot, "--run-id", "r2"]) == 0
    assert capsys.readouterr().out.startswith("run r2: nothing to do, every checkpoint is at its partition's LSO (")
    p.produce(spec.source.topics[0], value=b"y", partition=0)
    p.flush(30)
    assert main(["run", str(path), *boot, "--run-id", "r2"]) == 0
    out = capsys.readouterr().out
    assert re.match(r"run r2: nothing to do: its plan, made at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC by an earlier "
                    r"attempt, is empty \(a run keeps its plan; records since then go to the next run\) \(", out), out
    assert main(["run", str(path), *boot, "--run-id", "r3"]) == 0
    assert "in 1, out 1, dead letters 0" in capsys.readouterr().out.splitlines()[0]


def test_pipelines_lists_specs_with_lag_and_last_run(kafka_settings, make_spec, tmp_path, capsys, monkeypatch):
    spec = make_spec(partitions=1)
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / f"{spec.name}.yaml").write_text(yaml.safe_dump(spec_document(spec)))
    (folder / "broken.yaml").write_text("name: broken\nsource: {}\n")
    monkeypatch.setattr("kafka_eos.spec.pipelines_dir", lambda: folder)
    p = Producer(kafka_settings.client_config())
    for _ in range(4):
        p.produce(spec.source.topics[0], value=b"x")
    p.flush(30)
    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    assert main(["plan", str(folder / f"{spec.name}.yaml"), *boot]) == 0  # plan has no side effects
    capsys.readouterr()

    assert main(["pipelines", *boot, "--json"]) == 0
    found = {p["name"]: p for p in json.loads(capsys.readouterr().out)["pipelines"]}
    assert found[spec.name]["lag"] == 4
    assert found[spec.name]["last_run"] is None
    assert (found[spec.name]["sink"], found[spec.name]["commit"]) == ("kafka", "atomic")
    assert "source.topics" in found["broken"]["error"]
    assert main(["pipelines", *boot]) == 0
    text = capsys.readouterr().out
    assert spec.name in text and "error (below)" in text


def test_a_reader_that_goes_early_ends_the_output_not_the_command(kafka_settings, make_spec, tmp_path):
    """``kafka-eos txn hanging | head -1``: the reader went before the command ended, and a
    BrokenPipeError turned the command's own exit code (3 for a finding) into 2 ("unexpected"),
    or 120 where it came at the interpreter's last flush. Now the output ends there, quietly, and
    the command exits with its own code."""
    import subprocess
    import sys

    path = _spec_file(make_spec(partitions=3), tmp_path)
    command = [sys.executable, "-m", "kafka_eos.cli", "plan", str(path), "--bootstrap", kafka_settings.bootstrap_servers]
    for extra in ([], ["--json"]):
        child = subprocess.Popen([*command, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child.stdout.close()  # the reader is gone before the first line
        err = child.stderr.read().decode()
        assert (child.wait(timeout=120), err) == (0, "")


def test_checkpoint_names_each_partition_whose_group_offset_is_gone(spark, kafka_settings, make_spec, tmp_path,
                                                                    capsys):
    """A Kafka sink's group deleted (or its offsets expired): ``checkpoint`` showed ``-`` and the lag
    from the log start, exit 0, with no word of it, while ``plan`` and ``run`` refuse. Now it names
    each partition with the checkpoint kafka-eos committed there and the command that restores it."""
    from kafka_eos import kafka_admin

    spec, path, _producer, boot = _five_records(kafka_settings, make_spec, tmp_path)
    assert main(["run", str(path), *boot, "--run-id", "r1"]) == 0
    admin = kafka_admin.admin_client(kafka_settings)  # kept: its futures complete while it lives
    for fut in admin.delete_consumer_groups([spec.source.group_id]).values():
        fut.result(30)
    capsys.readouterr()

    assert main(["checkpoint", str(path), *boot]) == 0
    lost = [line.strip() for line in capsys.readouterr().out.splitlines() if "LOST" in line]
    topic, group = spec.source.topics[0], spec.source.group_id
    assert [line.split(":")[0] for line in lost] == [f"LOST {topic}-0", f"LOST {topic}-1"], lost
    assert lost[0].startswith(f"LOST {topic}-0: group '{group}' has no committed offset, but run 'r1' committed 3 at ")
    assert lost[1].endswith(f"kafka-consumer-groups --group {group} --topic {topic}:1 --reset-offsets --to-offset 2 "
                            "--execute")
    assert main(["checkpoint", str(path), *boot, "--json"]) == 0
    assert [(r["partition"], r["offset"], r["run_id"]) for r in json.loads(capsys.readouterr().out)["lost"]] == [
        (0, 3, "r1"), (1, 2, "r1")]
    assert main(["plan", str(path), *boot]) == 1  # as the runs refuse, naming every partition
    assert capsys.readouterr().err.strip().endswith(
        f"--to-offset 3 --execute); likewise {topic}-1 (kafka-eos checkpoint {spec.name} gives each one's offset)")


RAISER = '''
from pyspark.sql import functions as F
from pyspark.sql import types as T


@F.udf(T.BooleanType())
def _check(offset):
    if offset == 2:
        raise ValueError(f"boom at offset {offset}")
    return True


def raiser(df):
    return df.where(_check(F.col("offset"))).select("key", "value", "topic", "partition", "offset",
                                                    F.lit(None).cast("string").alias("dlq_reason"))
'''


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_a_transform_raising_in_a_spark_task_is_named_in_one_line_exit_1(spark, kafka_settings, make_spec,
                                                                         transforms_from, unique, tmp_path,
                                                                         capsys, commit):
    """A transform's UDF raising on a record exited 2, "unexpected", as a bug of kafka-eos's own
    would. Now it is the transform's error: exit 1, one line naming the spec and the transform,
    with the exception's own line; nothing committed."""
    from kafka_eos import kafka_admin

    module = transforms_from(f"raiser_{unique.replace('-', '_')}", RAISER)
    spec = make_spec(f"{module}:raiser", commit=commit, partitions=1)
    path = _spec_file(spec, tmp_path)
    p = Producer(kafka_settings.client_config())
    for _ in range(5):
        p.produce(spec.source.topics[0], value=b"x", partition=0)
    p.flush(30)
    capsys.readouterr()
    assert main(["run", str(path), "--bootstrap", kafka_settings.bootstrap_servers, "--run-id", "r1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"kafka-eos: {path}: transform {module}:raiser raised in a Spark task: "
                       "ValueError: boom at offset 2"), err
    assert kafka_admin.committed_offsets(kafka_settings, spec.source.group_id, [(spec.source.topics[0], 0)]) == {
        (spec.source.topics[0], 0): None}


def test_a_look_at_offsets_a_killed_attempt_left_pending_shows_them_as_before_it_and_says_so(
        kafka_settings, make_spec, tmp_path, capsys, monkeypatch):
    """An attempt killed between sending its offsets and its commit leaves the group's offsets
    pending until a run fences it (or its transaction times out). ``checkpoint`` and ``plan``
    waited 30 s for them, then failed with "Failed to get committed offsets: Local: Timed out",
    blaming the cluster. Now they show the offsets before that transaction within seconds, and say
    why; a run's plan fences that attempt after the same few seconds."""
    from confluent_kafka import Consumer, TopicPartition

    from kafka_eos import kafka_admin

    spec = make_spec(partitions=2, commit="atomic")
    path = _spec_file(spec, tmp_path)
    topic, group = spec.source.topics[0], spec.source.group_id
    p = Producer(kafka_settings.client_config())
    for i in range(6):
        p.produce(topic, value=b"x", partition=i % 2)
    p.flush(30)
    kafka_admin.alter_group_offsets(kafka_settings, group, {(topic, 0): 1, (topic, 1): 0})
    # The killed attempt: the pipeline's own transactional id, its offsets sent, never committed.
    killed = Producer(kafka_settings.client_config(**{"transactional.id": spec.transactional_id(),
                                                      "transaction.timeout.ms": 600_000}))
    killed.init_transactions(30)
    killed.begin_transaction()
    member = Consumer(kafka_settings.client_config(**{"group.id": group}))
    killed.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], member.consumer_group_metadata(), 30)
    member.close()
    boot = ["--bootstrap", kafka_settings.bootstrap_servers]
    capsys.readouterr()

    began = time.monotonic()
    assert main(["checkpoint", str(path), *boot, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["partitions"]
    assert [(r["partition"], r["checkpoint"], r["pending"]) for r in rows] == [(0, 1, True), (1, 0, True)]
    assert main(["checkpoint", str(path), *boot]) == 0
    assert f"PENDING: the offsets of group '{group}' are held by an open transaction" in capsys.readouterr().out
    assert main(["plan", str(path), *boot, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pending"] and [(r["partition"], r["from_offset"]) for r in shown["plan"]["ranges"]] == [(0, 1), (1, 0)]
    monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(tmp_path))
    assert main(["pipelines", *boot]) == 0
    assert f"{spec.name}: PENDING: the offsets of group '{group}' are held" in capsys.readouterr().out
    assert time.monotonic() - began < 30  # four looks, each waiting LOOK_SETTLE_S at most, not 30 s each

    # A run's plan fences the killed attempt once the offsets stay pending for LOOK_SETTLE_S (it
    # waited the full 30 s first), and plans from the offsets before it.
    from kafka_eos.pipeline import prepare_plan

    began = time.monotonic()
    plan = prepare_plan(spec, kafka_settings, "after-the-kill")
    assert time.monotonic() - began < 20
    assert [(r.partition, r.from_offset, r.until) for r in plan.active] == [(0, 1, 3), (1, 0, 3)]
    assert main(["checkpoint", str(path), *boot, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["partitions"]
    assert [(r["partition"], r["checkpoint"], r["pending"]) for r in rows] == [(0, 1, False), (1, 0, False)]
