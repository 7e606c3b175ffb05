"""An Iceberg sink's catalog URL: a REST catalog's properties from the URL, and the URL from an
Airflow connection of the Iceberg provider's type (credentials through, never lost or mangled)."""

from __future__ import annotations

import json

import pytest

from kafka_eos.errors import SpecError
from kafka_eos.sinks.iceberg_store import is_rest, rest_properties


def test_a_rest_url_gives_the_uri_its_credentials_and_properties_apart():
    url = "https://client%3Aid:se%2Fcr%40et@polaris.example:8443/api/catalog?warehouse=prod&scope=PRINCIPAL_ROLE%3AALL"
    assert is_rest(url) and not is_rest("postgresql://u:p@h/db")
    assert rest_properties(url) == {"uri": "https://polaris.example:8443/api/catalog",
                                    "credential": "client:id:se/cr@et", "warehouse": "prod",
                                    "scope": "PRINCIPAL_ROLE:ALL"}
    assert rest_properties("http://:t0k%2Ben@127.0.0.1:8181") == {"uri": "http://127.0.0.1:8181", "token": "t0k+en"}
    assert rest_properties("http://[::1]:8181/v1?header.X-Iceberg-Access-Delegation=vended-credentials") == {
        "uri": "http://[::1]:8181/v1", "header.X-Iceberg-Access-Delegation": "vended-credentials"}


def test_an_iceberg_connection_is_a_rest_catalog_and_any_other_a_database(monkeypatch):
    from kafka_eos_airflow.hooks.iceberg import catalog_url_of

    monkeypatch.setenv("AIRFLOW_CONN_LAKE", json.dumps({
        "conn_type": "iceberg", "host": "https://polaris.example/api/catalog", "login": "etl",
        "password": "p@ss:/word", "extra": {"warehouse": "prod", "token": "a-token", "retries": 3}}))
    assert rest_properties(catalog_url_of("lake")) == {
        "uri": "https://polaris.example/api/catalog", "credential": "etl:p@ss:/word", "warehouse": "prod",
        "token": "a-token", "retries": "3"}
    monkeypatch.setenv("AIRFLOW_CONN_CATDB", "postgresql://cat:pw@db.example:5432/catalog")
    assert catalog_url_of("catdb").startswith("postgresql") and "cat:pw@db.example:5432/catalog" in catalog_url_of("catdb")
    assert catalog_url_of("nothing_here") is None
    monkeypatch.setenv("AIRFLOW_CONN_BAD", json.dumps({"conn_type": "iceberg", "host": "polaris.example"}))
    with pytest.raises(SpecError, match=r"connection 'bad' of type 'iceberg': its Host must be the REST catalog's URI"):
        catalog_url_of("bad")


def test_secrets_written_raw_stay_whole_and_never_reach_an_error():
    from kafka_eos.sinks.iceberg_store import _redacted

    # A secret written raw that a URL parser would split: refused, never quoted.
    for raw in ("https://etl:ab/c?d#e@f@catalog.example:8443/api", "https://id:p@ss/word@cat.example.com/api",
                "https://id:1234/x@iceberg_rest:8181/api"):
        with pytest.raises(SpecError, match=r"credentials must be percent-encoded") as refused:
            rest_properties(raw)
        assert "ss/word" not in str(refused.value) and "1234" not in str(refused.value)
    assert rest_properties("https://etl:ab%2Fc%3Fd%23e%40f@iceberg_rest:8181/api?scope=a@b") == {
        "uri": "https://iceberg_rest:8181/api", "credential": "etl:ab/c?d#e@f", "scope": "a@b"}
    for bad in ("https://:t0ken%0A@catalog.example", "https://catalog.example?token=t0ken%0A"):
        with pytest.raises(SpecError, match=r"holds a control character") as refused:
            rest_properties(bad)
        assert "t0ken" not in str(refused.value)
    props = rest_properties("https://:s3cr3t%2Ftoken@catalog.example?s3.secret-access-key=wJalrXUtn&s3.access-key-id=AKID")
    assert _redacted("Invalid header: b'Bearer s3cr3t/token\\n' or s3cr3t%2Ftoken, key wJalrXUtn, id AKID", props) == \
        "Invalid header: b'Bearer ***\\n' or ***, key ***, id AKID"


def test_a_password_alone_is_a_bearer_token_and_a_hosts_query_stays(monkeypatch):
    from kafka_eos_airflow.hooks.iceberg import catalog_url_of

    monkeypatch.setenv("AIRFLOW_CONN_LAKE2", json.dumps({
        "conn_type": "iceberg", "host": "https://catalog.example/api?warehouse=w1", "password": "t/k",
        "extra": {"vended": True, "scopes": ["a", "b"]}}))
    assert rest_properties(catalog_url_of("lake2")) == {
        "uri": "https://catalog.example/api", "token": "t/k", "warehouse": "w1", "vended": "true",
        "scopes": '["a", "b"]'}
