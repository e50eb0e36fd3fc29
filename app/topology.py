"""Topology files: what a pipeline reads, which stages it runs, where results go.

A topology is a YAML file in `topologies/` - the Kafka Connect "connector config" of a
Prism pipeline. It is loaded and validated once at start-up; any problem is a
`ConfigError` naming the file, the key path and what is wrong, so a worker never starts
half-configured. Relative paths inside a topology (key files, schema files) resolve
against the topology file's folder.

Stage names map one-to-one onto modules in `app/agents/` (`authenticate` ->
`app/agents/authenticate.py`), so the file is also the map of the code.
"""

from __future__ import annotations

import re
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.errors import ConfigError, ConfigProblems

STAGE_ORDER = ("normalize", "validate", "authenticate", "verify_signature", "policy", "dedup", "enrich")
#: Data classifications, lowest first (app/envelope/validation.py CLASSIFICATIONS).
Classification = Literal["public", "internal", "confidential", "restricted"]
CLASSIFICATIONS = ("public", "internal", "confidential", "restricted")
#: Schema validation of payloads (RFC-030 "Migration Path"): off, warn (log, count, forward with
#: the `prism-schema-validation` header) or strict (DLQ as `schema_validation_failed`).
def _off_word(v: Any) -> Any:
    """YAML 1.1 reads a bare `off`/`no` as false - taken as the word `off` - and `on`/`yes` as
    true, which names no mode: said so, not as "should be 'off', 'warn' or 'strict'"."""
    if v is False:
        return "off"
    if v is True:
        raise ValueError("on / yes / true is YAML for a boolean, not a mode: write warn or strict (or off)")
    return v


ValidationMode = Annotated[Literal["off", "warn", "strict"], BeforeValidator(_off_word)]
#: The longest retention a topic config takes (Kafka's `retention.ms` is a Java long)
MAX_RETENTION_MS = 2**63 - 1
InputFormat = Literal["auto", "prism", "cloudevents", "kafka-headers", "nats-headers", "redis-json", "lnmp", "raw"]


class _Strict(BaseModel):
    """Every topology model: unknown keys refused (a typo is an error, not a default), and values
    taken as the type YAML gave them - `partitions: true` was 1 and `partitions: "4"` 4 (strict),
    and `roll_interval_s: .nan` was refused as "less than or equal to 3600" (no NaN, no inf)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _not_dots(v: str) -> str:
    if v in (".", ".."):
        raise ValueError(f"{v!r} is not a Kafka topic name (Kafka refuses '.' and '..')")
    return v


#: Kafka's topic name rules (249 characters at most, `.` and `..` refused); 200 leaves room for
#: the names Prism derives from a source (`<topic>.v3`, `<topic><dlq suffix>.replayed`).
TopicName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$"),
                      AfterValidator(_not_dots)]
#: `off` (and `on`) in YAML 1.1 are booleans: a policy written `off` is taken as the word it was
_OffWord = BeforeValidator(lambda v: "off" if v is False else v)
Policy = Annotated[Literal["required", "optional", "off"], _OffWord]
#: Envelope namespaces: the names `producers:` and `namespaces:` take (1-249: the envelope's limit)
NamespaceName = Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._:/@+-]+$")]


_DURATION = re.compile(r"^\s*(\d{1,9})\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Source topics hold producers' tokens until the broker deletes them (memo-031 Recommendation 5:
#: keep tokens only as long as needed). A day covers a worker outage overnight; see
#: docs/operations.md "Source topic retention" for choosing a value.
DEFAULT_SOURCE_RETENTION = "24h"
MIN_SOURCE_RETENTION_MS = 60_000


def parse_duration_ms(value: str | int) -> int:
    """`30m`, `1h`, `2d`, `90s`, `500ms` (or a number of milliseconds) -> milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int):
        ms = value
    else:
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"{value!r} is not a duration; write e.g. 30m, 1h, 2d")
        ms = int(m.group(1)) * _UNIT_MS[m.group(2)]
    if ms <= 0:
        raise ValueError(f"duration {value!r} must be positive")
    if ms > MAX_RETENTION_MS:
        raise ValueError(f"duration {value!r} is longer than Kafka takes ({MAX_RETENTION_MS} ms); write e.g. 30d, "
                         "or null for the broker's default")
    return ms


_LNMP_SOURCE_ID = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")


class LnmpSource(_Strict):
    """How a source reads LNMP (LNMP spec v1): `mode` strict (default; a malformed envelope is
    an error, DLQ reason `bad_lnmp`) or loose (section 9 leniency: a malformed envelope is ignored
    or, when only `metadata_length` is wrong, every TLV that parses whole is kept; the record
    always flows). `known_sources`: the service identifiers LNMP producers on this topic may
    name as `source`; any other is refused (DLQ reason `unknown_source`, section 9.1). Omitted:
    no check. The LNMP source is a claim either way (app/agents/identity.py)."""

    mode: Literal["strict", "loose"] = "strict"
    known_sources: list[str] | None = None

    @field_validator("known_sources")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is an empty list, which would refuse every LNMP message that names a source; list "
                             "the service identifiers, or omit the key (no check)")
        bad = [s for s in v if not _LNMP_SOURCE_ID.match(s)]
        if bad:
            raise ValueError(f"{[b[:64] for b in bad]} are not LNMP source identifiers: 1-256 characters, no control "
                             "characters (exact names; no wildcards)")
        _no_repeats(v, "known_sources")
        return v


class Source(_Strict):
    """A topic the pipeline reads.

    An envelope read here must claim this topic (`metadata.topic`), or one of `topic_aliases`:
    otherwise it is a message replayed from another topic and goes to the DLQ as
    `topic_mismatch` (checked by the normalize stage, always, with or without `producers:`).
    """

    topic: TopicName
    topic_aliases: list[TopicName] = []  # other envelope topics accepted here (e.g. an old name during a rename)
    format: InputFormat = "auto"
    partitions: Annotated[int, Field(ge=1, le=1024)] = 4
    namespace: NamespaceName | None = None  # overrides the topology default for legacy inputs
    #: The lowest classification a message from a producer that is not authenticated (no
    #: verified token, key bound to a publisher, or DLQ attestation) may carry from this
    #: source: a lower or absent one is raised to it, before the policy stage
    #: (app/agents/identity.py; docs/topologies.md "Classification floor"). null: no floor.
    classification_floor: Classification | None = None
    #: LNMP reading rules for this source (strict/loose, known source identifiers); None: strict,
    #: no source check. Only for `format: auto` or `lnmp` (checked at load).
    lnmp: LnmpSource | None = None
    #: how long the broker keeps this topic's records (they carry producers' tokens): set as
    #: `retention.ms` when Prism creates the topic, checked by the worker at start-up.
    #: null: leave the broker's default (and skip the check).
    retention: str | int | None = DEFAULT_SOURCE_RETENTION

    @field_validator("retention", mode="before")
    @classmethod
    def _retention_type(cls, v: Any) -> Any:
        # one message for a value of the wrong type, not one per member of `str | int | None`
        if v is not None and (isinstance(v, bool) or not isinstance(v, str | int)):
            raise ValueError(f"{str(v)[:64]!r} is not a duration: write e.g. 24h, 30m, 7d, a whole number of "
                             "milliseconds, or null for the broker's default")
        return v

    @field_validator("retention")
    @classmethod
    def _retention(cls, v: str | int | None) -> str | int | None:
        if v is not None and parse_duration_ms(v) < MIN_SOURCE_RETENTION_MS:
            raise ValueError(f"retention {v!r} is under one minute: records could be deleted before the worker "
                             "reads them")
        return v

    @property
    def retention_ms(self) -> int | None:
        return None if self.retention is None else parse_duration_ms(self.retention)


