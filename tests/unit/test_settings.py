"""Kafka settings travel to child processes without a secret in their environment."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kafka_eos.errors import KafkaEosError
from kafka_eos.settings import KafkaSettings

SECRET = "pa55-word-of-the-test"


def test_secrets_go_to_a_private_file_that_the_environment_names(tmp_path):
    settings = KafkaSettings("b:9092", extra={"security.protocol": "SASL_SSL", "sasl.password": SECRET})
    env = settings.to_environ(tmp_path / "client.json")
    assert SECRET not in json.dumps(env) and SECRET not in repr(settings)
    assert stat.S_IMODE((tmp_path / "client.json").stat().st_mode) == 0o600
    assert KafkaSettings.from_environ(env) == settings
    with pytest.raises(FileExistsError):  # never overwritten, never shared
        settings.to_environ(tmp_path / "client.json")
    # No extra settings: no file.
    assert KafkaSettings("b:9092").to_environ(tmp_path / "none.json") == {
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092", "KAFKA_EOS_CONNECT_TIMEOUT_S": "10.0",
        "KAFKA_EOS_CLIENT_CONFIG": ""}  # the parent's own never mixes in
    assert not (tmp_path / "none.json").exists()


def test_a_bad_client_config_file_is_named_and_its_content_is_not_shown(tmp_path):
    bad = tmp_path / "client.json"
    bad.write_text('{"sasl.password": "' + SECRET + '",')
    with pytest.raises(KafkaEosError, match=rf"^KAFKA_EOS_CLIENT_CONFIG_FILE file {bad} is not a JSON object: ") as err:
        KafkaSettings.from_environ({"KAFKA_EOS_CLIENT_CONFIG_FILE": str(bad)}, "b:9092")
    assert SECRET not in str(err.value)
    with pytest.raises(KafkaEosError, match=rf"^KAFKA_EOS_CLIENT_CONFIG_FILE: cannot read {tmp_path}/missing: "):
        KafkaSettings.from_environ({"KAFKA_EOS_CLIENT_CONFIG_FILE": str(tmp_path / "missing")}, "b:9092")


def test_the_registry_and_its_credentials_travel_like_the_clusters(tmp_path):
    from kafka_eos.settings import RegistrySettings

    registry = RegistrySettings("https://registry:8081", {"basic.auth.user.info": f"user:{SECRET}"})
    settings = KafkaSettings("b:9092", schema_registry=registry)
    env = settings.to_environ(tmp_path / "client.json")
    assert env["KAFKA_EOS_SCHEMA_REGISTRY_URL"] == "https://registry:8081"
    assert SECRET not in json.dumps(env) and SECRET not in repr(settings)
    assert stat.S_IMODE(Path(env["KAFKA_EOS_SCHEMA_REGISTRY_CONFIG_FILE"]).stat().st_mode) == 0o600
    assert KafkaSettings.from_environ(env) == settings
    # None named: the CLI's default (the embedded registry), else none.
    assert KafkaSettings.from_environ({}, "b:9092").schema_registry is None
    assert KafkaSettings.from_environ({}, "b:9092", default_registry="http://r:1/").schema_registry == \
        RegistrySettings("http://r:1")


def test_a_registry_connection_is_an_http_connection():
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowException

    from kafka_eos_airflow.hooks.kafka import registry_from_connection

    tls = registry_from_connection(Connection(conn_id="sr", conn_type="http", host="registry.example", port=8081,
                                              schema="https", login="u", password=SECRET,
                                              extra='{"ssl.ca.location": "/ca.pem"}'))
    assert (tls.url, dict(tls.extra)) == ("https://registry.example:8081",
                                          {"ssl.ca.location": "/ca.pem", "basic.auth.user.info": f"u:{SECRET}"})
    assert registry_from_connection(Connection(conn_id="a", conn_type="http", host="apicurio/apis/ccompat/v7",
                                               port=8080)).url == "http://apicurio:8080/apis/ccompat/v7"
    with pytest.raises(AirflowException, match=r"^connection 'b': extra schema.registry.url: not a Schema Registry"):
        registry_from_connection(Connection(conn_id="b", conn_type="http", host="h",
                                            extra='{"schema.registry.url": "x"}'))
