"""The runbook operator: abort one named open transaction, from a manually triggered DAG whose
Params form names it. A dry run (the default) shows what would be aborted, or why it would be
refused, and changes nothing; a real run needs a typed confirmation, passes the abort's guards
(age, whose it is: :mod:`kafka_eos.health.abort`), checks that the transaction ended and writes an
audit record of every attempt, refused and failed ones too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException

from kafka_eos_airflow import config
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
    "force": Param(False, type="boolean", title="Force",
                   description_md="Abort even though the transaction is younger than its threshold (the larger of "
                                  "the brokers' `transaction.max.timeout.ms` and the pipeline's "
                                  "`transaction_timeout_s`): a healthy producer may still commit it. Never lets a "
                                  "partition marker end a transaction its coordinator may still track."),
    "older_than_s": Param(None, type=["null", "number"], minimum=0, title="Threshold (seconds)",
                          description_md="Refuse a transaction open for less than this. Empty: the default above."),
    # Nullable: the UI's form refuses to trigger while a non-nullable field is empty (a dry run
    # needs no confirmation).
    "confirm": Param(None, type=["null", "string"], title="Confirmation",
                     description_md="For a real run, type `ABORT <topic>-<partition>@<start offset>`, "
                                    "e.g. `ABORT orders-1@3`."),
}


class AbortTransactionOperator(BaseOperator):
    """Abort the open transaction named by the run's params (see :data:`PARAMS`). Returns what it
    found and, in a real run, the audit record.

    :param kafka_conn_id: the ``kafka`` connection; None: ``[kafka_eos] kafka_conn_id``. (templated)
    :param pipelines_folder: the folder of the pipelines whose transactions it knows (whose
        producer a transaction is); None: ``[kafka_eos] pipelines_folder``.
    """

    template_fields = ("kafka_conn_id",)

    def __init__(self, *, kafka_conn_id: str | None = None, pipelines_folder: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()
        self.pipelines_folder = pipelines_folder

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos.errors import KafkaEosError
        from kafka_eos.health.abort import attempt_abort, check_abort, find_open_transaction, outcome_text
        from kafka_eos.spec import bundled_specs

        params = context["params"]
        topic, partition, start = params["topic"], int(params["partition"]), int(params["start_offset"])
        force, older_than = bool(params.get("force")), params.get("older_than_s")
        older_than = None if older_than is None else float(older_than)
        specs = bundled_specs(folder=self.pipelines_folder or config.pipelines_folder())
        try:
            settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings()
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        if params["dry_run"]:
            try:
                txn = find_open_transaction(settings, topic, partition, start, specs)
                self.log.info("%s-%s: open transaction at %s: %s", topic, partition, start, txn)
                guard = check_abort(settings, topic, partition, txn, older_than_s=older_than, force=force,
                                    specs=specs)
            except KafkaEosError as exc:
                raise AirflowFailException(f"dry run: {exc}") from exc
            self.log.info("dry run: nothing changed; it would be aborted (%s); trigger again with dry_run off and "
                          "confirm %r to abort it", guard, confirmation(topic, partition, start))
            return {"dry_run": True, "transaction": txn, "guard": guard}
        dag_run = context.get("dag_run")
        who = getattr(dag_run, "triggering_user_name", None) or "unknown"
        via = f"{self.dag_id} run {context['run_id']}"
        expected = confirmation(topic, partition, start)
        if params["confirm"] != expected:
            from kafka_eos.health.abort import record_abort

            error = (f"confirm: type exactly {expected!r} to abort this transaction (got {params['confirm']!r}); "
                     "nothing was changed")
            record_abort(settings, topic, partition, start, None, None, who=who, via=via, outcome="refused",
                         error=error)
            raise AirflowFailException(error)
        try:
            record = attempt_abort(settings, topic, partition, start, who=who, via=via, specs=specs,
                                   older_than_s=older_than, force=force)
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("aborted: %s", outcome_text(record))
        return {"dry_run": False, "transaction": record["transaction"], "audit": record}
