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
    #: The fix when the raiser names none: every failure a person reads says how to fix it.
    default_hint: str | None = None

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.path = path
        self.hint = hint if hint is not None else self.default_hint
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
    default_hint = ("these bytes are not a well-formed Prism envelope (either layout): give the record's value alone, "
                    "whole; producers should build envelopes with a Prism client (docs/sdk.md)")


class TruncatedError(DecodeError):
    code = "truncated"


class WireTypeError(DecodeError):
    code = "wire_type"


class LengthError(DecodeError):
    """A length prefix that is negative, absurd or runs past the end of the buffer."""

    code = "bad_length"


class Utf8Error(DecodeError):
    code = "bad_utf8"


class AmbiguousMapEntryError(DecodeError):
    """An entry of the envelope's top-level ``extensions`` map holds more than a key and a value
    (a third field, or a key or value of another wire type). Protobuf runtimes disagree on such
    an entry - upb (Python) keeps it aside as an unknown field, Go's and Java's runtimes store
    its key and value in the map - so converting it to the other layout would either drop it or
    turn it into an extension some readers never saw. The conversion refuses it instead
    (docs/formats.md, "Map entries that hold more than a key and a value")."""

    code = "ambiguous_map_entry"
    default_hint = ("write extensions as plain map<string, bytes> entries (generated code or a Prism client "
                    "does); the record was not converted")


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


class UnknownSourceError(LnmpError):
    """An LNMP message names a `source` that is not one of the service identifiers its
    topology source lists (`sources[].lnmp.known_sources`; LNMP spec v1 section 9.1: validate
    untrusted metadata against known identifiers)."""

    code = "unknown_source"


class CloudEventError(FormatError):
    code = "bad_cloudevent"


class JsonInputError(FormatError, ValueError):
    """JSON text Prism did not write that it will not decode (``app.untrusted_json``). Also a
    ``ValueError``, so code that caught ``json.loads``' ``ValueError`` still catches it."""

    code = "bad_json"


class JsonSyntaxError(JsonInputError):
    """Not strict JSON: a syntax error, invalid UTF-8, ``NaN``/``Infinity``, a number out of
    range, or (where asked) a key that appears twice in one object."""

    code = "bad_json_syntax"


class JsonTooLargeError(JsonInputError):
    """JSON text longer than the reader's size limit; refused before it is parsed."""

    code = "json_too_large"


class JsonTooDeepError(JsonInputError):
    """JSON nested deeper than the reader's depth limit; refused before it is parsed, so no
    reader (nor anything that walks the value afterwards) can hit Python's recursion limit."""

    code = "json_too_deep"


class BindingError(PrismError):
    """A backend message (Kafka record, NATS msg, row, object) that does not follow its binding."""

    code = "bad_binding"


# --------------------------------------------------------------------------- security


class SecurityError(PrismError):
    code = "security_error"


class SignatureError(SecurityError):
    """Signature missing where required, malformed, or not matching (forged/tampered)."""

    code = "bad_signature"


class SignatureScopeError(SignatureError):
    """`security.signature_scope` names a scope this verifier does not implement: never
    guessed, never treated as another scope (docs/signing.md)."""

    code = "unsupported_signature_scope"


class LegacySignatureScopeError(SignatureScopeError):
    """A legacy-scope signature (the envelope minus its whole security context) where the
    verifier's policy does not accept it: publisher identity, classification, PII flag and
    encryption metadata are not covered by such a signature, so they could have been changed."""

    code = "legacy_signature_scope"


class AmbiguousEnvelopeError(SignatureError):
    """Envelope bytes whose meaning depends on how a parser merges repeated records (two
    security contexts, two metadata records, a security field twice, a known field with the
    wrong wire type). Protobuf would silently merge them, so what was signed and what is read
    could differ; such envelopes are rejected instead of verified."""

    code = "ambiguous_envelope"


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


