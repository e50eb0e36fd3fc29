"""Producer authentication with JWTs (issue 3, stage "authenticate"; memo-031 Recommendation 5).

A producer puts a JWT in `security.auth_token`. The worker verifies it against a JWKS file,
takes the publisher identity from its claims, writes that identity into the envelope and
strips the token before the envelope is written anywhere:

    auth = Authenticator(JwtConfig(jwks_path="keys/jwks.json", issuers=("https://idp.example",),
                                   audience=("prism",)))
    identity = auth.authenticate_envelope(env)   # token stripped even when this raises

Design decisions, each closing a known JWT pitfall (RFC 8725):

* Accepted algorithms are HS256, RS256 and EdDSA only; `none` and everything else are refused
  before any key is touched (`TokenAlgorithmError`).
* Keys are selected by the token's `kid`, and each key is bound to ONE algorithm by its JWK
  type (`oct` -> HS256, `RSA` -> RS256, `OKP`/Ed25519 -> EdDSA, or its `alg` member). A token
  whose `alg` differs from its key's algorithm is refused, so an RSA public key can never be
  used as an HMAC secret (algorithm confusion). The JWKS may therefore mix HS256 `oct` keys
  with public keys safely.
* A verification JWKS must not hold private key material (`d`, ...): loading fails.
  Weak keys (HMAC < 32 bytes, RSA < 2048 bits) fail at load time too, not per message.
* Time claims (`exp`, `nbf`, `iat`) are checked here, not by PyJWT, against an injectable
  `now` with a configurable clock-skew leeway, and each failure says which claim and by how
  much. Issuer (one of several) and audience are checked by PyJWT.
* Error messages never contain the token (nor any part of it but a truncated `kid`/`alg`).
* The JWKS file is re-read when it changes (checked at most every `reload_interval_seconds`,
  and at once for an unknown `kid`, so a rotated-in key works without a restart). A broken
  new file keeps the previous keys and is logged; a broken file at start-up is a `ConfigError`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jwt
from jwt.exceptions import (
    DecodeError as JwtDecodeError,
)
from jwt.exceptions import (
    InvalidAlgorithmError,
    InvalidAudienceError,
    InvalidIssuedAtError,
    InvalidIssuerError,
    InvalidJTIError,
    InvalidKeyError,
    InvalidSignatureError,
    InvalidSubjectError,
    InvalidTokenError,
    MissingRequiredClaimError,
    PyJWKError,
    PyJWTError,
)

from app.envelope.model import Envelope
from app.errors import (
    ConfigError,
    InvalidClaimError,
    MalformedTokenError,
    MissingClaimError,
    MissingTokenError,
    TokenAlgorithmError,
    TokenExpiredError,
    TokenNotYetValidError,
    TokenSignatureError,
    UnknownTokenKeyError,
    WrongAudienceError,
    WrongIssuerError,
)
from app.untrusted_json import loads_untrusted

log = logging.getLogger(__name__)

#: Algorithm -> the JWK key type that may verify it.
KEY_TYPES: Mapping[str, str] = MappingProxyType({"HS256": "oct", "RS256": "RSA", "EdDSA": "OKP"})
ACCEPTED_ALGORITHMS = frozenset(KEY_TYPES)
MIN_HMAC_KEY_BYTES = 32
MIN_RSA_BITS = 2048
#: JWK members that only private (or symmetric-secret) keys have; `k` is allowed for `oct`.
_PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth")
DEFAULT_KEPT_CLAIMS = ("iss", "sub", "aud", "exp", "iat", "nbf", "jti")


def _show(value: object, limit: int = 64) -> str:
    """A safe, bounded rendering of an attacker-controlled header value."""
    text = value if isinstance(value, str) else type(value).__name__
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _seconds(now: float | datetime | None) -> float:
    """`now` as epoch seconds: a number, an aware datetime, or None for the wall clock."""
    if isinstance(now, datetime):
        return now.timestamp()
    return time.time() if now is None else float(now)


def _when(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{seconds} s since the epoch"


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class JwtConfig:
    """How tokens are checked. Invalid settings raise `ConfigError` at construction."""

    jwks_path: str | Path
    issuers: tuple[str, ...]
    audience: tuple[str, ...]
    algorithms: tuple[str, ...] = ("RS256", "EdDSA", "HS256")
    leeway_seconds: float = 30.0
    required_claims: tuple[str, ...] = ("exp",)
    publisher_id_claim: str = "sub"
    publisher_team_claim: str | None = "team"
    require_team: bool = False
    max_token_bytes: int = 8192
    reload_interval_seconds: float = 5.0
    kept_claims: tuple[str, ...] = DEFAULT_KEPT_CLAIMS

    def __post_init__(self) -> None:
        # Accept a single string where a tuple is expected (YAML `issuer: x`).
        for name in ("issuers", "audience", "algorithms", "required_claims", "kept_claims"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        where = "jwt"
        bad = [a for a in self.algorithms if a not in ACCEPTED_ALGORITHMS]
        if any(a.lower() == "none" for a in bad):
            raise ConfigError("algorithm 'none' (unsigned tokens) can never be accepted", path=f"{where}.algorithms",
                              hint=f"use a subset of {sorted(ACCEPTED_ALGORITHMS)}")
        if bad or not self.algorithms:
            raise ConfigError(f"algorithms must be a non-empty subset of {sorted(ACCEPTED_ALGORITHMS)}, "
                              f"got {list(self.algorithms)}", path=f"{where}.algorithms")
        if not self.issuers or not all(isinstance(i, str) and i for i in self.issuers):
            raise ConfigError("at least one issuer is required (non-empty strings)", path=f"{where}.issuers",
                              hint="set it to your identity provider's `iss` value")
        if not self.audience or not all(isinstance(a, str) and a for a in self.audience):
            raise ConfigError("at least one audience is required (non-empty strings)", path=f"{where}.audience",
                              hint="issue Prism's tokens with an `aud` naming Prism, and list it here")
        if not (isinstance(self.leeway_seconds, int | float) and 0 <= self.leeway_seconds <= 3600):
            raise ConfigError(f"leeway_seconds must be between 0 and 3600, got {self.leeway_seconds!r}",
                              path=f"{where}.leeway_seconds")
        if not self.publisher_id_claim:
            raise ConfigError("publisher_id_claim must name a claim", path=f"{where}.claims.publisher_id")
        if self.require_team and not self.publisher_team_claim:
            raise ConfigError("require_team needs publisher_team_claim", path=f"{where}.claims.publisher_team")
        if self.max_token_bytes < 256:
            raise ConfigError(f"max_token_bytes {self.max_token_bytes} is too small for any JWT",
                              path=f"{where}.max_token_bytes")
        if self.reload_interval_seconds < 0:
            raise ConfigError("reload_interval_seconds must be >= 0", path=f"{where}.reload_interval_seconds")

    _KEYS = frozenset({"jwks_file", "jwks_path", "issuer", "issuers", "audience", "algorithms", "leeway_seconds",
                       "required_claims", "claims", "require_team", "max_token_bytes", "reload_interval_seconds",
                       "kept_claims"})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "jwt", base_dir: Path | None = None) -> JwtConfig:
        """Build from a topology/config mapping:

            jwt:
              jwks_file: keys/jwks.json      # relative to base_dir
              issuers: [https://idp.example]
              audience: prism
              algorithms: [RS256, EdDSA]
              leeway_seconds: 30
              required_claims: [exp, iat]
              claims: {publisher_id: sub, publisher_team: team}
              require_team: false
        """
        unknown = sorted(set(data) - cls._KEYS)
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown}", path=where, hint=f"allowed: {sorted(cls._KEYS)}")
        path = data.get("jwks_file", data.get("jwks_path"))
        if not path:
            raise ConfigError("jwks_file is required", path=f"{where}.jwks_file")
        jwks_path = Path(path)
        if base_dir is not None and not jwks_path.is_absolute():
            jwks_path = base_dir / jwks_path
        claims = data.get("claims") or {}
        if not isinstance(claims, Mapping) or set(claims) - {"publisher_id", "publisher_team"}:
            raise ConfigError("claims may only set publisher_id and publisher_team", path=f"{where}.claims")
        kwargs: dict[str, Any] = {"jwks_path": jwks_path,
                                  "issuers": data.get("issuers", data.get("issuer", ())),
                                  "audience": data.get("audience", ())}
        for key in ("algorithms", "leeway_seconds", "required_claims", "require_team", "max_token_bytes",
                    "reload_interval_seconds", "kept_claims"):
            if key in data:
                kwargs[key] = data[key]
        if "publisher_id" in claims:
            kwargs["publisher_id_claim"] = claims["publisher_id"]
        if "publisher_team" in claims:
            kwargs["publisher_team_claim"] = claims["publisher_team"]
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(exc.message, path=(exc.path or "").replace("jwt", where, 1), hint=exc.hint) from None
        except TypeError as exc:
            raise ConfigError(f"invalid value type: {exc}", path=where) from None


# --------------------------------------------------------------------------- JWKS


@dataclass(frozen=True, slots=True)
class TokenKey:
    """One usable verification key: its kid, the single algorithm it verifies, the PyJWK."""

    kid: str
    algorithm: str
    jwk: jwt.PyJWK = field(repr=False)


def _b64url_len(value: object) -> int:
    if not isinstance(value, str):
        return -1
    try:
        return len(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        return -1


def parse_jwks(doc: Any, *, source: str = "JWKS") -> tuple[dict[str, TokenKey], dict[str, str]]:
    """(usable keys by kid, skipped kid -> why) from an RFC 7517 JWK Set document.

    Structural problems and unsafe keys raise `ConfigError`; keys for algorithms Prism does
    not accept (EC, RS512, encryption keys, ...) are skipped, so a JWKS shared with other
    services still loads, and a token naming one gets a precise error.
    """
    if not isinstance(doc, Mapping) or not isinstance(doc.get("keys"), list):
        raise ConfigError(f"{source} is not a JWK Set (an object with a 'keys' array)", path=source,
                          hint="see RFC 7517 section 5")
    keys: dict[str, TokenKey] = {}
    skipped: dict[str, str] = {}
    for i, jwk_doc in enumerate(doc["keys"]):
        where = f"{source}: keys[{i}]"
        if not isinstance(jwk_doc, Mapping):
            raise ConfigError("key is not an object", path=where)
        kid = jwk_doc.get("kid")
        if not isinstance(kid, str) or not kid:
            raise ConfigError("key has no kid; Prism selects keys by kid", path=where,
                              hint="give every key a unique kid and issue tokens with it in the header")
        where = f"{source}: kid {kid!r}"
        if kid in keys or kid in skipped:
            raise ConfigError("duplicate kid", path=where, hint="kids must be unique within the JWKS")
        kty = jwk_doc.get("kty")
        private = [m for m in _PRIVATE_MEMBERS if m in jwk_doc]
        if private:
            raise ConfigError(f"key holds private key material {private}", path=where,
                              hint="a verification JWKS publishes public keys only")
        use = jwk_doc.get("use")
        ops = jwk_doc.get("key_ops")
        if use is not None and use != "sig":
            skipped[kid] = f"its use is {use!r}, not 'sig'"
            continue
        if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
            skipped[kid] = "its key_ops do not include 'verify'"
            continue
        if kty == "oct":
            algorithm = "HS256"
        elif kty == "RSA":
            algorithm = "RS256"
        elif kty == "OKP" and jwk_doc.get("crv") == "Ed25519":
            algorithm = "EdDSA"
        else:
            skipped[kid] = f"its key type {kty!r} (crv {jwk_doc.get('crv')!r}) verifies none of " \
                           f"{sorted(ACCEPTED_ALGORITHMS)}"
            continue
        declared = jwk_doc.get("alg")
        if declared is not None and declared != algorithm:
            skipped[kid] = f"its alg {declared!r} is not accepted (a {kty} key may only verify {algorithm})"
            continue
        if kty == "oct":
            size = _b64url_len(jwk_doc.get("k"))
            if size < MIN_HMAC_KEY_BYTES:
                raise ConfigError(f"HS256 key is {max(size, 0)} bytes; at least {MIN_HMAC_KEY_BYTES} required",
                                  path=where, hint="generate 32+ random bytes (RFC 7518 section 3.2)")
        try:
            pyjwk = jwt.PyJWK(dict(jwk_doc), algorithm)
        except (PyJWKError, InvalidKeyError, PyJWTError, ValueError, TypeError) as exc:
            raise ConfigError(f"key material is malformed ({type(exc).__name__})", path=where) from None
        if kty == "RSA" and pyjwk.key.key_size < MIN_RSA_BITS:
            raise ConfigError(f"RSA key is {pyjwk.key.key_size} bits; at least {MIN_RSA_BITS} required", path=where)
        keys[kid] = TokenKey(kid, algorithm, pyjwk)
    return keys, skipped


class JwksKeyring:
    """The keys of a JWKS file, re-read when the file changes (module docs)."""

    def __init__(self, path: str | Path, *, reload_interval_seconds: float = 5.0) -> None:
        self.path = Path(path)
        self.reload_interval_seconds = reload_interval_seconds
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()
        self.last_reload_error: str | None = None
        #: bumped by every reload that loaded keys: caches of verified tokens compare it
        self.version = 0
        self._stamp = self._stat()
        if self._stamp is None:
            raise ConfigError(f"JWKS file {str(self.path)!r} does not exist or cannot be read", path="jwt.jwks_file",
                              hint="point jwks_file at an RFC 7517 JSON file")
        self.keys, self.skipped = self._load()

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> JwksKeyring:
        """An in-memory keyring (no file, no reload)."""
        ring = cls.__new__(cls)
        ring.path = Path("<memory>")
        ring.reload_interval_seconds = math.inf
        ring._lock = threading.Lock()
        ring._checked_at = time.monotonic()
        ring.last_reload_error = None
        ring.version = 0
        ring._stamp = None
        ring.keys, ring.skipped = parse_jwks(doc, source="JWKS")
        return ring

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> tuple[dict[str, TokenKey], dict[str, str]]:
        # The one bounded reader and JSON decoder of configuration files: `read_bytes` and
        # `json.loads` read `jwks: /dev/zero` until the kernel killed the worker (out of memory),
        # and took a key given twice silently
        from app.config_files import parse_config_text, read_text

        text = read_text(self.path, what="JWKS file",
                         missing_hint="point the topology's authenticate.jwks at an RFC 7517 JSON file "
                                      "(`prism keys init` writes one)")
        doc = parse_config_text(text, what="JWKS file", source=str(self.path), json=True)
        return parse_jwks(doc, source=str(self.path))

    def refresh(self, *, force: bool = False) -> bool:
        """Re-read the file if it changed; True when new keys were loaded. `force` skips the
        interval (the stat is cheap), used when a token names an unknown kid."""
        if self.reload_interval_seconds == math.inf:
            return False
        now = time.monotonic()
        if not force and now - self._checked_at < self.reload_interval_seconds:
            return False
        with self._lock:
            self._checked_at = now
            stamp = self._stat()
            if stamp is None or stamp == self._stamp:
                return False
            try:
                keys, skipped = self._load()
            except ConfigError as exc:
                # Keep serving the previous keys: a half-written file must not stop the worker.
                self.last_reload_error = str(exc)
                log.warning("JWKS reload failed, keeping the previous %d key(s): %s", len(self.keys), exc)
                return False
            self._stamp = stamp
            self.keys, self.skipped = keys, skipped
            self.version += 1
            self.last_reload_error = None
            log.info("JWKS reloaded from %s: %d usable key(s), %d skipped", self.path, len(keys), len(skipped))
            return True

    def get(self, kid: str) -> TokenKey:
        self.refresh()
        key = self.keys.get(kid)
        if key is None and kid not in self.skipped and self.refresh(force=True):
            key = self.keys.get(kid)
        if key is not None:
            return key
        if kid in self.skipped:
            raise UnknownTokenKeyError(f"token key {_show(kid)} is in the JWKS but unusable: {self.skipped[kid]}",
                                       path="token header kid")
        raise UnknownTokenKeyError(f"token key {_show(kid)} is not in the JWKS", path="token header kid",
                                   hint="add the issuer's current key to the JWKS file (it is re-read on change)")


# --------------------------------------------------------------------------- authentication


def _unverified_header(token: str) -> dict[str, Any]:
    """The JOSE header, parsed here (not by PyJWT) so each malformation gets its own message."""
    parts = token.split(".")
    if len(parts) != 3:
        raise MalformedTokenError(f"token has {len(parts)} dot-separated part(s); a compact JWS has 3",
                                  path="security.auth_token")
    try:
        raw = base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4))
        header = loads_untrusted(raw, what="token header", max_bytes=8192)
    except (binascii.Error, ValueError):  # JsonInputError (syntax, size, depth) is a ValueError
        raise MalformedTokenError("token header is not base64url-encoded JSON", path="token header") from None
    if not isinstance(header, dict):
        raise MalformedTokenError("token header is not a JSON object", path="token header")
    return header


@dataclass(frozen=True, slots=True)
class Identity:
    """Who published, as proven by a verified token. `claims` is the configured subset
    (`kept_claims` + the team claim) - never the token itself."""

    publisher_id: str
    publisher_team: str | None
    claims: Mapping[str, Any]
    key_id: str
    algorithm: str


_SIG_OPTIONS: dict[str, Any] = {
    "verify_signature": True,
    "verify_exp": False,   # time claims are checked below, against an injectable `now`
    "verify_nbf": False,
    "verify_iat": False,
    "verify_iss": True,
    "verify_aud": True,
    "verify_sub": True,
    "verify_jti": True,
    "strict_aud": False,
    "enforce_minimum_key_length": True,
}


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidClaimError(f"claim {name!r} must be a NumericDate (seconds since the epoch), "
                                f"got a {type(value).__name__}", path=f"token claim {name}")
    return float(value)


class Authenticator:
    """Verifies producer JWTs per a `JwtConfig` (module docs)."""

    def __init__(self, config: JwtConfig, *, keyring: JwksKeyring | None = None) -> None:
        self.config = config
        self.keyring = keyring or JwksKeyring(config.jwks_path, reload_interval_seconds=config.reload_interval_seconds)
        self._options = {**_SIG_OPTIONS, "require": list(config.required_claims)}

    def authenticate(self, token: str, *, now: float | datetime | None = None) -> Identity:
        """Verify `token` and return the publisher identity. Every failure is an `AuthError`
        subclass (`TokenExpiredError`, `WrongAudienceError`, ...); see docs/bindings.md."""
        cfg = self.config
        if not isinstance(token, str) or not token.strip():
            raise MissingTokenError("no auth token", path="security.auth_token",
                                    hint="the producer must send a JWT in security.auth_token")
        token = token.strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        if len(token) > cfg.max_token_bytes:
            raise MalformedTokenError(f"token is {len(token)} bytes, over the {cfg.max_token_bytes}-byte limit",
                                      path="security.auth_token", hint="raise jwt.max_token_bytes if this is legitimate")
        header = _unverified_header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or not alg:
            raise MalformedTokenError("token header has no alg", path="token header alg")
        if alg.lower() == "none":
            raise TokenAlgorithmError("unsigned token (alg 'none') is never accepted", path="token header alg")
        if alg not in cfg.algorithms:
            raise TokenAlgorithmError(f"token algorithm {_show(alg)} is not accepted",
                                      path="token header alg", hint=f"accepted: {list(cfg.algorithms)}")
        if "crit" in header or header.get("b64") is False:
            raise MalformedTokenError("token header uses critical extensions (crit/b64), which Prism does not support",
                                      path="token header crit")
        kid = header.get("kid")
        if kid is None:
            raise UnknownTokenKeyError("token header has no kid; keys are selected by kid", path="token header kid",
                                       hint="configure the issuer to put the key id in the token header")
        if not isinstance(kid, str) or not kid:
            raise MalformedTokenError("token header kid must be a non-empty string", path="token header kid")
        key = self.keyring.get(kid)
        if key.algorithm != alg:
            raise TokenAlgorithmError(
                f"token says {_show(alg)} but key {_show(kid)} is a {key.algorithm} key (algorithm confusion refused)",
                path="token header alg")
        try:
            decoded = jwt.decode_complete(
                token, key=key.jwk, algorithms=[alg], options=self._options,  # type: ignore[arg-type]
                audience=list(cfg.audience), issuer=list(cfg.issuers),
            )
        except InvalidSignatureError:
            raise TokenSignatureError(f"token signature does not verify with key {_show(kid)}",
                                      path="token signature", hint="the token was altered or signed by another key") \
                from None
        except InvalidAudienceError:
            raise WrongAudienceError("token audience (aud) names none of the accepted audiences",
                                     path="token claim aud", hint=f"accepted: {list(cfg.audience)}") from None
        except InvalidIssuerError:
            raise WrongIssuerError("token issuer (iss) is not an accepted issuer", path="token claim iss",
                                   hint=f"accepted: {list(cfg.issuers)}") from None
        except MissingRequiredClaimError as exc:
            raise MissingClaimError(f"token has no {exc.claim!r} claim", path=f"token claim {exc.claim}") from None
        except (InvalidSubjectError, InvalidJTIError, InvalidIssuedAtError) as exc:
            raise InvalidClaimError(f"token claim has the wrong type ({type(exc).__name__})",
                                    path="token claims") from None
        except (InvalidAlgorithmError, InvalidKeyError):
            raise TokenAlgorithmError(f"key {_show(kid)} cannot verify a {_show(alg)} token",
                                      path="token header alg") from None
        except (JwtDecodeError, InvalidTokenError, ValueError, TypeError):
            raise MalformedTokenError("token segments are not valid base64url, or its payload is not a JSON object "
                                      "of claims", path="token payload") from None
        claims: dict[str, Any] = decoded["payload"]
        self._check_times(claims, now)
        return self._identity(claims, key)

    def _check_times(self, claims: Mapping[str, Any], now: float | datetime | None) -> None:
        t = _seconds(now)
        leeway = self.config.leeway_seconds
        exp = _number(claims, "exp")
        if exp is not None and exp <= t - leeway:
            raise TokenExpiredError(
                f"token expired at {_when(exp)}, {t - exp:.0f} s ago (clock-skew leeway {leeway:g} s)",
                path="token claim exp", hint="the producer must fetch a fresh token")
        nbf = _number(claims, "nbf")
        if nbf is not None and nbf > t + leeway:
            raise TokenNotYetValidError(
                f"token is not valid before {_when(nbf)}, {nbf - t:.0f} s from now (clock-skew leeway {leeway:g} s)",
                path="token claim nbf", hint="check the clocks of the issuer and this worker")
        iat = _number(claims, "iat")
        if iat is not None and iat > t + leeway:
            raise TokenNotYetValidError(
                f"token is issued in the future ({_when(iat)}, {iat - t:.0f} s from now; leeway {leeway:g} s)",
                path="token claim iat", hint="check the clocks of the issuer and this worker")

    def _identity(self, claims: Mapping[str, Any], key: TokenKey) -> Identity:
        cfg = self.config
        pid = claims.get(cfg.publisher_id_claim)
        if pid is None:
            raise MissingClaimError(f"token has no {cfg.publisher_id_claim!r} claim for the publisher id",
                                    path=f"token claim {cfg.publisher_id_claim}")
        if not isinstance(pid, str) or not pid:
            raise InvalidClaimError(f"claim {cfg.publisher_id_claim!r} must be a non-empty string",
                                    path=f"token claim {cfg.publisher_id_claim}")
        team: str | None = None
        if cfg.publisher_team_claim:
            raw = claims.get(cfg.publisher_team_claim)
            if raw is None:
                if cfg.require_team:
                    raise MissingClaimError(f"token has no {cfg.publisher_team_claim!r} claim for the publisher team",
                                            path=f"token claim {cfg.publisher_team_claim}")
            elif not isinstance(raw, str) or not raw:
                raise InvalidClaimError(f"claim {cfg.publisher_team_claim!r} must be a non-empty string",
                                        path=f"token claim {cfg.publisher_team_claim}")
            else:
                team = raw
        kept = {*cfg.kept_claims, *([cfg.publisher_team_claim] if cfg.publisher_team_claim else [])}
        subset = {k: claims[k] for k in claims if k in kept}
        return Identity(pid, team, MappingProxyType(subset), key.kid, key.algorithm)

    def authenticate_envelope(self, env: Envelope, *, now: float | datetime | None = None) -> Identity:
        """Authenticate the envelope's `security.auth_token`, write the identity into the
        envelope (`apply_identity`) and strip the token - always, also when authentication
        fails, so a rejected message carries no token into the DLQ or logs."""
        sec = env.security
        token = sec.auth_token if sec is not None and sec.HasField("auth_token") else ""
        try:
            identity = self.authenticate(token, now=now)
            apply_identity(env, identity)
            return identity
        finally:
            strip_token(env)


def strip_token(env: Envelope) -> bool:
    """Remove `security.auth_token`; True when one was present.

    The context is read off the header without its presence test (an absent context reads as
    the empty default, which holds no token, and reading never sets it): one property call and
    one `HasField` less - the publisher strips every output's envelope, whose token the
    authenticate stage already cleared."""
    sec = env.header.security
    if not sec.HasField("auth_token"):
        return False
    sec.ClearField("auth_token")
    return True


def apply_identity(env: Envelope, identity: Identity) -> None:
    """Overwrite the envelope's publisher identity with the verified one. A producer-claimed
    team is cleared when the token states none: only verified identity leaves the worker."""
    sec = env.ensure_security()
    sec.publisher_id = identity.publisher_id
    if identity.publisher_team:
        sec.publisher_team = identity.publisher_team
    else:
        sec.ClearField("publisher_team")


__all__ = [
    "ACCEPTED_ALGORITHMS",
    "Authenticator",
    "Identity",
    "JwksKeyring",
    "JwtConfig",
    "TokenKey",
    "apply_identity",
    "parse_jwks",
    "strip_token",
]
