"""The worker's side of payload encryption (topology `encryption:`; docs/encryption.md,
"Encryption in the worker").

A producer that can encrypt does so itself (RFC-031 rev. 2: end to end), and the worker
passes its ciphertext through untouched: it checks the algorithm against the policy stage and
re-signs the envelope, but holds no key that opens it. What the worker adds is for producers
that cannot encrypt yet (legacy shapes, raw bytes): a classified payload that arrives in
plaintext is encrypted by the worker, for the consumers, instead of being sent to the DLQ as
`policy_violation`. The worker saw that plaintext on the wire anyway; what matters is that
nothing downstream does.

Why the worker holds public keys only (asymmetric, post-quantum and hybrid): those patterns
exist so that only the recipient can read the payload. A worker holding the private half
could read every message encrypted to that recipient, including the ones producers encrypted
themselves, so `build_worker_encryption` refuses such a key at start-up, and the
Kubernetes-mounted provider runs public-only (a rotated Secret with a private half is not
taken). With a symmetric algorithm the worker necessarily holds the shared key; the docs say
so, and deployments that must keep the worker blind use a public-key pattern.

Start-up checks (`build_worker_encryption`) report every problem at once as one
`ConfigError`, like the topology itself: the provider's keys load, the private-key rule holds,
and the configured key (or each namespace's current key of the rotation group) exists and may
encrypt now. A message whose encryption fails later (a key rotated away, KMS down) goes to the
DLQ as `worker_encryption_failed`, naming the key and the fix; KMS unavailability is retried
first, as any transient error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.envelope.model import Envelope
from app.errors import ConfigError, KeyProviderError, PrismError, WorkerEncryptionError
from app.security.algorithms import SYMMETRIC, AlgorithmPolicy, AlgorithmSpec, lookup
from app.security.encryption import AuditSink, encrypt_envelope
from app.security.keys import (
    AwsKmsProvider,
    DataKeyProvider,
    FileKeyring,
    KeyProvider,
    KeyUse,
    MountedSecretsKeyProvider,
    private_key_ids,
)
from app.topology import EncryptionSettings, Topology


@dataclass
class WorkerEncryption:
    """Encrypts a classified plaintext envelope in place for its consumers (policy stage)."""

    provider: KeyProvider | DataKeyProvider
    spec: AlgorithmSpec
    classifications: frozenset[str]
    policy: AlgorithmPolicy
    key_id: str | None = None
    purpose: str | None = None
    audit: AuditSink | None = None
    #: envelopes encrypted, per classification (the worker's status and tests read it)
    encrypted: dict[str, int] = field(default_factory=dict)

    def applies_to(self, classification: str) -> bool:
        return classification in self.classifications

    def encrypt(self, env: Envelope, classification: str) -> None:
        """Encrypt `env`'s payload; `WorkerEncryptionError` (DLQ reason
        `worker_encryption_failed`) says which key failed and why. A transient provider error
        (KMS unreachable) stays a `KeyProviderError`, which the worker retries."""
        try:
            encrypt_envelope(env, self.provider, key_id=self.key_id, algorithm=self.spec.name, policy=self.policy,
                             purpose=self.purpose, audit=self.audit)
        except KeyProviderError as exc:
            if exc.transient:
                raise
            raise self._refusal(exc) from None
        except PrismError as exc:
            raise self._refusal(exc) from None
        self.encrypted[classification] = self.encrypted.get(classification, 0) + 1

    def _refusal(self, exc: PrismError) -> WorkerEncryptionError:
        group = self.key_id or f"the current {self.purpose or self.spec.key_type} key"
        return WorkerEncryptionError(
            f"{exc.code}: the worker could not encrypt this classified payload with {self.spec.name} using "
            f"{group} of provider {getattr(self.provider, 'name', '?')}: {exc.message}",
            path="encryption.key_id" if self.key_id else "encryption.purpose",
            hint="make the key available to the worker (mount or rotate it in, extend its validity), or fix "
                 "encryption.key_id / encryption.purpose in the topology")


def build_provider(settings: EncryptionSettings, topology: Topology) -> KeyProvider | DataKeyProvider:
    """The provider a topology's `encryption:` block names. Raises `KeyringError` /
    `ConfigError` when its keys do not load (every problem of the key files at once)."""
    if settings.provider == "file":
        assert settings.path is not None
        return FileKeyring.load(topology.resolve(settings.path))
    if settings.provider == "k8s-secrets":
        assert settings.path is not None
        return MountedSecretsKeyProvider(topology.resolve(settings.path), refresh_s=settings.refresh_s,
                                         public_only=True)
    kms = settings.kms
    assert kms is not None
    return AwsKmsProvider(default_key_id=kms.default_key_id or settings.key_id, namespace_keys=kms.namespace_keys,
                          encryption_context=kms.encryption_context, region_name=kms.region,
                          endpoint_url=kms.endpoint_url)


def _namespaces(topology: Topology) -> list[str]:
    names = {topology.namespace} | {s.namespace for s in topology.sources if s.namespace}
    if topology.producers:
        for p in topology.producers:
            names.update(p.namespaces)
    return sorted(names)


def build_worker_encryption(topology: Topology, *, audit: AuditSink | None = None,
                            provider: KeyProvider | DataKeyProvider | None = None) -> WorkerEncryption | None:
    """The topology's `WorkerEncryption`, checked (module docstring), or None without an
    `encryption:` block. `provider` replaces the one the block names (tests, KMS stubs)."""
    settings = topology.encryption
    if settings is None:
        return None
    where = f"{topology.base_dir / 'topology'} encryption" if topology.base_dir != Path(".") else "encryption"
    problems: list[str] = []
    if provider is None:
        try:
            provider = build_provider(settings, topology)
        except PrismError as exc:
            raise ConfigError(f"the worker's encryption keys do not load: {exc.message}",
                              path=f"encryption.path ({settings.path})" if settings.path else "encryption",
                              hint=exc.hint or "fix the key files, see docs/encryption.md") from None
    policy_stage = topology.stage("policy")
    policy = AlgorithmPolicy(fips_mode=policy_stage.fips_mode, allowlist=set(policy_stage.allowed_algorithms)
                             if policy_stage.allowed_algorithms else None)
    spec = lookup(settings.algorithm)  # the topology validated it
    holding = private_key_ids(provider)
    if holding and spec.pattern != SYMMETRIC:
        problems.append(f"encryption.path: the worker's keys include the private half of {holding}; with "
                        f"{spec.name} ({spec.pattern.replace('_', '-')}) only the consumers may hold it, or the worker "
                        "could read what producers encrypted for them - give the worker the public halves only "
                        "(FileKeyring.public_only(), or mount only public_pem / public / x25519_public + "
                        "ml_kem_public)")
    elif holding:
        problems.append(f"encryption.path: the worker's keys include the private half of {holding}, which "
                        f"{spec.name} does not need - remove them from the worker's keys")
    if not isinstance(provider, AwsKmsProvider):
        _check_keys(provider, settings, spec, _namespaces(topology), problems)
    if problems:
        raise ConfigError(f"invalid encryption settings ({len(problems)} problem(s)): " + "; ".join(problems),
                          path=where, hint="see docs/encryption.md, \"Encryption in the worker\"")
    return WorkerEncryption(provider, spec, frozenset(settings.encrypt_unencrypted), policy, settings.key_id,
                            settings.purpose, audit)


def _check_keys(provider: Any, settings: EncryptionSettings, spec: AlgorithmSpec, namespaces: list[str],
                problems: list[str]) -> None:
    """The key the worker would encrypt with exists, has the algorithm's type and may encrypt now."""

    def usable(kid: str, where: str) -> None:
        try:
            if spec.pattern == SYMMETRIC:
                provider.get_symmetric_key(kid, KeyUse.ENCRYPT)
            else:
                ref = provider.get_public_key(kid)
                if ref.key_type != spec.key_type:
                    problems.append(f"{where}: key {kid!r} is a {ref.key_type} key; {spec.name} needs a "
                                    f"{spec.key_type} key - name one of that type")
        except PrismError as exc:
            problems.append(f"{where}: {exc.message}" + (f" - {exc.hint}" if exc.hint else ""))

    if settings.key_id:
        usable(settings.key_id, "encryption.key_id")
        return
    group = settings.purpose or spec.key_type
    for ns in namespaces:
        try:
            kid = provider.current_key_id(group, ns)
        except PrismError as exc:
            problems.append(f"encryption.purpose: namespace {ns!r} has no current {group} key: {exc.message} - "
                            "add one to the worker's keys, or set encryption.key_id")
            continue
        usable(kid, f"encryption (namespace {ns!r}, current key {kid!r})")
