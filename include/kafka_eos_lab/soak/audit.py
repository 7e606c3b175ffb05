"""The soak's audit, after the load stopped and every pipeline caught up: one number per check, all
zero when the soak's hours were exactly once.

The ground truth is the source read back with a plain read_committed consumer and classified here
(valid order or poison) without Spark; what the pipelines wrote is read back the same way (Kafka
outputs) or with SQL (the SQL sink's tables).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

from sqlalchemy import create_engine, text

from kafka_eos.backfill.side import (GENERATION_COLUMN, GENERATION_HEADER, RANGE_COLUMN, RANGE_HEADER, interval_key,
                                    replay_key)
from kafka_eos.kafka_admin import TP, partition_offsets, partitions_of
from kafka_eos.pipeline import checkpoint_rows, checkpoints
from kafka_eos.readers import committed_messages
from kafka_eos_lab.soak.world import SOURCE, WATCHDOG_DAG, World
from kafka_eos.wire import DEAD_LETTER_HEADER_NAMES

#: The orders transform's validation, restated (spark_apps.transforms.orders): these fields, a
#: positive amount with at most two decimals, a known currency, a zoned RFC 3339 time.
REQUIRED = ("order_id", "customer_id", "amount", "currency", "category", "ts")
REASON, SOURCE_PARTITION, SOURCE_OFFSET = DEAD_LETTER_HEADER_NAMES[0], DEAD_LETTER_HEADER_NAMES[2], DEAD_LETTER_HEADER_NAMES[3]
CENT = Decimal("0.01")
#: RFC 3339 with a zone (the transform's own rule: a zoneless time is poison).
ZONED_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")


def eur_rates() -> dict[str, Decimal]:
    from spark_apps.transforms.orders import EUR_RATES

    return EUR_RATES


@dataclass(frozen=True)
class SourceRecord:
    partition: int
    offset: int
    timestamp_ms: int
    order: dict | None  # None: poison


def valid_order(value: bytes | None, rates: dict[str, Decimal]) -> dict | None:
    """The order, or None where the orders transform dead-letters it."""
    try:
        order = json.loads(value)
    except (TypeError, ValueError):
        return None
    if not isinstance(order, dict) or any(not str(order.get(f) or "").strip() for f in REQUIRED):
        return None
    try:
        amount = Decimal(str(order["amount"]))
    except InvalidOperation:
        return None
    if amount <= 0 or amount != amount.quantize(CENT) or order["currency"] not in rates:
        return None
    if not ZONED_TIME.fullmatch(order["ts"]):
        return None
    try:
        datetime.fromisoformat(order["ts"].replace("Z", "+00:00"))
    except ValueError:
        return None
    return order


def read_source(world: World) -> list[SourceRecord]:
    rates = eur_rates()
    return [SourceRecord(m.partition(), m.offset(), m.timestamp()[1], valid_order(m.value(), rates))
            for m in committed_messages(world.settings, SOURCE)]


def revenue(records) -> dict[tuple[str, str], tuple[Decimal, int]]:
    """Revenue (EUR, each order rounded to the cent, as the transform does) and order count per
    (minute of ``ts``, category)."""
    rates, sums = eur_rates(), defaultdict(lambda: [Decimal(0), 0])
    for r in records:
        o = r.order
        minute = datetime.fromisoformat(o["ts"].replace("Z", "+00:00")).astimezone(timezone.utc)
        key = (minute.strftime("%Y-%m-%d %H:%M"), o["category"])
        sums[key][0] += (Decimal(o["amount"]) * rates[o["currency"]]).quantize(CENT, ROUND_HALF_UP)
        sums[key][1] += 1
    return {k: (v[0], v[1]) for k, v in sums.items()}


@dataclass
class Check:
    name: str
    number: int
    detail: str = ""


def attempted_ids(load_log: Path) -> set[str]:
    """The ids of every valid order the load produced, committed or not (poison has no id to audit by)."""
    return {i for line in load_log.read_text().splitlines() for i in json.loads(line)["ids"]}


def kafka_output(world: World, name: str, source: list[SourceRecord], aborted: set[str]) -> list[Check]:
    spec = world.spec(name)
    out = Counter(json.loads(m.value())["order_id"] for m in committed_messages(world.settings, spec.sink.topic))
    dlq = Counter((int(h[SOURCE_PARTITION]), int(h[SOURCE_OFFSET])) for m in
                  committed_messages(world.settings, spec.sink.dlq_topic) for h in [dict(m.headers() or [])])
    valid = {r.order["order_id"] for r in source if r.order}
    poison = {(r.partition, r.offset) for r in source if not r.order}
    return [
        Check(f"{name}: committed orders missing", len(valid - set(out)) + len(poison - set(dlq)),
              f"{len(valid)} orders, {len(poison)} poison in the source"),
        Check(f"{name}: written more than once", sum(n - 1 for n in out.values()) + sum(n - 1 for n in dlq.values())),
        Check(f"{name}: aborted input visible", len(set(out) & aborted)),
        Check(f"{name}: output not from committed input", len(set(out) - valid - aborted) + len(set(dlq) - poison)),
    ]


def sql_output(world: World, name: str, source: list[SourceRecord]) -> list[Check]:
    spec = world.spec(name)
    expected = revenue(r for r in source if r.order)
    with create_engine(spec.sink.url).connect() as conn:
        rows = conn.execute(text(f"SELECT minute, category, revenue_eur, order_count FROM {spec.sink.table}")).all()
        letters = conn.execute(text(f"SELECT partition, \"offset\" FROM {spec.sink.dead_letters_table} "
                                    "WHERE pipeline = :p AND topic = :t"), {"p": spec.name, "t": SOURCE}).all()
    got = {(r[0].strftime("%Y-%m-%d %H:%M"), r[1]): (Decimal(r[2]), int(r[3])) for r in rows}
    wrong = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
    poison = {(r.partition, r.offset) for r in source if not r.order}
    return [
        Check(f"{name}: aggregates differing from the input's", len(wrong),
              f"{len(expected)} (minute, category) rows; first differing: "
              f"{[(k, expected.get(k), got.get(k)) for k in wrong[:2]]}" if wrong else f"{len(expected)} rows"),
        Check(f"{name}: dead letters missing or extra", len(poison ^ {(int(p), int(o)) for p, o in letters})),
    ]


def checkpoints_at_lso(world: World) -> list[Check]:
    settings = world.settings
    n = partitions_of(settings, [SOURCE])[SOURCE]
    tps: list[TP] = [(SOURCE, p) for p in range(n)]
    lso = {tp: o.lso for tp, o in partition_offsets(settings, tps).items()}
    checks = []
    for name in world.pipelines:
        cks, drift = checkpoints(world.spec(name), settings, tps)
        behind = {f"{t}-{p}": (cks[(t, p)], lso[(t, p)]) for t, p in tps if cks[(t, p)] != lso[(t, p)]}
        checks.append(Check(f"{name}: checkpoint != LSO", len(behind), str(behind) if behind else ""))
        checks.append(Check(f"{name}: SQL/Kafka checkpoint drift", len(drift)))
    return checks


def open_transactions(world: World) -> Check:
    settings = world.settings
    topics = ["orders.enriched", "orders.dlq", "orders.backfill", "orders.stream", "orders.stream.dlq"]
    tps = [(t, p) for t, n in partitions_of(settings, topics).items() for p in range(n)]
    held = [f"{t}-{p}" for (t, p), o in partition_offsets(settings, tps).items() if o.lso < o.high_watermark]
    return Check("outputs with an open transaction", len(held), ", ".join(held))


def side_runs(world: World, events, source: list[SourceRecord]) -> list[Check]:
    """Each replay's records in the backfill topic are its range's orders, once; each backfill's rows
    in the backfill table are its interval's aggregates."""
    checks = []
    spec = world.spec("orders_enriched")
    written: dict[str, Counter] = defaultdict(Counter)
    for m in committed_messages(world.settings, spec.sink.backfill_topic):
        h = dict(m.headers() or [])
        if h.get(GENERATION_HEADER) == b"1" and REASON not in h and RANGE_HEADER in h:
            written[h[RANGE_HEADER].decode()][json.loads(m.value())["order_id"]] += 1
    for e in (e for e in events if e.kind == "replay" and e.details):
        frm, until = json.loads(e.details["replay_from"]), json.loads(e.details["replay_until"])
        want = {r.order["order_id"] for r in source if r.order and f"{SOURCE}-{r.partition}" in until
                and frm[f"{SOURCE}-{r.partition}"] <= r.offset < until[f"{SOURCE}-{r.partition}"]}
        got = written.get(replay_key(e.details["replay_from"], e.details["replay_until"]), Counter())
        bad = len(want ^ set(got)) + sum(n - 1 for n in got.values())
        checks.append(Check(f"replay {e.target}: output != its range", bad, f"{len(want)} orders in the range"))
    sql = world.spec("revenue_per_minute")
    for e in (e for e in events if e.kind == "backfill" and e.details):
        runs = [r for r in world.airflow.api("GET", f"/api/v2/dags/kafka_eos__{sql.name}/dagRuns?run_type=backfill"
                                                     "&limit=1000")["dag_runs"]
                if r["logical_date"] and datetime.fromisoformat(r["logical_date"].replace("Z", "+00:00")) ==
                datetime.fromisoformat(e.details["start"])]
        if not runs or any(r["state"] != "success" for r in runs):
            checks.append(Check(f"backfill {e.target}: no successful backfill run", 1, str([r["state"] for r in runs])))
            continue
        start, end = (datetime.fromisoformat(e.details[k]) for k in ("start", "end"))
        key = interval_key(start, end)
        lo, hi = start.timestamp() * 1000, end.timestamp() * 1000
        want = revenue(r for r in source if r.order and lo <= r.timestamp_ms < hi)
        with create_engine(sql.sink.url).connect() as conn:
            rows = conn.execute(text(f"SELECT minute, category, revenue_eur, order_count FROM "
                                     f"{sql.sink.backfill_table} WHERE {RANGE_COLUMN} = :k AND {GENERATION_COLUMN} = 1"),
                                {"k": key}).all()
        got = {(r[0].strftime("%Y-%m-%d %H:%M"), r[1]): (Decimal(r[2]), int(r[3])) for r in rows}
        bad = sum(want.get(k) != got.get(k) for k in set(want) | set(got))
        checks.append(Check(f"backfill {key}: rows != its interval", bad, f"{len(want)} rows expected"))
    return checks


