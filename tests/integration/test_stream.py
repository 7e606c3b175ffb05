"""Stream mode against the real broker and real Spark: many batches over input with aborted
transactions, both commit scopes and the SQL sink; SIGTERM and SIGKILL of a running stream; the
lease that keeps a stream and batch runs from running the same pipeline at once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, text

from kafka_eos import kafka_admin
from kafka_eos.cli import main as cli
from kafka_eos.errors import PipelineBusy
from kafka_eos.readers import read_committed
from kafka_eos.sample_data import produce_orders
from kafka_eos.spec import spec_document
from kafka_eos.stream.figures import parse_figures_line
from kafka_eos.lease import StreamLease, stream_owner
from kafka_eos.stream.loop import STREAM_RUN_ID, StreamRunner
from waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.waits]

KAFKA_EOS = Path(sys.executable).parent / "kafka-eos"


def caught_up(spec, settings) -> bool:
    """Every source partition's checkpoint is at its LSO."""
    n = kafka_admin.partitions_of(settings, spec.source.topics)[spec.source.topics[0]]
    tps = [(spec.source.topics[0], p) for p in range(n)]
    lso = kafka_admin.partition_offsets(settings, tps)
    cks = kafka_admin.committed_offsets(settings, spec.source.group_id, tps)
    return all(cks[tp] == lso[tp].lso for tp in tps)


def check_kafka_output(spec, settings, committed: list[dict], aborted: list[str]) -> None:
    out = [json.loads(m.value)["order_id"] for m in read_committed(settings, spec.sink.topic)]
    assert Counter(out) == Counter(o["order_id"] for o in committed)  # nothing lost, nothing twice
    assert not set(out) & set(aborted)  # nothing of an aborted input transaction


def stable_output(spec, settings) -> None:
    """No transaction left open on the output: LSO == HW on every output partition."""
    n = kafka_admin.partitions_of(settings, [spec.sink.topic])[spec.sink.topic]
    offsets = kafka_admin.partition_offsets(settings, [(spec.sink.topic, p) for p in range(n)])
    assert all(o.lso == o.high_watermark for o in offsets.values()), offsets


@pytest.mark.parametrize("kind,commit", [("kafka", "atomic"), ("kafka", "per_partition"), ("sql", "atomic")])
def test_stream_many_batches_exactly_once_over_aborted_input(spark, kafka_settings, make_spec, kind, commit):
    transform = "identity" if kind == "kafka" else "spark_apps.transforms.revenue:revenue_per_minute"
    extra = {} if kind == "kafka" else {"key_columns": ["minute", "category"], "merge": "add"}
    spec = make_spec(transform, kind, commit, **extra)
    topic = spec.source.topics[0]
    lines: list[str] = []
    runner = StreamRunner(spark, spec, kafka_settings, interval_s=0.2, report=lines.append)
    failure: list[BaseException] = []

    def run():
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            failure.append(exc)

    stream = threading.Thread(target=run)
    stream.start()
    committed, aborted, malformed = [], [], 0
    try:
        # Waves of input while the stream runs: each wave has aborted and (for SQL) poison records.
        for wave in range(4):
            truth = produce_orders(kafka_settings, topic, 120, first_seq=wave * 120, abort_every=3,
                                   malformed_every=0 if kind == "kafka" else 13,
                                   # per topic: tests of this module run at once on other workers
                                   transactional_id=f"wave-{wave}.{topic}")
            committed += truth.committed
            aborted += truth.aborted
            malformed += truth.malformed
            if wave == 0:
                # The next waves must arrive while the stream runs, not before its first plan (a
                # busy machine once took 5 s to start the stream: all four waves fell in batch 1).
                wait_until("the stream's first batch", lambda: failure or runner.stats.batches >= 1, 120)
            else:
                time.sleep(1.0)
        wait_until("the stream to catch up", lambda: failure or caught_up(spec, kafka_settings), 120)
    finally:
        runner.stop()
        stream.join(60)
    assert not failure, failure
    assert runner.stats.batches >= 2, lines  # waves arrived while it ran: more than one batch
    assert runner.stats.records_in == len(committed) + malformed
    assert all(line.startswith("batch ") and " committed: in " in line for line in lines), lines
    if kind == "kafka":
        check_kafka_output(spec, kafka_settings, committed, aborted)
        stable_output(spec, kafka_settings)
    else:
        with create_engine(spec.sink.url).connect() as conn:
            assert conn.execute(text("select sum(order_count) from results")).scalar() == len(committed)
            assert conn.execute(text("select count(*) from kafka_eos_dead_letters")).scalar() == malformed
    # The progress record: one key for every batch, holding the last batch's plan and number.
    from kafka_eos.manifest import ManifestStore

    record, _parts = ManifestStore.of(spec, kafka_settings).run_records(STREAM_RUN_ID)
    assert record["stream"]["batch"] == runner.stats.batches
    from confluent_kafka.admin import ConfigResource, ResourceType

    manifest = ConfigResource(ResourceType.TOPIC, spec.manifest_topic)
    admin = kafka_admin.admin_client(kafka_settings)  # alive until its answer is read
    configs = admin.describe_configs([manifest])[manifest].result(30)
    assert configs["segment.ms"].value == "3600000"  # compaction reaches the batches' records within the hour
    assert stream_owner(spec, kafka_settings) is None  # the lease was given back


