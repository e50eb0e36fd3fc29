"""The compiled batch finish (`prism_native.finish_batch`, wired in as `signing.finish_batch`'s
compiled branch, with `prepare_batch` keeping the compiled `pair_copies`' bytes) against the
protobuf way it replaces: set `signature`, `sibling_digest`, `tree_index`, `tree_size` and
`tree_path` on each copy's security context, serialize it again, join head + security record +
payload. `_reference` below is that code as it was before the splice, over the pure-Python
copies, kept here so a change to the library's own Python path cannot hide a difference.

Byte for byte the same copies, and every copy verifies alone: on the conformance vectors'
envelopes (as received: payloads are memoryviews of the message), on generated envelopes
(unknown fields, encryption, tokens, extreme numbers) in batches of 1, 2, odd sizes, 500+ and
`MAX_TREE_SIZE`, with both layouts requested, one, or none; a batch where some messages take
the Python path; a message whose bytes the splice declines. The compiled function is also fed
arbitrary bytes directly (copies or a path back, never a crash).

Locally these skip without the native module; under CI=true they fail (tests/support.require).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import native
from app.envelope import Layout, codec
from app.envelope.model import Envelope
from app.errors import PrismError, SignatureError
from app.security import signing
from tests.envelope.test_layouts_native import _copy, _envelopes_of_the_vectors, envelopes
from tests.security.test_signing import ED_KEY, HMAC_KEY, rich_envelope
from tests.support import require

BOTH = (Layout.DRAFT, Layout.REVIEWED)
LAYOUT_CHOICES = (BOTH, (Layout.REVIEWED, Layout.DRAFT), (Layout.DRAFT,), (Layout.REVIEWED,), ())
KEYS = {key.algorithm: signing.VerificationKeys.of([key]) for key in (HMAC_KEY, ED_KEY)}


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require(native.ACTIVE and signing._native_finish_batch is not None,
            f"the compiled batch finish is not active: {native.reason}")


@contextlib.contextmanager
def _python_finish() -> Iterator[None]:
    """`finish_batch` without the compiled call (the tree and every copy in Python)."""
    compiled = signing._native_finish_batch
    signing._native_finish_batch = None
    try:
        yield
    finally:
        signing._native_finish_batch = compiled


def _reference(envs: Sequence[Envelope], key: signing.SigningKey, layouts: Sequence[Layout]) -> list[list[bytes]]:
    """`sign_batch` as it was before the splice: the pure-Python copies, the Python tree, and
    per copy the five protobuf writes and `security_bytes`."""
    prepared = []
    for env in envs:
        signing.begin_signature(env, key, signing.SCOPE_BATCH)
        prepared.append(signing._py_pair_copies(env, signing._CUT_BATCH))
    n = len(prepared)
    root, paths = signing.merkle_tree([signing.leaf_hash(d, r) for _, d, r in prepared])
    sig = signing.signature_over(key, [signing.batch_statement(n, root)])
    out = []
    for i, ((copies, draft_digest, reviewed_digest), path) in enumerate(zip(prepared, paths, strict=True)):
        written = {}
        for layout, hsec, head, payload in copies:
            hsec.signature = sig
            hsec.sibling_digest = reviewed_digest if layout is Layout.DRAFT else draft_digest
            hsec.tree_index = i
            hsec.tree_size = n
            if path:
                hsec.tree_path = path
            written[layout] = b"".join([head, codec.security_bytes(hsec, layout), *payload])
        out.append([written[layout] for layout in layouts])
    return out


def _compiled(envs: Sequence[Envelope], key: signing.SigningKey, layouts: Sequence[Layout]) -> tuple[list[list[bytes]], int]:
    """`prepare_batch` each and `finish_batch`, as the worker does; and how many messages took
    the compiled path."""
    prepared = [signing.prepare_batch(env, key, layouts) for env in envs]
    return signing.finish_batch(prepared, key), sum(p.compiled is not None for p in prepared)


def _assert_same(got: list[list[bytes]], expected: list[list[bytes]]) -> None:
    """`got == expected`, failing on the first message that differs (a failed comparison of
    65,536 messages' copies would have pytest print all of them)."""
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g != e:
            assert (i, g) == (i, e)


def _same(envs: Sequence[Envelope], key: signing.SigningKey, layouts: Sequence[Layout], *, verify: bool = True
          ) -> int:
    """Compiled and reference copies of copies of `envs` are the same bytes, and each verifies;
    returns how many messages the compiled path took."""
    got, compiled = _compiled([_copy(e) for e in envs], key, layouts)
    _assert_same(got, _reference([_copy(e) for e in envs], key, layouts))
    if verify:
        for copies in got:
            for data in copies:
                assert signing.verify(data, KEYS[key.algorithm]).scope == signing.SCOPE_BATCH
    return compiled


def _preparable(envs: Sequence[Envelope]) -> list[Envelope]:
    """The envelopes the Python path signs into copies that verify. Some conformance vectors
    are refused by design; a few sign into a copy the verifier calls ambiguous (an unknown
    top-level record of the input carried into the draft copy under a number the draft
    layout uses), on either path: `_same` compares those bytes too, in
    `test_unverifiable_inputs_give_the_same_bytes`."""
    out = []
    for env in envs:
        try:
            for copies in _reference([_copy(env)], HMAC_KEY, BOTH):
                for data in copies:
                    signing.verify(data, KEYS[HMAC_KEY.algorithm])
        except PrismError:
            continue
        out.append(env)
    return out


def test_unverifiable_inputs_give_the_same_bytes() -> None:
    """The vectors `_preparable` leaves out: where the Python path signs them at all, the
    compiled path gives the same bytes (and the same error where it does not)."""
    envs = _envelopes_of_the_vectors()
    kept = {id(e) for e in _preparable(envs)}
    signed = refused = 0
    for env in envs:
        if id(env) in kept:
            continue
        try:
            expected = _reference([_copy(env)], HMAC_KEY, BOTH)
        except PrismError as exc:
            with pytest.raises(type(exc)):
                _compiled([_copy(env)], HMAC_KEY, BOTH)
            refused += 1
            continue
        assert _compiled([_copy(env)], HMAC_KEY, BOTH)[0] == expected
        signed += 1
    assert signed + refused > 10, (signed, refused)


def test_the_conformance_envelopes_in_batches_of_every_size() -> None:
    envs = _preparable(_envelopes_of_the_vectors())
    assert len(envs) > 300
    took = total = 0
    for size in (1, 2, 3, 7):
        for at in range(0, min(len(envs), 60), size):
            took += _same(envs[at:at + size], HMAC_KEY, BOTH)
        total += 60
    # the whole set and more as one batch of 500+, both keys, every choice of layouts
    big = (envs * 2)[:523]
    took += _same(big, ED_KEY, BOTH)
    total += len(big)
    for layouts in LAYOUT_CHOICES[1:]:
        took += _same(big[:41], HMAC_KEY, layouts)
        total += 41
    # a third of the vectors take the compiled path (the shortcut's shape); the batches mix both
    assert 250 < took < total - 250, (took, total)


def test_the_workers_message_takes_the_splice_at_the_tree_size_limit() -> None:
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    env.header.extensions["prism.identity.method"] = b"hmac-signature"
    received = codec.decode(codec.encode(env))  # the payload a memoryview, as in the worker
    envs = [received] * signing.MAX_TREE_SIZE
    got, compiled = _compiled([_copy(e) for e in envs], HMAC_KEY, BOTH)
    assert compiled == signing.MAX_TREE_SIZE
    _assert_same(got, _reference([_copy(e) for e in envs], HMAC_KEY, BOTH))
    for i in (0, 1, 2, 3, 4095, 4096, 32767, 32768, signing.MAX_TREE_SIZE - 2, signing.MAX_TREE_SIZE - 1):
        for data in got[i]:
            signing.verify(data, KEYS[HMAC_KEY.algorithm])
        assert codec.decode(got[i][1]).security.tree_index == i
    with pytest.raises(SignatureError, match="at most 65536"):
        signing.finish_batch([signing.prepare_batch(_copy(received), HMAC_KEY, BOTH)] * (signing.MAX_TREE_SIZE + 1),
                             HMAC_KEY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.one_of(envelopes(), envelopes(shortcut_shape=True)),
                          st.one_of(st.none(), st.text(max_size=8))), min_size=1, max_size=9),
       st.sampled_from(LAYOUT_CHOICES), st.sampled_from([HMAC_KEY, ED_KEY]))