class NormalizeStage(_Strict):
    default_content_type: str | None = None


class ValidateStage(_Strict):
    #: bounded like every number of the topology (a year; a century): larger values meant nothing
    max_future_skew_s: Annotated[int, Field(ge=0, le=365 * 86_400)] = 300
    max_age_days: Annotated[int, Field(ge=1, le=36_500)] = 365
    max_id_length: Annotated[int, Field(ge=16, le=4096)] = 128


#: A text a key needs to mean anything: the worker's checks at start-up named the JWT settings'
#: keys (`jwt.issuers`, `jwt.algorithms`), not the topology's, found one problem per start, and
#: `keyring: ""` was reported as "no keyring is configured"
NonEmpty = Annotated[str, Field(min_length=1)]


class AuthenticateStage(_Strict):
    policy: Policy = "required"
    jwks: NonEmpty  # path to an RFC 7517 JWKS file
    issuer: str | list[str] | None = None
    audience: NonEmpty | None = None
    algorithms: Annotated[list[Literal["HS256", "RS256", "EdDSA"]], Field(min_length=1)] = ["RS256", "EdDSA"]
    leeway_s: Annotated[int, Field(ge=0, le=600)] = 30
    publisher_id_claim: NonEmpty = "sub"
    publisher_team_claim: NonEmpty = "team"

    @field_validator("issuer", mode="before")
    @classmethod
    def _issuer(cls, v: Any) -> Any:
        # one message for `issuer: ""`, `issuer: []` or `issuer: [""]` (not one per member of the union)
        if v is None:
            return v
        values = v if isinstance(v, list) else [v]
        if not values or not all(isinstance(x, str) and x for x in values):
            raise ValueError(f"{str(v)[:100]!r} is not an issuer: write the identity provider's `iss` value, or a "
                             "non-empty list of them")
        return v


class VerifySignatureStage(_Strict):
    policy: Policy = "optional"
    keyring: NonEmpty  # path to a signing keyring file (docs/signing.md, "Keyring files")
    #: Accept legacy-scope signatures (memo-031 Option 2: the envelope minus its security
    #: context). A DOWNGRADE RISK: such a signature does not cover publisher, classification,
    #: PII flag or encryption metadata, so anyone can rewrite those on a legacy-signed
    #: envelope. Off by default (DLQ reason `legacy_signature_scope`); turn it on only while
    #: old producers migrate (docs/signing.md).
    accept_legacy_scope: bool = False


class PolicyStage(_Strict):
    default_priority: Annotated[int, Field(ge=0, le=10)] = 5
    require_encryption_for: list[Classification] = [
        "confidential", "restricted"]
    allowed_algorithms: list[str] | None = None  # None: every non-deprecated algorithm
    fips_mode: bool = False
    expired: Literal["drop", "dlq"] = "drop"

    @model_validator(mode="after")
    def _algorithms(self) -> PolicyStage:
        """The allowlist as the policy stage will use it, checked at load: `[]` was taken as "no
        list" - every algorithm allowed, the opposite of what it says - and an unknown or
        FIPS-forbidden name failed at start-up under another config's key."""
        if self.allowed_algorithms is None:
            return self
        from app.errors import AlgorithmError
        from app.security.algorithms import AlgorithmPolicy

        if not self.allowed_algorithms:
            raise ValueError("allowed_algorithms is an empty list, which would allow no algorithm (it was read as "
                             "every algorithm) - list the algorithms to allow, or remove the key for every "
                             "non-deprecated one")
        try:
            AlgorithmPolicy(fips_mode=self.fips_mode, allowlist=set(self.allowed_algorithms))
        except AlgorithmError as exc:
            raise ValueError(f"allowed_algorithms: {exc.message}" + (f" - {exc.hint}" if exc.hint else "")) from None
        return self


class DedupStage(_Strict):
    window_s: Annotated[int, Field(ge=1, le=30 * 24 * 3600)] = 3600


class SchemaRef(_Strict):
    """A namespace's schema, resolved once at start-up (RFC-030) by `app.schema.resolve`.

    Each registry type names what it needs, checked here so a topology fails at load, not at
    the first message: `file` a `path`; `prism` / `confluent` a `url` and a `subject`; `git` a
    local `repository` (path or file:// URL) and a `path` in it, pinned by `ref` (tag/commit).
    """

    registry_type: Literal["prism", "confluent", "file", "git"] = "file"
    url: str | None = None
    path: str | None = None
    subject: str | None = None
    repository: str | None = None   # git: local repository path (relative to the topology) or file:// URL
    ref: str | None = None          # git: tag, commit or branch (default HEAD)
    version: str = "latest"
    message: str | None = None      # protobuf message name
    validate_payloads: bool = False  # debug: reject non-conforming payloads to the DLQ

    @model_validator(mode="after")
    def _needs(self) -> SchemaRef:
        needed = {"file": ("path",), "prism": ("url", "subject"), "confluent": ("url", "subject"),
                  "git": ("repository", "path")}[self.registry_type]
        missing = [k for k in needed if not getattr(self, k)]
        if missing:
            raise ValueError(f"registry_type {self.registry_type} needs {' and '.join(missing)}")
        if self.registry_type in ("file", "git") and self.path and not self.path.lower().endswith(
                (".proto", ".avsc", ".avro", ".json")):
            # the resolver tells the format by the extension; its error said "pass --format", an
            # option of `prism schema`, which a topology does not have
            raise ValueError(f"path {self.path[:200]!r}: the schema's format is told by its file extension - name a "
                             ".proto, .avsc (.avro) or .json file")
        if self.registry_type != "git" and (self.repository or self.ref):
            raise ValueError("repository and ref are for registry_type git only")
        if self.registry_type == "git" and self.repository and (
                ("://" in self.repository and not self.repository.startswith("file://"))
                or self.repository.startswith("git@")):
            raise ValueError(f"repository {self.repository!r} is remote; only local git repositories are read "
                             "(clone it and give its path or a file:// URL)")
        if self.ref is not None and (not self.ref or self.ref.startswith("-") or not self.ref.isprintable()
                                     or " " in self.ref):
            raise ValueError(f"ref {self.ref!r} is not a tag, commit or branch name")
        return self


class EnrichStage(_Strict):
    trace: bool = True
    schema_: SchemaRef | None = Field(default=None, alias="schema")
    pii_fields: list[str] = []       # used when no schema is configured


