"""Envelope evolution signals (RFC-031 "Backward Compatibility"): unknown fields of either
layout survive a layout change, a newer draft `envelope_version` is read best-effort, counted
and warned about once, and the fast draft encoder never drops what it cannot carry."""

from __future__ import annotations

import logging

import pytest

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.agents import normalize as normalize_mod
from app.agents.chain import Chain, Outcome
from app.agents.normalize import Normalize
from app.envelope import Layout, convert, decode, encode, new_envelope
from app.envelope.codec import draft_split, split_header
from app.envelope.layouts import PRODUCER_VERSION_EXT, draft_to_reviewed, reviewed_to_draft
from app.errors import DecodeError
from app.observability.metrics import PipelineMetrics
from app.topology import NormalizeStage
from tests.agents.conftest import make_msg

#: unknown records a newer producer adds: field 20 (string) and field 21 (varint)
NEW_TOP = b"\xa2\x01\x03top" + b"\xa8\x01\x07"
NEW_MD = b"\xa2\x01\x02md"
NEW_SEC = b"\xa2\x01\x03sec"
NEW_ENC = b"\xa2\x01\x03enc"


def _draft(version: int = 1) -> bytes:
    d = dpb.PrismEnvelope(envelope_version=version)
    d.metadata.message_id, d.metadata.topic, d.metadata.namespace = "m-1", "orders.created", "order-events"
    d.metadata.published_at.seconds = 1_700_000_000
    d.metadata.MergeFromString(NEW_MD)
    d.security.publisher_id = "svc-orders"
    d.security.MergeFromString(NEW_SEC)
    d.security.encryption.key_id, d.security.encryption.algorithm = "k1", "aes-256-gcm"
    d.security.encryption.MergeFromString(NEW_ENC)
    d.payload.value = b"{}"
    return d.SerializeToString() + NEW_TOP


def test_draft_unknown_fields_survive_draft_to_reviewed_to_draft_byte_for_byte() -> None:
    env = decode(_draft())
    ext = env.extensions
    assert ext["prism.unknown.draft"] == NEW_TOP
    assert ext["prism.unknown.draft.metadata"] == NEW_MD
    assert ext["prism.unknown.draft.security"] == NEW_SEC
    assert ext["prism.unknown.draft.security.encryption"] == NEW_ENC
    # the reviewed copy carries them as extensions, never on their numbers (they mean other things there)
    reviewed = vpb.PrismEnvelope.FromString(encode(env, Layout.REVIEWED))
    assert NEW_MD not in reviewed.metadata.SerializeToString()
    # back in the draft layout they are on their own numbers again, and the extensions are gone
    back = dpb.PrismEnvelope.FromString(encode(env, Layout.DRAFT))
    assert NEW_TOP in back.SerializeToString()
    assert back.metadata.SerializeToString().endswith(NEW_MD)
    assert back.security.SerializeToString().count(NEW_SEC) == 1
    assert back.security.encryption.SerializeToString().endswith(NEW_ENC)
    assert not [k for k in back.extensions if k.startswith("prism.unknown.")]


def test_reviewed_unknown_fields_survive_reviewed_to_draft_to_reviewed() -> None:
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events", data_classification="internal")
    env.header.MergeFromString(b"\xa2\x06\x02hi")  # field 100: unknown in the reviewed top level
    env.metadata.MergeFromString(NEW_MD)
    env.header.security.MergeFromString(NEW_SEC)
    draft, dropped = reviewed_to_draft(env.header)
    assert not [x for x in dropped if "unknown" in x]
    assert draft.extensions["prism.unknown.reviewed.metadata"] == NEW_MD
    again = decode(encode(env, Layout.DRAFT))
    assert again.metadata.SerializeToString().endswith(NEW_MD)
    assert again.header.security.SerializeToString().endswith(NEW_SEC)
    assert b"\xa2\x06\x02hi" in again.header.SerializeToString()
    assert not [k for k in again.extensions if k.startswith("prism.unknown.")]


def test_a_carried_extension_cannot_set_a_known_field() -> None:
    """`prism.unknown.*` is producer-writable: restoring only adds numbers the target does not
    know, so it cannot smuggle in, say, a classification (security field 8)."""
    d = dpb.PrismEnvelope.FromString(_draft())
    d.extensions["prism.unknown.reviewed.security"] = b"\x42\x06public" + NEW_SEC  # field 8 + an unknown one
    d.extensions["prism.unknown.reviewed.metadata"] = b"\xff\xff"  # malformed: kept as a plain extension
    v, _ = draft_to_reviewed(d)
    assert not v.security.HasField("data_classification")
    assert v.security.SerializeToString().endswith(NEW_SEC)
    assert v.extensions["prism.unknown.reviewed.metadata"] == b"\xff\xff"
    assert v.extensions["prism.unknown.reviewed.security"] == b"\x42\x06public"  # refused, kept, not dropped


