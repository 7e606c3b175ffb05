"""docs/first-pipeline.md, followed literally: its ``bash`` blocks run in order, in an empty folder
outside the repository, with the wheel built from this checkout installed into a fresh virtualenv at
the tested pins (requirements.txt as constraints), against the session's broker. Then what the guide promises is checked: the
pipeline's output holds every valid record once and the bad one as a dead letter, the checkpoint
is at the source's end, and the guide's Airflow, still running before its last block stops it,
shows the provider, its plugin and the DAGs through the REST API its UI reads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from kafka_eos import kafka_admin
from kafka_eos.local.airflow import LocalAirflow
from kafka_eos.readers import read_committed
from kafka_eos_lab import faults
from waiting import wait_until
from wheel_build import build_wheel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "first-pipeline.md"
#: What the guide creates on the cluster (removed first: the names are the guide's, not the test's).
TOPICS = ["clicks.in", "clicks.out", "clicks.dlq", "clicks.backfill", "kafka-eos.manifest.clicks"]
GROUP = "kafka-eos.clicks"
#: The guide's blocks take 3-5 minutes (a fresh virtualenv, a DAG run under a scheduler).
GUIDE_TIMEOUT_S = 2400
#: What the guide's shell prints before its last block, to wait there.
PAUSE = "== paused before the last block"


def guide_blocks() -> list[str]:
    """The guide's ``bash`` blocks, in order."""
    blocks = re.findall(r"^```bash\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    assert blocks, f"{GUIDE}: no bash blocks"
    return blocks


def _clean_environ(home: Path, bootstrap: str, port: int) -> dict[str, str]:
    """A new user's shell: the system PATH (not this checkout's virtualenv), no Airflow settings."""
    venv = str(ROOT / ".venv")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(venv))
    keep = {k: v for k, v in os.environ.items()
            if k in ("HOME", "LANG", "LC_ALL", "JAVA_HOME", "TMPDIR", "SPARK_SUBMIT_OPTS") or k.startswith("PIP_")}
    return {**keep, "PATH": path, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "KAFKA_EOS_HOME": str(home),
            "KAFKA_EOS_AIRFLOW_PORT": str(port), "SPARK_LOCAL_IP": "127.0.0.1"}


def _forget_the_guides_pipeline(settings) -> None:
    admin = kafka_admin.admin_client(settings)
    existing = [t for t in TOPICS if t in admin.list_topics(timeout=30).topics]
    if existing:
        for fut in admin.delete_topics(existing).values():
            fut.result(30)
    groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    if GROUP in groups:
        for fut in admin.delete_consumer_groups([GROUP]).values():
            fut.result(30)


