"""`metadata.producer_sdk_version` (memo-031 migration tracking): one number in both layouts,
carried across a layout change by both draft encoders, and counted by the worker under a
bounded label."""

from __future__ import annotations

from app._gen.prism.envelope.draft import envelope_pb2 as dpb
from app._gen.prism.envelope.v1 import envelope_pb2 as vpb
from app.envelope import Layout, decode, encode, new_envelope
from app.envelope.codec import draft_split, security_bytes, split_header
from app.envelope.layouts import draft_to_reviewed, reviewed_to_draft
from app.observability.metrics import MAX_SDK_VERSIONS, PipelineMetrics

VERSION = "prism-python/9.8.7"


def test_the_field_has_the_same_unused_number_in_both_layouts() -> None:
    draft = dpb.PrismMetadata.DESCRIPTOR.fields_by_name["producer_sdk_version"]
    reviewed = vpb.PrismMetadata.DESCRIPTOR.fields_by_name["producer_sdk_version"]
    assert draft.number == reviewed.number == 13
    # no other metadata field of either layout has that number
    for desc in (dpb.PrismMetadata.DESCRIPTOR, vpb.PrismMetadata.DESCRIPTOR):
        assert [f.name for f in desc.fields if f.number == 13] == ["producer_sdk_version"]


def test_it_survives_both_layouts_and_a_layout_change() -> None:
    env = new_envelope("orders.created", {"a": 1}, namespace="ns", producer_sdk_version=VERSION)
    assert env.producer_sdk_version == VERSION
    for layout in Layout:
        assert decode(encode(env, layout)).producer_sdk_version == VERSION
    draft, _ = reviewed_to_draft(env.header)
    assert draft.metadata.producer_sdk_version == VERSION
    back, dropped = draft_to_reviewed(draft)
    assert back.metadata.producer_sdk_version == VERSION and not dropped
    assert not new_envelope("t", b"x", namespace="ns").header.metadata.HasField("producer_sdk_version")


def test_the_fast_draft_encoder_writes_what_the_general_one_writes() -> None:
    env = new_envelope("orders.created", {"a": 1}, namespace="ns", producer_sdk_version=VERSION)
    env.ensure_security().publisher_id = "svc"  # draft_split needs a security context
    header = env.header
    fast = draft_split(header, split_header(header, Layout.REVIEWED)[0])
    assert fast is not None
    general = split_header(reviewed_to_draft(header, report=False)[0], Layout.DRAFT)
    assert (fast[0], security_bytes(fast[1], Layout.DRAFT)) == general
    assert VERSION.encode() in fast[0]


def test_the_metric_label_is_bounded_and_never_a_planted_value() -> None:
    m = PipelineMetrics()
    m.producer_sdk_output("orders.created", VERSION, 3)
    m.producer_sdk_output("orders.created", "", 2)
    m.producer_sdk_output("orders.created", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")  # a token: no '/'
    for i in range(MAX_SDK_VERSIONS + 4):
        m.producer_sdk_output("orders.created", f"prism-go/1.{i}.0")
    text = m.exposition().decode()
    assert f'prism_producer_sdk_outputs_total{{sdk_version="{VERSION}",topic="orders.created"}} 3.0' in text
    assert 'sdk_version="none",topic="orders.created"} 2.0' in text
    assert 'sdk_version="invalid",topic="orders.created"} 1.0' in text
    assert 'eyJ' not in text
    assert 'sdk_version="other",topic="orders.created"} 5.0' in text
    labels = {line.split('sdk_version="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("prism_producer_sdk_outputs_total{")}
    assert len(labels) == MAX_SDK_VERSIONS + 3  # the distinct versions, none, invalid, other
