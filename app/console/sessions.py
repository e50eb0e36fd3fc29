"""Log-in sessions and CSRF tokens of the console.

Why server-side sessions with an opaque cookie, and not HTTP basic in the browser: a browser
caches basic credentials and sends them with every request to the origin - cross-site form
posts included - and offers no way to log out. Here the browser gets a random 256-bit token
(``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS) that names a session in this
process's memory; nothing in it can be forged or decoded, so no signing key is needed. The
password is checked once, at log-in, by :class:`app.security.http_auth.HttpAuth` (the users
file's Argon2id hashes, its per-address failure limit), and never kept.

Every session has its own CSRF token, rendered into each state-changing form and compared in
constant time on the POST, together with a same-origin check of ``Origin``/``Referer``
(:func:`check_same_origin`). Sessions end after ``idle_timeout_s`` without a request,
``max_session_s`` after log-in, on log-out, and with the process (one console process; a
restart logs everyone out, which is the safe direction).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from app.security.http_auth import Principal

COOKIE = "prism_console"
#: sessions kept at most (the oldest are dropped first): bounded memory under a log-in flood
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    principal: Principal
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = 0.0
    seen: float = 0.0


class Sessions:
    """Token -> :class:`Session`, expiring (module docs)."""

    def __init__(self, idle_timeout_s: float, max_session_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle, self.max_age, self.clock = idle_timeout_s, max_session_s, clock
        self._by_token: OrderedDict[str, Session] = OrderedDict()

    def create(self, principal: Principal) -> tuple[str, Session]:
        """A new session (a new token every log-in: no session fixation)."""
        now = self.clock()
        token = secrets.token_urlsafe(32)
        session = Session(principal, created=now, seen=now)
        self._by_token[token] = session
        while len(self._by_token) > MAX_SESSIONS:
            self._by_token.popitem(last=False)
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        session = self._by_token.get(token)
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.idle or now - session.created > self.max_age:
            del self._by_token[token]
            return None
        session.seen = now
        return session

    def end(self, token: str | None) -> None:
        if token:
            self._by_token.pop(token, None)


def csrf_ok(session: Session | None, sent: str | None) -> bool:
    """The form's token is the session's (constant-time)."""
    return session is not None and bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())


def check_same_origin(own_origin: str, origin: str | None, referer: str | None) -> bool:
    """A state-changing request comes from a page of this console: its ``Origin`` (sent by every
    current browser on a POST) is ours, or without one its ``Referer`` starts with ours. A
    request with neither is allowed here - the CSRF token still has to match."""
    if origin:
        return origin == own_origin
    if referer:
        return referer == own_origin or referer.startswith(own_origin + "/")
    return True
