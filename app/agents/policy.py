"""policy: TTL expiry, default priority, encryption for classified data, algorithm allowlist.

With the topology's `encryption:` block (app/security/worker_encryption.py), a classified
payload that arrives in plaintext is encrypted here for its consumers instead of being
refused: the classifications it lists are encrypted, the others that
`require_encryption_for` names still go to the DLQ as `policy_violation`.

A payload that *claims* to be encrypted (`security.encryption` present) is checked by
`check_encryption_claim`: its algorithm against the policy, and its metadata and payload
against the shape that algorithm produces (IV, encapsulated key, tag, sizes). A claim that
passes is never touched: the worker holds no key that opens it. A claim that fails is not
ciphertext any consumer could open - it may be plaintext under an encryption label - so it is
treated as the plaintext it may be: encrypted by the worker where the `encryption:` block lists
the message's classification (the rejected claim's algorithm kept visible in the extension
`prism.claimed.encryption_algorithm`), and otherwise sent to the DLQ as
`encryption_claim_invalid`, whatever its classification (a consumer could not read it either).

The identity stage runs before this one, so the classification seen here is the one a source's
`classification_floor` already raised: a floor-raised message is encrypted or refused like any
other classified plaintext.
"""

from __future__ import annotations

import time

from app.agents.base import Message, Stage
from app.agents.identity import CLAIMED_PREFIX
from app.envelope.model import Envelope
from app.errors import EncryptionClaimError, ExpiredError, PolicyError
from app.security.algorithms import AlgorithmPolicy
from app.security.encryption import check_encryption_claim
from app.security.worker_encryption import WorkerEncryption
from app.topology import PolicyStage

#: The algorithm a rejected claim of encryption named, on a payload the worker then encrypted.
CLAIMED_ENCRYPTION = CLAIMED_PREFIX + "encryption_algorithm"


class Policy(Stage):
    name = "policy"

    def __init__(self, settings: PolicyStage, encryption: WorkerEncryption | None = None) -> None:
        self.settings = settings
        self.encryption = encryption
        self.algorithms = AlgorithmPolicy(
            fips_mode=settings.fips_mode,
            allowlist=set(settings.allowed_algorithms) if settings.allowed_algorithms else None,
        )
        self.needs_encryption = frozenset(settings.require_encryption_for)

    def process(self, msg: Message) -> None:
        env = msg.env
        header = env.header  # read directly: Envelope.is_expired / .security / .is_encrypted, inlined
        md = header.metadata
        ttl = md.ttl_seconds
        if ttl > 0 and int(time.time() * 1000) >= md.published_at_ms + ttl * 1000:
            raise ExpiredError(f"TTL of {md.ttl_seconds}s passed before processing", path="metadata.ttl_seconds")
        if not md.HasField("priority"):
            md.priority = self.settings.default_priority
        sec = header.security if header.HasField("security") else None
        classification = sec.data_classification if sec is not None else ""
        enc = self.encryption
        worker_encrypts = enc is not None and enc.applies_to(classification)
        if sec is not None and sec.HasField("encryption"):
            try:
                check_encryption_claim(env, self.algorithms)  # AlgorithmError: refused, as any disallowed algorithm
                return  # ciphertext the worker cannot open: passed through untouched
            except EncryptionClaimError:
                if not worker_encrypts:
                    raise
            _drop_claim(env)
        if enc is not None and worker_encrypts:
            enc.encrypt(env, classification)
            return  # encrypted with an algorithm the topology checked against this policy at load
        if classification in self.needs_encryption:
            raise PolicyError(f"{classification} data must be encrypted end to end",
                              path="security.data_classification",
                              hint="encrypt the payload in the producer (Prism SDK `encryption=`), "
                                   "or correct the classification")


def _drop_claim(env: Envelope) -> None:
    """Remove a claim of encryption that failed its check, so the worker encrypts the payload as
    the plaintext it may be; the claimed algorithm stays visible to consumers as an extension."""
    sec = env.header.security
    env.extensions[CLAIMED_ENCRYPTION] = sec.encryption.algorithm.encode()
    sec.ClearField("encryption")
