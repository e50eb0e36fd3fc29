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
* Failed attempts are limited per (client address, claimed user name) (:class:`FailureLimiter`:
  10 in 60 s by default, ``PRISM_AUTH_MAX_FAILURES`` / ``PRISM_AUTH_FAILURE_WINDOW_S``): past the
  limit every request from that address for that name gets 429 with ``Retry-After`` *before* any
  hash is verified, so guessing is bounded. A wrong password for one name never locks out another
  user of the same address (the console's host, a NAT gateway). Over all names an address may
  fail 10 times as often; past that only names that have logged in from it before are still
  verified, so a flood of wrong passwords cannot keep the Argon2 threads busy and cannot lock out
  the console, whose user has. Successes do not reset a count (valid low-privilege credentials
  must not buy more guesses), and a locked name gets 429 even for right or cached credentials
  (anything else would tell the guesser which guess was right).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import AuthError, ConfigError, ConfigProblems

# The client side (header building) lives in client_auth so that clients need no argon2/PyJWT;
# re-exported because the CLI, the console and the tests import it from here.
from app.security.client_auth import basic_header, client_auth_from_env, client_auth_header
from app.untrusted_json import loads_untrusted

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
    """Too many failed attempts for this user name from this client address (HTTP 429, ``Retry-After``)."""

    code = "too_many_failures"

    def __init__(self, message: str, *, retry_after: float, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


#: Methods a browser may send across sites without the server's consent and that change nothing.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cross_site_refusal(method: str, host: str | None, origin: str | None, fetch_site: str | None) -> str | None:
    """Why a state-changing request that a browser sent from another site is refused, or None.

    Why: a browser caches HTTP basic credentials for an origin - the registry's ``/ui``, a
    worker's management API opened after its 401 challenge - and sends them with every request
    to it, a cross-site form post included, which needs no CORS preflight. A page anywhere
    could then ``POST /v1/approvals/{id}/approve`` to the registry as the admin who looked at
    the UI (approving a breaking schema change in the admin's name), or restart a worker's
    topology. No Prism server takes a state-changing request from a browser page of another
    site (the registry UI only reads; the console's forms post to the console, which checks its
    own session, CSRF token and origin), so: an unsafe method is refused when the browser says
    the request is not same-origin (``Sec-Fetch-Site`` ``cross-site`` or ``same-site``), or,
    from a browser that does not send that header, when its ``Origin`` is ``null`` or names
    another host than the request's ``Host``. Clients that are not browsers (the SDK, the CLI,
    Confluent clients, curl) send neither header and are not affected."""
    if method.upper() in SAFE_METHODS:
        return None
    site = (fetch_site or "").strip().lower()
    if site in ("same-origin", "none"):
        return None  # the browser says so (also behind a proxy that rewrites Host)
    if site in ("cross-site", "same-site"):
        return f"a {method} from another site's page is refused (Sec-Fetch-Site: {site})"
    if origin is None:
        return None
    from urllib.parse import urlsplit

    value = origin.strip()
    try:
        netloc = urlsplit(value).netloc.lower() if value.lower() != "null" else ""
    except ValueError:
        netloc = ""
    if not netloc or netloc != (host or "").strip().lower():
        return f"a {method} from another origin ({value[:100]!r}) is refused"
    return None


ENV_MAX_FAILURES = "PRISM_AUTH_MAX_FAILURES"
ENV_FAILURE_WINDOW = "PRISM_AUTH_FAILURE_WINDOW_S"


class FailureLimiter:
    """Failed authentications per (client address, claimed user name) over a sliding window,
    with a wider per-address ceiling for the names that never authenticated from there
    (module docs).

    Why per name, not per address: one address is often many users (the console calls the
    worker from its host, a NAT gateway hides an office). Counting per address let ten wrong
    passwords for *any* name lock every user of that address out - a read-only user, or anyone
    on the console's host, could lock out the console. So:

    * a name is locked from an address after ``max_failures`` failures *for that name* in
      ``window_s`` - right or cached credentials included (anything else would tell the guesser
      which guess was right);
    * an address is locked after ``max_failures * names_per_address`` failures in ``window_s``
      over all names - this bounds Argon2 work and password spraying across names - but *not*
      for names that authenticated successfully from that address within ``known_good_s``: a
      flood of wrong passwords for other names cannot lock out a user (the console) who has
      logged in from there before. A guesser cannot join that set without a right password.

    Memory is bounded: at most ``max_clients`` (address, name) pairs, addresses and known-good
    pairs are remembered (least recently used first out), each with at most the limit's number
    of timestamps."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0, *, max_clients: int = 65_536,
                 names_per_address: int = 10, known_good_s: float = 24 * 3600.0,
                 clock: Any = time.monotonic) -> None:
        if max_failures < 1 or not 0 < window_s < 366 * 86400 or names_per_address < 1:  # NaN and inf too
            raise ConfigError(f"failure limit must be >= 1 attempt in a window over 0 s and under a year, got "
                              f"{max_failures} in {window_s} s", path=f"{ENV_MAX_FAILURES} / {ENV_FAILURE_WINDOW}",
                              hint="e.g. PRISM_AUTH_MAX_FAILURES=10 PRISM_AUTH_FAILURE_WINDOW_S=60")
        self.max_failures, self.window_s, self.max_clients = max_failures, float(window_s), max_clients
        self.max_address_failures = max_failures * names_per_address
        self.known_good_s = known_good_s
        self.clock = clock
        #: (address, name) -> failure times
        self._failures: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        #: address -> failure times over every name
        self._by_address: OrderedDict[str, list[float]] = OrderedDict()
        #: (address, name) -> when its last success stops counting
        self._known: OrderedDict[tuple[str, str], float] = OrderedDict()

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

    def _recent(self, table: OrderedDict[Any, list[float]], key: Any, now: float) -> list[float]:
        times = table.get(key)
        if not times:
            return []
        cut = now - self.window_s
        if times[0] <= cut:
            times[:] = [t for t in times if t > cut]
        return times

    def _known_good(self, client: str, name: str, now: float) -> bool:
        until = self._known.get((client, name))
        if until is None:
            return False
        if until <= now:
            del self._known[(client, name)]
            return False
        return True

    def retry_after(self, client: str, name: str = "") -> float | None:
        """Seconds until `name` may try again from `client`, or None when it may now."""
        now = self.clock()
        times = self._recent(self._failures, (client, name), now)
        if len(times) >= self.max_failures:
            return max(times[0] + self.window_s - now, 0.001)
        if self._known_good(client, name, now):
            return None
        times = self._recent(self._by_address, client, now)
        if len(times) >= self.max_address_failures:
            return max(times[0] + self.window_s - now, 0.001)
        return None

    def failed(self, client: str, name: str = "") -> None:
        now = self.clock()
        for table, key, keep in ((self._failures, (client, name), self.max_failures),
                                 (self._by_address, client, self.max_address_failures)):
            times = self._recent(table, key, now)
            times.append(now)
            del times[:-keep]  # only the newest `keep` matter
            table[key] = times
            table.move_to_end(key)
            while len(table) > self.max_clients:
                table.popitem(last=False)

    def succeeded(self, client: str, name: str) -> None:
        """`name` proved its password from `client`: the address ceiling no longer applies to it
        there for ``known_good_s``. Its own failures still count (no reset: valid credentials
        must not buy more guesses)."""
        self._known[(client, name)] = self.clock() + self.known_good_s
        self._known.move_to_end((client, name))
        while len(self._known) > self.max_clients:
            self._known.popitem(last=False)


def claimed_name(header: str) -> str:
    """The user name a request's ``Authorization`` value *claims*, unverified - only the key its
    failures are counted under: the basic user name, ``jwt:<sub>`` of a bearer token's payload,
    or ``""`` when nothing can be read (malformed headers share one count per address). At most
    256 characters, so a hostile header cannot make the limiter's keys large."""
    scheme, _, rest = header.strip().partition(" ")
    rest = rest.strip()
    try:
        if scheme.lower() == "basic":
            user, sep, _ = base64.b64decode(rest[:MAX_HEADER_BYTES], validate=True).decode("utf-8").partition(":")
            return user[:256] if sep else ""
        if scheme.lower() == "bearer":
            parts = rest.split(".")
            if len(parts) != 3 or len(parts[1]) > MAX_HEADER_BYTES:
                return ""
            payload = loads_untrusted(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)),
                                      what="bearer token payload", max_bytes=MAX_HEADER_BYTES)
            sub = payload.get("sub") if isinstance(payload, dict) else None
            return f"jwt:{sub[:256]}" if isinstance(sub, str) else ""
    except (binascii.Error, ValueError):  # JsonInputError is a ValueError
        return ""
    return ""


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
    #: the data classification this user may read (`clearance` in the users file; None: not
    #: set, and whoever enforces classification - the console's DLQ pages - applies its default)
    clearance: str | None = None

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
    #: optional `clearance` (public/internal/confidential/restricted): what the console shows them
    clearance: str | None = None


