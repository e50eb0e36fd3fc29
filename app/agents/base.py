"""What flows between stages, and the contract every stage follows."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

from app.envelope import Envelope
from app.envelope.codec import Layout
from app.security.jwt_auth import Identity
from app.security.signing import SignatureInfo


@dataclass(slots=True)
class Message:
    """One input record on its way through the chain.

    `value`/`headers`/`key`/`timestamp_ms` are the record as received: they are what the
    DLQ re-publishes (minus secrets) so nothing about the original is lost.
    """

    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None
    # filled in by stages
    envelope: Envelope | None = None
    shape: str = ""
    original_is_envelope: bool = False
    #: secrets seen in the input (auth tokens); used only to scrub DLQ copies and logs
    secrets: list[bytes] = field(default_factory=list)
    signature: SignatureInfo | None = None
    attempts: int = 1
    #: the identity the authenticate stage verified (from the token, or from a replayed DLQ
    #: record's attestation); what a DLQ copy attests so a replay keeps it
    identity: Identity | None = None
    #: how `identity` was verified: "token" or "attestation" (app/agents/identity.py Method)
    identity_method: str = ""
    #: the publisher id and team the input *stated* (normalize's reading, before any verifier
    #: overwrote them): a claim, kept visible on outputs only as `prism.claimed.*`
    claimed: tuple[str, str] | None = None
    #: the identity rule (app/agents/identity.py) has run: publisher fields state only a verified
    #: identity, the method is recorded, the classification floor applied
    settled: bool = False
    #: normalize generated the message id (the input carried none): derived from this record's
    #: topic/partition/offset, so a replay takes the attested original id instead
    generated_id: bool = False
    #: normalize's walk of `value` when it decoded as an envelope with no required-field
    #: problem and `value` is immutable `bytes`: (that very object, its top-level records,
    #: their layout).
    #: verify_signature runs its checks on these records instead of walking the bytes again;
    #: keeping `value` lets it make sure they describe the bytes it verifies. It also tells
    #: validate that `required_problems` already found nothing (nothing between normalize
    #: and validate - the topology fixes the order - touches a required field).
    scanned: tuple[bytes, list[tuple[int, int, int, int, int]], Layout] | None = None
    #: headers a stage adds to this message's outputs (not to its DLQ copy, which keeps the
    #: record as received): `prism-schema-validation` from enrich under `validation: warn`
    out_headers: list[tuple[str, bytes]] | None = None

    @property
    def env(self) -> Envelope:
        assert self.envelope is not None, "stage ran before normalize"
        return self.envelope


class Stage(abc.ABC):
    """A pipeline stage. `process` mutates `msg` or raises a `PrismError` to reject it.

    `ExpiredError`/`DuplicateError` mean "account for it and stop" rather than failure.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def process(self, msg: Message) -> None: ...
