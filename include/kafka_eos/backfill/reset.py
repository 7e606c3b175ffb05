"""Move a pipeline's checkpoint to offsets a person chose (back to re-read, forward to skip),
the way the pipeline's own commits move it, and record that in the audit trail.

Kafka sinks: the new offsets are committed in a transaction under the pipeline's own
transactional ids (the group-level id in ``atomic`` scope, each partition's id in
``per_partition`` scope), exactly like an offsets-only run. So the reset fences every attempt of
the pipeline still in flight, and its check (the group is where the reset found it) refuses to
reset over a commit that landed in between. SQL sinks: the offsets table is changed by
compare-and-set in one database transaction, then mirrored to the group offsets.

The run manifest's memory of the checkpoints is replaced by a ``reset`` snapshot, so a
pipeline whose group offsets later expire is not told to restore the offsets from before the
reset.
"""

from __future__ import annotations

from kafka_eos.audit import write_audit
from kafka_eos.kafka_admin import TP
from kafka_eos.lease import refuse_if_streaming
from kafka_eos.manifest import ManifestStore, checkpoint_record, now_iso
from kafka_eos.pipeline import checkpoints
from kafka_eos.plan import PartitionRange, Plan
from kafka_eos.settings import KafkaSettings
from kafka_eos.sinks.scope import sink_of
from kafka_eos.spec import PipelineSpec


def confirmation(spec: PipelineSpec) -> str:
    """What a person types to confirm a reset of ``spec``'s checkpoint."""
    return f"RESET {spec.name}"


def reset_checkpoint(spec: PipelineSpec, settings: KafkaSettings, targets: dict[TP, int], *, run_id: str,
                     asked: str, who: str, via: str) -> dict:
    """Move the checkpoint of the partitions in ``targets`` there; returns the audit record.

    :param targets: the new next offset per partition (checked by :mod:`.positions`).
    :param asked: what the person asked for (the timestamp or the offsets, as given).
    :raises CheckpointConflict: a run committed between reading the checkpoint and the reset.
    :raises TransactionFailed: the reset transaction failed; nothing moved.
    :raises PipelineBusy: a stream owns the pipeline (its offsets are the stream's: the reset's
        transaction would fence the stream's producer); nothing moved.
    """
    refuse_if_streaming(spec, settings, "a checkpoint reset waits")
    before, _drift = checkpoints(spec, settings, sorted(targets))
    plan = Plan(spec.name, run_id, tuple(PartitionRange(t, p, offset, offset, before[(t, p)])
                                         for (t, p), offset in sorted(targets.items())))
    moving = plan.active
    with sink_of(spec, settings) as sink:
        sink.reset(plan)

    manifest = ManifestStore.of(spec, settings)
    manifest.ensure_topic()
    memory = manifest.state()
    for (t, p), offset in targets.items():
        memory.checkpoints[(t, p)] = checkpoint_record(run_id, spec.source.group_id, t, p, offset)
    manifest.put_snapshot(memory, reset=True)

    at = now_iso()
    record = {"action": "reset_checkpoint", "pipeline": spec.name, "group_id": spec.source.group_id,
              "sink": spec.sink.kind, "asked": asked, "who": who, "via": via, "at": at, "run_id": run_id,
              "status": "reset" if moving else "noop",
              "before": {f"{t}-{p}": before[(t, p)] for t, p in sorted(targets)},
              "after": {f"{t}-{p}": offset for (t, p), offset in sorted(targets.items())}}
    return write_audit(settings, f"reset:{spec.name}:{at}", record)
