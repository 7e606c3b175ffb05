"""Security settings reach every client: librdkafka (confluent-kafka), Spark's Java Kafka client
and kafka-python (the transaction admin API), each in its own names."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs

import pytest

from kafka_eos.errors import KafkaEosError
from kafka_eos.oauth import ClientCredentialsTokenProvider
from kafka_eos.settings import JAVA_OIDC_HANDLER, KafkaSettings

OIDC = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "etl", "sasl.oauthbearer.client.secret": "s3cret",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token", "sasl.oauthbearer.scope": "kafka",
        "ssl.ca.location": "/etc/ca.pem"}


def test_oauthbearer_settings_reach_each_client_in_its_own_names():
    settings = KafkaSettings("b:9093", extra=OIDC)
    librdkafka = settings.client_config()
    assert {k: librdkafka[k] for k in OIDC} == OIDC  # librdkafka runs the OIDC flow itself
    spark = settings.spark_options()
    assert spark["kafka.security.protocol"] == "SASL_SSL" and spark["kafka.sasl.mechanism"] == "OAUTHBEARER"
    assert spark["kafka.sasl.oauthbearer.token.endpoint.url"] == "https://idp.example/token"
    assert spark["kafka.sasl.login.callback.handler.class"] == JAVA_OIDC_HANDLER
    assert spark["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
        'clientId="etl" clientSecret="s3cret" scope="kafka";')
    assert spark["kafka.ssl.truststore.location"] == "/etc/ca.pem" and spark["kafka.ssl.truststore.type"] == "PEM"
    kp = settings.kafka_python_config()
    assert kp["security_protocol"] == "SASL_SSL" and kp["sasl_mechanism"] == "OAUTHBEARER"
    provider = kp["sasl_oauth_token_provider"]
    assert isinstance(provider, ClientCredentialsTokenProvider)
    assert (provider.token_endpoint_url, provider.client_id, provider.scope) == ("https://idp.example/token", "etl",
                                                                                 "kafka")
    assert "s3cret" not in repr(provider) and "s3cret" not in repr(settings)


def test_scram_settings_become_the_java_clients_login_module_and_kafka_pythons_arguments():
    settings = KafkaSettings("b:9093", extra={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                              "sasl.username": "etl", "sasl.password": "pw",
                                              "ssl.ca.location": "/ca.pem"})
    spark = settings.spark_options()
    assert spark["kafka.sasl.jaas.config"] == \
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="etl" password="pw";'
    assert spark["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    kp = settings.kafka_python_config()
    assert (kp["sasl_mechanism"], kp["sasl_plain_username"], kp["sasl_plain_password"], kp["ssl_cafile"]) == \
        ("SCRAM-SHA-512", "etl", "pw", "/ca.pem")


def test_oauthbearer_without_the_oidc_fields_is_named():
    with pytest.raises(KafkaEosError, match="sasl.oauthbearer.token.endpoint.url not set"):
        KafkaSettings("b:9093", extra={k: v for k, v in OIDC.items()
                                       if k != "sasl.oauthbearer.token.endpoint.url"}).spark_options()
    with pytest.raises(KafkaEosError, match=r"^sasl.mechanism OAUTHBEARER: a token callback \(oauth_cb\) or sasl.oauthbearer.method=oidc"):
        KafkaSettings("b:9093", extra={"sasl.mechanism": "OAUTHBEARER"}).kafka_python_config()


def test_the_token_provider_runs_the_client_credentials_grant_and_reuses_the_token():
    seen = []

    class TokenEndpoint(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            seen.append((self.headers["Authorization"], body))
            answer = json.dumps({"access_token": f"token-{len(seen)}", "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), TokenEndpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = ClientCredentialsTokenProvider(f"http://127.0.0.1:{server.server_port}/token", "etl", "s3cret",
                                                  "kafka")
        assert provider.token() == "token-1"
        assert provider.token() == "token-1"  # reused until shortly before it expires
    finally:
        server.shutdown()
    [(auth, form)] = seen
    assert auth == "Basic ZXRsOnMzY3JldA=="  # etl:s3cret
    assert form == {"grant_type": ["client_credentials"], "scope": ["kafka"]}


CALLBACK = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": "kafka_eos_lab.oauth.unsecured_token", "sasl.oauthbearer.config": 'sub=etl note="a\\b"'}


def test_a_token_callback_reaches_each_client_kind_as_the_same_callable():
    from kafka_eos.oauth import CallbackTokenProvider
    from kafka_eos.settings import JAVA_CALLBACK_HANDLER, JAVA_OAUTH_MODULE
    from kafka_eos_lab.oauth import unsecured_token

    settings = KafkaSettings("b:9093", extra=CALLBACK)
    oauth_cb = settings.client_config()["oauth_cb"]
    assert oauth_cb.__wrapped__ is unsecured_token
    assert oauth_cb("sub=etl")[2] == "etl"  # confluent-kafka's shape: (token, expiry, principal, extensions)
    spark = settings.spark_options(python="/opt/py/bin/python3")
    assert spark["kafka.sasl.login.callback.handler.class"] == JAVA_CALLBACK_HANDLER
    # JAAS quoting: the argument's quotes and backslash survive.
    assert spark["kafka.sasl.jaas.config"] == (
        f'{JAVA_OAUTH_MODULE} required callback="kafka_eos_lab.oauth.unsecured_token" python="/opt/py/bin/python3" '
        'config="sub=etl note=\\"a\\\\b\\"";')
    provider = settings.kafka_python_config()["sasl_oauth_token_provider"]
    assert isinstance(provider, CallbackTokenProvider)
    token = provider.token()
    assert token == provider.token()  # kept until shortly before it expires
    assert json.loads(_b64decode(token.split(".")[1]))["sub"] == "etl"


def _b64decode(part: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_the_java_logins_command_prints_the_token_expiry_and_principal_and_names_a_bad_callback(tmp_path):
    import subprocess
    import sys
    import time

    calls = tmp_path / "calls"
    ok = subprocess.run([sys.executable, "-m", "kafka_eos.oauth", "kafka_eos_lab.oauth.unsecured_token"],
                        input=f"sub=etl calls={calls}", capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    token, expiry_ms, principal = ok.stdout.splitlines()
    assert principal == "etl" and abs(int(expiry_ms) / 1000 - (time.time() + 3600)) < 60
    assert token.count(".") == 2
    assert json.loads(calls.read_text())["argv0"].endswith("kafka_eos/oauth.py")
    bad = subprocess.run([sys.executable, "-m", "kafka_eos.oauth", "no_such_module.cb"], input="",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip().splitlines()[-1] == ("kafka-eos: token callback no_such_module.cb: callback "
                                                  "'no_such_module.cb': cannot import no_such_module: No module "
                                                  "named 'no_such_module'")


def test_callbacks_kafka_eos_clients_must_not_take_are_refused_by_name():
    with pytest.raises(KafkaEosError, match=r"^Kafka settings set log_cb, on_commit: kafka-eos's clients take no"):
        KafkaSettings("b:9093", extra={"log_cb": "a.b", "on_commit": "a.c"})


def test_the_kafka_providers_msk_iam_callback_travels_as_a_path_and_an_airflow_hooks_method_is_refused():
    from functools import partial

    from airflow.providers.apache.kafka.hooks.base import _msk_iam_oauth_cb
    from airflow.sdk.exceptions import AirflowException

    from kafka_eos.oauth import msk_iam_oauth_cb
    from kafka_eos.settings import MSK_IAM_CALLBACK
    from kafka_eos_airflow.hooks.kafka import _named_callback

    # What the provider's hook adds for an MSK cluster (KafkaBaseHook._maybe_add_msk_iam_oauth).
    assert _named_callback("msk", "oauth_cb", partial(_msk_iam_oauth_cb, "eu-west-1")) == \
        {"oauth_cb": MSK_IAM_CALLBACK, "sasl.oauthbearer.config": "region=eu-west-1"}
    assert KafkaSettings("b:9098", extra={"oauth_cb": MSK_IAM_CALLBACK}).client_config()["oauth_cb"].__wrapped__ \
        is msk_iam_oauth_cb

    class ManagedKafkaHook:  # Google Managed Kafka's: a hook's method, callable only where Airflow is
        def get_confluent_token(self, config_str):
            return "t", 0.0

    with pytest.raises(AirflowException, match=r"^connection 'gmk': the Kafka provider adds oauth_cb=.*which only "
                                               r"this process can call"):
        _named_callback("gmk", "oauth_cb", ManagedKafkaHook().get_confluent_token)


def test_a_line_break_in_any_java_login_value_is_refused_naming_the_setting_not_the_value():
    """A line break ends a quoted JAAS value, and what follows would be read as further options
    (another callback, another interpreter): refused, for every login the Java client gets."""
    injected = "x\ncallback='os.system' python='/usr/bin/python3' config='id';//"
    for extra in ({**CALLBACK, "sasl.oauthbearer.config": injected},
                  {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": injected},
                  {**OIDC, "sasl.oauthbearer.client.secret": injected}):
        with pytest.raises(KafkaEosError, match=r"^(sasl\.oauthbearer\.config|sasl\.password|"
                                                r"sasl\.oauthbearer\.client\.secret): a control character") as err:
            KafkaSettings("b:9093", extra=extra).spark_options()
        assert "os.system" not in str(err.value)


def test_a_token_callbacks_expiry_must_be_a_time_ahead_in_seconds_and_short_lives_refresh_half_way(monkeypatch):
    import time

    from kafka_eos import oauth

    now = time.time()
    for expiry in (now - 10, now * 1000):  # past; milliseconds
        with pytest.raises(KafkaEosError, match=r"^token callback cb: its expiry \d+ is not a time in the next year"):
            oauth.call_token_callback(lambda _c, e=expiry: ("t", e), "", "cb")
    calls = []

    def short_lived(config_str):
        calls.append(time.time())
        return "t", time.time() + 30, "p"

    monkeypatch.setattr(oauth, "resolve_callback", lambda path: short_lived)
    provider = oauth.CallbackTokenProvider("x.short_lived")
    provider.token()
    provider.extensions()
    provider.token()
    assert len(calls) == 1  # a 30 s token is kept for 15 s, not fetched again at each call
