"""Redaction of secrets and tagged PII from any text Prism writes for humans or tools
(logs, span attributes, metric label values, health messages).

Redaction is a property of the sinks, not of the callers: a `Redactor` is applied by the
logging handler filter, by `stage_span` and by the metrics label guard, so a forgotten
`log.info("%s", token)` cannot leak. It removes, in this order:

1. registered values (`register_secret`): known keys, the tokens the worker validated, tagged
   PII field values, canaries. Exact substring match, including the hex/base64/repr forms of
   byte secrets, since that is how bytes usually end up in text;
2. PEM blocks (`-----BEGIN ...-----` up to the matching END, or to the end of the text when
   a block was cut off);
3. JWT-looking strings: three (or five, JWE) base64url segments starting with `eyJ` (the
   base64url of `{"`, which every JOSE header starts with; plain `a.b.c` is not matched, so
   host names and dotted identifiers survive);
4. `Bearer <credentials>` / `Basic <credentials>` authorization values;
5. the value in `name=value`, `name: value`, `"name": "value"` pairs whose name ends in
   token, secret, password/passwd/pwd, key, signature, authorization, credential(s), cookie
   or session (so `auth_token=`, `api-key:`, `"client_secret":` are caught but `key_id` and
   `signature_algorithm` - needed in audit records - are not).

Registered values shorter than `min_secret_length` (default 4) are refused: a two-letter value
would redact that substring out of every log line and make logs useless.

PII values of failed messages (`register_pii`, app/schema/pii.py `PiiValueFinder`) are kept
apart from the secrets: they change with every failing message, and recompiling the secrets'
trie regex for each (~1 s per compile at 4096 values) would stall the worker in a failure
storm. They sit in a bounded most-recent set (`max_pii_values`) matched by plain substring
search: ~0.1 us per value per redacted text, and texts are redacted only when written.
"""

from __future__ import annotations

import base64
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "[REDACTED]"

_SENSITIVE_WORDS = (
    "token", "secret", "password", "passwd", "pwd", "key", "signature", "authorization",
    "credential", "credentials", "cookie", "session", "apikey", "privatekey",
)

_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----.*?(?:-----END [A-Z0-9 ]{1,64}-----|\Z)", re.DOTALL)
# A JOSE header is a JSON object: its base64url starts with "ey" ('{' then '"' or a space)
# or "ew" ('{' then a newline/tab). Then 2 (JWS) or 4 (JWE) more segments.
# No leading \b: in a bytes repr a token follows an escape ("\\x02eyJ..."), where "2e" has no
# word boundary. Matching inside a longer base64url run only ever redacts more.
#
# Found in linear time by `jwt_spans`, not by one regex: the pattern this replaced,
# `e[wy][A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*){0,2}`, restarts at
# every "ey"/"ew" of a long base64url run and scans to its end: quadratic (40 kB of "eyey..."
# took ~1 s per log line; the DLQ's variant over message payloads, 1 MB ~8 min).
_DOTTED_RUN = re.compile(r"(?<![A-Za-z0-9_.-])[A-Za-z0-9_-]*+(?:\.[A-Za-z0-9_-]*+){2,}+")
_DOTTED_RUN_BYTES = re.compile(rb"(?<![A-Za-z0-9_.-])[A-Za-z0-9_-]*+(?:\.[A-Za-z0-9_-]*+){2,}+")
_URL_CREDENTIALS = re.compile(r"(?<=://)([^/\s:@]+):[^/\s@]+@")
_AUTH_SCHEME = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{4,}", re.IGNORECASE)
# Every repetition below has exactly one way to match a given text (or is bounded), so the
# cost is linear in the text: log lines carry producer-controlled bytes (error messages, reprs
# of records), and an ambiguous pattern is a ReDoS. The quoted value used to be
# `(?:\\.|(?!q).)*`, where a backslash could be consumed either way: with no closing quote
# the engine tried 2^n splits of n escapes - one aiokafka DEBUG line (a ProduceRequest repr
# in which a header ended in "token" followed by the bytes `:"`) held a test worker for 5 min.
_SENSITIVE_NAME = (
    r"[A-Za-z0-9_.\-]{0,64}(?:" + "|".join(_SENSITIVE_WORDS) + r")s?"
)
_KV = re.compile(
    r"""(?P<name>["']?\b""" + _SENSITIVE_NAME + r"""\b["']?)"""
    r"""(?P<sep>\s*[:=]\s*)"""
    # quoted value: escapes or any other non-quote character of the line, possessively; an
    # unterminated value is masked to the end of its line (it is still a secret)
    r"""(?:b?(?P<q>["'])(?P<qv>(?:\\.|(?!(?P=q))[^\\\n])*+\\?)(?:(?P=q)|(?=\n)|\Z)"""
    r"""|(?!\[REDACTED\])(?P<uv>"""
    r"""(?:bearer|basic|digest|token)\s+(?:\[REDACTED\]|[^\s,;&}\])"']+)"""
    r"""|[^\s,;&}\])"']+))""",
    re.IGNORECASE,
)


