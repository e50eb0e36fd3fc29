"""Prism's typed exception hierarchy.

Every failure Prism can report about a message or a configuration is a `PrismError`
subclass, so a stage can catch exactly one base class, route the message to the DLQ and
keep going. Each error carries:

* `code` - a short, stable machine-readable reason (DLQ header `prism.errors.reason`,
  metric label); it never contains message data.
* `path` - where the problem is (`metadata.message_id`, `byte 17`, `topology.yaml:stages[2]`).
* `hint` - one line saying how to fix it.

`str(err)` reads as one sentence: "what, where, how to fix". Messages never include secret
material (tokens, keys, signatures, plaintext).
"""

from __future__ import annotations

from dataclasses import dataclass


class PrismError(Exception):
    """Base class of every error Prism raises on purpose."""

    code: str = "prism_error"
    #: Transient errors are retried with backoff before a message goes to the DLQ.
    transient: bool = False

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.path = path
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.message
        if self.path:
            text = f"{text} (at {self.path})"
        if self.hint:
            text = f"{text}; fix: {self.hint}"
        return text


# --------------------------------------------------------------------------- envelope


class EnvelopeError(PrismError):
    """A problem with envelope bytes or the envelope model."""

    code = "envelope_error"


class DecodeError(EnvelopeError):
    """Bytes that are not a well-formed envelope."""

    code = "malformed_envelope"


class TruncatedError(DecodeError):
    code = "truncated"


class WireTypeError(DecodeError):
    code = "wire_type"


class LengthError(DecodeError):
    """A length prefix that is negative, absurd or runs past the end of the buffer."""

    code = "bad_length"


class Utf8Error(DecodeError):
    code = "bad_utf8"


class SizeLimitError(EnvelopeError):
    """Input larger than the configured limit; raised before the payload is touched."""

    code = "too_large"


class LayoutError(EnvelopeError):
    """The bytes do not match the requested (or any known) wire layout."""

    code = "unknown_layout"


class CompressionError(EnvelopeError):
    code = "bad_compression"


class PayloadError(EnvelopeError):
    """The payload cannot be produced as asked (wrong content type, still encrypted, ...)."""

    code = "payload_error"


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One validation finding: a dotted field path and what is wrong with it."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


class ValidationError(EnvelopeError):
    """Required fields missing or values out of range. Lists every problem at once."""

    code = "invalid_envelope"

    def __init__(self, problems: list[FieldProblem], *, hint: str | None = None) -> None:
        self.problems = list(problems)
        summary = "; ".join(str(p) for p in self.problems)
        super().__init__(
            f"envelope failed validation with {len(self.problems)} problem(s): {summary}",
            hint=hint or "set the listed fields in the producer (the Prism SDK builder sets them all)",
        )


# --------------------------------------------------------------------------- input formats


class FormatError(PrismError):
    """A legacy or foreign input shape that cannot be decoded."""

    code = "bad_input_format"


class LnmpError(FormatError):
    code = "bad_lnmp"


class CloudEventError(FormatError):
    code = "bad_cloudevent"


class BindingError(PrismError):
    """A backend message (Kafka record, NATS msg, row, object) that does not follow its binding."""

    code = "bad_binding"


# --------------------------------------------------------------------------- security


class SecurityError(PrismError):
    code = "security_error"


class SignatureError(SecurityError):
    """Signature missing where required, malformed, or not matching (forged/tampered)."""

    code = "bad_signature"


class UnknownKeyError(SecurityError):
    code = "unknown_key"


class AlgorithmError(SecurityError):
    """An algorithm that is deprecated, not allowed by policy, or not FIPS-approved in FIPS mode."""

    code = "algorithm_not_allowed"


class CryptoError(SecurityError):
    code = "crypto_error"


class DecryptionError(CryptoError):
    """Ciphertext that does not authenticate: tampered, wrong key, or wrong AAD."""

    code = "decryption_failed"


class AuthError(SecurityError):
    """Producer authentication failed (JWT missing, invalid, expired, wrong audience ...)."""

    code = "auth_failed"


class TokenExpiredError(AuthError):
    code = "token_expired"


class PolicyError(SecurityError):
    """Envelope violates the namespace's security policy (unencrypted restricted data, ...)."""

    code = "policy_violation"


# --------------------------------------------------------------------------- config & runtime


class ConfigError(PrismError):
    """A configuration file or environment variable that is invalid. Raised at start-up."""

    code = "bad_config"


class SinkError(PrismError):
    """Writing to an output (topic, Redis, PostgreSQL, NATS, object store) failed."""

    code = "sink_failed"
    transient = True


class ExpiredError(PrismError):
    """The message's TTL has passed; it is accounted as expired, not as an error."""

    code = "expired"


class DuplicateError(PrismError):
    """The message id was already processed inside the dedup window."""

    code = "duplicate"


# --------------------------------------------------------------------------- payload encryption keys


class KeyringError(ConfigError):
    """A key file (dev keyring) that cannot be loaded: names the file, the key id and the field."""

    code = "bad_keyring"


class KeyNotUsableError(SecurityError):
    """The key exists but may not be used now or for this: not yet valid, expired past its
    decrypt overlap, public-only where a private key is needed, or the wrong key type."""

    code = "key_not_usable"


class KeyProviderError(SecurityError):
    """The key service (AWS KMS, Vault, ...) failed or refused the request; retried with backoff."""

    code = "key_provider_failed"
    transient = True


class EncryptionError(CryptoError):
    """The payload cannot be encrypted as asked (already encrypted, bad parameters, ...)."""

    code = "encryption_failed"
