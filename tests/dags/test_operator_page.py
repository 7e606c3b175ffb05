"""The operator page in a real browser (headless Chromium) on a real Airflow API server with the
plugin: what it shows for a pipeline with lag and for one whose source a killed producer's open
transaction pins, checked against the broker's own offsets; its JSON API against
``kafka-eos checkpoint --json``; and an anonymous request refused."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.cli import main

pytestmark = pytest.mark.integration


def test_the_page_shows_lag_and_a_hung_transaction_and_its_api_matches_checkpoint_json(
        airflow_deployment, browser, kafka_settings, killed_transaction, unique, tmp_path, capsys, timeless):
    from selenium.webdriver.common.by import By

    airflow = airflow_deployment
    specs = airflow.dags_folder.parent / "specs"
    lagging, held = f"lag_{unique.replace('-', '_')}", f"held_{unique.replace('-', '_')}"
    topics = {"lag": f"{lagging}.in", "held": f"{held}.in", "out": f"{lagging}.out"}
    kafka_admin.create_topics(kafka_settings, {topics["lag"]: 2, topics["held"]: 1, topics["out"]: 1})
    producer = Producer(kafka_settings.client_config())
    for i in range(4):
        producer.produce(topics["lag"], value=f"waiting {i}".encode(), partition=1)
    producer.produce(topics["held"], value=b"committed")
    assert producer.flush(30) == 0
    txid = f"stranger-{unique}"
    killed_transaction(txid, (topics["held"], 0))
    producer.produce(topics["held"], value=b"behind the open transaction")
    assert producer.flush(30) == 0
    for name, source in ((lagging, topics["lag"]), (held, topics["held"])):
        (specs / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "source": {"topics": [source]}, "transform": "identity",
            "sink": {"kind": "kafka", "topic": topics["out"]}}))

    # The page serves a snapshot whose reads began at most page_cache_seconds before the request:
    # once that long has passed since the specs were written, whatever it serves read them.
    time.sleep(float(airflow.environ["AIRFLOW__KAFKA_EOS__PAGE_CACHE_SECONDS"]))

    # Anonymous: refused, page and API alike.
    for path in ("/kafka-eos/", "/kafka-eos/api/pipelines"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{airflow.url}{path}", timeout=30)
        assert refused.value.code in (401, 403), path

    # The JSON API has the numbers of `kafka-eos checkpoint --json`.
    for name in (lagging, held):
        entry = airflow.api("GET", f"/kafka-eos/api/pipelines/{name}")
        assert main(["--bootstrap", kafka_settings.bootstrap_servers, "checkpoint", str(specs / f"{name}.yaml"),
                     "--json"]) == 0
        expected = json.loads(capsys.readouterr().out)
        assert entry["error"] is None, entry["error"]
        assert timeless(entry["partitions"]) == timeless(expected["partitions"])
        assert timeless(entry["pinned"]) == timeless(expected["pinned"]) and entry["drift"] == expected["drift"]
    assert [e["pipeline"] for e in airflow.api("GET", "/kafka-eos/api/pipelines")["pipelines"]].count(held) == 1

    # The page, in the browser of a logged-in user.
    started = time.monotonic()
    browser.get(f"{airflow.url}/kafka-eos/")
    section = browser.find_element(By.ID, lagging)
    rendered_s = time.monotonic() - started
    offsets = kafka_admin.partition_offsets(kafka_settings, [(topics["lag"], 0), (topics["lag"], 1), (topics["held"], 0)])

    def cells(section, tp) -> list[str]:
        row = section.find_element(By.CSS_SELECTOR, f'tr[data-partition="{tp[0]}-{tp[1]}"]')
        return [td.text for td in row.find_elements(By.TAG_NAME, "td")]

    for p in (0, 1):
        o = offsets[(topics["lag"], p)]
        partition, checkpoint, lso, hw, lag, oldest = cells(section, (topics["lag"], p))
        assert (partition, checkpoint, lso, hw, lag) == (f"{topics['lag']}-{p}", "-", str(o.lso),
                                                         str(o.high_watermark), str(o.lso - o.log_start))
        assert (oldest == "-") == (p == 0)
    assert section.find_element(By.CLASS_NAME, "lag").text == "4"

    section = browser.find_element(By.ID, held)
    o = offsets[(topics["held"], 0)]
    assert (o.lso, o.high_watermark) == (1, 3)
    partition, checkpoint, lso, hw, lag, _oldest = cells(section, (topics["held"], 0))
    assert (lso, hw, lag) == ("1", "3", "1")
    row = section.find_element(By.CSS_SELECTOR, "table.pinned tr.bad")
    text = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert text[:3] == [f"{topics['held']}-0", "1", "3"]
    assert text[4] == txid and text[5] == "1" and int(text[3]) >= 0
    assert f"kafka-eos txn abort --topic {topics['held']} --partition 0 --start-offset 1" in text[8]
    link = row.find_element(By.LINK_TEXT, "runbook")
    assert link.get_attribute("href") == f"{airflow.url}/dags/kafka_eos_runbook_abort_transaction"
    browser.save_screenshot(str(tmp_path / "operator-page.png"))
    with capsys.disabled():
        print(f"\noperator page: {rendered_s:.2f}s to load and render; screenshot {tmp_path / 'operator-page.png'}")

    # Airflow's UI lists the page in its navigation and shows it under its own.
    plugins = airflow.api("GET", "/api/v2/plugins")["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "kafka_eos"]
    assert [v["href"] for v in ours["external_views"]] == ["/kafka-eos/"]
    browser.get(f"{airflow.url}/plugin/kafka-pipelines")
    assert browser.find_element(By.TAG_NAME, "iframe").get_attribute("src") == f"{airflow.url}/kafka-eos/"
    browser.save_screenshot(str(tmp_path / "operator-page-in-airflow.png"))


def test_a_broken_spec_gets_a_row_the_page_opens_no_database_and_the_cli_names_an_unreachable_one(
        kafka_settings, unique, tmp_path, monkeypatch, capsys):
    from kafka_eos.spec import parse_spec

    source = f"in-{unique}"
    kafka_admin.create_topics(kafka_settings, {source: 1, f"out-{unique}": 1})
    good = parse_spec({"name": f"good_{unique.replace('-', '_')}", "source": {"topics": [source]},
                       "sink": {"kind": "kafka", "topic": f"out-{unique}"}}, "good.yaml")
    specs_dir = tmp_path / "pipelines"
    specs_dir.mkdir()
    (specs_dir / "good.yaml").write_text(yaml.safe_dump({
        "name": good.name, "source": {"topics": [source]}, "transform": "identity",
        "sink": {"kind": "kafka", "topic": good.sink.topic}}))
    (specs_dir / "broken.yaml").write_text("name: broken\nsource: {topics: [x]}\nsink: {kind: kafka, colour: red}\n")
    # A SQL sink whose database refuses connections (nothing listens on port 1).
    kafka_admin.create_topics(kafka_settings, {f"{source}.sql": 1})
    (specs_dir / "nodb.yaml").write_text(yaml.safe_dump({
        "name": f"{good.name}_nodb", "source": {"topics": [f"{source}.sql"]}, "transform": "identity",
        "sink": {"kind": "sql", "table": "t", "url": "postgresql+psycopg2://u@127.0.0.1:1/db"}}))
    monkeypatch.setenv("KAFKA_EOS_PIPELINES_DIR", str(specs_dir))

    # The operator page's read: the plugin's loader and the snapshot.
    from kafka_eos_airflow.plugins import operator_page

    monkeypatch.setattr("kafka_eos_airflow.hooks.kafka.KafkaEosHook.get_checked_settings", lambda self: kafka_settings)
    monkeypatch.setattr(operator_page, "_cache", None)
    page = operator_page.overview()
    by_name = {e["pipeline"]: e for e in page["pipelines"]}
    assert set(by_name) == {good.name, f"{good.name}_nodb", "broken"}
    assert by_name[good.name]["error"] is None and by_name[good.name]["partitions"][0]["topic"] == source
    assert "sink.colour: unknown field" in by_name["broken"]["error"]
    # The page opens no sink's database (the API server holds no database credentials): the SQL
    # sink's checkpoints as its Kafka mirror has them.
    nodb = by_name[f"{good.name}_nodb"]
    assert nodb["error"] is None and nodb["checkpoints_from"] == "kafka mirror", nodb
    assert nodb["partitions"][0]["checkpoint"] is None and nodb["drift"] == []
    assert all("\n" not in e["error"] for e in page["pipelines"] if e["error"])
    html = operator_page.render(page)
    assert html.count('class="bad error"') == 1 and f'id="{good.name}"' in html
    assert "checkpoints as the Kafka mirror has them" in html

    # `kafka-eos pipelines`: every row, the failed ones with their error.
    capsys.readouterr()  # Airflow's log lines of the page's read
    assert main(["--bootstrap", kafka_settings.bootstrap_servers, "pipelines", "--json"]) == 0
    out = capsys.readouterr().out  # after Airflow's own log lines, when it logs to stdout
    printed, _end = json.JSONDecoder().raw_decode(out[out.rindex("{", 0, out.index('"pipelines"')):])
    rows = {r["name"]: r for r in printed["pipelines"]}
    assert "error" not in rows[good.name] and rows[good.name]["lag"] == 0
    assert "sink.colour: unknown field" in rows["broken"]["error"]
    assert rows[f"{good.name}_nodb"]["error"].startswith("OperationalError: ")


def test_every_route_of_the_page_refuses_an_anonymous_request(airflow_deployment):
    from fastapi.routing import APIRoute

    from kafka_eos_airflow.plugins.operator_page import URL_PREFIX, app

    routes = [r.path.replace("{name}", "anything") for r in app.routes]
    # What the app serves: the page and its API; FastAPI's schema and docs pages are not served.
    assert sorted(r.path for r in app.routes if isinstance(r, APIRoute)) == ["/", "/api/pipelines",
                                                                              "/api/pipelines/{name}"]
    assert len(routes) == 3, [r.path for r in app.routes]
    for path in [*routes, "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{airflow_deployment.url}{URL_PREFIX}{path}", timeout=30)
        # The app's routes: refused by Airflow's auth; the schema and docs: not there at all.
        assert refused.value.code in ((401, 403) if path in routes else (401, 403, 404)), path


def _page_as(airflow, user: str) -> str:
    req = urllib.request.Request(f"{airflow.url}/kafka-eos/", headers={"Authorization": f"Bearer {airflow.token(user)}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


def test_each_user_sees_only_the_pipelines_whose_dags_they_may_read_linked_to_the_dag_that_exists(
        airflow_deployment, kafka_settings, unique):
    """Per-DAG permissions of the deployment's auth manager (tests/dags/conftest.py PAGE_USERS):
    alice may read ``kafka_eos__page_a_*``, bob only ``team_c__*`` — a team's DAG file that builds
    pipeline b's DAG under ``dag_id_prefix="team_c__"``."""
    airflow = airflow_deployment
    specs = airflow.dags_folder.parent / "specs"
    u = unique.replace("-", "_")
    a, b = f"page_a_{u}", f"page_b_{u}"
    for name in (a, b):
        kafka_admin.create_topics(kafka_settings, {f"{name}.in": 1, f"{name}.out": 1})
        (specs / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "source": {"topics": [f"{name}.in"]}, "transform": "identity",
            "sink": {"kind": "kafka", "topic": f"{name}.out"}}))
    (airflow.dags_folder / f"team_c_{u}.py").write_text(
        "from kafka_eos.spec import load_spec\nfrom kafka_eos_airflow.dag_factory import build_dag\n\n"
        f"dag = build_dag(load_spec({str(specs / f'{b}.yaml')!r}, import_transform=False), dag_id_prefix='team_c__')\n")
    for dag_id in (f"kafka_eos__{a}", f"kafka_eos__{b}", f"team_c__kafka_eos__{b}"):
        airflow.wait_for_dag(dag_id, unpause=False)

    def seen(user: str) -> dict[str, str]:
        entries = airflow.api("GET", "/kafka-eos/api/pipelines", user=user)["pipelines"]
        return {e["pipeline"]: e["dag_id"] for e in entries if e["pipeline"] in (a, b)}

    assert seen("admin") == {a: f"kafka_eos__{a}", b: f"kafka_eos__{b}"}
    assert seen("alice") == {a: f"kafka_eos__{a}"}
    assert seen("bob") == {b: f"team_c__kafka_eos__{b}"}
    # Another team's pipeline is not there, as one that does not exist.
    for user, hidden in (("bob", a), ("alice", b)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            airflow.api("GET", f"/kafka-eos/api/pipelines/{hidden}", user=user)
        assert refused.value.code == 404, (user, hidden)
    assert airflow.api("GET", f"/kafka-eos/api/pipelines/{b}", user="bob")["dag_id"] == f"team_c__kafka_eos__{b}"
    # The page: bob's pipeline only, its link to the DAG id that exists (the factory's prefix).
    html = _page_as(airflow, "bob")
    assert f'id="{b}"' in html and f'id="{a}"' not in html
    assert f'href="/dags/team_c__kafka_eos__{b}"' in html
    html = _page_as(airflow, "alice")
    assert f'id="{a}"' in html and f'id="{b}"' not in html and f'href="/dags/kafka_eos__{a}"' in html
