"""Helpers shared by the integration tests (imported, not a conftest: conftests are not modules to import)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.broker.embedded import BrokerBinaryNotFound, resolve_broker_binary


def require(ok: bool, reason: str) -> None:
    """Skip locally, but FAIL under CI=true: CI must never silently skip an integration test."""
    if ok:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"required for this integration test under CI=true: {reason}")
    pytest.skip(reason)


def require_broker_binary() -> Path:
    try:
        return resolve_broker_binary()
    except BrokerBinaryNotFound as exc:
        require(False, str(exc))
        raise  # unreachable: require() skipped or failed


# --------------------------------------------------------------------------- HTTP auth (registry, management API)

#: Test users: name -> (password, roles). Hashes use cheap Argon2 parameters (tests only).
USERS: dict[str, tuple[str, list[str]]] = {
    "admin": ("admin-password-1", ["admin"]),
    "alice": ("alice-password-1", ["admin"]),
    "bob": ("bob-password-12", ["admin"]),
    "writer": ("writer-password-1", ["write:orders."]),
    "reader": ("reader-password-1", ["read"]),
}
#: the console tests' admin may read (and replay) data of every classification; the other users
#: have the console's default clearance, internal (app/console/clearance.py)
ADMIN_CLEARED = {"admin": "restricted"}
FAST_ARGON2 = {"time_cost": 1, "memory_cost": 1024, "parallelism": 1}


def write_users_file(path: Path, users: dict[str, tuple[str, list[str]]] = USERS,
                     clearances: dict[str, str] | None = None) -> Path:
    """A users file (the registry's and the management API's format) for ``users``; with
    ``clearances``, those users' `clearance` (what the console shows them)."""
    import yaml

    from app.security.http_auth import hash_password

    doc = {"users": [{"user": u, "hash": hash_password(pw, **FAST_ARGON2), "roles": roles,
                      **({"clearance": (clearances or {})[u]} if u in (clearances or {}) else {})}
                     for u, (pw, roles) in users.items()]}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def creds(user: str) -> tuple[str, str]:
    """(user, password) of a test user, as httpx's ``auth=`` takes it."""
    return user, USERS[user][0]


def auth_headers(user: str) -> dict[str, str]:
    from app.security.http_auth import basic_header

    return {"Authorization": basic_header(*creds(user))}


def self_signed_cert(tmp: Path) -> tuple[Path, Path]:
    """(certificate, key) PEM files of a fresh self-signed certificate for 127.0.0.1."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    tmp.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = tmp / "cert.pem", tmp / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return certfile, keyfile


# --------------------------------------------------------------------------- headless Chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def headless_chromium(*flags: str) -> Iterator[Any]:
    """A headless Chromium WebDriver, quit afterwards: for a fixture to ``yield from``
    (scripts/ensure-test-deps.sh installs it; skipped without it, a failure under CI=true).
    ``flags``: Chromium flags besides the headless ones (``--window-size=W,H``)."""
    require(os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER),
            "chromium and chromedriver (Debian: chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *flags):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield drv
    drv.quit()


@contextlib.contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on a threading HTTP server at 127.0.0.1 (a free port) for the block: its base
    URL. For a test's stand-in of a server Prism talks to (a registry, a hostile address);
    stopped and joined on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


async def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset of each partition of ``topic`` as the broker has it (0 where
    none): asked by a consumer in the group that never joins it (``committed`` asks the
    coordinator), so the group's members are not disturbed."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        return {p: max(await reader.committed(TopicPartition(topic, p)) or 0, 0) for p in range(partitions)}
    finally:
        await reader.stop()
