"""The shared HTTP authentication (registry and worker management API): users file loading
and validation, Argon2 verification (no user enumeration, verified-credentials cache),
malformed Authorization headers, roles and subject prefixes, and the hashing CLI."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from app.errors import ConfigError
from app.security import http_auth
from app.security.http_auth import (
    FailureLimiter,
    HttpAuth,
    Principal,
    TooManyFailures,
    Unauthenticated,
    auth_from_settings,
    basic_header,
    client_auth_from_env,
    cross_site_refusal,
    hash_password,
    load_users,
    parse_role,
)

FAST = {"time_cost": 1, "memory_cost": 1024, "parallelism": 1}


def users_yaml(path: Path, entries: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"users": entries}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hashes() -> dict[str, str]:
    return {"alice": hash_password("alice-secret-1", **FAST), "bob": hash_password("bob-secret-12", **FAST)}


@pytest.fixture
def auth(tmp_path: Path, hashes: dict[str, str]) -> HttpAuth:
    f = users_yaml(tmp_path / "users.yaml", [{"user": "alice", "hash": hashes["alice"], "roles": ["admin"]},
                                              {"user": "bob", "hash": hashes["bob"], "roles": ["write:orders."]}])
    return HttpAuth(users=load_users(f))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def refusal(exc_type: type[Exception], fn, *args) -> str:  # type: ignore[no-untyped-def]
    """The message of the exception ``fn(*args)`` raises."""
    with pytest.raises(exc_type) as info:
        fn(*args)
    return str(info.value)


# --------------------------------------------------------------------------- users file


def test_users_file_yaml_and_json(tmp_path: Path, hashes: dict[str, str]) -> None:
    import json

    f = tmp_path / "users.json"
    f.write_text(json.dumps([{"user": "alice", "hash": hashes["alice"], "roles": ["read", "write:orders."]}]))
    users = load_users(f)
    assert users["alice"].roles == frozenset({"read", "write:orders."})
    assert "hash" not in repr(users["alice"])  # the hash never ends up in logs through repr


@pytest.mark.parametrize(("entry", "where", "says"), [
    ({"user": "alice", "password": "x", "roles": ["admin"]}, "users[0]", "never a password"),
    ({"user": "alice", "hash": "plaintext", "roles": ["admin"]}, "users[0].hash", "not an Argon2 hash"),
    ({"user": "alice", "hash": "$argon2id$v=19$m=x", "roles": ["admin"]}, "users[0].hash", "malformed Argon2"),
    ({"user": "al:ice", "hash": "H", "roles": ["admin"]}, "users[0].user", "without ':'"),
    ({"user": "anonymous", "hash": "H", "roles": ["read"]}, "users[0].user", "reserved"),
    ({"user": "alice", "hash": "H", "roles": []}, "users[0].roles", "non-empty list"),
    ({"user": "alice", "hash": "H", "roles": ["superuser"]}, "users[0].roles[0]", "unknown role"),
    ({"user": "alice", "hash": "H", "roles": ["write:"]}, "users[0].roles[0]", "non-empty subject prefix"),
    ({"user": "alice", "hash": "H", "roles": ["write:a/b"]}, "users[0].roles[0]", "'/'"),
    ("alice", "users[0]", "not a mapping"),
])
def test_users_file_problems_name_what_where_fix(tmp_path: Path, hashes: dict[str, str], entry: object, where: str,
                                                  says: str) -> None:
    if isinstance(entry, dict) and entry.get("hash") == "H":
        entry = {**entry, "hash": hashes["alice"]}
    f = users_yaml(tmp_path / "u.yaml", [entry])
    with pytest.raises(ConfigError) as exc:
        load_users(f)
    assert says in str(exc.value) and f"{f}: {where}" in str(exc.value)
    assert "fix:" in str(exc.value) or says in ("reserved", "malformed Argon2", "not a mapping")


def test_users_file_reports_every_problem_at_once(tmp_path: Path, hashes: dict[str, str]) -> None:
    f = users_yaml(tmp_path / "u.yaml", [{"user": "a", "hash": "x", "roles": ["read"]},
                                         {"user": "b", "hash": hashes["bob"], "roles": ["root"]},
                                         {"user": "c", "hash": hashes["bob"], "roles": ["read"]},
                                         {"user": "c", "hash": hashes["bob"], "roles": ["read"]}])
    msg = refusal(ConfigError, load_users, f)
    assert msg.startswith("3 problems") and "users[0].hash" in msg and "users[1].roles[0]" in msg
    assert "duplicate user 'c'" in msg
    # each its own error, so the CLI prints one line per problem (it was one line holding all three)
    from app.errors import ConfigProblems

    with pytest.raises(ConfigProblems) as err:
        load_users(f)
    assert [p.path.split(": ")[-1] for p in err.value.problems] == ["users[0].hash", "users[1].roles[0]",
                                                                    "users[3].user"]


def test_a_misspelt_users_key_names_the_key_meant(tmp_path: Path, hashes: dict[str, str]) -> None:
    f = users_yaml(tmp_path / "u.yaml", [{"usr": "a", "hash": hashes["alice"], "roles": ["read"]}])
    assert "unknown key(s) ['usr'] - did you mean 'user' for 'usr'?" in refusal(ConfigError, load_users, f)


@pytest.mark.parametrize(("text", "says"), [
    (None, "cannot read users file"), ("users: [", "not valid YAML"), ("users: []", "holds no users"),
    ("other: 1\nusers: []", "unknown top-level key"),
])
def test_users_file_unreadable_or_empty(tmp_path: Path, text: str | None, says: str) -> None:
    f = tmp_path / "u.yaml"
    if text is not None:
        f.write_text(text)
    assert says in refusal(ConfigError, load_users, f)


# --------------------------------------------------------------------------- basic authentication


def test_basic_ok_and_wrong_password_and_unknown_user_look_the_same(auth: HttpAuth) -> None:
    p = run(auth.authenticate(basic_header("alice", "alice-secret-1")))
    assert p == Principal("alice", frozenset({"admin"}), "basic")
    wrong = refusal(Unauthenticated, run, auth.authenticate(basic_header("alice", "nope")))
    unknown = refusal(Unauthenticated, run, auth.authenticate(basic_header("mallory", "nope")))
    assert wrong == unknown == "invalid user name or password (at Authorization)"


def test_unknown_users_cost_a_hash_verification_with_the_strongest_parameters(tmp_path: Path) -> None:
    """No enumeration by timing: the dummy hash has the file's strongest parameters, and an
    unknown user's answer takes about as long as a known user's wrong password."""
    from argon2 import PasswordHasher, extract_parameters

    strong = {"time_cost": 3, "memory_cost": 16384, "parallelism": 1}
    f = users_yaml(tmp_path / "u.yaml", [
        {"user": "weak", "hash": hash_password("weak-password-1", **FAST), "roles": ["read"]},
        {"user": "strong", "hash": hash_password("strong-password-1", **strong), "roles": ["read"]}])
    auth = HttpAuth(users=load_users(f))
    assert auth._dummy is not None
    assert extract_parameters(auth._dummy) == extract_parameters(auth.users["strong"].hash)

    verified: list[str] = []
    real_verify = PasswordHasher.verify

    def counting_verify(self: PasswordHasher, hash_: str, password: str) -> bool:
        verified.append(hash_)
        return real_verify(self, hash_, password)

    # Counted, not timed (a timing assertion flaked on a loaded machine): an unknown user costs
    # one Argon2 verification of a hash with the strongest parameters - the same work as a known
    # user's wrong password, so the answer's timing tells nothing.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PasswordHasher, "verify", counting_verify)
        for user in ("strong", "nobody-by-that-name"):
            with pytest.raises(Unauthenticated):
                run(auth.authenticate(basic_header(user, "wrong-password")))
    assert len(verified) == 2
    assert extract_parameters(verified[1]) == extract_parameters(verified[0]) == extract_parameters(
        auth.users["strong"].hash)


def test_success_is_cached_by_hmac_failures_never(auth: HttpAuth, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = http_auth._verify_hash

    def counting(h: str, pw: str) -> bool:
        calls.append(pw)
        return real(h, pw)

    monkeypatch.setattr(http_auth, "_verify_hash", counting)
    for _ in range(3):
        run(auth.authenticate(basic_header("alice", "alice-secret-1")))
    assert len(calls) == 1
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            run(auth.authenticate(basic_header("alice", "wrong")))
    assert len(calls) == 4
    assert all(b"alice-secret-1" not in k for k in auth._cache)  # keys are HMACs, not the password
    auth.cache_seconds = 0.0
    auth._cache.clear()
    run(auth.authenticate(basic_header("alice", "alice-secret-1")))
    run(auth.authenticate(basic_header("alice", "alice-secret-1")))
    assert len(calls) == 6


@pytest.mark.parametrize(("header", "says"), [
    (["Basic YWxpY2U6eA==", "Basic YWxpY2U6eA=="], "more than one Authorization header"),
    ("Digest username=alice", "unsupported authorization scheme"),
    ("Basic !!!notbase64", "not base64"),
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "not base64 of UTF-8"),
    ("Basic " + base64.b64encode(b"no-colon").decode(), "no 'user:' part"),
    ("Basic " + base64.b64encode(b":password").decode(), "no 'user:' part"),
    ("Basic " + "A" * 9000, "over 8192 bytes"),
    ("Basic " + base64.b64encode(b"alice:" + b"x" * 2000).decode(), "password too long"),
    ("Bearer abc", "bearer tokens are not enabled"),
])
def test_malformed_authorization_is_refused_not_guessed(auth: HttpAuth, header: object, says: str) -> None:
    assert says in refusal(Unauthenticated, run, auth.authenticate(header))  # type: ignore[arg-type]


def test_anonymous_gets_only_explicit_roles(tmp_path: Path, hashes: dict[str, str]) -> None:
    f = users_yaml(tmp_path / "u.yaml", [{"user": "alice", "hash": hashes["alice"], "roles": ["admin"]}])
    closed = auth_from_settings(users_file=f, jwt_config=None, allow_anonymous=None, realm="r", where="w")
    assert run(closed.authenticate(None)).roles == frozenset() and not run(closed.authenticate([])).can_read()
    for off in ("", "none", "off"):
        assert not auth_from_settings(users_file=None, jwt_config=None, allow_anonymous=off, realm="r",
                                      where="w").configured
    opened = auth_from_settings(users_file=None, jwt_config=None, allow_anonymous="read", realm="r", where="w")
    anon = run(opened.authenticate(None))
    assert anon.anonymous and anon.can_read() and not anon.can_write("x") and not anon.is_admin
    with pytest.raises(ConfigError, match="unknown role"):
        auth_from_settings(users_file=None, jwt_config=None, allow_anonymous="god", realm="r", where="--allow")
    assert opened.challenges() == ['Basic realm="r", charset="UTF-8"']


# --------------------------------------------------------------------------- roles


@pytest.mark.parametrize(("roles", "subject", "ok"), [
    ({"write:orders."}, "orders.created", True),
    ({"write:orders."}, "orders.created-value", True),
    ({"write:orders."}, "orders-evil", False),       # prefix escape: '-' is not '.'
    ({"write:orders."}, "orders", False),
    ({"write:orders."}, "ORDERS.created", False),    # case matters, like Kafka topic names
    ({"write:orders."}, ":.ctx:orders.created", False),  # a context-qualified name is another subject
    ({"write:orders."}, " orders.created", False),
    ({"write:orders."}, None, False),                # subject unknown: only global writers
    ({"write"}, "anything", True),
    ({"write"}, None, True),
    ({"admin"}, "anything", True),
    ({"read"}, "orders.created", False),
])
def test_write_prefix_is_a_plain_string_prefix(roles: set[str], subject: str | None, ok: bool) -> None:
    p = Principal("u", frozenset(roles), "basic")
    assert p.can_write(subject) is ok
    assert p.can_read()  # every role reads


def test_parse_role() -> None:
    assert parse_role("write:orders.", where="x") == "write:orders."
    for bad in ("Write", "write:", "write: x", "write:\x1b[31m", 3, "admin "):
        with pytest.raises(ConfigError):
            parse_role(bad, where="x")


def test_client_headers_from_env() -> None:
    assert client_auth_from_env("P", {"P_TOKEN": "t", "P_USER": "u"}) == {"Authorization": "Bearer t"}
    assert client_auth_from_env("P", {"P_USER": "u", "P_PASSWORD": "p:w"}) == {
        "Authorization": "Basic " + base64.b64encode(b"u:p:w").decode()}
    assert client_auth_from_env("P", {}) == {}


# --------------------------------------------------------------------------- hashing CLI


def test_hash_password_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.schema import cli
    from app.schema.cli import schema_app

    runner = CliRunner()
    r = runner.invoke(schema_app, ["hash-password", "--stdin", "--user", "ci", "--roles", "write:orders.,read"],
                      input="a-long-random-password\n")
    assert r.exit_code == 0, r.output
    assert "a-long-random-password" not in r.output
    f = tmp_path / "u.yaml"
    f.write_text("users:\n" + "".join("  " + line + "\n" for line in r.output.splitlines()))
    users = load_users(f)
    assert users["ci"].roles == frozenset({"write:orders.", "read"})
    auth = HttpAuth(users=users)
    assert run(auth.authenticate(basic_header("ci", "a-long-random-password"))).name == "ci"

    plain = runner.invoke(schema_app, ["hash-password", "--stdin"], input="another-long-password\n")
    assert plain.exit_code == 0 and plain.output.startswith("$argon2id$")
    short = runner.invoke(schema_app, ["hash-password", "--stdin"], input="short\n")
    assert short.exit_code == 2 and "shorter than 12" in short.output
    bad = runner.invoke(schema_app, ["hash-password", "--stdin", "--roles", "root"], input="x" * 20 + "\n")
    assert bad.exit_code == 2 and "unknown role" in bad.output
    # no terminal: the one error line naming --stdin (it was getpass's echo warning, then "Aborted.")
    monkeypatch.setattr(cli, "_terminal", lambda: False)
    piped = runner.invoke(schema_app, ["hash-password"], input="prompted-password-1\n")
    assert piped.exit_code == 2 and piped.output.startswith("error [no_terminal]") and "--stdin" in piped.output
    monkeypatch.setattr(cli, "_terminal", lambda: True)  # CliRunner's stdin stands in for a terminal
    prompted = runner.invoke(schema_app, ["hash-password"], input="prompted-password-1\nprompted-password-1\n")
    # the prompt goes to stderr (CliRunner echoes the hidden input's newlines on stdout; a tty does not)
    assert prompted.exit_code == 0 and prompted.stdout.strip().startswith("$argon2id$")
    assert "password" in prompted.stderr and "password" not in prompted.stdout


# --------------------------------------------------------------------------- failed-attempt limit


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failures_are_limited_per_address_in_a_sliding_window() -> None:
    clock = _Clock()
    lim = FailureLimiter(3, 60, clock=clock)
    for _ in range(3):
        assert lim.retry_after("10.0.0.1") is None
        lim.failed("10.0.0.1")
        clock.now += 10
    assert lim.retry_after("10.0.0.1") == pytest.approx(30)  # the first failure leaves the window at +60
    assert lim.retry_after("10.0.0.2") is None  # another address is not affected
    clock.now += 30
    assert lim.retry_after("10.0.0.1") is None  # one slot free again, not a full reset
    lim.failed("10.0.0.1")
    assert lim.retry_after("10.0.0.1") == pytest.approx(10)


def test_the_limiter_remembers_a_bounded_number_of_addresses() -> None:
    lim = FailureLimiter(2, 60, max_clients=100)
    for i in range(1000):
        lim.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(lim._failures) == 100
    assert all(len(t) <= 2 for t in lim._failures.values())


@pytest.mark.parametrize("env", [{"PRISM_AUTH_MAX_FAILURES": "0"}, {"PRISM_AUTH_FAILURE_WINDOW_S": "-1"},
                                 {"PRISM_AUTH_MAX_FAILURES": "ten"}, {"PRISM_AUTH_FAILURE_WINDOW_S": "nan"},
                                 {"PRISM_AUTH_FAILURE_WINDOW_S": "inf"}])  # inf: failures never forgotten
def test_bad_limit_settings_stop_the_start_up(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="PRISM_AUTH_MAX_FAILURES"):
        FailureLimiter.from_env(env)


def test_over_the_limit_even_right_or_cached_credentials_of_that_name_are_refused_before_any_hash(
        auth: HttpAuth, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    auth.limiter = FailureLimiter(3, 60, clock=clock)
    verified = []
    real = http_auth._verify_hash
    monkeypatch.setattr(http_auth, "_verify_hash", lambda h, pw: verified.append(pw) or real(h, pw))
    good = basic_header("alice", "alice-secret-1")
    assert run(auth.authenticate(good, client="203.0.113.9")).name == "alice"  # cached from now on
    for _ in range(3):
        with pytest.raises(Unauthenticated):
            run(auth.authenticate(basic_header("alice", "guess"), client="203.0.113.9"))
    # successes did not reset the count, and now nothing for alice is even checked:
    # answering right guesses differently would tell the guesser which one was right
    n = len(verified)
    for header in (basic_header("alice", "guess-4"), good):
        with pytest.raises(TooManyFailures) as info:
            run(auth.authenticate(header, client="203.0.113.9"))
        assert info.value.retry_after == pytest.approx(60) and "3 failures in 60 s" in info.value.hint
    assert len(verified) == n  # no Argon2 work for a locked name
    # another user of the same address (the console's host, a NAT gateway) is not locked out
    assert run(auth.authenticate(basic_header("bob", "bob-secret-12"), client="203.0.113.9")).name == "bob"
    assert run(auth.authenticate(None, client="203.0.113.9")).anonymous  # no credentials: not limited
    assert run(auth.authenticate(good, client="198.51.100.7")).name == "alice"  # another address
    clock.now += 61
    assert run(auth.authenticate(good, client="203.0.113.9")).name == "alice"


def test_a_flood_of_wrong_passwords_for_other_names_cannot_lock_out_a_user(
        auth: HttpAuth, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack of issue 28: wrong passwords for made-up names from the console's address.
    Past the per-address ceiling (3 x 10 here) names new to the address are refused before any
    hash, but alice, who logged in from there, still is verified."""
    clock = _Clock()
    auth.limiter = FailureLimiter(3, 60, clock=clock)
    verified = []
    real = http_auth._verify_hash
    monkeypatch.setattr(http_auth, "_verify_hash", lambda h, pw: verified.append(pw) or real(h, pw))
    alice = basic_header("alice", "alice-secret-1")
    assert run(auth.authenticate(alice, client="127.0.0.1")).name == "alice"
    for i in range(30):  # 30 names, one wrong password each: every one a fresh name
        with pytest.raises(Unauthenticated):
            run(auth.authenticate(basic_header(f"user{i}", "x"), client="127.0.0.1"))
    n = len(verified)
    for i in range(100):  # the address ceiling: new names (and bob, who never logged in here) get 429
        with pytest.raises(TooManyFailures) as info:
            run(auth.authenticate(basic_header(f"other{i}", "x"), client="127.0.0.1"))
    assert "per address" in info.value.hint
    with pytest.raises(TooManyFailures):
        run(auth.authenticate(basic_header("bob", "bob-secret-12"), client="127.0.0.1"))
    assert len(verified) == n  # the flood costs no Argon2
    clock.now += 1000  # past the verification cache: alice's password is verified again, not refused
    auth._cache.clear()
    assert run(auth.authenticate(alice, client="127.0.0.1")).name == "alice"
    assert len(verified) == n + 1
    # bob from another address is untouched
    assert run(auth.authenticate(basic_header("bob", "bob-secret-12"), client="127.0.0.2")).name == "bob"