class EncryptionClaimError(CryptoError):
    """An envelope claims an encrypted payload (`security.encryption` is present) whose metadata
    and payload do not have the shape its algorithm produces: an IV or nonce of the wrong length,
    a missing or wrongly sized encapsulated key, a payload shorter than the AEAD tag, an
    `encryption_type` or AAD that names another algorithm or envelope. No consumer could decrypt
    it, and its payload may well be plaintext under an encryption label, so it is refused (or,
    where the topology's `encryption:` block covers its classification, encrypted by the worker)
    instead of being passed through as ciphertext (docs/encryption.md, "Claims of encryption")."""

    code = "encryption_claim_invalid"


class AuthError(SecurityError):
    """Producer authentication failed (JWT missing, invalid, expired, wrong audience ...)."""

    code = "auth_failed"


class TokenExpiredError(AuthError):
    code = "token_expired"


class PolicyError(SecurityError):
    """Envelope violates the namespace's security policy (unencrypted restricted data, ...)."""

    code = "policy_violation"


# What a producer may claim (docs/topologies.md "What a producer may claim"). One reason per
# way a claim can be out of bounds, so the DLQ says which binding was broken.


class ProducerBindingError(SecurityError):
    """An envelope claims a topic or namespace that its source, its authenticated principal or
    its signing key may not claim."""

    code = "producer_binding"


class TopicMismatchError(ProducerBindingError):
    """The envelope's topic is neither the source topic it was read from nor one of that
    source's `topic_aliases`: a message replayed from another topic."""

    code = "topic_mismatch"


class PrincipalNotAllowedError(ProducerBindingError):
    """The topology declares `producers:` and no entry names this principal (or, for a message
    without a verified token, no entry allows anonymous producers)."""

    code = "principal_not_allowed"


class NamespaceNotAllowedError(ProducerBindingError):
    """The principal is declared, but for other namespaces than the one the envelope claims."""

    code = "namespace_not_allowed"


class TopicNotAllowedError(ProducerBindingError):
    """The principal may claim the namespace, but not on the source topic the message came from."""

    code = "topic_not_allowed"


class KeyNamespaceError(ProducerBindingError):
    """The signing key is scoped (keyring `namespaces`, or the topology's `producers:` key_ids)
    to other namespaces than the one the envelope claims."""

    code = "key_not_allowed_for_namespace"


class KeyTopicError(ProducerBindingError):
    """The signing key may sign the namespace, but not for the source topic the message came from."""

    code = "key_not_allowed_for_topic"


# --------------------------------------------------------------------------- config & runtime


class ConfigError(PrismError):
    """A configuration file or environment variable that is invalid. Raised at start-up."""

    code = "bad_config"


class TopicNotFoundError(ConfigError):
    """A command was told to read a topic (an audit topic, a DLQ reason's topic) that does not
    exist: an empty result would look like a successful read of nothing (`prism audit
    --audit-topic typo` said "0 audited deliveries" and exited 0)."""

    code = "topic_not_found"


class FileAccessError(PrismError):
    """A file or directory a command was told to read or write cannot be used (missing, not
    permitted, a directory, a full disk). A CLI failure, never a message's."""

    code = "file_error"


class NoRoomError(ConfigError):
    """The output topics' size limits leave an input no usable room (app/worker/limits.py)."""

    code = "no_room"


class StallError(PrismError):
    """The worker made no progress with messages waiting, and a rewind did not help: it exits
    so that its supervisor restarts it (app/worker/progress.py)."""

    code = "stalled"


class ConfigProblems(ConfigError):
    """Several problems of one configuration file, each its own `ConfigError` in `problems`.

    `str()` is every problem in one sentence (what a log or a test reads); the CLI prints one
    `error [bad_config]` line per problem and then `summary`, so an operator fixes them all in
    one round instead of one per start."""

    def __init__(self, message: str, problems: list[ConfigError], *, path: str | None = None,
                 hint: str | None = None, summary: str = "") -> None:
        self.problems: list[PrismError] = list(problems)
        self.summary = summary or f"{len(problems)} configuration problems"
        super().__init__(message, path=path, hint=hint)


class SinkError(PrismError):
    """Writing to an output (topic, Redis, PostgreSQL, NATS, object store) failed."""

    code = "sink_failed"
    transient = True


