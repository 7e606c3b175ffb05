"""docker-compose.yml stays complete, consistent with .env.example, and free of literal secrets.

There is no Docker engine on the development machine, so the deployment itself is not started here:
the structural tests read the file with PyYAML, and a Compose tool (the docker compose plugin, or
Debian's docker-compose that ``make test`` installs) checks and resolves it with ``config``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"

REQUIRED_SERVICES = {
    "kafka", "spark-master", "spark-worker",
    "airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
    "airflow-triggerer", "airflow-db", "sink-db",
}
AIRFLOW_SERVICES = sorted(s for s in REQUIRED_SERVICES if s.startswith("airflow-") and s != "airflow-db")

#: ``${NAME`` interpolations; ``$${`` is compose's escape for a literal ``$`` and is skipped.
VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")
#: ``${NAME:?message}`` / ``${NAME?message}``: compose fails when NAME is missing.
REQUIRED_VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*):?\?")
#: Environment keys whose value is a secret.
SECRET_KEY = re.compile(r"(PASSWORD|SECRET|_KEY|TOKEN)$")
#: The password part of a ``scheme://user:password@host`` URL.
URL_PASSWORD = re.compile(r"://[^:/@\s]+:([^@]+)@")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _strings(node):
    """Every string value in the parsed file (comments are not part of it)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _environment(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        env = dict(item.partition("=")[::2] for item in env)
    return env


def _env_example() -> tuple[set[str], set[str]]:
    """(names set on an uncommented line, names mentioned anywhere) in .env.example."""
    text = ENV_EXAMPLE.read_text()
    assigned = set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", text, re.MULTILINE))
    mentioned = set(re.findall(r"^#\s*([A-Za-z_][A-Za-z0-9_]*)=", text, re.MULTILINE)) | assigned
    return assigned, mentioned


def test_every_service_is_defined(compose):
    assert REQUIRED_SERVICES <= set(compose["services"])


def test_every_service_has_an_image(compose):
    for name, service in compose["services"].items():
        assert service.get("image") or service.get("build"), name
    # Spark and Airflow run the project's own image, built from docker/Dockerfile.
    for name in ["spark-master", "spark-worker", *AIRFLOW_SERVICES]:
        service = compose["services"][name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile", name
        assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert service["command"], name


def test_dependencies_exist_and_wait_for_a_condition(compose):
    services = compose["services"]
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown service {target}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}, which has no healthcheck"
    for name in AIRFLOW_SERVICES:
        if name != "airflow-init":
            assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"


def test_airflow_services_share_one_configuration(compose):
    names = [*AIRFLOW_SERVICES, "airflow-worker-1", "airflow-worker-2"]
    envs = [_environment(compose["services"][name]) for name in names]
    assert all(env == envs[0] for env in envs), "Airflow services must agree on secrets and connections"
    env = envs[0]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "${AIRFLOW_EXECUTOR:-LocalExecutor}"  # LocalExecutor unless chosen
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    assert "@airflow-db:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"
    assert "@sink-db:" in env["KAFKA_EOS_SQL_URL"]
    for conn in ("AIRFLOW_CONN_KAFKA_EOS_KAFKA", "AIRFLOW_CONN_SPARK_DEFAULT"):
        assert conn in env


def test_required_variables_are_documented_in_env_example(compose):
    assigned, mentioned = _env_example()
    values = list(_strings(compose))
    required = {name for value in values for name in REQUIRED_VARIABLE.findall(value)}
    used = {name for value in values for name in VARIABLE.findall(value)}
    assert required, "secrets are expected to be required variables"
    assert required <= assigned, f"add to .env.example: {sorted(required - assigned)}"
    assert used <= mentioned, f"document in .env.example: {sorted(used - mentioned)}"


def test_no_literal_secrets(compose):
    for name, service in compose["services"].items():
        for key, value in _environment(service).items():
            value = str(value)
            if SECRET_KEY.search(key):
                assert value.startswith("${"), f"{name}: {key} must come from the environment"
            for password in URL_PASSWORD.findall(value):
                assert password.startswith("${"), f"{name}: literal password in {key}"
    # The example file ships no secret values either.
    for line in ENV_EXAMPLE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#") and SECRET_KEY.search(key):
            assert value == "", f".env.example must not carry a value for {key}"


def _compose_command() -> list[str]:
    """The docker compose plugin where it works, else Debian's docker-compose (``make test``
    installs it: ``make compose-tool``). Neither needs a Docker engine for ``config``."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("no Compose tool: run `make compose-tool` (Debian's docker-compose) or install the docker compose plugin")


def _config(env_file: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*_compose_command(), "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), "--env-file", str(env_file),
         *options, "config"],
        capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                          if k not in _env_example()[1]})


def test_the_compose_tool_accepts_the_file_and_resolves_it(tmp_path, capsys):
    assigned, _ = _env_example()
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{name}=placeholder-{name.lower()}\n" for name in sorted(assigned)))
    result = _config(env_file)
    assert result.returncode == 0, result.stderr
    with capsys.disabled():
        print(f"\n{' '.join(_compose_command())} config (first lines):\n" + "\n".join(result.stdout.splitlines()[:12]))
    resolved = yaml.safe_load(result.stdout)
    assert set(resolved["services"]) == set(yaml.safe_load(COMPOSE_FILE.read_text())["services"])
    # Secrets came from the env file; the defaults filled the rest.
    env = resolved["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__FERNET_KEY"] == "placeholder-airflow_fernet_key"
    assert env["KAFKA_EOS_SQL_URL"] == "postgresql+psycopg2://kafka_eos:placeholder-sink_db_password@sink-db:5432/kafka_eos"
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"]) == {"conn_type": "spark", "host": "spark://spark-master",
                                                             "port": 7077}
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):  # nothing is published beyond this machine by default
            # Compose 1.x resolves a port to "ip:host:container/tcp", the plugin to a mapping.
            host_ip = port["host_ip"] if isinstance(port, dict) else port.split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} on every interface"
        if name != "airflow-init":  # a one-shot job: it has nothing to be healthy about
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_the_celery_profile_puts_every_airflow_service_on_the_celery_executor(tmp_path):
    assigned, _ = _env_example()
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{name}=placeholder-{name.lower()}\n" for name in sorted(assigned))
                        + "AIRFLOW_EXECUTOR=CeleryExecutor\n")
    result = _config(env_file, "--profile", "celery")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    workers = sorted(name for name in services if name.startswith("airflow-worker-"))
    assert workers == ["airflow-worker-1", "airflow-worker-2"]
    airflow = [name for name in services if name.startswith("airflow-") and name != "airflow-db"]
    for name in airflow:  # one configuration, workers included
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0", name
        assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == \
            "db+postgresql+psycopg2://airflow:placeholder-airflow_db_password@airflow-db:5432/airflow", name
    for worker in workers:
        service = services[worker]
        assert service["command"][:3] == ["airflow", "celery", "worker"]
        assert service["hostname"] == worker and worker in service["command"]
        assert "redis" in service["depends_on"] and service.get("healthcheck", {}).get("test")
    assert "ports" not in services["redis"]  # Celery's broker stays on the compose network
    assert services["redis"]["healthcheck"]["test"]


def test_the_compose_tool_refuses_a_missing_secret_naming_it(tmp_path):
    assigned, _ = _env_example()
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{name}=placeholder\n" for name in sorted(assigned - {"SINK_DB_PASSWORD"})))
    result = _config(env_file)
    assert result.returncode != 0
    assert "set SINK_DB_PASSWORD in .env" in result.stderr


def _pom_property(name: str) -> str:
    return re.search(rf"<{name}>([^<]+)</{name}>", (ROOT / "jvm" / "pom.xml").read_text()).group(1)


def _pinned(package: str) -> str:
    return re.search(rf"^{re.escape(package)}==(\S+)$", (ROOT / "requirements.txt").read_text(), re.MULTILINE).group(1)


def test_images_and_versions_agree_with_the_pins(compose):
    # The broker image is the Kafka version the local broker and the tests run.
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{_pom_property('kafka.version')}"
    # Spark's Kafka connector (built into the image by the same pom) matches pyspark's Spark.
    assert _pom_property("spark.version") == _pinned("pyspark") == _pinned("pyspark-client")
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    # The image's Python is the one the project is tested on, and it installs requirements.txt
    # (every pin) plus the project: executors and Airflow tasks run the same kafka_eos.
    python = re.search(r"^FROM python:(\d+\.\d+)", dockerfile, re.MULTILINE).group(1)
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "pip install -r requirements.txt" in dockerfile and "pip install --no-cache-dir --no-deps -e ." in dockerfile
    # Java for spark-submit (Airflow tasks) and for the Spark daemons.
    assert "openjdk-17-jre-headless" in dockerfile
    # Every image is pinned: no floating tags.
    for name, service in compose["services"].items():
        image = service.get("image", "")
        assert image and not image.endswith(":latest") or image.startswith("${KAFKA_EOS_IMAGE"), f"{name}: {image}"
