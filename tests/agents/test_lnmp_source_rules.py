"""A source's LNMP rules (`sources[].lnmp`): strict or loose reading, and the known `source`
identifiers (LNMP spec v1 Appendix A, sections 9 and 9.1), through the normalize stage and the
chain's DLQ record."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.agents.chain import Chain, Outcome
from app.agents.normalize import Normalize
from app.errors import ConfigError
from app.formats import lnmp
from app.topology import LnmpSource, NormalizeStage, load_topology
from tests.agents.conftest import make_msg

ROOT = Path(__file__).resolve().parents[2]
#: The spec's Appendix A container as printed: metadata_length 31 for a 38-byte TLV chain.
APPENDIX_A = (b"LNMP\x01\x02\x80\x00" + bytes.fromhex("0000001F")
              + bytes.fromhex("100008") + bytes.fromhex("0000018C9A3B2F28")
              + bytes.fromhex("11000C") + b"auth-service" + bytes.fromhex("120009") + b"abc-123-x"
              + b"F12=14532\n")


def _chain(rules: LnmpSource | None) -> Chain:
    stage = Normalize(NormalizeStage(), namespaces={"orders.created": "order-events"},
                      formats={"orders.created": "auto"},
                      lnmp={"orders.created": rules} if rules is not None else None)
    return Chain([stage], dlq_topic_for=lambda t: t + ".dlq")


def _container(source: str) -> bytes:
    return lnmp.encode_container(lnmp.Container(record=b"F1=1\n", envelope=lnmp.LnmpEnvelope(
        timestamp=1732373147000, source=source)))


def test_appendix_a_is_refused_by_default_and_read_in_loose_mode() -> None:
    strict = _chain(None).run(make_msg(APPENDIX_A))
    assert strict.outcome is Outcome.DLQ and strict.reason == "bad_lnmp"
    msg = make_msg(APPENDIX_A)
    loose = _chain(LnmpSource(mode="loose")).run(msg)
    assert loose.outcome is Outcome.EMITTED
    env = msg.env
    assert env.published_at_ms == 1703394619176
    assert env.security.publisher_id == "auth-service"
    assert bytes(env.payload.value) == b"F12=14532\n"
    assert env.extensions["lnmp.trace_id"] == b"abc-123-x"


def test_an_unknown_source_goes_to_the_dlq_with_its_own_reason_path_and_hint() -> None:
    rules = LnmpSource(known_sources=["auth-service", "billing"])
    ok = _chain(rules).run(make_msg(_container("billing")))
    assert ok.outcome is Outcome.EMITTED
    bad = _chain(rules).run(make_msg(_container("intruder")))
    assert bad.outcome is Outcome.DLQ and bad.reason == "unknown_source" and bad.stage == "normalize"
    headers = dict(bad.dlq.headers)
    text = headers["prism.errors.exception.message"].decode()
    assert "'intruder'" in text and "lnmp.source" in text and "known_sources" in text
    assert headers["prism.errors.reason"] == b"unknown_source"


def test_the_source_check_also_covers_text_and_transport_headers_but_not_other_shapes() -> None:
    rules = LnmpSource(known_sources=["billing"])
    text = b"#ENVELOPE timestamp=1732373147000 source=intruder\nF1=1\n"
    assert _chain(rules).run(make_msg(text)).reason == "unknown_source"
    # the source only in the Kafka binding's header (the record's own envelope has none)
    bare = lnmp.encode_container(lnmp.Container(record=b"F1=1\n"))
    assert _chain(rules).run(make_msg(bare, [("lnmp.source", b"intruder")])).reason == "unknown_source"
    # no source at all: nothing is claimed, nothing to refuse
    assert _chain(rules).run(make_msg(bare)).outcome is Outcome.EMITTED
    # a Kafka-header producer's publisher-id is not an LNMP source: not this rule's business
    assert _chain(rules).run(make_msg(b"{}", [("publisher-id", b"intruder")])).outcome is Outcome.EMITTED


def _load(tmp_path: Path, source: dict) -> object:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["sources"][0].update(source)
    doc["sources"].append({"topic": "payments.captured", "format": "cloudevents",
                           "lnmp": {"mode": "sloppy", "known_sources": []}})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_topology(path)


def test_topology_lnmp_settings_are_parsed_and_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["sources"][0]["lnmp"] = {"mode": "loose", "known_sources": ["auth-service"]}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(doc))
    t = load_topology(path)
    assert t.sources[0].lnmp == LnmpSource(mode="loose", known_sources=["auth-service"])
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, {"lnmp": {"known_sources": ["a", "a", "bad\x01id"]}})
    text = str(err.value)
    assert "sources[0].lnmp.known_sources" in text and "control characters" in text
    assert "sources[1].lnmp.mode" in text and "sources[1].lnmp.known_sources: is an empty list" in text
    assert "problem(s)" in text


def test_lnmp_settings_on_a_source_that_never_reads_lnmp_are_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "topologies/orders-created.yaml").read_text())
    doc["sources"][0].update({"format": "cloudevents", "lnmp": {"mode": "loose"}})
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.lnmp: the source's format is 'cloudevents'"):
        load_topology(path)
