"""policy: TTL expiry, default priority, encryption for classified data, algorithm allowlist.

With the topology's `encryption:` block (app/security/worker_encryption.py), a classified
payload that arrives in plaintext is encrypted here for its consumers instead of being
refused: the classifications it lists are encrypted, the others that
`require_encryption_for` names still go to the DLQ as `policy_violation`. Payloads that
arrive encrypted are never touched: the worker only checks their algorithm.
"""

from __future__ import annotations

import time

from app.agents.base import Message, Stage
from app.errors import ExpiredError, PolicyError
from app.security.algorithms import AlgorithmPolicy
from app.security.worker_encryption import WorkerEncryption
from app.topology import PolicyStage


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
        encrypted = sec is not None and sec.HasField("encryption")
        if not encrypted and self.encryption is not None and self.encryption.applies_to(classification):
            self.encryption.encrypt(env, classification)
            return  # encrypted with an algorithm the topology checked against this policy at load
        if classification in self.needs_encryption and not encrypted:
            raise PolicyError(f"{classification} data must be encrypted end to end",
                              path="security.data_classification",
                              hint="encrypt the payload in the producer (Prism SDK `encryption=`), "
                                   "or correct the classification")
        if encrypted:
            self.algorithms.check(sec.encryption.algorithm, decrypt=True)  # type: ignore[union-attr]
