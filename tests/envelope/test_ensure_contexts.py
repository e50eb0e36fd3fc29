"""`Envelope.ensure_security` / `ensure_observability` / `ensure_schema` read the context once
(issue 29, `stagelean`): the object they mark present is the header's own context, present
with no write yet, and what is written through it is what the header and its encoding carry -
for a new envelope and a decoded one, with the context absent or already set."""

from __future__ import annotations

import pytest

from app.envelope import Layout, decode, encode, new_envelope

# (method, header field, a string field of that context)
_CONTEXTS = [("ensure_security", "security", "publisher_id"),
             ("ensure_observability", "observability", "trace_id"),
             ("ensure_schema", "schema", "schema_url")]


def _envelopes(field: str, attr: str):
    fresh = new_envelope("t", b"x", namespace="n")
    fresh.header.ClearField(field)
    absent = decode(encode(fresh, Layout.REVIEWED))
    present = decode(encode(fresh, Layout.REVIEWED))
    setattr(getattr(present.header, field), attr, "before")
    present = decode(encode(present, Layout.REVIEWED))
    return {"new": fresh, "decoded, absent": absent, "decoded, present": present}


@pytest.mark.parametrize(("method", "field", "attr"), _CONTEXTS)
def test_the_context_is_the_headers_own_and_present(method, field, attr) -> None:
    for name, env in _envelopes(field, attr).items():
        was = getattr(getattr(env.header, field), attr)
        ctx = getattr(env, method)()
        assert env.header.HasField(field), name  # present before anything is written
        assert ctx is getattr(env.header, field), name
        assert getattr(ctx, attr) == was, name  # a set context keeps what it had
        assert getattr(env, method)() is ctx, name
        setattr(ctx, attr, "after")
        assert getattr(getattr(env.header, field), attr) == "after", name
        again = decode(encode(env, Layout.REVIEWED))
        assert getattr(getattr(again.header, field), attr) == "after", name


@pytest.mark.parametrize(("method", "field", "attr"), _CONTEXTS)
def test_an_ensured_context_with_nothing_written_is_encoded_present(method, field, attr) -> None:
    env = _envelopes(field, attr)["decoded, absent"]
    getattr(env, method)()
    assert decode(encode(env, Layout.REVIEWED)).header.HasField(field)
