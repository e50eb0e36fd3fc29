"""JWT authentication: accepted algorithms, every rejection with its documented error, JWKS
loading and reload, and the token never leaking (into messages or the envelope)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm

from app.envelope import Layout, encode, new_envelope
from app.errors import (
    AuthError,
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
from app.security.jwt_auth import (
    Authenticator,
    JwksKeyring,
    JwtConfig,
    apply_identity,
    parse_jwks,
    strip_token,
)

FIXTURES = Path(__file__).parent / "fixtures" / "jwks"
NOW = 1_800_000_000
ISS = "https://idp.example"
AUD = "prism"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Keys:
    """Keys generated for this test module (RSA generation is the slow part: done once)."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa_other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ed = ed25519.Ed25519PrivateKey.generate()
        self.hs = secrets.token_bytes(32)

    def jwks(self, *, with_other: bool = False) -> dict:
        keys = [
            {**json.loads(RSAAlgorithm.to_jwk(self.rsa.public_key())), "kid": "rsa-1", "use": "sig"},
            {**json.loads(OKPAlgorithm.to_jwk(self.ed.public_key())), "kid": "ed-1"},
            {"kty": "oct", "kid": "hs-1", "k": b64url(self.hs)},
        ]
        if with_other:
            keys.append({**json.loads(RSAAlgorithm.to_jwk(self.rsa_other.public_key())), "kid": "rsa-2"})
        return {"keys": keys}


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture
def jwks_file(tmp_path, keys) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    return path


def config(path: Path, **kw) -> JwtConfig:
    return JwtConfig(jwks_path=path, issuers=kw.pop("issuers", (ISS,)), audience=kw.pop("audience", (AUD,)), **kw)


@pytest.fixture
def auth(jwks_file) -> Authenticator:
    return Authenticator(config(jwks_file))


def claims(**over) -> dict:
    base = {"iss": ISS, "aud": AUD, "sub": "svc-orders", "team": "commerce", "iat": NOW - 10, "exp": NOW + 300,
            "email": "orders@example.com", "scope": "publish"}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def token(keys: Keys, alg: str = "RS256", kid: str | None = None, **claim_over) -> str:
    key = {"RS256": keys.rsa, "EdDSA": keys.ed, "HS256": keys.hs}[alg]
    kid = kid or {"RS256": "rsa-1", "EdDSA": "ed-1", "HS256": "hs-1"}[alg]
    return jwt.encode(claims(**claim_over), key, algorithm=alg, headers={"kid": kid})


def handmade(header: dict, payload: dict, sign=lambda signing_input: b"") -> str:
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}"
    return f"{signing_input}.{b64url(sign(signing_input.encode()))}"


def rejects(auth: Authenticator, tok: str, error: type[AuthError], match: str | None = None, **kw) -> AuthError:
    """Assert the documented error, and that no part of the token leaks into its message."""
    with pytest.raises(error, match=match) as info:
        auth.authenticate(tok, now=kw.pop("now", NOW))
    text = str(info.value)
    assert tok not in text
    for segment in tok.split("."):
        if len(segment) >= 16:
            assert segment not in text
    return info.value


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("alg", ["RS256", "EdDSA", "HS256"])
def test_accepts_each_algorithm(auth, keys, alg):
    identity = auth.authenticate(token(keys, alg), now=NOW)
    assert (identity.publisher_id, identity.publisher_team, identity.algorithm) == ("svc-orders", "commerce", alg)
    assert identity.key_id == {"RS256": "rsa-1", "EdDSA": "ed-1", "HS256": "hs-1"}[alg]
    # Only the configured subset is kept: not the e-mail, not the scope.
    assert dict(identity.claims) == {"iss": ISS, "aud": AUD, "sub": "svc-orders", "team": "commerce",
                                     "iat": NOW - 10, "exp": NOW + 300}