def test_known_good_names_expire_and_stay_bounded() -> None:
    clock = _Clock()
    lim = FailureLimiter(1, 60, names_per_address=1, known_good_s=100, max_clients=50, clock=clock)
    lim.succeeded("10.0.0.1", "alice")
    lim.failed("10.0.0.1", "mallory")
    assert lim.retry_after("10.0.0.1", "mallory") is not None  # its own count
    assert lim.retry_after("10.0.0.1", "eve") is not None  # the address ceiling (1 x 1)
    assert lim.retry_after("10.0.0.1", "alice") is None  # logged in from here
    clock.now += 101
    lim.failed("10.0.0.1", "mallory")
    assert lim.retry_after("10.0.0.1", "alice") is not None  # no longer known here
    for i in range(500):
        lim.succeeded(f"10.1.{i // 256}.{i % 256}", "alice")
        lim.failed(f"10.1.{i // 256}.{i % 256}", f"name{i}")
    assert len(lim._known) == len(lim._failures) == len(lim._by_address) == 50


@pytest.mark.parametrize("header, name", [
    (basic_header("alice", "pw"), "alice"),
    (basic_header("alice", "a:b"), "alice"),
    ("Basic " + base64.b64encode(b"no-colon").decode(), ""),
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), ""),
    ("Basic !!!", ""),
    ("Basic " + base64.b64encode(("u" * 5000 + ":p").encode()).decode(), "u" * 256),
    ("Bearer " + ".".join(base64.urlsafe_b64encode(json.dumps(p).encode()).decode().rstrip("=")
                          for p in ({"alg": "none"}, {"sub": "svc"})) + ".sig", "jwt:svc"),
    ("Bearer a.b.c", ""),
    ("Bearer a." + base64.urlsafe_b64encode(b"[1,2]").decode() + ".c", ""),
    ("Bearer a." + base64.urlsafe_b64encode(b'{"sub": 5}').decode() + ".c", ""),
    ("Bearer a." + base64.urlsafe_b64encode(b"[" * 100_000).decode()[:8000] + ".c", ""),
    ("Digest x", ""), ("", ""),
])
def test_the_claimed_name_of_hostile_headers_is_bounded_and_never_raises(header: str, name: str) -> None:
    assert http_auth.claimed_name(header) == name


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_claimed_name_is_a_short_string_for_any_header(header: str) -> None:
    out = http_auth.claimed_name(header)
    assert isinstance(out, str) and len(out) <= 260


