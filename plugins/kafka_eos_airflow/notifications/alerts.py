"""Operator alerts: a webhook (JSON POST with a Slack-compatible ``text``) and e-mail, sent by
Airflow's own HTTP and SMTP providers, configured through Airflow Connections.

- ``kafka_eos_alerts_webhook`` (type ``http``): host, port, schema; the endpoint path is the
  notifier's ``endpoint`` (default: the connection's URL itself).
- ``kafka_eos_alerts_smtp`` (type ``smtp``): the mail server; its extra holds ``to`` (a
  comma-separated list) and optionally ``from_email``.

A notifier whose connection does not exist logs that and sends nothing: a deployment chooses its
channels by defining connections, and the DAGs carry both notifiers. Notifiers of any provider get
the same alerts through :class:`KafkaEosAlertRouter` (failures and warnings) and
:func:`deadline_missed` (a pipeline DAG's ``DeadlineAlert``), with the structured payload
(:func:`alert`, ``findings``) as ``kafka_eos_alert`` in their template context.

An alert says what is wrong and what to do: DAG, run, task, the one-line error, and
- ``stalls``: when a hung-transaction sensor failed, each held partition with its LSO, high
  watermark, age, producer, transactional.id, the runbook to trigger and the command that aborts it;
- ``stale``: when a freshness check failed, each partition whose oldest unprocessed committed
  record is older than its pipeline's ``source.freshness_limit_s``;
- ``skipped``: when a plan skipped records lost to retention (``on_data_loss: skip``), the ranges.
  The run goes on; the alert is sent by the plan task (:func:`send_alert`), not on a failure.
"""

from __future__ import annotations

import copy
import html
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.http.notifications.http import HttpNotifier
from airflow.providers.smtp.notifications.smtp import SmtpNotifier
from airflow.sdk import BaseHook, BaseNotifier
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from kafka_eos.health import abort_command

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import Context

WEBHOOK_CONN_ID = "kafka_eos_alerts_webhook"
#: The DAG that aborts a held partition's transaction (dags/kafka_eos_runbooks.py).
RUNBOOK_DAG_ID = "kafka_eos_runbook_abort_transaction"
#: The watchdog's DAG: its freshness task's alert links each late pipeline's DAG, under the same
#: DAG id prefix as its own (the DAG factory's ``dag_id_prefix``).
WATCHDOG_DAG_ID = "kafka_eos_watchdog"
PIPELINE_DAG_PREFIX = "kafka_eos__"
SMTP_CONN_ID = "kafka_eos_alerts_smtp"


#: Where :func:`send_alert` puts an alert that is not a task failure, in the notifiers' context.
ALERT_KEY = "kafka_eos_alert"


