"""What lives in an extra (pyproject.toml) fails, where it is needed and missing, in one line naming
the extra: the registry's .proto compiler (``protoc``), the stream's Prometheus endpoint (``metrics``)."""

from __future__ import annotations

import sys

import pytest

from kafka_eos.errors import KafkaEosError, RegistryError


def test_a_proto_text_schema_without_the_compiler_names_the_extra(monkeypatch):
    from kafka_eos.formats.protobuf import _compiled

    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # not installed
    with pytest.raises(RegistryError, match=r"^the registry answered the Protobuf schema orders.proto as .proto "
                                            r"text: compiling it needs protoc \(pip install 'kafka-eos\[protoc\]'\)$"):
        _compiled('syntax = "proto3"; message Order { string id = 1; }', "orders.proto")


def test_a_metrics_port_without_prometheus_client_names_the_extra(monkeypatch):
    from kafka_eos.stream.figures import PrometheusFigures

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(KafkaEosError, match=r"^--metrics-port: needs prometheus-client \(pip install "
                                            r"'kafka-eos\[metrics\]'\)$"):
        PrometheusFigures("p", 0)


def test_the_extras_are_declared_and_not_in_the_base_dependencies():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"])
    assert "grpcio-tools" not in base and "prometheus-client" not in base
    assert project["optional-dependencies"]["protoc"][0].startswith("grpcio-tools")
    assert project["optional-dependencies"]["metrics"][0].startswith("prometheus-client")
