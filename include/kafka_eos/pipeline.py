"""Planning and checking a pipeline against the cluster: the steps around the batch step.

``prepare_plan`` computes a run's plan once and stores it in the run manifest; a retried task
gets the stored plan back while it still applies. ``verify`` is the final check of a run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, TypeVar

from confluent_kafka import KafkaError, KafkaException

from kafka_eos.errors import BrokerError, CheckpointLost, KafkaEosError, PipelineBusy, PipelineHeld, PlanError
from kafka_eos.kafka_admin import (TP, TopicsMetadata, committed_offsets_and_times, topics_metadata,
                                   offsets_retention_s, partition_offsets, partitions_of)
from kafka_eos.manifest import RESERVED_RUN_IDS, ManifestState, ManifestStore, checkpoint_record, reserved_run_id
from kafka_eos.plan import PartitionRange, Plan, plan_ranges, stale_checkpoints
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.base import Drift
from kafka_eos.sinks.scope import sink_of
from kafka_eos.spec import PipelineSpec
from kafka_eos.lease import REFRESH_PREFIX, StreamLease, stream_owner
from kafka_eos.txn import fence

log = logging.getLogger(__name__)
T = TypeVar("T")


def source_partitions(spec: PipelineSpec, settings: KafkaSettings, md: TopicsMetadata | None = None) -> list[TP]:
    """Every partition of the source topics, after checking every topic the run needs exists.

    :param md: :func:`kafka_admin.topics_metadata` of (at least) :func:`needed_topics` already read.
    :raises TopicMissing: naming the missing topic and its role.
    """
    md = md or topics_metadata(settings, needed_topics(spec))
    counts = partitions_of(settings, spec.source.topics, "source", md)
    for topic, role in ((spec.sink.topic, "sink"), (spec.sink.dlq_topic, "dead-letter")):
        if topic:
            partitions_of(settings, [topic], role, md)
    return [(t, p) for t, n in counts.items() for p in range(n)]


#: How long a look (``checkpoint``, ``plan``, a sensor, the operator page) waits for group offsets
#: pending in an open transaction before it shows the offsets before it: a live commit settles in
#: milliseconds; an attempt killed inside its transaction holds them until a run fences it.
LOOK_SETTLE_S = 5.0


def needed_topics(spec: PipelineSpec) -> list[str]:
    """The topics a run of ``spec`` checks before it plans: its sources, its Kafka sink, its dead letters."""
    return [*spec.source.topics, *spec.sink.topics]


def checkpoints(spec: PipelineSpec, settings: KafkaSettings, tps: list[TP],
                mirror: bool = False, settle_s: float | None = None) -> tuple[dict[TP, int | None], list[Drift]]:
    """The pipeline's checkpoints, and for a SQL sink the drift of its Kafka mirror.

    Kafka sinks: the group offsets. SQL sinks: the sink's offsets table is the truth; its Kafka
    mirror may lag behind (a crash between the DB commit and the mirror) but never lead.

    :param mirror: read a SQL sink's checkpoints from its Kafka mirror, not its database (no
        drift then): for the looks that hold no database credentials (the operator page on the
        API server, the triggerer). Never for a plan.
    :param settle_s: a look's bound on waiting out offsets pending in an open transaction
        (:func:`kafka_eos.kafka_admin.committed_offsets_and_times`). Never for a plan or a check.
    :raises CheckpointConflict: the Kafka mirror is ahead of the SQL sink.
    """
    cks, drift, _times = checkpoints_and_times(spec, settings, tps, mirror, settle_s)
    return cks, drift


def checkpoints_and_times(spec: PipelineSpec, settings: KafkaSettings, tps: list[TP], mirror: bool = False,
                           settle_s: float | None = None):
    """:func:`checkpoints`, and when kafka-eos last committed each group offset (or None)."""
    fetched = committed_offsets_and_times(settings, spec.source.group_id, tps, settle_s=settle_s)
    kafka = {tp: offset for tp, (offset, _at) in fetched.items()}
    times = {tp: at for tp, (_offset, at) in fetched.items()}
    if mirror and not spec.sink.about.transactional:
        return kafka, [], times
    with sink_of(spec, settings) as sink:
        cks, drift = sink.checkpoints(tps, kafka)
    return cks, drift, times


def _cluster_state(spec: PipelineSpec, settings: KafkaSettings, mirror: bool = False,
                   settle_s: float | None = None):
    """What a plan is computed from: checkpoints, their drift, the partitions' offsets, and
    when each group offset was last committed (``mirror``, ``settle_s``: see :func:`checkpoints`)."""
    tps = source_partitions(spec, settings)
    cks, drift, times = checkpoints_and_times(spec, settings, tps, mirror, settle_s)
    return {tp: cks.get(tp) for tp in tps}, drift, partition_offsets(settings, tps), times


def _plan(spec: PipelineSpec, settings: KafkaSettings, run_id: str, cks, offsets, times,
          state: ManifestState | None = None) -> tuple[Plan, bool]:
    """:func:`plan_ranges` with what the run manifest and the offsets' commit times add: which
    group offsets are old enough to be committed again, and, for partitions without one, the last
    checkpoint kafka-eos committed and the start the pipeline's first plan chose.

    :param state: the manifest's memory when the caller has read it already.
    :returns: the plan, and whether it is the pipeline's first plan (no checkpoint, no start).
    :raises CheckpointLost: no partition has a checkpoint, and the manifest's memory of the
        pipeline is gone too (retention deleted records and no snapshot is left).
    """
    # Kafka deletes the offsets of a group without members `offsets.retention.minutes` after
    # their last commit: a checkpoint that might not live until the next run's commit is
    # committed again by this one.
    stale = stale_checkpoints(cks, times, offsets_retention_s(settings), time.time())
    history = starts = None
    if any(ck is None for ck in cks.values()):
        state = state or ManifestStore.of(spec, settings).state()
        unknown = lost_to_retention(spec, cks, state)
        if unknown and len(unknown) == len(cks):  # no checkpoint anywhere, and none remembered
            raise CheckpointLost(
                f"group {spec.source.group_id!r} has no committed offsets, and the manifest {spec.manifest_topic!r} "
                "holds records of earlier runs but its memory of their checkpoints is gone (retention): "
                "nothing is re-read; set the group's offsets (kafka-consumer-groups --reset-offsets) to go on")
        if unknown:
            names = ", ".join(f"{t}-{p}" for t, p in unknown)
            known = [f"{t}-{p}" for (t, p), ck in sorted(cks.items()) if ck is None and (t, p) in state.checkpoints]
            raise CheckpointLost(
                f"{names}: group {spec.source.group_id!r} has no committed offset, and the manifest "
                f"{spec.manifest_topic!r} lost part of its memory of earlier checkpoints (retention): a lost "
                "checkpoint cannot be told from a new partition. Nothing is re-read; set each one's offset "
                f"(kafka-consumer-groups --group {spec.source.group_id} --topic TOPIC:PARTITION --reset-offsets "
                "--to-offset N --execute; --to-earliest for a partition that is new) to go on"
                + (f"; {', '.join(known)} lost checkpoints the manifest still knows: restore them (kafka-eos "
                   f"checkpoint {spec.name} gives each one's offset)" if known else ""))
        # Only `latest` needs the first plan's starts: `earliest` means each partition's log
        # start, whenever a partition without a checkpoint is planned.
        if spec.source.starting_offsets == "latest":
            starts = state.starts or {}
        if spec.sink.about.transactional:  # the group's offsets are the checkpoints: the manifest remembers them
            history = state.checkpoints
    plan = plan_ranges(spec, run_id, offsets, cks, stale=stale, history=history, starts=starts)
    return plan, starts is not None and not starts and all(ck is None for ck in cks.values())


def checkpoint_rows(spec: PipelineSpec, settings: KafkaSettings,
                    mirror: bool = False) -> tuple[list[dict], list[Drift]]:
    """Per source partition: checkpoint, LSO, high watermark, log start and lag, the lag counted
    to the LSO (what a read_committed pipeline can read now), not to the high watermark
    (``mirror``: see :func:`checkpoints`); ``pending`` where the group's offsets were pending in an
    open transaction (a look waits :data:`LOOK_SETTLE_S` for it, then shows the offsets before it)."""
    cks, drift, offsets, times = _cluster_state(spec, settings, mirror, LOOK_SETTLE_S)
    return rows_of(cks, offsets, any(t.pending for t in times.values())), drift


def rows_of(cks: dict[TP, int | None], offsets: dict, pending: bool = False) -> list[dict]:
    """:func:`checkpoint_rows` from checkpoints and offsets already read (``offsets`` may hold
    other partitions too: one batched query for many pipelines; ``pending``: the group's offsets
    were pending in an open transaction, these are the offsets before it)."""
    rows = []
    for tp, ck in cks.items():
        o = offsets[tp]
        rows.append({"topic": tp[0], "partition": tp[1], "checkpoint": ck, "lso": o.lso,
                     "high_watermark": o.high_watermark, "log_start": o.log_start,
                     "lag": max(0, o.lso - (ck if ck is not None else o.log_start)), "pending": pending})
    return rows


def compute_plan(spec: PipelineSpec, settings: KafkaSettings, run_id: str) -> tuple[Plan, list[Drift]]:
    """The next plan, with no side effects (``kafka-eos plan``): :func:`looked_plan`'s."""
    plan, drift, _pending = looked_plan(spec, settings, run_id)
    return plan, drift


