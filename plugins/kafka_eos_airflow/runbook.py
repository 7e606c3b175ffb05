"""The runbook operator: abort one named open transaction, from a manually triggered DAG whose
Params form names it. A dry run (the default) shows what would be aborted and changes nothing; a
real run needs a typed confirmation, checks that the LSO moved and writes an audit record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException

from kafka_eos_airflow.hooks import KafkaEosHook

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context


def confirmation(topic: str, partition: int, start_offset: int) -> str:
    """What the operator types to confirm a real abort."""
    return f"ABORT {topic}-{partition}@{start_offset}"


#: The trigger form of the runbook DAG.
PARAMS = {
    "topic": Param("", type="string", minLength=1, title="Topic",
                   description_md="The topic of the held partition (from the alert or `kafka-eos txn hanging`)."),
    "partition": Param(0, type="integer", minimum=0, title="Partition"),
    "start_offset": Param(0, type="integer", minimum=0, title="Start offset",
                          description_md="Where the open transaction starts on the partition: its LSO."),
    "dry_run": Param(True, type="boolean", title="Dry run",
                     description_md="On: show what would be aborted, change nothing."),
    # Nullable: the UI's form refuses to trigger while a non-nullable field is empty (a dry run
    # needs no confirmation).
    "confirm": Param(None, type=["null", "string"], title="Confirmation",
                     description_md="For a real run, type `ABORT <topic>-<partition>@<start offset>`, "
                                    "e.g. `ABORT orders-1@3`."),
}


class AbortTransactionOperator(BaseOperator):
    """Abort the open transaction named by the run's params (see :data:`PARAMS`). Returns what it
    found and, in a real run, the audit record.

    :param kafka_conn_id: the ``kafka`` connection. (templated)
    """

    template_fields = ("kafka_conn_id",)

    def __init__(self, *, kafka_conn_id: str = KafkaEosHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_conn_id = kafka_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos.errors import KafkaEosError
        from kafka_eos.health.abort import abort_transaction, find_open_transaction, record_abort
        from kafka_eos.spec import bundled_specs

        params = context["params"]
        topic, partition, start = params["topic"], int(params["partition"]), int(params["start_offset"])
        try:
            settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings()
            txn = find_open_transaction(settings, topic, partition, start, bundled_specs())
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("%s-%s: open transaction at %s: %s", topic, partition, start, txn)
        if params["dry_run"]:
            self.log.info("dry run: nothing changed; trigger again with dry_run off and confirm %r to abort it",
                          confirmation(topic, partition, start))
            return {"dry_run": True, "transaction": txn}
        expected = confirmation(topic, partition, start)
        if params["confirm"] != expected:
            raise AirflowFailException(f"confirm: type exactly {expected!r} to abort this transaction (got "
                                       f"{params['confirm']!r}); nothing was changed")
        dag_run = context.get("dag_run")
        who = getattr(dag_run, "triggering_user_name", None) or "unknown"
        try:
            done = abort_transaction(settings, topic, partition, txn)
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        record = record_abort(settings, topic, partition, txn, done, who=who,
                              via=f"{self.dag_id} run {context['run_id']}")
        self.log.info("aborted: %s; LSO %s -> %s (high watermark %s)", done["method"], done["lso_before"],
                      done["lso_after"], done["high_watermark"])
        return {"dry_run": False, "transaction": txn, "audit": record}
