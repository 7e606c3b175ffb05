"""A streaming pipeline's offsets belong to the stream: while ``kafka-eos stream`` runs, neither
``kafka-eos checkpoint --refresh`` nor the watchdog's refresh task commits them (an atomic
stream's producer was fenced by the refresh's init_transactions() and the stream died), and the
stream commits its idle partitions' checkpoints again itself, before a short offsets retention
expires them. Both commit scopes, as separate processes, on a broker of the test's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.readers import read_committed
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import load_spec
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.waits]

KAFKA_EOS = Path(sys.executable).parent / "kafka-eos"
#: The smallest offsets retention Kafka takes (1 minute), checked every second.
RETENTION_S = 60
#: How long the streams run while refreshes are asked for: past the retention after the idle
#: partition's checkpoint was first committed, so it would have expired had nobody refreshed it.
RUN_S = RETENTION_S + 10
IDLE_RECORDS = 5


def _refresh_by_hand(spec_file: Path, bootstrap: str) -> str:
    done = subprocess.run([str(KAFKA_EOS), "checkpoint", str(spec_file), "--refresh", "--bootstrap", bootstrap],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_refreshes_step_aside_for_running_streams_which_keep_their_idle_checkpoints(private_broker, tmp_path,
                                                                                  monkeypatch):
    from kafka_eos_airflow.operators.checks import CheckpointRefreshOperator

    broker = private_broker(offsets_retention_minutes=RETENTION_S // 60, offsets_retention_check_interval_ms=1000)
    settings = KafkaSettings(broker.bootstrap)
    scopes = ("atomic", "per_partition")
    kafka_admin.create_topics(settings, {"in": 2, **{f"out-{s}": 2 for s in scopes}})
    files = {}
    for scope in scopes:
        files[scope] = tmp_path / f"{scope}.yaml"
        files[scope].write_text(f"name: s_{scope}\nsource: {{topics: [in]}}\ntransform: identity\n"
                                f"sink: {{kind: kafka, topic: out-{scope}, commit: {scope}}}\n")
    specs = {scope: load_spec(str(path)) for scope, path in files.items()}
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    written = []

    def produce(n: int, partition: int) -> None:
        for _ in range(n):
            value = f"r{len(written)}".encode()
            producer.produce("in", value=value, partition=partition)
            written.append(value)
        assert producer.flush(30) == 0

    produce(IDLE_RECORDS, 1)  # partition 1 is idle from now on: only the streams' plans commit it again
    produce(10, 0)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("KAFKA_EOS_CRASH_AT", None)
    streams = {scope: subprocess.Popen([str(KAFKA_EOS), "stream", str(files[scope]), "--bootstrap", broker.bootstrap,
                                        "--interval", "0.5"], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
               for scope in scopes}
    try:
        for scope, proc in streams.items():
            first = proc.stdout.readline()
            assert " batch 1 committed" in first, (scope, first, proc.stderr.read() if not first else "")
        started = time.monotonic()
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EOS_KAFKA", f'{{"conn_type": "kafka", "extra": '
                                                           f'{{"bootstrap.servers": "{broker.bootstrap}"}}}}')
        refreshes = {10: "cli", 30: "cli", 45: "watchdog", 60: "cli"}
        while time.monotonic() - started < RUN_S:
            produce(20, 0)
            for at in [t for t in refreshes if time.monotonic() - started >= t]:
                if refreshes.pop(at) == "cli":
                    for scope in scopes:
                        said = _refresh_by_hand(files[scope], broker.bootstrap)
                        assert f"s_{scope}: refresh skipped: streaming (kafka-eos-stream:" in said, said
                else:  # the watchdog's task, as the watchdog DAG builds it
                    done = CheckpointRefreshOperator(task_id="refresh_checkpoints", next_in_s=600,
                                                     pipelines=[str(f) for f in files.values()]).execute({})
                    assert set(done) == {f"s_{s}" for s in scopes}, done
                    assert all(v.startswith("skipped: streaming (kafka-eos-stream:") for v in done.values()), done
            for scope, proc in streams.items():
                assert proc.poll() is None, (scope, proc.stderr.read())
            time.sleep(2)
        assert not refreshes
        total = len(written)
        for scope in scopes:  # caught up, then stopped between batches
            wait_until(f"{scope} caught up", lambda: kafka_admin.committed_offsets(
                settings, specs[scope].source.group_id, [("in", 0)])[("in", 0)] == total - IDLE_RECORDS)
        for proc in streams.values():
            proc.send_signal(signal.SIGTERM)
        for scope, proc in streams.items():
            _out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and "stopped (SIGTERM)" in err, (scope, err[-3000:])
    finally:
        for proc in streams.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    for scope in scopes:
        spec = specs[scope]
        # The idle partition's checkpoint lived through more than the retention: the stream
        # committed it again itself.
        offsets = kafka_admin.committed_offsets(settings, spec.source.group_id, [("in", 0), ("in", 1)])
        assert offsets == {("in", 0): len(written) - IDLE_RECORDS, ("in", 1): IDLE_RECORDS}, (scope, offsets)
        out = read_committed(settings, f"out-{scope}")
        assert sorted(m.value for m in out) == sorted(written), scope  # every record once
        ends = kafka_admin.partition_offsets(settings, [(f"out-{scope}", p) for p in (0, 1)])
        assert all(o.lso == o.high_watermark for o in ends.values()), (scope, ends)  # nothing left open
