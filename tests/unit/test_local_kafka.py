"""The local broker's guard rails that need no broker: a taken port, missing jars."""

from __future__ import annotations

import socket

import pytest

from kafka_eos.errors import BrokerError
from kafka_eos.local.kafka import LocalBroker


def test_port_taken_by_another_process_is_a_clear_error(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(BrokerError, match=rf"port 127.0.0.1:{port} is taken by another process"):
            LocalBroker(home=tmp_path, port=port).start()


def test_stop_when_nothing_runs_reports_false(tmp_path):
    assert LocalBroker(home=tmp_path, port=1).stop() is False


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch):
    """kafka-storage format takes ``--cluster-id -…`` for an option: one format in 64 failed so."""
    import uuid

    from kafka_eos.local import kafka

    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64: '-' first (0xf8 >> 2 == 62)
    plain = uuid.UUID(bytes=b"\x04" + bytes(15))
    drawn = iter([dash_first, dash_first, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(drawn))
    cluster_id = kafka.new_cluster_id()
    assert cluster_id == "BAAAAAAAAAAAAAAAAAAAAA" and len(cluster_id) == 22