def strangers(world: World, events, actions) -> list[Check]:
    """Each stranger's transaction alerted within 60 s of the watchdog's threshold and aborted by the runbook."""
    late, uncleared, detail = 0, 0, []
    for e in (e for e in events if e.kind == "stranger" and e.details.get("offset") is not None):
        d = e.details
        where = f"{d['topic']}-{d['partition']}"
        alerted = [at for at, body in world.inbox.alerts for s in body.get("stalls") or ()
                   if s["partition"] == where and s["lso"] == d["offset"]]
        delay = (min(alerted) - d["opened"] - d["threshold_s"]) if alerted else None
        if delay is None or delay > 60:
            late += 1
        target = f"{where}@{d['offset']}"
        if not any(a.kind == "abort" and a.target == target and a.outcome == "abort success" for a in actions):
            uncleared += 1
        detail.append(f"{target}: alerted {'never' if delay is None else f'{delay:+.0f}s after its threshold'}")
    return [Check("strangers' transactions not alerted within 60 s of the threshold", late, "; ".join(detail)),
            Check("strangers' transactions not aborted by the runbook", uncleared)]


#: A fault explains a watchdog run's failure that overlaps it or ends less than this before the run
#: (a run watches for 4 minutes; a broker down leaves partitions unreadable a while after).
FAULT_SHADOW_S = 300.0