@pytest.mark.parametrize("layout", list(Layout))
def test_a_known_field_with_the_wrong_wire_type_survives_a_layout_change(layout: Layout) -> None:
    """Protobuf keeps a known field written with another wire type as an unknown field; a
    layout change must carry it like any unknown field, not drop it (conformance/negative,
    "wire/security-as-varint"). Restoring it cannot set the field: its wire type is wrong."""
    sec_field = 4 if layout is Layout.DRAFT else 2
    mistyped = bytes([sec_field << 3]) + b"\x01"  # the security field as a varint
    data = encode(new_envelope("orders.created", {"a": 1}, namespace="order-events"), layout) + mistyped
    other = Layout.REVIEWED if layout is Layout.DRAFT else Layout.DRAFT
    there, _ = convert(data, other)
    wire = (vpb.PrismEnvelope if other is Layout.REVIEWED else dpb.PrismEnvelope).FromString(there)
    assert dict(wire.extensions) == {f"prism.unknown.{layout.value}": mistyped}  # carried in the other layout
    back, _ = convert(there, layout)
    assert mistyped in back and back == encode(decode(data), layout)  # put back on its number
    assert decode(back).security is None


def test_the_fast_draft_encoder_leaves_unknown_metadata_to_the_general_path() -> None:
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events", data_classification="internal")
    head, _ = split_header(env.header, Layout.REVIEWED)
    assert draft_split(env.header, head) is not None
    env.metadata.MergeFromString(NEW_MD)
    head, _ = split_header(env.header, Layout.REVIEWED)
    assert draft_split(env.header, head) is None
    draft = dpb.PrismEnvelope.FromString(encode(env, Layout.DRAFT))
    assert draft.extensions["prism.unknown.reviewed.metadata"] == NEW_MD  # carried, not dropped


def test_a_newer_envelope_version_is_read_best_effort_and_recorded() -> None:
    dropped: list[str] = []
    env = decode(_draft(version=3), dropped=dropped)
    assert env.message_id == "m-1" and env.security.publisher_id == "svc-orders"
    assert env.extensions[PRODUCER_VERSION_EXT] == b"3"
    assert any("newer than 1" in x and "best-effort" in x for x in dropped)
    # the worker writes the layout it knows
    assert dpb.PrismEnvelope.FromString(encode(env, Layout.DRAFT)).envelope_version == 1


def _normalize() -> Normalize:
    return Normalize(NormalizeStage(), namespaces={"orders.created": "order-events"},
                     formats={"orders.created": "auto"})


def test_newer_versions_are_counted_and_warned_about_once_per_version(caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(normalize_mod, "_WARNED_VERSIONS", set())
    stage = _normalize()
    chain = Chain([stage], dlq_topic_for=lambda t: t + ".dlq")
    with caplog.at_level(logging.WARNING, logger="prism.worker"):
        for i, version in enumerate((2, 2, 5, 1, 2)):
            assert chain.run(make_msg(_draft(version), offset=i)).outcome is Outcome.EMITTED
    warnings = [r for r in caplog.records if getattr(r, "event", "") == "envelope_version_newer"]
    assert sorted(r.version for r in warnings) == [2, 5]  # once per version, not per message
    assert "best-effort" in warnings[0].getMessage()
    assert stage.drain_newer_versions() == {2: 3, 5: 1}
    assert stage.drain_newer_versions() == {}
    metrics = PipelineMetrics()
    metrics.newer_envelope_version("orders.created", 2, 3)
    metrics.newer_envelope_version("orders.created", -1)
    text = metrics.exposition().decode()
    assert 'prism_envelope_version_newer_total{topic="orders.created",version="2"} 3.0' in text
    assert 'version="other"' in text


def test_the_number_of_distinct_versions_counted_is_bounded() -> None:
    stage = _normalize()
    chain = Chain([stage], dlq_topic_for=lambda t: t + ".dlq")
    for v in range(2, 2 + normalize_mod.MAX_VERSIONS + 5):
        chain.run(make_msg(_draft(v), offset=v))
    counts = stage.drain_newer_versions()
    assert len(counts) == normalize_mod.MAX_VERSIONS + 1 and counts[-1] == 5


def test_an_encryption_type_this_build_does_not_name_survives_the_draft_layout() -> None:
    """A reviewed producer's `encryption_type` from a newer enum (proto3 keeps the number): the
    draft encoder writes the number into `prism.enc.encryption_type` instead of raising
    ValueError (which crashed `.v2` publishing), and the draft decoder reads it back; a name
    no build knows stays a typed `DecodeError`."""
    env = new_envelope("orders.created", b"\x00" * 32, namespace="ns")
    enc = env.ensure_security().encryption
    enc.key_id, enc.algorithm, enc.encryption_type = "k1", "aes-256-gcm", 77
    wire = encode(env, Layout.DRAFT)
    assert dpb.PrismEnvelope.FromString(wire).extensions["prism.enc.encryption_type"] == b"77"
    assert decode(wire).header.security.encryption.encryption_type == 77
    enc.encryption_type = vpb.ENCRYPTION_TYPE_HYBRID
    wire = encode(env, Layout.DRAFT)
    assert dpb.PrismEnvelope.FromString(wire).extensions["prism.enc.encryption_type"] == b"ENCRYPTION_TYPE_HYBRID"
    assert decode(wire).header.security.encryption.encryption_type == vpb.ENCRYPTION_TYPE_HYBRID
    draft = dpb.PrismEnvelope.FromString(wire)
    draft.extensions["prism.enc.encryption_type"] = b"ENCRYPTION_TYPE_QUANTUM_FOAM"
    with pytest.raises(DecodeError, match="inconsistent"):
        decode(draft.SerializeToString())