_STAGE_MODELS: dict[str, type[_Strict]] = {
    "normalize": NormalizeStage,
    "validate": ValidateStage,
    "authenticate": AuthenticateStage,
    "verify_signature": VerifySignatureStage,
    "policy": PolicyStage,
    "dedup": DedupStage,
    "enrich": EnrichStage,
}


class StageSpec(_Strict):
    name: str
    settings: Any


class Migration(_Strict):
    """The `.v2` sunset (RFC-031 "Breaking Change Procedure"; app/sunset.py): from
    `deprecation_date` every `.v2` record carries the `prism-deprecation` header; from
    `cutoff_date` the worker writes `.v3` only. Dates are ISO 8601 (a date is midnight UTC)."""

    deprecation_date: datetime
    cutoff_date: datetime

    @field_validator("deprecation_date", "cutoff_date", mode="before")
    @classmethod
    def _date(cls, v: Any) -> datetime:
        from app.sunset import to_utc

        if not isinstance(v, date | datetime | str):
            raise ValueError(f"{v!r} is not an ISO 8601 date (2025-06-01) or date-time (2025-06-01T00:00:00Z)")
        return to_utc(v)

    @model_validator(mode="after")
    def _order(self) -> Migration:
        if self.cutoff_date <= self.deprecation_date:
            raise ValueError(f"cutoff_date {self.cutoff_date} must come after deprecation_date "
                             f"{self.deprecation_date}: consumers need the time between them to move to .v3")
        return self


class Outputs(_Strict):
    #: The `.v2` sunset: deprecation and cutoff dates (None: `.v2` is written as long as listed).
    migration: Migration | None = None
    layouts: list[Literal["v2", "v3"]] = ["v2", "v3"]
    sign: bool = True
    signing_key_id: str | None = None      # worker's key in the keyring; default: keyring's current
    keyring: str | None = None
    #: `batch`: one signature per worker batch over a Merkle tree of every message's `.v2` and
    #: `.v3` copies (scope 4, docs/signing.md; ~1/500 of an Ed25519 signature per message).
    #: `pair`: one signature covers a message's two copies (scope 3). `v2`: each copy signed on
    #: its own with scope v2, for consumers whose verifier knows neither. With a single layout
    #: there is nothing to pair, and scope v2 is used either way.
    signature_scope: Literal["batch", "pair", "v2"] = "batch"

    @field_validator("layouts")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError("must name v2, v3 or both, each once")
        return v

    @model_validator(mode="after")
    def _migration_needs_both(self) -> Outputs:
        if self.migration is not None and set(self.layouts) != {"v2", "v3"}:
            raise ValueError(f"migration: sunsets .v2 in favour of .v3, so layouts must be [v2, v3] (got "
                             f"{self.layouts}) - add the missing layout, or remove migration:")
        return self


class DlqAttestation(_Strict):
    """Identity attestations on DLQ records (app/security/attestation.py): how a replayed record
    keeps the identity its (stripped) token proved."""

    enabled: bool = True
    #: a replayed record's attestation older than this is refused (`attestation_expired`)
    max_age_s: Annotated[int, Field(ge=60, le=90 * 86400)] = 7 * 86400
    #: Ed25519 worker keys (ids in the signing keyring) whose attestations are accepted besides
    #: the worker's own key: list a rotated-out worker key here to replay its DLQ records.
    trusted_keys: list[str] = []


class DlqOverflow(_Strict):
    """`dlq.overflow`: where the whole value of a DLQ copy cut to fit its topic is kept, by
    reference (app/worker/dlq_overflow.py). Without it a truncated copy keeps only the value's
    digest and length, and the whole message lives only as long as the source topic keeps it."""

    #: file:///absolute/dir or s3://bucket/prefix[?endpoint_override=host:port&scheme=http]
    path: str

    @field_validator("path")
    @classmethod
    def _location(cls, v: str) -> str:
        if v.startswith("file://"):
            if not v[len("file://"):].startswith("/"):
                raise ValueError(f"{v!r}: a file:// location needs an absolute path, e.g. file:///var/lib/prism/dlq")
        elif not v.startswith(("s3://", "s3a://")) or len(v.split("://", 1)[1].split("?", 1)[0].strip("/")) == 0:
            raise ValueError(f"{v!r} is neither file:///absolute/dir nor s3://bucket[/prefix]")
        return v


def _backoff_in_order(model: Any) -> Any:
    """`backoff_initial_ms` no larger than `backoff_max_ms`: the first retry waiting longer than
    the cap is a swapped pair, which the retry loop would silently clamp."""
    if model.backoff_initial_ms > model.backoff_max_ms:
        raise ValueError(f"backoff_initial_ms {model.backoff_initial_ms} is larger than backoff_max_ms "
                         f"{model.backoff_max_ms} - the first wait would exceed the cap; swap them, or raise "
                         "backoff_max_ms")
    return model


class Dlq(_Strict):
    #: the DLQ topic is `<source topic><topic_suffix>`: a suffix, so it can never be the source
    #: itself (an empty suffix sent failed records back into the topic they were read from)
    topic_suffix: Annotated[str, Field(min_length=2, max_length=32, pattern=r"^[._-][A-Za-z0-9._-]+$")] = ".dlq"
    attestation: DlqAttestation = DlqAttestation()
    #: the whole value of a truncated DLQ copy, stored by reference; None: digest and length only
    overflow: DlqOverflow | None = None
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    backoff_initial_ms: Annotated[int, Field(ge=1, le=600_000)] = 50
    #: at most 10 minutes between attempts (the sinks' bound): 10**18 slept for ever
    backoff_max_ms: Annotated[int, Field(ge=1, le=600_000)] = 2000

    _order = model_validator(mode="after")(_backoff_in_order)


class Archive(_Strict):
    """Every emitted envelope is archived for the lakehouse. By default the archive sink
    reads the `.v3` output itself (it holds exactly the reviewed-layout envelopes, each with
    a `prism-source` header); naming a `topic` makes the worker write a separate copy there
    (costs one more produce per message)."""

    enabled: bool = True
    topic: TopicName | None = None
    path: Annotated[str, Field(min_length=1)] = "var/archive"
    partitions: Annotated[int, Field(ge=1, le=1024)] = 4
    #: the archive tap commits its open roll (a Parquet file + manifest) at least this often -
    #: Kafka Connect's S3 sink `rotate.interval.ms`: how stale the lake may be at most, against
    #: more, smaller files (`prism lake optimize` merges them)
    roll_interval_s: Annotated[float, Field(ge=1, le=3600)] = 60.0


# --------------------------------------------------------------------------- producers
# Who may claim what (docs/topologies.md "What a producer may claim"). Checked per message by
# app/security/producers.py: principals in the authenticate stage, key ids in verify_signature.

_PRINCIPAL = re.compile(r"^[!-~]+$")  # printable ASCII, no spaces: what a JWT `sub` looks like in practice
_NAME = re.compile(r"^[A-Za-z0-9._:/@+-]+$")


