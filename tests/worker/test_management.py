"""What the worker's management API serves about a topology (app/worker/management.py): the
routes' authorization is tests/worker/test_management_auth.py's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from app.topology import load_topology
from app.worker.management import topology_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_served_config_masks_passwords_in_sink_urls_and_dsns(tmp_path: Path) -> None:
    """GET /connectors/{name}/config (and /connectors/{name}) - open to anonymous readers by
    default - served the topology as written: a sink's `postgresql://app:S3cretPW@db/...` or
    `redis://:RedisPW@cache` in clear. Every password in a URL or DSN is masked; hosts stay."""
    path = tmp_path / "topology.yaml"
    path.write_text((ROOT / "topologies" / "orders-created.yaml").read_text() + """
sinks:
  - type: postgres
    name: db
    dsn: postgresql://app:S3cretPW@db.internal:5432/events
  - type: postgres
    name: kv
    dsn: "host=db.internal user=app password='Kv Secret' dbname=events"
  - type: redis-stream
    name: cache
    url: redis://:RedisPW@cache.internal:6379/0
  - type: nats
    name: js
    url: nats://nats.internal:4222
    stream: ORDERS
""", encoding="utf-8")
    observer = SimpleNamespace(pipeline=SimpleNamespace(topology=load_topology(path)))
    config = topology_config(observer)  # type: ignore[arg-type]
    text = json.dumps(config)
    for secret in ("S3cretPW", "Kv Secret", "RedisPW"):
        assert secret not in text, secret
    sinks = {s["name"]: s for s in json.loads(config["sinks"])}
    assert sinks["db"]["dsn"] == "postgresql://app:***@db.internal:5432/events"
    assert sinks["kv"]["dsn"] == "host=db.internal user=app password=*** dbname=events"
    assert sinks["cache"]["url"] == "redis://:***@cache.internal:6379/0"
    assert sinks["js"]["url"] == "nats://nats.internal:4222"
