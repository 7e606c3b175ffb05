"""One read of the cluster for every pipeline: per source partition the numbers of
``kafka-eos checkpoint --json`` (checkpoint, LSO, HW, lag to the LSO, the oldest unprocessed
committed record), the SQL/Kafka checkpoint drift, the partitions an open transaction pins and
who holds them, and the last runs from each run manifest.

Built to stay quick with many pipelines: the partitions' offsets of all pipelines are one batched
query (LSO, high watermark and log start of every partition), the oldest records one read, the
pinned partitions' holders one admin client; what remains per pipeline is its group offsets (one
request per consumer group) and the tail of its run manifest. :class:`CachedOverview` keeps a
snapshot for a few seconds, so a page that many people reload asks the cluster once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from kafka_eos.errors import KafkaEosError
from kafka_eos.health.attribute import attribute
from kafka_eos.health.backlog import with_oldest_unprocessed
from kafka_eos.health.detect import find_stalls
from kafka_eos.kafka_admin import TP, partition_offsets, topics_metadata
from kafka_eos.manifest import PLANNED, ManifestStore
from kafka_eos.pipeline import LOOK_SETTLE_S, checkpoints_and_times, needed_topics, rows_of, source_partitions
from kafka_eos.settings import KafkaSettings
from kafka_eos.spec import PipelineSpec

#: Runs shown per pipeline (the page's chart covers them).
LAST_RUNS = 10
#: Pipelines whose group offsets and manifest are read at once.
PER_PIPELINE_READERS = 8
#: How long a snapshot is served before the cluster is asked again: reloads by several operators
#: within a few seconds cost one set of queries.
CACHE_TTL_S = 5.0


def _sink(spec: PipelineSpec) -> dict:
    sink = spec.sink
    return {"kind": sink.kind, "commit": sink.commit,
            "target": sink.target, "dead_letters": sink.dead_letters}


def _run(rec: dict) -> dict:
    """A run manifest record, as the page shows it: the plan's ranges and the result."""
    plan = rec.get("plan") or {}
    ranges = [r for r in plan.get("ranges", []) if r["from_offset"] < r["until"]]
    status = "empty" if rec.get("status") == PLANNED and not ranges else rec.get("status")
    return {"run_id": plan.get("run_id"), "status": status,
            **({"stream_batch": rec["stream"]["batch"]} if "stream" in rec else {}),
            "at": rec.get("committed_at") or rec.get("updated_at") or plan.get("created_at"),
            "records_in": rec.get("records_in"), "records_out": rec.get("records_out"),
            "dead_letters": rec.get("dead_letters"),
            "ranges": [{"topic": r["topic"], "partition": r["partition"], "from": r["from_offset"], "until": r["until"]}
                       for r in ranges]}


def one_line(exc: BaseException) -> str:
    """An error as one line: a kafka-eos error's message; another (a SQL driver's, which spans
    lines and quotes the statement) its type and first line."""
    if isinstance(exc, KafkaEosError):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def unreadable_spec(name: str, path: str, error: str) -> dict:
    """The entry of a spec that failed to load: shown in its own row, with its error."""
    return {"pipeline": name, "spec": path, "group_id": None,
            "sink": {"kind": None, "commit": None, "target": None, "dead_letters": None},
            "partitions": [], "drift": [], "pinned": [], "lag": 0, "runs": [], "held": None, "error": error}


