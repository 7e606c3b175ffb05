"""The trigger form of every pipeline DAG (Airflow Params: a validated JSON-schema form in the UI,
and what ``airflow dags trigger --conf`` and backfills' ``--dag-run-conf`` are checked against).

Scheduled runs get the defaults: a normal run from the checkpoint, capped by the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Param

from kafka_eos.backfill.places import writes_to
from kafka_eos.errors import SpecError
from kafka_eos.spec import PipelineSpec

THIS_RUN = "This run"
REPLAY = "Replay a past range"
RESET = "Reset the checkpoint"


def pipeline_params(spec: PipelineSpec) -> dict[str, Param]:
    """The Params of ``spec``'s DAG."""
    return {
        "max_records_per_partition": Param(
            spec.source.max_records_per_partition, type="integer", minimum=1, section=THIS_RUN,
            title="Max records per partition",
            description_md="How far this run reads in each partition, as a span of offsets (the spec's "
                           f"`source.max_records_per_partition`: {spec.source.max_records_per_partition})."),
        "dry_run": Param(
            False, type="boolean", section=THIS_RUN, title="Dry run",
            description_md="On: compute and show the plan (the offset ranges this run would read) and stop. "
                           "Nothing is stored, read by Spark, written or committed. With a reset below: show "
                           "where the checkpoint would move, and change nothing."),
        "replay_from": Param(
            None, type=["null", "string"], section=REPLAY, title="Replay from",
            description_md="Instead of a run: re-derive the results of a past range, beside the live pipeline "
                           "(its checkpoint does not move). Where the range starts: an ISO-8601 timestamp or "
                           "JSON offsets (`{\"orders-0\": 120}`)."
                           + _side_results(spec)),
        "replay_until": Param(
            None, type=["null", "string"], section=REPLAY, title="Replay until",
            description_md="Where the range ends (exclusive): an ISO-8601 timestamp or JSON offsets, at most the "
                           "last stable offset."),
        "reprocess": Param(
            False, type="boolean", section=REPLAY, title="Reprocess",
            description_md="A replay or a backfill interval that was already written is not written again, "
                           "unless this is on: then it is written as a new generation (header "
                           "`kafka-eos.generation`), over the same offsets as the first time."),
        "reset_checkpoint_to": Param(
            None, type=["null", "string"], section=RESET, title="Reset the checkpoint to",
            description_md="Instead of a run: move the pipeline's checkpoint (back to re-read, forward to skip). "
                           "An ISO-8601 timestamp (`2026-11-20T10:00:00Z`: every partition goes to its first "
                           "record at or after it) or JSON offsets (`{\"orders-0\": 120}`: only the partitions "
                           "listed). Offsets must lie between the log start and the last stable offset."),
        # Nullable, like every optional field: the UI's form refuses to trigger while a
        # non-nullable field is empty, even one that only a reset reads.
        "reset_confirm": Param(
            None, type=["null", "string"], section=RESET, title="Confirm the reset",
            description_md=f"Type `RESET {spec.name}` to reset. The reset is recorded in the topic "
                           "`kafka-eos.audit`: who, when, before and after."),
    }


@dataclass(frozen=True)
class RunOptions:
    """What a run's params ask for, checked."""

    max_records_per_partition: int | None = None
    dry_run: bool = False
    #: Move the checkpoint there instead of running (a timestamp or JSON offsets, as typed).
    reset_to: str | None = None
    reset_confirm: str = ""
    #: Re-derive a past range instead of a run (timestamps or JSON offsets, as typed).
    replay_from: str | None = None
    replay_until: str | None = None
    reprocess: bool = False

    @classmethod
    def of(cls, params: Mapping[str, Any] | None, spec: PipelineSpec) -> "RunOptions":
        """The options in ``params`` (a run's ``context["params"]``; missing keys: the defaults).

        :raises SpecError: a value the form's schema should have refused, naming the field.
        """
        params = params or {}
        cap = params.get("max_records_per_partition")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SpecError(f"params.max_records_per_partition: must be a positive integer, got {cap!r}")
        dry_run = _flag(params, "dry_run")
        text = {name: _position(params, name) for name in ("reset_checkpoint_to", "replay_from", "replay_until")}
        if bool(text["replay_from"]) != bool(text["replay_until"]):
            missing = "replay_until" if text["replay_from"] else "replay_from"
            raise SpecError(f"params.{missing}: a replay needs both replay_from and replay_until")
        if text["replay_from"] and text["reset_checkpoint_to"]:
            raise SpecError("params.reset_checkpoint_to: a run either replays or resets, not both")
        reprocess = _flag(params, "reprocess")
        return cls(max_records_per_partition=cap, dry_run=dry_run, reset_to=text["reset_checkpoint_to"],
                   reset_confirm=str(params.get("reset_confirm") or ""), replay_from=text["replay_from"],
                   replay_until=text["replay_until"], reprocess=reprocess)

    def apply(self, spec: PipelineSpec) -> PipelineSpec:
        """``spec`` as this run reads it (its cap replaced by the run's)."""
        if self.max_records_per_partition is None or self.max_records_per_partition == spec.source.max_records_per_partition:
            return spec
        return dataclasses.replace(spec, source=dataclasses.replace(
            spec.source, max_records_per_partition=self.max_records_per_partition))


def _position(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise SpecError(f"params.{name}: must be a timestamp or JSON offsets, got {value!r}")
    return (value or "").strip() or None


def _flag(params: Mapping[str, Any], name: str) -> bool:
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise SpecError(f"params.{name}: must be true or false, got {value!r}")
    return value


def _side_results(spec: PipelineSpec) -> str:
    """Where a replay's results go, for the form (never the live output, table or dead letters)."""
    if spec.sink.backfill_target is None:
        return f" Needs `sink.{spec.sink.about.backfill}` in the spec: a replay never writes the live output."
    promote = {"sql": " The run's note gives the SQL statement that copies a checked replay into the live table.",
               "branch": " The run's note gives the command that promotes a checked replay onto main."}.get(
        spec.sink.about.promoted_by, "")
    return f" Results go to {writes_to(spec)}, never to the live output.{promote}"
