"""enrich with a real resolved schema: deprecated fields a payload sets, publish-time validation."""

import json
from pathlib import Path

import pytest

from app.agents.enrich import Enrich
from app.envelope import new_envelope
from app.errors import PayloadSchemaError
from app.topology import EnrichStage
from app.worker.pipeline import resolve_schema
from tests.agents.conftest import make_msg

ROOT = Path(__file__).resolve().parents[2]


def _stage(tmp_path: Path, schema: dict, validate: bool) -> Enrich:
    settings = EnrichStage.model_validate({"trace": False, "schema": {**schema, "validate_payloads": validate}})
    return Enrich(trace=False, schema=resolve_schema(settings, tmp_path))


def _msg(payload, **kw):
    msg = make_msg(b"")
    msg.envelope = new_envelope("orders.created", payload, namespace="order-events", **kw)
    return msg


def _order_class(stage: Enrich):
    from google.protobuf import descriptor_pool, message_factory

    from app.schema.protoparse import compile_proto

    pool = descriptor_pool.DescriptorPool()
    for fd in compile_proto(stage.schema.resolved.schema_text).fds.file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prism.examples.orders.OrderCreated"))


PROTO = {"registry_type": "file", "path": str(ROOT / "topologies/schemas/order_created.proto"),
         "message": "prism.examples.orders.OrderCreated", "version": "v2"}


def test_schema_context_pii_and_deprecated_fields_used(tmp_path: Path) -> None:
    stage = _stage(tmp_path, PROTO, validate=False)
    order_cls = _order_class(stage)
    msg = _msg(b"", content_type="application/protobuf")
    msg.envelope.payload = type(msg.envelope.payload)(order_cls(order_id="o-1", legacy_channel="fax").SerializeToString())
    stage.process(msg)
    sc = msg.env.schema
    assert sc.schema_name == "prism.examples.orders.OrderCreated" and sc.schema_hash.startswith("sha256:")
    assert list(sc.deprecated_fields_used) == ["legacy_channel"]
    assert msg.env.security.contains_pii  # customer_email is tagged (prism.pii)
    clean = _msg(b"", content_type="application/protobuf")
    clean.envelope.payload = type(clean.envelope.payload)(order_cls(order_id="o-2").SerializeToString())
    stage.process(clean)
    assert list(clean.env.schema.deprecated_fields_used) == []


def test_validate_payloads_protobuf(tmp_path: Path) -> None:
    stage = _stage(tmp_path, PROTO, validate=True)
    bad = _msg(b"", content_type="application/protobuf")
    bad.envelope.payload = type(bad.envelope.payload)(b"\x0a\x05ab")  # truncated string field
    with pytest.raises(PayloadSchemaError, match=r"not a valid prism\.examples\.orders\.OrderCreated"):
        stage.process(bad)


def test_validate_payloads_json_schema(tmp_path: Path) -> None:
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Order", "type": "object",
              "required": ["order_id"], "properties": {"order_id": {"type": "string"}, "total": {"type": "number"}}}
    path = tmp_path / "order.json"
    path.write_text(json.dumps(schema))
    stage = _stage(tmp_path, {"registry_type": "file", "path": str(path), "version": "v1"}, validate=True)
    stage.process(_msg({"order_id": "o-1", "total": 3.5}))
    with pytest.raises(PayloadSchemaError) as e:
        stage.process(_msg({"total": "three"}))
    assert "order_id" in str(e.value) and "total" in str(e.value) and e.value.code == "payload_schema_mismatch"
