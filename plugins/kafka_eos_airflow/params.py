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

from kafka_eos.errors import SpecError
from kafka_eos.spec import PipelineSpec

THIS_RUN = "This run"
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
        "reset_checkpoint_to": Param(
            None, type=["null", "string"], section=RESET, title="Reset the checkpoint to",
            description_md="Instead of a run: move the pipeline's checkpoint (back to re-read, forward to skip). "
                           "An ISO-8601 timestamp (`2026-11-20T10:00:00Z`: every partition goes to its first "
                           "record at or after it) or JSON offsets (`{\"orders-0\": 120}`: only the partitions "
                           "listed). Offsets must lie between the log start and the last stable offset."),
        "reset_confirm": Param(
            "", type="string", section=RESET, title="Confirm the reset",
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

    @property
    def runs_spark(self) -> bool:
        """False when the plan task does all of the run: a dry run, a reset."""
        return not (self.dry_run or self.reset_to)

    @classmethod
    def of(cls, params: Mapping[str, Any] | None, spec: PipelineSpec) -> "RunOptions":
        """The options in ``params`` (a run's ``context["params"]``; missing keys: the defaults).

        :raises SpecError: a value the form's schema should have refused, naming the field.
        """
        params = params or {}
        cap = params.get("max_records_per_partition")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SpecError(f"params.max_records_per_partition: must be a positive integer, got {cap!r}")
        dry_run = params.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise SpecError(f"params.dry_run: must be true or false, got {dry_run!r}")
        reset_to = params.get("reset_checkpoint_to")
        if reset_to is not None and not isinstance(reset_to, str):
            raise SpecError(f"params.reset_checkpoint_to: must be a timestamp or JSON offsets, got {reset_to!r}")
        return cls(max_records_per_partition=cap, dry_run=dry_run, reset_to=(reset_to or "").strip() or None,
                   reset_confirm=str(params.get("reset_confirm") or ""))

    def apply(self, spec: PipelineSpec) -> PipelineSpec:
        """``spec`` as this run reads it (its cap replaced by the run's)."""
        if self.max_records_per_partition is None or self.max_records_per_partition == spec.source.max_records_per_partition:
            return spec
        return dataclasses.replace(spec, source=dataclasses.replace(
            spec.source, max_records_per_partition=self.max_records_per_partition))