def test_malformed_headers_count_as_failures_under_one_shared_name(auth: HttpAuth) -> None:
    auth.limiter = FailureLimiter(2, 60)
    for header in ("Digest x", "Basic !!!"):
        with pytest.raises(Unauthenticated):
            run(auth.authenticate(header, client="192.0.2.1"))
    with pytest.raises(TooManyFailures):
        run(auth.authenticate("Basic @@@", client="192.0.2.1"))
    # ... which is not alice's
    assert run(auth.authenticate(basic_header("alice", "alice-secret-1"), client="192.0.2.1")).name == "alice"


def test_surfaces_built_from_settings_are_limited(tmp_path: Path, hashes: dict[str, str]) -> None:
    f = users_yaml(tmp_path / "u.yaml", [{"user": "alice", "hash": hashes["alice"], "roles": ["admin"]}])
    auth = auth_from_settings(users_file=f, jwt_config=None, allow_anonymous=None, realm="r", where="t")
    assert auth.limiter is not None and (auth.limiter.max_failures, auth.limiter.window_s) == (10, 60.0)


# --------------------------------------------------------------------------- bearer clearance


def _bearer(tmp_path: Path, **extra: object) -> tuple[http_auth.BearerAuth, object]:
    """A BearerAuth over a one-key JWKS, and the key that signs its tokens."""
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from jwt.algorithms import OKPAlgorithm

    key = ed25519.Ed25519PrivateKey.generate()
    jwk = {**json.loads(OKPAlgorithm.to_jwk(key.public_key())), "kid": "c-1", "use": "sig", "alg": "EdDSA"}
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    conf = {"jwks_file": "jwks.json", "issuers": ["https://idp.test"], "audience": "prism-console",
            "claims": {"publisher_id": "sub"}, **extra}
    return http_auth.BearerAuth.from_mapping(conf, where="jwt.yaml", base_dir=tmp_path), key


