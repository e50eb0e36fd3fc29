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

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.errors import ConfigError

STAGE_ORDER = ("normalize", "validate", "authenticate", "verify_signature", "policy", "dedup", "enrich")
InputFormat = Literal["auto", "prism", "cloudevents", "kafka-headers", "nats-headers", "redis-json", "lnmp", "raw"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    topic: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]
    format: InputFormat = "auto"
    partitions: Annotated[int, Field(ge=1, le=1024)] = 4
    namespace: str | None = None  # overrides the topology default for legacy inputs


class NormalizeStage(_Strict):
    default_content_type: str | None = None


class ValidateStage(_Strict):
    max_future_skew_s: Annotated[int, Field(ge=0)] = 300
    max_age_days: Annotated[int, Field(ge=1)] = 365
    max_id_length: Annotated[int, Field(ge=16, le=4096)] = 128


class AuthenticateStage(_Strict):
    policy: Literal["required", "optional", "off"] = "required"
    jwks: str  # path to an RFC 7517 JWKS file
    issuer: str | list[str] | None = None
    audience: str | None = None
    algorithms: list[Literal["HS256", "RS256", "EdDSA"]] = ["RS256", "EdDSA"]
    leeway_s: Annotated[int, Field(ge=0, le=600)] = 30
    publisher_id_claim: str = "sub"
    publisher_team_claim: str = "team"


class VerifySignatureStage(_Strict):
    policy: Literal["required", "optional", "off"] = "optional"
    keyring: str  # path to a signing keyring file (docs/signing.md, "Keyring files")
    #: Accept legacy-scope signatures (memo-031 Option 2: the envelope minus its security
    #: context). A DOWNGRADE RISK: such a signature does not cover publisher, classification,
    #: PII flag or encryption metadata, so anyone can rewrite those on a legacy-signed
    #: envelope. Off by default (DLQ reason `legacy_signature_scope`); turn it on only while
    #: old producers migrate (docs/signing.md).
    accept_legacy_scope: bool = False


class PolicyStage(_Strict):
    default_priority: Annotated[int, Field(ge=0, le=10)] = 5
    require_encryption_for: list[Literal["public", "internal", "confidential", "restricted"]] = [
        "confidential", "restricted"]
    allowed_algorithms: list[str] | None = None  # None: every non-deprecated algorithm
    fips_mode: bool = False
    expired: Literal["drop", "dlq"] = "drop"


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


class Outputs(_Strict):
    layouts: list[Literal["v2", "v3"]] = ["v2", "v3"]
    sign: bool = True
    signing_key_id: str | None = None      # worker's key in the keyring; default: keyring's current
    keyring: str | None = None

    @field_validator("layouts")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if not v or len(set(v)) != len(v):
            raise ValueError("must name v2, v3 or both, each once")
        return v


class Dlq(_Strict):
    topic_suffix: str = ".dlq"
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    backoff_initial_ms: Annotated[int, Field(ge=1)] = 50
    backoff_max_ms: Annotated[int, Field(ge=1)] = 2000


class Archive(_Strict):
    """Every emitted envelope is archived for the lakehouse. By default the archive sink
    reads the `.v3` output itself (it holds exactly the reviewed-layout envelopes, each with
    a `prism-source` header); naming a `topic` makes the worker write a separate copy there
    (costs one more produce per message)."""

    enabled: bool = True
    topic: str | None = None
    path: str = "var/archive"
    partitions: Annotated[int, Field(ge=1, le=1024)] = 4


# --------------------------------------------------------------------------- sinks
# Kafka Connect-style sink connectors (app/sinks/, docs/sinks.md). One model per backend,
# discriminated by `type`, so a key that belongs to another backend is an error at load time.
# Connection strings name hosts only: credentials come from the environment or the backend's
# own config files (PGPASSFILE, AWS_* variables), never from a topology file.


def _unique_sink_names(sinks: list[Any]) -> list[Any]:
    names = [s.name for s in sinks]
    dupes = sorted({n for n in names if names.count(n) > 1})
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


class RedisPubSubSinkSpec(_SinkBase):
    type: Literal["redis-pubsub"]
    url: str = "redis://127.0.0.1:6379/0"
    channel: str | None = None                    # default: the envelope's topic
    min_subscribers: Annotated[int, Field(ge=0)] = 0  # PUBLISH reaching fewer counts as not delivered
    dedup_ttl_s: Annotated[int, Field(ge=0)] = 86_400  # 0: no replay protection


