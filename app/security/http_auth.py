"""HTTP authentication and role checks shared by the schema registry and the worker's
management API (issue 13).

Two ways to prove who you are, one result (a :class:`Principal` with roles):

* **HTTP basic** against a users file of Argon2id password hashes (argon2-cffi, the PHC
  winner's reference binding). The file is loaded and validated at start-up::

      users:
        - user: alice
          hash: "$argon2id$v=19$m=65536,t=3,p=4$..."   # prism schema hash-password
          roles: [admin]
        - user: orders-ci
          hash: "$argon2id$..."
          roles: ["write:orders."]

* **Bearer JWTs**, verified by the same code that authenticates producers
  (:mod:`app.security.jwt_auth`: JWKS by ``kid``, one algorithm per key, no ``none``, no
  HS256-with-a-public-key, time claims with leeway). A claim (``roles`` by default) names
  the roles, optionally through a ``role_map`` from the identity provider's group names.

Roles: ``read`` (every read), ``write`` (register under any subject), ``write:<prefix>``
(register under subjects starting with ``<prefix>``; a writer may also read) and ``admin``
(everything, including configuration, deletes, approvals and audits). Anonymous requests
get no role unless the deployment explicitly grants one (``--allow-anonymous read``).

Attacker-facing choices, each with a test:

* Unknown users are verified against a dummy hash with the same Argon2 parameters as the
  real ones, so the answer takes as long as for a known user with a wrong password (no user
  enumeration by timing); the answer is the same 401 text either way.
* A successful basic verification is remembered for ``cache_seconds`` under an HMAC of
  ``user:password`` with a per-process random key (the password itself is never kept), so
  a Confluent client that sends credentials with every request does not pay ~50 ms of
  Argon2 per request. Failures are never cached.
* Hash verification runs in a worker thread: a flood of wrong passwords costs CPU but never
  blocks the event loop that serves everyone else.
* Two ``Authorization`` headers, an unknown scheme, bad base64, non-UTF-8 or a header over
  8 KiB are refused (401), never guessed at.
* Failed attempts are limited per client address (:class:`FailureLimiter`: 10 in 60 s by
  default, ``PRISM_AUTH_MAX_FAILURES`` / ``PRISM_AUTH_FAILURE_WINDOW_S``): past the limit every
  request from that address that carries credentials gets 429 with ``Retry-After`` *before*
  any hash is verified, so guessing is bounded and a flood of wrong passwords cannot keep the
  Argon2 threads busy. Successes do not reset the count (valid low-privilege credentials must
  not buy more guesses at another account), and a locked address gets 429 even for right or
  cached credentials (anything else would tell the guesser which guess was right).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import AuthError, ConfigError

# The client side (header building) lives in client_auth so that clients need no argon2/PyJWT;
# re-exported because the CLI, the console and the tests import it from here.
from app.security.client_auth import basic_header, client_auth_from_env, client_auth_header

ROLE_READ = "read"
ROLE_WRITE = "write"
ROLE_ADMIN = "admin"
WRITE_PREFIX = "write:"
MAX_HEADER_BYTES = 8192
MAX_PASSWORD_BYTES = 1024
ANONYMOUS = "anonymous"

#: Confluent Schema Registry's error codes for the two refusals.
ERROR_UNAUTHENTICATED = 40101
ERROR_FORBIDDEN = 40301
#: Prism's, in Confluent's scheme (HTTP status * 100 + n): too many failed attempts
ERROR_TOO_MANY_FAILURES = 42901


class Unauthenticated(AuthError):
    """No usable credentials (HTTP 401)."""

    code = "unauthenticated"


class Forbidden(AuthError):
    """Authenticated, but the roles do not allow the request (HTTP 403)."""

    code = "forbidden"


class TooManyFailures(AuthError):
    """Too many failed attempts from this client address (HTTP 429, ``Retry-After``)."""

    code = "too_many_failures"

    def __init__(self, message: str, *, retry_after: float, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


ENV_MAX_FAILURES = "PRISM_AUTH_MAX_FAILURES"
ENV_FAILURE_WINDOW = "PRISM_AUTH_FAILURE_WINDOW_S"


class FailureLimiter:
    """Failed authentications per client address over a sliding window (module docs).

    Memory is bounded: at most ``max_clients`` addresses are remembered (least recently failed
    first out), each with at most ``max_failures`` timestamps."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0, *, max_clients: int = 65_536,
                 clock: Any = time.monotonic) -> None:
        if max_failures < 1 or not window_s > 0:
            raise ConfigError(f"failure limit must be >= 1 attempt in > 0 s, got {max_failures} in {window_s} s",
                              path=f"{ENV_MAX_FAILURES} / {ENV_FAILURE_WINDOW}")
        self.max_failures, self.window_s, self.max_clients = max_failures, float(window_s), max_clients
        self.clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FailureLimiter:
        import os

        env = os.environ if env is None else env
        try:
            n = int(env.get(ENV_MAX_FAILURES, "10"))
            w = float(env.get(ENV_FAILURE_WINDOW, "60"))
        except ValueError:
            raise ConfigError("failure limit settings must be numbers", path=f"{ENV_MAX_FAILURES} / {ENV_FAILURE_WINDOW}",
                              hint="e.g. PRISM_AUTH_MAX_FAILURES=10 PRISM_AUTH_FAILURE_WINDOW_S=60") from None
        return cls(n, w)

    def _recent(self, client: str, now: float) -> list[float]:
        times = self._failures.get(client)
        if not times:
            return []
        cut = now - self.window_s
        if times[0] <= cut:
            times[:] = [t for t in times if t > cut]
        return times

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again, or None when it may now."""
        now = self.clock()
        times = self._recent(client, now)
        if len(times) < self.max_failures:
            return None
        return max(times[0] + self.window_s - now, 0.001)

    def failed(self, client: str) -> None:
        now = self.clock()
        times = self._recent(client, now)
        times.append(now)
        del times[:-self.max_failures]  # only the newest max_failures matter
        self._failures[client] = times
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)


# --------------------------------------------------------------------------- roles


def parse_role(value: object, *, where: str) -> str:
    """One role string, validated: ``read``, ``write``, ``write:<prefix>`` or ``admin``."""
    if not isinstance(value, str):
        raise ConfigError(f"a role must be a string, got {type(value).__name__}", path=where,
                          hint="use read, write, write:<subject prefix> or admin")
    if value in (ROLE_READ, ROLE_WRITE, ROLE_ADMIN):
        return value
    if value.startswith(WRITE_PREFIX):
        prefix = value[len(WRITE_PREFIX):]
        if not prefix or any(c.isspace() or not c.isprintable() for c in prefix) or "/" in prefix:
            raise ConfigError(f"role {value!r} needs a non-empty subject prefix without spaces, control "
                              "characters or '/'", path=where, hint="e.g. write:orders. (note the trailing dot)")
        return value
    raise ConfigError(f"unknown role {value[:64]!r}", path=where,
                      hint="use read, write, write:<subject prefix> or admin")


def parse_roles(values: object, *, where: str) -> frozenset[str]:
    if isinstance(values, str):
        values = [v for v in values.replace(",", " ").split() if v]
    if not isinstance(values, list | tuple) or not values:
        raise ConfigError("roles must be a non-empty list", path=where,
                          hint="e.g. roles: [read] or roles: [\"write:orders.\"]")
    return frozenset(parse_role(v, where=f"{where}[{i}]") for i, v in enumerate(values))


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking, as proven (or ``anonymous``), and what they may do."""

    name: str
    roles: frozenset[str]
    method: str  # "basic", "bearer" or "anonymous"

    @property
    def anonymous(self) -> bool:
        return self.method == "anonymous"

    @property
    def is_admin(self) -> bool:
        return ROLE_ADMIN in self.roles

    def can_read(self) -> bool:
        """Every role includes reading (a producer's serializer reads what it registered)."""
        return bool(self.roles)

    def can_write_some(self) -> bool:
        return any(r in (ROLE_ADMIN, ROLE_WRITE) or r.startswith(WRITE_PREFIX) for r in self.roles)

    def can_write(self, subject: str | None) -> bool:
        """Register under ``subject``: admin, ``write``, or a ``write:<prefix>`` the subject starts
        with (plain string prefix: ``write:orders.`` does not cover ``orders-evil``)."""
        if ROLE_ADMIN in self.roles or ROLE_WRITE in self.roles:
            return True
        if subject is None:
            return False
        return any(r.startswith(WRITE_PREFIX) and subject.startswith(r[len(WRITE_PREFIX):]) for r in self.roles)


