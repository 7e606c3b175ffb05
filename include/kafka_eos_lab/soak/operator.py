"""The person on call, through Airflow's REST API only: an alert that names a pinned partition gets
the runbook's dry run, then (the dry run having shown the transaction) the abort, approved in
Airflow's Human-in-the-loop step when it asks; a pipeline or stream task that failed for good is
cleared, so it runs again."""

from __future__ import annotations

import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from kafka_eos_lab.soak.world import RUNBOOK_DAG, STREAM_DAG, World, pipeline_dag

#: How often the operator looks at the alerts and the failed runs.
LOOK_EVERY_S = 10.0
#: A runbook run is one short task; the scheduler may be down for a restart meanwhile.
RUN_TIMEOUT_S = 300.0
#: A run cleared this often and failed again is left for a person with more time (and reported).
MAX_CLEARS = 3
#: The runbook is run at most this often for one held partition (each time an alert names it).
MAX_ATTEMPTS = 3


@dataclass
class Action:
    kind: str  # "abort" | "clear"
    target: str
    began: float
    ended: float | None = None
    outcome: str = ""
    details: dict = field(default_factory=dict)


def confirmation(topic: str, partition: int, start_offset: int) -> str:
    """What the runbook's form asks to be typed for a real abort (the runbook's own wording)."""
    return f"ABORT {topic}-{partition}@{start_offset}"


