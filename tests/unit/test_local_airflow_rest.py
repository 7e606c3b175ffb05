"""The local deployment's REST client (``LocalAirflow.token`` and ``.api``) against an HTTP server
on loopback that answers like Airflow's API server, late when told to: a token request and a GET
are asked again after a read timeout, a DAG run's POST never is (it could make two runs), a token
is reused, and a 401 gets one more try with a new token."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kafka_eos.local import airflow as local_airflow
from kafka_eos.local.airflow import LocalAirflow


class FakeApi(ThreadingHTTPServer):
    """``POST /auth/token`` issues ``token-N``; any other path answers ``{"path": …, "token": …}``.
    The next ``late[path]`` requests to that path are answered only once :attr:`release` is set
    (at the test's end: the client has given up on them); ``refused`` tokens get 401."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.calls: list[tuple[str, str]] = []
        self.late: dict[str, int] = {}
        self.refused: set[str] = set()
        self.release = threading.Event()
        self.issued = 0


class _Handler(BaseHTTPRequestHandler):
    server: FakeApi

    def _serve(self) -> None:
        api, path = self.server, self.path
        api.calls.append((self.command, path))
        if path == "/auth/token":
            api.issued += 1
            issued = api.issued  # numbered as asked for, whenever answered
        if api.late.get(path, 0) > 0:
            api.late[path] -= 1
            api.release.wait()
        if path == "/auth/token":
            status, answer = 201, {"access_token": f"token-{issued}"}
        else:
            token = self.headers["Authorization"].removeprefix("Bearer ")
            status, answer = (401, {"detail": "expired"}) if token in api.refused else (200, {"path": path, "token": token})
        body = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up waiting
            pass

    do_GET = do_POST = _serve

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def api(monkeypatch, tmp_path):
    monkeypatch.setattr(local_airflow, "REST_READ_S", 1.0)
    monkeypatch.setattr(local_airflow, "REST_PATIENCE_S", 30.0)
    server = FakeApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, LocalAirflow(tmp_path / "home", server.server_address[1], tmp_path / "dags")
    server.release.set()
    server.shutdown()
    server.server_close()


def test_a_late_token_and_a_late_get_are_asked_again(api):
    server, airflow = api
    server.late = {"/auth/token": 2, "/api/v2/dags": 1}
    assert airflow.api("GET", "/api/v2/dags") == {"path": "/api/v2/dags", "token": "token-3"}
    assert server.calls == [("POST", "/auth/token")] * 3 + [("GET", "/api/v2/dags")] * 2


def test_a_late_post_is_waited_for_once_not_asked_again(api, monkeypatch):
    server, airflow = api
    monkeypatch.setattr(local_airflow, "REST_PATIENCE_S", 2.0)
    server.late = {"/api/v2/dags/d/dagRuns": 1}
    started = time.monotonic()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        airflow.api("POST", "/api/v2/dags/d/dagRuns", {"conf": {}})
    assert time.monotonic() - started >= 2.0  # the whole patience, not one read's timeout
    assert server.calls.count(("POST", "/api/v2/dags/d/dagRuns")) == 1


def test_patience_runs_out(api, monkeypatch):
    server, airflow = api
    monkeypatch.setattr(local_airflow, "REST_PATIENCE_S", 2.4)
    airflow.token()
    server.late = {"/api/v2/dags": 100}
    started = time.monotonic()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        airflow.api("GET", "/api/v2/dags")
    waited = time.monotonic() - started
    # The patience, not a whole read's timeout (1 s) beyond it; a loaded machine adds a little.
    assert 2.4 <= waited < 3.3, waited
    assert server.calls.count(("GET", "/api/v2/dags")) == 3  # 1 s, 1 s, then the last 0.4 s


def test_a_token_is_reused_and_a_refused_one_replaced_once(api, monkeypatch):
    server, airflow = api
    assert airflow.api("GET", "/a")["token"] == airflow.api("GET", "/b")["token"] == "token-1"
    server.refused.add("token-1")  # the deployment restarted with a new signing key
    assert airflow.api("POST", "/c", {})["token"] == "token-2"
    assert server.calls.count(("POST", "/c")) == 2
    server.refused.add("token-2")
    server.refused.add("token-3")  # the new token refused too: the caller hears it
    with pytest.raises(urllib.error.HTTPError) as refused:
        airflow.api("GET", "/d")
    assert refused.value.code == 401
    server.refused.clear()
    monkeypatch.setattr(local_airflow, "TOKEN_REUSE_S", 0.0)  # an old token is not used: asked for anew
    assert airflow.api("GET", "/e")["token"] == "token-4"
    assert server.calls[-2:] == [("POST", "/auth/token"), ("GET", "/e")]
