"""The fault matrix's parts that need no broker: placing coordinators as Kafka does, the matrix's
cells, and every step it pauses or kills at being a fail point the commit paths really pass."""

from __future__ import annotations

import re
from pathlib import Path

from kafka_eos_lab.chaos.brokers import coordinator_partition, java_hash
from kafka_eos_lab.chaos.scenarios import QUICK, SCENARIOS, SINKS, STEPS, cells_of

INCLUDE = Path(__file__).resolve().parents[2] / "include" / "kafka_eos"


def test_java_hash_is_javas_string_hashcode():
    # Values printed by Java (jshell): "".hashCode(), "hello".hashCode(), the string whose hash is
    # Integer.MIN_VALUE, and a pipeline's group id.
    assert java_hash("") == 0
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == -2147483648
    assert java_hash("kafka-eos.orders_enriched") == 1987994738


def test_coordinator_partition_follows_kafkas_utils_abs():
    # Utils.abs(Integer.MIN_VALUE) is 0 (a mask, not Math.abs): partition 0 of any count.
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("hello", 4) == 2


def test_every_step_is_a_fail_point_the_code_passes():
    source = "".join(p.read_text() for p in INCLUDE.rglob("*.py"))
    passed = set(re.findall(r'\bpoint\("(\w+)"\)', source))
    named = {point for by_sink in STEPS.values() for point in by_sink.values() if point}
    assert named <= passed, named - passed


def test_the_matrix_covers_every_sink_and_leaves_out_what_does_not_apply():
    cells = cells_of()
    assert {sink for _, sink in cells} == set(SINKS)
    # SQL and Iceberg sinks have no Kafka commit step and no producer to stall.
    assert not [s.name for s, sink in cells if sink in ("sql", "iceberg") and s.kind == "stall"]
    assert not [s.name for s, sink in cells if sink in ("sql", "iceberg") and s.step == "commit"]
    assert [s.name for s, sink in cells if sink == "sql"] == [s.name for s, sink in cells if sink == "iceberg"]
    assert len(cells) == len(set((s.name, s.step, sink) for s, sink in cells))
    by_name = {s.name for s in SCENARIOS}
    assert all(name in by_name for name, _ in QUICK)
    assert [sink for _, sink in cells_of(quick=True)] == [sink for _, sink in QUICK]
    assert {s.name for s, _ in cells_of(["SIGSTOP"])} == {s.name for s in SCENARIOS if "SIGSTOP" in s.name}