def _repeated(values: list[Any]) -> list[Any]:
    """The values listed more than once, sorted. Linear: `values.count(v)` for each value made a
    topology of 8,000 sources take 7 s to load (and 200,000 - a 4 MiB file - hours)."""
    from collections import Counter

    return sorted(v for v, n in Counter(values).items() if n > 1)


def _no_repeats(values: list[str], what: str) -> None:
    dupes = _repeated(values)
    if dupes:
        raise ValueError(f"{what} lists {dupes} more than once")


class ProducerSpec(_Strict):
    """One `producers:` entry: these principals (JWT publisher ids, `*` globs) and/or these
    signing key ids may claim these namespaces on these source topics.

    Lists are either omitted or non-empty: an empty list would be an entry that allows nothing,
    which is always a mistake in a security rule. `topics` omitted means every source topic.
    """

    name: Annotated[str, Field(min_length=1, max_length=100)] | None = None  # a label for errors and docs
    principals: list[str] | None = None
    anonymous: bool = False          # messages without a verified token (authenticate policy optional/off)
    key_ids: list[str] | None = None
    namespaces: list[str]
    topics: list[TopicName] | None = None

    @field_validator("principals")
    @classmethod
    def _principals(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is an empty list; name at least one principal or omit the key")
        for p in v:
            if not p or len(p) > 256 or not _PRINCIPAL.match(p):
                raise ValueError(f"{p[:64]!r} is not a principal pattern: printable characters without spaces, "
                                 "1-256 long (e.g. svc-orders or svc-orders-*)")
            if "?" in p or "[" in p or "]" in p:
                raise ValueError(f"{p!r}: only `*` is a wildcard in principal patterns (`?` and `[...]` are not)")
            if "**" in p:
                raise ValueError(f"{p!r}: write one `*`, not `**` (`*` already matches any run of characters)")
        _no_repeats(v, "principals")
        return v

    @field_validator("key_ids")
    @classmethod
    def _key_ids(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is an empty list; name at least one signing key id or omit the key")
        for k in v:
            if not k or len(k) > 256 or not _PRINCIPAL.match(k) or "*" in k:
                raise ValueError(f"{k[:64]!r} is not a key id: the exact `id` of a keyring key (no wildcards, "
                                 "no spaces)")
        _no_repeats(v, "key_ids")
        return v

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("is an empty list; an entry must allow at least one namespace")
        for n in v:
            if not n or len(n) > 249 or not _NAME.match(n):
                raise ValueError(f"{n[:64]!r} is not a namespace name: letters, digits and . _ : / @ + - "
                                 "(exact names; no wildcards)")
        _no_repeats(v, "namespaces")
        return v

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is an empty list; name source topics or omit the key (every source)")
        _no_repeats(v, "topics")
        return v

    @model_validator(mode="after")
    def _someone(self) -> ProducerSpec:
        if self.principals is None and self.key_ids is None and not self.anonymous:
            raise ValueError("an entry must say who it is for: principals, key_ids, or anonymous: true")
        return self


# --------------------------------------------------------------------------- sinks
# Kafka Connect-style sink connectors (app/sinks/, docs/sinks.md). One model per backend,
# discriminated by `type`, so a key that belongs to another backend is an error at load time.
# Connection strings name hosts only: credentials come from the environment or the backend's
# own config files (PGPASSFILE, AWS_* variables), never from a topology file.


def _unique_sink_names(sinks: list[Any]) -> list[Any]:
    names = [s.name for s in sinks]
    dupes = _repeated(names)
    if dupes:
        raise ValueError(f"sink names must be unique (each is a Faust agent and a metrics label); repeated: {dupes}")
    return sinks


class _SinkBase(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=64)]
    input: Literal["v2", "v3"] = "v3"             # which dual-publish output the sink consumes
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 500
    linger_ms: Annotated[int, Field(ge=0, le=60_000)] = 50
    on_outage: Literal["wait", "dlq"] = "wait"
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 5   # per batch, before `dlq` gives up
    backoff_initial_ms: Annotated[int, Field(ge=1, le=60_000)] = 100
    backoff_max_ms: Annotated[int, Field(ge=1, le=600_000)] = 5_000
    timeout_ms: Annotated[int, Field(ge=100, le=600_000)] = 10_000  # one write attempt

    _order = model_validator(mode="after")(_backoff_in_order)


def _url_scheme(*schemes: str, optional: bool = False) -> AfterValidator:
    """A connection string's scheme checked at load: `url: http://h` or `ftp://x` was accepted
    and failed only when the sink first connected, after the worker had started. `optional`:
    a string without `://` passes (libpq's keyword/value form, `host=db dbname=x`)."""

    def check(v: str) -> str:
        if optional and "://" not in v:
            return v
        scheme = v.split("://", 1)[0].lower() if "://" in v else ""
        if scheme not in schemes or not v.split("://", 1)[1].strip():
            raise ValueError(f"{v.split('@')[-1][:100]!r} is not a {' / '.join(s + '://' for s in schemes)} URL")
        return v

    return AfterValidator(check)


#: S3's bucket naming rules: 3-63 lowercase letters, digits, dots and hyphens, a letter or digit
#: at each end (an uppercase or underscore name was accepted and refused by S3 at the first write)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


#: The longest replay-protection TTL (10 years): Redis refuses an expire time past its limit
#: (`ERR invalid expire time`) at every write, which left a sink with a huge TTL in an outage
MAX_DEDUP_TTL_S = 10 * 365 * 86_400


class RedisPubSubSinkSpec(_SinkBase):
    type: Literal["redis-pubsub"]
    url: Annotated[str, _url_scheme("redis", "rediss", "unix")] = "redis://127.0.0.1:6379/0"
    channel: str | None = None                    # default: the envelope's topic
    min_subscribers: Annotated[int, Field(ge=0, le=1_000_000)] = 0  # PUBLISH reaching fewer counts as not delivered
    dedup_ttl_s: Annotated[int, Field(ge=0, le=MAX_DEDUP_TTL_S)] = 86_400  # 0: no replay protection
    #: the server's proto-max-bulk-len (Redis's default 512 MB): a larger message goes to the DLQ
    max_bulk_bytes: Annotated[int, Field(ge=1024, le=2**63 - 1)] = 512 * 1024 * 1024


class RedisStreamSinkSpec(_SinkBase):
    type: Literal["redis-stream"]
    url: Annotated[str, _url_scheme("redis", "rediss", "unix")] = "redis://127.0.0.1:6379/0"
    stream: str | None = None                     # default: the envelope's topic
    maxlen: Annotated[int, Field(ge=1, le=2**63 - 1)] | None = None  # approximate trim (XADD MAXLEN ~)
    dedup_ttl_s: Annotated[int, Field(ge=1, le=MAX_DEDUP_TTL_S)] = 86_400
    #: the server's proto-max-bulk-len (Redis's default 512 MB): a larger field goes to the DLQ
    max_bulk_bytes: Annotated[int, Field(ge=1024, le=2**63 - 1)] = 512 * 1024 * 1024


class PostgresSinkSpec(_SinkBase):
    type: Literal["postgres"]
    dsn: Annotated[str, _url_scheme("postgresql", "postgres", optional=True)] = "postgresql://127.0.0.1:5432/postgres"
    db_schema: Annotated[str, Field(alias="schema", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")] = "public"
    create_table: bool = True
    #: the largest envelope document (JSON text) a row takes; default jsonb's own maximum,
    #: 268435455 bytes (PostgreSQL refuses a larger jsonb value; any field is capped at 1 GB)
    max_document_bytes: Annotated[int, Field(ge=1024, le=268_435_455)] = 268_435_455


class NatsSinkSpec(_SinkBase):
    type: Literal["nats"]
    url: Annotated[str, _url_scheme("nats", "tls", "ws", "wss")] = "nats://127.0.0.1:4222"
    stream: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]
    subject: str | None = None                    # default: the envelope's topic
    create_stream: bool = True
    stream_subjects: list[str] | None = None      # for create_stream; default: the sink's subjects
    duplicate_window_s: Annotated[int, Field(ge=1, le=7 * 86_400)] = 120


class S3SinkSpec(_SinkBase):
    type: Literal["s3"]
    bucket: Annotated[str, Field(min_length=3, max_length=63, pattern=_BUCKET.pattern)]
    endpoint: Annotated[str, _url_scheme("http", "https")] | None = None  # e.g. http://127.0.0.1:9000; None: AWS
    region: str = "us-east-1"
    prefix: str = "events"
    create_bucket: bool = False
    concurrency: Annotated[int, Field(ge=1, le=64)] = 8


SinkSpec = Annotated[
    RedisPubSubSinkSpec | RedisStreamSinkSpec | PostgresSinkSpec | NatsSinkSpec | S3SinkSpec,
    Field(discriminator="type"),
]


_NAMESPACE_NAME = re.compile(r"^[A-Za-z0-9._:/@+-]{1,256}$")


class NamespaceSettings(_Strict):
    """Per-namespace settings (`namespaces: {order-events: {validation: strict}}`): a message's
    namespace is its envelope's, so one topology can roll validation out namespace by namespace."""

    validation: ValidationMode | None = None  # None: the topology's `validation`


# --------------------------------------------------------------------------- encryption
# The worker's keys (docs/encryption.md, "Encryption in the worker"). Checked at load here
# (shape, algorithm, provider fit); the key files themselves at start-up by
# app/security/worker_encryption.py, every problem at once.


class KmsSettings(_Strict):
    """`encryption.kms` for `provider: aws-kms` (app.security.keys.AwsKmsProvider)."""

    default_key_id: str | None = None                # key ARN, key id or alias/...
    namespace_keys: dict[str, str] = {}              # namespace -> key
    region: str | None = None
    endpoint_url: str | None = None
    encryption_context: dict[str, str] = {}


class EncryptionSettings(_Strict):
    """`encryption:` - which keys the worker uses to encrypt classified payloads that arrived
    in plaintext (instead of sending them to the DLQ as `policy_violation`).

    The block holds key *references* only (a provider and key ids or rotation groups); the key
    material stays in the provider. For asymmetric, post-quantum and hybrid algorithms the
    worker holds public keys only, so it can encrypt for consumers but never decrypt.
    """

    #: file | k8s-secrets | aws-kms (checked in `_check`, with the rest, so every problem is listed)
    provider: str
    #: file: a keyring file; k8s-secrets: the directory the Secret is mounted at
    path: str | None = None
    #: k8s-secrets: how often (at most) the mount is checked for a rotated Secret
    refresh_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    kms: KmsSettings | None = None
    #: classifications the worker encrypts when a message arrives with them in plaintext
    encrypt_unencrypted: list[str]
    algorithm: str
    #: a fixed key id (or public key id); None: the provider's current key of the rotation group
    key_id: str | None = None
    #: the rotation group (default: the algorithm's key type), per envelope namespace
    purpose: str | None = None

    @model_validator(mode="after")
    def _check(self) -> EncryptionSettings:
        from app.errors import AlgorithmError
        from app.security.algorithms import SYMMETRIC, lookup

        problems: list[str] = []
        if self.provider not in ("file", "k8s-secrets", "aws-kms"):
            problems.append(f"provider: {self.provider!r} is not one of file, k8s-secrets, aws-kms")
        unknown = [c for c in self.encrypt_unencrypted if c not in CLASSIFICATIONS]
        if unknown:
            problems.append(f"encrypt_unencrypted: {unknown} are not classifications (one of {list(CLASSIFICATIONS)})")
        if not self.encrypt_unencrypted:
            problems.append("encrypt_unencrypted: is empty, so the worker would never use these keys - list the "
                            "classifications to encrypt (e.g. [confidential, restricted]) or remove `encryption:`")
        elif len(set(self.encrypt_unencrypted)) != len(self.encrypt_unencrypted):
            problems.append(f"encrypt_unencrypted: {self.encrypt_unencrypted} names a classification twice")
        spec = None
        try:
            spec = lookup(self.algorithm)
        except AlgorithmError as exc:
            problems.append(f"algorithm: {exc.message}" + (f" - {exc.hint}" if exc.hint else ""))
        if self.provider in ("file", "k8s-secrets"):
            if not self.path:
                problems.append(f"path: provider {self.provider} needs it - the "
                                + ("keyring file" if self.provider == "file" else "directory the Secret is mounted at"))
            if self.kms is not None:
                problems.append(f"kms: only for provider aws-kms (this block's provider is {self.provider})")
        elif self.provider == "aws-kms":
            if self.path:
                problems.append("path: not used by provider aws-kms - remove it, or set kms.default_key_id")
            if self.kms is None or not (self.kms.default_key_id or self.kms.namespace_keys or self.key_id):
                problems.append("kms: provider aws-kms needs kms.default_key_id or kms.namespace_keys (or key_id)")
            if spec is not None and spec.pattern != SYMMETRIC:
                problems.append(f"algorithm: {spec.name} is {spec.pattern.replace('_', '-')}; provider aws-kms "
                                "serves symmetric data keys only - use aes-256-gcm, or a file / k8s-secrets "
                                "provider holding the recipients' public keys")
        if "refresh_s" in self.model_fields_set and self.provider != "k8s-secrets":
            problems.append(f"refresh_s: only provider k8s-secrets re-reads its keys (this one is {self.provider})")
        if problems:
            raise ValueError("; ".join(f"encryption.{p}" for p in problems))
        return self


class Topology(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=200)]
    namespace: NamespaceName
    sources: Annotated[list[Source], Field(min_length=1)]
    stages: list[StageSpec]
    outputs: Outputs = Outputs()
    dlq: Dlq = Dlq()
    archive: Archive = Archive()
    #: Kafka Streams' `processing.guarantee`: at_least_once, or exactly_once (Kafka transactions;
    #: docs/operations.md, "Processing guarantees"); PRISM_PROCESSING_GUARANTEE overrides it
    processing_guarantee: Literal["at_least_once", "exactly_once"] = "at_least_once"
    #: exactly_once: Kafka's `transaction.timeout.ms` of the transactional producers - how long a
    #: dead worker's open transaction holds back read_committed readers when no new owner fences
    #: it sooner; a transaction open longer (a worker paused that long) is aborted by the broker
    #: and its batch read again. At most the broker's `transaction.max.timeout.ms` (15 min default).
    transaction_timeout_ms: Annotated[int, Field(ge=1_000, le=900_000)] = 30_000
    base_dir: Path = Path(".")
    sinks: Annotated[list[SinkSpec], AfterValidator(_unique_sink_names)] = []
    #: who may claim which namespaces on which source topics; None: only the source-topic binding
    producers: list[ProducerSpec] | None = None
    #: the worker's encryption keys: encrypt classified payloads that arrive in plaintext
    encryption: EncryptionSettings | None = None
    #: payload schema validation for every namespace (RFC-030 rollout: off -> warn -> strict)
    validation: ValidationMode = "off"
    #: per-namespace overrides, keyed by the envelope's namespace
    namespaces: dict[str, NamespaceSettings] = {}

    @model_validator(mode="after")
    def _check_all(self) -> Topology:
        """Every check across keys, each one run even when another failed: a topology with a bad
        stage order and a bad `producers:` entry reports both at once (pydantic stops a model's
        chain of validators at the first that raises)."""
        problems: list[str] = []
        for check in (self._check_order, self._check_sources, self._check_topics, self._check_validation,
                      self._check_encryption, self._check_producers):
            try:
                check()
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("\n".join(problems))  # load_topology reports each as its own problem
        return self

    def _check_validation(self) -> Topology:
        """Every problem of the validation settings at once: a mode other than off needs the
        schema it validates against, and the debug switch `validate_payloads` (strict by
        another name) may not contradict it."""
        problems: list[str] = []
        for ns in self.namespaces:
            if not _NAMESPACE_NAME.fullmatch(ns):
                problems.append(f"namespaces.{ns[:64]!r}: not a namespace name (letters, digits and . _ : / @ + -)")
        modes = {"validation": self.validation} | {f"namespaces.{ns}.validation": s.validation
                                                   for ns, s in self.namespaces.items() if s.validation}
        enrich = self.stage("enrich")
        ref = enrich.schema_ if enrich is not None else None
        for where, mode in modes.items():
            if mode != "off" and ref is None:
                problems.append(f"{where}: {mode} needs a schema to validate against - add "
                                "`- enrich: {schema: {...}}` to the stages, or set validation: off")
        if ref is not None and ref.validate_payloads and any(m != "off" for m in modes.values()):
            problems.append("stages.enrich.schema.validate_payloads: the older switch for strict validation of every "
                            "namespace; with `validation` settings it is ambiguous - remove it and write "
                            "`validation: strict`")
        if problems:
            raise ValueError("\n".join(problems))  # one problem each (load_topology)
        return self

    def validation_modes(self) -> tuple[str, dict[str, str]]:
        """(default mode, namespace -> mode) as the enrich stage applies them. The older
        `validate_payloads` switch keeps its own path (DLQ reason `payload_schema_mismatch`)."""
        return self.validation, {ns: s.validation for ns, s in self.namespaces.items() if s.validation}


    def _check_encryption(self) -> Topology:
        """`encryption:` works in the policy stage and must agree with its algorithm policy."""
        enc = self.encryption
        if enc is None:
            return self
        from app.errors import AlgorithmError
        from app.security.algorithms import AlgorithmPolicy

        policy = self.stage("policy")
        if policy is None:
            raise ValueError("encryption: the worker encrypts in the policy stage, which this topology does not "
                             "have - add `- policy: {}` to the stages, or remove `encryption:`")
        problems: list[str] = []
        try:
            AlgorithmPolicy(fips_mode=policy.fips_mode, allowlist=set(policy.allowed_algorithms)
                            if policy.allowed_algorithms else None).check(enc.algorithm)
        except AlgorithmError as exc:
            problems.append(f"encryption.algorithm: {exc.message} (stages.policy allowed_algorithms / fips_mode) - "
                            "pick an algorithm the policy stage allows")
        if problems:
            raise ValueError("\n".join(problems))  # one problem each (load_topology)
        return self


    def _check_sources(self) -> Topology:
        topics = [s.topic for s in self.sources]
        dupes = _repeated(topics)
        every_topic = set(topics)  # once: a set per source made loading quadratic in the sources
        if dupes:
            raise ValueError(f"sources: topic(s) {dupes} listed twice; each source topic once")
        problems: list[str] = []
        for i, src in enumerate(self.sources):
            if src.topic in src.topic_aliases:
                raise ValueError(f"sources[{i}].topic_aliases: {src.topic!r} is the source topic itself; list only "
                                 "other names")
            repeated = _repeated(src.topic_aliases)
            if repeated:
                raise ValueError(f"sources[{i}].topic_aliases: {repeated} listed twice; list each name once")
            if src.lnmp is not None and src.format not in ("auto", "lnmp"):
                problems.append(f"sources[{i}].lnmp: the source's format is {src.format!r}, which never reads LNMP, "
                                "so these settings would never apply - remove `lnmp:` or set format to auto or lnmp")
            stolen = sorted(set(src.topic_aliases) & every_topic)
            if stolen:
                raise ValueError(
                    f"sources[{i}].topic_aliases: {stolen} are other sources of this topology; an alias would "
                    f"let envelopes of that source be replayed onto {src.topic!r} - remove the alias")
        if problems:
            raise ValueError("\n".join(problems))  # one problem each (load_topology)
        return self


    def _check_topics(self) -> Topology:
        """Every topic the topology reads or writes has one role: a source's DLQ or output that
        is another source (or its output, or the archive topic) made the worker write into a topic
        it reads - a loop - or mix DLQ records into consumers' outputs. And no two names differ
        only by `.` against `_` (Kafka refuses to create the second: their metric names collide).
        Lengths need no check here: a source topic (200) plus the longest suffix (32) and
        `.replayed` stay under Kafka's 249."""
        roles: dict[str, list[str]] = {}
        listed: set[str] = set()
        for i, src in enumerate(self.sources):
            if src.topic in listed:
                continue  # a source listed twice: `_check_sources` says so, once
            listed.add(src.topic)
            roles.setdefault(src.topic, []).append(f"sources[{i}].topic")
            for layout in self.outputs.layouts:
                roles.setdefault(f"{src.topic}.{layout}", []).append(f"the {layout} output of sources[{i}]")
            dlq = src.topic + self.dlq.topic_suffix
            roles.setdefault(dlq, []).append(f"the DLQ of sources[{i}]")
            roles.setdefault(dlq + ".replayed", []).append(f"the DLQ replay ledger of sources[{i}]")
        if self.archive.enabled and self.archive.topic:
            roles.setdefault(self.archive.topic, []).append("archive.topic")
        problems = []
        for name, what in roles.items():
            if len(what) > 1:
                # led by the key that made the clash (load_topology finds its line)
                key = next((w for w in reversed(what) if w.endswith(".topic")), "dlq.topic_suffix")
                problems.append(f"{key}: topic {name!r} is {' and '.join(what)} - each topic has one role; rename "
                                "the topic, or change dlq.topic_suffix / archive.topic")
        folded: dict[str, str] = {}
        for name in roles:
            other = folded.setdefault(name.replace(".", "_"), name)
            if other != name:
                problems.append(f"topics {other!r} and {name!r} differ only by '.' against '_', which Kafka "
                                "refuses (their metric names collide) - rename one")
        if problems:
            raise ValueError("\n".join(problems))  # one problem each (load_topology)
        return self

    def _check_producers(self) -> Topology:
        if self.producers is None:
            return self
        if not self.producers:
            raise ValueError("producers: is an empty list, which would reject every message; declare at least "
                             "one entry, or remove `producers:` to keep only the source-topic binding")
        stages = {s.name for s in self.stages}
        sources = {s.topic for s in self.sources}
        problems: list[str] = []
        if "authenticate" not in stages:
            problems.append("producers: needs the authenticate stage, where a message's principal is known and "
                            "checked - add `- authenticate: {jwks: ..., policy: optional}` (anonymous producers "
                            "then need an entry with anonymous: true)")
        auth, vs = self.stage("authenticate"), self.stage("verify_signature")
        for i, p in enumerate(self.producers):
            if p.key_ids is not None and vs is None:
                problems.append(f"producers[{i}].key_ids: needs the verify_signature stage, which is where a key "
                                "id is verified and checked - add it, or remove key_ids")
            elif p.key_ids is not None and vs.policy == "off":
                problems.append(f"producers[{i}].key_ids: verify_signature.policy is off, so no key is ever "
                                "verified and this binding would never be enforced - set the policy to optional "
                                "or required, or remove key_ids")
            if p.principals is not None and auth is not None and auth.policy == "off":
                problems.append(f"producers[{i}].principals: authenticate.policy is off, so no token is verified "
                                "and every message is anonymous - set the policy to optional or required, or "
                                "use anonymous: true")
            unknown = sorted(set(p.topics or ()) - sources)
            if unknown:
                problems.append(f"producers[{i}].topics: {unknown} are not source topics of this topology "
                                f"(sources: {sorted(sources)}); the check compares the topic a message was read "
                                "from")
        if problems:
            raise ValueError("\n".join(problems))  # one problem each (load_topology)
        return self


    def _check_order(self) -> Topology:
        names = [s.name for s in self.stages]
        if not names or names[0] != "normalize":
            raise ValueError("stages must start with `normalize` (every later stage works on an envelope)")
        if len(set(names)) != len(names):
            raise ValueError(f"a stage appears twice: {names}")
        ranks = [STAGE_ORDER.index(n) for n in names]
        if ranks != sorted(ranks):
            raise ValueError(
                f"stages must keep the order {' -> '.join(STAGE_ORDER)}: authentication and signature checks "
                f"come before any stage that may touch the payload (memo-031 'reject cheaply'); got {names}")
        return self

    def stage(self, name: str) -> Any:
        for s in self.stages:
            if s.name == name:
                return s.settings
        return None

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else (self.base_dir / p)

    def accepted_topics(self) -> dict[str, frozenset[str]]:
        """Source topic -> the envelope topics a message read from it may claim (itself + aliases)."""
        return {s.topic: frozenset([s.topic, *s.topic_aliases]) for s in self.sources}

    def topics(self) -> dict[str, int]:
        """Every topic this topology reads or writes, with its partition count."""
        out: dict[str, int] = {}
        for s in self.sources:
            out[s.topic] = s.partitions
            for layout in self.outputs.layouts:
                out[f"{s.topic}.{layout}"] = s.partitions
            out[s.topic + self.dlq.topic_suffix] = s.partitions
        if self.archive.enabled and self.archive.topic:
            out[self.archive.topic] = self.archive.partitions
        return out

    def topic_configs(self, *, source_retention_ms: int | None = None) -> dict[str, dict[str, str]]:
        """Configs for the topics Prism creates: source topics get their short `retention.ms`
        (`source_retention_ms` overrides every source's, as `prism topics create --source-retention`)."""
        out: dict[str, dict[str, str]] = {}
        for s in self.sources:
            ms = source_retention_ms if source_retention_ms is not None else s.retention_ms
            if ms is not None:
                out[s.topic] = {"retention.ms": str(ms)}
        return out

    def source_retention_limits(self) -> dict[str, int]:
        """Source topic -> the longest retention (ms) the topology allows (the worker's start-up check)."""
        return {s.topic: ms for s in self.sources if (ms := s.retention_ms) is not None}

    def archive_source_topics(self) -> list[str]:
        """Where the archive sink reads: the separate archive topic, or every `.v3` output."""
        if not self.archive.enabled:
            return []
        if self.archive.topic:
            return [self.archive.topic]
        return [f"{s.topic}.v3" for s in self.sources] if "v3" in self.outputs.layouts else \
            [f"{s.topic}.{self.outputs.layouts[0]}" for s in self.sources]


def _parse_stages(raw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """(the stages that parsed, one problem per key of every stage that did not)."""
    if not isinstance(raw, list):
        return [], ["stages: must be a list like [- normalize: {}, - validate: {}]"]
    out: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            name, settings = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, settings = next(iter(item.items()))
            settings = settings or {}
        else:
            problems.append(f"stages[{i}]: must be a stage name or a one-key mapping `name: {{settings}}`")
            continue
        if not isinstance(name, str) or name not in _STAGE_MODELS:
            close = _closest(str(name), STAGE_ORDER)
            problems.append(f"stages[{i}]: unknown stage {str(name)[:64]!r}"
                            + (f" - did you mean {close!r}?" if close else "")
                            + f" (known stages: {', '.join(STAGE_ORDER)})")
            continue
        try:
            out.append({"name": name, "settings": _STAGE_MODELS[name].model_validate(settings)})
        except ValidationError as exc:
            problems.extend(f"stages[{i}].{name}" + (f".{_loc(e['loc'])}" if e["loc"] else "")
                            + f": {_say(e, [_STAGE_MODELS[name]])}" for e in exc.errors())
    return out, problems


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _closest(word: str, choices: Any) -> str | None:
    """The choice a typo most likely meant (difflib's ratio, as Python's own "Did you mean")."""
    import difflib

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The topology models a field's annotation holds (through Annotated, unions, lists, dicts)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _models_at(roots: list[type[BaseModel]], loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The models whose keys are allowed at `loc` (a pydantic error location). A part that names
    no field - a list index, a dict key, a union's tag - keeps the models it was found in."""
    models = roots
    for part in loc:
        if not isinstance(part, str):
            continue
        inner = [m for model in models for name, f in model.model_fields.items() if part in (name, f.alias)
                 for m in _models_in(f.annotation)]
        if inner:
            models = inner
    return models


def _keys_of(models: list[type[BaseModel]]) -> list[str]:
    return sorted({f.alias or name for m in models for name, f in m.model_fields.items() if name != "base_dir"})


def _say(error: Any, roots: list[type[BaseModel]]) -> str:
    """A pydantic error as a person fixes it: an unknown key with the key it most likely meant
    (or the keys allowed there), a missing key as missing - not "Extra inputs are not permitted"."""
    kind, loc = error["type"], tuple(error["loc"])
    if kind == "extra_forbidden" and loc and isinstance(loc[-1], str):
        keys = _keys_of(_models_at(roots, loc[:-1]))
        close = _closest(loc[-1], keys)
        if close:
            return f"unknown key - did you mean {close!r}?"
        return "unknown key" + (f" (the keys here: {', '.join(keys)})" if keys else "")
    if kind == "missing":
        return "required, and missing"
    if kind == "string_pattern_mismatch":
        pattern = str((error.get("ctx") or {}).get("pattern", ""))
        words = _PATTERN_WORDS.get(pattern, f"text matching {pattern}")
        return f"{str(error.get('input'))[:100]!r} is not allowed here: use {words}"
    if kind in _WANTED and "input" in error:
        # what YAML made of the value: `name: 2024-01-01` is a date, `partitions: "4"` text, `x:` null
        return f"should be {_WANTED[kind]}, not {_yaml_kind(error['input'])}"
    if kind == "union_tag_invalid":  # a sink `type:` that is no sink type
        ctx = error.get("ctx") or {}
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",") if t.strip(" '")]
        close = _closest(str(ctx.get("tag", "")), tags)
        return (f"type {str(ctx.get('tag', ''))[:64]!r} is not a sink type"
                + (f" - did you mean {close!r}?" if close else "") + f" (one of {', '.join(tags)})")
    return str(error["msg"]).removeprefix("Value error, ")


