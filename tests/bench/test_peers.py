"""The peers benchmark compares frameworks, not workloads: every peer gets the document Prism's
inputs carry and applies the one shared transform (bench/bench_peers.py, bench/_peer_procs.py).
No timing here - the benchmark itself measures."""

from __future__ import annotations

import json
from types import CodeType

from app.envelope import new_envelope
from bench import _peer_procs
from bench.bench_peers import expected_identities, peer_identity, peer_value
from bench.bench_pipeline import payload_1kb


def _names(code: CodeType) -> set[str]:
    """Global names a function's code uses, nested functions (the Faust agent) included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _names(const)
    return names


def test_peers_get_prisms_payload_and_the_transform_bumps_one_field() -> None:
    for i in (0, 7, 19_999):
        value = peer_value(i)
        # byte for byte the document inside Prism's input envelope i (~1 KB)
        assert value == bytes(new_envelope("t", payload_1kb(i), namespace="order-events").payload.value)
        assert 950 <= len(value) <= 1050
        out = json.loads(_peer_procs.transform(value))
        expected = payload_1kb(i)
        expected["items"][0]["qty"] += 1
        assert out == expected
        assert peer_identity(_peer_procs.transform(value)) == payload_1kb(i)["order_id"]
    prism_ids, peer_ids = expected_identities(3)
    assert len(prism_ids) == len(peer_ids) == 3


def test_every_peer_runner_applies_the_shared_transform() -> None:
    runners = {"aiokafka": _peer_procs.run_aiokafka, "confluent": _peer_procs.run_confluent,
               "faust-tuned": _peer_procs.run_faust, "quix": _peer_procs.run_quix}
    assert set(runners) == set(_peer_procs.PEERS)
    for label, fn in runners.items():
        assert "transform" in _names(fn.__code__), label