def snapshot(settings: KafkaSettings, specs: Iterable[PipelineSpec], runs: int = LAST_RUNS,
             now_ms: int | None = None, mirror: bool = False) -> list[dict]:
    """Every pipeline's state, in the order of ``specs``.

    Each entry: ``pipeline``, ``group_id``, ``sink``, ``partitions`` (the rows of
    ``kafka-eos checkpoint --json``), ``drift``, ``pinned`` (stalls with their holder), ``lag``
    (total), ``runs`` (newest first), ``held`` (a range committed short that holds the pipeline
    until acknowledged: its run, finding and time; else None), and ``error`` (a one-line reason
    this pipeline could not be read, e.g. a missing topic; the other pipelines are still shown).
    ``mirror``: SQL sinks' checkpoints as their Kafka mirror has them, their databases never opened
    (no drift shown).
    """
    specs = list(specs)
    out: list[dict] = []
    tps_of: dict[str, list[TP]] = {}
    # One metadata request naming every topic of every pipeline, their run manifests too (never
    # the whole cluster's).
    md = topics_metadata(settings, [t for spec in specs for t in (*needed_topics(spec), spec.manifest_topic)])
    for spec in specs:
        entry = {"pipeline": spec.name, "group_id": spec.source.group_id, "sink": _sink(spec),
                 "checkpoints_from": "kafka mirror" if mirror and not spec.sink.about.transactional else "sink",
                 "partitions": [], "drift": [], "pinned": [], "lag": 0, "runs": [], "held": None, "error": None}
        out.append(entry)
        try:
            tps_of[spec.name] = source_partitions(spec, settings, md)
        except KafkaEosError as exc:
            entry["error"] = str(exc)
    # 1. One batched offsets query for every source partition of every pipeline, and of every run
    # manifest there is (where its last runs are read back from).
    manifests = {spec.name: (spec.manifest_topic, 0) for spec in specs if spec.manifest_topic in md.partitions}
    everything = sorted({tp for tps in tps_of.values() for tp in tps} | set(manifests.values()))
    offsets = partition_offsets(settings, everything) if everything else {}

    # 2. Per pipeline, a few at a time (the clients wait on the network, not the CPU): its group
    # offsets (and a SQL sink's own checkpoints), and its last runs from its run manifest.
    def per_pipeline(spec: PipelineSpec) -> tuple[dict, list[dict], list[dict], dict | None, bool] | str:
        """(checkpoints, drift, last runs, hold, whether the group's offsets were pending), or the
        one-line reason they could not be read."""
        try:
            # A look: offsets pending in a killed attempt's transaction show as before it (not 30 s, then an error).
            cks, drift, times = checkpoints_and_times(spec, settings, tps_of[spec.name], mirror, LOOK_SETTLE_S)
            manifest = manifests.get(spec.name)
            last, held = ManifestStore.of(spec, settings).last_runs_and_hold(runs, offsets[manifest]) \
                if manifest else ([], None)
        except Exception as exc:  # noqa: BLE001 - a SQL sink's database error too: one row, not the page
            return one_line(exc)
        return ({tp: cks.get(tp) for tp in tps_of[spec.name]}, [dataclasses.asdict(d) for d in drift],
                [_run(rec) for rec in last], held, any(t.pending for t in times.values()))

    readable = [(spec, entry) for spec, entry in zip(specs, out) if spec.name in tps_of]
    with ThreadPoolExecutor(max_workers=PER_PIPELINE_READERS) as pool:
        results = list(pool.map(per_pipeline, [spec for spec, _entry in readable]))
    rows_of_pipeline: dict[str, list[dict]] = {}
    for (spec, entry), result in zip(readable, results):
        if isinstance(result, str):
            entry["error"] = result
            continue
        cks, entry["drift"], entry["runs"], held, pending = result
        entry["held"] = None if held is None else {k: held[k] for k in ("run_id", "mismatch", "found_at")}
        rows_of_pipeline[spec.name] = rows_of(cks, offsets, pending)
    # 3. One read of the oldest unprocessed committed record of every lagging partition.
    with_oldest_unprocessed(settings, [r for rows in rows_of_pipeline.values() for r in rows], now_ms)
    # 4. Pinned partitions (any age) and who holds them: one admin client for all.
    measured = [tp for name in rows_of_pipeline for tp in tps_of[name]]
    stalls = attribute(settings, find_stalls(settings, measured, older_than_s=0, now_ms=now_ms, offsets=offsets),
                       specs)
    for spec, entry in zip(specs, out):
        rows = rows_of_pipeline.get(spec.name)
        if rows is not None:
            mine = {(r["topic"], r["partition"]) for r in rows}
            entry.update(partitions=rows, lag=sum(r["lag"] for r in rows),
                         pinned=[s.as_dict() for s in stalls if (s.topic, s.partition) in mine])
    return out


class CachedOverview:
    """:func:`snapshot`, served from memory for ``ttl_s`` after it was taken; one refresh at a
    time (concurrent requests wait for it rather than each asking the cluster). A request gets a
    snapshot whose reads began at most ``ttl_s`` before the request did: a spec written ``ttl_s``
    before a request is in its answer, however long a refresh takes (a refresh's age counts from
    its first read, the specs', not from its end), and a request that waited for a refresh begun
    after it gets that refresh.

    :param load: returns the settings, the specs to show and the entries of those that failed to
        load (:func:`unreadable_spec`); read again on every refresh, so new spec files appear
        without a restart.
    """

    def __init__(self, load: Callable[[], tuple[KafkaSettings, list[PipelineSpec], list[dict]]],
                 ttl_s: float = CACHE_TTL_S, mirror: bool = False):
        self._load = load
        self._ttl_s = ttl_s
        self._mirror = mirror
        self._lock = threading.Lock()
        self._taken: tuple[float, dict] | None = None

    def get(self) -> dict:
        """``{"taken_at": epoch s, "seconds": how long the reads took, "pipelines": [...]}``."""
        asked = time.monotonic()
        with self._lock:
            if self._taken is None or self._taken[0] < asked - self._ttl_s:
                started = time.monotonic()
                settings, specs, unreadable = self._load()
                pipelines = snapshot(settings, specs, mirror=self._mirror) + list(unreadable)
                self._taken = (started, {"taken_at": time.time(), "bootstrap": settings.bootstrap_servers,
                                         "seconds": round(time.monotonic() - started, 3), "pipelines": pipelines})
            return self._taken[1]
