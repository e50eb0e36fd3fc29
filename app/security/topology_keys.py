"""The keys a topology names, loaded the one way the worker and the CLI both use.

Why a module of its own: the worker (app/worker/pipeline.py) needs the keyring and the DLQ
attestation verifier when it starts, and `prism dlq list|show` need the same verifier to say
whether a DLQ record's attested identity is genuine. Building it twice would let the two
disagree about which keys are trusted; importing the worker's module from the CLI would load
Faust for a listing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from app.security.attestation import AttestationVerifier, Attester, trusted_keys
from app.security.signing import ED25519, SigningKey, SigningKeyring, load_signing_keyring

if TYPE_CHECKING:
    from app.topology import Topology

log = logging.getLogger("prism.worker")


def keyring_for(topology: Topology) -> SigningKeyring | None:
    """The signing keyring the topology names (`outputs.keyring`, else `verify_signature.keyring`)."""
    path = topology.outputs.keyring
    vs = topology.stage("verify_signature")
    if path is None and vs is not None:
        path = vs.keyring
    return load_signing_keyring(topology.resolve(path)) if path else None


def attestation_setup(topology: Topology, keyring: SigningKeyring | None, worker_key: SigningKey | None,
                      ) -> tuple[Attester | None, AttestationVerifier | None]:
    """The DLQ attester (the worker's Ed25519 key) and the verifier of replayed attestations.
    Both None when attestations are off or the worker has no Ed25519 key: then a replayed
    authenticated record fails authentication, as it would without this feature."""
    cfg = topology.dlq.attestation
    if not cfg.enabled or topology.stage("authenticate") is None or keyring is None:
        return None, None
    key = worker_key or keyring.worker_key()
    attester = Attester(key) if key is not None and key.algorithm == ED25519 else None
    if attester is None and not cfg.trusted_keys:
        log.warning("DLQ attestations are off: the worker has no Ed25519 worker key, so authenticated messages "
                    "that reach the DLQ cannot be replayed with their identity (set worker_key in the keyring)")
        return None, None
    keys = trusted_keys(keyring, cfg.trusted_keys, default=attester.key.key_id if attester else None)
    return attester, AttestationVerifier(keys, max_age_s=cfg.max_age_s)


def attestation_reader(topology: Topology) -> AttestationVerifier | None:
    """The verifier the worker would check this topology's DLQ attestations with, from public
    keys only (an operator's machine need not hold the worker's private key); None when the
    topology has attestations off, no keyring, or no Ed25519 worker key among its keys.
    Raises the keyring's `PrismError` when a named key file cannot be read."""
    cfg = topology.dlq.attestation
    keyring = keyring_for(topology)
    if not cfg.enabled or keyring is None:
        return None
    default = topology.outputs.signing_key_id or keyring.worker_key_id
    known = keyring.verify_all.keys
    if default is not None and (default not in known or known[default].algorithm != ED25519):
        default = None
    if default is None and not cfg.trusted_keys:
        return None
    return AttestationVerifier(trusted_keys(keyring, cfg.trusted_keys, default=default), max_age_s=cfg.max_age_s)


__all__ = ["attestation_reader", "attestation_setup", "keyring_for"]
