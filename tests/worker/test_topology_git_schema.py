"""`registry_type: git` from a topology file, end to end without a broker.

The shipped topology with its enrich schema pointed at a local git repository (a path relative
to the topology, pinned by a tag): loaded by `load_topology`, resolved by `resolve_schema` and
run through the stage chain and publisher exactly as the worker builds them. The published
envelope carries the schema context of the tagged commit, not of the working tree. A topology
that lacks what its registry type needs, names a remote repository or an unknown registry
type fails at load with `bad_config`.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from app.agents.base import Message
from app.agents.chain import Chain, Outcome
from app.agents.publish import Publisher
from app.envelope import Layout, decode, encode, new_envelope
from app.errors import ConfigError
from app.security.devkeys import DevKeys
from app.security.signing import load_signing_keyring
from app.tables.dedup import DedupWindow
from app.topology import load_topology
from app.worker.pipeline import build_stages, resolve_schema
from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
PROTO = (ROOT / "topologies/schemas/order_created.proto").read_text()



@pytest.fixture(autouse=True)
def _git_installed() -> None:
    require(shutil.which("git") is not None, "the git command (registry_type git reads repositories with it)")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _write_topology(tmp_path: Path, keys: DevKeys, schema: dict) -> Path:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    suffix = uuid.uuid4().hex[:8]
    doc["name"] = f"t-{suffix}"
    doc["sources"][0]["topic"] = f"orders.created.{suffix}"
    for stage in doc["stages"]:
        if "authenticate" in stage:
            stage["authenticate"]["jwks"] = str(keys.jwks_path)
        if "verify_signature" in stage:
            stage["verify_signature"]["keyring"] = str(keys.signing_path)
        if "enrich" in stage:
            stage["enrich"]["schema"] = schema
    path = tmp_path / "pipelines" / "topology.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def schema_repo(tmp_path: Path) -> tuple[Path, str]:
    """A schema repository next to the topology: v2.0.0 tagged, then an unreleased edit."""
    repo = tmp_path / "schemas"
    (repo / "orders").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "orders/order_created.proto").write_text(PROTO)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "orders v2")
    _git(repo, "tag", "v2.0.0")
    tagged = _git(repo, "rev-parse", "HEAD")
    (repo / "orders/order_created.proto").write_text(PROTO.replace("package ", "// unreleased\npackage ", 1))
    _git(repo, "commit", "-qam", "unreleased")
    return repo, tagged


def test_git_schema_from_a_topology_reaches_the_published_envelope(
        tmp_path: Path, dev_keys: DevKeys, schema_repo: tuple[Path, str]) -> None:
    _, tagged = schema_repo
    path = _write_topology(tmp_path, dev_keys, {
        "registry_type": "git", "repository": "../schemas", "path": "orders/order_created.proto",
        "ref": "v2.0.0", "version": "v2", "message": "prism.examples.orders.OrderCreated"})
    topo = load_topology(path)
    schema = resolve_schema(topo.stage("enrich"), topo.base_dir)
    assert schema is not None and tagged in schema.url and schema.version == "v2"
    assert "OrderCreated.customer_email" in schema.pii_fields  # read from the tagged file's (prism.pii) option

    keyring = load_signing_keyring(dev_keys.signing_path)
    stages = build_stages(topo, keyring=keyring, schema=schema,
                          dedup_window=lambda window_s: DedupWindow({}, window=window_s))
    chain = Chain(stages, dlq_topic_for=lambda t: t + topo.dlq.topic_suffix)
    publisher = Publisher(topo, worker_key=keyring.signing[keyring.worker_key_id])
    topic = topo.sources[0].topic
    env = new_envelope(topic, {"order_id": "o-1"}, namespace="order-events")
    msg = Message(topic=topic, partition=0, offset=0, key=b"o-1", timestamp_ms=int(time.time() * 1000),
                  value=encode(env, Layout.REVIEWED), headers=[])
    result = chain.run(msg)
    assert result.outcome is Outcome.EMITTED, result
    [v3] = [e for e in publisher.emissions(msg) if e.topic == f"{topic}.v3"]
    ctx = decode(v3.record.value).header.schema
    assert ctx.schema_name == "prism.examples.orders.OrderCreated" and ctx.schema_version == "v2"
    assert tagged in ctx.schema_url and ctx.schema_hash == schema.hash


@pytest.mark.parametrize(("schema", "fragment"), [
    ({"registry_type": "git", "path": "orders/order_created.proto"}, "registry_type git needs repository"),
    ({"registry_type": "git", "repository": "../schemas"}, "registry_type git needs path"),
    ({"registry_type": "git", "repository": "https://github.com/acme/schemas", "path": "a.proto"},
     "only local git repositories"),
    ({"registry_type": "prism", "subject": "orders"}, "registry_type prism needs url"),
    ({"registry_type": "file", "path": "a.proto", "ref": "v1"}, "for registry_type git only"),
    ({"registry_type": "git", "repository": "../schemas", "path": "a.proto", "ref": "--output=/tmp/x"},
     "is not a tag, commit or branch name"),
    ({"registry_type": "github", "path": "a.proto"}, "'prism', 'confluent', 'file' or 'git'"),
])
def test_incomplete_or_unknown_registry_config_fails_at_load(
        tmp_path: Path, dev_keys: DevKeys, schema: dict, fragment: str) -> None:
    path = _write_topology(tmp_path, dev_keys, schema)
    with pytest.raises(ConfigError) as exc:
        load_topology(path)
    assert exc.value.code == "bad_config" and "stages" in str(exc.value) and fragment in str(exc.value)


def test_a_missing_tag_fails_at_start_up(tmp_path: Path, dev_keys: DevKeys, schema_repo: tuple[Path, str]) -> None:
    path = _write_topology(tmp_path, dev_keys, {
        "registry_type": "git", "repository": "../schemas", "path": "orders/order_created.proto", "ref": "v9"})
    topo = load_topology(path)
    with pytest.raises(ConfigError, match="cannot resolve the namespace schema: git rev-parse"):
        resolve_schema(topo.stage("enrich"), topo.base_dir)