def jwt_spans(text: str | bytes, *, strict: bool = False) -> list[tuple[int, int]]:
    """``(start, end)`` of every JWT-shaped substring of `text`, left to right, in linear time.

    Default (logs): a first segment from "ey"/"ew" on with at least 6 more characters, a second of
    at least 2, a third of any length, and up to two more segments (JWE has five). The start may be
    inside a longer base64url or dotted run (a token after a `\\x02` escape in a bytes repr), which
    only ever masks more. `strict=True` (message bytes in DLQ records, where masking too much
    damages the payload kept for replay): "eyJ" plus at least 4, a second segment of at least 4, a
    third of any length, and the two JWE segments only when both are non-empty.
    """
    run_re = _DOTTED_RUN_BYTES if isinstance(text, bytes) else _DOTTED_RUN
    dot = b"." if isinstance(text, bytes) else "."
    heads = ((b"eyJ",) if isinstance(text, bytes) else ("eyJ",)) if strict else (
        (b"ey", b"ew") if isinstance(text, bytes) else ("ey", "ew"))
    need_first, need_second = (4, 4) if strict else (6, 2)
    spans: list[tuple[int, int]] = []
    for run in run_re.finditer(text):  # type: ignore[arg-type]
        segs = run.group(0).split(dot)  # type: ignore[arg-type]
        offsets, pos = [], run.start()
        for seg in segs:
            offsets.append(pos)
            pos += len(seg) + 1
        k = 0
        while k + 2 < len(segs):
            first = segs[k]
            found = [i for i in (first.find(h) for h in heads) if i >= 0]  # type: ignore[arg-type]
            i = min(found) if found else -1
            if i < 0 or len(first) - i - len(heads[0]) < need_first or len(segs[k + 1]) < need_second:
                k += 1
                continue
            end = k + 2  # index of the third segment
            if strict:
                if end + 2 < len(segs) and segs[end + 1] and segs[end + 2]:
                    end += 2
            else:
                end = min(end + 2, len(segs) - 1)
            spans.append((offsets[k] + i, offsets[end] + len(segs[end])))
            k = end + 1
    return spans