def looked_plan(spec: PipelineSpec, settings: KafkaSettings, run_id: str) -> tuple[Plan, list[Drift], bool]:
    """The next plan, with no side effects, its drift, and whether the group's offsets were pending
    in an open transaction (an attempt killed between sending its offsets and its commit, or one
    committing now): then it is planned from the offsets before it (waited for
    :data:`LOOK_SETTLE_S`); the run fences that transaction and plans again."""
    cks, drift, offsets, times = _cluster_state(spec, settings, settle_s=LOOK_SETTLE_S)
    pending = any(t.pending for t in times.values())
    return _plan(spec, settings, run_id, cks, offsets, times)[0], drift, pending


def repair_drift(spec: PipelineSpec, settings: KafkaSettings, drift: list[Drift]) -> None:
    """Republish a sink's own checkpoints to the Kafka group offsets (:meth:`Sink.repair`)."""
    with sink_of(spec, settings) as sink:
        sink.repair(drift)


@dataclass(frozen=True)
class Refreshed:
    """What :func:`refresh_checkpoints` did: the partitions whose checkpoints it committed again,
    or why it left the pipeline alone (``skipped``)."""

    partitions: list[TP]
    skipped: str = ""


def refresh_checkpoints(spec: PipelineSpec, settings: KafkaSettings, *, every: bool = False,
                        next_in_s: float | None = None) -> Refreshed:
    """Commit checkpoints again, unchanged, before the broker's offsets retention expires them:
    for pipelines that may not run for a long time (event-driven, manual), from the watchdog or
    ``kafka-eos checkpoint PIPELINE --refresh``.

    Kafka sinks commit the same offsets the way a run does (an offsets-only transaction under
    the pipeline's own transactional ids): a run of the same partitions still in flight is fenced
    and retried, never overwritten, and a checkpoint that moved in between is left alone
    (:class:`CheckpointConflict`). SQL sinks republish the sink's checkpoint to the group.

    A pipeline a stream owns is skipped (``skipped="streaming (…)"``): its offsets belong to the
    stream, whose plans commit its idle checkpoints again themselves; a refresh's
    init_transactions() would fence the stream's producer and stop it. A Kafka sink's refresh holds
    the stream's lease while it commits: a stream that starts meanwhile waits for it, never is
    fenced by it (looking for a stream and then committing left a window in which one could start).

    :param every: every checkpoint; else those that might not live ``next_in_s`` more seconds
        (see :func:`kafka_eos.plan.stale_checkpoints`).
    :param next_in_s: when the caller's next refresh comes (the watchdog's interval).
    """
    owner = stream_owner(spec, settings)
    if owner is not None:
        return _refresh_skipped(spec, owner.describe())
    if not spec.sink.about.transactional:  # no transactional id a stream holds: nothing to fence
        return _refresh(spec, settings, every, next_in_s)
    lease = StreamLease(spec, settings, holder=REFRESH_PREFIX)
    try:
        lease.acquire(wait_s=0)  # held while it commits: a stream that starts now waits for it
    except PipelineBusy:
        owner = stream_owner(spec, settings)
        return _refresh_skipped(spec, owner.describe() if owner else "a stream started meanwhile")
    try:
        return _refresh(spec, settings, every, next_in_s)
    finally:
        lease.release()