def test_generated_envelopes_give_the_same_copies(
        batch: list[tuple[Envelope, str | None]], layouts: tuple[Layout, ...], key: signing.SigningKey) -> None:
    envs = []
    for env, token in batch:
        if token is not None:
            env.ensure_security().auth_token = token  # begin_signature keeps it; the digests cut it
        envs.append(env)
    envs = _preparable(envs)
    if envs:
        _same(envs, key, layouts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(shortcut_shape=True), st.sampled_from([500, 511, 512, 513, 1023]))
def test_generated_batches_of_500_and_more(env: Envelope, size: int) -> None:
    envs = _preparable([env])
    if envs:
        assert _same(envs * size, HMAC_KEY, BOTH, verify=False) == size


def test_a_batch_where_some_messages_take_the_python_path() -> None:
    plain = rich_envelope()
    plain.header.security.ClearField("encryption")
    plain.header.observability.ClearField("labels")
    plain.header.extensions.clear()
    encrypted = rich_envelope()  # encryption metadata: the compiled pair copies decline it
    unknown = _copy(plain)
    unknown.header.security.MergeFromString(b"\xa8\x06\x01")  # an unknown security field
    envs = [plain, encrypted, plain, unknown, plain, encrypted, plain]
    assert _same(envs, ED_KEY, BOTH) == 4