# The guide's own bound, not the suite's 15 minutes: on a slow hour its fresh virtualenv and its
# Airflow took 14 minutes under a loaded session's start.
@pytest.mark.timeout(GUIDE_TIMEOUT_S)
def test_the_first_pipeline_guide_runs_as_written(tmp_path_factory, kafka_settings, free_ports):
    work = tmp_path_factory.mktemp("first-pipeline")
    project, state = work / "project", work / "state"
    project.mkdir()
    wheel = build_wheel(work)
    packages = {name.rsplit("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    assert {"kafka_eos", "kafka_eos/local", "kafka_eos/health", "kafka_eos/stream", "kafka_eos/backfill",
            "kafka_eos/overview", "kafka_eos/sinks", "kafka_eos_airflow", "spark_apps", "spark_apps/transforms"} <= packages
    # The lab is the repository's, not the runtime's: no benchmark, fault matrix, soak or fault probe.
    assert not [p for p in packages if p.split("/")[0] == "kafka_eos_lab" or p.split("/")[-1] in ("bench", "chaos", "soak")]
    with zipfile.ZipFile(wheel) as whl:
        texts = {n: whl.read(n).decode() for n in whl.namelist() if n.endswith(".py")}
    assert not [n for n, text in texts.items() if any(setting in text for setting in faults.SETTINGS)]
    assert "kafka_eos/probes.py" in texts  # the points, which do nothing without a probe
    # The Spark Connect server plugin is always inside (make test builds it first, as make wheel does).
    assert "kafka_eos/jars/kafka-eos-connect.jar" in zipfile.ZipFile(wheel).namelist()
    # The connection resolvers (a SQL sink's database, an Iceberg sink's catalog), found by the
    # library through this entry point.
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in zipfile.ZipFile(wheel).namelist()
                                                    if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[kafka_eos.connections]\niceberg = kafka_eos_airflow.hooks.iceberg:catalog_url_of\n" \
           "sql = kafka_eos_airflow.hooks.sql:database_url_of" in entry_points
    shutil.copy(wheel, project)
    shutil.copy(ROOT / "requirements.txt", project)
    _forget_the_guides_pipeline(kafka_settings)
    env = _clean_environ(state, kafka_settings.bootstrap_servers, free_ports(1))

    *blocks, last = guide_blocks()
    assert last.strip() == "kafka-eos airflow stop", last
    # One shell runs every block in order; before the last (which stops the guide's Airflow) it
    # waits on its stdin while the test looks at what the UI shows.
    out_file, err_file = work / "guide.out", work / "guide.err"
    with open(out_file, "w") as out, open(err_file, "w") as err:
        script = "\n".join([*blocks, f"echo '{PAUSE}'", "read -r _", last])
        shell = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env,
                                 stdin=subprocess.PIPE, stdout=out, stderr=err, text=True)
    try:
        def paused():
            if shell.poll() is not None:
                raise AssertionError(f"exit {shell.returncode}\n{out_file.read_text()[-4000:]}\n{err_file.read_text()[-4000:]}")
            return PAUSE in out_file.read_text()

        wait_until("the guide's blocks before the last", paused, GUIDE_TIMEOUT_S, every_s=1.0)
        # What the guide's Airflow UI shows (its pages read the same REST API): the provider, its
        # plugin, and the DAGs of ./pipelines made by the installed wheel.
        ui = LocalAirflow(state / "airflow", int(env["KAFKA_EOS_AIRFLOW_PORT"]), state / "airflow" / "dags")
        assert "kafka-eos" in {p["package_name"] for p in ui.api("GET", "/api/v2/providers?limit=1000")["providers"]}
        assert "kafka_eos" in {p["name"] for p in ui.api("GET", "/api/v2/plugins?limit=1000")["plugins"]}
        dags = {d["dag_id"] for d in ui.api("GET", "/api/v2/dags?limit=1000")["dags"]}
        assert {"kafka_eos__clicks", "kafka_eos_stream__clicks", "kafka_eos_watchdog",
                "kafka_eos_runbook_abort_transaction"} <= dags, dags
        shell.communicate("\n", timeout=120)  # the last block: airflow stop
    finally:
        if shell.poll() is None:
            shell.kill()
        if (project / "venv" / "bin" / "kafka-eos").exists():
            subprocess.run([str(project / "venv" / "bin" / "kafka-eos"), "airflow", "stop"], cwd=project, env=env,
                           capture_output=True, timeout=120)
    stdout = out_file.read_text()
    assert shell.returncode == 0, f"exit {shell.returncode}\n{stdout[-4000:]}\n{err_file.read_text()[-4000:]}"
    assert stdout.rstrip().endswith(f"{PAUSE}\nstopped"), stdout[-1000:]
    print(stdout)

    # The guide's run: committed once, through the scheduler (by the triggered run, or by the
    # scheduled one the unpausing started at the same moment: `trigger` prints both notes).
    assert re.search(r"kafka_eos__clicks: run \S+ success: plan success, spark success, verify success", stdout), \
        stdout[-3000:]
    assert len(re.findall(r"committed: 21 in, 20 out, 1 dead-lettered in ", stdout)) == 1, stdout[-3000:]
    out = Counter(json.loads(m.value)["id"] for m in read_committed(kafka_settings, "clicks.out"))
    assert out == Counter(f"c{i}" for i in range(20))
    assert [m.value for m in read_committed(kafka_settings, "clicks.dlq")] == [b"not json"]
    tps = [("clicks.in", p) for p in range(3)]
    lso = kafka_admin.partition_offsets(kafka_settings, tps)
    assert kafka_admin.committed_offsets(kafka_settings, GROUP, tps) == {tp: lso[tp].lso for tp in tps}

