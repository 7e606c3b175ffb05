"""OAUTHBEARER logins for the clients librdkafka does not serve.

Two routes: OAuth 2 client credentials (``sasl.oauthbearer.method=oidc``), which librdkafka and the
Java client (``OAuthBearerLoginCallbackHandler``) run themselves and kafka-python through
:class:`ClientCredentialsTokenProvider` (POST ``grant_type=client_credentials`` to the token
endpoint with the client id and secret, use the access token until shortly before it expires); and
a Python token callback (``oauth_cb``, below), which every client kind calls.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from kafka.net.sasl.oauth import AbstractTokenProvider

from kafka_eos.errors import KafkaEosError

if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

#: A token is fetched again this long before it expires.
REFRESH_MARGIN_S = 60.0
TIMEOUT_S = 10.0


class ClientCredentialsTokenProvider(AbstractTokenProvider):
    def __init__(self, token_endpoint_url: str, client_id: str, client_secret: str, scope: str | None = None) -> None:
        super().__init__()
        self.token_endpoint_url = token_endpoint_url
        self.client_id = client_id
        self._secret = client_secret
        self.scope = scope
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the secret
        return f"ClientCredentialsTokenProvider({self.token_endpoint_url!r}, client_id={self.client_id!r})"

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expires_at - REFRESH_MARGIN_S:
                self._token, lifetime = self._fetch()
                self._expires_at = time.time() + lifetime
            return self._token

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials", **({"scope": self.scope} if self.scope else {})}
        basic = base64.b64encode(f"{urllib.parse.quote(self.client_id)}:{urllib.parse.quote(self._secret)}"
                                 .encode()).decode()
        request = urllib.request.Request(
            self.token_endpoint_url, data=urllib.parse.urlencode(form).encode(), method="POST",
            headers={"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded",
                     "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise KafkaEosError(f"OAuth token endpoint {self.token_endpoint_url}: {exc}") from None
        if "access_token" not in body:
            raise KafkaEosError(f"OAuth token endpoint {self.token_endpoint_url}: no access_token in its answer "
                                f"({body.get('error', 'no error given')})")
        return body["access_token"], float(body.get("expires_in", 3600))


# --- Token callbacks (librdkafka's ``oauth_cb``), for every client kind --------------------------
#
# A Kafka connection may log in through a Python token callback: confluent-kafka's ``oauth_cb``,
# named in the settings by its dotted path (an Airflow connection's extra, where the Kafka
# provider's ``[apache_kafka] callback_allowlist`` lets it; ``KAFKA_EOS_CLIENT_CONFIG`` for the CLI).
# The path travels to every process of a run, and each client kind calls the same callable:
# confluent-kafka directly, kafka-python through :class:`CallbackTokenProvider`, the Java client of
# Spark's connector through ``io.kafkaeos.oauth.PythonTokenLoginCallbackHandler`` (jvm/connect),
# which runs ``python -m kafka_eos.oauth <path>`` (:func:`main`).



def resolve_callback(path: str) -> "Callable":
    """The callable at ``path`` (``package.module.function``).

    :raises KafkaEosError: not importable, or not a callable, naming the path.
    """
    import importlib

    module, _, name = path.rpartition(".")
    if not module:
        raise KafkaEosError(f"callback {path!r}: not a dotted path (package.module.function)")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise KafkaEosError(f"callback {path!r}: cannot import {module}: {exc}") from None
    except AttributeError:
        raise KafkaEosError(f"callback {path!r}: {module} has no {name}") from None
    if not callable(value):
        raise KafkaEosError(f"callback {path!r}: not callable")
    return value


#: A token said to live longer than this is taken for an expiry in the wrong unit.
MAX_LIFETIME_S = 366 * 24 * 3600.0


@dataclass(frozen=True)
class Token:
    """What a token callback answered (confluent-kafka's ``oauth_cb`` shape)."""

    value: str = field(repr=False)
    #: When it expires, in seconds since the epoch.
    expires_at: float
    principal: str
    extensions: Mapping[str, str] = field(default_factory=dict)


def call_token_callback(callback: "Callable", config_str: str, path: str = "oauth_cb") -> Token:
    """Call a token callback as librdkafka does (``callback(sasl.oauthbearer.config)``) and read its
    answer: ``(token, expiry)``, ``(token, expiry, principal)`` or ``(token, expiry, principal,
    extensions)``, the expiry in seconds since the epoch. A missing principal is the token's
    ``sub`` claim where it is a JWT, else ``kafka-eos``.

    :raises KafkaEosError: the answer has another shape, naming ``path``.
    """
    answer = callback(config_str)
    if not isinstance(answer, (tuple, list)) or not 2 <= len(answer) <= 4 or not isinstance(answer[0], str):
        raise KafkaEosError(f"token callback {path}: answered {type(answer).__name__}, not (token, expiry[, "
                            "principal[, extensions]])")
    token, expiry = answer[0], float(answer[1])
    now = time.time()
    if not now < expiry <= now + MAX_LIFETIME_S:
        raise KafkaEosError(f"token callback {path}: its expiry {expiry:.0f} is not a time in the next year in seconds "
                            f"since the epoch (now {now:.0f}; milliseconds?)")
    principal = answer[2] if len(answer) > 2 and answer[2] else _jwt_subject(token) or "kafka-eos"
    extensions = {str(k): str(v) for k, v in (answer[3] if len(answer) > 3 and answer[3] else {}).items()}
    return Token(token, expiry, str(principal), extensions)


def checked_token_callback(callback: "Callable", path: str) -> "Callable":
    """``callback`` as confluent-kafka's ``oauth_cb``, its answers checked by
    :func:`call_token_callback` (the same rules as the other client kinds')."""

    def oauth_cb(config_str: str) -> tuple:
        token = call_token_callback(callback, config_str, path)
        return token.value, token.expires_at, token.principal, dict(token.extensions)

    oauth_cb.__wrapped__ = callback  # type: ignore[attr-defined]
    return oauth_cb


def _jwt_subject(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return claims.get("sub") if isinstance(claims, dict) else None


class CallbackTokenProvider(AbstractTokenProvider):
    """kafka-python's token provider over a token callback: the token is kept until shortly before
    it expires (:data:`REFRESH_MARGIN_S` before, or half-way through a life shorter than twice that)."""

    def __init__(self, path: str, config_str: str = "") -> None:
        super().__init__()
        self.path = path
        self._callback = resolve_callback(path)
        self._config = config_str
        self._token: Token | None = None
        self._refresh_at = 0.0
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the token or its argument
        return f"CallbackTokenProvider({self.path!r})"

    def _current(self) -> Token:
        with self._lock:
            if self._token is None or time.time() >= self._refresh_at:
                now = time.time()
                self._token = call_token_callback(self._callback, self._config, self.path)
                life = self._token.expires_at - now
                # A minute before it expires, or half-way through a short life; never at once.
                self._refresh_at = now + max(life - REFRESH_MARGIN_S, life / 2, 1.0)
            return self._token

    def token(self) -> str:
        return self._current().value

    def extensions(self) -> dict:
        return dict(self._current().extensions)


def msk_iam_oauth_cb(config_str: str) -> tuple[str, float]:
    """Amazon MSK IAM's token (aws-msk-iam-sasl-signer-python, the Kafka provider's ``msk`` extra),
    for the region ``config_str`` names (``region=us-east-1``): what the Kafka provider's hook
    injects for an MSK connection, as a dotted path every process of a run can call."""
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    fields = dict(part.split("=", 1) for part in config_str.split() if "=" in part)
    if not fields.get("region"):
        raise KafkaEosError("MSK IAM token: sasl.oauthbearer.config names no region (region=us-east-1)")
    token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(fields["region"])
    return token, expiry_ms / 1000


def main(argv: list[str] | None = None) -> int:
    """``python -m kafka_eos.oauth CALLBACK``: call the token callback with the text on standard input
    (``sasl.oauthbearer.config``) and print the token, its expiry in epoch milliseconds, the
    principal and one ``key=value`` line per SASL extension: the Java client's login
    (``PythonTokenLoginCallbackHandler``) reads them. Errors go to standard error, one line."""
    import contextlib

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kafka_eos.oauth package.module.callback  (sasl.oauthbearer.config on stdin)",
              file=sys.stderr)
        return 2
    config_str = sys.stdin.read()
    try:
        # Whatever the callback prints must not be taken for its answer.
        with contextlib.redirect_stdout(sys.stderr):
            token = call_token_callback(resolve_callback(args[0]), config_str, args[0])
    except Exception as exc:  # noqa: BLE001 - the Java login reports this line and fails
        print(f"kafka-eos: token callback {args[0]}: {exc}", file=sys.stderr)
        return 1
    lines = [token.value, str(int(token.expires_at * 1000)), token.principal,
             *(f"{k}={v}" for k, v in token.extensions.items())]
    if any("\n" in line or "\r" in line for line in lines):
        print(f"kafka-eos: token callback {args[0]}: a line break in its answer", file=sys.stderr)
        return 1
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
