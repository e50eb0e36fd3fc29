"""Deferred re-signing (`SigningBatch`, `DeferredSigner`): the worker's outputs must be the
bytes `Publisher.emissions` writes, whether the signatures are made on a pool or inline."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from app.agents.publish import Publisher, SigningBatch
from app.envelope import decode, encode, new_envelope
from app.errors import AlgorithmError, SignatureError
from app.security.signing import DeferredSigner, SigningKey
from app.topology import Archive, Outputs, Topology
from tests.agents.conftest import make_msg

TOKEN = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJzdmMifQ.c2lnbmF0dXJlLWJ5dGVz"


def _topology(layouts=("v2", "v3"), archive=True):
    return Topology(name="t", namespace="ns", sources=[{"topic": "orders.created"}],
                    stages=[{"name": "normalize", "settings": {}}], outputs=Outputs(layouts=list(layouts)),
                    archive=Archive(topic="arch", enabled=archive))


def _inputs(n):
    """(value bytes, headers, key) of `n` distinct envelopes; each is decoded afresh per use."""
    out = []
    for i in range(n):
        env = new_envelope("orders.created", {"i": i, "note": "x" * (i * 37 % 300)}, namespace="ns",
                           correlation_id=f"c-{i}")
        env.ensure_security().auth_token = TOKEN
        headers = [("x-team", b"a"), ("Authorization", b"Bearer x")] if i % 3 else []
        out.append((encode(env), headers, None if i % 4 == 0 else f"k{i}".encode()))
    return out


def _msg(value, headers, key, offset):
    m = make_msg(value, headers=headers, key=key, offset=offset)
    m.envelope = decode(value)
    return m


def _flat(emissions):
    return [(e.topic, e.record.key, e.record.value, list(e.record.headers), e.record.timestamp_ms) for e in emissions]


@pytest.mark.parametrize("layouts,archive", [(("v2", "v3"), True), (("v2", "v3"), False), (("v2",), True),
                                             (("v3",), False)])
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_deferred_signatures_give_the_same_records_as_signing_inline(dev_keys, layouts, archive, threads):
    pub = Publisher(_topology(layouts, archive), worker_key=dev_keys.keyring.worker_key())
    assert pub.can_defer_signing()
    pool = ThreadPoolExecutor(threads) if threads else None
    try:
        batch = SigningBatch(pub, pool, chunk=5)  # several chunks, the last one partial
        inputs = _inputs(23)
        direct, deferred = [], []
        for i, (value, headers, key) in enumerate(inputs):
            m = _msg(value, headers, key, i)
            direct.append((m, pub.emissions(m)))
            m2 = _msg(value, headers, key, i)
            deferred.append((m2, batch.emissions(m2)))
        batch.wait_sync()
        for (m, ems), (m2, ems2) in zip(direct, deferred, strict=True):
            finished = batch.finish(m2, ems2)
            assert _flat(finished) == _flat(ems)
            assert m2.env.security.signature == m.env.security.signature != b""
            assert m2.env.header.SerializeToString() == m.env.header.SerializeToString()
    finally:
        if pool is not None:
            pool.shutdown()


def test_wait_lets_the_event_loop_await_the_pool(dev_keys):
    import asyncio

    pub = Publisher(_topology(), worker_key=dev_keys.keyring.worker_key())
    (value, headers, key), = _inputs(1)
    m, m2 = _msg(value, headers, key, 0), _msg(value, headers, key, 0)
    with ThreadPoolExecutor(1) as pool:
        batch = SigningBatch(pub, pool)
        ems = batch.emissions(m2)
        asyncio.run(batch.wait())
        assert _flat(batch.finish(m2, ems)) == _flat(pub.emissions(m))


class _Flaky:
    """An Ed25519 private key that fails for envelopes whose bytes contain `poison`."""

    def __init__(self, real, poison: bytes):
        self.real, self.poison = real, poison

    def sign(self, data):
        if self.poison in data:
            raise ValueError("signing failed")
        return self.real.sign(data)


def test_a_failed_signature_raises_for_its_message_only_as_inline_signing_would(dev_keys):
    real = dev_keys.keyring.worker_key()
    flaky = SigningKey(real.key_id, real.algorithm, private_key=_Flaky(real.private_key, b"POISON"))
    pub = Publisher(_topology(), worker_key=flaky)
    values = []
    for i in range(6):
        env = new_envelope("orders.created", {"i": i, "p": "POISON" if i == 2 else "ok"}, namespace="ns")
        values.append(encode(env))
    with pytest.raises(ValueError, match="signing failed"):
        pub.emissions(_msg(values[2], [], None, 2))
    with ThreadPoolExecutor(1) as pool:
        batch = SigningBatch(pub, pool, chunk=4)
        msgs = [_msg(v, [], None, i) for i, v in enumerate(values)]
        pending = [batch.emissions(m) for m in msgs]  # placeholders: nothing fails yet
        batch.wait_sync()
        for i, (m, ems) in enumerate(zip(msgs, pending, strict=True)):
            if i == 2:
                with pytest.raises(ValueError, match="signing failed"):
                    batch.finish(m, ems)
            else:
                assert _flat(batch.finish(m, ems)) == _flat(pub.emissions(_msg(values[i], [], None, i)))


def test_deferred_signer_is_for_ed25519_and_patches_exactly_one_placeholder(dev_keys):
    with pytest.raises(AlgorithmError):
        DeferredSigner(dev_keys.keyring.signing["dev-producer-1"])  # HMAC: signed inline
    signer = DeferredSigner(dev_keys.keyring.worker_key())
    ph = signer.key.private_key.sign(b"data")
    assert len(ph) == 64 and signer.pending() == 1
    (job,) = signer.compute(signer.take())
    assert job.signature == dev_keys.keyring.worker_key().private_key.sign(b"data")
    assert DeferredSigner.patch(b"a" + ph + b"b", job) == b"a" + job.signature + b"b"
    for bad in (b"no placeholder", ph + ph):
        with pytest.raises(SignatureError):
            DeferredSigner.patch(bad, job)
    other = DeferredSigner(dev_keys.keyring.worker_key())
    assert other.key.private_key.sign(b"data")[:56] != ph[:56]  # random per signer
