"""Servers a session's tests share (the Airflow deployment, the secured broker): each stops after
the session's last test that uses it, rather than idling to the session's end."""

from __future__ import annotations

#: Per session fixture: the tests using it that have run in this process.
_USERS_DONE: dict[str, set[str]] = {}


def last_test_using(request, fixture: str) -> bool:
    """Record the test of ``request`` as done with the session fixture ``fixture``; True when it
    was the last of the session's tests (as selected) that use it. In a parallel session those
    tests must all run in this worker: tests/conftest.py's scheduler keeps them together."""
    done = _USERS_DONE.setdefault(fixture, set())
    done.add(request.node.nodeid)
    users = {item.nodeid for item in request.session.items if fixture in getattr(item, "fixturenames", ())}
    return users <= done
