"""A token callback's AdminClients are shared inside kafka_admin.shared_admin_clients: confluent-kafka
(2.13 on) holds each new client with an ``oauth_cb`` about a second in its constructor, and a run's
planning and checks ask the cluster through a dozen. No broker is needed: a client is built without
connecting (the bootstrap address answers nothing)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException

from kafka_eos import kafka_admin
from kafka_eos.errors import BrokerError
from kafka_eos.settings import KafkaSettings

#: Nothing listens there; SASL_PLAINTEXT so that no CA file is needed.
TOKEN = KafkaSettings("127.0.0.1:9", extra={
    "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
    "oauth_cb": "kafka_eos_lab.oauth.unsecured_token", "sasl.oauthbearer.config": "sub=etl"})
PLAIN = KafkaSettings("127.0.0.1:9")


def test_a_token_callbacks_client_is_built_once_per_scope_and_other_settings_get_a_new_one():
    assert kafka_admin.admin_client(TOKEN) is not kafka_admin.admin_client(TOKEN)  # outside: a new one each
    with kafka_admin.shared_admin_clients():
        started = time.monotonic()
        first = kafka_admin.admin_client(TOKEN)
        built_s = time.monotonic() - started
        started = time.monotonic()
        assert all(kafka_admin.admin_client(TOKEN) is first for _ in range(5))
        shared_s = time.monotonic() - started
        with kafka_admin.shared_admin_clients():  # nested: the outer scope's
            assert kafka_admin.admin_client(TOKEN) is first
        assert kafka_admin.admin_client(TOKEN) is first  # the nested scope's end kept it
        # Other settings: the same cluster, another principal; and settings with no token callback.
        other = KafkaSettings(TOKEN.bootstrap_servers, extra={**TOKEN.extra, "sasl.oauthbearer.config": "sub=ops"})
        assert kafka_admin.admin_client(other) is not first
        assert kafka_admin.admin_client(PLAIN) is not kafka_admin.admin_client(PLAIN)
    assert kafka_admin.admin_client(TOKEN) is not first  # the scope's end dropped it
    # What the scope saves (confluent-kafka's wait); printed, not timed: the figure moves with the machine.
    print(f"a token callback's AdminClient: built in {built_s:.2f} s; five more from the scope in {shared_s:.3f} s")


def test_a_retry_after_a_transient_error_starts_from_a_fresh_client():
    seen, errors = [], [KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)]

    def once():
        seen.append(kafka_admin.admin_client(TOKEN))
        if errors:
            raise BrokerError("offsets: NOT_LEADER_FOR_PARTITION") from KafkaException(errors.pop())
        return "read"

    with kafka_admin.shared_admin_clients():
        before = kafka_admin.admin_client(TOKEN)
        assert kafka_admin.retrying(once, timeout_s=30) == "read"
        assert seen[0] is before and seen[1] is not before
        assert kafka_admin.admin_client(TOKEN) is seen[1]  # the fresh one is shared from then on


def test_a_shared_client_is_built_again_once_a_minute_old(monkeypatch):
    with kafka_admin.shared_admin_clients():
        first = kafka_admin.admin_client(TOKEN)
        now = time.monotonic()
        monkeypatch.setattr(kafka_admin.time, "monotonic", lambda: now + kafka_admin.SHARED_CLIENT_MAX_AGE_S)
        again = kafka_admin.admin_client(TOKEN)
        assert again is not first and kafka_admin.admin_client(TOKEN) is again


def test_a_forked_child_neither_uses_nor_destroys_its_parents_clients(monkeypatch):
    """What ``os.fork()`` runs in the child (kafka_admin._after_fork_in_child), played in this
    process: the parent's clients are parked, never released; the child's own scope builds its own."""
    import os
    import sys

    parent_pid = os.getpid()
    with kafka_admin.shared_admin_clients():
        parent = kafka_admin.admin_client(TOKEN)
        references = sys.getrefcount(parent)
        parked = len(kafka_admin._inherited)
        monkeypatch.setattr(kafka_admin.os, "getpid", lambda: parent_pid + 1)
        kafka_admin._after_fork_in_child()
        assert kafka_admin._inherited[parked:] and kafka_admin._shared is None
        assert kafka_admin.admin_client(TOKEN) is not parent  # the child: no scope, a new client
        with kafka_admin.shared_admin_clients():  # the child's own scope
            child = kafka_admin.admin_client(TOKEN)
            assert child is not parent and kafka_admin.admin_client(TOKEN) is child
        assert sys.getrefcount(parent) == references  # the child's scope released nothing of the parent's
    # The parent's scope, unwound in the "child": its clients stay parked, nothing is destroyed.
    assert sys.getrefcount(parent) == references
    del kafka_admin._inherited[parked:]
