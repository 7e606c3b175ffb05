"""The operator page, "Kafka pipelines": a FastAPI app that Airflow's API server mounts at
``/kafka-eos`` (registered by ``kafka_eos_airflow.plugins.plugin``, the provider's plugin), and its JSON API.

- ``GET /kafka-eos/`` — one HTML page, rendered here (no JavaScript, nothing fetched from outside):
  per pipeline its source partitions (checkpoint, LSO, HW, lag to the LSO, age of the oldest
  unprocessed committed record), sink, SQL/Kafka checkpoint drift, the partitions an open
  transaction pins with the transaction's holder and the runbook that aborts it, and the last runs
  from the run manifest with a chart of records in/out per run (inline SVG).
- ``GET /kafka-eos/api/pipelines`` and ``/kafka-eos/api/pipelines/{name}`` — the same numbers as
  JSON, the partitions as ``kafka-eos checkpoint --json`` prints them.

A plugin's app is not behind Airflow's authentication by itself: every route depends on Airflow's
own check (a valid token in the ``Authorization`` header, or the UI's session cookie; and the
auth manager's permission to see the website), and a user sees only the pipelines one of whose
DAGs the auth manager lets them read (``get_authorized_dag_ids``: any auth manager, per-DAG
permissions, teams), by their exact DAG ids under ``[kafka_eos] dag_id_prefixes``; another's
pipeline is a 404, as one that does not exist. Links are paths under the API server's own root
(``[api] base_url`` with a path prefix, or a proxy's root path), to the DAG ids that exist.

The page only reads Kafka: it never commits, aborts or produces, and it needs no sink's
credentials: a SQL sink's checkpoints are shown as its Kafka mirror has them (the API server
opens no database of a pipeline). It reads the cluster at most once per few seconds
(:class:`kafka_eos.overview.snapshot.CachedOverview`), for every user; what each sees is
filtered per request.
"""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_view

from kafka_eos.spec import load_spec, spec_paths
from kafka_eos_airflow import config
from kafka_eos_airflow.config import page_cache_seconds
from kafka_eos_airflow.hooks.kafka import KafkaEosHook

#: Where Airflow's API server mounts the app (the plugin registers it).
URL_PREFIX = "/kafka-eos"
#: The DAG that aborts a held partition's transaction (dags/kafka_eos_runbooks.py).
RUNBOOK_DAG_ID = "kafka_eos_runbook_abort_transaction"
#: A pipeline's DAG ids end with these and its name (the factory's ``dag_id_prefix`` before them).
PIPELINE_DAG, STREAM_DAG = "kafka_eos__", "kafka_eos_stream__"

app = FastAPI(title="kafka-eos: Kafka pipelines",
              description="Checkpoints, LSO, lag and stuck transactions of every kafka-eos pipeline (read only).",
              # FastAPI's own schema and docs routes would bypass the dependency below: none.
              openapi_url=None, docs_url=None, redoc_url=None,
              # Airflow's own authentication and authorization, on every route.
              dependencies=[Depends(requires_access_view(AccessView.WEBSITE))])

_cache = None


def _load():
    """The Kafka settings (``[kafka_eos] kafka_conn_id``) and the specs of ``[kafka_eos]
    pipelines_folder`` (:mod:`kafka_eos_airflow.config`)."""
    # The overview loads the Kafka clients: every Airflow component loads this plugin, only the
    # page's requests need them.
    from kafka_eos.overview.snapshot import one_line, unreadable_spec

    specs, unreadable = [], []
    for path in spec_paths(config.pipelines_folder()):
        try:
            specs.append(load_spec(str(path), import_transform=False))
        except Exception as exc:  # noqa: BLE001 - one bad spec hides no other: it gets a row with its error
            unreadable.append(unreadable_spec(path.stem, str(path), one_line(exc)))
    return KafkaEosHook().get_checked_settings(), specs, unreadable


def overview() -> dict:
    """The current snapshot (see :class:`~kafka_eos.overview.snapshot.CachedOverview`)."""
    global _cache
    if _cache is None:
        from kafka_eos.overview.snapshot import CachedOverview  # Kafka clients: see _load

        # mirror: the API server holds no SQL sink's credentials (see the module's docstring).
        _cache = CachedOverview(_load, page_cache_seconds(), mirror=True)
    return _cache.get()


