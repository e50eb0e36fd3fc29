"""Redaction must cost time linear in the text, whatever the text: log lines and DLQ records
carry producer-controlled bytes, so a pattern that backtracks is a way to stall the worker.

The inputs below are the shapes that did (an unterminated quoted value after `token:` followed by
escapes: exponential; runs of "ey"/"eyJ": quadratic) plus neighbours. Each test is bounded by
pytest-timeout: the old patterns needed minutes to hours on these sizes, the current ones take
milliseconds, so the bound checks termination, not speed.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.observability.redaction import MASK, Redactor, jwt_spans, redact_patterns, redact_shown

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzdmMtb3JkZXJzIn0.c2lnbmF0dXJlLWJ5dGVzLWhlcmU"

ADVERSARIAL = {
    "unterminated_quote_then_escapes": 'records=b\'\\x00token:"' + "\\x01" * 5_000 + "'",
    "ey_run": "ey" * 200_000,
    "key_run": "key" * 130_000,
    "dotted_ey_run": "eyJabcd." * 7_000,
    "many_kv": "token=a " * 7_000,
    "many_quotes": 'token="' * 8_000,
    "backslashes": 'secret="' + "\\" * 60_000,
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_text_is_redacted_in_bounded_time(text: str) -> None:
    out = Redactor(max_length=len(text) + 1).redact(text)  # no cut: the patterns alone
    assert out and len(out) <= len(text) + len(MASK) * len(text)


@pytest.mark.timeout(30)
def test_the_unterminated_quoted_value_is_masked_to_the_end_of_its_line() -> None:
    text = 'x token:"' + "\\x01" * 5_000 + "\nnext line stays"
    assert Redactor(max_length=10**6).redact(text) == f'x token:"{MASK}"\nnext line stays'
    assert Redactor().redact('token="abc\\"') == f'token="{MASK}"'  # an escaped quote is not the end
    assert Redactor().redact('token="a\\"b" after') == f'token="{MASK}" after'


def test_jwts_inside_runs_and_after_escapes_are_still_found() -> None:
    r = Redactor()
    for text in (f"Bearer-less {JWT} tail", f"b'\\x02{JWT}\\x00'", f"prefix.dotted.{JWT}", f"{JWT}.jwe.parts"):
        out = r.redact(text)
        assert "eyJhbGciOiJIUzI1NiJ9" not in out and MASK in out, out


def test_a_long_text_is_cut_without_leaving_part_of_a_token_at_the_cut() -> None:
    text = "a" * 100 + " " + JWT * 3  # the cut falls inside the token run
    out = Redactor(max_length=150).redact(text)
    assert out.startswith("a" * 100 + " ...[") and out.endswith("characters not shown]")
    assert "eyJ" not in out


# The regular expressions jwt_spans replaced: the oracle for what it must find (fine on short
# strings; quadratic on long runs, which is why they were replaced).
OLD_LOG = re.compile(r"e[wy][A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*){0,2}")
OLD_DLQ = re.compile(rb"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+)?")


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="eyJwab.-_ \\x0", max_size=48))
def test_jwt_spans_find_what_the_old_patterns_found(text: str) -> None:
    assert jwt_spans(text) == [m.span() for m in OLD_LOG.finditer(text)]
    data = text.encode()
    assert jwt_spans(data, strict=True) == [m.span() for m in OLD_DLQ.finditer(data)]


def test_registered_pii_values_are_masked_longest_first_and_bounded() -> None:
    r = Redactor(max_pii_values=3)
    assert r.register_pii(["alice", "alice@example.invalid", "ab", 42]) == 2  # too short / not text: skipped
    assert r.redact("to alice@example.invalid from alice") == f"to {MASK} from {MASK}"
    r.register_pii(["v-one", "v-two", "v-three"])  # pushes the oldest two out
    assert "alice" in r.redact("alice") and r.redact("v-one v-two v-three") == f"{MASK} {MASK} {MASK}"
    assert r.secret_count == 0  # PII values are not secrets: no trie recompile per failing message


def test_pii_registration_stays_cheap_in_a_failure_storm() -> None:
    import time

    r = Redactor()
    t0 = time.perf_counter()
    for i in range(20_000):
        r.register_pii([f"person-{i}@example.invalid"])
    per = (time.perf_counter() - t0) / 20_000
    assert per < 50e-6, f"{per * 1e6:.1f} us per registration"
    assert MASK in r.redact("failed for person-19999@example.invalid")


def test_shown_documents_get_the_pattern_rules_and_only_them() -> None:
    """`redact_patterns` is `Redactor.redact`'s rules without registered values or the cut (text
    shown, not logged: a DLQ record on `prism dlq show` and the console); `redact_shown` applies
    it to every string of a document, keys included, at any depth."""
    text = "GET https://alice:pw-123@h.example/x with Authorization: Basic YWxpY2U6cHctMTIz; password=hunter22"
    assert redact_patterns(text) == Redactor().redact(text)
    assert "pw-123" not in redact_patterns(text) and "YWxpY2U6" not in redact_patterns(text)
    assert "hunter22" not in redact_patterns(text)
    long = "x" * 200_000 + " https://u:long-pw@h"
    assert redact_patterns(long).startswith("x" * 200_000) and "long-pw" not in redact_patterns(long)  # not cut
    deep: object = "https://u:deep-pw@h"
    for _ in range(100):
        deep = {"k": [deep]}
    doc = {"https://u:key-pw@h": deep, "n": 3, "none": None}
    shown = repr(redact_shown(doc))
    assert "deep-pw" not in shown and "key-pw" not in shown and "'n': 3" in shown and MASK in shown
