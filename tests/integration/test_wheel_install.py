"""The wheel in an estate that already runs Airflow: a fresh virtualenv holding only Apache Airflow
(the tested version), then ``pip install kafka_eos-*.whl`` with no requirements or constraints file,
so pip's resolver takes what the wheel declares. Then, as the adopter would: the provider imports
and Airflow lists it, ``airflow config list`` shows the ``[kafka_eos]`` section, a DAG file of the
user's own over a folder made by ``kafka-eos new`` parses, and that pipeline's DAG runs end to end
(``airflow dags test``, spark-submit included) on the session's broker, exactly once.

(The same wheel with the constraints file, requirements.txt, is installed by the first-pipeline
guide's test.)

``make compat-floors`` runs it at the other end of the ranges: with ``KAFKA_EOS_WHEEL_AT=floors``,
every requirement the wheel declares (and its ``spark`` extra) is held at its lowest declared
version (``name>=X`` installs ``name==X``), Airflow included, and the same run must pass.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from kafka_eos import kafka_admin
from kafka_eos.paths import jars_dir
from kafka_eos.readers import read_committed
from wheel_build import ROOT, build_wheel

pytestmark = pytest.mark.integration


def _tested_airflow() -> str:
    """The Airflow version the pins hold (requirements.txt)."""
    (version,) = re.findall(r"^apache-airflow==(\S+)$", (ROOT / "requirements.txt").read_text(), flags=re.M)
    return version


def _run(command: list[str], env: dict, cwd: Path, timeout: int = 600) -> str:
    """The command's stdout and stderr, one after the other; it must exit 0."""
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


#: ``floors``: install every declared requirement at its lowest declared version.
AT_ENV = "KAFKA_EOS_WHEEL_AT"


def floor_pins() -> dict[str, str]:
    """``{distribution: version}``: the lowest version each requirement of pyproject.toml's
    ``dependencies`` and ``spark`` extra declares (``>=X`` or ``==X``)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in [*project["dependencies"], *project["optional-dependencies"]["spark"]]:
        req = Requirement(line)
        (low,) = [s.version for s in req.specifier if s.operator in (">=", "==")]
        pins[req.name.lower()] = low
    return pins


def _constraints(work: Path) -> list[str]:
    """pip's arguments that hold the install at the floors (none unless ``KAFKA_EOS_WHEEL_AT=floors``)."""
    if os.environ.get(AT_ENV) != "floors":
        return []
    path = work / "floors.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in floor_pins().items()))
    return ["-c", str(path)]


