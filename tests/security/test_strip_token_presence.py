"""`strip_token` reads the security context without its presence test (issue 29, `stagelean`):
it must still leave an absent context absent, a present one present, and clear a token that is
present, empty or not - in a new envelope and in a decoded one."""

from __future__ import annotations

import pytest

from app.envelope import Layout, decode, encode, new_envelope
from app.security.jwt_auth import strip_token


def _cases():
    base = new_envelope("t", b"x", namespace="n")
    base.header.ClearField("security")
    absent = decode(encode(base, Layout.REVIEWED))
    no_token = decode(encode(base, Layout.REVIEWED))
    no_token.ensure_security().publisher_id = "svc"
    empty = decode(encode(base, Layout.REVIEWED))
    empty.ensure_security().auth_token = ""
    token = decode(encode(base, Layout.REVIEWED))
    token.ensure_security().auth_token = "eyJ.a.b"
    return [("new, absent", base, False, False), ("decoded, absent", absent, False, False),
            ("no token", no_token, False, True), ("empty token", empty, True, True), ("token", token, True, True)]


@pytest.mark.parametrize(("name", "env", "had", "present"), _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_strip_token_keeps_presence(name, env, had, present) -> None:
    assert strip_token(env) is had
    assert env.header.HasField("security") is present
    assert not env.header.security.HasField("auth_token")
    again = decode(encode(env, Layout.REVIEWED))
    assert again.header.HasField("security") is present
    assert not again.header.security.HasField("auth_token")
    assert strip_token(env) is False
