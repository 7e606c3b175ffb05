"""A token callback of the lab's own, for the test broker that accepts unsecured OAUTHBEARER tokens
(Kafka's ``OAuthBearerUnsecuredValidatorCallbackHandler``: an unsigned JWT whose ``sub`` is the
principal). Never for a real cluster: anyone can write such a token for any principal.

``sasl.oauthbearer.config`` (the callback's argument) names the principal and, optionally, a file
that each call appends a line to (which process called: the tests prove every client kind logged in
through the callback): ``sub=etl calls=/tmp/calls.log lifetime_s=3600``.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time


def _b64(obj: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def unsecured_token(config_str: str) -> tuple[str, float, str]:
    """confluent-kafka's ``oauth_cb``: (an unsigned JWT for ``sub``, its expiry in epoch seconds, ``sub``)."""
    fields = dict(part.split("=", 1) for part in config_str.split() if "=" in part)
    now = time.time()
    expires = now + float(fields.get("lifetime_s", 3600))
    token = f"{_b64({'alg': 'none'})}.{_b64({'sub': fields['sub'], 'iat': int(now), 'exp': int(expires)})}."
    if fields.get("calls"):
        with open(fields["calls"], "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "argv0": sys.argv[0], "sub": fields["sub"]}) + "\n")
    return token, expires, fields["sub"]
