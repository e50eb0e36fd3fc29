"""Start-up resolution (prism, confluent, git, local), deprecated-field detection, assertions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from app.schema.assertion import SchemaAssertion, SchemaMismatchError
from app.schema.resolve import (
    GitSchemaSource,
    SchemaResolutionError,
    SchemaTampered,
    build_resolved,
    deprecated_fields_used,
    resolve_schema_config,
)
from tests.support import creds

ORDER = '''syntax = "proto3";
package orders.v1;
import "prism/annotations.proto";
message OrderCreated {
  string order_id = 1;
  string email = 2 [(prism.pii) = "email"];
  string legacy_ref = 3 [deprecated = true];
  Customer customer = 4;
  repeated Item items = 5;
  message Item { string sku = 1; int32 old_qty = 2 [deprecated = true]; }
}
message Customer { string id = 1; string fax = 2 [deprecated = true, (prism.pii) = "phone"]; }
'''


def _payload(**fields: object) -> bytes:
    from google.protobuf import descriptor_pool, message_factory

    from app.schema.protoparse import compile_proto

    pool = descriptor_pool.DescriptorPool()
    for f in compile_proto(ORDER).fds.file:
        pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("orders.v1.OrderCreated"))
    msg = cls()
    for k, v in fields.items():
        if k == "customer":
            msg.customer.id = "c1"
            msg.customer.fax = str(v)
        elif k == "items":
            for qty in v:  # type: ignore[attr-defined]
                it = msg.items.add()
                it.sku = "s"
                if qty:
                    it.old_qty = qty
        else:
            setattr(msg, k, v)
    return msg.SerializeToString()


def test_resolved_schema_fields_and_deprecated_walk() -> None:
    r = build_resolved(ORDER, "PROTOBUF", url="mem://orders", version="v2", compatibility="backward")
    assert r.name == "orders.v1.OrderCreated" and r.compatibility == "BACKWARD"
    assert r.contains_pii and r.pii_fields == ("Customer.fax", "OrderCreated.email")
    assert r.deprecated_fields == ("customer.fax", "items.old_qty", "legacy_ref")
    assert deprecated_fields_used(_payload(order_id="o1"), r) == []
    assert deprecated_fields_used(_payload(order_id="o1", legacy_ref="x"), r) == ["legacy_ref"]
    used = deprecated_fields_used(_payload(customer="555", items=[0, 3, 4]), r)
    assert used == ["customer.fax", "items.old_qty"]
    ctx = r.schema_context(used)
    assert ctx["schema_hash"].startswith("sha256:") and ctx["deprecated_fields_used"] == used
    assert deprecated_fields_used(b"\xff\xff", r) == []  # malformed: no crash


def test_resolve_from_prism_and_confluent_registry(live_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    live_server.registry.register("orders.created", ORDER, "PROTOBUF", label="v1", namespace="orders")
    live_server.registry.set_policy(actor="t", namespace="orders", compatibility="FULL")
    for var in ("PRISM_REGISTRY_USER", "PRISM_REGISTRY_PASSWORD", "PRISM_REGISTRY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SchemaResolutionError, match=r"HTTP 401.*PRISM_REGISTRY_USER"):
        resolve_schema_config({"registry_type": "prism", "registry_url": live_server.url, "subject": "orders.created"})
    user, password = creds("reader")  # credentials come from the environment, never the topology
    monkeypatch.setenv("PRISM_REGISTRY_USER", user)
    monkeypatch.setenv("PRISM_REGISTRY_PASSWORD", password)
    r = resolve_schema_config({"registry_type": "prism", "registry_url": live_server.url,
                               "subject": "orders.created", "version": "v1"})
    assert r.version == "v1" and r.compatibility == "FULL" and r.deprecated_fields
    c = resolve_schema_config({"registry_type": "confluent", "url": live_server.url,
                               "subject": "orders.created", "version": "latest"})
    assert c.hash == r.hash and c.version == "v1" and c.compatibility == "FULL"
    # a subject-level setting is what registrations apply: both registry types report it (the
    # prism one read the namespace's policy and said FULL)
    live_server.registry.set_policy(actor="t", subject="orders.created", compatibility="NONE")
    for kind in ("prism", "confluent"):
        got = resolve_schema_config({"registry_type": kind, "url": live_server.url, "subject": "orders.created"})
        assert got.compatibility == "NONE", kind
    with pytest.raises(SchemaTampered):
        resolve_schema_config({"registry_type": "confluent", "url": live_server.url, "subject": "orders.created",
                               "expected_hash": "sha256:" + "0" * 64})
    with pytest.raises(SchemaResolutionError):
        resolve_schema_config({"registry_type": "prism", "registry_url": live_server.url, "subject": "nope"})


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}).stdout.strip()


def test_git_tier_pinning_ttl_and_tamper_detection(tmp_path: Path) -> None:
    repo = tmp_path / "schemas"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "events").mkdir()
    f = repo / "events" / "orders.created.proto"
    f.write_text(ORDER)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "v1")
    _git(repo, "tag", "v1.0.0")
    first_commit = _git(repo, "rev-parse", "HEAD")
    f.write_text(ORDER.replace("string order_id = 1;", "string order_id = 1;\n  optional string note = 9;"))
    _git(repo, "commit", "-qam", "v2")
    src = GitSchemaSource(ttl=60)
    cfg = {"registry_type": "git", "repository": f"file://{repo}", "path": "events/orders.created.proto",
           "ref": "v1.0.0"}
    a = resolve_schema_config(cfg, git=src)
    b = resolve_schema_config(cfg, git=src)
    assert a.hash == b.hash and first_commit in a.url and (src.hits, src.misses) == (1, 1)
    head = resolve_schema_config({**cfg, "ref": "HEAD"}, git=src)
    assert head.hash != a.hash
    # moving the tag to other content is detected on the next load after the TTL
    src.ttl = 0
    _git(repo, "tag", "-f", "v1.0.0", "HEAD")
    with pytest.raises(SchemaTampered):
        resolve_schema_config(cfg, git=src)
    with pytest.raises(SchemaTampered):
        resolve_schema_config({**cfg, "ref": first_commit, "expected_hash": "sha256:" + "1" * 64}, git=GitSchemaSource())
    with pytest.raises(SchemaResolutionError):
        resolve_schema_config({**cfg, "repository": "https://github.com/x/y"}, git=src)


def test_local_file(tmp_path: Path) -> None:
    p = tmp_path / "reading.avsc"
    p.write_text('{"type":"record","name":"Reading","namespace":"iot","fields":[{"name":"client_ip","type":"string"}]}')
    r = resolve_schema_config({"registry_type": "local", "path": str(p), "version": "v1"})
    assert r.name == "iot.Reading" and r.pii_fields == ("Reading.client_ip",) and r.format.value == "AVRO"
    assert deprecated_fields_used(b"\x08\x01", r) == []


def test_consumer_assertion_modes(caplog: pytest.LogCaptureFixture) -> None:
    assert SchemaAssertion("v2", "error").check("2")
    with pytest.raises(SchemaMismatchError):
        SchemaAssertion("v2", "error", topic="orders.created").check("v1")
    warn = SchemaAssertion("v2", "warn")
    assert warn.check("v1") and warn.check("v1") and warn.mismatches == 2
    assert len([r for r in caplog.records if "unexpected schema version" in r.message]) == 1
    assert SchemaAssertion("v2", "ignore").check("v9")
    with pytest.raises(SchemaMismatchError):
        SchemaAssertion("v2", "error", expected_hash="sha256:a").check("v2", "sha256:b")


def test_git_ref_or_path_cannot_be_read_as_a_git_option(tmp_path: Path) -> None:
    for cfg in ({"ref": "--output=/tmp/prism-x"}, {"path": "--help.proto"}):
        with pytest.raises(SchemaResolutionError, match="may not start with '-'"):
            resolve_schema_config({"registry_type": "git", "repository": str(tmp_path), "path": "a.proto",
                                   "ref": "HEAD", **cfg}, git=GitSchemaSource())


def test_a_schema_file_is_read_bounded(tmp_path: Path) -> None:
    """`schema.path` naming /dev/zero (through a `.proto` symlink) was read with `read_text()`
    until memory ran out; a file that is not UTF-8 was a UnicodeDecodeError. Both are a
    SchemaResolutionError now, which `prism run` reports as its one error line."""
    import os

    big = tmp_path / "big.proto"
    with big.open("wb") as f:
        f.truncate(17 * 1024 * 1024)  # sparse, over the registry's 16 MiB
    (tmp_path / "bin.proto").write_bytes(b"\xff\xfe syntax")
    os.symlink("/dev/zero", tmp_path / "zero.proto")
    for name, why in (("big.proto", "over 16 MiB"), ("zero.proto", "over 16 MiB"), ("bin.proto", "not UTF-8")):
        with pytest.raises(SchemaResolutionError, match=why):
            resolve_schema_config({"registry_type": "file", "path": str(tmp_path / name)})