def _token(key: object, **claims: object) -> str:
    import time

    import jwt

    now = int(time.time())
    body = {"iss": "https://idp.test", "aud": "prism-console", "sub": "ops-bot", "iat": now, "exp": now + 300,
            "roles": ["read"], **claims}
    return jwt.encode(body, key, algorithm="EdDSA", headers={"kid": "c-1"})


@pytest.mark.parametrize(("claim", "want"), [
    ("confidential", "confidential"), (["internal", "restricted"], "restricted"), ("public internal", "internal"),
    ("top-secret", None), ([7, None, {"x": 1}], None), (None, None), (42, None),
])
def test_a_bearer_users_clearance_is_the_highest_its_claim_names(tmp_path: Path, claim: object,
                                                                  want: str | None) -> None:
    bearer, key = _bearer(tmp_path, clearance_claim="prism_clearance")
    claims = {} if claim is None else {"prism_clearance": claim}
    p = bearer.principal(_token(key, **claims))
    assert (p.name, p.method, p.clearance) == ("ops-bot", "bearer", want)


def test_without_a_clearance_claim_no_token_claim_raises_a_bearer_users_clearance(tmp_path: Path) -> None:
    """The console's default (internal) holds for every bearer user unless the operator names
    the claim: a token cannot pick its own claim."""
    bearer, key = _bearer(tmp_path)
    token = _token(key, clearance="restricted", prism_clearance="restricted", roles=["admin"])
    assert bearer.principal(token).clearance is None