#: The name rules of the topology, as a person reads them (pydantic says the regular expression)
_PATTERN_WORDS = {
    r"^[A-Za-z0-9._-]+$": "letters, digits, '.', '_' and '-' (a Kafka topic name)",
    r"^[A-Za-z0-9._:/@+-]+$": "letters, digits and . _ : / @ + - (a namespace name)",
    r"^[._-][A-Za-z0-9._-]+$": "'.', '_' or '-' then letters, digits, '.', '_' or '-' (e.g. .dlq)",
    r"^[a-z0-9][a-z0-9-]*$": "lowercase letters, digits and '-', starting with a letter or digit (e.g. orders-created)",
    r"^[A-Za-z_][A-Za-z0-9_]{0,62}$": "a PostgreSQL identifier: letters, digits and '_', not starting with a digit",
    r"^[A-Za-z0-9_-]+$": "letters, digits, '_' and '-'",
    r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$": "an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-', "
                                           "a letter or digit at each end",
}
#: pydantic's type errors, as what the key takes
_WANTED = {"string_type": "text", "int_type": "a whole number", "float_type": "a number", "bool_type": "true or false",
           "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping of settings"}


def _yaml_kind(value: Any) -> str:
    """How YAML read a value, for "should be a valid integer, not the text '4'"."""
    shown = repr(value)[:64]
    if value is None:
        return "empty (YAML null): give a value"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()} (YAML reads on/off/yes/no/true/false so): quote it if it is text"
    if isinstance(value, datetime | date):
        return f"a date ({value}) - YAML reads dates: quote it (\"{value}\") to make it text"
    if isinstance(value, int | float):
        return f"the number {shown}" + (" - quote it to make it text" if isinstance(value, int) else "")
    if isinstance(value, str):
        return f"the text {shown}" + (" - write the number without quotes" if value.strip().lstrip("-").isdigit()
                                      else "")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


