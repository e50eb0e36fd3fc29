"""`sanity_problems`' fast path (issue 29, `stagelean`): the five lengths compared one by one and
`isprintable()` asked before the control-character search must find exactly what the former
test - `max(map(len, ...))` per group and the search alone - found. That former function is kept
here, verbatim, as the reference."""

from __future__ import annotations

import sys
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import Envelope, new_envelope, sanity_problems
from app.envelope.validation import _CONTROL, SanityPolicy, _string_problems
from app.errors import FieldProblem


def _reference(env: Envelope, *, now_ms: int | None = None,
               policy: SanityPolicy = SanityPolicy()) -> list[FieldProblem]:
    """`sanity_problems` before the fast path (commit b5027af)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    h = env.header
    md = h.metadata
    p: list[FieldProblem] = []
    published = md.published_at_ms
    if published > now + policy.max_future_skew_ms:
        p.append(FieldProblem("metadata.published_at_ms",
                              f"is {(published - now) // 1000}s in the future "
                              f"(allowed skew {policy.max_future_skew_ms // 1000}s)"))
    elif 0 < published < now - policy.max_age_ms:
        p.append(FieldProblem("metadata.published_at_ms", "is unrealistically old"))
    ids = (md.message_id, md.correlation_id, md.causality_parent)
    names = (md.topic, md.namespace)
    sec = h.security if h.HasField("security") else None
    who = (sec.publisher_id, sec.publisher_team) if sec is not None else ()
    if (max(map(len, ids)) > policy.max_id_length or max(map(len, names)) > policy.max_name_length
            or _CONTROL.search("".join((*ids, *names, *who)))):
        p += _string_problems(ids, names, who, policy)
    obs = h.observability if h.HasField("observability") else None
    labels = obs.labels if obs is not None else None
    if labels:
        if len(labels) > policy.max_label_count:
            p.append(FieldProblem("observability.labels", f"has {len(labels)} entries, over {policy.max_label_count}"))
        for k, v in labels.items():
            if len(k) + len(v) > policy.max_label_length or _CONTROL.search(k) or _CONTROL.search(v):
                p.append(FieldProblem(f"observability.labels[{k[:32]!r}]", "is too long or has control characters"))
    return p


def test_every_control_character_is_unprintable() -> None:
    """What the fast path rests on: a text `isprintable()` accepts has no character the
    control-character search finds - checked over every code point."""
    for cp in range(sys.maxunicode + 1):
        c = chr(cp)
        if _CONTROL.match(c):
            assert not c.isprintable(), hex(cp)


# printable text, and at most one character that is a control character or unprintable without
# being one (NEL, NBSP, line/paragraph separators, a zero-width space, a private-use, a tag and a
# noncharacter-plane code point): mostly printable, so that the fast path itself is what decides
_PRINTABLE = st.sampled_from(["a", "Z", "0", "-", "/", " ", "é", "ü"])
_SPECIAL = st.sampled_from(["\x00", "\x07", "\t", "\n", "\x1b", "\x1f", "\x7f", "\x85", "\xa0", "\u2028", "\u2029",
                            "\u200b", "\ue000", "\U000e0001", "\U0010fffd"])


def _text(limit: int) -> st.SearchStrategy[str]:
    base = st.one_of(st.text(_PRINTABLE, max_size=6), st.text(_PRINTABLE, min_size=limit - 2, max_size=limit + 2))
    return st.one_of(base, base, base, st.builds(lambda a, c, b: a + c + b, base, _SPECIAL, st.text(_PRINTABLE, max_size=3)))


@settings(max_examples=600, deadline=None)
@given(mid=_text(12), cid=_text(12), cause=_text(12), topic=_text(16), namespace=_text(16),
       who=st.none() | st.tuples(_text(8), _text(8)), id_max=st.integers(10, 14), name_max=st.integers(14, 18))
def test_the_fast_path_finds_what_the_former_test_found(mid, cid, cause, topic, namespace, who, id_max,
                                                          name_max) -> None:
    """Generated strings of every field, near the (small) limits, with and without a security
    context: the same problems in the same order as the reference."""
    now = 1_700_000_000_000
    env = new_envelope("t", b"x", namespace="n", published_at_ms=now)
    md = env.metadata
    md.message_id, md.correlation_id, md.causality_parent, md.topic, md.namespace = mid, cid, cause, topic, namespace
    if who is not None:
        sec = env.ensure_security()
        sec.publisher_id, sec.publisher_team = who
    policy = SanityPolicy(max_id_length=id_max, max_name_length=name_max)
    got = sanity_problems(env, now_ms=now, policy=policy)
    want = _reference(env, now_ms=now, policy=policy)
    assert [(p.path, p.problem) for p in got] == [(p.path, p.problem) for p in want]


def test_an_unprintable_character_that_is_no_control_character_is_no_problem() -> None:
    """`isprintable()` false alone is not a finding: the search still decides (a NEL, a
    zero-width space in a topic and a publisher)."""
    now = 1_700_000_000_000
    env = new_envelope("t\x85\u200b", b"x", namespace="n", published_at_ms=now)
    env.ensure_security().publisher_id = "svc\u2028"
    assert sanity_problems(env, now_ms=now) == []
    env.ensure_security().publisher_team = "team\x1b"
    assert [p.path for p in sanity_problems(env, now_ms=now)] == ["security.publisher_team"]
