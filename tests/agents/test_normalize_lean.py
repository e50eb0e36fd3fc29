"""Normalize.process's per-message shortcuts (issue 29) decide exactly what the code they
replaced decided: which auth tokens are registered with the log redactor."""

from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import app.agents.normalize as normalize_module
from app.agents.normalize import Normalize
from app.envelope import encode, new_envelope
from app.topology import NormalizeStage
from tests.agents.conftest import make_msg


def _registered_before(token: str) -> bool:
    """The test as it read before issue 29's cut (`count` over the whole token): the reference."""
    return bool(token) and not (token.startswith("eyJ") and token.count(".") >= 2) and bool(token.strip("*"))


#: tokens near the JWT shape: the prefix, dots anywhere (none, one, two, more), '*' masks
_TOKENS = st.text(alphabet="eyJ.*a=", max_size=24) | st.builds(
    lambda a, b: f"eyJ{a}.{b}", st.text(alphabet="aJ.*", max_size=8), st.text(alphabet="a.*", max_size=8))


@settings(max_examples=300, deadline=None)
@given(_TOKENS)
def test_opaque_tokens_are_registered_exactly_as_before(token):
    env = new_envelope("orders.created", b"{}", namespace="order-events")
    env.ensure_security().auth_token = token
    msg = make_msg(encode(env))
    redactor = mock.Mock()
    with mock.patch.object(normalize_module, "default_redactor", return_value=redactor):
        Normalize(NormalizeStage(), namespaces={"orders.created": "order-events"},
                  formats={"orders.created": "auto"}).process(msg)
    assert msg.secrets == ([token.encode()] if token else [])
    if _registered_before(token):
        redactor.register_secret.assert_called_once_with(token)
    else:
        redactor.register_secret.assert_not_called()


def test_the_token_shapes_that_decide_it():
    """The edges, named (the property test finds them too): a JWT needs the prefix and two dots."""
    assert not _registered_before("eyJa.b.c") and not _registered_before("eyJ..")
    assert _registered_before("eyJa.b") and _registered_before("eyJab") and _registered_before("a.b.c")
    assert not _registered_before("***") and not _registered_before("")
    for token in ("eyJa.b.c", "eyJ..", "eyJa.b", "eyJab", "a.b.c", "***", ".eyJ.a"):
        test_opaque_tokens_are_registered_exactly_as_before.hypothesis.inner_test(token)
