"""The console's sessions (app/console/sessions.py): one user's log-ins cannot end another
user's session (issue 28). The per-user cap ends that user's oldest session; the overall cap
takes from the user holding the most and never ends someone's only (most recent) session; the
log-in throttle counts per user name and address. Unit tests on the class, then the same over a
real console (uvicorn on loopback) through its log-in form."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.console import create_app
from app.console.sessions import MAX_SESSIONS, MAX_SESSIONS_PER_USER, ConsoleFull, Sessions
from app.security.http_auth import FailureLimiter, Principal
from tests.console.support import console_settings, serve
from tests.support import USERS, write_users_file


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def who(name: str, role: str = "read") -> Principal:
    return Principal(name, frozenset({role}), "basic")


def test_the_defaults_are_the_documented_ones() -> None:
    assert (MAX_SESSIONS, MAX_SESSIONS_PER_USER) == (10_000, 20)


def test_an_admins_session_survives_10001_log_ins_by_a_reader() -> None:
    """The attack of issue 28, at the real caps: it ended the admin's session in 26 s."""
    s = Sessions(3600, 86400)
    admin_token, _ = s.create(who("admin", "admin"))
    tokens = [s.create(who("reader"))[0] for _ in range(10_001)]
    assert s.get(admin_token) is not None
    assert s.of("reader") == MAX_SESSIONS_PER_USER and len(s) == MAX_SESSIONS_PER_USER + 1
    assert all(s.get(t) is None for t in tokens[:-MAX_SESSIONS_PER_USER])  # the reader's own oldest went
    assert all(s.get(t) is not None for t in tokens[-MAX_SESSIONS_PER_USER:])


def test_the_overall_cap_takes_from_the_user_with_most_never_anyones_newest() -> None:
    s = Sessions(3600, 86400, max_sessions=6, max_per_user=4)
    a = [s.create(who("a"))[0] for _ in range(4)]
    b = [s.create(who("b"))[0] for _ in range(2)]
    c = s.create(who("c"))[0]  # full: a (4) gives up its oldest
    assert s.get(a[0]) is None and all(s.get(t) for t in a[1:] + b + [c])
    d = s.create(who("d"))[0]  # a (3) again
    e = s.create(who("e"))[0]  # a and b hold 2: a's oldest goes (ties: the first found)
    assert len(s) == 6 and all(s.get(t) for t in [*b, c, d, e])
    assert s.of("a") + s.of("b") == 3
    f = s.create(who("f"))[0]  # someone with 2 gives one up; nobody with 1 does
    assert len(s) == 6 and all(s.get(t) for t in (c, d, e, f))
    with pytest.raises(ConsoleFull):  # a, b, c, d, e, f: six users, one session each
        s.create(who("g"))
    assert all(s.get(t) for t in (c, d, e, f)) and s.of("g") == 0
    # a user who already holds a slot may replace their own session when full
    c2 = s.create(who("c"))[0]
    assert s.get(c2) is not None and s.get(c) is None and len(s) == 6


def test_expired_sessions_make_room_first_and_logout_frees_the_users_share() -> None:
    clock = Clock()
    s = Sessions(100, 86400, clock=clock, max_sessions=3, max_per_user=2)
    old = [s.create(who(n))[0] for n in ("a", "b", "c")]
    clock.now += 101  # all idle past the timeout
    fresh = s.create(who("d"))[0]  # the sweep frees the expired slots; nobody live is touched
    assert s.get(fresh) is not None and all(s.get(t) is None for t in old) and len(s) == 1
    x, y = s.create(who("x"))[0], s.create(who("x"))[0]
    s.end(x)
    s.end(x)  # twice, and an unknown token: no error
    s.end("not-a-token")
    s.end(None)
    assert s.of("x") == 1 and s.get(y) is not None
    s.end(y)
    assert s.of("x") == 0 and "x" not in s._by_user  # no empty entries left behind


@given(st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=120), st.integers(1, 6), st.integers(1, 4))
@settings(max_examples=300, deadline=None)
def test_no_sequence_of_log_ins_ends_another_users_newest_session(ops: list[tuple[int, bool]], cap: int,
                                                                  per_user: int) -> None:
    """Any order of log-ins and log-outs by up to eight users, any caps: the caps hold, every user's
    newest session survives everyone else's log-ins, and a log-in is refused only when every
    slot is another user's only session."""
    s = Sessions(3600, 86400, max_sessions=cap, max_per_user=per_user)
    newest: dict[str, str] = {}
    for n, log_out in ops:
        user = f"u{n}"
        if log_out and user in newest:
            s.end(newest.pop(user))
            continue
        before = {u: s.of(u) for u in newest}
        try:
            token, _ = s.create(who(user))
        except ConsoleFull:
            assert len(s) == cap and s.of(user) == 0 and all(v == 1 for v in before.values())
            continue
        newest[user] = token
        assert len(s) <= cap and all(s.of(u) <= per_user for u in newest)
        for u, t in newest.items():
            assert s._by_token.get(t) is not None, (u, ops)
        # after a log-out the user's newest is gone: the test forgets it, the class may keep older ones
        newest = {u: t for u, t in newest.items() if s.of(u)}