def _epoch(iso: str | None) -> float | None:
    return None if not iso else datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def watchdog_failures(world: World, events) -> Check:
    """Watchdog runs that failed without finding anything (no alert naming a held partition or
    stale data during the run) and without a fault overlapping them: a watchdog that cries wolf."""
    runs = world.airflow.api("GET", f"/api/v2/dags/{WATCHDOG_DAG}/dagRuns?state=failed&limit=1000")["dag_runs"]
    findings = [at for at, body in world.inbox.alerts if body.get("stalls") or body.get("stale") or body.get("findings")]
    faults = [(e.injected, (e.healed or e.injected) + FAULT_SHADOW_S) for e in events]
    unexplained = []
    for run in runs:
        start, end = _epoch(run.get("start_date")), _epoch(run.get("end_date"))
        if start is None or end is None:
            continue
        if any(start - 5 <= at <= end + 60 for at in findings) or any(a <= end and start <= b for a, b in faults):
            continue
        unexplained.append(run["dag_run_id"])
    return Check("watchdog runs failed without a finding or a fault", len(unexplained),
                 f"{len(runs)} failed runs; unexplained: {', '.join(unexplained[:5])}")


def operator_page(world: World) -> Check:
    """The operator page's partition figures equal the broker's (read now, everything at rest)."""
    time.sleep(2)  # the page's cache (1 s in the soak's deployment)
    page = {e["pipeline"]: e for e in world.airflow.api("GET", "/kafka-eos/api/pipelines")["pipelines"]}
    wrong = []
    for name in world.pipelines:
        rows, _drift = checkpoint_rows(world.spec(name), world.settings)
        want = {(r["topic"], r["partition"]): (r["checkpoint"], r["lso"], r["high_watermark"]) for r in rows}
        shown = {(r["topic"], r["partition"]): (r["checkpoint"], r["lso"], r["high_watermark"])
                 for r in (page.get(name) or {}).get("partitions", [])}
        wrong += [f"{name} {t}-{p}: page {shown.get((t, p))} broker {want.get((t, p))}"
                  for t, p in set(want) | set(shown) if want.get((t, p)) != shown.get((t, p))]
    return Check("operator page figures != the broker's", len(wrong), "; ".join(wrong[:3]))