class KafkaEosAlertError(AirflowFailException):
    """A check failed; ``details`` (lists of dicts: ``stalls``, ``stale``) go into the alert."""

    def __init__(self, message: str, **details: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.details = details


class HungTransactionsFound(KafkaEosAlertError):
    """A sensor found partitions held by open transactions; ``stalls`` has them as dicts."""

    def __init__(self, message: str, stalls: list[dict[str, Any]]) -> None:
        super().__init__(message, stalls=stalls)
        self.stalls = stalls


class StaleDataFound(KafkaEosAlertError):
    """Committed records have waited longer than their pipeline's freshness limit; ``stale``
    has the partitions (:meth:`kafka_eos.health.backlog.Staleness.as_dict`)."""

    def __init__(self, message: str, stale: list[dict[str, Any]]) -> None:
        super().__init__(message, stale=stale)


def alert(context: Context, runbook_dag_id: str = RUNBOOK_DAG_ID) -> dict[str, Any]:
    """The alert of a failed task (or of :func:`send_alert`): the facts, and a Slack-compatible
    one-paragraph ``text``.

    :param runbook_dag_id: the abort runbook's DAG, which the alert names for each held partition.
    """
    sent = context.get(ALERT_KEY)
    if sent and "findings" in sent:  # a whole alert already (a deadline's, or one routed to notifiers)
        return sent
    ti, dag_run = context["ti"], context.get("dag_run")
    exc = context.get("exception")
    details = (sent or {}).get("details") or getattr(exc, "details", {})
    if sent:
        error, what = sent["message"], "reports"
    else:
        error, what = (str(exc).strip().splitlines() or ["failed"])[0] if exc is not None else "failed", "failed"
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id")
    stalls = [{
        "partition": f"{s['topic']}-{s['partition']}", "lso": s["lso"], "high_watermark": s["high_watermark"],
        "open_for_s": s["stuck_s"], "producer_id": (s.get("culprit") or {}).get("producer_id"),
        "transactional_id": (s.get("culprit") or {}).get("transactional_id"),
        "verdict": (s.get("culprit") or {}).get("verdict"), "attribution_error": s.get("attribution_error"),
        "abort": abort_command(s["topic"], s["partition"], s["lso"]),
        "runbook": {"dag_id": runbook_dag_id,
                    "conf": {"topic": s["topic"], "partition": s["partition"], "start_offset": s["lso"]}},
    } for s in details.get("stalls", [])]
    text = f"kafka-eos: {ti.dag_id} / {ti.task_id} {what} (run {run_id}, try {ti.try_number}): {error}"
    stale, skipped = details.get("stale", []), details.get("skipped", [])
    return {"text": text, "dag_id": ti.dag_id, "run_id": run_id, "task_id": ti.task_id,
            "try_number": ti.try_number, "error": error, "stalls": stalls, "stale": stale, "skipped": skipped,
            "findings": alert_findings(ti, run_id, error, details.get("stalls", []), stale, skipped, runbook_dag_id),
            "log_url": getattr(ti, "log_url", None)}


def _ui(path: str) -> str:
    """A link into the Airflow UI (``[api] base_url``)."""
    from airflow.sdk.configuration import conf

    return conf.get("api", "base_url", fallback="http://localhost:8080/").rstrip("/") + path


def _since(seconds_ago: float | None) -> str | None:
    from datetime import datetime, timedelta, timezone

    if seconds_ago is None:
        return None
    return (datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


def alert_findings(ti: Any, run_id: str | None, error: str, stalls: list[dict], stale: list[dict],
                   skipped: list[dict], runbook_dag_id: str) -> list[dict[str, Any]]:
    """The alert as structured findings, one per thing wrong: ``what`` (``held_partition``,
    ``stale_partition``, ``skipped_records``, ``task_failed``), ``pipeline``, ``partition``, ``since``
    (ISO time: the open transaction's start, the oldest unprocessed record's time, the alert's time)
    and ``runbook`` (a link into the Airflow UI: the abort runbook's DAG, the pipeline's DAG, the task's
    log), besides the fields of the kind."""
    findings = [{
        "what": "held_partition", "pipeline": (s.get("culprit") or {}).get("pipeline"),
        "pipelines_reading": s.get("pipelines", []), "partition": f"{s['topic']}-{s['partition']}",
        "since": _since(s.get("stuck_s")), "lso": s["lso"], "high_watermark": s["high_watermark"],
        "transactional_id": (s.get("culprit") or {}).get("transactional_id"),
        "runbook": _ui(f"/dags/{runbook_dag_id}"),
        "runbook_conf": {"topic": s["topic"], "partition": s["partition"], "start_offset": s["lso"]},
        "abort": abort_command(s["topic"], s["partition"], s["lso"]),
    } for s in stalls]
    prefix = ti.dag_id[:-len(WATCHDOG_DAG_ID)] if ti.dag_id.endswith(WATCHDOG_DAG_ID) else ""
    findings += [{
        "what": "stale_partition", "pipeline": s["pipeline"], "partition": f"{s['topic']}-{s['partition']}",
        "since": _since(s["age_s"]), "lag": s["lag"], "limit_s": s["limit_s"],
        "runbook": _ui(f"/dags/{prefix}{PIPELINE_DAG_PREFIX}{s['pipeline']}"),
    } for s in stale]
    findings += [{
        "what": "skipped_records", "pipeline": s.get("pipeline"), "partition": f"{s['topic']}-{s['partition']}",
        "since": _since(0), "from": s["from"], "until": s["until"], "runbook": getattr(ti, "log_url", None),
    } for s in skipped]
    if not findings:
        findings.append({"what": "task_failed", "pipeline": None, "partition": None, "since": _since(0),
                         "dag_id": ti.dag_id, "run_id": run_id, "task_id": ti.task_id, "error": error,
                         "runbook": getattr(ti, "log_url", None)})
    return findings


def send_alert(context: Context, message: str, **details: list[dict[str, Any]]) -> None:
    """Alert through every channel while the task goes on (a warning, not a failure): the notifiers
    among the task's failure callbacks (the DAG factory's, any Airflow notifier included); a task
    without any: the bundled two.
    An Airflow notifier of another provider finds the alert in its template context as
    ``kafka_eos_alert`` (``message``, ``details``, ``text``).

    :param message: one line: what happened and what it means.
    :param details: lists of dicts for the alert's ``stale`` / ``skipped`` / ``stalls``.
    """
    task = context.get("task")
    callbacks = getattr(task, "on_failure_callback", None) if task is not None else None
    if callable(callbacks):
        callbacks = [callbacks]
    # Notifiers only: a plain failure callback is for failures.
    callbacks = [c for c in callbacks or [] if isinstance(c, BaseNotifier)]
    if not callbacks:  # a task built without any: the bundled channels, as for every kafka-eos DAG
        callbacks = failure_notifiers()
    sent = {"message": message, "details": details}
    text = alert({**context, ALERT_KEY: sent})["text"]
    for notifier in callbacks:
        # A copy: a notifier renders its templates onto itself, and the task's own must stay
        # templates for a failure that may follow.
        copy.copy(notifier)({**context, ALERT_KEY: {**sent, "text": text}})


#: The notifiers a deadline alert goes to unless the DAG factory names others: the bundled two
#: (each sends only where its connection exists), as (class path, keyword arguments).
BUNDLED_NOTIFIERS = [{"classpath": "kafka_eos_airflow.notifications.alerts.KafkaEosWebhookNotifier"},
                     {"classpath": "kafka_eos_airflow.notifications.alerts.KafkaEosEmailNotifier"}]


def deadline_alert(context: dict[str, Any], pipeline: str, limit_s: float) -> dict[str, Any]:
    """The alert of a pipeline run that missed its deadline (the spec's freshness limit after it was
    queued), in the shape of :func:`alert`. ``context``: what Airflow gives a deadline's callback
    (``dag_run`` as the REST API shows it, ``deadline``)."""
    run = context.get("dag_run") or {}
    dag_id, run_id = run.get("dag_id"), run.get("dag_run_id")
    deadline = (context.get("deadline") or {}).get("deadline_time")
    error = (f"pipeline {pipeline}: run {run_id} has not finished {limit_s:g} s after it was queued (its "
             f"freshness limit): records wait longer than the limit")
    text = f"kafka-eos: {dag_id} missed its deadline (run {run_id}): {error}"
    from urllib.parse import quote

    finding = {"what": "deadline_missed", "pipeline": pipeline, "partition": None,
               "since": run.get("queued_at"), "deadline": str(deadline) if deadline else None, "limit_s": limit_s,
               "run_state": run.get("state"),
               "runbook": _ui(f"/dags/{dag_id}/runs/{quote(str(run_id), safe='')}") if dag_id else None}
    return {"text": text, "dag_id": dag_id, "run_id": run_id, "task_id": "(deadline)", "try_number": 0,
            "error": error, "stalls": [], "stale": [], "skipped": [], "findings": [finding], "log_url": None}


async def deadline_missed(*, pipeline: str, limit_s: float, notifiers: list[dict[str, Any]] | None = None,
                          context: dict[str, Any] | None = None) -> list[str]:
    """The callback of a pipeline DAG's ``DeadlineAlert`` (Airflow runs it in the triggerer): send
    :func:`deadline_alert` through ``notifiers`` — Airflow notifier classes of any provider with their
    keyword arguments (``{"classpath": ..., "kwargs": {...}}``; default :data:`BUNDLED_NOTIFIERS`),
    each with the alert as ``kafka_eos_alert`` in its template context. Returns the ones that sent."""
    import asyncio

    from airflow.sdk.module_loading import import_string

    context = dict(context or {})
    payload = deadline_alert(context, pipeline, limit_s)
    sent = []
    for entry in BUNDLED_NOTIFIERS if notifiers is None else notifiers:
        notifier = import_string(entry["classpath"])(**(entry.get("kwargs") or {}))
        try:
            # Notifiers and their hooks block: off the triggerer's event loop.
            await asyncio.to_thread(notifier, {**context, ALERT_KEY: payload})
            sent.append(entry["classpath"])
        except Exception as exc:  # noqa: BLE001 - one channel down must not silence the others
            log.error("kafka-eos deadline alert not sent by %s: %s", entry["classpath"], exc)
    return sent


class KafkaEosAlertRouter(BaseNotifier):
    """kafka-eos's alerts to Airflow notifiers of any provider (e.g. Slack's ``SlackNotifier``,
    the HTTP or SMTP provider's): each gets the task's context with the alert's payload as
    ``kafka_eos_alert`` — ``text`` (one paragraph), ``findings`` (:func:`alert_findings`: what, pipeline,
    partition, since, runbook link), ``stalls``/``stale``/``skipped`` and the task's facts
    (:func:`alert`) — for a failure and for an alert a task sends while it goes on
    (:func:`send_alert`). The DAG factory puts the team's notifiers behind one of these.

    :param notifiers: the Airflow notifiers to call, each with its own templates.
    :param runbook_dag_id: the abort runbook's DAG, which the payload links for each held partition.
    """

    template_fields = ()

    def __init__(self, notifiers: Sequence[Callable], runbook_dag_id: str = RUNBOOK_DAG_ID) -> None:
        super().__init__()
        self.notifiers = list(notifiers)
        self.runbook_dag_id = runbook_dag_id

    def notify(self, context: Context) -> None:
        sent = context.get(ALERT_KEY) or {}
        payload = alert(context, self.runbook_dag_id)
        routed = {**context, ALERT_KEY: {**payload, "message": sent.get("message", payload["error"]),
                                         "details": sent.get("details", {})}}
        for notifier in self.notifiers:
            try:
                # A copy: a notifier renders its templates onto itself, and they must stay
                # templates for the next alert.
                copy.copy(notifier)(routed)
            except Exception as exc:  # noqa: BLE001 - one channel down must not silence the others
                self.log.error("kafka-eos alert not sent by %s: %s", type(notifier).__name__, exc)


def connection_or_none(conn_id: str, log) -> Any | None:
    """The Airflow connection ``conn_id``, or None (logged) when it is not defined."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        log.info("kafka-eos: no Airflow connection %r: not sent", conn_id)
        return None


class KafkaEosWebhookNotifier(HttpNotifier):
    """POST the alert as JSON to the ``kafka_eos_alerts_webhook`` connection (Slack incoming
    webhooks read its ``text``)."""

    def __init__(self, *, http_conn_id: str = WEBHOOK_CONN_ID, endpoint: str | None = None,
                 runbook_dag_id: str = RUNBOOK_DAG_ID, **kwargs: Any) -> None:
        super().__init__(http_conn_id=http_conn_id, endpoint=endpoint,
                         headers={"Content-Type": "application/json"}, **kwargs)
        self.runbook_dag_id = runbook_dag_id

    def notify(self, context: Context) -> None:
        if connection_or_none(self.http_conn_id, self.log) is None:
            return
        # Set after template rendering: the payload is data, not a Jinja template.
        self.json = alert(context, self.runbook_dag_id)
        super().notify(context)


class KafkaEosEmailNotifier(SmtpNotifier):
    """Mail the alert through the ``kafka_eos_alerts_smtp`` connection, to its extra's ``to``."""

    def __init__(self, *, smtp_conn_id: str = SMTP_CONN_ID, runbook_dag_id: str = RUNBOOK_DAG_ID,
                 **kwargs: Any) -> None:
        super().__init__(to=[], smtp_conn_id=smtp_conn_id, **kwargs)
        self.runbook_dag_id = runbook_dag_id

    def notify(self, context: Context) -> None:
        conn = connection_or_none(self.smtp_conn_id, self.log)
        if conn is None:
            return
        extra = conn.extra_dejson
        self.to = [t.strip() for t in str(extra.get("to", "")).split(",") if t.strip()]
        if not self.to:
            self.log.warning("kafka-eos alert not sent: connection %r has no 'to' in its extra", self.smtp_conn_id)
            return
        self.from_email = extra.get("from_email") or self.from_email or "kafka-eos@localhost"
        a = alert(context, self.runbook_dag_id)
        self.subject = a["text"][:200]
        rows = "".join(
            f"<li><b>{html.escape(s['partition'])}</b>: LSO {s['lso']} &lt; HW {s['high_watermark']}, open "
            f"{s['open_for_s']} s, producer {s['producer_id']}, transactional.id "
            f"{html.escape(str(s['transactional_id']))} ({s['verdict']}). To abort it, trigger the DAG "
            f"<code>{html.escape(self.runbook_dag_id)}</code> with <code>{html.escape(json.dumps(s['runbook']['conf']))}</code> "
            f"(a dry run first), or run <code>{html.escape(s['abort'])}</code></li>" for s in a["stalls"])
        rows += "".join(
            f"<li><b>{html.escape(s['topic'])}-{s['partition']}</b> ({html.escape(s['pipeline'])}): the oldest "
            f"unprocessed committed record (offset {s['oldest_offset']}) is {s['age_s']:g} s old, limit "
            f"{s['limit_s']} s; checkpoint {s['checkpoint']}, LSO {s['lso']}, lag {s['lag']}. Check that the "
            "pipeline's DAG is unpaused and its runs succeed.</li>" for s in a["stale"])
        rows += "".join(
            f"<li><b>{html.escape(s['topic'])}-{s['partition']}</b>: offsets [{s['from']}, {s['until']}) were "
            "deleted by retention before they were read: they are skipped (on_data_loss: skip).</li>"
            for s in a["skipped"])
        self.html_content = (f"<p>{html.escape(a['text'])}</p><p>DAG {html.escape(a['dag_id'])}, run "
                             f"{html.escape(str(a['run_id']))}, task {html.escape(a['task_id'])}, try "
                             f"{a['try_number']}.</p>" + (f"<ul>{rows}</ul>" if rows else ""))
        super().notify(context)


def failure_notifiers(runbook_dag_id: str = RUNBOOK_DAG_ID) -> list:
    """What every kafka-eos DAG calls when a task fails: both channels (each sends only when its
    connection exists), naming the abort runbook ``runbook_dag_id``."""
    return [KafkaEosWebhookNotifier(runbook_dag_id=runbook_dag_id), KafkaEosEmailNotifier(runbook_dag_id=runbook_dag_id)]