@pytest.mark.parametrize("token", ["", None, "x" * 10_000, "\x00", "../../etc", "prism_console=1; a=b"])
def test_hostile_cookies_name_no_session(token: str | None) -> None:
    s = Sessions(3600, 86400)
    s.create(who("a"))
    assert s.get(token) is None and len(s) == 1


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("console-sessions") / "users.yaml")


@pytest.fixture
def console(users_file: Path) -> Iterator[tuple[str, Sessions, FailureLimiter]]:
    settings = console_settings(users_file, registry_url=None)
    limiter = FailureLimiter(3, 60)
    settings.auth.limiter = limiter
    app = create_app(settings)
    with serve(app) as url:
        yield url, app.state.sessions, limiter


#: one client for every request (each new httpx client loads the CA bundle: ~0.1 s); its cookie
#: jar is emptied before each request, so every log-in is a browser of its own
_HTTP = httpx.Client(follow_redirects=False)


@pytest.fixture(scope="module", autouse=True)
def _close_client() -> Iterator[None]:
    yield
    _HTTP.close()


def post_login(url: str, user: str, password: str) -> httpx.Response:
    _HTTP.cookies.clear()
    return _HTTP.post(url + "/login", data={"user": user, "password": password, "next": "/"},
                      headers={"origin": url})


def log_in(url: str, user: str, password: str | None = None) -> httpx.Response:
    return post_login(url, user, USERS[user][0] if password is None else password)


def page(url: str, token: str) -> int:
    _HTTP.cookies.clear()
    return _HTTP.get(url + "/", headers={"cookie": f"prism_console={token}"}).status_code


def test_log_ins_by_one_user_never_end_another_users_session(console: tuple[str, Sessions, FailureLimiter]) -> None:
    url, sessions, _ = console
    sessions.max_per_user, sessions.max_sessions = 5, 12
    admin = log_in(url, "admin").cookies["prism_console"]
    writer = log_in(url, "writer").cookies["prism_console"]
    readers = []
    for _ in range(40):
        r = log_in(url, "reader")
        assert r.status_code == 303, r.text
        readers.append(r.cookies["prism_console"])
    alice = [log_in(url, "alice").cookies["prism_console"] for _ in range(5)]
    bob = log_in(url, "bob").cookies["prism_console"]  # 13th: the overall cap takes from reader or alice
    assert page(url, admin) == 200 and page(url, writer) == 200 and page(url, bob) == 200
    assert sessions.of("reader") + sessions.of("alice") == 9 and len(sessions) == 12
    assert [page(url, t) for t in readers[:35]] == [401] * 35  # the reader's own oldest went first
    assert page(url, alice[-1]) == 200


def test_a_full_console_refuses_a_log_in_rather_than_ending_someones_only_session(
        console: tuple[str, Sessions, FailureLimiter]) -> None:
    url, sessions, _ = console
    sessions.max_sessions = 2
    admin = log_in(url, "admin").cookies["prism_console"]
    log_in(url, "writer")
    r = log_in(url, "reader")
    assert r.status_code == 503 and "The console is full" in r.text and "prism_console" not in r.cookies
    assert page(url, admin) == 200


def test_log_in_throttling_counts_per_user_name_and_address(console: tuple[str, Sessions, FailureLimiter]) -> None:
    """Wrong passwords for the admin lock the admin's name out (429 even for the right password),
    not the reader's; a flood for made-up names past the address ceiling (3 x 10) does not lock
    out a user who has logged in from this address before."""
    url, _, _ = console
    assert log_in(url, "reader").status_code == 303
    assert [log_in(url, "admin", "guess").status_code for _ in range(3)] == [401] * 3
    r = log_in(url, "admin")
    assert r.status_code == 429 and "Too many failed attempts" in r.text
    assert log_in(url, "reader").status_code == 303
    hostile = ["x" * 300, "<script>", "a\u202eb", "\x7f", "admin ", "ADMIN"] + [f"nobody-{i}" for i in range(40)]
    codes = [post_login(url, name, "p").status_code for name in hostile]
    assert set(codes) == {401, 429} and codes.index(429) == 27, codes  # 3 for admin + 27 = the ceiling
    assert log_in(url, "reader").status_code == 303
    assert log_in(url, "writer").status_code == 429  # never logged in from here: the ceiling holds
