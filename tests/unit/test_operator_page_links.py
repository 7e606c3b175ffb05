"""The operator page's links under a base URL with a path prefix (``[api] base_url =
https://host/airflow``, or a proxy's root path): Starlette gives the mounted app its root path,
the links are paths under it, to the DAG id that exists (the factory's ``dag_id_prefix``)."""

from __future__ import annotations

import re
from urllib.parse import urljoin

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from kafka_eos_airflow.plugins.operator_page import URL_PREFIX, dag_of, render, root_of


def _entry(name: str, dag_id: str) -> dict:
    return {"pipeline": name, "dag_id": dag_id, "group_id": "g", "error": None, "lag": 1, "drift": [], "runs": [],
            "sink": {"kind": "kafka", "commit": "atomic", "target": "out", "dead_letters": None},
            "partitions": [{"topic": "in", "partition": 0, "checkpoint": 0, "lso": 1, "high_watermark": 2,
                            "log_start": 0, "lag": 1, "oldest_unprocessed": None}],
            "pinned": [{"topic": "in", "partition": 0, "lso": 1, "high_watermark": 2, "stuck_s": 60,
                        "culprit": {"producer_id": 7, "transactional_id": "t", "start_offset": 1, "verdict": "hung"}}]}


def test_the_root_path_of_a_mounted_app_under_a_prefix_and_without():
    for root in ("/airflow", ""):
        outer = FastAPI(root_path=root)
        inner = FastAPI()

        @inner.get("/")
        def where(request: Request) -> str:
            return root_of(request)

        outer.mount(URL_PREFIX, inner)
        with TestClient(outer, root_path=root) as client:
            assert client.get(f"{root}{URL_PREFIX}/").json() == f"{root}/"


def test_every_link_resolves_under_the_prefix_to_the_dag_that_exists():
    page = f"https://host/airflow{URL_PREFIX}/"
    snapshot = {"taken_at": 0, "seconds": 0.1, "bootstrap": "b:9092",
                "pipelines": [_entry("orders", "team_c__kafka_eos__orders")]}
    html = render(snapshot, "/airflow/")
    links = {urljoin(page, href) for href in re.findall(r'href="([^"]+)"', html)}
    assert links == {"https://host/airflow/dags/team_c__kafka_eos__orders",
                     "https://host/airflow/dags/team_c__kafka_eos_runbook_abort_transaction"}


def test_which_dag_a_pipeline_links_to():
    readable = {"kafka_eos__a", "team_c__kafka_eos__b", "kafka_eos_stream__c", "x", "my_kafka_eos__e",
                "payments__kafka_eos__f"}
    prefixes = ["", "team_c__"]
    assert dag_of("a", readable, prefixes) == "kafka_eos__a"
    assert dag_of("b", readable, prefixes) == "team_c__kafka_eos__b"
    assert dag_of("c", readable, prefixes) == "kafka_eos_stream__c"
    assert dag_of("d", readable, prefixes) is None  # no DAG of it this user may read
    # A DAG id that merely ends like one (another prefix, a DAG named so) shows nothing.
    assert dag_of("e", readable, prefixes) is None and dag_of("f", readable, prefixes) is None
    assert dag_of("f", readable, [*prefixes, "payments__"]) == "payments__kafka_eos__f"
