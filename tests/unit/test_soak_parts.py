"""The soak's parts that need no cluster: the seeded fault schedule, the audit's plain reader (which
orders are valid, what they add up to), the recovery time and the lag chart. The soak itself runs
on real parts in tests/dags/test_soak.py."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from decimal import Decimal
from types import SimpleNamespace

from kafka_eos.health import watch_threshold_s
from kafka_eos.sample_data import MALFORMED, order_record
from kafka_eos_lab.soak.audit import SourceRecord, eur_rates, revenue, valid_order
from kafka_eos_lab.soak.faults import KINDS, QUIET_S, schedule
from kafka_eos_lab.soak.lag import Sample, recovered_at
from kafka_eos_lab.soak.report import lag_svg, recovery_table


def test_the_schedule_is_the_seeds_quiet_at_both_ends_and_meets_every_kind_in_an_hour():
    hour = schedule(11, 60)
    assert hour == schedule(11, 60) and hour != schedule(12, 60)
    assert hour[0][0] == QUIET_S and all(t <= 60 * 60 - QUIET_S for t, _ in hour)
    assert [t for t, _ in hour] == sorted(t for t, _ in hour)
    assert {k for _, k in hour} == set(KINDS)
    # A stranger is alerted only after the watchdog's threshold: never drawn where that cannot end in the soak.
    for seed in range(30):
        for t, kind in schedule(seed, 5):
            assert kind != "stranger"
            assert QUIET_S <= t <= 4 * 60
        latest = max((t for t, k in schedule(seed, 60) if k == "stranger"), default=0)
        assert latest + watch_threshold_s([]) + 60 <= 59 * 60


def test_the_plain_reader_tells_valid_orders_from_every_kind_of_poison():
    rates, rng, start = eur_rates(), random.Random(3), datetime(2026, 11, 26, tzinfo=timezone.utc)
    verdicts = {}
    for seq in range(200):
        order, value, poison = order_record(seq, rng, start)
        verdicts[seq] = (valid_order(value, rates) is None, poison)
        if not poison:
            assert valid_order(value, rates) == order
    assert all(found == produced for found, produced in verdicts.values())
    assert sum(p for _, p in verdicts.values()) >= len(MALFORMED)  # every kind met
    for value in (None, b"", b"[1]", json.dumps({**order, "amount": "1.234"}).encode(),
                  json.dumps({**order, "ts": "2026-11-26T10:00:00"}).encode(),
                  json.dumps({**order, "customer_id": " "}).encode()):
        assert valid_order(value, rates) is None, value


def test_revenue_rounds_each_order_to_the_cent_then_adds_per_minute_and_category():
    def rec(amount, currency, ts, category="books"):
        return SourceRecord(0, 0, 0, {"order_id": "o", "customer_id": "c", "amount": amount, "currency": currency,
                                      "category": category, "ts": ts})

    got = revenue([rec("10.00", "USD", "2026-11-26T10:00:59Z"), rec("1.01", "JPY", "2026-11-26T10:00:00Z"),
                   rec("3.00", "EUR", "2026-11-26T10:01:00Z"), rec("3.00", "EUR", "2026-11-26T10:00:00Z", "tools")])
    assert got == {("2026-11-26 10:00", "books"): (Decimal("9.21"), 2),  # 9.20 + 0.01 (0.006161)
                   ("2026-11-26 10:01", "books"): (Decimal("3.00"), 1),
                   ("2026-11-26 10:00", "tools"): (Decimal("3.00"), 1)}


def test_a_fault_is_recovered_from_when_every_pipeline_passed_the_lsos_at_its_heal():
    samples = [Sample(10, {}, {"a": {"orders-0": 5}, "b": {"orders-0": 9}}),
               Sample(20, {}, {"a": {"orders-0": 9}, "b": {"orders-0": 8}}),
               Sample(30, {}, {"a": {"orders-0": 9}, "b": {"orders-0": 9}})]
    assert recovered_at(samples, 15, {"orders-0": 9}) == 30
    assert recovered_at(samples, 31, {"orders-0": 9}) is None
    assert recovered_at(samples, 0, {"orders-0": 5}) == 10


def test_recovery_per_fault_kind_counts_from_the_heal_against_the_target():
    samples = [Sample(at, {}, {"a": {"orders-0": ck}}) for at, ck in ((100, 3), (150, 9), (400, 20))]
    events = [SimpleNamespace(kind="worker_kill", injected=90.0, healed=95.0, lso_at_heal={"orders-0": 9}),
              SimpleNamespace(kind="worker_kill", injected=190.0, healed=200.0, lso_at_heal={"orders-0": 20}),
              SimpleNamespace(kind="scheduler_kill", injected=380.0, healed=390.0, lso_at_heal={"orders-0": 30}),
              SimpleNamespace(kind="replay", injected=10.0, healed=None, lso_at_heal={})]
    rows = {line.split()[0]: line.split()[1:] for line in recovery_table(events, samples, 120).splitlines()[1:]}
    # worker_kill: 55 s and 200 s after their heals (one over 120 s); scheduler_kill never recovered.
    assert rows == {"worker_kill": ["2", "200", "1"], "scheduler_kill": ["1", "-", "1"]}


def test_the_lag_chart_is_an_svg_with_a_line_per_pipeline_and_a_mark_per_fault():
    samples = [Sample(100 + 10 * i, {"orders_enriched": i % 4 * 100, "orders_stream": 5}, {}) for i in range(30)]
    events = [SimpleNamespace(injected=150.0, kind="broker_kill", target="node 2")]
    svg = ET.fromstring(lag_svg(samples, events, began=100))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(svg.findall(f"{ns}polyline")) == 2
    assert [t.text for t in svg.findall(f"{ns}text") if t.text in ("orders_enriched", "orders_stream")] == [
        "orders_enriched", "orders_stream"]
    assert any(line.find(f"{ns}title") is not None for line in svg.findall(f"{ns}line"))


class FakeAirflow:
    """Airflow's REST API as the soak's operator meets it: the runbook refuses a dry run without
    force (the transaction is younger than the abort threshold) and succeeds otherwise."""

    def __init__(self, refuse: str = "unforced") -> None:
        self.triggered: list[dict] = []
        self.refuse = refuse  # "unforced" | "always"

    def api(self, method, path, body=None):
        if method == "POST" and path.endswith("/dagRuns"):
            self.triggered.append(body["conf"])
            return {"dag_run_id": f"manual__{len(self.triggered)}", "state": "queued"}
        if "/xcomEntries/" in path:
            return {"value": {"found": True}}
        if "/dagRuns/manual__" in path:
            conf = self.triggered[int(path.rsplit("__", 1)[1]) - 1]
            refused = self.refuse == "always" or not conf.get("force")
            return {"state": "failed" if refused else "success"}
        if path.startswith("/api/v2/dags/~/dagRuns?state=failed"):
            return {"dag_runs": []}
        raise AssertionError(f"unexpected call {method} {path}")


def test_the_operator_runs_the_runbook_as_its_answers_lead_once_per_held_partition(monkeypatch):
    from kafka_eos_lab.soak import operator as op

    monkeypatch.setattr(op.time, "sleep", lambda s: None)
    airflow = FakeAirflow()
    world = SimpleNamespace(airflow=airflow, pipelines=["orders_enriched"], inbox=SimpleNamespace(alerts=[]))
    person = op.Operator(world, say=lambda line: None)
    stall = {"runbook": {"conf": {"topic": "orders", "partition": 1, "start_offset": 6614}}}
    world.inbox.alerts += [(0.0, {"stalls": [stall]}), (1.0, {"text": "a task failed", "stalls": []})]
    person.look()
    assert airflow.triggered == [
        {"topic": "orders", "partition": 1, "start_offset": 6614, "dry_run": True},
        {"topic": "orders", "partition": 1, "start_offset": 6614, "dry_run": True, "force": True},
        {"topic": "orders", "partition": 1, "start_offset": 6614, "dry_run": False, "force": True,
         "confirm": "ABORT orders-1@6614"}]
    (action,) = person.actions
    assert (action.kind, action.target, action.outcome) == ("abort", "orders-1@6614", "abort success")
    # The next watchdog run alerts again before the LSO moved on: done already, not again.
    world.inbox.alerts.append((2.0, {"stalls": [stall]}))
    person.look()
    assert len(airflow.triggered) == 3

    # A dry run that finds nothing to abort even forced: no abort; a later alert tries again, up to a limit.
    world.airflow = refusing = FakeAirflow(refuse="always")
    other = {"runbook": {"conf": {"topic": "orders", "partition": 2, "start_offset": 9}}}
    for i in range(op.MAX_ATTEMPTS + 2):
        world.inbox.alerts.append((3.0 + i, {"stalls": [other]}))
        person.look()
    assert [c["dry_run"] for c in refusing.triggered] == [True, True] * op.MAX_ATTEMPTS
    assert [a.outcome for a in person.actions[1:]] == ["dry run failed"] * op.MAX_ATTEMPTS