def _mask_spans(text: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for start, end in spans:
        out += [text[last:start], MASK]
        last = end
    out.append(text[last:])
    return "".join(out)


_TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.~+/=-"


def _cut(text: str, limit: int) -> str:
    """The first `limit` characters and a marker. Bounds what every pattern costs on one text
    (a 1 MB repr in a DEBUG line took seconds even with linear patterns). A token the cut splits
    would no longer look like one, so a token-like run ending at the cut is dropped as well."""
    head = text[:limit].rstrip(_TOKEN_CHARS)
    return f"{head}...[{len(text) - len(head)} characters not shown]"


def is_sensitive_key(name: str) -> bool:
    """True for field names whose values must never be written (auth_token, api-key, ...)."""
    n = name.strip().strip("\"'").lower()
    return any(n.endswith(w) or n.endswith(w + "s") for w in _SENSITIVE_WORDS)


def _kv_sub(m: re.Match[str]) -> str:
    if m.group("q") is not None:
        q = m.group("q")
        return f"{m.group('name')}{m.group('sep')}{q}{MASK}{q}"
    return f"{m.group('name')}{m.group('sep')}{MASK}"


def _trie_regex(words: Iterable[str]) -> re.Pattern[str] | None:
    """One regex matching any of `words`, longest first, built as a trie so matching costs
    O(text length x trie depth) rather than O(text length x number of words)."""
    trie: dict[str, Any] = {}
    count = 0
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = True
        count += 1
    if not count:
        return None

    def emit(node: dict[str, Any]) -> str:
        # Walk single-child chains iteratively so a long secret does not recurse per char.
        out = []
        while True:
            terminal = "" in node
            kids = [(c, n) for c, n in node.items() if c != ""]
            if len(kids) == 1 and not terminal:
                out.append(re.escape(kids[0][0]))
                node = kids[0][1]
                continue
            if not kids:
                return "".join(out)
            alts = "|".join(re.escape(c) + emit(n) for c, n in sorted(kids, key=lambda x: x[0]))
            out.append(f"(?:{alts})?" if terminal else f"(?:{alts})")
            return "".join(out)

    return re.compile(emit(trie))


def _byte_forms(value: bytes) -> list[str]:
    forms = [value.hex(), base64.b64encode(value).decode(), base64.urlsafe_b64encode(value).decode()]
    forms += [f.rstrip("=") for f in forms[1:]]
    forms.append(repr(value)[2:-1])
    try:
        text = value.decode("utf-8")
        if text.isprintable():
            forms.append(text)
    except UnicodeDecodeError:
        pass
    return forms


class Redactor:
    """Removes secrets from text. Thread-safe; one per worker (or the process default)."""

    def __init__(self, *, min_secret_length: int = 4, max_secrets: int = 4096, max_length: int = 65_536,
                 max_pii_values: int = 1024) -> None:
        self.min_secret_length = min_secret_length
        self.max_secrets = max_secrets
        self.max_pii_values = max_pii_values
        self._pii: OrderedDict[str, None] = OrderedDict()
        self.max_length = max_length
        self._secrets: OrderedDict[str, None] = OrderedDict()
        self._compiled: re.Pattern[str] | None = None
        self._pending: list[str] = []  # registered since the last compile: matched with `in`
        self._lock = threading.Lock()

    # -- registration ------------------------------------------------------------------------
    def register_secret(self, value: str | bytes | bytearray | memoryview) -> bool:
        """Never let `value` appear in output again. Returns False if it is too short to
        register (see the module docstring). Byte values are registered in their hex, base64
        and repr renderings too. Least-recently registered values are forgotten past
        `max_secrets`, which bounds memory when the worker registers PII per message."""
        forms = _byte_forms(bytes(value)) if isinstance(value, bytes | bytearray | memoryview) else [value]
        added = False
        with self._lock:
            for f in forms:
                if not isinstance(f, str) or len(f) < self.min_secret_length:
                    continue
                if f in self._secrets:
                    self._secrets.move_to_end(f)
                    added = True
                    continue
                self._secrets[f] = None
                self._pending.append(f)
                added = True
                if len(self._secrets) > self.max_secrets:
                    # Forget the oldest; the compiled regex may still mask it until the next
                    # recompile, which over-redacts harmlessly and keeps registration cheap.
                    self._secrets.popitem(last=False)
            # Recompile once the linear `in` scan of pending values would cost more than the
            # (amortized) trie compile: cheap registration even when PII is registered per message.
            if len(self._pending) > max(32, len(self._secrets) // 8):
                self._recompile()
        return added

    def register_pii(self, values: Iterable[str]) -> int:
        """Mask these PII field values from now on (the most recent `max_pii_values` of them);
        returns how many were (re)registered. Cheap: no regex is rebuilt (module docstring)."""
        n = 0
        with self._lock:
            for v in values:
                if not isinstance(v, str) or len(v) < self.min_secret_length:
                    continue
                if v in self._pii:
                    self._pii.move_to_end(v)
                else:
                    self._pii[v] = None
                    if len(self._pii) > self.max_pii_values:
                        self._pii.popitem(last=False)
                n += 1
        return n

    def _recompile(self) -> None:
        self._compiled = _trie_regex(self._secrets)
        self._pending = []

    @property
    def secret_count(self) -> int:
        return len(self._secrets)

    # -- redaction ---------------------------------------------------------------------------
    def redact(self, text: str, *, patterns: bool = True) -> str:
        """`text` with every secret replaced by `[REDACTED]`. `patterns=False` removes only
        registered values (for fields that are identifiers by definition, like `key_id`,
        where the name=value heuristics would mangle `hmac-key:2024`)."""
        if not text:
            return text
        if len(text) > self.max_length:
            text = _cut(text, self.max_length)
        compiled, pending = self._compiled, self._pending
        if compiled is not None:
            text = compiled.sub(MASK, text)
        for s in tuple(pending):
            if s in text:
                text = text.replace(s, MASK)
        if self._pii:
            # longest first, so a value that contains another is masked whole
            for s in sorted([v for v in tuple(self._pii) if v in text], key=len, reverse=True):
                text = text.replace(s, MASK)
        if not patterns:
            return text
        return redact_patterns(text)

    def redact_value(self, value: Any, *, _depth: int = 0) -> Any:
        """Structured redaction: mapping entries with a sensitive key are masked whatever
        their value; strings are redacted; containers are walked (bounded depth); other
        objects are rendered with `str()` and redacted (their text is what a sink writes)."""
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self.redact(value)
        if _depth > 8:
            return MASK
        if isinstance(value, Mapping):
            return {
                str(k): (MASK if is_sensitive_key(str(k)) else self.redact_value(v, _depth=_depth + 1))
                for k, v in value.items()
            }
        if isinstance(value, list | tuple | set | frozenset):
            return [self.redact_value(v, _depth=_depth + 1) for v in value]
        if isinstance(value, bytes | bytearray | memoryview):
            return self.redact(repr(bytes(value)))
        return self.redact(str(value))


def redact_patterns(text: str) -> str:
    """`text` through the pattern rules (2-5 of the module docs: PEM blocks, JWTs, a URL's
    `user:password@`, `Bearer`/`Basic` credentials, secret-named `name=value` pairs) and nothing
    else - no registered values, no cut. The rules of `Redactor.redact`, for text that is shown
    rather than logged (a DLQ record's value, headers and error on `prism dlq show` and the
    console, the console's error pages): one set of rules for every place Prism hides secrets.
    Linear in the text (every pattern is; module docs), so it is not cut."""
    if not text:
        return text
    if "-----BEGIN " in text:
        text = _PEM.sub(MASK, text)
    if "e" in text:
        spans = jwt_spans(text)
        if spans:
            text = _mask_spans(text, spans)
    if "://" in text:
        text = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    text = _KV.sub(_kv_sub, text)  # before the scheme rule: "Authorization: Bearer x" masks as one value
    return _AUTH_SCHEME.sub(lambda m: f"{m.group(1)} {MASK}", text)


def redact_shown(value: Any) -> Any:
    """`value` - a document about to be shown (JSON-like: mappings, lists, strings, numbers) - with
    every string, mapping keys included, through `redact_patterns`. Walked whole, at any depth: the
    documents shown are already bounded (app/untrusted_json.py: 64 levels)."""
    if isinstance(value, str):
        return redact_patterns(value)
    if isinstance(value, Mapping):
        return {redact_shown(k) if isinstance(k, str) else k: redact_shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_shown(v) for v in value]
    return value


_default: Redactor | None = None
_default_lock = threading.Lock()


def default_redactor() -> Redactor:
    """The process-wide redactor used when none is passed (logging config, health, ...)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Redactor()
        return _default