def dag_of(name: str, readable: set[str], prefixes: list[str]) -> str | None:
    """The DAG id a link to pipeline ``name`` goes to: the first of its DAG ids —
    ``<prefix>kafka_eos__<name>``, then ``<prefix>kafka_eos_stream__<name>``, for each of
    ``[kafka_eos] dag_id_prefixes`` — that is among the ``readable`` ones; None: the user may not
    see this pipeline (no DAG of it readable, or none parsed yet)."""
    for kind in (PIPELINE_DAG, STREAM_DAG):
        for prefix in prefixes:
            if prefix + kind + name in readable:
                return prefix + kind + name
    return None


def dag_ids_of(name: str, prefixes: list[str]) -> list[str]:
    """Every DAG id pipeline ``name`` may have (:func:`dag_of`'s order)."""
    return [prefix + kind + name for kind in (PIPELINE_DAG, STREAM_DAG) for prefix in prefixes]


def _existing(dag_ids: set[str]) -> set[str]:
    """Which of ``dag_ids`` the metadata database holds (parsed DAGs)."""
    from sqlalchemy import select

    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return set(session.scalars(select(DagModel.dag_id).where(DagModel.dag_id.in_(dag_ids))))


def visible(snapshot: dict, user: Any) -> dict:
    """``snapshot`` with only the pipelines ``user`` may see, each with the DAG its links go to
    (``dag_id``). A pipeline none of whose DAGs is parsed yet (a new spec) is shown to a user the
    auth manager lets read its DAG id (no team is known for it yet)."""
    # The API server's app module imports the plugins (this one too): only a request asks for it.
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    prefixes = config.dag_id_prefixes()
    # Which DAGs exist before which the user may read: a DAG the dag-processor writes between the
    # two reads is then either not yet existing (shown as unparsed) or readable — never existing
    # but unreadable, which would hide a pipeline the user may see.
    existing = _existing({d for e in snapshot["pipelines"] for d in dag_ids_of(e["pipeline"], prefixes)})
    readable = manager.get_authorized_dag_ids(user=user, method="GET")
    shown = []
    for entry in snapshot["pipelines"]:
        dag_id = dag_of(entry["pipeline"], readable, prefixes)
        unparsed = PIPELINE_DAG + entry["pipeline"]
        if dag_id is None and not existing.intersection(dag_ids_of(entry["pipeline"], prefixes)) and \
                manager.is_authorized_dag(method="GET", user=user, details=DagDetails(id=unparsed)):
            dag_id = unparsed
        if dag_id is not None:
            shown.append({**entry, "dag_id": dag_id})
    return {**snapshot, "pipelines": shown}


def root_of(request: Request) -> str:
    """The API server's root path (``/`` or ``[api] base_url``'s path, e.g. ``/airflow/``): what
    Starlette gives this mounted app as its root path, less the mount."""
    return request.scope.get("root_path", "").removesuffix(URL_PREFIX).rstrip("/") + "/"


@app.get("/api/pipelines")
def pipelines(user: GetUserDep) -> dict[str, Any]:
    """Every pipeline the user may see: partitions, drift, pinned partitions, last runs."""
    return visible(overview(), user)


@app.get("/api/pipelines/{name}")
def pipeline(name: str, user: GetUserDep) -> dict[str, Any]:
    """One pipeline; 404 when no spec has that name or the user may not see it."""
    for entry in visible(overview(), user)["pipelines"]:
        if entry["pipeline"] == name:
            return entry
    raise HTTPException(status_code=404, detail=f"no pipeline {name!r}")


@app.get("/", response_class=HTMLResponse)
def page(request: Request, user: GetUserDep) -> str:
    return render(visible(overview(), user), root_of(request))


