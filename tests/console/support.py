"""Shared by the console tests: a real uvicorn server in a thread, the registry the console
reads (subjects under BACKWARD and FULL), and its users (tests/support.py's)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.console import ConsoleSettings
from app.schema.registry import Registry
from app.schema.store import SqliteStore
from app.security.http_auth import FailureLimiter, HttpAuth, auth_from_settings
from tests.support import auth_headers

XSS = "<script>alert(1)</script>"

#: v1 -> v2 drops a field without a default: a v2 reader reads v1 data (BACKWARD holds), a v1
#: reader of v2 data misses `coupon` (FORWARD, and so FULL, breaks). Compact one-line Avro, as
#: Confluent clients send it.
AVRO_V1 = json.dumps({"type": "record", "name": "Order", "doc": f"orders {XSS}", "fields": [
    {"name": "id", "type": "string"}, {"name": "coupon", "type": "string"}]}, separators=(",", ":"))
AVRO_V2 = json.dumps({"type": "record", "name": "Order", "doc": f"orders {XSS}", "fields": [
    {"name": "id", "type": "string"}]}, separators=(",", ":"))
BACKWARD_SUBJECT = "orders.backward-value"
FULL_SUBJECT = "orders.full-value"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` on a real uvicorn server (a thread, a free loopback port); yields its URL."""
    import uvicorn

    port = free_port()
    from app.security.http_limits import HttpLimits, uvicorn_config

    # The production HTTP stack: the limited protocol of app.security.http_limits.
    server = uvicorn.Server(uvicorn_config(app, HttpLimits(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.time() + 15
    while not server.started:
        if time.time() > deadline or not t.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(timeout=10)


def make_auth(users_file: Path, realm: str) -> HttpAuth:
    auth = auth_from_settings(users_file=users_file, jwt_config=None, allow_anonymous=None, realm=realm,
                              where="tests")
    auth.limiter = FailureLimiter(10_000, 60)  # the tests' deliberate failures must not lock each other out
    return auth


def seeded_registry(path: Path) -> Registry:
    """Two subjects with the same two versions, registered under BACKWARD; then one is set to FULL
    (as an operator would tighten it) - so the same pair is compatible under one and not the other."""
    reg = Registry(SqliteStore(str(path)))
    for subject in (BACKWARD_SUBJECT, FULL_SUBJECT):
        reg.register(subject, AVRO_V1, "AVRO", namespace="orders", label="v1")
        reg.register(subject, AVRO_V2, "AVRO", namespace="orders", label="v2")
    reg.set_policy(actor="tests", subject=BACKWARD_SUBJECT, compatibility="BACKWARD")
    reg.set_policy(actor="tests", subject=FULL_SUBJECT, compatibility="FULL")
    return reg


@contextlib.contextmanager
def registry_server(tmp: Path, users_file: Path) -> Iterator[tuple[str, Registry]]:
    from app.schema.service import create_app

    reg = seeded_registry(tmp / "registry.db")
    with serve(create_app(reg, auth=make_auth(users_file, "prism-schema-registry"))) as url:
        yield url, reg


def console_settings(users_file: Path, *, registry_url: str | None, worker_urls: tuple[str, ...] = (),
                     bootstrap: str | None = None, registry_user: str = "admin",
                     worker_user: str = "reader") -> ConsoleSettings:
    """The console's settings: its own users, and its own credentials for each back end."""
    return ConsoleSettings(auth=make_auth(users_file, "prism-console"), registry_url=registry_url,
                           worker_urls=worker_urls, registry_headers=auth_headers(registry_user),
                           worker_headers=auth_headers(worker_user), bootstrap=bootstrap, rate_interval_s=0.5)


def patch_dlq(monkeypatch: Any, records: Callable[[], list[Any]]) -> None:
    """The console's DLQ reads (``Kafka.dlq_window``, ``Kafka.dlq_record``) over the records
    ``records()`` returns, in memory: each source's whole DLQ as one window, nothing older."""
    from app.cli.dlq import PartitionWindow, Window
    from app.console.backends import Kafka

    async def window(self: Kafka, topology: Any, source: str | None = None,
                     before: dict[int, int] | None = None) -> list[Any]:
        out = []
        for s in topology.sources:
            if source is not None and s.topic != source:
                continue
            topic = s.topic + topology.dlq.topic_suffix
            recs = [r for r in records() if r.topic == topic]
            ends = {p: 1 + max((r.offset for r in recs if r.partition == p), default=-1) for p in range(s.partitions)}
            out.append(Window(topic, recs, [PartitionWindow(p, 0, e, e, 0) for p, e in ends.items()]))
        return out

    async def record(self: Kafka, topology: Any, source: str, partition: int, offset: int) -> Any | None:
        topic = source + topology.dlq.topic_suffix
        return next((r for r in records() if (r.topic, r.partition, r.offset) == (topic, partition, offset)), None)

    monkeypatch.setattr(Kafka, "dlq_window", window)
    monkeypatch.setattr(Kafka, "dlq_record", record)