#: the data classifications, lowest first (app/sdk/audit.py LEVELS, app/envelope/validation.py)
CLEARANCES = ("public", "internal", "confidential", "restricted")


def _check_clearance(value: object, *, where: str) -> str | None:
    """A user's optional clearance: one of :data:`CLEARANCES` (absent: None, the default applies)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in CLEARANCES:
        raise ConfigError(f"clearance must be one of {list(CLEARANCES)}, got {str(value)[:40]!r}", path=where,
                          hint="e.g. clearance: confidential (leave it out for the default, internal)")
    return value


def load_users(path: str | Path) -> dict[str, UserRecord]:
    """Read and validate a users file (YAML or JSON). Every problem is reported at once, with
    the entry it is in and how to fix it."""
    from app.config_files import read_config

    p = Path(path)
    doc = read_config(p, what="users file",
                      missing_hint="pass an existing YAML/JSON file (see docs/schema-registry.md, Authentication)")
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
            unknown = sorted(map(str, set(entry) - {"user", "hash", "roles", "clearance"}))
            if unknown:
                import difflib

                meant = {k: m[0] for k in unknown
                         if (m := difflib.get_close_matches(k, ["user", "hash", "roles", "clearance"], n=1))}
                raise ConfigError(f"unknown key(s) {unknown}" + "".join(f" - did you mean {v!r} for {k!r}?"
                                                                         for k, v in meant.items()), path=where,
                                  hint="allowed: user, hash, roles, clearance"
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
                                     parse_roles(entry.get("roles"), where=f"{where}.roles"),
                                     _check_clearance(entry.get("clearance"), where=f"{where}.clearance"))
        except ConfigError as exc:
            problems.append(exc)
    if problems:
        if len(problems) == 1:
            raise problems[0]
        # one error line per problem where the CLI prints them (app/cli/output.py), not all in one line
        raise ConfigProblems(f"{len(problems)} problems in the users file: " + "; ".join(str(e) for e in problems),
                             problems, path=str(p), summary=f"{len(problems)} problems in users file {p}")
    return users


# --------------------------------------------------------------------------- bearer tokens


@dataclass(frozen=True, slots=True)
class BearerAuth:
    """JWT bearer tokens -> principals. ``roles_claim`` holds a list (or a space-separated
    string, like OAuth ``scope``); with ``role_map`` its values are translated (``{group:
    role-or-roles}``) and unmapped values ignored, without it values that are valid roles
    are taken as they are and others ignored. A token with no usable role authenticates
    but may do nothing (403).

    The console's clearance comes the same way: ``clearance_claim`` (absent: no token carries
    one, every bearer user reads at the default, ``internal``) holds a clearance word, a list,
    or a space-separated string; with ``clearance_map`` its values (IdP groups, say) are
    translated and unmapped ones ignored. The highest clearance named wins; a token naming none
    gets the default. The token is signed by a configured issuer, so the claim is as trusted as
    a users-file entry - and no other claim can raise it."""

    authenticator: Any  # app.security.jwt_auth.Authenticator
    roles_claim: str = "roles"
    role_map: Mapping[str, frozenset[str]] | None = None
    clearance_claim: str | None = None
    clearance_map: Mapping[str, str] | None = None

    _KEYS = frozenset({"roles_claim", "role_map", "clearance_claim", "clearance_map"})

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
        clearance_claim = data.get("clearance_claim")
        if clearance_claim is not None and (not isinstance(clearance_claim, str) or not clearance_claim):
            raise ConfigError("clearance_claim must name a claim", path=f"{where}.clearance_claim",
                              hint="e.g. clearance_claim: prism_clearance (leave it out: bearer users read at internal)")
        clearance_map: dict[str, str] | None = None
        if data.get("clearance_map") is not None:
            cm = data["clearance_map"]
            if clearance_claim is None:
                raise ConfigError("clearance_map needs clearance_claim", path=f"{where}.clearance_map",
                                  hint="name the claim whose values it maps, e.g. clearance_claim: groups")
            if not isinstance(cm, Mapping) or not cm:
                raise ConfigError("clearance_map must map claim values to clearances", path=f"{where}.clearance_map",
                                  hint="e.g. clearance_map: {payments-oncall: restricted, analysts: confidential}")
            clearance_map = {}
            for k, v in cm.items():
                level = _check_clearance(v, where=f"{where}.clearance_map.{k}")
                if level is None:
                    raise ConfigError("a mapped clearance cannot be empty", path=f"{where}.clearance_map.{k}",
                                      hint=f"one of {list(CLEARANCES)}")
                clearance_map[str(k)] = level
        jwt_part = {k: v for k, v in data.items() if k not in cls._KEYS}
        wanted = [roles_claim, *([clearance_claim] if clearance_claim else [])]
        kept = tuple(dict.fromkeys([*jwt_part.get("kept_claims", DEFAULT_KEPT_CLAIMS), *wanted]))
        jwt_part["kept_claims"] = kept
        config = JwtConfig.from_mapping(jwt_part, where=where, base_dir=base_dir)
        return cls(Authenticator(config), roles_claim, role_map, clearance_claim, clearance_map)

    @classmethod
    def from_file(cls, path: str | Path) -> BearerAuth:
        from app.config_files import read_config

        p = Path(path)
        doc = read_config(p, what="JWT settings", by_suffix=False,
                          missing_hint="pass an existing YAML file (see docs/operations.md, management API)")
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

    def clearance_of(self, claims: Mapping[str, Any]) -> str | None:
        """The highest clearance ``clearance_claim`` names (class docs); None: the default."""
        if self.clearance_claim is None:
            return None
        raw = claims.get(self.clearance_claim)
        values = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
        named = [self.clearance_map.get(v) if self.clearance_map is not None else v
                 for v in values if isinstance(v, str)]
        levels = [v for v in named if v in CLEARANCES]
        return max(levels, key=CLEARANCES.index) if levels else None

    def principal(self, token: str, *, now: float | None = None) -> Principal:
        try:
            identity = self.authenticator.authenticate(token, now=now)
        except AuthError as exc:
            raise Unauthenticated(f"bearer token refused: {exc.message}", path=exc.path) from None
        return Principal(identity.publisher_id, self.roles_of(identity.claims), "bearer",
                         clearance=self.clearance_of(identity.claims))


# --------------------------------------------------------------------------- the authenticator


class HttpAuth:
    """Turns an ``Authorization`` header into a :class:`Principal` (module docs)."""

    def __init__(self, *, users: Mapping[str, UserRecord] | None = None, bearer: BearerAuth | None = None,
                 anonymous_roles: Iterable[str] = (), realm: str = "prism", cache_seconds: float = 60.0,
                 cache_size: int = 4096, limiter: FailureLimiter | None = None) -> None:
        self.users = dict(users or {})
        #: failed attempts per (client address, user name); None: unlimited, for in-process tools only
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
        if self.limiter is None or client is None:
            return await self._authenticate(values)
        limiter, name = self.limiter, claimed_name(values[0]) if len(values) == 1 else ""
        wait = limiter.retry_after(client, name)
        if wait is not None:
            raise TooManyFailures(f"too many failed authentication attempts from {client[:100]}",
                                  retry_after=wait, path="Authorization",
                                  hint=f"wait {wait:.0f} s; the limit is {limiter.max_failures} failures in "
                                       f"{limiter.window_s:g} s per user name and client address, and "
                                       f"{limiter.max_address_failures} per address for names that have not "
                                       "logged in from it")
        try:
            principal = await self._authenticate(values)
        except Unauthenticated:
            limiter.failed(client, name)
            raise
        limiter.succeeded(client, name)
        return principal

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
        principal = Principal(record.name, record.roles, "basic", record.clearance)
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
