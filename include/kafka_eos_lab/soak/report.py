"""The soak's report: what happened (faults, alerts, operator actions, runs and retries, time to
recover), the audit's numbers, and a chart of each pipeline's lag over time (SVG, drawn here: no
plotting library needed), written to the soak's folder."""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from kafka_eos.console import table
from kafka_eos_lab.soak.lag import Sample, recovered_at

#: Recovery's target: every pipeline back past the LSOs of a fault's end within this long of it.
RECOVERY_TARGET_S = 120.0

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def hhmmss(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%H:%M:%S")


def events_table(events, samples: list[Sample], began: float) -> str:
    rows = []
    for e in events:
        back = recovered_at(samples, e.healed or e.injected, e.lso_at_heal) if e.lso_at_heal else None
        rows.append((f"{e.injected - began:.0f}", e.kind, e.target[:60], f"{(e.healed or e.injected) - e.injected:.0f}",
                     "-" if back is None else f"{back - e.injected:.0f}", e.note[:80]))
    return table(rows, ("t (s)", "fault", "target", "healed after (s)", "recovered after (s)", "note"))


def recovery_table(events, samples: list[Sample], target_s: float) -> str:
    """Per fault kind: how many, the slowest recovery (every pipeline past the LSOs of the fault's
    end, counted from its end), and how many took longer than ``target_s`` or never recovered."""
    by_kind: dict[str, list[float | None]] = {}
    for e in events:
        if not e.lso_at_heal:
            continue
        healed = e.healed or e.injected
        back = recovered_at(samples, healed, e.lso_at_heal)
        by_kind.setdefault(e.kind, []).append(None if back is None else back - healed)
    rows = []
    for kind, times in sorted(by_kind.items()):
        known = [t for t in times if t is not None]
        over = sum(1 for t in times if t is None or t > target_s)
        rows.append((kind, len(times), f"{max(known):.0f}" if known else "-", over))
    return table(rows, ("fault", "count", "slowest recovery (s)", f"over {target_s:g} s"))


def runs_table(runs: dict[str, Counter]) -> str:
    states = sorted({s for c in runs.values() for s in c})
    return table([(dag, *(c.get(s, 0) for s in states)) for dag, c in sorted(runs.items())], ("DAG", *states))


def lag_svg(samples: list[Sample], events, began: float, width: int = 900, height: int = 300) -> str:
    """Each pipeline's lag (records waiting) over the soak's minutes; faults as grey marks."""
    if not samples:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40"><text x="10" y="25">no samples</text></svg>'
    left, bottom, top, right = 60, 30, 20, 160
    t_max = max(s.at for s in samples) - began or 1
    y_max = max(max(s.lag.values() or [0]) for s in samples) or 1

    def x(t: float) -> float:
        return left + (t - began) / t_max * (width - left - right)

    def y(v: float) -> float:
        return height - bottom - v / y_max * (height - bottom - top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>']
    for e in events:
        parts.append(f'<line x1="{x(e.injected):.1f}" y1="{top}" x2="{x(e.injected):.1f}" y2="{height - bottom}" '
                     f'stroke="#bbb" stroke-dasharray="3,3"><title>{html.escape(e.kind)}: {html.escape(e.target)}</title></line>')
    names = sorted({n for s in samples for n in s.lag})
    for i, name in enumerate(names):
        points = " ".join(f"{x(s.at):.1f},{y(s.lag.get(name, 0)):.1f}" for s in samples)
        colour = COLOURS[i % len(COLOURS)]
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
        parts.append(f'<text x="{width - right + 10}" y="{top + 15 * (i + 1)}" fill="{colour}">{html.escape(name)}</text>')
    parts += [f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
              f'<text x="5" y="{top + 5}">{y_max}</text><text x="5" y="{height - bottom}">0</text>',
              f'<text x="{left}" y="{height - 8}">0 min</text>',
              f'<text x="{width - right - 40}" y="{height - 8}">{t_max / 60:.0f} min</text>',
              f'<text x="{left + 10}" y="{top - 5}">records waiting beyond the checkpoint (dashed: faults)</text>',
              "</svg>"]
    return "\n".join(parts)


def write(folder: Path, *, seed: int, minutes: float, began: float, ended: float, checks, events, actions,
          alerts, runs: dict[str, Counter], tries: int, samples: list[Sample], load_stats: dict,
          operator_errors: list[str]) -> Path:
    """``report.md``, ``lag.svg`` and ``events.json`` in ``folder``; returns the report's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lag.svg").write_text(lag_svg(samples, events, began))
    (folder / "events.json").write_text(json.dumps({
        "events": [e.__dict__ for e in events], "actions": [asdict(a) for a in actions],
        "alerts": [{"at": at, **body} for at, body in alerts], "checks": [asdict(c) for c in checks]}, indent=1))
    bad = [c for c in checks if c.number]
    lines = [
        f"# Soak {hhmmss(began)}-{hhmmss(ended)} UTC: seed {seed}, {minutes:g} minutes",
        "",
        f"Result: {'PASSED, every audit number zero' if not bad else f'FAILED: {len(bad)} audit number(s) above zero'}.",
        f"Load: {load_stats}. Alerts received: {len(alerts)} "
        f"({sum(bool(b.get('stalls')) for _, b in alerts)} naming pinned partitions). Task tries beyond the first: {tries}.",
        "", "## Audit", "", "```", table([(c.name, c.number, c.detail[:120]) for c in checks], ("check", "number", "detail")), "```",
        "", "## Faults", "", "```", events_table(events, samples, began), "```",
        "", f"## Recovery (target: every pipeline past its LSO within {RECOVERY_TARGET_S:g} s of the fault's end)", "",
        "```", recovery_table(events, samples, RECOVERY_TARGET_S), "```",
        "", "## Operator actions (REST)", "", "```",
        table([(hhmmss(a.began), a.kind, a.target, f"{(a.ended or a.began) - a.began:.0f}", a.outcome) for a in actions],
              ("at", "action", "target", "took (s)", "outcome")), "```",
        "", "## Runs", "", "```", runs_table(runs), "```",
        "", "## Lag", "", "![lag](lag.svg)", "",
    ]
    if operator_errors:
        lines += ["## Operator's REST errors (retried)", "", *[f"- {e}" for e in operator_errors[:20]], ""]
    path = folder / "report.md"
    path.write_text("\n".join(lines))
    return path
