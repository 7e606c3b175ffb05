"""The audit of committed runs (``kafka-eos audit``): each run's ranges read again from the source and
counted, against what the run's manifest says it wrote — for an operator after an incident, or after
upgrading from a version that could commit a range short (0.2.0 and earlier: CHANGELOG).

Per source partition in per_partition scope (each partition's manifest record is written inside
its own transaction), per run in atomic scope and for SQL sinks (the run record). A range is:

- ``whole``: results and dead letters (SQL: the records the run counted in) equal the committed
  records the range holds;
- ``filtered``: fewer, and the commit proved it read its range to the end (``read: whole`` in its
  record, written since the proof of read): the transform dropped records;
- ``short``: fewer, and no such proof: records may have been lost — replay the range;
- ``more``: more (a transform that turns one record into several);
- ``unreadable``: retention has deleted part of the range since: it cannot be counted again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kafka_eos.errors import PlanError
from kafka_eos.kafka_admin import partition_offsets
from kafka_eos.manifest import COMMITTED, ManifestStore
from kafka_eos.readers import count_committed
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.scope import sink_of
from kafka_eos.spec import PipelineSpec

#: The verdict that makes ``kafka-eos audit`` exit non-zero.
SHORT = "short"


@dataclass(frozen=True)
class RangeAudit:
    """One audited unit: a source partition's range (per_partition), or a whole run (``partition``
    None: the totals of its ranges)."""

    run_id: str
    topic: str | None
    partition: int | None
    from_offset: int | None
    until: int | None
    holds: int | None
    written: int
    verdict: str
    proven: bool
    #: A short range: the offset of its first committed record past the ``written`` first ones —
    #: where to move the checkpoint back to for the next run to write the rest, when the transform
    #: gives one row per record in order (the records before it are in the output already).
    resume_at: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def audit_runs(spec: PipelineSpec, settings: KafkaSettings, run_id: str | None = None,
               last: int = 10) -> list[RangeAudit]:
    """Audit ``run_id`` (or the pipeline's ``last`` runs, newest first) of ``spec``: its committed
    ranges counted again on the source (read_committed), against its manifest's counts.

    :raises PlanError: the manifest has no record of ``run_id``."""
    manifest = ManifestStore.of(spec, settings)
    if run_id is not None:
        record, _parts = manifest.run_records(run_id, older=True)
        if record is None:
            raise PlanError(f"pipeline {spec.name} has no run {run_id!r} in its manifest {spec.manifest_topic!r}")
        runs = [record]
    else:
        runs = manifest.last_runs(last)
    found: list[RangeAudit] = []
    for record in runs:
        if record.get("status") != COMMITTED or not record.get("plan"):
            continue
        found.extend(_audit_run(spec, settings, manifest, record))
    return found


def _audit_run(spec: PipelineSpec, settings: KafkaSettings, manifest: ManifestStore, record: dict) -> list[RangeAudit]:
    run_id = record["run_id"]
    ranges = {(r["topic"], r["partition"]): (r["from_offset"], r["until"]) for r in record["plan"]["ranges"]
              if r["until"] > r["from_offset"]}
    starts = {tp: o.log_start for tp, o in partition_offsets(settings, list(ranges)).items()} if ranges else {}
    readable = {tp: span for tp, span in ranges.items() if starts.get(tp, 0) <= span[0]}
    if sink_of(spec, settings).partition_records:
        _run, parts = manifest.run_records(run_id, older=True)
        written = {tp: part.get("records_out", 0) + part.get("dead_letters", 0) for tp in ranges
                   if (part := parts.get(f"{tp[0]}-{tp[1]}")) is not None}
        holds, resume = count_committed(settings, readable, {tp: n + 1 for tp, n in written.items()})
        audits = []
        for tp, (start, until) in sorted(ranges.items()):
            part = parts.get(f"{tp[0]}-{tp[1]}")
            if part is None:
                continue  # committed by no transaction of this run (its counts are in no record)
            proven = part.get("read") == "whole"
            verdict = _verdict(holds.get(tp) if tp in readable else None, written[tp], proven)
            audits.append(RangeAudit(run_id, tp[0], tp[1], start, until, holds.get(tp) if tp in readable else None,
                                     written[tp], verdict, proven, resume.get(tp) if verdict == SHORT else None))
        return audits
    holds, _marks = count_committed(settings, readable)
    written = record.get("records_in", record.get("records_out", 0) + record.get("dead_letters", 0))
    total = None if len(readable) < len(ranges) else sum(holds.values())
    proven = record.get("read") == "whole"
    return [RangeAudit(run_id, None, None, None, None, total, written, _verdict(total, written, proven), proven)]


def _verdict(holds: int | None, written: int, proven: bool) -> str:
    if holds is None:
        return "unreadable"
    if written == holds:
        return "whole"
    if written > holds:
        return "more"
    return "filtered" if proven else SHORT


def partition_name(audit: RangeAudit) -> str:
    return "(run)" if audit.topic is None else f"{audit.topic}-{audit.partition}"


def suspects(audits: list[RangeAudit]) -> list[RangeAudit]:
    """The ranges whose records may have been lost (:data:`SHORT`)."""
    return [a for a in audits if a.verdict == SHORT]

