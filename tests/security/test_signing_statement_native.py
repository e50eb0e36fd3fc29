"""The compiled signed message (`prism_native.signed_message`, wired in as
`signing._message_parts`) and the compiled HMAC check of scopes v2 and legacy
(`prism_native.signed_mac`, `signing._check_mac`) against the Python path
(`_py_message_parts`, `_check`): for the same bytes, the same signed message byte for byte, the
same MAC, the same verdict - or the same `PrismError` class, text, path and hint. On the
signature vectors of the conformance suite (every scope, both algorithms, both layouts, with
and without legacy acceptance), on every other conformance hex string, and on generated
security records with hostile sibling digests, tree fields (70-bit varints included) and paths.

Locally these skip without the native module; under CI=true they fail (tests/support.require).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.envelope import Layout, wire
from app.errors import PrismError, UnknownKeyError
from app.security import signing
from tests.envelope.test_wire_native import _vector_bytes
from tests.security.test_signature_vectors import DOCS, _keyring
from tests.security.test_signing import rich_envelope
from tests.support import require

SECRET = b"k" * 32
#: Two HMAC keys: an envelope that names no key id is tried with both (`_check_mac`'s loop).
KEYS = signing.VerificationKeys.of([signing.SigningKey.hmac_sha256("k0", b"x" * 32).verification_key(),
                                    signing.SigningKey.hmac_sha256("k1", SECRET).verification_key()],
                                   accept_legacy_scope=True)


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._message_parts is not signing._py_message_parts
            and signing._native_mac is not None,
            f"the compiled signed message is not active: {native.reason}")


@contextmanager
def _python_path() -> Iterator[None]:
    """The pure-Python statement and MAC, put back for the duration (the walk and the
    security-record check stay as they are: both are proven equal in their own tests)."""
    parts, mac = signing._message_parts, signing._native_mac
    signing._message_parts, signing._native_mac = signing._py_message_parts, None
    try:
        yield
    finally:
        signing._message_parts, signing._native_mac = parts, mac


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        result = fn(*args, **kwargs)
    except PrismError as exc:
        return ("error", type(exc), str(exc), exc.path, exc.hint)
    if isinstance(result, signing.SignedMessage):
        return ("ok", result.layout, result.scope, result.joined())
    return ("ok", result)


def _same_message(data: bytes, lay: Layout) -> Any:
    compiled = _outcome(signing.signed_message, data, layout=lay)
    with _python_path():
        expected = _outcome(signing.signed_message, data, layout=lay)
    assert compiled == expected, (data.hex(), lay)
    return expected


def _same_verdict(data: bytes, keys: signing.VerificationKeys, **kwargs: Any) -> Any:
    signing.clear_verification_cache()
    compiled = _outcome(signing.verify, data, keys, **kwargs)
    signing.clear_verification_cache()
    with _python_path():
        expected = _outcome(signing.verify, data, keys, **kwargs)
    assert compiled == expected, (data.hex(), kwargs)
    return expected


def _same(data: bytes) -> list[Any]:
    seen = [_same_message(data, lay) for lay in Layout]
    for lay in Layout:
        seen.append(_same_verdict(data, KEYS, layout=lay))
    return seen


def test_the_signature_vectors_give_the_same_message_and_verdict() -> None:
    verdicts: dict[str, int] = {}
    for doc in DOCS.values():
        for vector in doc["vectors"]:
            data = bytes.fromhex(vector["envelope_hex"])
            lay = Layout(vector["layout"])
            outcome = _same_message(data, lay)
            if outcome[0] == "ok":
                assert outcome[3].hex() == vector["signed_message_hex"], vector["name"]
            for accept in (False, True):
                v = _same_verdict(data, _keyring(doc, accept), layout=lay)
                key = "valid" if v[0] == "ok" else v[1].__name__
                verdicts[key] = verdicts.get(key, 0) + 1
    assert verdicts["valid"] > 50
    assert verdicts["SignatureError"] > 50  # tampered, missing siblings, bad tree fields


def test_every_conformance_hex_string_gives_the_same_message_and_mac_outcome() -> None:
    outcomes = [o for data in _vector_bytes() for o in _same(data)]
    assert sum(o[0] == "ok" for o in outcomes) > 300
    assert sum(o[0] == "error" for o in outcomes) > 300


def test_the_mac_is_the_python_mac_of_the_python_message() -> None:
    for doc in DOCS.values():
        for vector in doc["vectors"]:
            data = bytes.fromhex(vector["envelope_hex"])
            lay = Layout(vector["layout"])
            with _python_path():
                try:
                    message = signing.signed_message(data, layout=lay).joined()
                except PrismError:
                    continue
            assert signing._native_mac(memoryview(data), lay is Layout.REVIEWED, SECRET) == \
                signing._mac(SECRET, [message])


def _record(field: int, wt: int, body: bytes | int) -> bytes:
    tag = wire.encode_varint(field << 3 | wt)
    if isinstance(body, int):
        return tag + wire.encode_varint(body)
    return tag + wire.encode_varint(len(body)) + body


_SIZE = st.one_of(st.integers(0, 40), st.integers(0, 2**70 - 1), st.just(signing.MAX_TREE_SIZE),
                  st.just(signing.MAX_TREE_SIZE + 1))


def _maybe(strategy: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """`strategy`'s record three times in four, else none."""
    return st.tuples(st.integers(0, 3), strategy).map(lambda t: t[1] if t[0] else b"")


