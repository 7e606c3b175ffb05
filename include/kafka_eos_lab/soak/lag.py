"""Lag over the soak: every few seconds, each pipeline's checkpoints and lag (committed records
waiting beyond its checkpoint), and the source's LSOs — for the chart and for the time each fault
took to recover from."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kafka_eos.pipeline import checkpoint_rows
from kafka_eos_lab.soak.world import World

#: Often enough to see a minute's runs; cheap enough beside them (one offsets request per pipeline).
SAMPLE_EVERY_S = 10.0


@dataclass(frozen=True)
class Sample:
    at: float
    lag: dict[str, int]  # pipeline -> records waiting
    checkpoints: dict[str, dict[str, int | None]]  # pipeline -> "topic-partition" -> checkpoint


class LagSampler(threading.Thread):
    def __init__(self, world: World) -> None:
        super().__init__(name="soak lag", daemon=True)
        self.world = world
        self.samples: list[Sample] = []
        self.errors = 0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)

    def sample(self) -> Sample:
        lag, cks = {}, {}
        for name in self.world.pipelines:
            rows, _drift = checkpoint_rows(self.world.spec(name), self.world.settings)
            lag[name] = sum(r["lag"] for r in rows)
            cks[name] = {f"{r['topic']}-{r['partition']}": r["checkpoint"] for r in rows}
        return Sample(time.time(), lag, cks)

    def run(self) -> None:
        while not self._halt.wait(SAMPLE_EVERY_S):
            try:
                self.samples.append(self.sample())
            except Exception:  # noqa: BLE001 - a broker away: no sample this time
                self.errors += 1


def recovered_at(samples: list[Sample], after: float, lsos: dict[str, int]) -> float | None:
    """The first sample after ``after`` where every pipeline's checkpoint reached ``lsos``."""
    for s in samples:
        if s.at >= after and all((cks.get(tp) or 0) >= lso for cks in s.checkpoints.values() for tp, lso in lsos.items()):
            return s.at
    return None
