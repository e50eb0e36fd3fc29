"""Authenticate's last-token match and its token strip (issue 29, `stagelean`).

The stage keeps the token it used last with its cache entry, so that the next message with the
same token is matched by comparing the strings instead of hashing the token and looking the
digest up. It must answer exactly what the digest cache answers: the same identity for the same
token, another token never served from it, an expired entry verified again, a JWKS reload
forgetting it (tests/agents/test_stages.py, the revoked key), and it must not keep a token any
longer than its entry lives. The strip after the check clears a token read from the context
directly; an empty token keeps strip_token's own test (a present but empty token is cleared too).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from app.agents import authenticate as auth_module
from app.agents.authenticate import CACHE_SECONDS, Authenticate
from app.errors import AuthError, TokenExpiredError
from app.topology import AuthenticateStage
from tests.agents.conftest import envelope_bytes, make_msg


def _stage(dev_keys: Any, policy: str = "required") -> Authenticate:
    return Authenticate(AuthenticateStage(policy=policy, jwks=str(dev_keys.jwks_path), issuer="https://auth.prism.dev",
                                          audience="prism", algorithms=["EdDSA"]), jwks_path=str(dev_keys.jwks_path))


def _with_token(token: str | None):
    env, _ = envelope_bytes()
    if token is not None:
        env.ensure_security().auth_token = token
    msg = make_msg(b"")
    msg.envelope = env
    return msg


class _Counting:
    """Counts the stage's verifications and digests."""

    def __init__(self, stage: Authenticate, monkeypatch: pytest.MonkeyPatch) -> None:
        self.verified = self.digests = 0
        real_auth = stage.authenticator.authenticate

        def authenticate(token: str, **kw: Any) -> Any:
            self.verified += 1
            return real_auth(token, **kw)

        def sha256(data: bytes) -> Any:
            self.digests += 1
            return hashlib.sha256(data)

        monkeypatch.setattr(stage.authenticator, "authenticate", authenticate)
        monkeypatch.setattr(auth_module, "hashlib", SimpleNamespace(sha256=sha256))


def _publisher(msg) -> tuple[str, str]:
    sec = msg.env.security
    return sec.publisher_id, sec.publisher_team


def test_a_repeated_token_is_matched_without_a_digest(dev_keys, monkeypatch) -> None:
    stage = _stage(dev_keys)
    count = _Counting(stage, monkeypatch)
    token = dev_keys.mint_token("svc-orders", team="commerce")
    msgs = [_with_token(token) for _ in range(3)]
    for m in msgs:
        stage.process(m)
    assert (count.verified, count.digests) == (1, 1)
    assert [_publisher(m) for m in msgs] == [("svc-orders", "commerce")] * 3
    assert all(m.identity is msgs[0].identity for m in msgs)


def test_alternating_tokens_each_keep_their_own_identity(dev_keys, monkeypatch) -> None:
    """Another token is never served from the last one's entry; the digest cache still serves
    both after their first verification."""
    stage = _stage(dev_keys)
    count = _Counting(stage, monkeypatch)
    a = dev_keys.mint_token("svc-a", team="team-a")
    b = dev_keys.mint_token("svc-b", team="team-b")
    seen = []
    for token in (a, b, a, a, b, b, a):
        m = _with_token(token)
        stage.process(m)
        seen.append(_publisher(m))
    assert seen == [("svc-a", "team-a"), ("svc-b", "team-b"), ("svc-a", "team-a"), ("svc-a", "team-a"),
                    ("svc-b", "team-b"), ("svc-b", "team-b"), ("svc-a", "team-a")]
    assert count.verified == 2  # each once: the rest from the cache or the last token
    assert count.digests == 5  # every change of token (a, b, a, b, a); no repeat digested


def test_an_expired_entry_is_verified_again(dev_keys, monkeypatch) -> None:
    """Past the entry's end (the token's `exp`, here before now + CACHE_SECONDS) the last token is
    not used: the token is verified again - accepted within the leeway, refused after it."""
    clock = [1_000_000.0]
    monkeypatch.setattr(auth_module, "time", SimpleNamespace(time=lambda: clock[0]))
    stage = _stage(dev_keys)
    count = _Counting(stage, monkeypatch)
    token = dev_keys.mint_token("svc-orders", ttl_s=30, now=clock[0])
    stage.process(_with_token(token))
    clock[0] += 29
    stage.process(_with_token(token))
    assert count.verified == 1
    clock[0] += 2  # past exp (< now + CACHE_SECONDS): the entry ends with the token
    assert CACHE_SECONDS > 31
    stage.process(_with_token(token))
    assert count.verified == 2
    clock[0] += stage.config.leeway_seconds + 60
    with pytest.raises(TokenExpiredError):
        stage.process(_with_token(token))
    assert count.verified == 3
    assert stage._last is None  # a refused token is not kept


def test_an_entry_ends_after_the_cache_time_even_for_a_long_token(dev_keys, monkeypatch) -> None:
    clock = [2_000_000.0]
    monkeypatch.setattr(auth_module, "time", SimpleNamespace(time=lambda: clock[0]))
    stage = _stage(dev_keys)
    count = _Counting(stage, monkeypatch)
    token = dev_keys.mint_token("svc-orders", ttl_s=3600, now=clock[0])
    stage.process(_with_token(token))
    clock[0] += CACHE_SECONDS - 1
    stage.process(_with_token(token))
    assert count.verified == 1
    clock[0] += 2
    stage.process(_with_token(token))
    assert count.verified == 2


def test_the_last_token_is_kept_only_while_it_is_the_last(dev_keys) -> None:
    stage = _stage(dev_keys)
    a = dev_keys.mint_token("svc-a")
    stage.process(_with_token(a))
    assert stage._last is not None and stage._last[0] == a
    with pytest.raises(AuthError):
        stage.process(_with_token("not.a.jwt"))
    assert stage._last is None


def test_the_token_is_stripped_present_or_empty(dev_keys) -> None:
    """A verified token and a present-but-empty one are both cleared (the context keeps no
    `auth_token` field); a message with no security context keeps none."""
    stage = _stage(dev_keys, "optional")
    m = _with_token(dev_keys.mint_token("svc-orders"))
    stage.process(m)
    assert not m.env.header.security.HasField("auth_token")
    empty = _with_token("")
    assert empty.env.header.security.HasField("auth_token")
    stage.process(empty)
    assert not empty.env.header.security.HasField("auth_token")
    absent = _with_token(None)
    absent.env.header.ClearField("security")
    stage.process(absent)
    assert not absent.env.header.HasField("security")