def _unconstrained() -> dict:
    """This environment without pip's constraint and requirement settings: pip's resolver alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PIP_CONSTRAINT", "PIP_REQUIRE"))}


#: pip's settings of where and how long to fetch, as uv names them (uv reads no pip setting).
_PIP_TO_UV = {"PIP_INDEX_URL": "UV_DEFAULT_INDEX", "PIP_EXTRA_INDEX_URL": "UV_INDEX",
              "PIP_FIND_LINKS": "UV_FIND_LINKS", "PIP_DEFAULT_TIMEOUT": "UV_HTTP_TIMEOUT"}


def _uv_environ() -> dict:
    """The environment for ``uv pip install`` fetching as pip would here: pip's index, extra
    indexes, find-links and timeout under uv's names, and none of uv's own settings (with
    ``--no-config``, no uv.toml either)."""
    env = {k: v for k, v in _unconstrained().items() if not k.startswith("UV_")}
    env.update({uv: env[pip] for pip, uv in _PIP_TO_UV.items() if env.get(pip)})
    return env


@pytest.fixture(scope="module")
def airflow_only(tmp_path_factory):
    """A virtualenv with Apache Airflow only, then the wheel without extras, as on the Airflow
    components that run no Spark task: (venv bin folder, work folder, the wheel).

    The estate's Airflow is installed with uv (about 2 s against pip's 31 s on 2 cores; on
    2026-11-29 the same 162 distributions as pip's); the wheel goes in with pip, as the adopter's
    would."""
    work = tmp_path_factory.mktemp("wheel-install")
    wheel = build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _unconstrained()
    floors = _constraints(work)
    airflow = floor_pins()["apache-airflow"] if floors else _tested_airflow()
    uv = [str(Path(sys.executable).parent / "uv"), "pip", "install", "-q", "--no-config",
          "--python", str(venv / "bin" / "python")]
    _run([*uv, *floors, f"apache-airflow=={airflow}"], _uv_environ(), work, timeout=900)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    _run([*pip, *floors, str(wheel)], env, work, timeout=900)
    return venv / "bin", work, wheel


def test_the_wheel_runs_a_pipeline_in_an_airflow_only_environment(airflow_only, kafka_settings):
    bin_dir, work, wheel = airflow_only
    project, home = work / "project", work / "airflow"
    project.mkdir()
    (work / "dags").mkdir()
    name = f"wheel_{uuid.uuid4().hex[:8]}"
    venv_path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(ROOT)))
    env = {k: v for k, v in os.environ.items()
           if k in ("HOME", "LANG", "LC_ALL", "JAVA_HOME", "TMPDIR", "SPARK_SUBMIT_OPTS")}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{venv_path}", "SPARK_LOCAL_IP": "127.0.0.1",
        "KAFKA_EOS_HOME": str(work / "state"), "KAFKA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # The adopter's configuration: kafka-eos's section, its connections.
        "AIRFLOW__KAFKA_EOS__PIPELINES_FOLDER": str(project / "pipelines"),
        "AIRFLOW_CONN_KAFKA_EOS_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": kafka_settings.bootstrap_servers}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        # The estate's folder of Spark's Kafka connector jars (its image's): nothing is downloaded
        # at run time.
        "KAFKA_EOS_SPARK_JARS": str(jars_dir("spark")),
    })

    _run([str(bin_dir / "python"), "-c", "import kafka_eos_airflow.notifications.alerts, kafka_eos_airflow.dag_factory, "
          "kafka_eos_airflow.plugins.operator_page, kafka_eos_airflow.operators.stream"], env, work)
    providers = _json_out(_run([str(bin_dir / "airflow"), "providers", "list", "-o", "json"], env, work))
    assert "kafka-eos" in {p["package_name"] for p in providers}
    section = _run([str(bin_dir / "airflow"), "config", "list", "--section", "kafka_eos", "--show-values"], env, work)
    assert "[kafka_eos]" in section and f"pipelines_folder = {project / 'pipelines'}" in section, section
    assert "kafka_conn_id = kafka_eos_kafka" in section and "local_broker_fallback = False" in section, section

    # The user's project: `kafka-eos new`, its Spark settings, topics, records; a DAG file of theirs.
    _run([str(bin_dir / "kafka-eos"), "new", name], env, project)
    spec_file = project / "pipelines" / f"{name}.yaml"
    spec = yaml.safe_load(spec_file.read_text())
    spec["spark"] = {"spark.sql.shuffle.partitions": 3, "spark.executor.memory": "1g"}
    spec_file.write_text(yaml.safe_dump(spec))
    _run([str(bin_dir / "kafka-eos"), "topics", "create", str(spec_file), "--yes"], env, project)
    source = spec["source"]["topics"][0]
    producer = Producer(kafka_settings.client_config(**{"transactional.id": f"{name}-sample"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(source, key=f"c{i}", value=json.dumps({"id": f"c{i}", "payload": "home"}))
    producer.produce(source, value="not json")
    producer.commit_transaction(30)
    (work / "dags" / "pipelines.py").write_text(
        "from kafka_eos_airflow.dag_factory import kafka_eos_dags\n\nglobals().update(kafka_eos_dags())\n")

    _run([str(bin_dir / "airflow"), "db", "migrate"], env, work)
    errors = _run([str(bin_dir / "airflow"), "dags", "list-import-errors", "-l", "-o", "json"], env, work)
    assert _json_out(errors) == [], errors
    listed = {d["dag_id"] for d in _json_out(_run([str(bin_dir / "airflow"), "dags", "list", "-l", "-o", "json"],
                                                  env, work))}
    assert {f"kafka_eos__{name}", f"kafka_eos_stream__{name}", "kafka_eos_watchdog",
            "kafka_eos_runbook_abort_transaction"} <= listed, listed

    # No OpenLineage provider without its extra: the DAG below runs (and verifies) without lineage.
    done = subprocess.run([str(bin_dir / "python"), "-c", "import airflow.providers.openlineage"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No module named 'airflow.providers.openlineage'" in done.stderr, done.stderr[-500:]

    # Everything so far ran on Spark Connect's client alone (the Spark provider's pyspark-client):
    # no pyspark distribution, no Spark jars. The workers that run the Spark task add the extra.
    probe = "import importlib.metadata as m; print(m.version('pyspark-client'), end=' '); m.version('pyspark')"
    done = subprocess.run([str(bin_dir / "python"), "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "No package metadata was found for pyspark\n" in done.stderr, done.stderr[-500:]
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    _run([*pip, *_constraints(work), f"{wheel}[spark]"], _unconstrained(), work, timeout=900)
    versions = subprocess.run([str(bin_dir / "python"), "-c", "import importlib.metadata as m; "
                               "print(m.version('pyspark'), m.version('pyspark-client'))"], env=env,
                              capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert versions[0] == versions[1], versions  # one Spark, wherever both are installed
    if os.environ.get(AT_ENV) == "floors":
        # Really at the floors: each declared requirement is installed at its lowest version.
        script = ("import importlib.metadata as m, json, sys; "
                  "print(json.dumps({n: m.version(n) for n in json.loads(sys.argv[1])}))")
        installed = json.loads(subprocess.run([str(bin_dir / "python"), "-c", script, json.dumps(list(floor_pins()))],
                                              env=env, capture_output=True, text=True, timeout=60,
                                              check=True).stdout)
        assert {n: _release(v) for n, v in installed.items()} == \
            {n: _release(v) for n, v in floor_pins().items()}, installed

    out = _run([str(bin_dir / "airflow"), "dags", "test", f"kafka_eos__{name}"], env, work, timeout=900)
    assert re.search(r"spark\.sql\.shuffle\.partitions=3", out), out[-3000:]  # the spec's `spark:` reached spark-submit
    again = _run([str(bin_dir / "airflow"), "dags", "test", f"kafka_eos__{name}"], env, work, timeout=900)
    assert "empty plan, nothing to read" in again, again[-3000:]

    sink = spec["sink"]
    assert Counter(json.loads(m.value)["id"] for m in read_committed(kafka_settings, sink["topic"])) == \
        Counter(f"c{i}" for i in range(20))
    assert [m.value for m in read_committed(kafka_settings, sink["dlq_topic"])] == [b"not json"]
    partitions = kafka_admin.admin_client(kafka_settings).list_topics(source, timeout=30).topics[source].partitions
    tps = [(source, p) for p in sorted(partitions)]
    lso = kafka_admin.partition_offsets(kafka_settings, tps)
    assert kafka_admin.committed_offsets(kafka_settings, spec["source"].get("group_id", f"kafka-eos.{name}"), tps) == \
        {tp: lso[tp].lso for tp in tps}


def _release(version: str) -> tuple[int, ...]:
    """``2.2`` and ``2.2.0`` alike."""
    from packaging.version import Version

    release = list(Version(version).release)
    while release and release[-1] == 0:
        release.pop()
    return tuple(release)


def _json_out(text: str):
    """The JSON document an ``airflow ... -o json`` command printed among its log lines."""
    decoder = json.JSONDecoder()
    for line in text.splitlines():
        if line.startswith(("[", "{")):
            try:
                return decoder.raw_decode(line)[0]
            except json.JSONDecodeError:
                continue  # a log line that starts with a bracket
    raise AssertionError(f"no JSON in:\n{text[-3000:]}")
