"""The worker's re-signing on a thread pool (`sign_threads`, app/agents/publish.py
`SigningBatch`) on the real broker: the same outcomes, accounting and DLQ as signing inline,
and every output verifies with the worker key."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.envelope import Layout, decode, new_envelope
from app.security.signing import SigningKey, sign, verify
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


class _Flaky:
    """The worker's Ed25519 key, failing for envelopes whose bytes contain `poison`."""

    def __init__(self, real, poison: bytes) -> None:
        self.real, self.poison = real, poison

    def sign(self, data: bytes) -> bytes:
        if self.poison in data:
            raise ValueError("signing failed")
        return self.real.sign(data)


@pytest.mark.parametrize("sign_threads", [0, 1])
async def test_resigning_on_a_pool_matches_inline(broker, tmp_path: Path, dev_keys, sign_threads: int) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    producer_key = dev_keys.keyring.signing["dev-producer-1"]
    values = [sign(new_envelope(topic, {"i": i, "note": "POISON" if i == 7 else "ok"}, namespace="order-events"),
                   producer_key) for i in range(40)]
    keys = [f"k{i % 5}".encode() for i in range(40)]
    values.append(values[3])  # a redelivery (same key, so the same partition's window): dedup drops it
    keys.append(keys[3])
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", sign_threads=sign_threads) as p:
        assert (p.pipeline.sign_pool is not None) == (sign_threads > 0)
        real = p.pipeline.publisher.sign_with
        p.pipeline.publisher.sign_with = SigningKey(real.key_id, real.algorithm,
                                                    private_key=_Flaky(real.private_key, b"POISON"))
        for v, k in zip(values, keys, strict=True):
            await p.send(v, key=k)
        await p.wait_read(len(values))
        out = await p.outputs()
    s = p.pipeline.summary()
    assert (s["emitted"], s["duplicate"], s["dlq"]) == (39, 1, 1), s
    assert s["dlq_reasons"] == {"internal_error": 1}, s  # what a ValueError while publishing maps to
    (dlq,) = out[topic + ".dlq"]
    assert dlq.value == values[7] and dict(dlq.headers)["prism.errors.stage"] == b"publish"
    trusted = dev_keys.keyring.keys_for("order-events")
    for suffix, layout in (("v2", Layout.DRAFT), ("v3", Layout.REVIEWED)):
        recs = out[f"{topic}.{suffix}"]
        assert len(recs) == 39
        assert all(verify(r.value, trusted, layout=layout).key_id == real.key_id for r in recs)
        assert b"POISON" not in b"".join(r.value for r in recs)
    assert sorted(decode(r.value).payload_json()["i"] for r in out[f"{topic}.v3"]) == [i for i in range(40) if i != 7]
    assert p.pipeline.stats.written[topic + ".dlq"] == 1