def _refresh_skipped(spec: PipelineSpec, holder: str) -> Refreshed:
    skipped = f"streaming ({holder})"
    log.info("%s: refresh skipped: %s; the stream refreshes its own idle checkpoints", spec.name, skipped)
    return Refreshed([], skipped)


def _refresh(spec: PipelineSpec, settings: KafkaSettings, every: bool, next_in_s: float | None) -> Refreshed:
    """:func:`refresh_checkpoints`' commit, once no stream can start beside it."""
    with sink_of(spec, settings) as sink:
        sink.keep_checkpoints()
    tps = source_partitions(spec, settings)
    cks, drift, times = checkpoints_and_times(spec, settings, tps)
    if drift:
        repair_drift(spec, settings, drift)
    now = time.time()
    due = sorted(tp for tp, ck in cks.items() if ck is not None) if every else \
        sorted(stale_checkpoints(cks, times, offsets_retention_s(settings), now, next_in_s=next_in_s or 0.0))
    if not due:
        return Refreshed([])
    # The commits keep the time the pipeline's last run was planned: the planner's estimate of
    # how far apart runs come is not shortened by a refresh.
    planned = max((t.planned_at for t in times.values() if t.planned_at is not None), default=now)
    plan = Plan(spec.name, f"refresh-{int(now)}",
                tuple(PartitionRange(t, p, cks[(t, p)], cks[(t, p)], cks[(t, p)], refresh=True) for t, p in due),
                created_at=datetime.fromtimestamp(planned, timezone.utc).isoformat())
    with sink_of(spec, settings) as sink:
        sink.refresh(plan)
    # An idle pipeline's manifest memory, likewise, before retention deletes it: a snapshot older
    # than SNAPSHOT_MAX_AGE_S is written again. A held pipeline plans nothing, so this is what
    # keeps its hold (carried by the snapshot) beyond the manifest's retention.
    ManifestStore.of(spec, settings).refresh_state()
    log.info("%s: refreshed the checkpoints of %s", spec.name, ", ".join(f"{t}-{p}" for t, p in due))
    return Refreshed(due)


