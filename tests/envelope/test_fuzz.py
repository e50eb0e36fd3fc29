"""Fuzzing: mutated envelopes must only ever raise Prism's documented errors.

A seeded mutation fuzzer (bit flips, byte overwrites, truncation, insertion, splicing,
length-prefix corruption) over a corpus of valid envelopes in both layouts - signed,
compressed, encrypted-looking. Seeded so a failure reproduces; >= 100k cases per run.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import Layout, decode, encode, new_envelope, required_problems, sanity_problems
from app.envelope.codec import convert
from app.errors import PrismError
from app.security.signing import SigningKey, VerificationKeys, sign, verify

N_CASES = 100_000
KEY = SigningKey.hmac_sha256("fuzz", b"k" * 32)
KEYS = VerificationKeys.of([KEY])


def corpus() -> list[bytes]:
    out = []
    for i, enc in enumerate(["", "gzip", "snappy", "zstd"]):
        env = new_envelope(f"topic-{i}", {"i": i, "data": "x" * (i * 40)}, namespace="ns", content_encoding=enc,
                           correlation_id="c", priority=i, ttl_seconds=10, labels={"k": "v"},
                           extensions={"x-a": b"1"})
        sec = env.ensure_security()
        sec.publisher_id, sec.data_classification = "p", "internal"
        if i % 2:
            sec.encryption.key_id, sec.encryption.algorithm = "k1", "aes-256-gcm"
            sec.encryption.iv, sec.encryption.encapsulated_key = b"\x01" * 12, b"\x02" * 32
        obs = env.ensure_observability()
        obs.trace_id, obs.span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        env.ensure_schema().schema_version = "v1"
        for layout in Layout:
            out.append(encode(env, layout))
            out.append(sign(env.copy(), KEY, layout))
    return out


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 4))):  # mostly single edits, so many mutants parse and reach deep paths
        op = rng.choice((0, 0, 0, 1, 1, 2, 3, 4, 5, 6))  # bit flips dominate: they keep framing intact
        if not b:
            b = bytearray(rng.randbytes(rng.randint(1, 16)))
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            del b[i:]
        elif op == 3:
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:
            other = rng.choice(pool)
            j = rng.randrange(len(other))
            b[i:] = other[j:]
        elif op == 5:  # corrupt what may be a length prefix into a huge varint
            b[i : i + 1] = rng.choice([b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", b"\x00"])
        else:
            j = rng.randrange(len(b))
            b[i:i] = b[min(i, j) : max(i, j)][:64]
    return bytes(b)


def exercise(data: bytes) -> None:
    """Everything a stage does with untrusted bytes; only PrismError may escape."""
    try:
        env = decode(data)
        required_problems(env)
        sanity_problems(env, now_ms=1_700_000_000_000)
        env.payload.type_url  # noqa: B018 - forces the lazy parse
        if not env.is_encrypted:
            if env.content_type == "application/json":
                env.payload_json()
            else:
                env.payload_bytes()
        encode(env, Layout.DRAFT)
        convert(data, Layout.REVIEWED)
        verify(data, KEYS)
    except PrismError:
        pass


def test_mutation_fuzz_only_documented_errors():
    rng = random.Random(20261121)
    pool = corpus()
    undocumented: list[tuple[bytes, BaseException]] = []
    for _ in range(N_CASES):
        data = mutate(rng, rng.choice(pool), pool)
        try:
            exercise(data)
        except Exception as exc:  # anything else is a bug
            undocumented.append((data, exc))
            if len(undocumented) > 5:
                break
    assert not undocumented, [(d.hex()[:80], repr(e)) for d, e in undocumented]


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_documented_errors(data):
    exercise(data)