def test_committed_fixture_tokens_verify_at_their_fixed_time():
    data = json.loads((FIXTURES / "tokens.json").read_text())
    auth = Authenticator(JwtConfig(jwks_path=FIXTURES / "jwks.json", issuers=data["issuer"],
                                   audience=data["audience"]))
    assert set(auth.keyring.keys) == {"rsa-2025", "ed-2025", "hs-shared"}
    assert set(auth.keyring.skipped) == {"ec-other-service", "rsa-enc", "rsa-512"}
    for entry in data["tokens"]:
        identity = auth.authenticate(entry["token"], now=data["now"])
        assert (identity.publisher_id, identity.publisher_team) == (entry["publisher_id"], entry["publisher_team"])
        assert (identity.key_id, identity.algorithm) == (entry["kid"], entry["alg"])
    # The same tokens an hour and a minute later: expired.
    with pytest.raises(TokenExpiredError):
        auth.authenticate(data["tokens"][0]["token"], now=data["now"] + 3660)


def test_bearer_prefix_and_datetime_now(auth, keys):
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(NOW, UTC)
    assert auth.authenticate("Bearer " + token(keys), now=at).publisher_id == "svc-orders"


def test_several_issuers_and_audiences(jwks_file, keys):
    auth = Authenticator(config(jwks_file, issuers=("https://old-idp", ISS), audience=("other", AUD)))
    assert auth.authenticate(token(keys, aud=["billing", AUD]), now=NOW).publisher_id == "svc-orders"


# --------------------------------------------------------------------------- time claims


def test_expired(auth, keys):
    err = rejects(auth, token(keys, exp=NOW - 100), TokenExpiredError, "expired at")
    assert err.code == "token_expired" and "leeway 30 s" in str(err)


def test_clock_skew_leeway_on_expiry(jwks_file, keys):
    tok = token(keys, exp=NOW - 10)
    assert Authenticator(config(jwks_file, leeway_seconds=30)).authenticate(tok, now=NOW)
    rejects(Authenticator(config(jwks_file, leeway_seconds=0)), tok, TokenExpiredError)
    rejects(Authenticator(config(jwks_file, leeway_seconds=0)), token(keys, exp=NOW), TokenExpiredError)


def test_not_yet_valid(jwks_file, keys):
    auth = Authenticator(config(jwks_file, leeway_seconds=30))
    rejects(auth, token(keys, nbf=NOW + 100), TokenNotYetValidError, "not valid before")
    assert auth.authenticate(token(keys, nbf=NOW + 10), now=NOW)  # within the skew
    rejects(Authenticator(config(jwks_file, leeway_seconds=0)), token(keys, nbf=NOW + 10), TokenNotYetValidError)
    rejects(auth, token(keys, iat=NOW + 600), TokenNotYetValidError, "issued in the future")


def test_time_claims_must_be_numbers(auth, keys):
    rejects(auth, token(keys, exp="tomorrow"), InvalidClaimError, "'exp' must be a NumericDate")
    rejects(auth, token(keys, nbf=True), InvalidClaimError, "'nbf'")


def test_required_claims(jwks_file, keys):
    auth = Authenticator(config(jwks_file, required_claims=("exp", "iat", "jti")))
    rejects(auth, token(keys), MissingClaimError, "'jti'")
    rejects(Authenticator(config(jwks_file)), token(keys, exp=None), MissingClaimError, "'exp'")


# --------------------------------------------------------------------------- issuer / audience


def test_wrong_issuer(auth, keys):
    err = rejects(auth, token(keys, iss="https://evil.example"), WrongIssuerError)
    assert err.code == "wrong_issuer"
    rejects(auth, token(keys, iss=None), MissingClaimError, "'iss'")


def test_wrong_audience(auth, keys):
    rejects(auth, token(keys, aud="billing"), WrongAudienceError)
    rejects(auth, token(keys, aud=["billing", "search"]), WrongAudienceError)
    rejects(auth, token(keys, aud=None), MissingClaimError, "'aud'")


# --------------------------------------------------------------------------- signatures and algorithms


@pytest.mark.parametrize("alg", ["RS256", "EdDSA", "HS256"])
def test_bad_signature(auth, keys, alg):
    tok = token(keys, alg)
    header, _payload, sig = tok.split(".")
    forged_payload = b64url(json.dumps(claims(sub="svc-admin")).encode())
    rejects(auth, f"{header}.{forged_payload}.{sig}", TokenSignatureError, "does not verify")


