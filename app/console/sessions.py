"""Log-in sessions and CSRF tokens of the console.

Why server-side sessions with an opaque cookie, and not HTTP basic in the browser: a browser
caches basic credentials and sends them with every request to the origin - cross-site form
posts included - and offers no way to log out. Here the browser gets a random 256-bit token
(``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS) that names a session in this
process's memory; nothing in it can be forged or decoded, so no signing key is needed. The
password is checked once, at log-in, by :class:`app.security.http_auth.HttpAuth` (the users
file's Argon2id hashes, its failure limit per user name and client address), and never kept.

Every session has its own CSRF token, rendered into each state-changing form and compared in
constant time on the POST, together with a same-origin check of ``Origin``/``Referer``
(:func:`check_same_origin`). Sessions end after ``idle_timeout_s`` without a request,
``max_session_s`` after log-in, on log-out, and with the process (one console process; a
restart logs everyone out, which is the safe direction). How many sessions one user may hold,
and which go when the console is full, is :class:`Sessions`'s: never another user's newest.
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
#: live sessions one user may hold (a new log-in ends that user's oldest): a user who logs in
#: again and again fills only their own share
MAX_SESSIONS_PER_USER = 20
#: live sessions kept at most (bounded memory under a log-in flood); see :meth:`Sessions.create`
MAX_SESSIONS = 10_000


class ConsoleFull(Exception):
    """Every session slot holds some user's only session: a new log-in is refused (503) rather
    than ending someone else's."""


@dataclass(slots=True)
class Session:
    principal: Principal
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = 0.0
    seen: float = 0.0


class Sessions:
    """Token -> :class:`Session`, expiring (module docs), with caps one user cannot turn against
    another:

    * per user (:data:`MAX_SESSIONS_PER_USER`): a user's new log-in ends *that user's* oldest
      session, nobody else's;
    * overall (:data:`MAX_SESSIONS`): expired sessions go first; then the oldest session of the
      user holding the most, as long as that user holds more than one. A user's most recent
      session is never ended to make room for another user's log-in - when every slot holds
      someone's only session the new log-in is refused (:class:`ConsoleFull`).

    So 10,001 log-ins by a read-only user end only that user's older sessions; an admin's session
    survives them."""

    #: what :meth:`create` raises when full (here too, so a caller needs only this class)
    Full = ConsoleFull

    def __init__(self, idle_timeout_s: float, max_session_s: float, *,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS,
                 max_per_user: int = MAX_SESSIONS_PER_USER) -> None:
        self.idle, self.max_age, self.clock = idle_timeout_s, max_session_s, clock
        self.max_sessions, self.max_per_user = max_sessions, max_per_user
        self._by_token: dict[str, Session] = {}
        #: user -> that user's tokens, oldest first
        self._by_user: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._by_token)

    def of(self, user: str) -> int:
        """How many live sessions `user` holds."""
        return len(self._by_user.get(user, ()))

    def _drop(self, token: str) -> None:
        session = self._by_token.pop(token, None)
        if session is None:
            return
        mine = self._by_user.get(session.principal.name)
        if mine is not None:
            mine.pop(token, None)
            if not mine:
                del self._by_user[session.principal.name]

    def _expired(self, session: Session, now: float) -> bool:
        return now - session.seen > self.idle or now - session.created > self.max_age

    def _sweep(self, now: float) -> None:
        for token in [t for t, s in self._by_token.items() if self._expired(s, now)]:
            self._drop(token)

    def create(self, principal: Principal) -> tuple[str, Session]:
        """A new session (a new token every log-in: no session fixation), within the caps
        (class docs). Raises :class:`ConsoleFull` instead of ending another user's only session."""
        now = self.clock()
        user = principal.name
        mine = self._by_user.get(user)
        while mine and len(mine) >= self.max_per_user:
            self._drop(next(iter(mine)))
            mine = self._by_user.get(user)
        if len(self._by_token) >= self.max_sessions:
            self._sweep(now)
        while len(self._by_token) >= self.max_sessions:
            heaviest = max(self._by_user, key=lambda u: (len(self._by_user[u]), u == user))
            # the new session will be this user's most recent, so one of theirs may go too
            if len(self._by_user[heaviest]) <= (0 if heaviest == user else 1):
                raise ConsoleFull(f"the console holds {len(self._by_token)} sessions, each some user's only one")
            self._drop(next(iter(self._by_user[heaviest])))
        token = secrets.token_urlsafe(32)
        session = Session(principal, created=now, seen=now)
        self._by_token[token] = session
        self._by_user.setdefault(user, OrderedDict())[token] = None
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        session = self._by_token.get(token)
        if session is None:
            return None
        now = self.clock()
        if self._expired(session, now):
            self._drop(token)
            return None
        session.seen = now
        return session

    def end(self, token: str | None) -> None:
        if token:
            self._drop(token)


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