# --------------------------------------------------------------------------- password hashes


def _hasher(**params: Any) -> Any:
    from argon2 import PasswordHasher

    return PasswordHasher(**params)


def hash_password(password: str, **params: Any) -> str:
    """An Argon2id hash of ``password`` (argon2-cffi's defaults unless ``params`` override:
    ``time_cost``, ``memory_cost`` in KiB, ``parallelism``)."""
    if not password:
        raise ConfigError("the password is empty", path="password", hint="choose a long random password")
    return str(_hasher(**params).hash(password))


def _check_hash(text: object, *, where: str) -> str:
    from argon2 import extract_parameters
    from argon2.exceptions import InvalidHashError

    if not isinstance(text, str) or not text.startswith("$argon2"):
        raise ConfigError("hash is not an Argon2 hash (it must start with $argon2id$)", path=where,
                          hint="create one with `prism schema hash-password` - never store the password itself")
    try:
        extract_parameters(text)
    except (InvalidHashError, ValueError):
        raise ConfigError("hash is a malformed Argon2 hash", path=where,
                          hint="copy the whole output of `prism schema hash-password`") from None
    return text


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    hash: str = field(repr=False)
    roles: frozenset[str]


def load_users(path: str | Path) -> dict[str, UserRecord]:
    """Read and validate a users file (YAML or JSON). Every problem is reported at once, with
    the entry it is in and how to fix it."""
    import yaml

    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read users file: {exc.strerror}", path=str(p),
                          hint="pass an existing YAML/JSON file (see docs/schema-registry.md, Authentication)") \
            from None
    try:
        doc = json.loads(raw) if p.suffix.lower() == ".json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"users file is not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: "
                          f"{str(exc).splitlines()[0]}", path=str(p)) from None
    entries = doc.get("users") if isinstance(doc, Mapping) else doc
    if isinstance(doc, Mapping) and set(doc) - {"users"}:
        raise ConfigError(f"unknown top-level key(s) {sorted(map(str, set(doc) - {'users'}))}", path=str(p),
                          hint="the file holds one key, users: [ {user, hash, roles}, ... ]")
    if not isinstance(entries, list) or not entries:
        raise ConfigError("users file holds no users", path=str(p),
                          hint="users: [ {user: alice, hash: <prism schema hash-password>, roles: [admin]} ]")
    users: dict[str, UserRecord] = {}
    problems: list[ConfigError] = []
    for i, entry in enumerate(entries):
        where = f"{p}: users[{i}]"
        try:
            if not isinstance(entry, Mapping):
                raise ConfigError("entry is not a mapping", path=where, hint="each user is {user, hash, roles}")
            unknown = sorted(map(str, set(entry) - {"user", "hash", "roles"}))
            if unknown:
                raise ConfigError(f"unknown key(s) {unknown}", path=where, hint="allowed: user, hash, roles"
                                  + (" (store a hash, never a password)" if "password" in unknown else ""))
            name = entry.get("user")
            if not isinstance(name, str) or not name or ":" in name or any(not c.isprintable() for c in name):
                raise ConfigError("user must be a non-empty printable name without ':'", path=f"{where}.user",
                                  hint="HTTP basic auth cannot carry ':' in a user name")
            if name == ANONYMOUS:
                raise ConfigError(f"{ANONYMOUS!r} is reserved for unauthenticated requests", path=f"{where}.user")
            if name in users:
                raise ConfigError(f"duplicate user {name!r}", path=f"{where}.user", hint="user names must be unique")
            users[name] = UserRecord(name, _check_hash(entry.get("hash"), where=f"{where}.hash"),
                                     parse_roles(entry.get("roles"), where=f"{where}.roles"))
        except ConfigError as exc:
            problems.append(exc)
    if problems:
        if len(problems) == 1:
            raise problems[0]
        raise ConfigError(f"{len(problems)} problems in the users file: " + "; ".join(str(e) for e in problems),
                          path=str(p))
    return users