def test_a_clearance_map_translates_groups_and_ignores_literal_words(tmp_path: Path) -> None:
    bearer, key = _bearer(tmp_path, clearance_claim="groups",
                          clearance_map={"payments-oncall": "restricted", "analysts": "confidential"})
    assert bearer.principal(_token(key, groups=["analysts", "payments-oncall"])).clearance == "restricted"
    assert bearer.principal(_token(key, groups="analysts staff")).clearance == "confidential"
    # with a map, a token naming a level itself means nothing
    assert bearer.principal(_token(key, groups=["restricted"])).clearance is None


@pytest.mark.parametrize(("extra", "where", "says"), [
    ({"clearance_claim": ""}, "jwt.yaml.clearance_claim", "must name a claim"),
    ({"clearance_claim": ["a"]}, "jwt.yaml.clearance_claim", "must name a claim"),
    ({"clearance_map": {"g": "restricted"}}, "jwt.yaml.clearance_map", "needs clearance_claim"),
    ({"clearance_claim": "g", "clearance_map": []}, "jwt.yaml.clearance_map", "must map claim values"),
    ({"clearance_claim": "g", "clearance_map": {"ops": "top-secret"}}, "jwt.yaml.clearance_map.ops",
     "clearance must be one of"),
    ({"clearance_claim": "g", "clearance_map": {"ops": None}}, "jwt.yaml.clearance_map.ops", "cannot be empty"),
])
def test_bad_clearance_settings_stop_the_start_up(tmp_path: Path, extra: dict[str, object], where: str,
                                                  says: str) -> None:
    with pytest.raises(ConfigError) as err:
        _bearer(tmp_path, **extra)
    assert err.value.path == where and says in err.value.message