def test_stream_per_partition_keeps_its_producers_between_batches(spark, kafka_settings, make_spec, monkeypatch):
    """A per_partition stream whose batches commit in the executors (batches above
    DRIVER_BATCH_OFFSETS; set to none here) builds a partition's producer once per Spark worker, not
    once per batch: each batch's line says where its producers came from."""
    from kafka_eos.sinks import per_partition

    monkeypatch.setattr(per_partition, "DRIVER_BATCH_OFFSETS", 0)
    spec = make_spec("identity", "kafka", "per_partition", partitions=1)
    topic = spec.source.topics[0]
    lines: list[str] = []
    committed: list[dict] = []

    def wave(line: str | None = None) -> None:  # a batch per wave: the next arrives after a commit
        if line is not None:
            lines.append(line)
        n = len(lines)
        committed.extend(produce_orders(kafka_settings, topic, 20, first_seq=n * 20, abort_every=0,
                                        malformed_every=0, transactional_id=f"wave-{n}.{topic}").committed)

    wave()
    runner = StreamRunner(spark, spec, kafka_settings, interval_s=0.1, report=wave, max_batches=6)
    runner.run()
    committed = committed[:6 * 20]  # the wave after the last batch is not read
    assert runner.stats.batches == 6, lines
    producers = Counter()
    for line in lines:
        for how in ("kept", "built", "rebuilt"):
            found = re.search(rf"\b{how} (\d+)", line)
            producers[how] += int(found.group(1)) if found else 0
    assert sum(producers.values()) == 6, lines  # one transaction per batch, each through one producer
    # Built at most once per Python worker that ran a batch (local[2]: two, a third if one was
    # replaced), never once per batch as before.
    assert producers["built"] <= 3 and producers["kept"] + producers["rebuilt"] >= 3, lines
    check_kafka_output(spec, kafka_settings, committed, [])
    stable_output(spec, kafka_settings)