class BrokerError(PrismError):
    """A broker could not be started, reached or administered. Defined here rather than next to
    the embedded broker (``app.broker.embedded`` re-exports it) because topic administration,
    which the client SDK uses, raises it too, and the client must not carry the broker launcher."""

    code = "broker_error"


class NoBrokerError(BrokerError):
    """A command that reads or writes an existing broker found none: PRISM_BROKER_URL is unset
    and no local broker (`prism broker start`) runs. Its own code, not the generic
    ``prism_error``, so that a script can tell "start a broker" from any other failure."""

    code = "no_broker"


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


class WorkerEncryptionError(EncryptionError):
    """The worker could not encrypt a classified payload that arrived in plaintext with the
    keys of the topology's `encryption:` block (key rotated away, wrong type, expired): the
    message goes to the DLQ instead of leaving the worker unencrypted."""

    code = "worker_encryption_failed"


# --------------------------------------------------------------------------- observability


class TraceContextError(PrismError):
    """Prism was asked to EMIT a trace context that is not valid W3C Trace Context.

    Received values never raise this: a malformed incoming `traceparent` restarts the trace
    (W3C Trace Context section "Versioning of traceparent"). Only a caller bug does.
    """

    code = "bad_trace_context"


class AuditError(CryptoError):
    """The audit sink failed, so the encryption operation was refused (RFC-031: every one is audited)."""

    code = "audit_failed"


class DeliveryAuditError(SecurityError):
    """An SDK subscription could not write the audit record of a `confidential` or
    `restricted` delivery (RFC-031 data classification), so the message was not handed to the
    application: it was given back to the backend (nack) and is delivered again later."""

    code = "delivery_audit_failed"
    transient = True


# --------------------------------------------------------------------------- lakehouse


class LakeError(PrismError):
    """The archive or the Delta table cannot be read or written as asked."""

    code = "lake_error"


class ArchiveError(LakeError):
    """An archive location, file or manifest that is missing, unreadable or inconsistent."""

    code = "archive_error"


class SchemaEvolutionError(LakeError):
    """A batch whose columns conflict with the table's (a changed type, not an added column)."""

    code = "schema_conflict"


class RetentionError(LakeError):
    """A vacuum retention shorter than the safe minimum, refused unless forced."""

    code = "retention_too_short"


# --------------------------------------------------------------------------- JWT authentication
# Subclasses of AuthError so a stage can catch AuthError once; `code` tells the DLQ reason.


class MissingTokenError(AuthError):
    """The envelope carries no auth token where authentication is required."""

    code = "missing_token"


class MalformedTokenError(AuthError):
    """Not a compact JWS/JWT at all: wrong segment count, bad base64url, bad JSON, too large."""

    code = "malformed_token"


class TokenAlgorithmError(AuthError):
    """`alg` is `none`, not on the accepted list, or not the algorithm of the key `kid` names
    (algorithm confusion)."""

    code = "token_algorithm_rejected"


class UnknownTokenKeyError(AuthError):
    """The token's `kid` names no usable key in the configured JWKS."""

    code = "unknown_token_key"


class TokenSignatureError(AuthError):
    """The token's signature does not verify with the key its `kid` names."""

    code = "bad_token_signature"


class TokenNotYetValidError(AuthError):
    """`nbf` or `iat` lies in the future beyond the allowed clock skew."""

    code = "token_not_yet_valid"


class WrongIssuerError(AuthError):
    code = "wrong_issuer"


class WrongAudienceError(AuthError):
    code = "wrong_audience"


class MissingClaimError(AuthError):
    """A required claim (configured, or the publisher-id claim) is absent."""

    code = "missing_claim"


class InvalidClaimError(AuthError):
    """A claim of the wrong type (`exp` not a number, `sub` not a string, ...)."""

    code = "invalid_claim"


# DLQ replay attestations (app/security/attestation.py): the identity a worker verified before a
# message failed, signed by that worker. Each failure has its own reason code, so an operator
# can tell a forgery from a record that was simply replayed too late.