class RedisStreamSinkSpec(_SinkBase):
    type: Literal["redis-stream"]
    url: str = "redis://127.0.0.1:6379/0"
    stream: str | None = None                     # default: the envelope's topic
    maxlen: Annotated[int, Field(ge=1)] | None = None  # approximate trim (XADD MAXLEN ~)
    dedup_ttl_s: Annotated[int, Field(ge=1)] = 86_400


class PostgresSinkSpec(_SinkBase):
    type: Literal["postgres"]
    dsn: str = "postgresql://127.0.0.1:5432/postgres"
    db_schema: Annotated[str, Field(alias="schema", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")] = "public"
    create_table: bool = True


class NatsSinkSpec(_SinkBase):
    type: Literal["nats"]
    url: str = "nats://127.0.0.1:4222"
    stream: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]
    subject: str | None = None                    # default: the envelope's topic
    create_stream: bool = True
    stream_subjects: list[str] | None = None      # for create_stream; default: the sink's subjects
    duplicate_window_s: Annotated[int, Field(ge=1, le=7 * 86_400)] = 120


class S3SinkSpec(_SinkBase):
    type: Literal["s3"]
    bucket: Annotated[str, Field(min_length=3, max_length=63)]
    endpoint: str | None = None                   # e.g. http://127.0.0.1:9000; None: AWS
    region: str = "us-east-1"
    prefix: str = "events"
    create_bucket: bool = False
    concurrency: Annotated[int, Field(ge=1, le=64)] = 8


SinkSpec = Annotated[
    RedisPubSubSinkSpec | RedisStreamSinkSpec | PostgresSinkSpec | NatsSinkSpec | S3SinkSpec,
    Field(discriminator="type"),
]


class Topology(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    namespace: str
    sources: Annotated[list[Source], Field(min_length=1)]
    stages: list[StageSpec]
    outputs: Outputs = Outputs()
    dlq: Dlq = Dlq()
    archive: Archive = Archive()
    base_dir: Path = Path(".")
    sinks: Annotated[list[SinkSpec], AfterValidator(_unique_sink_names)] = []

    @model_validator(mode="after")
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

    def archive_source_topics(self) -> list[str]:
        """Where the archive sink reads: the separate archive topic, or every `.v3` output."""
        if not self.archive.enabled:
            return []
        if self.archive.topic:
            return [self.archive.topic]
        return [f"{s.topic}.v3" for s in self.sources] if "v3" in self.outputs.layouts else \
            [f"{s.topic}.{self.outputs.layouts[0]}" for s in self.sources]


def _parse_stages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ValueError("`stages` must be a list like [- normalize: {}, - validate: {}]")
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            name, settings = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, settings = next(iter(item.items()))
            settings = settings or {}
        else:
            raise ValueError(f"stages[{i}] must be a stage name or a one-key mapping `name: {{settings}}`")
        if name not in _STAGE_MODELS:
            raise ValueError(f"stages[{i}]: unknown stage {name!r}; known stages: {', '.join(STAGE_ORDER)}")
        try:
            out.append({"name": name, "settings": _STAGE_MODELS[name].model_validate(settings)})
        except ValidationError as exc:
            raise ValueError("; ".join(f"stages[{i}].{name}.{_loc(e['loc'])}: {e['msg']}" for e in exc.errors())) \
                from None
    return out


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_topology(path: str | Path) -> Topology:
    """Load and validate a topology file. Raises `ConfigError` listing every problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read topology file: {exc.strerror}", path=str(path),
                          hint="pass an existing file, e.g. --topology topologies/orders-created.yaml") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"not valid YAML: {getattr(exc, 'problem', exc)}", path=where,
                          hint="check indentation and quoting at that line") from exc
    if not isinstance(raw, dict):
        raise ConfigError("a topology must be a YAML mapping", path=str(path),
                          hint="start from topologies/orders-created.yaml")
    problems: list[str] = []
    try:
        raw = dict(raw)
        if "stages" in raw:
            try:
                raw["stages"] = _parse_stages(raw["stages"])
            except ValueError as exc:
                problems.append(str(exc))
        raw["base_dir"] = path.parent
        if not problems:
            return Topology.model_validate(raw)
    except ValidationError as exc:
        for e in exc.errors():
            msg = e["msg"].removeprefix("Value error, ")
            problems.append(f"{_loc(e['loc'])}: {msg}")
    raise ConfigError(f"invalid topology ({len(problems)} problem(s)): " + "; ".join(problems), path=str(path),
                      hint="see docs/topologies.md for every key and its allowed values")