# --------------------------------------------------------------------------- bearer tokens


@dataclass(frozen=True, slots=True)
class BearerAuth:
    """JWT bearer tokens -> principals. ``roles_claim`` holds a list (or a space-separated
    string, like OAuth ``scope``); with ``role_map`` its values are translated (``{group:
    role-or-roles}``) and unmapped values ignored, without it values that are valid roles
    are taken as they are and others ignored. A token with no usable role authenticates
    but may do nothing (403)."""

    authenticator: Any  # app.security.jwt_auth.Authenticator
    roles_claim: str = "roles"
    role_map: Mapping[str, frozenset[str]] | None = None

    _KEYS = frozenset({"roles_claim", "role_map"})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str, base_dir: Path | None = None) -> BearerAuth:
        from app.security.jwt_auth import DEFAULT_KEPT_CLAIMS, Authenticator, JwtConfig

        if not isinstance(data, Mapping):
            raise ConfigError("JWT settings must be a mapping", path=where,
                              hint="jwks_file, issuers, audience, roles_claim, role_map")
        roles_claim = data.get("roles_claim", "roles")
        if not isinstance(roles_claim, str) or not roles_claim:
            raise ConfigError("roles_claim must name a claim", path=f"{where}.roles_claim")
        role_map: dict[str, frozenset[str]] | None = None
        if data.get("role_map") is not None:
            rm = data["role_map"]
            if not isinstance(rm, Mapping) or not rm:
                raise ConfigError("role_map must map claim values to roles", path=f"{where}.role_map",
                                  hint="e.g. role_map: {schema-admins: admin, orders-team: \"write:orders.\"}")
            role_map = {}
            for k, v in rm.items():
                role_map[str(k)] = parse_roles([v] if isinstance(v, str) else v, where=f"{where}.role_map.{k}")
        jwt_part = {k: v for k, v in data.items() if k not in cls._KEYS}
        kept = tuple(dict.fromkeys([*jwt_part.get("kept_claims", DEFAULT_KEPT_CLAIMS), roles_claim]))
        jwt_part["kept_claims"] = kept
        config = JwtConfig.from_mapping(jwt_part, where=where, base_dir=base_dir)
        return cls(Authenticator(config), roles_claim, role_map)

    @classmethod
    def from_file(cls, path: str | Path) -> BearerAuth:
        import yaml

        p = Path(path)
        try:
            doc = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read JWT settings: {exc.strerror}", path=str(p)) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"JWT settings are not valid YAML: {str(exc).splitlines()[0]}", path=str(p)) from None
        return cls.from_mapping(doc if doc is not None else {}, where=str(p), base_dir=p.parent)

    def roles_of(self, claims: Mapping[str, Any]) -> frozenset[str]:
        raw = claims.get(self.roles_claim)
        values = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
        out: set[str] = set()
        for v in values:
            if not isinstance(v, str):
                continue
            if self.role_map is not None:
                out |= self.role_map.get(v, frozenset())
                continue
            try:
                out.add(parse_role(v, where="token"))
            except ConfigError:
                continue
        return frozenset(out)

    def principal(self, token: str, *, now: float | None = None) -> Principal:
        try:
            identity = self.authenticator.authenticate(token, now=now)
        except AuthError as exc:
            raise Unauthenticated(f"bearer token refused: {exc.message}", path=exc.path) from None
        return Principal(identity.publisher_id, self.roles_of(identity.claims), "bearer")


