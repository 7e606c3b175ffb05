"""A stalled partition, as detection finds it (:mod:`.detect`) and attribution names its holder
(:mod:`.attribute`): the one type both steps share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kafka_eos.health import abort_command
from kafka_eos.kafka_admin import TP


@dataclass
class Stall:
    """A partition whose LSO is pinned below its high watermark by an open transaction."""

    topic: str
    partition: int
    lso: int
    high_watermark: int
    #: When the transaction's first record on this partition was written (epoch ms), or when
    #: the caller first saw the LSO at this offset; None when neither is known.
    open_since_ms: int | None
    #: Seconds the LSO has been held, as of the observation.
    stuck_s: float | None
    #: Who holds it (see :mod:`kafka_eos.health.attribute`); None until attributed.
    culprit: dict | None = None
    #: Why attribution was not possible, when it was not.
    attribution_error: str | None = None
    #: Whose clock ``open_since_ms`` is: ``coordinator`` (the broker's transaction start),
    #: ``observed`` (first seen held at this LSO) or ``record timestamp`` (the record at the LSO).
    age_from: str | None = None
    waiting: int = field(init=False)

    def __post_init__(self) -> None:
        #: Offsets behind the LSO that read_committed readers cannot reach (records of the open
        #: transaction and, possibly, committed records of others behind it).
        self.waiting = self.high_watermark - self.lso

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for a person: where, how long, who, and the command that aborts it."""
        held = "for an unknown time" if self.stuck_s is None else f"for {self.stuck_s:.0f}s"
        text = (f"{self.topic}-{self.partition}: LSO {self.lso} < HW {self.high_watermark} ({self.waiting} offsets "
                f"waiting), held {held}")
        c = self.culprit
        if c:
            owner = f", pipeline {c['pipeline']}" if c.get("pipeline") else ""
            text += (f" by producer {c['producer_id']} epoch {c['producer_epoch']}, transactional.id "
                     f"{c.get('transactional_id') or '?'}{owner}, {c['verdict']}")
        elif self.attribution_error:
            text += f"; attribution unavailable: {self.attribution_error}"
        return f"{text}; abort: {abort_command(self.topic, self.partition, self.lso)}"
