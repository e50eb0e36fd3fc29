"""`python -m conformance.check`, the Python side of the Go and Rust cross-language tests:
its answers agree with the vectors, and what it encrypts decrypts (randomized encryption has
no byte-for-byte vector, so this round trip is the check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import check

ROOT = Path(check.__file__).resolve().parent


def _doc(path: str) -> dict[str, Any]:
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", _doc("encryption/vectors.json")["vectors"], ids=lambda v: v["name"])
def test_decrypt_answers_every_encryption_vector(vector: dict[str, Any]) -> None:
    got = check.answer(["decrypt", vector["envelope_hex"]])
    assert got["outcome"] == vector["expected"]
    if vector["expected"] == "plaintext":
        assert got["plaintext_hex"] == vector["plaintext_hex"]


@pytest.mark.parametrize("algorithm", ["aes-256-gcm", "ml-kem-1024", "x25519-ml-kem-1024"])
@pytest.mark.parametrize("layout", ["draft", "reviewed"])
def test_what_it_encrypts_decrypts_and_is_fresh_each_time(algorithm: str, layout: str) -> None:
    first = check.answer(["encrypt", algorithm, "68656c6c6f", "--layout", layout])["envelope_hex"]
    second = check.answer(["encrypt", algorithm, "68656c6c6f", "--layout", layout])["envelope_hex"]
    assert first != second  # a fresh nonce (and encapsulation) each time: no byte-for-byte vector
    for data in (first, second):
        assert check.answer(["decrypt", data]) == {"outcome": "plaintext", "plaintext_hex": "68656c6c6f"}
        assert check.answer(["decode", data])["layout"] == layout


@pytest.mark.parametrize("vector", [v for v in _doc("negative/negative.json")["vectors"] if "limits" not in v],
                         ids=lambda v: v["name"])
def test_decode_and_verify_answer_every_negative_vector_with_default_limits(vector: dict[str, Any]) -> None:
    decoded = check.answer(["decode", vector["input_hex"]])
    assert decoded["outcome"] == vector["expected_decode"], decoded
    if vector["expected_decode"] == "ok":
        assert decoded["model"] == vector["model"]
        assert decoded.get("payload_error") == vector.get("expected_payload")
    else:
        assert decoded["python_code"] and decoded["message"]
    assert check.answer(["verify", vector["input_hex"]])["outcome"] == vector["expected_verify"]


@pytest.mark.parametrize("vector", _doc("envelopes/draft.json")["vectors"] + _doc("envelopes/reviewed.json")["vectors"],
                         ids=lambda v: v["name"])
def test_encode_gives_the_canonical_bytes_of_every_envelope_vector(vector: dict[str, Any]) -> None:
    got = check.answer(["encode", vector["layout"], json.dumps(vector["model"])])
    assert (got["envelope_hex"] == vector["envelope_hex"]) is vector["canonical"]
    assert check.answer(["decode", got["envelope_hex"]])["model"] == vector["model"]


def test_the_command_line_reads_stdin_and_prints_one_json_line() -> None:
    vector = _doc("signatures/scope-v2-ed25519.json")["vectors"][0]
    out = subprocess.run([sys.executable, "-m", "conformance.check", "verify", "-"], input=vector["envelope_hex"],
                         capture_output=True, text=True, check=True, cwd=ROOT.parent, timeout=60)
    assert json.loads(out.stdout) == {"outcome": "valid", "key_id": "vector-ed25519-1", "scope": 2}


def test_unusable_command_lines_exit_non_zero_with_a_reason() -> None:
    with pytest.raises(SystemExit):
        check.answer(["decode", "not-hex"])
    with pytest.raises(SystemExit, match="algorithm must be"):
        check.answer(["encrypt", "rot13", "00"])
    with pytest.raises(SystemExit, match="JSON form"):
        check.answer(["encode", "draft", '{"metadata": {"nope": 1}}'])
    with pytest.raises(SystemExit):
        check.answer(["frobnicate"])


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["decode", "verify", "decrypt"]))
def test_any_bytes_get_an_answer_never_a_traceback(data: bytes, command: str) -> None:
    """Hostile input: whatever the bytes, the answer is an outcome (ok/valid/plaintext or an
    error kind with Python's code), never an exception."""
    got = check.answer([command, data.hex()])
    assert got["outcome"] in {"ok", "valid", "plaintext"} or got["python_code"]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=400), st.integers(min_value=0, max_value=255))
def test_a_vector_with_one_byte_changed_gets_an_answer(at: int, value: int) -> None:
    vector = _doc("signatures/scope-v2-hmac-sha256.json")["vectors"][0]
    data = bytearray.fromhex(vector["envelope_hex"])
    data[at % len(data)] = value
    for command in ("decode", "verify"):
        got = check.answer([command, data.hex()])
        assert got["outcome"] in {"ok", "valid"} or got["python_code"]
