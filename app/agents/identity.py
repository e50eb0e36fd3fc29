"""identity: the one place where a message's publisher identity is settled.

Every input shape can *state* a publisher: the envelope's `security.publisher_id` /
`publisher_team`, the Kafka headers `publisher-id` / `publisher-team`, the NATS header
`X-Publisher-Id`, Redis `meta.publisher`, CloudEvents `source`, LNMP `source`. The formats
read those into the envelope's publisher fields, as a claim. Nothing proves a claim but a
verifier, and the worker signs whatever leaves it - so without this rule an anonymous
producer writing `publisher_id=svc-orders` came out with svc-orders' identity under the
worker's signature, indistinguishable from a message svc-orders authenticated.

The rule (applied once per message, after authenticate and verify_signature, before policy;
`insert_identity_stage` puts this stage there in every chain the worker builds):

* `security.publisher_id` / `publisher_team` on an output state only a **verified** identity,
  taken from the verifier, never from the input:

  - `token`: a JWT the authenticate stage verified (`Message.identity`);
  - `attestation`: a worker-signed DLQ attestation of such an identity (`prism dlq replay`);
  - `key`: a producer signature that verify_signature verified with a key the signing keyring
    binds to a publisher (`publisher_id:` on the key, docs/signing.md "Keyring files");
  - `none`: nothing verified who sent it. The publisher fields are then empty.

* The method is stated on every output, in the extension `prism.identity.method` (and, for
  `key`, the verifying key's id in `prism.identity.key_id`: the worker's re-signature replaces
  `signature_key_id`).
* A claim that differs from the verified identity (or any claim, when there is none) is kept,
  visibly, under `prism.claimed.publisher_id` / `prism.claimed.publisher_team`: a consumer can
  see what the producer said, but never mistake it for what was verified.
* A producer that is not authenticated (method `none`) cannot lower the classification below
  its source's `classification_floor` (docs/topologies.md): a lower or absent classification is
  **raised** to the floor (the lower claim kept in `prism.claimed.data_classification`). Raising
  rather than rejecting keeps legacy producers flowing; it runs before the policy stage, so a
  floor that requires encryption is enforced on the raised value like on any other.
* The worker owns the `prism.identity.` and `prism.claimed.` extension prefixes: whatever an
  input carried under them is removed first, so a producer cannot pre-state a method or a claim.

Extensions ride in both layouts and are covered by the worker's signature, like the publisher
fields. Rejecting unverified claims instead would have dropped every legacy producer whose
shape carries a publisher name (CloudEvents always does: `source` is required).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from app.agents.base import Message, Stage
from app.envelope.model import Envelope
from app.security.signing import KeyPublisher, SigningKeyring
from app.topology import Topology

#: The extension prefixes only the worker writes (any input value under them is removed).
IDENTITY_PREFIX = "prism.identity."
CLAIMED_PREFIX = "prism.claimed."
#: How the output's publisher identity was established: a `Method` value.
METHOD_EXTENSION = IDENTITY_PREFIX + "method"
#: With method `key`: the producer key that verified (the output's `signature_key_id` is the worker's).
KEY_ID_EXTENSION = IDENTITY_PREFIX + "key_id"
CLAIMED_PUBLISHER_ID = CLAIMED_PREFIX + "publisher_id"
CLAIMED_PUBLISHER_TEAM = CLAIMED_PREFIX + "publisher_team"
CLAIMED_CLASSIFICATION = CLAIMED_PREFIX + "data_classification"

#: Lowest first: a floor admits its own level and every level after it.
CLASSIFICATION_ORDER: tuple[str, ...] = ("public", "internal", "confidential", "restricted")
_RANK = {name: i for i, name in enumerate(CLASSIFICATION_ORDER)}


class Method(enum.StrEnum):
    """How a publisher identity was established (the value of `prism.identity.method`)."""

    TOKEN = "token"
    KEY = "key"
    ATTESTATION = "attestation"
    NONE = "none"


#: `settle` runs on every message: the methods as module names, not EnumType attribute lookups
#: (~60 ns each on Python 3.11), and each method's extension value encoded once, not read
#: through `.value` (a property) and encoded per message
_TOKEN, _KEY, _ATTESTATION, _NONE = Method.TOKEN, Method.KEY, Method.ATTESTATION, Method.NONE
_METHOD_BYTES = {m: m.value.encode() for m in Method}


@dataclass(frozen=True, slots=True)
class IdentityRule:
    """What the rule needs besides the message: which keys are bound to which publisher, and
    each source topic's classification floor."""

    #: signing key id -> the publisher it is bound to (keys without a binding are absent)
    key_publishers: Mapping[str, KeyPublisher] = field(default_factory=dict)
    #: source topic -> the lowest classification an unauthenticated producer's message may carry
    floors: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, topology: Topology, keyring: SigningKeyring | None) -> IdentityRule:
        """The rule of one topology: its sources' floors, the keyring's key bindings."""
        return cls(key_publishers=dict(keyring.publishers) if keyring is not None else {},
                   floors={s.topic: s.classification_floor for s in topology.sources
                           if s.classification_floor is not None})


