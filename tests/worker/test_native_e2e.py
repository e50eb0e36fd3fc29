"""The worker's outputs are the same bytes with and without the compiled hot path
(app/native.py): one topology, one input topic of well-formed, signed, forged, truncated and
non-envelope records, read by two workers one after the other (two consumer groups) - the
first with `prism_native`, the second with the pure-Python walk put back in every module that
uses it and the pure-Python security-record check, signed message, HMAC check and both
layouts' copies with their digests (`_pair_copies`, the `.v2` head from the `.v3` bytes) in
`signing`, and aiokafka's key hash in `batch_send`.
Every output and DLQ record (key, value, headers) of the second run must equal the first's.
The outputs are signed with scope `pair`, so a record's bytes do not depend on how the worker
happened to batch (a batch-scope tree does, in any two runs of the same code).
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.partitioner import murmur2 as py_murmur2

from app import native
from app.envelope import Layout, encode, new_envelope, wire
from app.observability import tracecontext
from app.security import signing
from app.security.signing import SigningKey, sign
from app.topology import load_topology
from app.worker import batch_send
from tests.support import require
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


def _inputs(topic: str, dev_keys: Any) -> list[tuple[bytes, bytes | None]]:
    real = dev_keys.keyring.signing["dev-producer-1"]

    def fresh(n: int):
        return new_envelope(topic, {"order_id": n, "amount": 100 + n}, namespace="order-events")

    good = sign(fresh(1), real)
    with_token = fresh(2)
    with_token.ensure_security().auth_token = dev_keys.mint_token("svc-orders")
    tampered = bytearray(sign(fresh(3), real))
    tampered[-1] ^= 0x01
    values = [
        good,
        sign(fresh(4), real, Layout.DRAFT),
        encode(with_token),
        encode(fresh(5), Layout.DRAFT),
        bytes(tampered),  # forged: the DLQ
        sign(fresh(6), SigningKey.hmac_sha256("stolen-key", b"y" * 32)),  # unknown key: the DLQ
        good[: len(good) - 7],  # truncated: malformed
        b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # a length past 2**64: malformed
        b"\x0b\x0c",  # a group at the top level
        json.dumps({"order_id": 7, "amount": 1}).encode(),  # plain JSON: wrapped
    ]  # (no duplicate: whether the second worker's dedup stage counts one does not depend on the walk,
    # but on which partition and batch it lands in - two runs of the same code differ there)
    return [(v, f"k{i}".encode()) for i, v in enumerate(values)]


def _python_walk_everywhere(monkeypatch: pytest.MonkeyPatch) -> int:
    """Put the pure-Python `scan` back wherever the compiled one was imported by name, and the
    pure-Python security-record check, signed message, HMAC check and pair copies into
    `signing` - and take away the compiled record span `verify` uses with a parsed context
    (`_verify_parsed`), as a build without the module has none: its compiled path hands the
    signed-message step no records, which only the compiled step reads that way."""
    patched, compiled = 0, wire.scan
    for mod in list(sys.modules.values()):
        if mod is not None and getattr(mod, "scan", None) is compiled and mod.__name__.startswith("app."):
            monkeypatch.setattr(mod, "scan", wire._py_scan)
            patched += 1
    assert signing._security_record is not signing._py_security_record
    monkeypatch.setattr(signing, "_security_record", signing._py_security_record)
    assert signing._message_parts is not signing._py_message_parts and signing._native_mac is not None
    monkeypatch.setattr(signing, "_message_parts", signing._py_message_parts)
    monkeypatch.setattr(signing, "_native_mac", None)
    assert signing._native_security_span is not None
    monkeypatch.setattr(signing, "_native_security_span", None)
    assert signing._pair_copies is not signing._py_pair_copies
    monkeypatch.setattr(signing, "_pair_copies", signing._py_pair_copies)
    # aiokafka's own key hash for the outputs' placement (app/bindings/partitioner.py; the
    # placement itself is compared over many partitions in tests/worker/test_batch_send.py)
    assert batch_send.murmur2 is not py_murmur2
    monkeypatch.setattr(batch_send, "murmur2", py_murmur2)
    return patched


def _records(out: dict[str, list[Any]], skip: Counter[str]) -> dict[str, Counter[Any]]:
    got: dict[str, Counter[Any]] = {}
    for topic, recs in out.items():
        got[topic] = Counter((r.partition, r.key, r.value, tuple(r.headers)) for r in recs[skip[topic]:])
    return got


async def test_outputs_are_identical_with_and_without_the_native_walk(broker, tmp_path: Path, dev_keys,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    require(native.ACTIVE, f"the compiled hot path is not active: {native.reason}")
    # one partition, and trace/span ids from a generator seeded alike for both runs: the worker
    # starts a trace for a message that has none (random ids, under the signature), so only then
    # are two runs' records comparable byte for byte
    topo = make_topology(tmp_path, dev_keys, partitions=1)
    doc = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    doc["outputs"]["signature_scope"] = "pair"
    doc["archive"] = {"enabled": False}
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump(doc))
    topo = load_topology(tmp_path / "topology.yaml")
    inputs = _inputs(topo.sources[0].topic, dev_keys)

    monkeypatch.setattr(tracecontext, "getrandbits", random.Random(29).getrandbits)
    shortcuts = Counter[bool]()
    compiled_pair = signing._native_pair_copies

    def counted(*args: Any) -> Any:
        got = compiled_pair(*args)
        shortcuts[got is not None] += 1
        return got

    monkeypatch.setattr(signing, "_native_pair_copies", counted)
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "native") as p:
        for value, key in inputs:
            await p.send(value, key=key)
        await p.wait_read(len(inputs))
        first = await p.outputs()
    s1 = p.pipeline.summary()
    assert s1["emitted"] >= 5 and s1["dlq"] >= 2, s1  # (malformed bytes that are no envelope are wrapped)
    assert shortcuts[True] >= 5, shortcuts  # the emitted copies took the compiled `.v2` shortcut

    assert _python_walk_everywhere(monkeypatch) >= 5
    monkeypatch.setattr(tracecontext, "getrandbits", random.Random(29).getrandbits)
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "python") as p2:  # a new group: from the start
        await p2.wait_read(len(inputs))
        both = await p2.outputs()
    s2 = p2.pipeline.summary()
    assert (s2["emitted"], s2["dlq"], s2["dlq_reasons"]) == (s1["emitted"], s1["dlq"], s1["dlq_reasons"])
    counts = Counter({t: len(r) for t, r in first.items()})
    assert all(len(both[t]) == 2 * counts[t] for t in first), ({t: len(r) for t, r in both.items()}, counts)
    assert _records(both, counts) == _records(first, Counter()), "an output differs without the native walk"
