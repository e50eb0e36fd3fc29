"""The client side of HTTP authentication: the ``Authorization`` header a caller sends to the
schema registry or a worker's management API.

Why it is its own module: :mod:`app.security.http_auth` is the *server* side (Argon2id users
files, JWT verification, failure limits) and needs argon2-cffi and PyJWT. The client SDK, the
CLI and the console only ever build a header from credentials, so they import this module and
the client distribution (``prism-client``, docs/sdk.md) ships it without the server's
dependencies. ``http_auth`` re-exports these names, so existing imports keep working.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping


def basic_header(user: str, password: str) -> str:
    """The ``Authorization`` value clients send (CLI, SDK, tests)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def client_auth_header(*, user: str | None = None, password: str | None = None,
                       token: str | None = None) -> dict[str, str]:
    """Headers for a client given credentials (a token wins over user/password)."""
    if token:
        return {"Authorization": f"Bearer {token}"}
    if user:
        return {"Authorization": basic_header(user, password or "")}
    return {}


def client_auth_from_env(prefix: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Client headers from ``<prefix>_TOKEN`` or ``<prefix>_USER`` + ``<prefix>_PASSWORD``
    (``PRISM_REGISTRY`` for the registry, ``PRISM_ADMIN`` for a worker's management API)."""
    env = os.environ if env is None else env
    return client_auth_header(user=env.get(f"{prefix}_USER") or None, password=env.get(f"{prefix}_PASSWORD"),
                              token=env.get(f"{prefix}_TOKEN") or None)


__all__ = ["basic_header", "client_auth_from_env", "client_auth_header"]