def audit(world: World, events, actions, load_log: Path) -> list[Check]:
    source = read_source(world)
    committed = {r.order["order_id"] for r in source if r.order}
    stranger_ids = {e.details["order_id"] for e in events if e.kind == "stranger" and e.details}
    aborted = (attempted_ids(load_log) | stranger_ids) - committed
    checks = [Check("committed source records", 0, f"{len(source)} ({len(committed)} orders); {len(aborted)} "
                    "orders aborted or never committed")]
    groups = [(f"{name} output", (lambda n=name: kafka_output(world, n, source, aborted)
                                  if world.spec(n).sink.kind == "kafka" else sql_output(world, n, source)))
              for name in world.pipelines]
    groups += [("checkpoints", lambda: checkpoints_at_lso(world)), ("open transactions", lambda: [open_transactions(world)]),
               ("side runs", lambda: side_runs(world, events, source)),
               ("strangers", lambda: strangers(world, events, actions)), ("operator page", lambda: [operator_page(world)]),
               ("watchdog", lambda: [watchdog_failures(world, events)])]
    for what, check in groups:
        try:
            checks += check()
        except Exception as exc:  # noqa: BLE001 - a check that cannot be made is a failed check, named
            checks.append(Check(f"{what}: could not be checked", 1, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
    return checks