@pytest.mark.parametrize(("method", "host", "origin", "site", "refused"), [
    ("POST", "reg:8081", "https://evil.example", None, True),
    ("POST", "reg:8081", "null", None, True),
    ("POST", "reg:8081", "http://reg:8081.evil.example", None, True),
    ("PUT", "reg:8081", "http://reg:8081", "cross-site", True),   # the browser's word wins
    ("DELETE", "reg:8081", None, "same-site", True),              # a sibling subdomain is another app
    ("POST", "reg:8081", "http://REG:8081", None, False),
    ("POST", "reg:8081", "https://proxy.example", "same-origin", False),  # behind a proxy rewriting Host
    ("POST", "reg:8081", None, "none", False),                    # typed into the address bar
    ("POST", "reg:8081", None, None, False),                      # a script: the SDK, the CLI, curl
    ("GET", "reg:8081", "https://evil.example", "cross-site", False),
    ("OPTIONS", "reg:8081", "https://evil.example", None, False),
])
def test_cross_site_refusal(method: str, host: str, origin: str | None, site: str | None, refused: bool) -> None:
    """Which requests a browser sent from another site's page are refused (the registry's and
    the worker's guards call this before authenticating: cached basic credentials ride along)."""
    why = cross_site_refusal(method, host, origin, site)
    assert (why is not None) is refused, why
    if why is not None:
        assert method in why and "refused" in why


def test_hash_password_without_any_terminal_says_to_use_stdin() -> None:
    """In its own session (no controlling terminal, as under cron or a CI runner) with stdin not
    a terminal, getpass warned that the password may be echoed, read what it could and ended in
    "Aborted."; it is one error line naming --stdin now."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "app.cli.main", "schema", "hash-password"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60, start_new_session=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.startswith("error [no_terminal] no terminal to ask for the password on (at stdin); fix: ")
    assert res.stderr.count("\n") == 1 and "--stdin" in res.stderr, res.stderr