def _drop_owned(ext: MutableMapping[str, bytes]) -> None:
    """Remove every input extension under the worker-owned prefixes."""
    for k in [k for k in ext if k.startswith((IDENTITY_PREFIX, CLAIMED_PREFIX))]:
        del ext[k]


def settle(msg: Message, rule: IdentityRule) -> None:
    """Apply the rule (module docs) to `msg`'s envelope, once; a second call is a no-op."""
    if msg.settled:
        return
    env = msg.env
    header = env.header
    sec = header.security if header.HasField("security") else None
    ext = header.extensions
    if ext:
        _drop_owned(ext)
    # What the input claimed: normalize's reading, taken before any verifier overwrote it.
    if msg.claimed is not None:
        claimed_id, claimed_team = msg.claimed
    elif sec is not None:
        claimed_id, claimed_team = sec.publisher_id, sec.publisher_team
    else:
        claimed_id = claimed_team = ""

    verified_id: str = ""
    verified_team: str = ""
    identity = msg.identity
    if identity is not None:
        method = _ATTESTATION if msg.identity_method == _ATTESTATION else _TOKEN
        verified_id, verified_team = identity.publisher_id, identity.publisher_team or ""
    else:
        key_id = msg.signature.key_id if msg.signature is not None else ""
        bound = rule.key_publishers.get(key_id) if key_id else None
        if bound is not None:
            method = _KEY
            verified_id, verified_team = bound.publisher_id, bound.publisher_team or ""
            ext[KEY_ID_EXTENSION] = key_id.encode()
        else:
            method = _NONE

    if verified_id:
        sec = env.ensure_security()
        sec.publisher_id = verified_id
        if verified_team:
            sec.publisher_team = verified_team
        else:
            sec.ClearField("publisher_team")
    elif sec is not None:
        sec.ClearField("publisher_id")
        sec.ClearField("publisher_team")
    if claimed_id and claimed_id != verified_id:
        ext[CLAIMED_PUBLISHER_ID] = claimed_id.encode()
    if claimed_team and claimed_team != verified_team:
        ext[CLAIMED_PUBLISHER_TEAM] = claimed_team.encode()
    ext[METHOD_EXTENSION] = _METHOD_BYTES[method]

    if method is _NONE:
        floor = rule.floors.get(msg.topic)
        if floor is not None:
            _raise_to_floor(env, floor)
    msg.settled = True


def _raise_to_floor(env: Envelope, floor: str) -> None:
    """An unauthenticated producer's classification, raised to `floor` when lower or absent."""
    sec = env.ensure_security()
    current = sec.data_classification if sec.HasField("data_classification") else ""
    if _RANK.get(current, -1) >= _RANK[floor]:
        return
    if current:
        env.extensions[CLAIMED_CLASSIFICATION] = current.encode()
    sec.data_classification = floor


def stated_publisher(env: Envelope) -> str:
    """Who the message says it is from - the verified publisher, else the claimed one, else
    "". For bookkeeping that groups messages by sender (LNMP sequence tracking), never for
    trust: a claim is not an identity."""
    sec = env.security
    if sec is not None and sec.publisher_id:
        return sec.publisher_id
    raw = env.extensions.get(CLAIMED_PUBLISHER_ID)
    return raw.decode("utf-8", "replace") if raw else ""


class SettleIdentity(Stage):
    """The rule as a stage of the chain (module docs). Not a topology stage: the worker always
    runs it (`insert_identity_stage`), so no topology can leave it out."""

    name = "identity"

    def __init__(self, rule: IdentityRule) -> None:
        self.rule = rule

    def process(self, msg: Message) -> None:
        settle(msg, self.rule)


#: The stages that establish an identity; the rule runs after the last of them present.
_VERIFIERS = frozenset({"normalize", "validate", "authenticate", "verify_signature"})


def insert_identity_stage(stages: Sequence[Stage], rule: IdentityRule) -> list[Stage]:
    """`stages` with `SettleIdentity` right after the verifying stages (before policy, dedup and
    enrich): the policy stage must see a classification the floor already raised."""
    out = list(stages)
    at = 0
    for i, stage in enumerate(out):
        if stage.name in _VERIFIERS:
            at = i + 1
    out.insert(at, SettleIdentity(rule))
    return out


__all__ = ["CLAIMED_CLASSIFICATION", "CLAIMED_PREFIX", "CLAIMED_PUBLISHER_ID", "CLAIMED_PUBLISHER_TEAM",
           "CLASSIFICATION_ORDER", "IDENTITY_PREFIX", "KEY_ID_EXTENSION", "METHOD_EXTENSION", "IdentityRule",
           "KeyPublisher", "Method", "SettleIdentity", "insert_identity_stage", "settle", "stated_publisher"]