class Operator(threading.Thread):
    def __init__(self, world: World, say=print) -> None:
        super().__init__(name="soak operator", daemon=True)
        self.world, self.say = world, say
        self.actions: list[Action] = []
        self._seen_alerts = 0
        #: Held partitions (topic, partition, LSO) the runbook was run for: its last outcome, and how often.
        self._outcomes: dict[tuple[str, int, int], str] = {}
        self._attempts: dict[tuple[str, int, int], int] = {}
        self._clears: dict[tuple[str, str], int] = {}
        #: A cleared run's end when it was cleared: it is cleared again only after a later failure.
        self._cleared_at: dict[tuple[str, str], str] = {}
        self._halt = threading.Event()
        self.errors: list[str] = []

    def stop(self, timeout_s: float = 2 * RUN_TIMEOUT_S) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        while not self._halt.wait(LOOK_EVERY_S):
            try:
                self.look()
            except Exception as exc:  # noqa: BLE001 - Airflow restarting; look again
                self.errors.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}")

    def look(self) -> None:
        alerts = self.world.inbox.alerts
        new, self._seen_alerts = alerts[self._seen_alerts:], len(alerts)
        for _at, body in new:
            for stall in body.get("stalls") or ():
                conf = stall["runbook"]["conf"]
                key = (conf["topic"], int(conf["partition"]), int(conf["start_offset"]))
                # Once per held partition; again at a later alert if the runbook did not end it.
                if self._outcomes.get(key) != "abort success" and self._attempts.get(key, 0) < MAX_ATTEMPTS:
                    self._attempts[key] = self._attempts.get(key, 0) + 1
                    self._outcomes[key] = self.abort(*key).outcome
        self.clear_failed()

    # --- the runbook -------------------------------------------------------------------------------

    def abort(self, topic: str, partition: int, start_offset: int) -> Action:
        """The runbook as its alert and its answers lead a person: the dry run; refused (the
        watchdog alerts at its threshold, the abort's guard waits for the brokers' longest
        transaction timeout, 15 minutes), the dry run again with ``force`` — the alert names a
        producer of no pipeline pinning the partition; then the approved abort, forced and confirmed."""
        action = Action("abort", f"{topic}-{partition}@{start_offset}", time.time())
        self.actions.append(action)
        conf = {"topic": topic, "partition": partition, "start_offset": start_offset}
        # A dry run ends at ``inspect`` (the approval and the abort are skipped): its finding is inspect's.
        dry_state, found = self.trigger(RUNBOOK_DAG, {**conf, "dry_run": True}, xcom_of="inspect")
        action.details["dry_run"] = {"state": dry_state, "found": found}
        force = False
        if dry_state != "success":
            force = True
            dry_state, found = self.trigger(RUNBOOK_DAG, {**conf, "dry_run": True, "force": True},
                                            xcom_of="inspect")
            action.details["forced_dry_run"] = {"state": dry_state, "found": found}
        if dry_state != "success":
            action.outcome, action.ended = f"dry run {dry_state}", time.time()
            return action
        state, result = self.trigger(RUNBOOK_DAG, {**conf, "dry_run": False, "force": force,
                                                   "confirm": confirmation(topic, partition, start_offset)},
                                     xcom_of="abort_transaction", approve=True)
        action.details["abort"] = {"state": state, "result": result, "forced": force,
                                   "approval_asked": bool(found and found.get("needs_approval"))}
        action.outcome, action.ended = f"abort {state}", time.time()
        self.say(f"operator: {action.target}: dry run {dry_state}{' (forced)' if force else ''}, abort {state}")
        return action

    def trigger(self, dag_id: str, conf: dict, xcom_of: str | None = None,
                approve: bool = False) -> tuple[str, object]:
        """Trigger ``dag_id`` with ``conf`` and wait for its end: ``(state, the task's return value)``.
        With ``approve``, the run's ``approve`` step is answered "Approve" when it waits for a person."""
        airflow = self.world.airflow
        run = airflow.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
        run_id = urllib.parse.quote(run["dag_run_id"], safe="")
        deadline = time.time() + RUN_TIMEOUT_S
        state = run["state"]
        while state not in ("success", "failed") and time.time() < deadline:
            time.sleep(3)
            try:
                state = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
                if approve and state == "running" and self._approve(dag_id, run_id):
                    approve = False  # answered once
            except OSError:
                continue  # the api-server busy or restarting
        value = None
        if xcom_of and state == "success":
            value = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{xcom_of}"
                                       "/xcomEntries/return_value")["value"]
        return state, value

    def _approve(self, dag_id: str, run_id: str) -> bool:
        """Answer the run's approval request (Airflow's Human-in-the-loop step) as the person on call:
        True once answered; False while the step does not wait for an answer (yet, or at all)."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve"
        if self.world.airflow.api("GET", path)["state"] not in ("awaiting_input", "deferred"):
            return False
        # Deferred but its request not written yet: a 404 (an OSError), and the caller asks again.
        self.world.airflow.api("PATCH", f"{path}/-1/hitlDetails", {"chosen_options": ["Approve"]})
        self.say(f"operator: approved {dag_id} {urllib.parse.unquote(run_id)}")
        return True

    # --- failed runs ---------------------------------------------------------------------------------

    def clear_failed(self) -> None:
        """Clear the failed tasks of every failed pipeline or stream run (its retries spent)."""
        airflow = self.world.airflow
        watched = {pipeline_dag(n) for n in self.world.pipelines} | {STREAM_DAG}
        runs = airflow.api("GET", "/api/v2/dags/~/dagRuns?state=failed&limit=100&order_by=-end_date")["dag_runs"]
        for run in runs:
            key = (run["dag_id"], run["dag_run_id"])
            if run["dag_id"] not in watched or self._clears.get(key, 0) >= MAX_CLEARS:
                continue
            if key in self._cleared_at and (run.get("end_date") or "") <= self._cleared_at[key]:
                continue  # cleared, and not failed again since
            self._clears[key] = self._clears.get(key, 0) + 1
            airflow.api("POST", f"/api/v2/dags/{run['dag_id']}/clearTaskInstances",
                        {"dag_run_id": run["dag_run_id"], "only_failed": True, "dry_run": False,
                         "reset_dag_runs": True})
            self._cleared_at[key] = run.get("end_date") or ""
            self.actions.append(Action("clear", f"{run['dag_id']} {run['dag_run_id']}", time.time(),
                                       time.time(), f"cleared ({self._clears[key]})"))
            self.say(f"operator: cleared {run['dag_id']} {run['dag_run_id']}")
