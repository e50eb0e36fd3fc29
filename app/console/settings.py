"""What the console connects to, and as whom (module docs of :mod:`app.console`)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.errors import ConfigError, ConfigProblems, PrismError
from app.security.http_auth import HttpAuth, client_auth_from_env
from app.security.http_limits import HttpLimits

#: The console's own users: the registry's users-file format (Argon2id hashes, roles).
#: The largest request body the console reads: one of its forms (the log-in, a replay, an approval).
MAX_FORM_BYTES = 16 * 1024
ENV_USERS_FILE = "PRISM_CONSOLE_USERS_FILE"
ENV_JWT_CONFIG = "PRISM_CONSOLE_JWT_CONFIG"
ENV_REGISTRY_URL = "PRISM_CONSOLE_REGISTRY_URL"
ENV_WORKER_URLS = "PRISM_CONSOLE_WORKER_URLS"
#: CA files for HTTPS back ends (the worker one is the one `prism status` reads).
ENV_REGISTRY_CAFILE = "PRISM_REGISTRY_CAFILE"
ENV_ADMIN_CAFILE = "PRISM_ADMIN_CAFILE"
#: the keyring holding the console's audit signing key, and that key's id
ENV_AUDIT_KEYRING = "PRISM_CONSOLE_AUDIT_KEYRING"
ENV_AUDIT_KEY = "PRISM_CONSOLE_AUDIT_KEY"
ENV_AUDIT_TOPIC = "PRISM_CONSOLE_AUDIT_TOPIC"


def audit_key(keyring_path: str | None, key_id: str | None) -> tuple[Any, str]:
    """(signing key, principal) of the console's audit records: key ``key_id`` of the signing
    keyring at ``keyring_path``, which must hold its secret and bind it to a principal
    (``publisher_id``) - else `prism audit --keyring` could not verify who wrote the records.
    Neither given: (None, "prism-console"), unsigned records."""
    if not keyring_path and not key_id:
        return None, "prism-console"
    if not keyring_path or not key_id:
        raise ConfigError("--audit-keyring and --audit-key go together", path="--audit-key",
                          hint="the keyring file and the id of the console's key in it")
    from app.security.signing import load_signing_keyring

    ring = load_signing_keyring(keyring_path)
    key = ring.signing.get(key_id)
    if key is None:
        raise ConfigError(f"the keyring holds no signing key {key_id!r} (a key with its secret)", path=keyring_path,
                          hint=f"keys with secrets: {sorted(ring.signing)[:10]}")
    owner = ring.publishers.get(key_id)
    if owner is None:
        raise ConfigError(f"key {key_id!r} is bound to no principal", path=keyring_path,
                          hint="add `publisher_id: prism-console` (the name the audit records give) to the key")
    return key, owner.publisher_id


def _url(value: str, where: str) -> str:
    """A back end's http(s) URL, checked when the console starts: one urllib cannot parse
    (`http://[::1`, a port that is no number) was a `ValueError` traceback at start-up, and one
    with a space or a control character in it (`http://no such`) started a console whose every
    page then failed."""
    text = value.strip().rstrip("/")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigError(f"{value!r} holds a space or a control character", path=where,
                          hint="e.g. http://127.0.0.1:8081")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - a port that is no number or out of range raises here
    except ValueError as exc:
        raise ConfigError(f"{value!r} is not a usable URL: {exc}", path=where, hint="e.g. http://127.0.0.1:8081") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{value!r} is not an http(s) URL", path=where, hint="e.g. http://127.0.0.1:8081")
    if parts.username or parts.password:
        raise ConfigError(f"{where} carries credentials in the URL", path=where,
                          hint="put them in PRISM_REGISTRY_USER/_PASSWORD or PRISM_ADMIN_USER/_PASSWORD instead")
    return text


def split_urls(values: Sequence[str], where: str) -> list[str]:
    """``--worker`` values, each possibly a comma-separated list, as checked URLs (order kept,
    duplicates dropped)."""
    out: list[str] = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                u = _url(part, where)
                if u not in out:
                    out.append(u)
    return out


def _ssl_context(cafile: str | None, where: str) -> ssl.SSLContext | None:
    if not cafile:
        return None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA file: {exc}", path=where, hint="a PEM file of the CA that signed the "
                                                                          "server's certificate") from None


@dataclass(frozen=True)
class ConsoleSettings:
    """Everything the console needs besides its own users (``auth``).

    ``registry_headers``/``worker_headers`` are the console's credentials for the back ends:
    sent server-side only, never rendered. ``bootstrap``/``broker_settings``: the Kafka cluster
    holding the DLQ topics (None: the DLQ pages say that no broker is configured)."""

    auth: HttpAuth
    registry_url: str | None = None
    worker_urls: tuple[str, ...] = ()
    registry_headers: Mapping[str, str] = field(default_factory=dict)
    worker_headers: Mapping[str, str] = field(default_factory=dict)
    registry_ssl: ssl.SSLContext | None = None
    worker_ssl: ssl.SSLContext | None = None
    bootstrap: str | None = None
    broker_settings: Any = None
    #: seconds a log-in lasts without a request, and at most
    idle_timeout_s: float = 8 * 3600
    max_session_s: float = 24 * 3600
    #: seconds between the two /metrics scrapes a rate is computed from
    rate_interval_s: float = 1.0
    #: records read from the end of each output partition when looking for a replayed record
    trace_window: int = 20_000
    #: what one DLQ page view reads at most, over all the DLQ topics it shows: offsets (the newest,
    #: below the page's cursor) and bytes of keys, values and headers kept (app/cli/dlq.py
    #: `read_window`); the page says how far it looked and links to the older records
    dlq_window_records: int = 5000
    dlq_window_bytes: int = 16 << 20
    #: what every request may be (app.security.http_limits; the body: one form, MAX_FORM_BYTES)
    http_limits: HttpLimits = field(default_factory=lambda: HttpLimits(max_body_bytes=MAX_FORM_BYTES))
    #: the audit records of withheld DLQ views (app/console/clearance.py): signed with this key
    #: (an app.security.signing.SigningKey; None: unsigned), naming this principal - the key's
    #: `publisher_id` in the keyring `prism audit --keyring` verifies with - on this topic
    audit_signing_key: Any = None
    audit_principal: str = "prism-console"
    audit_topic: str = "prism.audit"

    @classmethod
    def from_env(cls, auth: HttpAuth, *, registry_url: str | None = None, worker_urls: Sequence[str] = (),
                 bootstrap: str | None = None, broker_settings: Any = None,
                 env: Mapping[str, str] | None = None) -> ConsoleSettings:
        """Back-end credentials and CA files from the variables the CLI already reads:
        ``PRISM_REGISTRY_USER``/``_PASSWORD``/``_TOKEN`` (+ ``PRISM_REGISTRY_CAFILE``) and
        ``PRISM_ADMIN_USER``/``_PASSWORD``/``_TOKEN`` (+ ``PRISM_ADMIN_CAFILE``)."""
        env = os.environ if env is None else env
        reg = registry_url or env.get(ENV_REGISTRY_URL) or None
        workers = list(worker_urls) or [env.get(ENV_WORKER_URLS, "")]
        # Every setting checked, every problem reported at once: a bad worker URL hid a bad CA file
        # and a bad audit keyring until the next start.
        problems: list[PrismError] = []

        def check(fn: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ConfigProblems as exc:
                problems.extend(exc.problems)
            except PrismError as exc:
                problems.append(exc)
            return None

        values = {
            "registry_url": check(_url, reg, "--registry") if reg else None,
            "worker_urls": tuple(check(split_urls, workers, "--worker") or ()),
            "registry_headers": check(client_auth_from_env, "PRISM_REGISTRY", env) or {},
            "worker_headers": check(client_auth_from_env, "PRISM_ADMIN", env) or {},
            "registry_ssl": check(_ssl_context, env.get(ENV_REGISTRY_CAFILE), ENV_REGISTRY_CAFILE),
            "worker_ssl": check(_ssl_context, env.get(ENV_ADMIN_CAFILE), ENV_ADMIN_CAFILE),
            "http_limits": check(HttpLimits.from_env, env, max_body_bytes=MAX_FORM_BYTES),
            **(check(_audit_settings, env) or {}),
        }
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise ConfigProblems("; ".join(str(p) for p in problems), problems,  # type: ignore[arg-type]
                                 summary=f"{len(problems)} configuration problems; the console did not start")
        return cls(auth=auth, bootstrap=bootstrap, broker_settings=broker_settings, **values)


def _audit_settings(env: Mapping[str, str]) -> dict[str, Any]:
    key, principal = audit_key(env.get(ENV_AUDIT_KEYRING) or None, env.get(ENV_AUDIT_KEY) or None)
    topic = (env.get(ENV_AUDIT_TOPIC) or "prism.audit").strip()
    return {"audit_signing_key": key, "audit_principal": principal, "audit_topic": topic}


def templates_dir() -> Path:
    return Path(__file__).parent / "templates"


def static_dir() -> Path:
    return Path(__file__).parent / "static"