def prepare_plan(spec: PipelineSpec, settings: KafkaSettings, run_id: str) -> Plan:
    """The plan of run ``run_id``: the stored one while it still applies, else a new one, stored.

    A stored plan applies while every active range's checkpoint is still its expected
    checkpoint (not run yet, and its records still exist) or its end (committed: the re-run is a
    no-op). Otherwise the run is planned anew, so ``on_data_loss`` decides about deleted records.

    :raises PipelineHeld: an earlier run found a range committed short (not acknowledged yet).
    :raises PlanError: ``run_id`` is one the run manifest's own keys use.
    """
    if reserved_run_id(run_id):
        raise PlanError(f"pipeline {spec.name}: run id {run_id!r} is reserved (the run manifest's keys use "
                        f"{', '.join(sorted(RESERVED_RUN_IDS))}): choose another")
    manifest = ManifestStore.of(spec, settings)
    cks, offsets, times, state = _repaired_state(spec, settings, manifest)
    stored = manifest.stored_plan(run_id)
    if stored is not None and all(
            cks.get(r.tp) == r.until
            # Not run yet: still applies unless retention deleted part of its range since.
            or (cks.get(r.tp) == r.expected and (r.empty or r.from_offset >= offsets[r.tp].log_start))
            for r in stored.active):
        return stored
    plan = _first_plan_remembered(spec, settings, manifest, run_id, cks, offsets, times, state)
    manifest.put_plan(plan)
    return plan


