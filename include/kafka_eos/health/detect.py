"""Stalled partitions: the LSO (read_committed end) below the high watermark, held there by an
open transaction for longer than a threshold.

How long a transaction has held a partition is measured by the broker's clock where the broker
can say: the coordinator's ``transaction_start_time_ms`` for a transaction it tracks (read with the
holder's attribution, :mod:`.attribute`). For a transaction no coordinator describes, the LSO
is the first offset of its oldest open transaction, so the record at the LSO (read uncommitted) is
that transaction's first write there; its timestamp is the producer's own clock (the broker's only
on a topic with ``message.timestamp.type=LogAppendTime``), so a caller that observes over time (a
sensor's trigger) also passes its previous observation and counts from when it first saw the
LSO at that offset, whichever is earlier. Each stall says which clock its age comes from.
"""

from __future__ import annotations

import time
from typing import Iterable, Mapping

from kafka_eos.errors import BrokerError
from kafka_eos.health import DEFAULT_OLDER_THAN_S
from kafka_eos.health.attribute import LONG_RUNNING, attribute
from kafka_eos.health.stall import Stall
from kafka_eos.kafka_admin import ADMIN_TIMEOUT_S, TP, PartitionOffsets, admin_client, partition_offsets, topics_metadata
from kafka_eos.readers import first_records
from kafka_eos.settings import KafkaSettings


def topic_partitions(settings: KafkaSettings, topics: Iterable[str] | None = None,
                     missing_ok: Iterable[str] = ()) -> list[TP]:
    """The partitions of ``topics`` (default: every topic that is not internal).

    :param missing_ok: topics that may not exist yet (a pipeline's run manifest or backfill topic
        before its first run): skipped while absent. A topic that does not exist holds no transaction.
    :raises BrokerError: a named topic not in ``missing_ok`` does not exist.
    """
    if not topics:  # asked for the whole cluster: its whole metadata, once
        admin = admin_client(settings)  # kept alive while its answer is read
        md = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        return [(t, p) for t in sorted(t for t in md.topics if not t.startswith("__") and md.topics[t].error is None)
                for p in sorted(md.topics[t].partitions)]
    names = list(dict.fromkeys(topics))
    md = topics_metadata(settings, names, ADMIN_TIMEOUT_S)  # these topics only, in one request
    missing_ok = set(missing_ok)
    out = []
    for name in names:
        if name not in md.partitions:
            if name in missing_ok:
                continue
            raise BrokerError(f"topic {name!r} {md.missing.get(name, 'does not exist')}")
        out += [(name, p) for p in range(md.partitions[name])]
    return out


def find_stalls(settings: KafkaSettings, tps: Iterable[TP], older_than_s: float = DEFAULT_OLDER_THAN_S,
                now_ms: int | None = None, offsets: Mapping[TP, PartitionOffsets] | None = None) -> list[Stall]:
    """The partitions of ``tps`` whose LSO has been held below the high watermark for longer
    than ``older_than_s`` (one look, no history).

    :param now_ms: the clock (epoch ms), for tests.
    :param offsets: the partitions' offsets when the caller has read them already.
    """
    return observe(settings, tps, older_than_s, None, now_ms, offsets)[0]


def observe(settings: KafkaSettings, tps: Iterable[TP], older_than_s: float = DEFAULT_OLDER_THAN_S,
            previous: Mapping[str, dict] | None = None, now_ms: int | None = None,
            offsets: Mapping[TP, PartitionOffsets] | None = None) -> tuple[list[Stall], dict[str, dict]]:
    """:func:`find_stalls` for a caller that looks again later (a trigger).

    :param previous: the observation an earlier call returned: a partition whose LSO has not
        moved since is counted from when it was first seen there, if that is earlier than its
        record's timestamp says (or the timestamp cannot be read).
    :returns: the stalls, and the observation to pass next time (JSON-serialisable: for every
        pinned partition, its LSO and since when it has been held there).
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tps = list(tps)
    offsets = {tp: offsets[tp] for tp in tps} if offsets is not None else partition_offsets(settings, tps)
    pinned = {tp: o for tp, o in offsets.items() if o.lso < o.high_watermark}
    first_writes = {tp: ts for tp, (_offset, ts) in
                    first_records(settings, {tp: o.lso for tp, o in pinned.items()}, committed=False).items()}
    # Every pinned partition's holder, for the coordinator's clock (and named for the caller).
    held = attribute(settings, [Stall(tp[0], tp[1], o.lso, o.high_watermark, None, None)
                                for tp, o in sorted(pinned.items())])
    stalls, seen_now = [], {}
    for stall in held:
        tp, o = stall.tp, pinned[stall.tp]
        key = f"{tp[0]}-{tp[1]}"
        culprit = stall.culprit or {}
        seen = (previous or {}).get(key)
        if culprit.get("verdict") == LONG_RUNNING and culprit.get("transaction_started_ms") is not None:
            since, age_from = culprit["transaction_started_ms"], "coordinator"
        else:
            since, age_from = first_writes.get(tp), "record timestamp"
            if seen is not None and seen.get("lso") == o.lso and seen.get("open_since_ms") is not None:
                if since is None or seen["open_since_ms"] < since:
                    since, age_from = seen["open_since_ms"], "observed"
        seen_now[key] = {"lso": o.lso, "open_since_ms": now_ms if since is None else since}
        if since is None and previous is not None:
            continue  # unreadable and first seen now: the observation starts the clock
        stuck = None if since is None else max(0.0, (now_ms - since) / 1000)
        if stuck is not None and stuck < older_than_s:
            continue  # a one-shot look reports an age it cannot read, rather than hide the partition
        stall.open_since_ms, stall.stuck_s, stall.age_from = since, stuck, None if since is None else age_from
        stalls.append(stall)
    return stalls, seen_now
