"""When the batch's one output signature cannot be made (`Publisher.finish` fails: the worker's
own key), every message it was to sign goes to the DLQ with the reason - none is written
unsigned, none is dropped, the worker keeps running - and the next batch signs normally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.envelope import decode, new_envelope
from app.security.signing import sign
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


async def test_a_failed_batch_signature_dead_letters_the_whole_batch(broker, tmp_path: Path, dev_keys) -> None:
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    topic = topo.sources[0].topic
    key = dev_keys.keyring.signing["dev-producer-1"]
    token = dev_keys.mint_token("svc-orders")

    def signed(i: int) -> bytes:
        env = new_envelope(topic, {"order_id": f"o-{i}"}, namespace="order-events", correlation_id=f"c-{i}")
        env.ensure_security().auth_token = token
        return sign(env, key)

    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w") as p:
        publisher = p.pipeline.publisher
        real_finish = publisher.finish
        calls = {"failed": 0}

        def failing_finish(items: Any) -> Any:
            calls["failed"] += 1
            raise RuntimeError("worker signing key unusable (HSM unreachable)")

        publisher.finish = failing_finish
        bad = [signed(i) for i in range(6)]
        for value in bad:
            await p.send(value, key=b"k")
        await p.wait_read(len(bad))
        assert calls["failed"] >= 1

        publisher.finish = real_finish  # the key is back: the next batch signs normally
        good = [signed(100 + i) for i in range(3)]
        for value in good:
            await p.send(value, key=b"k")
        await p.wait_read(len(bad) + len(good))
        out = await p.outputs()

    s = p.pipeline.summary()
    assert s["emitted"] == len(good) and s["dlq"] == len(bad), s
    dlq = out[topic + ".dlq"]
    stages = sorted(dict(r.headers)["prism.errors.stage"] for r in dlq)
    assert stages == [b"publish"] * len(bad)
    for rec in dlq:
        headers = dict(rec.headers)
        if headers["prism.errors.stage"] == b"publish":
            assert b"HSM unreachable" in headers["prism.errors.exception.message"]
            assert headers["prism.errors.reason"] == b"internal_error"
            assert token.encode() not in rec.value  # the input, minus its secret
    correlation = sorted(decode(r.value).header.metadata.correlation_id for r in dlq)
    assert correlation == sorted(f"c-{i}" for i in range(len(bad)))  # each input once, readable
    for layout in topo.outputs.layouts:
        assert len(out[f"{topic}.{layout}"]) == len(good)
