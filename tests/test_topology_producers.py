"""app/topology.py: the source-topic aliases and the `producers:` section are validated at load,
every problem reported as bad_config naming the key path, what is wrong and how to fix it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.errors import ConfigError
from app.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]

BASE: dict[str, Any] = {
    "name": "t", "namespace": "order-events",
    "sources": [{"topic": "orders.created"}, {"topic": "orders.updated"}],
    "stages": ["normalize", {"authenticate": {"jwks": "jwks.json", "policy": "optional"}},
               {"verify_signature": {"keyring": "signing.json"}}],
    "outputs": {"sign": False},
}


def _load(tmp_path: Path, **changes: Any):
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}))
    return load_topology(path)


def _error(tmp_path: Path, **changes: Any) -> str:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, **changes)
    assert e.value.code == "bad_config" and "fix:" in str(e.value)
    return str(e.value)


def test_the_shipped_topology_declares_its_producers() -> None:
    topo = load_topology(ROOT / "topologies/orders-created.yaml")
    assert topo.producers
    assert all(p.namespaces == [topo.namespace] for p in topo.producers)
    assert any(p.key_ids for p in topo.producers) and any(p.anonymous for p in topo.producers)


def test_no_producers_section_is_the_documented_default(tmp_path: Path) -> None:
    topo = _load(tmp_path)
    assert topo.producers is None
    assert topo.accepted_topics() == {"orders.created": {"orders.created"}, "orders.updated": {"orders.updated"}}


def test_a_full_producers_section(tmp_path: Path) -> None:
    topo = _load(tmp_path, producers=[
        {"name": "orders", "principals": ["svc-orders", "svc-orders-*"], "key_ids": ["k1"],
         "namespaces": ["order-events"], "topics": ["orders.created"]},
        {"anonymous": True, "namespaces": ["order-events"]}])
    a, b = topo.producers
    assert a.principals == ["svc-orders", "svc-orders-*"] and a.topics == ["orders.created"]
    assert b.anonymous and b.topics is None and b.principals is None


@pytest.mark.parametrize(("pattern", "why"), [
    ("", "not a principal pattern"),
    ("svc orders", "not a principal pattern"),
    ("svc-\u00e9", "not a principal pattern"),
    ("svc-\x1b[0m", "not a principal pattern"),
    ("x" * 257, "not a principal pattern"),
    ("svc-?", "only `*` is a wildcard"),
    ("svc-[ab]", "only `*` is a wildcard"),
    ("svc-**", "write one `*`"),
])
def test_bad_principal_patterns(tmp_path: Path, pattern: str, why: str) -> None:
    text = _error(tmp_path, producers=[{"principals": [pattern], "namespaces": ["order-events"]}])
    assert "producers[0].principals" in text and why in text


@pytest.mark.parametrize(("field", "why"), [
    ("principals", "empty list"), ("key_ids", "empty list"), ("namespaces", "empty list"), ("topics", "empty list"),
])
def test_empty_lists_are_refused(tmp_path: Path, field: str, why: str) -> None:
    entry: dict[str, Any] = {"principals": ["svc-orders"], "namespaces": ["order-events"], field: []}
    text = _error(tmp_path, producers=[entry])
    assert f"producers[0].{field}" in text and why in text


def test_an_empty_section_is_refused(tmp_path: Path) -> None:
    assert "would reject every message" in _error(tmp_path, producers=[])


def test_an_entry_for_nobody_is_refused(tmp_path: Path) -> None:
    text = _error(tmp_path, producers=[{"namespaces": ["order-events"]}])
    assert "principals, key_ids, or anonymous: true" in text


@pytest.mark.parametrize(("entry", "where", "why"), [
    ({"principals": ["a"], "namespaces": ["order-events"], "subjects": ["x"]}, "producers[0].subjects",
     "unknown key"),
    ({"principals": ["a"]}, "producers[0].namespaces", "required, and missing"),
    ({"principals": ["a"], "namespaces": ["order-*"]}, "producers[0].namespaces", "not a namespace name"),
    ({"principals": ["a"], "namespaces": ["a b"]}, "producers[0].namespaces", "not a namespace name"),
    ({"principals": ["a", "a"], "namespaces": ["n"]}, "producers[0].principals", "more than once"),
    ({"key_ids": ["k-*"], "namespaces": ["n"]}, "producers[0].key_ids", "not a key id"),
    ({"key_ids": ["k 1"], "namespaces": ["n"]}, "producers[0].key_ids", "not a key id"),
    ({"principals": "svc-orders", "namespaces": ["n"]}, "producers[0].principals", "should be a list"),
    ({"principals": ["a"], "namespaces": ["n"], "topics": ["bad topic"]}, "producers[0].topics",
     "'bad topic' is not allowed here: use letters, digits, '.', '_' and '-' (a Kafka topic name)"),
    ({"principals": ["a"], "namespaces": ["n"], "anonymous": "maybe"}, "producers[0].anonymous", "should be true or false"),
])
def test_unknown_keys_and_bad_values_name_the_key(tmp_path: Path, entry: dict, where: str, why: str) -> None:
    text = _error(tmp_path, producers=[entry])
    assert where in text and why in text, text


def test_topics_must_be_sources_of_this_topology(tmp_path: Path) -> None:
    text = _error(tmp_path, producers=[{"principals": ["a"], "namespaces": ["n"], "topics": ["payments.captured"]}])
    assert "producers[0].topics: ['payments.captured'] are not source topics" in text


def test_producers_need_the_stages_that_check_them(tmp_path: Path) -> None:
    text = _error(tmp_path, stages=["normalize"],
                  producers=[{"principals": ["a"], "key_ids": ["k"], "namespaces": ["n"]}])
    assert "needs the authenticate stage" in text and "producers[0].key_ids: needs the verify_signature stage" in text


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = _error(tmp_path, producers=[{"principals": ["svc-?"], "namespaces": ["n"]},
                                       {"key_ids": [], "namespaces": []}])
    assert "producers[0].principals" in text and "producers[1].key_ids" in text and "producers[1].namespaces" in text


@pytest.mark.parametrize(("aliases", "why"), [
    (["orders.created"], "is the source topic itself"),
    (["orders.new", "orders.new"], "listed twice"),
    (["orders.updated"], "are other sources of this topology"),
    (["bad topic"], "is not allowed here: use letters, digits"),
])
def test_topic_aliases(tmp_path: Path, aliases: list[str], why: str) -> None:
    sources = [{"topic": "orders.created", "topic_aliases": aliases}, {"topic": "orders.updated"}]
    assert why in _error(tmp_path, sources=sources)


def test_a_good_alias(tmp_path: Path) -> None:
    topo = _load(tmp_path, sources=[{"topic": "orders.created", "topic_aliases": ["orders.new"]}])
    assert topo.accepted_topics() == {"orders.created": {"orders.created", "orders.new"}}


def test_a_source_topic_listed_twice_is_refused(tmp_path: Path) -> None:
    assert "listed twice" in _error(tmp_path, sources=[{"topic": "a"}, {"topic": "a"}])


def test_producers_need_their_stages_switched_on(tmp_path: Path) -> None:
    text = _error(tmp_path, stages=["normalize", {"authenticate": {"jwks": "j.json", "policy": "off"}},
                                    {"verify_signature": {"keyring": "k.json", "policy": "off"}}],
                  producers=[{"principals": ["a"], "key_ids": ["k"], "namespaces": ["n"]}])
    assert "producers[0].key_ids: verify_signature.policy is off" in text
    assert "producers[0].principals: authenticate.policy is off" in text
    _load(tmp_path, stages=["normalize", {"authenticate": {"jwks": "j.json", "policy": "off"}}],
          producers=[{"anonymous": True, "namespaces": ["n"]}])  # off + anonymous-only is coherent