def _repaired_state(spec: PipelineSpec, settings: KafkaSettings, manifest: ManifestStore, may_fence: bool = True):
    """The cluster's state for a plan that will run: a SQL sink's drift repaired, the manifest's
    memory read (a bounded walk from its end, snapshotted when the walk was long: a later lookup,
    however many runs later, stops at that snapshot).

    :param may_fence: the caller has no open transaction of the pipeline's (see :func:`_unpinned_state`).
    :raises PipelineHeld: a run found a range committed short, and no operator has acknowledged it.
    """
    manifest.ensure_topic()
    cks, drift, offsets, times = _unpinned_state(spec, settings, may_fence)
    if drift:
        repair_drift(spec, settings, drift)
    # Read once no killed attempt's transaction pins the manifest's LSO: its checkpoint records are
    # read committed (a hold is also looked for above a pinned LSO, read uncommitted).
    state = manifest.refresh_state()
    refuse_if_held(spec, state)
    return cks, offsets, times, state


def refuse_if_held(spec: PipelineSpec, state: ManifestState) -> None:
    """:raises PipelineHeld: ``state`` (the pipeline's memory) holds a finding of a range committed
    short that no operator has acknowledged; names it and what ends it."""
    hold = state.held
    if hold is not None:
        raise PipelineHeld(f"pipeline {spec.name} is held since {hold['found_at']}: {hold['mismatch']}; nothing "
                           "is planned until an operator acknowledges it (docs/operations.md, \"A range committed "
                           f"short\"): kafka-eos acknowledge {spec.name} --yes")


def _unpinned_state(spec: PipelineSpec, settings: KafkaSettings, may_fence: bool):
    """:func:`_cluster_state`, past an attempt killed inside its transaction (see
    :func:`past_killed_attempt`). Where the run may fence, offsets still pending after
    :data:`LOOK_SETTLE_S` are such an attempt's (a live commit settles in milliseconds, and the
    run's own ``init_transactions`` would fence it anyway): fenced then, not after the full bound."""
    if not (may_fence and spec.sink.about.transactional):
        return past_killed_attempt(spec, settings, lambda: _cluster_state(spec, settings), may_fence)
    state = _cluster_state(spec, settings, settle_s=LOOK_SETTLE_S)
    if not any(t.pending for t in state[3].values()):
        return state
    _fence_pipeline(spec, settings)
    return _cluster_state(spec, settings)


def past_killed_attempt(spec: PipelineSpec, settings: KafkaSettings, read: Callable[[], T],
                        may_fence: bool = True) -> T:
    """``read()`` (a stable read of ``spec``'s group offsets), past an attempt killed inside its
    transaction after it had sent the offsets (between ``send_offsets_to_transaction`` and the
    commit): the group's offsets stay pending, and every stable read of them waits, until that
    transaction ends — at its timeout, or when an attempt of the same work fences it. The run
    fences it at its commit anyway; with ``may_fence`` it fences it now (every transactional.id
    of ``spec``: a side run's are its own), and reads again.
    """
    try:
        return read()
    except BrokerError as exc:
        cause = exc.__cause__
        timed_out = isinstance(cause, KafkaException) and cause.args[0].code() in (
            KafkaError._TIMED_OUT, KafkaError.UNSTABLE_OFFSET_COMMIT)
        if not (may_fence and timed_out and spec.sink.about.transactional):
            raise
    _fence_pipeline(spec, settings)
    return read()