def test_signed_by_another_key_with_a_known_kid(auth, keys):
    tok = jwt.encode(claims(), keys.rsa_other, algorithm="RS256", headers={"kid": "rsa-1"})
    rejects(auth, tok, TokenSignatureError)


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_is_never_accepted(auth, alg):
    rejects(auth, handmade({"alg": alg, "kid": "hs-1", "typ": "JWT"}, claims()), TokenAlgorithmError, "alg 'none'")


def test_alg_confusion_rsa_public_key_as_hmac_secret(auth, keys):
    """The classic attack: sign HS256 with the (public) RSA key and name the RSA kid."""
    pem = keys.rsa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    jwk_text = json.dumps(keys.jwks()["keys"][0]).encode()
    for secret in (pem, jwk_text):
        tok = handmade({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"}, claims(sub="svc-admin"),
                       lambda si, s=secret: hmac.new(s, si, hashlib.sha256).digest())
        rejects(auth, tok, TokenAlgorithmError, "algorithm confusion refused")
    # and the other way round: an RS256 header naming the HMAC key
    rejects(auth, jwt.encode(claims(), keys.rsa, algorithm="RS256", headers={"kid": "hs-1"}),
            TokenAlgorithmError, "algorithm confusion refused")


def test_algorithms_outside_the_config(jwks_file, keys):
    only_rs = Authenticator(config(jwks_file, algorithms=("RS256",)))
    rejects(only_rs, token(keys, "HS256"), TokenAlgorithmError, "not accepted")
    rejects(only_rs, jwt.encode(claims(), keys.rsa, algorithm="RS512", headers={"kid": "rsa-1"}),
            TokenAlgorithmError, "'RS512' is not accepted")


def test_unknown_and_missing_kid(auth, keys):
    rejects(auth, token(keys, kid="rsa-9"), UnknownTokenKeyError, "'rsa-9' is not in the JWKS")
    rejects(auth, jwt.encode(claims(), keys.rsa, algorithm="RS256"), UnknownTokenKeyError, "no kid")


def test_kid_of_a_skipped_key_says_why():
    data = json.loads((FIXTURES / "tokens.json").read_text())
    auth = Authenticator(JwtConfig(jwks_path=FIXTURES / "jwks.json", issuers=data["issuer"],
                                   audience=data["audience"]))
    tok = handmade({"alg": "RS256", "kid": "rsa-enc"}, claims(), lambda si: b"x" * 256)
    rejects(auth, tok, UnknownTokenKeyError, "its use is 'enc'", now=data["now"])


@pytest.mark.parametrize("tok", [
    "abc", "a.b", "a.b.c.d.e", "!!!.???.###", "eyJhbGciOiJIUzI1NiJ9",
    f"{b64url(b'not json')}.{b64url(b'{}')}.{b64url(b'sig')}",
    f"{b64url(b'[1,2]')}.{b64url(b'{}')}.{b64url(b'sig')}",
    # issue 28: a header nested past the decoder's depth limit (bounded JSON, app.untrusted_json)
    b64url(b'{"a":' * 2000 + b"1" + b"}" * 2000) + f".{b64url(b'{}')}.{b64url(b'sig')}",
    f"{b64url(b'[' * 65 + b']' * 65)}.{b64url(b'{}')}.{b64url(b'sig')}",
])
def test_malformed_tokens(auth, tok):
    rejects(auth, tok, MalformedTokenError)


def test_payload_that_is_not_a_claims_object(auth, keys):
    signing_input = f"{b64url(json.dumps({'alg': 'HS256', 'kid': 'hs-1'}).encode())}.{b64url(b'[1, 2, 3]')}"
    sig = hmac.new(keys.hs, signing_input.encode(), hashlib.sha256).digest()
    rejects(auth, f"{signing_input}.{b64url(sig)}", MalformedTokenError, "not a JSON object of claims")


def test_critical_header_extensions_are_refused(auth, keys):
    tok = jwt.encode(claims(), keys.rsa, algorithm="RS256", headers={"kid": "rsa-1", "crit": ["exp"]})
    rejects(auth, tok, MalformedTokenError, "critical")


def test_oversized_and_missing_tokens(auth, keys):
    rejects(auth, token(keys, blob="x" * 9000), MalformedTokenError, "over the 8192-byte limit")
    for empty in ("", "   "):
        with pytest.raises(MissingTokenError):
            auth.authenticate(empty, now=NOW)


# --------------------------------------------------------------------------- claim mapping


def test_claim_mapping(jwks_file, keys):
    auth = Authenticator(config(jwks_file, publisher_id_claim="client_id",
                                publisher_team_claim="https://prism.example/team"))
    tok = token(keys, client_id="svc-9", **{"https://prism.example/team": "search"})
    identity = auth.authenticate(tok, now=NOW)
    assert (identity.publisher_id, identity.publisher_team) == ("svc-9", "search")
    assert identity.claims["https://prism.example/team"] == "search"
    rejects(auth, token(keys), MissingClaimError, "'client_id' claim for the publisher id")


def test_team_claim_rules(jwks_file, keys):
    assert Authenticator(config(jwks_file)).authenticate(token(keys, team=None), now=NOW).publisher_team is None
    strict = Authenticator(config(jwks_file, require_team=True))
    rejects(strict, token(keys, team=None), MissingClaimError, "publisher team")
    rejects(strict, token(keys, team=["a", "b"]), InvalidClaimError, "'team' must be a non-empty string")


def test_subject_must_be_a_string(auth, keys):
    rejects(auth, token(keys, sub=42), InvalidClaimError)
    rejects(auth, token(keys, sub=None), MissingClaimError, "'sub'")


# --------------------------------------------------------------------------- envelope helpers


def test_authenticate_envelope_applies_identity_and_strips_the_token(auth, keys):
    tok = token(keys, "EdDSA")
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    sec = env.ensure_security()
    sec.auth_token, sec.publisher_id, sec.publisher_team = tok, "claimed-by-producer", "claimed-team"
    identity = auth.authenticate_envelope(env, now=NOW)
    assert identity.publisher_id == "svc-orders"
    assert (env.security.publisher_id, env.security.publisher_team) == ("svc-orders", "commerce")
    assert not env.security.HasField("auth_token")
    for layout in Layout:
        assert tok.encode() not in encode(env, layout)


def test_token_is_stripped_even_when_authentication_fails(auth, keys):
    tok = token(keys, exp=NOW - 3600)
    env = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    env.ensure_security().auth_token = tok
    with pytest.raises(TokenExpiredError):
        auth.authenticate_envelope(env, now=NOW)
    assert not env.security.HasField("auth_token")
    assert tok.encode() not in encode(env) and tok not in repr(env)
    bare = new_envelope("orders.created", {"a": 1}, namespace="order-events")
    with pytest.raises(MissingTokenError):
        auth.authenticate_envelope(bare, now=NOW)


def test_strip_token_and_apply_identity(auth, keys):
    env = new_envelope("t", b"", namespace="n")
    assert strip_token(env) is False
    env.ensure_security().auth_token = "x"
    assert strip_token(env) is True and strip_token(env) is False
    env.security.publisher_team = "self-declared"
    apply_identity(env, auth.authenticate(token(keys, team=None), now=NOW))
    assert env.security.publisher_id == "svc-orders" and not env.security.HasField("publisher_team")


# --------------------------------------------------------------------------- configuration and JWKS


@pytest.mark.parametrize(("kw", "match"), [
    ({"algorithms": ("none",)}, "'none'"),
    ({"algorithms": ("RS256", "ES256")}, "subset of"),
    ({"algorithms": ()}, "subset of"),
    ({"issuers": ()}, "issuer"),
    ({"audience": ("",)}, "audience"),
    ({"leeway_seconds": -1}, "leeway_seconds"),
    ({"require_team": True, "publisher_team_claim": None}, "require_team"),
])
def test_config_errors(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path / "jwks.json", **kw)


def test_config_from_mapping(tmp_path, jwks_file, keys):
    cfg = JwtConfig.from_mapping({"jwks_file": jwks_file.name, "issuer": ISS, "audience": AUD,
                                  "algorithms": ["EdDSA"], "leeway_seconds": 5,
                                  "claims": {"publisher_id": "sub", "publisher_team": "team"}},
                                 base_dir=jwks_file.parent)
    assert cfg.issuers == (ISS,) and cfg.algorithms == ("EdDSA",) and cfg.jwks_path == jwks_file
    assert Authenticator(cfg).authenticate(token(keys, "EdDSA"), now=NOW).publisher_id == "svc-orders"
    with pytest.raises(ConfigError, match="unknown key"):
        JwtConfig.from_mapping({"jwks_file": "x", "issuer": ISS, "audience": AUD, "algoritms": ["RS256"]},
                               where="topology.yaml:auth")
    with pytest.raises(ConfigError, match=r"topology\.yaml:auth\.algorithms"):
        JwtConfig.from_mapping({"jwks_file": "x", "issuer": ISS, "audience": AUD, "algorithms": ["none"]},
                               where="topology.yaml:auth")
    with pytest.raises(ConfigError, match="does not exist"):
        Authenticator(config(tmp_path / "missing.json"))


def test_jwks_errors(keys):
    good = keys.jwks()["keys"]
    short = {"kty": "oct", "kid": "short", "k": b64url(b"k" * 16)}
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    private = json.loads(RSAAlgorithm.to_jwk(keys.rsa))  # includes d, p, q, ...
    cases = [
        ({"nokeys": []}, "not a JWK Set"),
        ({"keys": [{"kty": "oct", "k": b64url(keys.hs)}]}, "no kid"),
        ({"keys": [good[0], {**good[1], "kid": "rsa-1"}]}, "duplicate kid"),
        ({"keys": [short]}, "16 bytes; at least 32"),
        ({"keys": [{**json.loads(RSAAlgorithm.to_jwk(weak.public_key())), "kid": "weak"}]}, "1024 bits"),
        ({"keys": [{**private, "kid": "leak"}]}, "private key material"),
        ({"keys": [{"kty": "RSA", "kid": "broken", "n": "AQAB"}]}, "malformed"),
    ]
    for doc, match in cases:
        with pytest.raises(ConfigError, match=match):
            parse_jwks(doc)


def test_jwks_reload_on_change(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    auth = Authenticator(config(path, reload_interval_seconds=3600))
    rotated_in = jwt.encode(claims(), keys.rsa_other, algorithm="RS256", headers={"kid": "rsa-2"})
    rejects(auth, rotated_in, UnknownTokenKeyError)
    path.write_text(json.dumps(keys.jwks(with_other=True)))
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-timestamp filesystems
    # Unknown kid -> immediate re-check of the file, despite the hour-long interval.
    assert auth.authenticate(rotated_in, now=NOW).key_id == "rsa-2"
    # A broken rewrite keeps the previous keys.
    path.write_text("{ half-written")
    os.utime(path, ns=(2, 2))
    assert auth.keyring.refresh(force=True) is False
    assert "not valid JSON" in auth.keyring.last_reload_error
    assert auth.authenticate(rotated_in, now=NOW).key_id == "rsa-2"


def test_in_memory_keyring(keys):
    ring = JwksKeyring.from_document(keys.jwks())
    auth = Authenticator(config(Path("unused")), keyring=ring)
    assert auth.authenticate(token(keys, "HS256"), now=NOW).algorithm == "HS256"


def test_the_jwks_file_is_read_bounded_and_strict(tmp_path: Path, keys) -> None:
    """`jwks: /dev/zero` in a topology was read whole (`read_bytes`) until the kernel killed the
    worker, and `json.loads` took a key given twice (`"keys"` twice: the last list won, silently).
    The file now goes through the one bounded reader and JSON decoder of configuration files."""
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(5 * 1024 * 1024)  # sparse: 5 MiB of NULs, over the 4 MiB limit
    with pytest.raises(ConfigError, match="JWKS file is over 4 MiB") as exc:
        JwksKeyring(big)
    assert exc.value.hint  # every error says how to fix it
    doc = json.dumps(keys.jwks())
    twice = tmp_path / "twice.json"
    twice.write_text('{"keys": [], ' + doc[1:])
    with pytest.raises(ConfigError, match=r"duplicate key 'keys'"):
        JwksKeyring(twice)
    a_dir = tmp_path / "d"
    a_dir.mkdir()
    with pytest.raises(ConfigError, match="cannot read JWKS file") as exc:
        JwksKeyring(a_dir)
    assert "authenticate.jwks" in (exc.value.hint or "")
