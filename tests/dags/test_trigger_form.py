"""The trigger form of a pipeline DAG in a real browser (headless Chromium) against a real
Airflow deployment: its sections and titled fields are there, the defaults can be triggered, and
a dry run triggered from the form runs as one."""

from __future__ import annotations

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from waiting import wait_until

pytestmark = pytest.mark.integration

#: Section -> the field titles it holds (plugins/kafka_eos_airflow/params.py).
FORM = {
    "This run": ["Max records per partition", "Dry run"],
    "Replay a past range": ["Replay from", "Replay until", "Reprocess"],
    "Reset the checkpoint": ["Reset the checkpoint to", "Confirm the reset"],
}


def _text(driver, text: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']")


def _open_section(driver, section: str, titles: list[str]) -> None:
    """Open one of the dialog's collapsible sections and wait until every field title in it is shown.

    A section expands with an animation: its fields are in the page (so an implicit wait finds them)
    before they are displayed, and a click that lands while the dialog itself is still animating can
    be lost, or close a section that was open. So: scroll the header into view, click it, and wait on
    the fields being displayed; if they are not within a few seconds, click once more and wait again.
    """
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(d) -> bool:
        return all(_text(d, title).is_displayed() for title in titles)

    header = _text(driver, section)
    for attempt in (1, 2):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", header)
        header.click()
        try:
            WebDriverWait(driver, 10, poll_frequency=0.2).until(shown)
            return
        except TimeoutException:
            if attempt == 2:
                hidden = [t for t in titles if not _text(driver, t).is_displayed()]
                raise AssertionError(f"the section {section!r} did not show {hidden} after two clicks") from None


def test_the_trigger_form_shows_every_param_and_triggers_a_dry_run(airflow_deployment, browser, kafka_settings,
                                                                    unique, tmp_path):
    from selenium.webdriver.common.by import By

    airflow = airflow_deployment
    name = f"form_{unique.replace('-', '_')}"
    topics = {t: f"{name}.{t}" for t in ("orders", "out", "backfill")}
    kafka_admin.create_topics(kafka_settings, {t: 1 for t in topics.values()})
    producer = Producer(kafka_settings.client_config())
    for i in range(3):
        producer.produce(topics["orders"], value=f"order {i}".encode())
    assert producer.flush(30) == 0
    (airflow.dags_folder.parent / "specs" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "source": {"topics": [topics["orders"]]},
        "sink": {"kind": "kafka", "topic": topics["out"], "backfill_topic": topics["backfill"]}}))
    dag_id = f"kafka_eos__{name}"
    airflow.wait_for_dag(dag_id, unpause=False)

    browser.get(f"{airflow.url}/dags/{dag_id}")
    browser.find_element(By.XPATH, "//button[normalize-space()='Trigger']").click()
    for section, titles in FORM.items():  # the dialog's sections: each opens on a click
        _open_section(browser, section, titles)
        browser.save_screenshot(str(tmp_path / f"trigger-form-{section.replace(' ', '-').lower()}.png"))
    (trigger,) = [b for b in browser.find_elements(By.XPATH, "//button[normalize-space()='Trigger']")
                  if b.is_displayed() and b.find_elements(By.XPATH, "./ancestor::*[@role='dialog']")]
    assert trigger.is_enabled()  # the defaults are a valid run: no field blocks it

    _open_section(browser, "This run", FORM["This run"])
    dry_run = _text(browser, "Dry run").find_element(
        By.XPATH, "./ancestor::*[.//input[@type='checkbox']][1]//input[@type='checkbox']")
    browser.execute_script("arguments[0].click();", dry_run)
    trigger.click()
    def finished():
        runs = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"]
        return runs if runs and runs[0]["state"] in ("success", "failed") else None

    (run,) = wait_until("the run triggered from the form to finish", finished, 300, every_s=1.0)
    assert run["conf"]["dry_run"] is True and run["state"] == "success"
    tis = airflow.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances")["task_instances"]
    assert {t["task_id"]: t["state"] for t in tis} == {"plan": "success", "spark": "skipped", "verify": "skipped"}
    note = airflow.run_note(dag_id, run["dag_run_id"])
    assert note == f"DRY RUN: would read {topics['orders']}-0 [0, 3). Nothing was stored, read, written or committed."
    browser.save_screenshot(str(tmp_path / "trigger-form-after.png"))
