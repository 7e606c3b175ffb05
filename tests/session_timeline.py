"""When each test ran, on which worker, and how busy the machine's cores were meanwhile.

A parallel session ends when its last worker does: minutes in which fewer workers than cores have
work, or in which every worker waits (on a broker, a scheduler, a timeout), are minutes the session
could be shorter. The per-test CPU account (:mod:`cpu_account`) says what each test costs; this
says where the session's wall time went between them: each worker's span and the cores' use, minute
by minute, as the controlling process saw them.
"""

from __future__ import annotations

import os
import threading
import time

#: How often the cores' use is read (from ``/proc/stat``; a read costs well under a millisecond).
SAMPLE_EVERY_S = 10.0
#: A minute whose cores were less busy than this is named in the summary.
IDLE_BELOW = 0.6


def _busy_and_total() -> tuple[float, float] | None:
    """The machine's busy and total jiffies since boot (every core), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return float(sum(fields) - idle), float(sum(fields))


class CoreSampler:
    """Reads the cores' use every ``every_s`` in a daemon thread: ``samples`` holds
    ``(epoch seconds, busy fraction of all cores since the sample before)``."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="core sampler", daemon=True)

    def start(self) -> "CoreSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        before = _busy_and_total()
        while before is not None and not self._stop.wait(self.every_s):
            now = _busy_and_total()
            if now is None:
                return
            total = now[1] - before[1]
            if total > 0:
                self.samples.append((time.time(), (now[0] - before[0]) / total))
            before = now


def by_minute(samples: list[tuple[float, float]], start: float) -> list[float]:
    """The cores' mean busy fraction in each whole minute from ``start`` (a minute with no sample
    takes the one before's)."""
    minutes: dict[int, list[float]] = {}
    for at, busy in samples:
        if at >= start:
            minutes.setdefault(int((at - start) // 60), []).append(busy)
    out: list[float] = []
    for minute in range(max(minutes, default=-1) + 1):
        values = minutes.get(minute)
        out.append(sum(values) / len(values) if values else (out[-1] if out else 0.0))
    return out


def worker_spans(tests: dict[str, tuple[str, float, float]]) -> dict[str, tuple[float, float, float, int]]:
    """Each worker's first start, last end, the seconds its tests took and their number, from
    ``{nodeid: (worker, start, end)}`` (epoch seconds)."""
    spans: dict[str, list] = {}
    for worker, start, end in tests.values():
        span = spans.setdefault(worker, [start, end, 0.0, 0])
        span[0], span[1] = min(span[0], start), max(span[1], end)
        span[2] += end - start
        span[3] += 1
    return {worker: tuple(span) for worker, span in sorted(spans.items())}


def summary_lines(tests: dict[str, tuple[str, float, float]], samples: list[tuple[float, float]],
                  start: float) -> list[str]:
    """What the terminal summary prints: each worker's span against the session's start, and the
    cores' use by minute (the minutes under :data:`IDLE_BELOW` named)."""
    lines = []
    for worker, (first, last, seconds, count) in worker_spans(tests).items():
        lines.append(f"{worker}: {count} tests from {first - start:,.0f} s to {last - start:,.0f} s, "
                     f"in them {seconds:,.0f} s ({seconds / max(last - first, 1e-9):.0%} of its span)")
    minutes = by_minute(samples, start)
    if minutes:
        cores = os.cpu_count() or 1
        lines.append(f"cores busy by minute (% of {cores}): " + " ".join(f"{100 * b:.0f}" for b in minutes))
        quiet = [str(m) for m, b in enumerate(minutes) if b < IDLE_BELOW]
        mean = sum(minutes) / len(minutes)
        lines.append(f"mean {mean:.0%}; under {IDLE_BELOW:.0%} in minute(s) {', '.join(quiet) or 'none'}")
    return lines
