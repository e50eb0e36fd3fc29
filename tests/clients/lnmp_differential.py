"""The LNMP differential tests' shared half (tests/clients/test_go.py, test_rust_client.py): the
inputs - every LNMP conformance vector and seeded random damages of them, with bytes chosen to
hit the text tokenizer and the TLV types - and what Python (app/formats/lnmp_envelope.py, strict
mode) answers for each, which another language's client must answer too."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: bytes an insertion picks from: separators, quotes, escapes, line ends, TLV type bytes
DAMAGE_BYTES = b' ="\\\n\r\x10\x11\x12\x13\x00\xff'


def vectors() -> list[bytes]:
    """The input of every vector in conformance/lnmp/lnmp.json."""
    doc = json.loads((ROOT / "conformance" / "lnmp" / "lnmp.json").read_text(encoding="utf-8"))
    return [bytes.fromhex(v["input_hex"]) for v in doc["vectors"]]


def damaged(base: list[bytes], count: int, seed: int) -> list[bytes]:
    """`count` copies of random vectors, each with one or two edits (a bit flipped, the tail
    cut, a byte inserted or deleted) - reproducible from `seed`."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        data = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 2)):
            if not data:
                break
            i = rng.randrange(len(data))
            op = rng.randrange(4)
            if op == 0:
                data[i] ^= 1 << rng.randrange(8)
            elif op == 1:
                del data[i:]
            elif op == 2:
                data.insert(i, rng.choice(DAMAGE_BYTES))
            else:
                del data[i]
        out.append(bytes(data))
    return out


def python_answer(data: bytes) -> dict[str, Any]:
    """Python's verdict on `data`: `{"outcome": "ok", "model", "reencoded_hex" or
    "reencode_error"}`, or `{"outcome": <error code>}`."""
    from app.errors import PrismError
    from app.formats.lnmp_envelope import decode_message, to_lnmp
    from conformance._common import model_json

    try:
        env = decode_message(data).envelope
    except PrismError as exc:
        return {"outcome": exc.code}
    want: dict[str, Any] = {"outcome": "ok", "model": model_json(env)}
    try:
        want["reencoded_hex"] = bytes(to_lnmp(env)).hex()
    except PrismError as exc:
        want["reencode_error"] = exc.code
    return want


def mismatches(inputs: list[bytes], answers: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(input hex, Python's answer, the other's) for every input they answer differently."""
    assert len(answers) == len(inputs), (len(answers), len(inputs))
    out = []
    for data, theirs in zip(inputs, answers, strict=True):
        want = python_answer(data)
        if theirs != want:
            out.append((data.hex()[:100], want, theirs))
    return out
