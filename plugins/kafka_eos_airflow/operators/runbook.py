"""The runbook's steps: abort one named open transaction, from a manually triggered DAG whose
Params form names it (inspect >> approve >> abort_transaction). A dry run (the default) shows what
would be aborted, or why it would be refused, and changes nothing; a real run needs a typed
confirmation, passes the abort's guards (age, whose it is: :mod:`kafka_eos.health.abort`), waits
for a person's approval in Airflow when the transaction is no known pipeline's own (Airflow's
Human-in-the-loop ``ApprovalOperator``), checks that the transaction ended and writes an audit
record of every attempt, refused, rejected and failed ones too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException

from kafka_eos.errors import KafkaEosError
from kafka_eos.spec import bundled_specs
from kafka_eos_airflow import config
from kafka_eos_airflow.hooks.kafka import KafkaEosHook

# Imported inside the functions that use them, not here: the Kafka clients (kafka_admin, the
# manifest, pipeline, health), Spark (batch, spark_io), the OpenLineage client (lineage) and
# Airflow's metrics. The DAG processor imports this module whenever it parses the DAG files,
# and none of them may load there (tests/dags/test_dagbag.py).

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


class _RunbookStep(BaseOperator):
    """What the runbook's steps share: the transaction named by the run's params, the cluster, the
    known pipelines and who asked."""

    template_fields = ("kafka_conn_id",)

    def __init__(self, *, kafka_conn_id: str | None = None, pipelines_folder: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()
        self.pipelines_folder = pipelines_folder

    def target(self, context: Context) -> dict[str, Any]:
        params = context["params"]
        older_than = params.get("older_than_s")
        try:
            settings = KafkaEosHook(self.kafka_conn_id).get_checked_settings()
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        return {"settings": settings, "topic": params["topic"], "partition": int(params["partition"]),
                "start": int(params["start_offset"]), "force": bool(params.get("force")),
                "older_than": None if older_than is None else float(older_than),
                "specs": bundled_specs(folder=self.pipelines_folder or config.pipelines_folder()),
                "who": getattr(context.get("dag_run"), "triggering_user_name", None) or "unknown",
                "via": f"{self.dag_id} run {context['run_id']}"}


class InspectTransactionOperator(_RunbookStep):
    """The runbook's first step: find the open transaction named by the run's params (see
    :data:`PARAMS`) and pass it through the abort's guards, changing nothing. A dry run stops here
    (the steps after it are skipped); a real run needs the typed confirmation first, and a refusal is
    audited. Returns the finding: the transaction (producer, transactional.id, coordinator, the
    partitions it holds, its pipeline), the guard's answer (method, age, threshold) and whether a
    person must approve the abort (a transaction that is no known pipeline's own).

    :param kafka_conn_id: the ``kafka`` connection; None: ``[kafka_eos] kafka_conn_id``. (templated)
    :param pipelines_folder: the folder of the pipelines whose transactions it knows (whose
        producer a transaction is); None: ``[kafka_eos] pipelines_folder``.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos.health.abort import check_abort, checked_abort, find_open_transaction, record_abort

        t = self.target(context)
        settings, topic, partition, start = t["settings"], t["topic"], t["partition"], t["start"]
        dry_run = bool(context["params"]["dry_run"])
        if dry_run:
            try:
                txn = find_open_transaction(settings, topic, partition, start, t["specs"])
                self.log.info("%s-%s: open transaction at %s: %s", topic, partition, start, txn)
                guard = check_abort(settings, topic, partition, txn, older_than_s=t["older_than"], force=t["force"],
                                    specs=t["specs"])
            except KafkaEosError as exc:
                raise AirflowFailException(f"dry run: {exc}") from exc
            self.log.info("dry run: nothing changed; it would be aborted (%s); trigger again with dry_run off and "
                          "confirm %r to abort it", guard, confirmation(topic, partition, start))
        else:
            expected = confirmation(topic, partition, start)
            if context["params"]["confirm"] != expected:
                error = (f"confirm: type exactly {expected!r} to abort this transaction (got "
                         f"{context['params']['confirm']!r}); nothing was changed")
                record_abort(settings, topic, partition, start, None, None, who=t["who"], via=t["via"],
                             outcome="refused", error=error)
                raise AirflowFailException(error)
            try:
                txn, guard = checked_abort(settings, topic, partition, start, who=t["who"], via=t["via"],
                                           specs=t["specs"], older_than_s=t["older_than"], force=t["force"])
            except KafkaEosError as exc:
                raise AirflowFailException(str(exc)) from exc
        return {"dry_run": dry_run, "target": {"topic": topic, "partition": partition, "start_offset": start},
                "transaction": txn, "guard": guard, "needs_approval": txn.get("pipeline") is None}


def finding_text(finding: dict[str, Any]) -> str:
    """What the approver reads (Markdown): the transaction the dry run found and what the abort does."""
    txn, guard = finding["transaction"], finding["guard"]
    age = "an unknown time" if guard.get("age_s") is None else f"{guard['age_s']:.0f} s"
    held = ", ".join(f"`{p}`" for p in txn.get("partitions") or []) or "unknown"
    return "\n".join([
        f"An open transaction holds `{txn.get('start_offset')}` onward; it is **no known pipeline's own**.",
        "",
        f"- producer: id `{txn.get('producer_id')}`, epoch `{txn.get('producer_epoch')}`, transactional.id "
        f"`{txn.get('transactional_id') or 'unknown'}`",
        f"- open for: {age} (by {guard.get('age_from')}; the abort threshold is {guard.get('threshold_s'):g} s"
        f"{', forced' if guard.get('forced') else ''})",
        f"- partitions held: {held}",
        f"- coordinator: broker `{txn.get('coordinator_id')}`, state `{txn.get('coordinator_state')}` "
        f"(verdict: {txn.get('verdict')})",
        f"- the abort: `{guard.get('method')}` ("
        + ("a new epoch of its transactional.id: its coordinator aborts it everywhere" if guard.get("method") == "fence"
           else "an abort marker on this partition") + ")",
        "",
        "**Approve** aborts it (its records are never read by read_committed consumers); **Reject** changes nothing.",
    ])


class AbortApprovalOperator(ApprovalOperator):
    """The runbook's second step: a person approves the abort of a transaction that is no known
    pipeline's own, in Airflow's Human-in-the-loop view (Required actions), reading the first step's
    finding. A pipeline's own transaction needs no approval (the step passes at once); a dry run
    has nothing to approve (skipped). Reject skips the abort: nothing changes; the rejection is
    audited."""

    def __init__(self, *, kafka_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(subject="Abort a transaction that is no pipeline's own?", **kwargs)
        self.kafka_conn_id = kafka_conn_id or config.kafka_conn_id()

    def execute(self, context: Context):
        from airflow.sdk.exceptions import AirflowSkipException

        finding = context["ti"].xcom_pull(task_ids="inspect")
        if finding["dry_run"]:
            raise AirflowSkipException("dry run: nothing to approve")
        txn = finding["transaction"]
        if not finding["needs_approval"]:
            self.log.info("no approval needed: the transaction is pipeline %s's own", txn.get("pipeline"))
            return {"approval": "not needed", "pipeline": txn.get("pipeline")}
        p = finding["target"]
        self.subject = (f"Abort the transaction at {p['topic']}-{p['partition']}@{p['start_offset']} "
                        f"(producer {txn.get('producer_id')}, no pipeline's own)?")
        self.body = finding_text(finding)
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        # Audited before the operator skips the abort (its skip ends this method with an exception).
        if "error" not in event and event.get("chosen_options") == [self.REJECT]:
            from kafka_eos.health.abort import record_abort

            finding = context["ti"].xcom_pull(task_ids="inspect")
            p = finding["target"]
            by = (event.get("responded_by_user") or {}).get("name") or (
                "nobody: unanswered in time" if event.get("timedout") else "unknown")
            record_abort(KafkaEosHook(self.kafka_conn_id).get_checked_settings(), p["topic"], p["partition"],
                         p["start_offset"], finding["transaction"], None,
                         who=by, via=f"{self.dag_id} run {context['run_id']}", outcome="rejected",
                         error=f"rejected by {by} in Airflow: nothing was changed")
            self.log.info("rejected by %s: the abort is skipped, nothing changed", by)
        return super().execute_complete(context, event)


class AbortTransactionOperator(_RunbookStep):
    """The runbook's last step: abort the transaction the first step found (found and checked
    again: it may have ended meanwhile), check that it ended, and audit the attempt, naming who
    asked and who approved. Returns the transaction and the audit record.

    :param kafka_conn_id: the ``kafka`` connection; None: ``[kafka_eos] kafka_conn_id``. (templated)
    :param pipelines_folder: see :class:`InspectTransactionOperator`.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from kafka_eos.health.abort import attempt_abort, outcome_text

        t = self.target(context)
        approval = context["ti"].xcom_pull(task_ids="approve") or {}
        approver = (approval.get("responded_by_user") or {}).get("name")
        who = f"{t['who']} (approved by {approver})" if approver else t["who"]
        try:
            record = attempt_abort(t["settings"], t["topic"], t["partition"], t["start"], who=who, via=t["via"],
                                   specs=t["specs"], older_than_s=t["older_than"], force=t["force"])
        except KafkaEosError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("aborted: %s", outcome_text(record))
        return {"dry_run": False, "transaction": record["transaction"], "audit": record}