# -- the page ---------------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1a202c}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.15rem;margin:1.6rem 0 .3rem}
h3{font-size:.95rem;margin:.8rem 0 .2rem}
table{border-collapse:collapse;margin:.2rem 0 .6rem;font-size:.85rem}
th,td{border:1px solid #cbd5e0;padding:.2rem .5rem;text-align:right} th{background:#edf2f7}
td.l,th.l{text-align:left} .muted{color:#718096;font-size:.8rem}
.bad{background:#fed7d7} .warn{background:#fefcbf} .ok{color:#276749} code{font-size:.8rem}
section{border-top:2px solid #e2e8f0;margin-top:1rem}
"""


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _chart(runs: list[dict]) -> str:
    """Records in (grey) and out (blue) per run, oldest first, as inline SVG."""
    runs = [r for r in reversed(runs) if r.get("records_in") is not None]
    if not runs:
        return '<p class="muted">no committed run yet</p>'
    top = max(max(r["records_in"] or 0, r["records_out"] or 0) for r in runs) or 1
    bar, gap, height = 9, 8, 60
    parts = []
    for i, r in enumerate(runs):
        x = i * (2 * bar + gap)
        for j, (key, colour) in enumerate((("records_in", "#a0aec0"), ("records_out", "#3182ce"))):
            h = round(height * (r[key] or 0) / top)
            parts.append(f'<rect x="{x + j * bar}" y="{height - h}" width="{bar - 1}" height="{h}" fill="{colour}">'
                         f'<title>{_e(r["run_id"])}: {key.replace("_", " ")} {r[key]}</title></rect>')
    width = max(len(runs) * (2 * bar + gap), 260)  # room for the legend
    return (f'<svg class="chart" width="{width}" height="{height + 14}" role="img" '
            f'aria-label="records in and out per run">{"".join(parts)}'
            f'<text x="0" y="{height + 12}" font-size="10" fill="#718096">in (grey) / out (blue) per run, '
            f'max {top}</text></svg>')


def _partitions(entry: dict) -> str:
    pinned = {(s["topic"], s["partition"]) for s in entry["pinned"]}
    rows = []
    for r in entry["partitions"]:
        oldest = r["oldest_unprocessed"]
        cls = "bad" if (r["topic"], r["partition"]) in pinned else ("warn" if r["lag"] else "")
        rows.append(
            f'<tr class="{cls}" data-partition="{_e(r["topic"])}-{r["partition"]}">'
            f'<td class="l">{_e(r["topic"])}-{r["partition"]}</td><td>{_e(r["checkpoint"])}</td>'
            f'<td>{r["lso"]}</td><td>{r["high_watermark"]}</td><td>{r["lag"]}</td>'
            f'<td>{_age(oldest["age_s"]) if oldest else "-"}</td></tr>')
    return ('<table class="partitions"><tr><th class="l">partition</th><th>checkpoint</th><th>LSO</th><th>HW</th>'
            f'<th>lag</th><th>oldest unprocessed</th></tr>{"".join(rows)}</table>')


def _prefix(entry: dict) -> str:
    """The ``dag_id_prefix`` of the DAG the entry links to."""
    dag_id, name = entry.get("dag_id") or PIPELINE_DAG + entry["pipeline"], entry["pipeline"]
    for kind in (PIPELINE_DAG, STREAM_DAG):
        if dag_id.endswith(kind + name):
            return dag_id[:-len(kind + name)]
    return ""


def _pinned(entry: dict, root: str) -> str:
    if not entry["pinned"]:
        return ""
    rows = []
    for s in entry["pinned"]:
        c = s.get("culprit") or {}
        conf = {"topic": s["topic"], "partition": s["partition"], "start_offset": s["lso"]}
        rows.append(
            f'<tr class="bad"><td class="l">{_e(s["topic"])}-{s["partition"]}</td><td>{s["lso"]}</td>'
            f'<td>{s["high_watermark"]}</td><td>{_e(c.get("producer_id"))}</td>'
            f'<td class="l">{_e(c.get("transactional_id") or s.get("attribution_error"))}</td>'
            f'<td>{_e(c.get("start_offset", s["lso"]))}</td><td>{_age(s.get("stuck_s"))}</td>'
            f'<td class="l">{_e(c.get("verdict"))}</td>'
            f'<td class="l"><a href="{_e(root)}dags/{quote(_prefix(entry) + RUNBOOK_DAG_ID)}" target="_top">runbook</a> '
            f'<code>{_e(json.dumps(conf))}</code><br><code>kafka-eos txn abort --topic {_e(s["topic"])} '
            f'--partition {s["partition"]} --start-offset {s["lso"]}</code></td></tr>')
    return ('<h3>Pinned by an open transaction</h3><table class="pinned"><tr><th class="l">partition</th>'
            '<th>LSO</th><th>HW</th><th>producer id</th><th class="l">transactional.id</th><th>start offset</th>'
            f'<th>age</th><th class="l">verdict</th><th class="l">abort</th></tr>{"".join(rows)}</table>')


def _runs(entry: dict) -> str:
    if not entry["runs"]:
        return '<p class="muted">no runs in the manifest</p>'
    rows = []
    for r in entry["runs"]:
        ranges = ", ".join(f'{x["topic"]}-{x["partition"]} [{x["from"]}, {x["until"]})' for x in r["ranges"])
        rows.append(f'<tr><td class="l">{_e(r["run_id"])}</td><td class="l">{_e(r["status"])}</td>'
                    f'<td class="l">{_e(r["at"])}</td><td>{_e(r["records_in"])}</td><td>{_e(r["records_out"])}</td>'
                    f'<td>{_e(r["dead_letters"])}</td><td class="l">{_e(ranges or "-")}</td></tr>')
    return ('<table class="runs"><tr><th class="l">run</th><th class="l">status</th><th class="l">at</th><th>in</th>'
            f'<th>out</th><th>dead letters</th><th class="l">plan</th></tr>{"".join(rows)}</table>')


def _pipeline(entry: dict, root: str) -> str:
    name, sink = entry["pipeline"], entry["sink"]
    dag_id = entry.get("dag_id") or PIPELINE_DAG + name
    mirror = (' · checkpoints as the Kafka mirror has them' if entry.get("checkpoints_from") == "kafka mirror"
              else "")
    head = (f'<section id="{_e(name)}"><h2>{_e(name)} '
            f'<a class="muted" href="{_e(root)}dags/{quote(dag_id)}" target="_top">DAG</a></h2>'
            f'<p class="muted">group <code>{_e(entry["group_id"])}</code> · sink {_e(sink["kind"])} '
            f'<code>{_e(sink["target"])}</code> ({_e(sink["commit"])}), dead letters <code>{_e(sink["dead_letters"])}'
            f'</code> · lag <b class="lag">{entry["lag"]}</b> · pinned <b class="pinned-count">{len(entry["pinned"])}</b>'
            f'{mirror}</p>')
    if entry["error"]:
        return f'{head}<p class="bad error">{_e(entry["error"])}</p></section>'
    drift = "".join(f'<p class="warn">drift {_e(d["topic"])}-{d["partition"]}: SQL sink at {_e(d["sink"])}, '
                    f'Kafka mirror at {_e(d["kafka"])} (the next run repairs it)</p>' for d in entry["drift"])
    held = entry.get("held")
    if held:
        head += (f'<p class="bad held">HELD since {_e(held["found_at"])}: {_e(held["mismatch"])}. Nothing of this '
                 f'pipeline runs until an operator repairs the range and acknowledges it: <code>kafka-eos acknowledge '
                 f'{_e(name)} --yes</code></p>')
    return (f'{head}{_partitions(entry)}{_pinned(entry, root)}{drift}<h3>Last runs</h3>{_chart(entry["runs"])}'
            f'{_runs(entry)}</section>')


def render(snapshot: dict, root: str = "/") -> str:
    """The page of one snapshot; its links under ``root``, the API server's root path."""
    from datetime import datetime, timezone

    taken = datetime.fromtimestamp(snapshot["taken_at"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    pipelines = snapshot["pipelines"]
    # Links open in the whole window: the UI shows this page in a frame under its navigation.
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>Kafka pipelines</title>'
        f'<meta http-equiv="refresh" content="30"><style>{_STYLE}</style></head><body>'
        f'<h1>Kafka pipelines</h1><p class="muted">{len(pipelines)} pipeline(s) on <code>{_e(snapshot["bootstrap"])}'
        f'</code>, read at {taken} in {snapshot["seconds"]:.2f}s. Lag counts the offsets a read_committed pipeline '
        'can read now (checkpoint to LSO), not to the high watermark; a partition whose LSO is below its HW is held '
        'by an open transaction. Read only: nothing here commits, aborts or produces.</p>'
        + "".join(_pipeline(e, root) for e in pipelines) + "</body></html>")
