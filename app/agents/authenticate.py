"""authenticate: verify the producer's JWT, take its identity from the claims, strip the token.

Tokens are stripped whatever the policy (even `off`): memo-031 Recommendation 5 says a
token never reaches backend storage. Verified tokens are cached by their SHA-256 until
`min(exp, now + 60 s)`: producers reuse one token for thousands of messages, and an RS256
or EdDSA verification costs tens of microseconds. A JWKS reload clears the cache. The token
used last is also kept with its entry, so the next message with the same token - the usual
case - is matched by a string comparison (~20 ns) instead of its SHA-256 and the lookup (~0.4 µs).

With a `producers:` section in the topology, this is also where the principal is bound: the
verified publisher id (or "anonymous" when no token was verified) must be declared for the
namespace the envelope claims on the source topic it was read from (app/security/producers.py).

A record replayed from the DLQ (`prism dlq replay`) has its token masked; it carries instead
the worker-signed attestation of the identity verified before it failed
(`app.security.attestation`). A record with an attestation header is authenticated by that
attestation alone - it must verify, or the record goes back to the DLQ with an
`attestation_*` reason; its (masked) token is never tried.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict

from app.agents.base import Message, Stage
from app.agents.identity import Method
from app.errors import AttestationMismatchError, AuthError
from app.security.attestation import AttestationVerifier, header_value
from app.security.jwt_auth import Authenticator, Identity, JwtConfig, apply_identity, strip_token
from app.security.producers import ProducerBindings
from app.topology import AuthenticateStage

CACHE_SECONDS = 60.0
CACHE_SIZE = 10_000
#: once per message: a module name, not an EnumType attribute lookup (~60 ns on Python 3.11)
_TOKEN = Method.TOKEN


class Authenticate(Stage):
    name = "authenticate"

    def __init__(self, settings: AuthenticateStage, *, jwks_path: str, producers: ProducerBindings | None = None,
                 attestations: AttestationVerifier | None = None) -> None:
        self.policy = settings.policy
        #: the topology's `producers:` rules; None: a verified principal may claim any namespace
        self.producers = producers
        self.attestations = attestations
        issuers = settings.issuer if isinstance(settings.issuer, list) else ([settings.issuer] if settings.issuer else [])
        self.config = JwtConfig(
            jwks_path=jwks_path, issuers=tuple(issuers),
            audience=(settings.audience,) if settings.audience else (),
            algorithms=tuple(settings.algorithms), leeway_seconds=float(settings.leeway_s),
            publisher_id_claim=settings.publisher_id_claim, publisher_team_claim=settings.publisher_team_claim,
        )
        self.authenticator = Authenticator(self.config)
        self._cache: OrderedDict[bytes, tuple[Identity, float]] = OrderedDict()
        self._keyring_version = -1
        #: the token used last, its identity and until when it holds: `_cache`'s newest used
        #: entry, kept under the token itself so that a repeat needs no digest (module docs).
        #: It holds one token at a time, as the message being processed does, and only while
        #: its entry is valid.
        self._last: tuple[str, Identity, float] | None = None

    def _identity(self, token: str) -> Identity:
        now = time.time()
        # A cache hit never reaches the keyring, so give it its (interval-limited, stat-only)
        # chance to notice a changed JWKS file here: a key removed from the file must stop
        # verifying cached tokens too, not only new ones.
        keyring = self.authenticator.keyring
        keyring.refresh()
        if keyring.version != self._keyring_version:
            self._cache.clear()
            self._last = None
            self._keyring_version = keyring.version
        last = self._last
        if last is not None:
            if last[0] == token and last[2] > now:
                return last[1]  # what the lookup below would return: this entry is in `_cache`
            self._last = None  # another token, or expired: the token is not kept any longer
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            self._last = (token, hit[0], hit[1])
            return hit[0]
        identity = self.authenticator.authenticate(token, now=now)
        exp = identity.claims.get("exp")
        until = min(float(exp), now + CACHE_SECONDS) if isinstance(exp, int | float) else now + CACHE_SECONDS
        self._cache[digest] = (identity, until)
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        self._last = (token, identity, until)
        return identity

    def process(self, msg: Message) -> None:
        principal = self._authenticate(msg)
        if self.producers is not None:
            self.producers.check_principal(principal, msg.env.header.metadata.namespace, msg.topic)

    def _authenticate(self, msg: Message) -> str | None:
        """Verify the token if any, apply its identity, strip it. Returns the verified principal;
        a bare `return` (no token, or policy off) is None: the message is anonymous."""
        env = msg.env
        header = env.header  # Envelope.security, inlined (a property and a HasField per call)
        token = header.security.auth_token if header.HasField("security") else ""
        try:
            if self.policy == "off":
                return
            attested = header_value(msg.headers) if msg.headers else None
            if attested is not None:
                self._attested(msg, attested)
                # the attested identity is the principal: producers: rules apply to it as to a token's
                return msg.identity.publisher_id if msg.identity is not None else None
            if not token:
                if self.policy == "required":
                    raise AuthError("message carries no auth token", path="security.auth_token",
                                    hint="producers must send a JWT (Authorization: Bearer header or "
                                         "security.auth_token), or set authenticate.policy to optional")
                return
            msg.identity = self._identity(token)
            msg.identity_method = _TOKEN
            apply_identity(env, msg.identity)
            return msg.identity.publisher_id
        finally:
            if token:  # read from this very context above, so present: what strip_token clears,
                header.security.ClearField("auth_token")  # without its three reads (~0.25 µs)
            else:
                strip_token(env)

    def _attested(self, msg: Message, raw: bytes) -> None:
        """Take the identity from a replayed DLQ record's attestation (module docs)."""
        if self.attestations is None:
            raise AttestationMismatchError("record carries a DLQ attestation but this worker trusts no attestation "
                                           "key", path="header prism-dlq-attestation",
                                           hint="give the worker an Ed25519 worker key (outputs / keyring)")
        env = msg.env
        att = self.attestations.verify(raw, message_id="" if msg.generated_id else env.message_id, topic=msg.topic,
                                       key=msg.key, value=msg.value, headers=msg.headers)
        if msg.generated_id:
            # The input carries no id; normalize derived one from this record's offset. The
            # attested one was derived the same way from the original record's offset: keep it,
            # so the message keeps its id (and dedup recognises a second replay).
            env.metadata.message_id = att.message_id
        msg.identity = att.identity
        msg.identity_method = Method.ATTESTATION
        apply_identity(env, att.identity)
