"""Fixtures for end-to-end pipeline tests on the real embedded broker.

Every test gets fresh topic names and a fresh app id (consumer group), so tests never see
each other's data or group state."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from app.security.devkeys import DevKeys, ensure_dev_keys
from app.topology import Topology, load_topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


def make_topology(tmp_path: Path, keys: DevKeys, *, partitions: int = 4, **overrides: object) -> Topology:
    """The shipped orders-created topology with fresh topic names and this test's keys."""
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    suffix = uuid.uuid4().hex[:8]
    doc["name"] = f"t-{suffix}"
    doc["sources"][0]["topic"] = f"orders.created.{suffix}"
    doc["sources"][0]["partitions"] = partitions
    for stage in doc["stages"]:
        if "authenticate" in stage:
            stage["authenticate"]["jwks"] = str(keys.jwks_path)
        if "verify_signature" in stage:
            stage["verify_signature"]["keyring"] = str(keys.signing_path)
        if "enrich" in stage:
            stage["enrich"]["schema"]["path"] = str(ROOT / "topologies/schemas/order_created.proto")
    doc.update(overrides)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)
