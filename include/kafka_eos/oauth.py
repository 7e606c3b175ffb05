"""An OAuth 2 client-credentials token provider for kafka-python (the transaction admin API), the
same flow librdkafka (``sasl.oauthbearer.method=oidc``) and the Java client
(``OAuthBearerLoginCallbackHandler``) run themselves: POST ``grant_type=client_credentials`` to the
token endpoint with the client id and secret, use the access token until shortly before it expires.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
import urllib.request

from kafka.net.sasl.oauth import AbstractTokenProvider

from kafka_eos.errors import KafkaEosError

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
