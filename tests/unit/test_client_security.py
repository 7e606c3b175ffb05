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
    with pytest.raises(KafkaEosError, match="only sasl.oauthbearer.method=oidc"):
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