# --------------------------------------------------------------------------- the authenticator


class HttpAuth:
    """Turns an ``Authorization`` header into a :class:`Principal` (module docs)."""

    def __init__(self, *, users: Mapping[str, UserRecord] | None = None, bearer: BearerAuth | None = None,
                 anonymous_roles: Iterable[str] = (), realm: str = "prism", cache_seconds: float = 60.0,
                 cache_size: int = 4096, limiter: FailureLimiter | None = None) -> None:
        self.users = dict(users or {})
        #: failed attempts per client address (None: unlimited, for in-process tools only)
        self.limiter = limiter
        self.bearer = bearer
        self.anonymous_roles = frozenset(anonymous_roles)
        self.realm = realm
        self.cache_seconds, self.cache_size = cache_seconds, cache_size
        self._cache_key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        self._dummy: str | None = None
        if self.users:
            from argon2 import PasswordHasher, extract_parameters

            # The slowest parameters in the file: an unknown user never answers faster than a known one.
            params = max((extract_parameters(u.hash) for u in self.users.values()),
                         key=lambda p: (p.memory_cost * p.time_cost, p.parallelism))
            self._dummy = PasswordHasher.from_parameters(params).hash(secrets.token_urlsafe(16))

    @property
    def configured(self) -> bool:
        """True when some way of getting a role exists (credentials or anonymous roles)."""
        return bool(self.users or self.bearer or self.anonymous_roles)

    @property
    def accepts_credentials(self) -> bool:
        return bool(self.users or self.bearer)

    def challenges(self) -> list[str]:
        """``WWW-Authenticate`` values (RFC 7617 / RFC 6750)."""
        out = []
        if self.users or not self.bearer:
            out.append(f'Basic realm="{self.realm}", charset="UTF-8"')
        if self.bearer:
            out.append(f'Bearer realm="{self.realm}"')
        return out

    def anonymous(self) -> Principal:
        return Principal(ANONYMOUS, self.anonymous_roles, "anonymous")

    async def authenticate(self, authorization: list[str] | str | None, client: str | None = None) -> Principal:
        """The principal of a request's ``Authorization`` header value(s); anonymous when there
        is none. Raises :class:`Unauthenticated` for anything malformed or not verifying, and
        :class:`TooManyFailures` when `client` (the peer address) is over the failure limit."""
        values = [authorization] if isinstance(authorization, str) else list(authorization or [])
        if not values:
            return self.anonymous()
        limiter = self.limiter if client is not None else None
        if limiter is not None:
            wait = limiter.retry_after(client)  # type: ignore[arg-type]
            if wait is not None:
                raise TooManyFailures(f"too many failed authentication attempts from {client[:100]}",  # type: ignore[index]
                                      retry_after=wait, path="Authorization",
                                      hint=f"wait {wait:.0f} s; the limit is {limiter.max_failures} failures "
                                           f"in {limiter.window_s:g} s per client address")
        try:
            return await self._authenticate(values)
        except Unauthenticated:
            if limiter is not None:
                limiter.failed(client)  # type: ignore[arg-type]
            raise

    async def _authenticate(self, values: list[str]) -> Principal:
        if len(values) > 1:
            raise Unauthenticated("more than one Authorization header", path="Authorization")
        header = values[0]
        if len(header) > MAX_HEADER_BYTES:
            raise Unauthenticated(f"Authorization header over {MAX_HEADER_BYTES} bytes", path="Authorization")
        scheme, _, rest = header.strip().partition(" ")
        scheme = scheme.lower()
        rest = rest.strip()
        if scheme == "basic":
            if not self.users:
                raise Unauthenticated("basic authentication is not enabled here", path="Authorization",
                                      hint="use a bearer token")
            user, password = _decode_basic(rest)
            return await self._verify_basic(user, password)
        if scheme == "bearer":
            if self.bearer is None:
                raise Unauthenticated("bearer tokens are not enabled here", path="Authorization",
                                      hint="use HTTP basic authentication")
            if not rest:
                raise Unauthenticated("empty bearer token", path="Authorization")
            return self.bearer.principal(rest)
        raise Unauthenticated("unsupported authorization scheme", path="Authorization",
                              hint="use Basic or Bearer")

    def _cache_id(self, user: str, password: str) -> bytes:
        return hmac.new(self._cache_key, user.encode() + b"\0" + password.encode(), hashlib.sha256).digest()

    async def _verify_basic(self, user: str, password: str) -> Principal:
        key = self._cache_id(user, password)
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        record = self.users.get(user)
        target = record.hash if record is not None else self._dummy
        assert target is not None
        ok = await asyncio.to_thread(_verify_hash, target, password)
        if not ok or record is None:
            raise Unauthenticated("invalid user name or password", path="Authorization")
        principal = Principal(record.name, record.roles, "basic")
        if self.cache_seconds > 0:
            self._cache[key] = (principal, now + self.cache_seconds)
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return principal


