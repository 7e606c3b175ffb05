"""Arrow batches of a Kafka-sink transform's output -> output records (kafka_eos.sinks.batches):
what the producer is handed, per row, in every case the sink meets."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pyarrow as pa
import pytest

from kafka_eos.errors import DeadLetterWithoutTopic
from kafka_eos.sinks import batches
from kafka_eos.spec import parse_spec

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def spec(dlq_topic: str | None = "out.dlq"):
    sink = {"kind": "kafka", "topic": "out", "commit": "per_partition"}
    if dlq_topic:
        sink["dlq_topic"] = dlq_topic
    return parse_spec({"name": "p", "source": {"topics": ["in"]}, "transform": "identity", "sink": sink})


def batch(keys, values, reasons, partitions=None, headers=None) -> pa.RecordBatch:
    n = len(keys)
    cols = {"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}
    if headers is not None:
        cols["headers"] = pa.array(headers, HEADERS)
    cols.update({"topic": pa.array(["in"] * n), "partition": pa.array(partitions or [0] * n, pa.int32()),
                 "offset": pa.array(range(10, 10 + n), pa.int64()), "dlq_reason": pa.array(reasons, pa.string())})
    return pa.RecordBatch.from_pydict(cols)


def test_results_without_headers_go_to_the_sink_topic():
    records = list(batches.records([batch([b"k1", None], [b"v1", b"v2"], [None, None])], spec()))
    assert records == [("out", b"k1", b"v1", None), ("out", None, b"v2", None)]


def test_dead_letters_carry_reason_and_source_coordinates_and_carried_headers():
    b = batch([b"k1", b"k2"], [b"v1", b"{bad"], [None, "malformed JSON"], partitions=[3, 3],
              headers=[[{"key": "trace", "value": b"t1"}], None])
    records = list(batches.records([b], spec()))
    assert records[0] == ("out", b"k1", b"v1", [("trace", b"t1")])
    assert records[1] == ("out.dlq", b"k2", b"{bad", [
        ("kafka-eos.reason", b"malformed JSON"), ("kafka-eos.source.topic", b"in"),
        ("kafka-eos.source.partition", b"3"), ("kafka-eos.source.offset", b"11")])


def test_headers_the_spec_adds_are_on_every_record():
    s = spec()
    s = dataclasses.replace(s, sink=dataclasses.replace(s.sink, headers=(("kafka-eos.replay", b"r1"),)))
    records = list(batches.records([batch([b"k"], [b"v"], [None], headers=[[]])], s))
    assert records == [("out", b"k", b"v", [("kafka-eos.replay", b"r1")])]


def test_tally_counts_out_and_dead_per_source_partition():
    tally: Counter = Counter()
    b = batch([b"a", b"b", b"c", b"d"], [b"1", b"2", b"3", b"4"], [None, "bad", None, None], partitions=[0, 0, 1, 1])
    assert len(list(batches.records([b, batch([], [], [])], spec(), tally))) == 4
    assert tally == {(("in", 0), "out"): 1, (("in", 0), "dead"): 1, (("in", 1), "out"): 2}


def test_a_dead_letter_without_a_dead_letter_topic_stops_before_its_batch_is_produced():
    good, bad = batch([b"a"], [b"1"], [None]), batch([b"b", b"c"], [b"2", b"3"], [None, "bad amount: -5"])
    produced = []
    with pytest.raises(DeadLetterWithoutTopic, match=r"in-0 offset 11: dead letter \(bad amount: -5\)"):
        for record in batches.records([good, bad], spec(dlq_topic=None)):
            produced.append(record)
    assert produced == [("out", b"a", b"1", None)]


def test_pack_and_unpack_round_trip_and_source_partitions():
    b = batch([b"a", b"b"], [b"1", b"2"], [None, None], partitions=[4, 5])
    packed = list(batches.pack(iter([b])))
    assert [len(p) for p in packed] == [1]
    (back,) = list(batches.unpack([(packed[0].column(0)[0].as_py(),)]))
    assert back.equals(b)
    assert batches.source_partitions(b) == {("in", 4), ("in", 5)}


def test_source_partitions_of_one_partition_and_of_rows_that_differ_late_or_in_topic():
    assert batches.source_partitions(batch([b"a"] * 3, [b"1"] * 3, [None] * 3, partitions=[2, 2, 2])) == {("in", 2)}
    assert batches.source_partitions(batch([b"a"] * 3, [b"1"] * 3, [None] * 3, partitions=[2, 2, 3])) == {
        ("in", 2), ("in", 3)}
    relabelled = batch([b"a"] * 2, [b"1"] * 2, [None] * 2, partitions=[2, 2])
    relabelled = relabelled.set_column(relabelled.schema.get_field_index("topic"), "topic", pa.array(["in", "other"]))
    assert batches.source_partitions(relabelled) == {("in", 2), ("other", 2)}
    assert batches.source_partitions(relabelled.slice(0, 0)) == set()



def arrivals(order, sizes):
    """Record batches as Spark's Arrow collect hands them over: each partition's batches together,
    the partitions in the order their tasks ended; a partition without rows sends nothing."""
    return [pa.RecordBatch.from_pydict({"v": [f"{part}.{i}"], batches.PART: pa.array([part], pa.int32())})
            for part in order for i in range(sizes[part])]


def values(out):
    return [v for batch in out for v in batch.column("v").to_pylist()]


ONE_GROUP = dict.fromkeys(range(4), 0)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]])
@pytest.mark.parametrize("held_in_memory", [1 << 20, 3])
def test_partitions_come_out_in_their_order_whatever_order_their_tasks_end(order, held_in_memory, monkeypatch):
    monkeypatch.setattr(batches, "HELD_IN_MEMORY", held_in_memory)  # 3 bytes: held batches go to a file
    sizes = {0: 2, 1: 0, 2: 3, 3: 1}  # partition 1 has no rows: it never comes
    out = list(batches.in_order(arrivals(order, sizes), ONE_GROUP))
    assert values(out) == ["0.0", "0.1", "2.0", "2.1", "2.2", "3.0"]
    assert all(batch.schema.names == ["v"] for batch in out)


def test_each_group_keeps_its_own_order_and_no_group_waits_for_another():
    groups = {0: "a", 1: "b", 2: "a", 3: "b"}  # e.g. two source partitions read in two tasks each
    out = values(batches.in_order(arrivals([3, 1, 2, 0], {0: 1, 1: 1, 2: 1, 3: 1}), groups))
    assert out == ["1.0", "3.0", "0.0", "2.0"]


def test_without_groups_batches_go_as_they_come():
    out = values(batches.in_order(arrivals([2, 0, 1], {0: 1, 1: 1, 2: 1}), None))
    assert out == ["2.0", "0.0", "1.0"]


def test_a_partition_in_turn_goes_through_at_once_not_when_the_stream_ends():
    pulled = []

    def rows():
        for batch in arrivals([0, 2, 1], {0: 1, 1: 2, 2: 1}):
            pulled.append(batch)
            yield batch

    seen = [(v, len(pulled)) for batch in batches.in_order(rows(), dict.fromkeys(range(3), 0))
            for v in batch.column("v").to_pylist()]
    # 0.0 as soon as it arrives; 2.0 waits for partition 1, which goes through as it arrives
    assert seen == [("0.0", 1), ("1.0", 3), ("1.1", 4), ("2.0", 4)]


def test_a_batch_of_a_partition_the_plan_does_not_have_is_an_error():
    with pytest.raises(RuntimeError, match="Spark partition 7, which the plan does not have"):
        list(batches.in_order(arrivals([7], {7: 1}), ONE_GROUP))


def test_a_group_goes_in_the_order_it_is_given_not_by_index():
    groups = {2: "a", 0: "a", 1: "a"}  # e.g. task 2 reads the lowest offsets
    out = values(batches.in_order(arrivals([0, 1, 2], {0: 1, 1: 1, 2: 1}), groups))
    assert out == ["2.0", "0.0", "1.0"]


_NO_PANDAS = r'''
import dataclasses, json, sys
import pyarrow as pa
from kafka_eos.sinks import batches
from kafka_eos.sinks.limits import refusing
from kafka_eos.spec import parse_spec

ipc = sys.stdin.buffer.read()
spec = parse_spec({"name": "p", "source": {"topics": ["in"]}, "transform": "identity",
                   "sink": {"kind": "kafka", "topic": "out", "commit": "per_partition", "dlq_topic": "out.dlq"}})
spec = dataclasses.replace(spec, sink=dataclasses.replace(spec.sink, record_limits=(("out", 10_000, 0), ("out.dlq", 10_000, 0))))
assert "pandas" not in sys.modules
for batch in pa.ipc.open_stream(ipc):
    assert batches.source_partitions(batch) == {("in", 3)}
    assert batches.first_dead_letter(batch)["offset"] == 11
    assert refusing(batch, spec) is batch  # no record near a limit: the bound, computed on Arrow's columns
    out = list(batches.records([batch], spec))
    packed = list(batches.pack([batch]))
    row = batches.one_binary_row("result", json.dumps({"n": len(out)}).encode())
print(json.dumps({"pandas": "pandas" in sys.modules, "records": len(out), "result": row.column(0)[0].as_py().decode(),
                  "packed": [b.num_rows for b in batches.unpack([(p.column(0)[0].as_py(),) for p in packed])]}))
'''


def test_a_workers_batch_work_converts_no_python_value_so_never_imports_pandas():
    """pyarrow imports pandas at its first conversion of a Python value (≈ 0.2–0.5 s of every
    Spark Python worker): the per-batch checks, the records, the bound of a batch's records, the
    packed batches and a task's result row convert none."""
    import json
    import subprocess
    import sys

    rows = batch([b"k1", b"k2", b"k3"], [b"v1", b"x" * 2000, b"v3"], [None, "bad json", None], partitions=[3, 3, 3],
                 headers=[[{"key": "h", "value": b"1"}], None, []])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_batch(rows)
    done = subprocess.run([sys.executable, "-c", _NO_PANDAS], input=sink.getvalue().to_pybytes(), capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == {"pandas": False, "records": 3, "result": '{"n": 3}', "packed": [3]}