def _start_stream(spec_file: Path, settings, *flags: str, crash_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("KAFKA_EOS_CRASH_AT", None)
    if crash_at:
        env["KAFKA_EOS_CRASH_AT"] = crash_at
    return subprocess.Popen([str(KAFKA_EOS), "stream", str(spec_file), "--bootstrap", settings.bootstrap_servers,
                             "--interval", "0.2", *flags], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _scrape(url: str, pipeline: str) -> dict[tuple[str, str | None], float]:
    """A Prometheus endpoint's samples of ``pipeline``: (name, status label or None) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        return {(s.name, s.labels.get("status")): s.value for f in families for s in f.samples
                if s.labels.get("pipeline") == pipeline}


def _spec_file(spec, tmp_path: Path) -> Path:
    path = tmp_path / f"{spec.name}.yaml"
    path.write_text(yaml.safe_dump(spec_document(spec)))
    return path


def test_sigterm_mid_stream_exits_clean_and_a_restart_is_exactly_once(kafka_settings, make_spec, tmp_path,
                                                                      capsys, monkeypatch, free_ports):
    spec = make_spec("identity", "kafka", "atomic")
    spec_file = _spec_file(spec, tmp_path)
    monkeypatch.setattr("kafka_eos.spec.pipelines_dir", lambda: tmp_path)  # `pipelines` lists this spec
    truth = produce_orders(kafka_settings, spec.source.topics[0], 3000, abort_every=4, malformed_every=0)
    port = free_ports(1)
    proc = _start_stream(spec_file, kafka_settings, "--max-records", "100", "--metrics-port", str(port), "--figures")
    try:
        first = proc.stdout.readline()
        assert first.split(" ", 1)[1].startswith("batch 1 committed"), (first, proc.stderr.read())
        figures = parse_figures_line(proc.stdout.readline())
        assert (figures["pipeline"], figures["batch"], figures["status"]) == (spec.name, 1, "committed")
        assert figures["records_in"] > 0 and figures["latency_s"] > figures["plan_s"] >= 0
        # The same figures, on the stream's Prometheus endpoint.
        scraped = _scrape(f"http://127.0.0.1:{port}/metrics", spec.name)
        committed_batches = scraped[("kafka_eos_stream_batches_total", "committed")]
        assert committed_batches >= 1
        assert scraped[("kafka_eos_stream_batch_latency_seconds_count", None)] == committed_batches
        assert scraped[("kafka_eos_stream_records_in_total", None)] >= figures["records_in"]
        # While it runs, it owns the pipeline: a batch run steps aside, a second stream is refused.
        owner = stream_owner(spec, kafka_settings)
        assert owner is not None and owner.client_id.endswith(f":{proc.pid}")
        assert cli(["run", str(spec_file), "--bootstrap", kafka_settings.bootstrap_servers]) == 1
        assert "is owned by a stream" in capsys.readouterr().err
        assert cli(["pipelines", "--bootstrap", kafka_settings.bootstrap_servers, "--json"]) == 0
        (listed,) = json.loads(capsys.readouterr().out)["pipelines"]
        assert listed["streaming"] == owner.client_id and listed["last_run"]["stream_batch"] >= 1
        with pytest.raises(PipelineBusy, match="already streaming"):
            StreamLease(spec, kafka_settings).acquire(wait_s=0)
        proc.send_signal(signal.SIGTERM)  # mid-stream: batches of 100 offsets, 3000 to go
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "stopped (SIGTERM)" in err
    # One figures line per committed batch; together they count what the stream says it did.
    lines = [figures, *filter(None, map(parse_figures_line, out.splitlines()))]
    total_in = int(re.search(r"stopped \(SIGTERM\): \d+ batch\(es\), in (\d+),", err).group(1))
    assert sum(f["records_in"] for f in lines) == total_in
    stable_output(spec, kafka_settings)  # the batch in flight finished: no open transaction
    assert not caught_up(spec, kafka_settings), "the stream should have stopped before the end"
    assert stream_owner(spec, kafka_settings) is None  # the lease went with it

    again = _start_stream(spec_file, kafka_settings, "--until-caught-up")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    check_kafka_output(spec, kafka_settings, truth.committed, truth.aborted)
    stable_output(spec, kafka_settings)
    assert caught_up(spec, kafka_settings)


@pytest.mark.parametrize("commit", ["atomic", "per_partition"])
def test_sigkill_mid_transaction_then_restart_is_exactly_once(kafka_settings, make_spec, tmp_path, commit):
    spec = make_spec("identity", "kafka", commit)
    spec_file = _spec_file(spec, tmp_path)
    truth = produce_orders(kafka_settings, spec.source.topics[0], 2000, abort_every=5, malformed_every=0)
    # The 3rd batch's (first) transaction is SIGKILLed after 100 of its records reached the broker:
    # atomic, a transaction a batch; per_partition, a transaction per partition (3), each batch's
    # committed from the stream's own process (a small batch: per_partition.driver_commits).
    killed = _start_stream(spec_file, kafka_settings, "--max-records", "150" if commit == "atomic" else "300",
                           crash_at="after_produce:3" if commit == "atomic" else "after_produce:7")
    out, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, (out, err)
    assert out.count(" committed: in ") == 2, out
    n = kafka_admin.partitions_of(kafka_settings, [spec.sink.topic])[spec.sink.topic]
    offsets = kafka_admin.partition_offsets(kafka_settings, [(spec.sink.topic, p) for p in range(n)])
    assert any(o.lso < o.high_watermark for o in offsets.values()), "the killed transaction should be open"

    # At once, not after the session timeout: the dead stream's lease expires while it waits.
    again = _start_stream(spec_file, kafka_settings, "--until-caught-up")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    check_kafka_output(spec, kafka_settings, truth.committed, truth.aborted)
    stable_output(spec, kafka_settings)  # its init_transactions() aborted the killed transaction
    assert caught_up(spec, kafka_settings)


def test_two_streams_racing_for_the_lease_end_with_one_owner(kafka_settings, make_spec, monkeypatch):
    """Both looked before either joined: Kafka assigns the lease partition to one of them; the
    other lets go (at once when it never got it, or when it was taken from it and not given back)."""
    from kafka_eos import lease as lease_module

    spec = make_spec("identity", "kafka", "atomic")
    first = StreamLease(spec, kafka_settings)
    first.acquire()
    outcome: dict[str, BaseException | None] = {}
    stop = threading.Event()

    def first_keeps_polling():  # a running stream polls between batches
        try:
            while not stop.is_set():
                first.keep()
                time.sleep(0.2)
            outcome["first"] = None
        except PipelineBusy as exc:
            outcome["first"] = exc

    poller = threading.Thread(target=first_keeps_polling)
    poller.start()
    monkeypatch.setattr(lease_module, "stream_owner", lambda *_: None)  # the second looked too early
    second = StreamLease(spec, kafka_settings)
    try:
        second.acquire(wait_s=0)
        outcome["second"] = None
    except PipelineBusy as exc:
        outcome["second"] = exc
    monkeypatch.undo()
    if outcome["second"] is None:  # the second won: the first must notice and let go
        poller.join(lease_module.LOST_AFTER_S + 15)
        assert isinstance(outcome.get("first"), PipelineBusy), outcome
    else:  # the first kept it
        time.sleep(2)
        stop.set()
        poller.join(30)
        assert outcome["first"] is None, outcome
        assert stream_owner(spec, kafka_settings).client_id == first.client_id
    stop.set()
    first.release()
    second.release()
    assert stream_owner(spec, kafka_settings) is None


def test_a_refresh_that_found_no_stream_never_fences_one_that_started_since(spark, kafka_settings, make_spec,
                                                                            monkeypatch):
    """The refresh looked for a stream, then committed: a stream that started in between was fenced
    by the refresh's init_transactions() and stopped (ProducerFenced is not retried). Now the
    refresh holds the stream's lease while it commits; one that cannot take it steps aside."""
    from kafka_eos import pipeline
    from kafka_eos import lease

    spec = make_spec("identity", "kafka", "atomic")
    topic = spec.source.topics[0]
    produce_orders(kafka_settings, topic, 30, abort_every=0, malformed_every=0)
    runner = StreamRunner(spark, spec, kafka_settings, interval_s=0.2)
    failure: list[BaseException] = []

    def run():
        try:
            runner.run()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    stream = threading.Thread(target=run)
    stream.start()
    try:
        wait_until("the stream's first batch", lambda: failure or runner.stats.batches >= 1, 120)
        real, looks = lease.stream_owner, []

        def looked_before_it_started(spec_, settings_):  # the refresh's first look came before the stream
            looks.append(1)
            return None if len(looks) == 1 else real(spec_, settings_)

        monkeypatch.setattr(pipeline, "stream_owner", looked_before_it_started)  # its own look
        done = pipeline.refresh_checkpoints(spec, kafka_settings, every=True)
        monkeypatch.undo()
        assert done.skipped and done.skipped.startswith("streaming (kafka-eos-stream:"), done
        more = produce_orders(kafka_settings, topic, 30, first_seq=30, abort_every=0, malformed_every=0,
                              transactional_id=f"more-{topic}")
        wait_until("the stream to catch up", lambda: failure or caught_up(spec, kafka_settings), 120)
    finally:
        runner.stop()
        stream.join(60)
    assert not failure, failure  # not fenced: the stream ran on and wrote the next records
    assert len(read_committed(kafka_settings, spec.sink.topic)) == 30 + len(more.committed)
