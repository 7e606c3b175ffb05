"""Kafka settings travel to child processes without a secret in their environment."""

from __future__ import annotations

import json
import stat

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
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092", "KAFKA_EOS_CONNECT_TIMEOUT_S": "10.0"}
    assert not (tmp_path / "none.json").exists()


def test_a_bad_client_config_file_is_named_and_its_content_is_not_shown(tmp_path):
    bad = tmp_path / "client.json"
    bad.write_text('{"sasl.password": "' + SECRET + '",')
    with pytest.raises(KafkaEosError, match=rf"^KAFKA_EOS_CLIENT_CONFIG_FILE file {bad} is not a JSON object: ") as err:
        KafkaSettings.from_environ({"KAFKA_EOS_CLIENT_CONFIG_FILE": str(bad)}, "b:9092")
    assert SECRET not in str(err.value)
    with pytest.raises(KafkaEosError, match=rf"^KAFKA_EOS_CLIENT_CONFIG_FILE: cannot read {tmp_path}/missing: "):
        KafkaSettings.from_environ({"KAFKA_EOS_CLIENT_CONFIG_FILE": str(tmp_path / "missing")}, "b:9092")