def test_a_message_the_splice_declines_is_written_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The splice takes only a prepared context (no field above 10, no signature): anything
    else comes back as the message's audit path and Python writes it from the same bytes."""
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()

    def prepared() -> list[signing.PreparedMessage]:
        out = [signing.prepare_batch(_copy(env), HMAC_KEY, BOTH) for _ in range(3)]
        codes, head_d, sec_d, head_r, full, payload = out[1].compiled  # type: ignore[misc]
        out[1].compiled = (codes, head_d, sec_d + b"\xa0\x06\x01", head_r, full, payload)
        return out

    returned: list[Any] = []
    compiled = signing._native_finish_batch

    def spy(*args: Any) -> Any:
        sig, done = compiled(*args)
        returned.extend(done)
        return sig, done

    monkeypatch.setattr(signing, "_native_finish_batch", spy)
    got = signing.finish_batch(prepared(), HMAC_KEY)
    assert [type(r) for r in returned] == [list, bytes, list]
    with _python_finish():
        assert got == signing.finish_batch(prepared(), HMAC_KEY)
    assert codec.decode(got[1][0]).security.tree_index == 1


def test_the_python_finish_still_gives_the_reference() -> None:
    """The library's own fallback (no compiled call) against the reference, on the same envelopes."""
    envs = _preparable(_envelopes_of_the_vectors())[:90]
    with _python_finish():
        got, _ = _compiled([_copy(e) for e in envs], ED_KEY, BOTH)
    _assert_same(got, _reference([_copy(e) for e in envs], ED_KEY, BOTH))


def test_a_panic_is_worded_as_a_prism_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> None:
        raise native.module.WireFault("internal", 0, None, None, None, None)

    monkeypatch.setattr(signing, "_native_finish_batch", boom)
    with pytest.raises(SignatureError, match=r"compiled batch finish failed \(internal\)") as info:
        signing.sign_batch([rich_envelope()], HMAC_KEY, BOTH)
    assert "PRISM_NATIVE=0" in (info.value.hint or "")


def _sign(statement: bytes) -> bytes:
    return signing.signature_over(HMAC_KEY, [statement])


_PIECES = st.one_of(st.none(), st.tuples(st.binary(max_size=4), st.binary(max_size=40), st.binary(max_size=40),
                                         st.binary(max_size=40), st.binary(max_size=60),
                                         st.one_of(st.none(), st.binary(max_size=40))))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32), _PIECES),
                min_size=1, max_size=6))
def test_the_compiled_finish_on_arbitrary_bytes(items: list[tuple[bytes, bytes, Any]]) -> None:
    """Copies where the bytes splice, else the audit path; the same tree as Python's either way."""
    sig, done = native.module.finish_batch(items, _sign)
    root, paths = signing.merkle_tree([signing.leaf_hash(d, r) for d, r, _ in items])
    assert sig == _sign(signing.batch_statement(len(items), root))
    for (_, _, pieces), got, path in zip(items, done, paths, strict=True):
        if type(got) is bytes:
            assert got == path
        else:
            assert pieces is not None and len(got) == len(pieces[0])


def test_the_compiled_finish_refuses_what_is_not_a_batch() -> None:
    with pytest.raises(ValueError, match="at least one leaf"):
        native.module.finish_batch([], _sign)
    with pytest.raises(ValueError, match="32 bytes"):
        native.module.finish_batch([(b"d" * 31, b"r" * 32, None)], _sign)

    def refuse(_: bytes) -> bytes:
        raise RuntimeError("no key")

    with pytest.raises(RuntimeError, match="no key"):
        native.module.finish_batch([(b"d" * 32, b"r" * 32, None)], refuse)
    # a payload may be any contiguous buffer (a memoryview of the received message)
    env = rich_envelope()
    env.header.security.ClearField("encryption")
    env.header.observability.ClearField("labels")
    env.header.extensions.clear()
    p = signing.prepare_batch(env, HMAC_KEY, BOTH)
    assert p.compiled is not None
    codes, head_d, sec_d, head_r, full, payload = p.compiled
    as_view = (codes, head_d, sec_d, head_r, full, memoryview(bytearray(payload or b"")))
    as_bytes = (codes, head_d, sec_d, head_r, full, bytes(payload or b""))
    one = native.module.finish_batch([(p.draft_digest, p.reviewed_digest, as_view)], _sign)
    two = native.module.finish_batch([(p.draft_digest, p.reviewed_digest, as_bytes)], _sign)
    assert one == two and type(one[1][0]) is list
