"""The registry's rules, independent of transport (REST, CLI, tests call the same methods).

- Versions are immutable: a subject version, once written, never changes; re-registering
  identical content (same canonical hash) is idempotent and returns the existing version.
- Compatibility is checked against earlier live versions under the effective mode
  (subject config -> namespace config -> global -> default BACKWARD).
- PII policy (enforce/warn/off) is applied at registration; a ``require_pii_tags`` policy
  (RFC-030 "Migration Path" phase 3) refuses a schema with any leaf field left untagged.
  ``require_schema`` (phase 2) is stored and resolved here but enforced where topics are
  used - the worker at start-up, the SDK at publish - since the registry creates no topics.
- Breaking changes may be allowed through an *approved* approval request when the policy
  requires approval; otherwise they are rejected.
- Every mutation is written to the audit log (who, what, when).
- Reads are served from in-process caches: schema texts by id never change, so that cache
  needs no invalidation; subject/version lookups are invalidated on delete/register - by
  this process directly, and in sibling worker processes or other replicas on the same store
  through the store's change token (:meth:`Registry.sync`; SQLite's ``data_version``,
  PostgreSQL ``LISTEN``/``NOTIFY``).
- ``self.metrics`` (:class:`~app.schema.metrics.RegistryMetrics`) counts cache lookups,
  compatibility verdicts, rejections by reason and PII-policy rejections for ``/metrics``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.decimal_text import decimal
from app.schema import pii as pii_mod
from app.schema.canonical import schema_hash
from app.schema.compat import check as compat_check
from app.schema.compat import parse_schema
from app.schema.metrics import RegistryMetrics
from app.schema.model import CompatibilityMode, CompatResult, Finding, SchemaError, SchemaFormat, Severity
from app.schema.protoparse import ProtoSchema, compile_proto
from app.schema.references import RawReference, Reference, expand_avro, expand_json, identity_suffix, parse_references
from app.schema.store import ApprovalRow, SchemaRow, SqlStore, VersionRow

log = logging.getLogger("prism.schema.registry")

GLOBAL_SCOPE = "__global__"
ACTIVE_CONSUMER_WINDOW_S = 15 * 60


class RegistryError(Exception):
    """Base: carries Confluent's HTTP status and error_code so the REST layer can map it."""

    status = 500
    code = 50001

    def __init__(self, message: str, findings: list[Finding] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.findings = findings or []


class SubjectNotFound(RegistryError):
    status, code = 404, 40401


class VersionNotFound(RegistryError):
    status, code = 404, 40402


class SchemaNotFound(RegistryError):
    status, code = 404, 40403


class SubjectConfigNotFound(RegistryError):
    status, code = 404, 40408


class IncompatibleSchema(RegistryError):
    status, code = 409, 409


class InvalidSchema(RegistryError):
    status, code = 422, 42201


class InvalidVersion(RegistryError):
    status, code = 422, 42202


class InvalidSubject(RegistryError):
    """A subject name no one could have meant: empty, blank, or holding control characters or
    text that is not Unicode (a lone surrogate from a JSON ``\\udcff`` escape)."""

    status, code = 422, 42208


def check_subject(subject: str, what: str = "subject") -> None:
    """Refuse a subject name that is empty, only spaces, or holds a control character or a lone
    surrogate, before anything is stored.

    Why: `prism schema register --topic ''` registered subject `''` (exit 0, URL
    /v1/subjects//versions/1) - a typo'd shell variable became a subject no one can address -
    and a lone surrogate reached the store and came back as HTTP 500 "Error in the backend data
    store" instead of the client's error."""
    if not subject.strip():
        raise InvalidSubject(f"Invalid {what}: the {what} name is empty; name it, e.g. orders.created")
    bad = next((c for c in subject if c < " " or c == "\x7f" or "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise InvalidSubject(f"Invalid {what} {subject.encode('utf-8', 'backslashreplace').decode()!r}: it holds "
                             f"{'a control character' if bad < ' ' or bad == chr(0x7f) else 'text that is not Unicode'}"
                             f" (U+{ord(bad):04X})")


class InvalidCompatibilityLevel(RegistryError):
    status, code = 422, 42203


class PiiPolicyViolation(RegistryError):
    status, code = 422, 42201


class PiiTagsRequired(PiiPolicyViolation):
    """``require_pii_tags``: a leaf field has no explicit PII tag. Confluent's "Invalid schema"
    (42201, HTTP 422) like every PII refusal, so Confluent clients show the message; the body's
    ``findings`` list every untagged field with the annotation that fixes it."""


class SubjectSoftDeleted(RegistryError):
    """Confluent 40404: soft delete of a subject whose versions are all soft-deleted already."""

    status, code = 404, 40404


class SubjectNotSoftDeleted(RegistryError):
    """Confluent 40405: permanent delete of a subject that still has live versions."""

    status, code = 404, 40405


class VersionSoftDeleted(RegistryError):
    """Confluent 40406: soft delete of a version that is soft-deleted already."""

    status, code = 404, 40406


class VersionNotSoftDeleted(RegistryError):
    """Confluent 40407: permanent delete of a version that was not soft-deleted first."""

    status, code = 404, 40407


class DeleteRefused(RegistryError):
    status, code = 422, 42206


class ReferenceExists(DeleteRefused):
    """Confluent's ReferenceExistsException: same 42206, raised when a delete would orphan
    a schema that references the version."""


class ApprovalNotFound(RegistryError):
    status, code = 404, 40404


class SubjectModeNotFound(RegistryError):
    status, code = 404, 40409


class InvalidMode(RegistryError):
    status, code = 422, 42204


class OperationNotPermitted(RegistryError):
    """Confluent's 42205: the subject's mode forbids the write (READONLY, IMPORT...)."""

    status, code = 422, 42205


#: Confluent's modes. READONLY_OVERRIDE set globally makes every subject read-only whatever
#: its own mode; set on a subject it acts as READONLY.
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
READ_ONLY_MODES = frozenset({"READONLY", "READONLY_OVERRIDE"})


@dataclass(frozen=True)
class Policy:
    """Effective per-subject policy (resolved through subject -> namespace -> global)."""

    compatibility: CompatibilityMode = CompatibilityMode.BACKWARD
    pii_policy: pii_mod.PiiPolicy = pii_mod.PiiPolicy.WARN
    approval_required: bool = False
    source: str = "default"
    #: RFC-030 phase 2: topics of this scope must have a schema (enforced by workers and the SDK)
    require_schema: bool = False
    #: RFC-030 phase 3: every leaf field of a registered schema must carry a PII tag
    require_pii_tags: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"compatibility": self.compatibility.value, "pii_policy": self.pii_policy.value,
                "approval_required": self.approval_required, "require_schema": self.require_schema,
                "require_pii_tags": self.require_pii_tags, "source": self.source}


@dataclass(frozen=True, slots=True)
class PolicyTarget:
    """A policy scope as ``/v1/policies/{scope}`` names it (see :meth:`Registry.policy_target`):
    ``kind`` global/namespace/subject, ``scope`` the stored key, and the ``subject`` or
    ``namespace`` argument :meth:`Registry.policy` and :meth:`Registry.set_policy` take."""

    kind: str
    scope: str
    subject: str | None
    namespace: str | None


@dataclass(frozen=True)
class RegisteredVersion:
    subject: str
    version: int
    id: int
    format: SchemaFormat
    schema: str
    hash: str
    namespace: str
    label: str | None
    created_at: float
    created_by: str
    metadata: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False
    references: tuple[Reference, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"subject": self.subject, "version": self.version, "id": self.id, "format": self.format.value,
               "schema": self.schema, "hash": self.hash, "namespace": self.namespace, "label": self.label,
               "created_at": self.created_at, "created_by": self.created_by, "metadata": self.metadata,
               "deleted": self.deleted}
        if self.references:
            out["references"] = [r.to_dict() for r in self.references]
        return out


@dataclass(frozen=True)
class Effective:
    """A schema with its references resolved, in the form the parsers and checkers take:
    protobuf compiled with the referenced files as imports; Avro/JSON Schema as one
    self-contained text (see :mod:`app.schema.references`)."""

    fmt: SchemaFormat
    text: str
    references: tuple[Reference, ...] = ()
    imports: dict[str, str] = field(default_factory=dict)
    proto: ProtoSchema | None = None

    @property
    def comparable(self) -> str | ProtoSchema:
        """What :func:`app.schema.compat.check` compares."""
        return self.proto if self.proto is not None else self.text

    @property
    def pii_text(self) -> str:
        return self.text


@dataclass(frozen=True)
class RegisterResult:
    version: RegisteredVersion
    created: bool
    compat: CompatResult
    pii_findings: list[Finding]
    approval_id: int | None = None


def namespace_of(subject: str) -> str:
    """Default namespace of a subject: the part before the first '.' (``orders.created`` -> ``orders``).

    Confluent-style ``orders.created-value`` subjects map to ``orders`` as well.
    """
    return subject.split(".", 1)[0].removesuffix("-value").removesuffix("-key")


class Registry:
    """Schema registry domain logic over a :class:`SqlStore`."""

    def __init__(self, store: SqlStore, *, default_compatibility: CompatibilityMode | str = "BACKWARD",
                 default_pii_policy: pii_mod.PiiPolicy | str = "warn") -> None:
        self.store = store
        self.default = Policy(CompatibilityMode.parse(default_compatibility),
                              pii_mod.PiiPolicy.parse(default_pii_policy), False, "default")
        self.metrics = RegistryMetrics()
        self._schema_cache: dict[int, SchemaRow] = {}
        self._refs_cache: dict[int, tuple[Reference, ...]] = {}  # immutable per id, never invalidated
        self._version_cache: dict[tuple[str, int], RegisteredVersion] = {}
        self._latest_cache: dict[str, RegisteredVersion] = {}
        #: Pre-serialized GET response bodies (the REST layer's fast path), cleared on every write.
        self.response_cache: dict[str, bytes] = {}
        self._write_lock = threading.Lock()
        # Readers fill caches outside the write lock; a write bumps the generation and drops
        # entries under _cache_lock, and a reader only stores a value computed in an unchanged
        # generation - so a read racing a register/delete can never leave a stale "latest".
        self._cache_lock = threading.Lock()
        self._generation = 0
        self._seen_change = store.change_token()

    @property
    def cache_generation(self) -> int:
        """Read before computing a cacheable value; pass to :meth:`cache_response`."""
        return self._generation

    def cache_response(self, key: str, generation: int, body: bytes) -> bool:
        """Keep ``body`` for ``key`` unless a write happened since ``generation`` was read."""
        with self._cache_lock:
            if generation != self._generation:
                return False
            self.response_cache[key] = body
            return True

    def _invalidate(self, subject: str, version: int | None = None) -> None:
        with self._cache_lock:
            self._generation += 1
            self._latest_cache.pop(subject, None)
            if version is not None:
                self._version_cache.pop((subject, version), None)
            self.response_cache.clear()
        try:
            self.store.announce_change()
        except Exception as exc:  # the write itself is committed: report it as done, not as a failure
            log.warning("registry write committed, but telling other registry processes failed (%s); "
                        "their caches of %r stay stale until their next change notice or restart", exc, subject)

    def sync(self) -> None:
        """Drop every mutable cache if another process wrote to the store since the last look.

        Called before each cached read, so a client that registered through one worker (or
        replica) and then reads through another sees its write: with SQLite the token is
        read from the database itself (strictly ordered); with PostgreSQL it follows the
        NOTIFY, which arrives within milliseconds of the writer's commit.
        """
        token = self.store.change_token()
        if token != self._seen_change:
            with self._cache_lock:
                self._seen_change = token
                self._generation += 1
                self._latest_cache.clear()
                self._version_cache.clear()
                self.response_cache.clear()

    def _cache_put(self, cache: dict[Any, RegisteredVersion], key: Any, generation: int,
                   rv: RegisteredVersion) -> None:
        with self._cache_lock:
            if generation == self._generation:
                cache[key] = rv

    # -- reads ------------------------------------------------------------------------------
    def _schema_row(self, schema_id: int) -> SchemaRow:
        if not 1 <= schema_id <= 2**31 - 1:  # no such id is ever given out; a store cannot even look one up
            raise SchemaNotFound(f"Schema {schema_id} not found")
        row = self._schema_cache.get(schema_id)
        if row is not None:
            self.metrics.cache("schema", True)
            return row
        self.metrics.cache("schema", False)
        row = self.store.schema_by_id(schema_id)
        if row is None:
            raise SchemaNotFound(f"Schema {schema_id} not found")
        self._schema_cache[schema_id] = row
        return row

    def _materialize(self, v: VersionRow) -> RegisteredVersion:
        s = self._schema_row(v.schema_id)
        return RegisteredVersion(v.subject, v.version, s.id, SchemaFormat(s.format), s.schema, s.hash, v.namespace,
                                 v.label, v.created_at, v.created_by, v.metadata, v.deleted,
                                 self.references_of(s.id))

    def references_of(self, schema_id: int) -> tuple[Reference, ...]:
        """The references stored with a schema id (cached forever: an id's references never change)."""
        refs = self._refs_cache.get(schema_id)
        if refs is None:
            refs = tuple(Reference(*r) for r in self.store.references(schema_id))
            self._refs_cache[schema_id] = refs
        return refs

    # -- Confluent's serialized protobuf form ----------------------------------------------------
    def text_from_serialized(self, text: str, references: Any = ()) -> str:
        """``text`` as ``.proto`` source when it is Confluent's serialized form (base64 of a
        ``FileDescriptorProto``, what Confluent's protobuf serializers register), else unchanged.

        The rendered text is compiled (against the request's references) and must give the
        descriptor the client sent; otherwise :class:`InvalidSchema`, rather than storing a
        schema other than the one the producer writes with."""
        from app.schema import protodesc

        fdp = protodesc.parse_serialized(text)
        if fdp is None:
            return text
        try:
            refs = self.resolve_references(SchemaFormat.PROTOBUF, references)
            rendered = protodesc.render_proto(fdp, self._imported_files(fdp, refs))
            compiled = self.effective(SchemaFormat.PROTOBUF, rendered, refs).proto or compile_proto(rendered)
        except SchemaError as e:
            raise InvalidSchema(f"Invalid schema: serialized protobuf descriptor {fdp.name!r}: {e}") from e
        if not protodesc.same_schema(fdp, compiled.main):
            raise InvalidSchema(f"Invalid schema: serialized protobuf descriptor {fdp.name!r} could not be "
                                "converted to .proto text faithfully; register it as .proto text instead")
        return rendered

    def _imported_files(self, fdp: Any, refs: tuple[Reference, ...]) -> list[Any]:
        """The files ``fdp`` imports, compiled with their own imports (dependency order), so
        custom options they define can be named when rendering."""
        from app.schema import protodesc

        if not fdp.dependency:
            return []
        stub = 'syntax = "proto3";\n' + "".join(f"import {protodesc.quote(d)};\n" for d in fdp.dependency)
        compiled = self.effective(SchemaFormat.PROTOBUF, stub, refs).proto or compile_proto(stub)
        return [f for f in compiled.files if f.name != compiled.main_file]

    def serialized_form(self, fmt: SchemaFormat, text: str, refs: tuple[Reference, ...] = ()) -> str:
        """Confluent's ``format=serialized`` for a protobuf schema: base64 of its compiled
        ``FileDescriptorProto`` (imports named as the references name them). Other formats
        have no serialized form and are returned as they are."""
        if fmt is not SchemaFormat.PROTOBUF:
            return text
        from app.schema import protodesc

        try:
            compiled = self.effective(fmt, text, refs).proto or compile_proto(text)
        except SchemaError as e:  # stored schemas compiled when registered; keep the store error shape
            raise InvalidSchema(f"Invalid schema: {e}") from e
        return protodesc.serialize(compiled.main)

    # -- references -------------------------------------------------------------------------
    def resolve_references(self, fmt: SchemaFormat, raw: Any) -> tuple[Reference, ...]:
        """Validate a request's references: each must name a live version of a subject, in
        the same format. ``latest``/-1 is pinned to the current version number, so the stored
        schema keeps meaning the same thing when the referenced subject moves on.
        Raises :class:`InvalidSchema` (Confluent answers 42201 for a missing reference)."""
        if raw and all(isinstance(r, Reference) for r in raw):
            return tuple(raw)  # already resolved (register -> check)
        try:
            parsed = raw if all(isinstance(r, RawReference) for r in raw or ()) else parse_references(raw)
        except SchemaError as e:
            raise InvalidSchema(f"Invalid schema: {e}") from e
        out = []
        for r in parsed:
            try:
                target = self.get(r.subject, r.version)
            except (SubjectNotFound, VersionNotFound, InvalidVersion) as e:
                raise InvalidSchema(f"Invalid schema: reference {r.name!r} not found: subject '{r.subject}' "
                                    f"version {r.version} ({e.message})") from e
            if target.format is not fmt:
                raise InvalidSchema(f"Invalid schema: reference {r.name!r} is a {target.format.value} schema, "
                                    f"this one is {fmt.value}")
            out.append(Reference(r.name, r.subject, target.version))
        return tuple(out)

    def effective(self, fmt: SchemaFormat, text: str, refs: tuple[Reference, ...] = (),
                  _depth: int = 0) -> Effective:
        """``text`` with ``refs`` resolved (transitively: a referenced schema's own references
        come along). Raises :class:`InvalidSchema` when the result does not parse."""
        if not refs:
            return Effective(fmt, text)
        if _depth > 32:
            raise InvalidSchema("Invalid schema: references nested more than 32 deep (a cycle?)")
        expanded: dict[str, str] = {}
        imports: dict[str, str] = {}
        for r in refs:
            row = self.store.version(r.subject, r.version, include_deleted=True)
            if row is None:
                raise InvalidSchema(f"Invalid schema: reference {r.name!r} not found: subject '{r.subject}' "
                                    f"version {r.version}")
            target = self._schema_row(row.schema_id)
            inner = self.effective(fmt, target.schema, self.references_of(target.id), _depth + 1)
            imports.update(inner.imports)
            imports[r.name] = target.schema
            expanded[r.name] = inner.text
        try:
            if fmt is SchemaFormat.PROTOBUF:
                return Effective(fmt, text, refs, imports, compile_proto(text, imports=imports))
            if fmt is SchemaFormat.AVRO:
                return Effective(fmt, expand_avro(text, expanded), refs)
            return Effective(fmt, expand_json(text, expanded), refs)
        except SchemaError as e:
            raise InvalidSchema(f"Invalid schema: {e}") from e

    def _version_effective(self, rv: RegisteredVersion) -> Effective:
        return self.effective(rv.format, rv.schema, rv.references)

    def referenced_by(self, subject: str, version: int | str) -> list[int]:
        """Ids of live schemas that reference this version (Confluent ``/referencedby``)."""
        rv = self.get(subject, version)
        return self.store.referencing(subject, rv.version)

    def schema_by_id(self, schema_id: int) -> SchemaRow:
        return self._schema_row(schema_id)

    def subjects(self, include_deleted: bool = False) -> list[str]:
        return self.store.subjects(include_deleted)

    def versions(self, subject: str, include_deleted: bool = False) -> list[RegisteredVersion]:
        rows = self.store.versions(subject, include_deleted)
        if not rows:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        return [self._materialize(r) for r in rows]

    def get(self, subject: str, version: int | str = "latest", include_deleted: bool = False) -> RegisteredVersion:
        """One version of a subject; ``version`` is a number, ``"latest"`` or ``-1``, or a label (``"v2"``)."""
        self.sync()
        if version in ("latest", -1, "-1") and include_deleted:  # Confluent ?deleted=true: soft-deleted count
            rows = self.store.versions(subject, include_deleted=True)
            if not rows:
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            return self._materialize(rows[-1])
        if version in ("latest", -1, "-1"):
            cached = self._latest_cache.get(subject)
            if cached is not None:
                self.metrics.cache("latest", True)
                return cached
            self.metrics.cache("latest", False)
            gen = self._generation
            rows = self.store.versions(subject)
            if not rows:
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            rv = self._materialize(rows[-1])
            self._cache_put(self._latest_cache, subject, gen, rv)
            return rv
        num = self._version_number(subject, version)
        key = (subject, num)
        cached = self._version_cache.get(key)
        if cached is not None and not include_deleted:
            self.metrics.cache("version", True)
            return cached
        self.metrics.cache("version", False)
        gen = self._generation
        row = self.store.version(subject, num, include_deleted)
        if row is None:
            if not self.store.versions(subject, include_deleted=True):
                raise SubjectNotFound(f"Subject '{subject}' not found.")
            raise VersionNotFound(f"Version {version} not found.")
        rv = self._materialize(row)
        if not row.deleted:
            self._cache_put(self._version_cache, key, gen, rv)
        return rv

    def _version_number(self, subject: str, version: int | str) -> int:
        if isinstance(version, int):
            num = version
        elif isinstance(version, str) and (number := decimal(version)) is not None:
            num = number
        else:
            for r in self.store.versions(subject, include_deleted=False):
                if r.label == version:
                    return r.version
            raise InvalidVersion(f"The specified version '{version}' is not a valid version id. Allowed values "
                                 "are between [1, 2^31-1] and the string \"latest\"")
        if num < 1 or num > 2**31 - 1:
            raise InvalidVersion(f"The specified version '{version}' is not a valid version id.")
        return num

    def lookup(self, subject: str, text: str, fmt: SchemaFormat | str,
               references: Any = (), include_deleted: bool = False) -> RegisteredVersion:
        """The live version of ``subject`` whose canonical hash (text and references) equals this
        schema's; with ``include_deleted`` (Confluent ``?deleted=true``) soft-deleted ones count
        too, the latest matching version winning."""
        fmt = SchemaFormat.parse(fmt)
        h = self._hash(fmt, text, self.resolve_references(fmt, references))
        rows = self.store.versions(subject, include_deleted)
        if not rows:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        for r in reversed(rows) if include_deleted else rows:
            if self._schema_row(r.schema_id).hash == h:
                return self._materialize(r)
        raise SchemaNotFound("Schema not found")

    # -- policy -----------------------------------------------------------------------------
    def policy(self, subject: str | None = None, namespace: str | None = None) -> Policy:
        """The effective policy: each setting from the narrowest scope that sets it (subject,
        then namespace, then global), else the registry's default."""
        comp, pii, appr, source = None, None, None, "default"
        req_schema: bool | None = None
        req_tags: bool | None = None
        scopes = []
        if subject:
            scopes.append(("subject", subject))
        ns = namespace or (self._namespace_for(subject) if subject else None)
        if ns:
            scopes.append(("namespace", f"ns:{ns}"))
        scopes.append(("global", GLOBAL_SCOPE))
        for kind, scope in scopes:
            row = self.store.get_config(scope)
            if row is None:
                continue
            if comp is None and row.compatibility:
                comp, source = row.compatibility, kind
            if pii is None and row.pii_policy:
                pii = row.pii_policy
            if appr is None and row.approval_required is not None:
                appr = row.approval_required
            if req_schema is None and row.require_schema is not None:
                req_schema = row.require_schema
            if req_tags is None and row.require_pii_tags is not None:
                req_tags = row.require_pii_tags
        return Policy(CompatibilityMode.parse(comp) if comp else self.default.compatibility,
                      pii_mod.PiiPolicy.parse(pii) if pii else self.default.pii_policy,
                      bool(appr) if appr is not None else self.default.approval_required, source,
                      bool(req_schema), bool(req_tags))

    def _namespace_for(self, subject: str) -> str:
        rows = self.store.versions(subject, include_deleted=True)
        return rows[-1].namespace if rows else namespace_of(subject)

    def namespace_for(self, subject: str) -> str:
        """The namespace whose policy governs ``subject`` now: its latest version's, else the
        default derived from its name. A registration naming another namespace moves the
        subject under another policy (the service makes that an admin decision)."""
        return self._namespace_for(subject)

    def policy_target(self, name: str, *, check: bool = True) -> PolicyTarget:
        """What ``/v1/policies/{name}`` addresses - one reading for its GET and its PUT, in the
        scope keys ``GET /v1/policies`` lists: ``__global__``; ``ns:<namespace>``;
        ``subject:<subject>`` (always the subject - how a policy is set on a subject before its
        first version, e.g. ``require_pii_tags`` for a topic about to be registered); otherwise the
        subject of that name when the registry knows one (a version, even soft-deleted, or a
        subject-level setting such as ``PUT /config/{s}`` or a registration's
        ``compatibility_mode``), else the namespace of that name.

        Why not "always a namespace" (as it once was): ``GET /v1/policies`` lists subject
        settings under the subject's name, so reading that name back as a namespace showed a
        different policy (BACKWARD) than the one registrations applied (NONE).

        ``check=False``: a scope the store already holds (the listing) is classified, not judged -
        a name written before the checks below, or through the Confluent API, must not make the
        whole list answer 422."""
        if name == GLOBAL_SCOPE:
            return PolicyTarget("global", GLOBAL_SCOPE, None, None)
        # An empty name after the prefix is refused, not read as something else: `prism schema
        # policy set --subject ''` stored a policy for the NAMESPACE "subject:", `--namespace ''`
        # one for the namespace "" (exit 0 both).
        if name.startswith("ns:"):
            if check:
                check_subject(name[3:], what="namespace")
            return PolicyTarget("namespace", name, None, name[3:])
        if name.startswith("subject:"):
            subject = name[len("subject:"):]
            if check:
                check_subject(subject)
            return PolicyTarget("subject", subject, subject, None)
        if check:
            check_subject(name, what="policy scope")
        if self.store.get_config(name) is not None or self.store.versions(name, include_deleted=True):
            return PolicyTarget("subject", name, name, None)
        return PolicyTarget("namespace", f"ns:{name}", None, name)

    def set_policy(self, *, actor: str, subject: str | None = None, namespace: str | None = None,
                   compatibility: str | None = None, pii_policy: str | None = None,
                   approval_required: bool | None = None, require_schema: bool | None = None,
                   require_pii_tags: bool | None = None) -> Policy:
        """Set policy at subject, namespace or (neither given) global scope; a None setting
        stays as it was."""
        try:
            comp = CompatibilityMode.parse(compatibility).value if compatibility else None
        except ValueError as e:
            raise InvalidCompatibilityLevel(f"Invalid compatibility level: {compatibility}") from e
        try:
            pii = pii_mod.PiiPolicy.parse(pii_policy).value if pii_policy else None
        except ValueError as e:
            raise InvalidCompatibilityLevel(f"Invalid PII policy: {pii_policy}") from e
        scope = subject if subject else (f"ns:{namespace}" if namespace else GLOBAL_SCOPE)
        self.store.set_config(scope, comp, pii, approval_required, require_schema=require_schema,
                              require_pii_tags=require_pii_tags)
        self.store.append_audit(actor, "policy.set", subject, None, {
            "scope": scope, "compatibility": comp, "pii_policy": pii, "approval_required": approval_required,
            "require_schema": require_schema, "require_pii_tags": require_pii_tags})
        return self.policy(subject, namespace)

    def subject_config(self, subject: str) -> str | None:
        row = self.store.get_config(subject)
        return row.compatibility if row else None

    def delete_subject_config(self, subject: str, actor: str) -> str:
        row = self.store.get_config(subject)
        if row is None or not row.compatibility:
            raise SubjectConfigNotFound(f"Subject '{subject}' does not have subject-level compatibility configured")
        self.store.delete_config(subject)
        self.store.append_audit(actor, "policy.delete", subject, None, {"scope": subject})
        return row.compatibility

    # -- modes (Confluent /mode) -------------------------------------------------------------
    def mode(self, subject: str | None = None) -> str:
        """Effective mode: the subject's own, else the global one, else READWRITE; a global
        READONLY_OVERRIDE wins over any subject mode."""
        glob = self.store.get_mode(GLOBAL_SCOPE) or "READWRITE"
        if subject is None or glob == "READONLY_OVERRIDE":
            return glob
        return self.store.get_mode(subject) or glob

    def subject_mode(self, subject: str) -> str | None:
        return self.store.get_mode(subject)

    def set_mode(self, mode: str, *, actor: str, subject: str | None = None, force: bool = False) -> str:
        """Set the global (``subject`` None) or a subject's mode. IMPORT is only allowed where
        no schema was ever registered (soft-deleted versions count) unless ``force``, as in
        Confluent: imported ids must not collide with ids already handed out."""
        value = (mode or "").strip().upper()
        if value not in MODES:
            raise InvalidMode(f"Invalid mode {mode!r}. Valid values are: {', '.join(MODES)}")
        if value == "IMPORT" and not force:
            taken = (self.store.versions(subject, include_deleted=True) if subject
                     else self.store.subjects(include_deleted=True))
            if taken:
                where = f"subject '{subject}'" if subject else "the registry"
                raise OperationNotPermitted(f"Cannot import since found existing subjects: {where} already has "
                                            "schemas; delete them permanently first or pass force=true")
        self.store.set_mode(subject or GLOBAL_SCOPE, value)
        self.store.append_audit(actor, "mode.set", subject, None, {"mode": value, "force": force})
        return value

    def delete_mode(self, subject: str | None, *, actor: str) -> str:
        """Remove a subject's mode (it follows the global one again) or reset the global one to
        READWRITE; returns the mode that was set."""
        scope = subject or GLOBAL_SCOPE
        old = self.store.get_mode(scope)
        if old is None:
            if subject:
                raise SubjectModeNotFound(f"Subject '{subject}' does not have subject-level mode configured")
            return "READWRITE"
        self.store.delete_mode(scope)
        self.store.append_audit(actor, "mode.delete", subject, None, {"mode": old})
        return old

    def _check_writable(self, subject: str, what: str) -> str:
        mode = self.mode(subject)
        if mode in READ_ONLY_MODES:
            raise OperationNotPermitted(f"Subject {subject} is in read-only mode ({mode}): {what} refused; "
                                        "change it with PUT /mode or PUT /mode/{subject}")
        return mode

    # -- writes -----------------------------------------------------------------------------
    def _hash(self, fmt: SchemaFormat, text: str, refs: tuple[Reference, ...] = ()) -> str:
        """Canonical hash; with references, of the schema compiled against them plus the
        references themselves (identity = text and references, as in Confluent). A schema
        without references hashes exactly as before references existed."""
        eff = self.effective(fmt, text, refs)
        try:
            parse_schema(fmt, eff.comparable)
            return schema_hash(fmt, text, eff.imports or None, identity_suffix(refs))
        except SchemaError as e:
            raise InvalidSchema(f"Invalid schema: {e}") from e

    def _validated_hash(self, fmt: SchemaFormat, text: str, operation: str, references: Any = ()
                        ) -> tuple[str, tuple[Reference, ...]]:
        """``_hash`` that counts an unparsable schema or a bad reference as a validation
        failure of ``operation``; returns the hash and the resolved references."""
        try:
            refs = self.resolve_references(fmt, references)
        except InvalidSchema:
            self.metrics.validation_failure(operation, "invalid_reference")
            raise
        try:
            return self._hash(fmt, text, refs), refs
        except InvalidSchema:
            self.metrics.validation_failure(operation, "invalid_schema")
            raise

    def check(self, subject: str, text: str, fmt: SchemaFormat | str, *, version: int | str | None = None,
              mode: CompatibilityMode | str | None = None, references: Any = ()) -> CompatResult:
        """Compatibility of ``text`` with the subject: against one ``version``, or per the policy's mode.

        With references, both sides are compared with their own references resolved (each
        stored version keeps the referenced versions it was registered with)."""
        fmt = SchemaFormat.parse(fmt)
        _, refs = self._validated_hash(fmt, text, "check", references)
        eff = CompatibilityMode.parse(mode) if mode else self.policy(subject).compatibility
        try:
            history = self.versions(subject)
        except SubjectNotFound:
            history = []
        if version is not None:
            one = self.get(subject, version)
            history = [one]
            if eff.transitive:
                eff = CompatibilityMode(eff.value.removesuffix("_TRANSITIVE"))
        prev = [(f"v{h.version}", self._version_effective(h).comparable) for h in history if h.format is fmt]
        other = [h for h in history if h.format is not fmt]
        result = compat_check(fmt, self.effective(fmt, text, refs).comparable, prev, eff)
        if other and eff is not CompatibilityMode.NONE:
            extra = Finding(Severity.BREAKING, subject, "FORMAT_CHANGED",
                            f"schema format changed from {other[-1].format.value} to {fmt.value}",
                            "use a new subject for a new format")
            result = CompatResult(result.mode, (extra, *result.findings))
        self.metrics.compat_check(fmt.value, result.mode.value, result.is_compatible)
        return result

    def register(self, subject: str, text: str, fmt: SchemaFormat | str = SchemaFormat.AVRO, *,
                 actor: str = "anonymous", namespace: str | None = None, label: str | None = None,
                 metadata: dict[str, Any] | None = None, dry_run: bool = False,
                 references: Any = (), schema_id: int | None = None,
                 version: int | None = None) -> RegisterResult:
        """Register a new version (or return the existing identical one). See module docstring.

        ``references``: Confluent ``[{name, subject, version}]``; each must exist (else
        :class:`InvalidSchema`) and they are stored with the schema id.

        Modes (Confluent): READONLY refuses; an explicit ``schema_id`` (and ``version``) needs
        IMPORT mode, see :meth:`_import`; without one the subject must be READWRITE."""
        check_subject(subject)
        fmt = SchemaFormat.parse(fmt)
        if not dry_run:
            mode = self._check_writable(subject, "registering a schema")
            if schema_id is not None and mode != "IMPORT":
                raise OperationNotPermitted(f"Subject {subject} is not in import mode: a schema id can only be "
                                            "given in IMPORT mode (PUT /mode/{subject} {\"mode\": \"IMPORT\"})")
            if schema_id is None and mode != "READWRITE":
                raise OperationNotPermitted(f"Subject {subject} is not in read-write mode ({mode}): in IMPORT mode "
                                            "give the schema's id (and version)")
        h, refs = self._validated_hash(fmt, text, "register", references)
        eff = self.effective(fmt, text, refs)
        if schema_id is not None and not dry_run:
            return self._import(subject, text, fmt, h, refs, eff, schema_id, version, actor=actor,
                                namespace=namespace, label=label, metadata=metadata)
        with self._write_lock:
            existing = [r for r in self.store.versions(subject) if self._schema_row(r.schema_id).hash == h]
            pol = self.policy(subject, namespace)
            if existing:
                rv = self._materialize(existing[-1])
                self.metrics.registration(created=False)
                return RegisterResult(rv, False, CompatResult(pol.compatibility), [])
            self._require_tags(subject, fmt, eff, pol, actor, namespace)
            pii_findings = pii_mod.check_policy(fmt, eff.pii_text, pol.pii_policy, eff.imports or None)
            blocking_pii = [f for f in pii_findings if f.severity is Severity.BREAKING]
            if blocking_pii:
                self.metrics.validation_failure("register", "pii_untagged")
                self.metrics.pii_rejection(pol.pii_policy.value)
                self.store.append_audit(actor, "register.rejected", subject, None,
                                        {"reason": "pii", "findings": [f.to_dict() for f in blocking_pii]})
                raise PiiPolicyViolation(
                    "Schema rejected by PII policy: " + "; ".join(f.reason for f in blocking_pii), blocking_pii)
            compat = self.check(subject, text, fmt, references=refs)
            approval_id = None
            if not compat.is_compatible:
                approved = [a for a in self.store.approvals(subject, "approved") if a.hash == h]
                if pol.approval_required and approved:
                    approval_id = approved[-1].id
                else:
                    self.metrics.validation_failure("register", "incompatible")
                    self.store.append_audit(actor, "register.rejected", subject, None,
                                            {"reason": "incompatible", "mode": compat.mode.value,
                                             "findings": [f.to_dict() for f in compat.breaking]})
                    hint = (" Policy requires approval for breaking changes: create an approval request."
                            if pol.approval_required else "")
                    raise IncompatibleSchema(
                        f"Schema being registered is incompatible with an earlier schema for subject \"{subject}\", "
                        f"details: {[f'{f.path}: {f.reason}' for f in compat.breaking]}.{hint}", compat.breaking)
            if dry_run:
                rv = RegisteredVersion(subject, 0, 0, fmt, text, h, namespace or self._namespace_for(subject),
                                       label, time.time(), actor, metadata or {}, references=refs)
                return RegisterResult(rv, False, compat, pii_findings, approval_id)
            sid = self.store.put_schema(h, fmt.value, text, [(r.name, r.subject, r.version) for r in refs])
            ns = namespace or self._namespace_for(subject)
            meta = dict(metadata or {})
            meta.setdefault("pii_fields", pii_mod.pii_fields(fmt, eff.pii_text, eff.imports or None))
            num = self.store.add_version(subject, sid, ns, actor, label, meta)
            self.store.append_audit(actor, "register", subject, num, {
                "id": sid, "hash": h, "format": fmt.value, "label": label, "approval_id": approval_id,
                "references": [r.to_dict() for r in refs],
                "warnings": [f.to_dict() for f in [*compat.warnings, *pii_findings]]})
            if approval_id is not None:
                self.store.decide_approval(approval_id, "consumed", actor)
            self._invalidate(subject)
            rv = self.get(subject, num)
            self.metrics.registration(created=True)
            return RegisterResult(rv, True, compat, pii_findings, approval_id)

    def _require_tags(self, subject: str, fmt: SchemaFormat, eff: Effective, pol: Policy, actor: str,
                      namespace: str | None) -> None:
        """Refuse a new schema with untagged leaf fields when the policy requires PII tags
        (RFC-030 phase 3). Checked before the detection-based PII policy so one answer lists
        every field to tag, not just the ones whose names look personal. An identical
        re-register returns the existing version before this runs: a schema registered before
        the policy stays usable."""
        if not pol.require_pii_tags:
            return
        findings = pii_mod.required_tag_findings(fmt, eff.pii_text, eff.imports or None)
        if not findings:
            return
        self.metrics.validation_failure("register", "pii_untagged")
        self.metrics.pii_rejection("require_pii_tags")
        self.store.append_audit(actor, "register.rejected", subject, None,
                                {"reason": "pii_tags_required", "fields": [f.path for f in findings]})
        ns = namespace or self._namespace_for(subject)
        example = findings[0].hint
        raise PiiTagsRequired(
            f"Schema rejected: the policy of subject '{subject}' (namespace '{ns}') requires a PII tag on every "
            f"field (require_pii_tags), and {len(findings)} field(s) have none: "
            + ", ".join(f.path for f in findings[:50]) + (" ..." if len(findings) > 50 else "")
            + f". Tag each field with its category, or \"none\" when it is not personal data; e.g. {example}",
            findings)

    def _import(self, subject: str, text: str, fmt: SchemaFormat, h: str, refs: tuple[Reference, ...],
                eff: Effective, schema_id: int, version: int | None, *, actor: str, namespace: str | None,
                label: str | None, metadata: dict[str, Any] | None) -> RegisterResult:
        """IMPORT mode: keep the id (and version) the schema had in the registry it comes
        from. No compatibility check (history is copied as it was); the PII policy still
        applies. Refused (42205): an id that names another schema, a schema already stored
        under another id, a version number holding another schema."""
        if not 1 <= schema_id <= 2**31 - 1:
            raise InvalidSchema(f"Invalid schema id {schema_id}: ids are between 1 and 2^31-1")
        if version is not None and not 1 <= version <= 2**31 - 1:
            raise InvalidVersion(f"The specified version '{version}' is not a valid version id.")
        with self._write_lock:
            by_id = self.store.schema_by_id(schema_id)
            if by_id is not None and by_id.hash != h:
                raise OperationNotPermitted(f"Overwrite new schema with id {schema_id} is not permitted: id "
                                            f"{schema_id} already names another schema")
            by_hash = self.store.schema_by_hash(h)
            if by_hash is not None and by_hash.id != schema_id:
                raise OperationNotPermitted(f"Schema already registered with id {by_hash.id}; it cannot be imported "
                                            f"again as id {schema_id}")
            pol = self.policy(subject, namespace)
            self._require_tags(subject, fmt, eff, pol, actor, namespace)
            pii_findings = pii_mod.check_policy(fmt, eff.pii_text, pol.pii_policy, eff.imports or None)
            blocking = [f for f in pii_findings if f.severity is Severity.BREAKING]
            if blocking:
                self.metrics.validation_failure("register", "pii_untagged")
                self.metrics.pii_rejection(pol.pii_policy.value)
                raise PiiPolicyViolation(
                    "Schema rejected by PII policy: " + "; ".join(f.reason for f in blocking), blocking)
            rows = self.store.versions(subject, include_deleted=True)
            same = [r for r in rows if r.schema_id == schema_id and not r.deleted and version in (None, r.version)]
            if same:
                self.metrics.registration(created=False)
                return RegisterResult(self._materialize(same[-1]), False, CompatResult(pol.compatibility), [])
            if version is not None and any(r.version == version for r in rows):
                raise OperationNotPermitted(f"Overwrite new schema with version {version} of subject '{subject}' is "
                                            "not permitted: that version holds another schema")
            if by_id is None:
                self.store.put_schema_with_id(schema_id, h, fmt.value, text,
                                              [(r.name, r.subject, r.version) for r in refs])
            meta = dict(metadata or {})
            meta.setdefault("pii_fields", pii_mod.pii_fields(fmt, eff.pii_text, eff.imports or None))
            num = self.store.add_version(subject, schema_id, namespace or self._namespace_for(subject), actor,
                                         label, meta, version=version)
            self.store.append_audit(actor, "register.import", subject, num, {
                "id": schema_id, "hash": h, "format": fmt.value, "references": [r.to_dict() for r in refs]})
            self._invalidate(subject)
            self.metrics.registration(created=True)
            return RegisterResult(self.get(subject, num), True, CompatResult(pol.compatibility), pii_findings)

    def delete_version(self, subject: str, version: int | str, *, actor: str, permanent: bool = False,
                       force: bool = False) -> int:
        """Soft delete (hide) a version; ``permanent`` purges an already soft-deleted one.

        Safety: refuses to delete a version that consumers reported reading within the last
        15 minutes unless ``force``; permanent deletes require a prior soft delete (Confluent).
        """
        self._check_writable(subject, "deleting a version")
        num = self.get(subject, version, include_deleted=True).version if version not in ("latest", -1, "-1") \
            else self.get(subject, "latest").version
        row = self.store.version(subject, num, include_deleted=True)
        assert row is not None
        if permanent and not row.deleted:
            raise VersionNotSoftDeleted(f"Subject '{subject}' Version {num} was not deleted first before being "
                                        "permanently deleted: soft delete it first (without permanent=true)")
        if not permanent and row.deleted:
            raise VersionSoftDeleted(f"Subject '{subject}' Version {num} was soft deleted. Set permanent=true to "
                                     "delete permanently")
        # Confluent: a version another schema references cannot be deleted (42206). A soft
        # delete is blocked by live referrers; a permanent one also by soft-deleted referrers,
        # whose ids stay readable and would then point at nothing.
        referrers = self.store.referencing(subject, num, include_deleted=permanent)
        if referrers:
            raise ReferenceExists(f"One or more references exist to the schema {{subject={subject}, version={num}}}: "
                                  f"schema id(s) {', '.join(map(str, referrers))}")
        if permanent:
            self.store.purge_version(subject, num)
        else:
            active = [c for c in self.active_consumers(subject) if c[1] == num]
            if active and not force:
                raise DeleteRefused(f"Version {num} of '{subject}' has {len(active)} active consumer(s) "
                                    f"({', '.join(c[0] for c in active)}); pass force to delete anyway")
            self.store.mark_deleted(subject, num)
        self._invalidate(subject, num)
        self.store.append_audit(actor, "delete.permanent" if permanent else "delete", subject, num,
                                {"force": force})
        if permanent:  # the subject's last version gone for good: its associations go too
            from app.schema.associations import forget_subject

            forget_subject(self, subject, actor=actor)
        return num

    def delete_subject(self, subject: str, *, actor: str, permanent: bool = False, force: bool = False) -> list[int]:
        """Confluent's subject delete: soft (every live version) or, once every version is
        soft-deleted, ``permanent`` (40405 while live versions remain; 40404 for a soft
        delete of a subject that has only soft-deleted versions)."""
        self._check_writable(subject, "deleting a subject")
        rows = self.store.versions(subject, include_deleted=True)
        if not rows:
            raise SubjectNotFound(f"Subject '{subject}' not found.")
        live = [r for r in rows if not r.deleted]
        if permanent and live:
            raise SubjectNotSoftDeleted(f"Subject '{subject}' was not deleted first before being permanently "
                                        f"deleted: {len(live)} live version(s); soft delete it first")
        if not permanent and not live:
            raise SubjectSoftDeleted(f"Subject '{subject}' was soft deleted. Set permanent=true to delete permanently")
        return [self.delete_version(subject, r.version, actor=actor, permanent=permanent, force=force)
                for r in (rows if permanent else live)]

    # -- approvals --------------------------------------------------------------------------
    def request_approval(self, subject: str, text: str, fmt: SchemaFormat | str, *, actor: str,
                         reason: str = "") -> ApprovalRow:
        fmt = SchemaFormat.parse(fmt)
        h = self._hash(fmt, text)
        aid = self.store.add_approval(subject, h, fmt.value, text, actor, reason)
        self.store.append_audit(actor, "approval.request", subject, None, {"approval_id": aid, "hash": h})
        row = self.store.approval(aid)
        assert row is not None
        return row

    def decide(self, approval_id: int, *, actor: str, approve: bool) -> ApprovalRow:
        row = self.store.approval(approval_id)
        if row is None:
            raise ApprovalNotFound(f"Approval request {approval_id} not found")
        if row.status != "pending":
            raise DeleteRefused(f"Approval request {approval_id} is already {row.status}")
        if approve and row.requested_by == actor:
            raise DeleteRefused("an approval request cannot be approved by its requester")
        status = "approved" if approve else "rejected"
        self.store.decide_approval(approval_id, status, actor)
        self.store.append_audit(actor, f"approval.{status}", row.subject, None, {"approval_id": approval_id})
        out = self.store.approval(approval_id)
        assert out is not None
        return out

    # -- consumers, audit -------------------------------------------------------------------
    def report_consumer(self, subject: str, version: int, consumer_id: str) -> None:
        """Subscribers report the version they read (feeds 'active consumers' and delete safety).

        The version must exist (404 otherwise): reports come from any SDK pointed at this
        registry, and rows for subjects it does not hold would only be noise.
        """
        self.get(subject, version)
        self.store.report_consumer(subject, consumer_id, version)

    def active_consumers(self, subject: str) -> list[tuple[str, int, float]]:
        return self.store.consumers(subject, time.time() - ACTIVE_CONSUMER_WINDOW_S)

    def audit_log(self, subject: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return [{"id": r.id, "at": r.at, "actor": r.actor, "action": r.action, "subject": r.subject,
                 "version": r.version, "detail": r.detail} for r in self.store.audit(subject, limit)]

    def pii_audit(self) -> list[pii_mod.AuditEntry]:
        """PII audit of the latest live version of every subject."""
        latest: dict[str, VersionRow] = {}
        for r in self.store.all_live_versions():
            latest[r.subject] = r
        items = []
        for subject, r in latest.items():
            rv = self._materialize(r)
            try:
                eff = self._version_effective(rv)
            except RegistryError:
                eff = Effective(rv.format, rv.schema)  # the audit reports it unparsable
            items.append((f"{subject}.v{r.version}", rv.format.value, eff.pii_text, eff.imports or None))
        return pii_mod.audit(items)