_KEY_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\[\d+\]|\.[A-Za-z_][\w-]*)*")


def _path_of(problem: str) -> tuple[str | int, ...]:
    """The key path a problem starts with (`sources[0].partitions: ...` -> sources, 0, partitions)."""
    m = _KEY_PATH.match(problem)
    if not m:
        return ()
    out: list[str | int] = []
    for part in re.findall(r"\[(\d+)\]|([^.\[\]]+)", m.group(0)):
        out.append(int(part[0]) if part[0] else part[1])
    return tuple(out)


def _line_of(problem: str, lines: dict[tuple[str | int, ...], int]) -> int | None:
    """The line of the deepest key of the problem's path that the file has (pydantic adds parts
    the YAML does not have - a union's tag, `str`/`int` of a union - which are skipped)."""
    where: tuple[str | int, ...] = ()
    line = None
    for part in _path_of(problem):
        if (*where, part) in lines:
            where = (*where, part)
            line = lines[where]
    return line


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology file. Raises `ConfigError` listing every problem, each with
    the file and the line of the key it is about."""
    from .config_files import key_lines, parse_config_text, read_text

    path = Path(path)
    text = read_text(path, what="topology file",
                     missing_hint="pass an existing file, e.g. --topology topologies/orders-created.yaml")
    raw = parse_config_text(text, what="topology file", source=str(path))
    if not isinstance(raw, dict):
        kinds = {list: "a list", str: "a single string", int: "a number", float: "a number", bool: "a boolean"}
        got = ("is empty" if raw is None or not text.strip() else
               f"is {kinds.get(type(raw), type(raw).__name__)}, not a mapping")
        raise ConfigError(f"a topology must be a YAML mapping of keys (name, namespace, sources, stages, ...); this "
                          f"file {got}", path=str(path),
                          hint="start from topologies/orders-created.yaml (docs/topologies.md lists every key)")
    # Every problem in one pass: the stages are parsed one by one (a bad stage does not hide the
    # next), and the rest of the file is validated even when a stage is bad - with the stages
    # that parsed, keeping only the errors of other keys (the checks across stages would judge a
    # list with holes). The checks across the whole file run once every key is valid on its own.
    problems: list[str] = []
    raw = dict(raw)
    stage_problems: list[str] = []
    if "stages" in raw:
        raw["stages"], stage_problems = _parse_stages(raw["stages"])
    raw["base_dir"] = path.parent
    try:
        topo = Topology.model_validate(raw)
    except ValidationError as exc:
        for e in exc.errors():
            if stage_problems and (not e["loc"] or e["loc"][0] == "stages"):
                continue
            msg = _say(e, [Topology])
            problems.extend(f"{_loc(e['loc'])}: {one}" if e["loc"] else one for one in msg.split("\n"))
    else:
        if not stage_problems:
            return topo
    problems = stage_problems + problems
    lines = key_lines(text)

    def where(problem: str) -> str:
        line = _line_of(problem, lines)
        return f"{path}:{line}" if line else str(path)

    hint = "see docs/topologies.md for every key and its allowed values"
    message = f"invalid topology ({len(problems)} problem(s)): " + "; ".join(problems)
    if len(problems) == 1:
        raise ConfigError(message, path=where(problems[0]), hint=hint)
    raise ConfigProblems(message, [ConfigError(f"invalid topology: {p}", path=where(p), hint=hint) for p in problems],
                         path=str(path), hint=hint, summary=f"{len(problems)} problems in topology {path}")