class AttestationError(AuthError):
    """A replayed record's attestation is malformed or its signature does not verify."""

    code = "attestation_invalid"


class AttestationUntrustedKeyError(AttestationError):
    """The attestation names a key that is not one of the worker keys trusted for attestations."""

    code = "attestation_untrusted_key"


class AttestationMismatchError(AttestationError):
    """A genuine attestation, but for another record (payload, headers, message id or topic differ)."""

    code = "attestation_mismatch"


class AttestationExpiredError(AttestationError):
    """The attestation is older than the configured maximum age (or issued in the future)."""

    code = "attestation_expired"


# --------------------------------------------------------------------------- input shapes (app.formats)


class LegacyFormatError(FormatError):
    """A legacy input shape (Kafka-header metadata, NATS headers, Redis `{"meta","payload"}`
    JSON) whose metadata cannot be read: bad timestamp, priority out of range, conflicting
    duplicates, malformed JSON, invalid base64 payload."""

    code = "bad_legacy_format"


class PrismShapeError(FormatError):
    """Input that claims to be a Prism envelope (prism-* headers) but does not decode as one,
    or whose headers disagree with it."""

    code = "bad_prism_envelope"


# --------------------------------------------------------------------------- client SDK (app.sdk)


class SchemaAssertionError(EnvelopeError):
    """A received envelope's schema version is not the one the subscriber asserted
    (`subscribe(expected_version=..., on_mismatch="error")`)."""

    code = "schema_mismatch"


class PublishError(SinkError):
    """The backend refused a publish or did not confirm it; the message may not be stored."""

    code = "publish_failed"


class SubscribeError(PrismError):
    """Receiving, acknowledging or re-queueing messages on a backend failed."""

    code = "subscribe_failed"
    transient = True


class MigrationError(PrismError):
    """A migration (`prism envelope migrate`) cannot continue: bad source entry, unsupported
    backend pair, or a target that refused the writes. Progress up to the last checkpoint is kept."""

    code = "migration_failed"


class PayloadSchemaError(EnvelopeError):
    """The payload does not conform to its namespace's schema (enrich.schema.validate_payloads)."""

    code = "payload_schema_mismatch"


class SchemaValidationError(PayloadSchemaError):
    """A payload does not match its schema under `validation: strict` (worker: DLQ reason
    `schema_validation_failed`), or an SDK `publish(..., schema_validation=True)` refused it
    before anything was sent (RFC-030 Workflow 1). `violations` lists each problem with its
    field path (`$.items[2].price`); `path` is the first one's."""

    code = "schema_validation_failed"

    def __init__(self, message: str, *, violations: list | tuple = (), path: str | None = None,
                 hint: str | None = None, schema_version: str = "") -> None:
        self.violations = list(violations)
        self.schema_version = schema_version
        super().__init__(message, path=path or (self.violations[0].path if self.violations else None), hint=hint)


class SchemaRequiredError(ConfigError):
    """RFC-030 "Migration Path" phase 2: the namespace's registry policy requires a schema
    (``require_schema``) and the topic has no registered subject; the SDK raises it before
    anything is sent (the worker refuses to start with a ``ConfigError`` instead)."""

    code = "schema_required"


class SchemaReferencesError(ConfigError):
    """A schema's Confluent references (imports, named types, ``$ref``s to other subjects) cannot
    be resolved: a referenced subject version is missing, the references form a cycle, nest too
    deep or pull in too many versions, or what they resolve to does not parse. Raised where a
    schema is resolved (worker start-up, SDK validation and decoding), never per message."""

    code = "schema_references_invalid"
    default_hint = ("register every referenced subject version, and keep references acyclic, at most "
                    "32 deep and at most 256 versions per schema (docs/schema-registry.md, \"Schema references\")")


class SchemaReferenceError(PayloadError):
    """A received envelope's schema reference cannot be used to decode its payload: it names
    no subject version or schema id, one the registry does not hold, a subject other than the
    message's, or content whose hash differs from the envelope's ``schema_hash``. The message
    is left as it is (ack or nack it); nothing was decoded."""

    code = "schema_reference_invalid"