def _fence_pipeline(spec: PipelineSpec, settings: KafkaSettings) -> None:
    """Fence every transactional.id of ``spec`` (a side run's are its own): an attempt killed inside
    its transaction has it aborted, and the group's offsets it held pending are released."""
    tps = source_partitions(spec, settings)
    log.warning("the offsets of group %s are held by an open transaction (an attempt killed before its "
                "commit?): fencing the pipeline's transactional ids to abort it", spec.source.group_id)
    for transactional_id in [spec.transactional_id(), *(spec.transactional_id(t, p) for t, p in tps)]:
        try:
            fence(settings, transactional_id, spec.sink.transaction_timeout_s * 1000, spec.source.topics[0])
        except KafkaException as exc:
            raise BrokerError(f"fencing {transactional_id} to release the offsets of group "
                              f"{spec.source.group_id!r}: {exc.args[0].str()}") from exc


def _first_plan_remembered(spec, settings, manifest, run_id, cks, offsets, times, state) -> Plan:
    """:func:`_plan`; a pipeline's first plan also records where it starts each partition, and a
    memory that retention cut is whole again once every partition has a checkpoint (restored by
    an operator): a snapshot that remembers each one."""
    plan, first = _plan(spec, settings, run_id, cks, offsets, times, state)
    if first:
        manifest.put_starts(plan)  # later plans start this plan's uncommitted partitions here
    if spec.sink.about.transactional and not state.complete and cks and None not in cks.values():
        whole = ManifestState(checkpoints=dict(state.checkpoints), starts=state.starts, read_upto=state.read_upto,
                              hold=state.hold)
        for (topic, partition), offset in cks.items():
            whole.remember({**checkpoint_record(run_id, spec.source.group_id, topic, partition, offset), "restored": True})
        manifest.put_snapshot(whole)
    return plan


def lost_to_retention(spec: PipelineSpec, cks: dict[TP, int | None], state: ManifestState) -> list[TP]:
    """A Kafka sink's partitions without a group offset that a memory cut by retention may have
    known (:attr:`ManifestState.complete` false): a lost checkpoint or a new partition, which
    nothing can tell apart."""
    if not spec.sink.about.transactional or state.complete:
        return []
    return sorted(tp for tp, ck in cks.items() if ck is None and tp not in state.checkpoints)


def fresh_plan(spec: PipelineSpec, settings: KafkaSettings, run_id: str, may_fence: bool = True) -> Plan:
    """A plan that will run at once and is not stored (a stream's batch: it is never retried as
    such; a restarted stream plans again from the checkpoints). Repairs drift like
    :func:`prepare_plan`.

    :param may_fence: False while the caller keeps a producer of the pipeline's open (a stream
        after its first batch): fencing it would fence the stream itself.
    :raises PipelineHeld: a run or batch found a range committed short (not acknowledged yet).
    """
    manifest = ManifestStore.of(spec, settings)
    cks, offsets, times, state = _repaired_state(spec, settings, manifest, may_fence)
    return _first_plan_remembered(spec, settings, manifest, run_id, cks, offsets, times, state)


def verify(spec: PipelineSpec, settings: KafkaSettings, plan: Plan) -> dict[TP, int | None]:
    """Check that every active range of the plan is committed (checkpoint == until) and, in
    per_partition scope, that its run found each partition's records whole (the run record's
    ``mismatch``: see :func:`kafka_eos.sinks.proof.check_rows`).

    :raises KafkaEosError: naming the first partition whose checkpoint is not at the plan's end.
    :raises RangeMismatch: a partition's transaction wrote fewer records than Spark gave it.
    """
    tps = [r.tp for r in plan.active]
    cks, drift = checkpoints(spec, settings, tps) if tps else ({}, [])
    for r in plan.active:
        # A later run (a backfill, the CLI) may have moved it further since: that is landed too.
        if cks.get(r.tp) is None or cks[r.tp] < r.until:
            raise KafkaEosError(f"{r.topic}-{r.partition}: checkpoint is {cks.get(r.tp)}, the plan of run "
                                f"{plan.run_id!r} ends at {r.until}: the commit did not land")
    if drift:
        raise KafkaEosError(f"{drift[0].topic}-{drift[0].partition}: Kafka mirror at {drift[0].kafka}, "
                            f"sink at {drift[0].sink}: the mirror was not updated")
    with sink_of(spec, settings) as sink:
        sink.verify(plan)  # per_partition: each partition's records found whole (its run's record)
    return cks