def _verify_hash(hash_text: str, password: str) -> bool:
    from argon2.exceptions import VerificationError, VerifyMismatchError

    try:
        return bool(_hasher().verify(hash_text, password))
    except (VerifyMismatchError, VerificationError):
        return False


def _decode_basic(token: str) -> tuple[str, str]:
    try:
        raw = base64.b64decode(token, validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        raise Unauthenticated("basic credentials are not base64 of UTF-8 'user:password'",
                              path="Authorization") from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise Unauthenticated("basic credentials have no 'user:' part", path="Authorization")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise Unauthenticated("password too long", path="Authorization")
    return user, password


# --------------------------------------------------------------------------- configuration


def auth_from_settings(*, users_file: str | Path | None, jwt_config: str | Path | None,
                       allow_anonymous: str | Iterable[str] | None, realm: str, where: str,
                       env: Mapping[str, str] | None = None) -> HttpAuth:
    """Build an :class:`HttpAuth` from the three settings every surface has (files validated
    now, so a bad file stops the start-up). ``allow_anonymous``: roles (``read``, ...) for
    requests without credentials, or ``none``/empty for none. ``env``: where the failed-attempt
    limit is read from (:meth:`FailureLimiter.from_env`; the process environment by default)."""
    users = load_users(users_file) if users_file else None
    bearer = BearerAuth.from_file(jwt_config) if jwt_config else None
    anon: frozenset[str] = frozenset()
    if isinstance(allow_anonymous, str):
        text = allow_anonymous.strip()
        if text and text.lower() not in ("none", "off", "false", "no"):
            anon = parse_roles(text, where=f"{where} allow-anonymous")
    elif allow_anonymous:
        anon = parse_roles(list(allow_anonymous), where=f"{where} allow-anonymous")
    return HttpAuth(users=users, bearer=bearer, anonymous_roles=anon, realm=realm, limiter=FailureLimiter.from_env(env))


__all__ = [
    "ANONYMOUS",
    "ERROR_FORBIDDEN",
    "ERROR_UNAUTHENTICATED",
    "BearerAuth",
    "Forbidden",
    "HttpAuth",
    "Principal",
    "Unauthenticated",
    "UserRecord",
    "auth_from_settings",
    "basic_header",
    "client_auth_from_env",
    "client_auth_header",
    "hash_password",
    "load_users",
    "parse_role",
    "parse_roles",
]
