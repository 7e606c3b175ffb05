"""The wire format of an output record and of a dead letter's headers: what every Kafka commit
scope produces and what readers of its output (side runs, audits, the soak) recognise.

A dead letter carries the reason and its source coordinates as its last four headers, in
:data:`DEAD_LETTER_HEADER_NAMES`' order, whichever topic it lands in.
"""

from __future__ import annotations

#: One output record: (topic, key, value, headers). key/value are bytes, str or None.
OutRecord = tuple[str, object, object, list | None]

#: The names of :func:`dead_letter_headers`, in order: the last headers of every dead letter.
DEAD_LETTER_HEADER_NAMES = ("kafka-eos.reason", "kafka-eos.source.topic", "kafka-eos.source.partition",
                            "kafka-eos.source.offset")


def is_dead_letter(headers) -> bool:
    """A record produced as a dead letter (its last headers are :func:`dead_letter_headers`): a
    side run without a dead-letter topic of its own writes them to its results topic."""
    return bool(headers) and len(headers) >= 4 and \
        tuple(name for name, _value in headers[-4:]) == DEAD_LETTER_HEADER_NAMES


def dead_letter_headers(reason: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Headers a dead letter carries: the reason and its source coordinates."""
    return list(zip(DEAD_LETTER_HEADER_NAMES, (reason.encode(), topic.encode(), str(partition).encode(),
                                               str(offset).encode())))