#: One security record: each known field at most once (a repeated one is ambiguous, and so
#: never reaches the statement), in any order, with unknown fields among them.
_FIELDS = st.tuples(
    st.tuples(st.sampled_from([3, 4, 4, 4, 2, 0, -1]), st.integers(0, 2**70 - 1)).map(
        lambda t: _record(10, wire.VARINT, t[1] if t[0] < 0 else t[0])),  # signature_scope, mostly pair and batch
    _maybe(st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=40)).map(
        lambda b: _record(11, wire.LEN, b))),  # sibling_digest, of 32 bytes or any length
    _maybe(_SIZE.map(lambda v: _record(12, wire.VARINT, v))),  # tree_index
    _maybe(_SIZE.map(lambda v: _record(13, wire.VARINT, v))),  # tree_size
    _maybe(st.one_of(st.integers(0, 8).map(lambda n: bytes(range(n * 32))), st.binary(max_size=70)).map(
        lambda b: _record(14, wire.LEN, b))),  # tree_path, whole hashes or any length
    _maybe(st.binary(min_size=1, max_size=32).map(lambda b: _record(4, wire.LEN, b))),  # signature
    _maybe(st.text("xyz.", max_size=8).map(lambda t: _record(3, wire.LEN, t.encode()))),  # auth_token
    _maybe(st.sampled_from([b"hmac-sha256"] * 4 + [b"ed25519", b"none"]).map(lambda b: _record(5, wire.LEN, b))),
    _maybe(st.sampled_from([b"k0", b"k1", b"nobody"]).map(lambda b: _record(9, wire.LEN, b))),
    _maybe(st.text("abc-", max_size=8).map(lambda t: _record(1, wire.LEN, t.encode()))),  # publisher_id
    st.lists(st.integers(16, 40).map(lambda f: _record(f, wire.VARINT, 1)), max_size=2).map(b"".join),
).flatmap(lambda fields: st.permutations(list(fields))).map(b"".join)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(Layout)), _FIELDS, st.binary(max_size=40), st.binary(max_size=40))
def test_generated_security_records_give_the_same_message_and_verdict(
        lay: Layout, body: bytes, head: bytes, tail: bytes) -> None:
    # other top-level records around it: a payload-like and an unknown field
    data = _record(20, wire.LEN, head) + _record(lay.security_field, wire.LEN, body) + _record(21, wire.LEN, tail)
    _same_message(data, lay)
    _same_verdict(data, KEYS, layout=lay)


def _sec(*parts: bytes) -> bytes:
    """A reviewed-layout envelope that is only a security record of `parts`."""
    return _record(2, wire.LEN, b"".join(parts))


_SIB = _record(11, wire.LEN, bytes(32))
_BATCH = _record(10, wire.VARINT, 4)


@pytest.mark.parametrize("data", [
    _sec(_BATCH),  # batch scope, nothing else
    _sec(_record(10, wire.VARINT, 3), _record(11, wire.LEN, b"\0")),  # pair scope, 1-byte sibling
    _sec(_BATCH, _SIB),  # tree_size absent (0)
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 2**70 - 1)),  # a 70-bit size
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 4), _record(12, wire.VARINT, 2**64)),  # index >= size
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 2), _record(14, wire.LEN, bytes(31))),  # path of 31 bytes
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 1), _record(14, wire.LEN, bytes(32))),  # path too long
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 2)),  # path too short
    _sec(_BATCH, _SIB, _record(13, wire.VARINT, 2), _record(14, wire.LEN, bytes(32)),
         _record(4, wire.LEN, b"s"), _record(5, wire.LEN, b"hmac-sha256")),  # forms a statement; forged
    _sec(_record(10, wire.VARINT, 2**70 - 1)),  # a 70-bit scope
    _sec(_record(10, wire.VARINT, 9), _record(4, wire.LEN, b"s")),  # an unknown scope
    _sec(_record(4, wire.LEN, b"s"), _record(5, wire.LEN, b"none")),  # an unknown algorithm
    _sec(_record(10, wire.VARINT, 2), _record(4, wire.LEN, b"s"), _record(5, wire.LEN, b"hmac-sha256"),
         _record(9, wire.LEN, b"nobody")),  # an unknown key
    _sec(_record(4, wire.LEN, b""), _record(4, wire.LEN, b"")),  # signature twice: ambiguous
    _sec(),  # unsigned
    b"",
])
def test_hostile_security_records_give_the_same_typed_error(data: bytes) -> None:
    for lay in Layout:
        _same_message(data, lay)
        _same_verdict(data, KEYS, layout=lay)


def test_a_forged_v2_mac_and_an_unknown_key_fail_as_in_python() -> None:
    key = signing.SigningKey.hmac_sha256("k1", SECRET)
    for lay in Layout:
        for scope in (signing.SCOPE_V2, signing.SCOPE_LEGACY):
            good = signing.sign(rich_envelope(), key, lay, scope=scope)
            assert _same_verdict(good, KEYS)[0] == "ok"
            forged = bytearray(good)
            forged[-1] ^= 1
            assert _same_verdict(bytes(forged), KEYS)[1] is signing.SignatureError
            other = signing.VerificationKeys.of([signing.SigningKey.hmac_sha256("k2", SECRET).verification_key()],
                                                accept_legacy_scope=True)
            assert _same_verdict(good, other)[1] is UnknownKeyError
            refused = _same_verdict(good, KEYS, accept_legacy_scope=False)
            assert refused[0] == ("ok" if scope == signing.SCOPE_V2 else "error")
