"""Registry REST service (FastAPI; OpenAPI at ``/openapi.json``, docs at ``/docs``).

Two surfaces over one :class:`~app.schema.registry.Registry`:

- the Confluent Schema Registry REST subset, so existing Confluent clients and serializers
  work unchanged: ``/subjects``, ``/subjects/{s}/versions[/{v}]``, ``/schemas/ids/{id}``,
  ``/config[/{s}]``, ``/compatibility/subjects/{s}/versions[/{v}]`` — with Confluent's
  content type ``application/vnd.schemaregistry.v1+json`` and its ``{"error_code", "message"}``
  errors on every failure, unknown routes (404) and methods (405) included; ``/mode``;
  ``/associations`` (:mod:`app.schema.associations`: confluent-kafka's serializers and
  deserializers look the topic up before their first message, so it must answer readers);
  protobuf in Confluent's serialized form (docs/schema-registry.md, "Confluent conformance");
- the Prism API under ``/v1`` (RFC-030): namespaces, PII, policies, approvals, audit log,
  active consumers, plus ``/metrics`` (Prometheus text via prometheus_client, see
  :mod:`app.schema.metrics`) and a small browser UI at ``/ui``.

Who may do what: every request is authenticated (HTTP basic against a users file, or a
bearer JWT) and authorized against one route table in :mod:`app.schema.authz`; the audit
actor is always the verified principal (``anonymous`` only where anonymous access is
explicitly allowed). Client-supplied actor headers are ignored.

One reading of every request, for the check and the handler alike:

- request bodies are parsed once, by FastAPI, into the models below; a route whose
  authorization depends on its input (``write`` rules) decides it in a dependency that
  receives that validated model (or path parameter) and hands the same object to the
  handler (:func:`app.schema.authz.decide`);
- the models are strict (:data:`_STRICT`): ``"false"``, ``"0"``, ``0`` or ``null`` is not a
  boolean, ``"3"`` is not an integer - a value means what its JSON type says or is refused
  (422), so no reader can convert it into something else. The Prism ``/v1`` models also refuse
  unknown fields (``"Dry_Run"``, ``"dryRun"``, ``"schema_"``: a field that looks like one
  but is not would otherwise be silently ignored); the Confluent ones accept them (Confluent
  clients send fields this registry does not use), still strictly typed;
- a JSON body with a duplicated key (at any depth) is refused (422): ``json.loads`` keeps
  the last one, a proxy or WAF in front may keep the first;
- one body-size limit, :data:`MAX_BODY_BYTES`, for every route, enforced on the bytes
  received (``Content-Length`` or not) before authentication, with the other HTTP limits of
  :mod:`app.security.http_limits` (header size and count, read timeouts).

Run: ``prism schema serve`` (or ``uvicorn app.schema.service:app`` with ``PRISM_REGISTRY_DB``
and the ``PRISM_REGISTRY_USERS_FILE`` / ``_JWT_CONFIG`` / ``_ALLOW_ANONYMOUS`` settings).
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from typing import Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.decimal_text import decimal
from app.errors import JsonInputError
from app.schema import associations as assoc
from app.schema import authz
from app.schema.authz import RegistryAuthMiddleware, actor_of, registry_auth_from_env
from app.schema.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.schema.metrics import UNMATCHED_ROUTE
from app.schema.model import SchemaFormat
from app.schema.registry import (
    InvalidSchema,
    InvalidVersion,
    Registry,
    RegistryError,
    SubjectConfigNotFound,
    SubjectModeNotFound,
)
from app.schema.store import open_store
from app.security.http_auth import HttpAuth
from app.security.http_limits import BodyLimit, HttpLimits
from app.untrusted_json import loads_untrusted

CONFLUENT_CT = "application/vnd.schemaregistry.v1+json"
#: The one request-body limit of every route (a schema text is rarely over a few MB).
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Error code of a refused oversized body (Confluent has none; 413 + the HTTP status, as 40101 is 401 + 01).
ERROR_BODY_TOO_LARGE = 41301

#: Every request model: strict types (no "false" -> False, "3" -> 3), fields by their JSON
#: name only (``schema``, never also ``schema_``).
_STRICT = ConfigDict(strict=True, populate_by_name=False)
#: Prism /v1 models also refuse unknown fields (a misspelt or case-variant field is an error).
_STRICT_CLOSED = ConfigDict(strict=True, populate_by_name=False, extra="forbid")


class ConfluentJSON(JSONResponse):
    media_type = CONFLUENT_CT


class SchemaBody(BaseModel):
    schema_: str = Field(alias="schema")
    schemaType: str | None = None
    references: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None
    ruleSet: dict[str, Any] | None = None
    id: int | None = Field(None, description="IMPORT mode only: the schema's id in the registry it comes from")
    version: int | None = Field(None, description="IMPORT mode only: the version number to import it as")

    model_config = ConfigDict(strict=True, populate_by_name=False, extra="allow")


class ModeBody(BaseModel):
    mode: str

    model_config = _STRICT


class ConfigBody(BaseModel):
    compatibility: str | None = None
    compatibilityLevel: str | None = None

    model_config = ConfigDict(strict=True, populate_by_name=False, extra="allow")


class PrismRegisterBody(BaseModel):
    """RFC-030 ``POST /v1/schemas``. :meth:`policy_change` is the one reading of "does this
    request set the subject's compatibility policy" - the authorization check and the handler
    both call it on the same validated instance."""

    namespace: str | None = None
    topic: str = Field(description="subject (topic) name, e.g. orders.created")
    version: str | None = Field(None, description="label such as 'v2' (numbers are assigned by the registry)")
    format: str = "protobuf"
    schema_: str = Field(alias="schema", description="schema text (or base64 of it)")
    metadata: dict[str, Any] = Field(default_factory=dict, description=(
        "stored with the version; compatibility_mode (a string) also sets the subject's policy (admin)"))
    dry_run: bool = Field(False, description="a JSON boolean: check and report, store nothing")

    model_config = _STRICT_CLOSED

    @model_validator(mode="after")
    def _compatibility_mode_is_text(self) -> PrismRegisterBody:
        """``metadata.compatibility_mode`` changes a policy, so it gets a type too: a string
        (or null / absent). ``0``, ``false`` or ``["NONE"]`` would otherwise be "no change" to
        one reader and something else to the next."""
        mode = self.metadata.get("compatibility_mode")
        if mode is not None and not isinstance(mode, str):
            raise ValueError("metadata.compatibility_mode must be a string such as \"BACKWARD\"")
        return self

    def policy_change(self) -> str | None:
        """The compatibility mode this request sets on its subject, or None (also for dry runs)."""
        mode = self.metadata.get("compatibility_mode")
        return mode if isinstance(mode, str) and mode and not self.dry_run else None


class PrismCheckBody(BaseModel):
    schema_: str = Field(alias="schema")
    format: str = "protobuf"
    mode: str | None = None
    version: str | None = None

    model_config = _STRICT_CLOSED


class PolicyBody(BaseModel):
    """``PUT /v1/policies/{scope}``: each setting given is changed, each one left out stays."""

    compatibility: str | None = None
    pii_policy: str | None = None
    approval_required: bool | None = None
    #: RFC-030 "Migration Path" phase 2: topics of this scope need a schema (workers, SDK publish)
    require_schema: bool | None = None
    #: phase 3: every leaf field of a new schema needs a PII tag ("none" counts)
    require_pii_tags: bool | None = None

    model_config = _STRICT_CLOSED


class ApprovalBody(BaseModel):
    subject: str
    schema_: str = Field(alias="schema")
    format: str = "protobuf"
    reason: str = ""

    model_config = _STRICT_CLOSED


class ConsumerReport(BaseModel):
    subject: str
    version: int
    consumer_id: str

    model_config = _STRICT_CLOSED


def _actor(request: Request) -> str:
    """The verified principal (set by the auth middleware); never a client-supplied header."""
    return actor_of(request)


def _maybe_b64(text: str) -> str:
    """RFC-030 shows base64-encoded schema bodies; accept both that and plain text."""
    stripped = text.strip()
    if stripped and not any(c in stripped for c in " \n{;\"") and len(stripped) % 4 == 0:
        try:
            return base64.b64decode(stripped, validate=True).decode("utf-8")
        except Exception:
            return text
    return text


def _version_json(rv: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"subject": rv.subject, "version": rv.version, "id": rv.id, "schema": rv.schema}
    if rv.format is not SchemaFormat.AVRO:
        out["schemaType"] = rv.format.value
    if rv.references:  # Confluent leaves the key out when there are none
        out["references"] = [r.to_dict() for r in rv.references]
    return out


def _text(reg: Registry, body: SchemaBody) -> str:
    """The schema text of a Confluent request: protobuf sent in Confluent's serialized form
    (base64 ``FileDescriptorProto``, as its serializers send it) becomes ``.proto`` text."""
    if (body.schemaType or "").upper() != "PROTOBUF":
        return body.schema_
    return reg.text_from_serialized(body.schema_, body.references)


def _formatted(reg: Registry, out: dict[str, Any], fmt: str | None, refs: Any) -> dict[str, Any]:
    """Apply Confluent's ``?format=``: ``serialized`` turns a protobuf schema into base64 of
    its ``FileDescriptorProto`` (what Confluent's protobuf deserializers ask for); any other
    value, or another schema type, leaves the text as stored."""
    if fmt == "serialized" and out.get("schemaType") == SchemaFormat.PROTOBUF.value:
        out["schema"] = reg.serialized_form(SchemaFormat.PROTOBUF, out["schema"], tuple(refs))
    return out


def _schema_json(reg: Registry, schema_id: int) -> dict[str, Any]:
    """``GET /schemas/ids/{id}`` body (the route and the fast path share it)."""
    row = reg.schema_by_id(schema_id)
    out: dict[str, Any] = {"schema": row.schema}
    if row.format != SchemaFormat.AVRO.value:
        out["schemaType"] = row.format
    if refs := reg.references_of(row.id):
        out["references"] = [r.to_dict() for r in refs]
    return out


def create_app(registry: Registry | None = None, *, store_url: str | None = None,
               auth: HttpAuth | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               limits: HttpLimits | None = None) -> FastAPI:
    """Build the app around ``registry`` (or a store opened from ``store_url`` / ``PRISM_REGISTRY_DB``).

    ``auth`` says who may do what (:mod:`app.schema.authz`); without it the settings come from
    the environment, and none at all is a :class:`~app.errors.ConfigError` (never an open registry).
    ``max_body_bytes`` is the request-body limit of every route (tests use a small one);
    ``limits``, the rest of the HTTP limits (default: ``PRISM_HTTP_*``, app.security.http_limits)."""
    limits = (limits or HttpLimits.from_env()).with_body_limit(max_body_bytes)
    auth = auth if auth is not None else registry_auth_from_env()
    reg = registry or Registry(open_store(store_url or os.environ.get("PRISM_REGISTRY_DB")))
    app = FastAPI(title="Prism Schema Registry", version="1.0",
                  description="RFC-030 schema registry with a Confluent-compatible REST subset.")
    app.state.registry = reg
    app.router.route_class = _SlashRoute  # before any route is declared

    app.state.auth = auth
    # Order matters (last added runs first): requests are counted, then authenticated and
    # authorized, and only then may the fast path answer from its cache.
    app.add_middleware(_FastReads, registry=reg)
    app.add_middleware(RegistryAuthMiddleware, auth=auth)
    # before authentication: no Argon2 for 40 MB, no body read past the limit, no stalled body held
    app.add_middleware(BodyLimit, limits=limits, refusal=_confluent_refusal)
    app.add_middleware(_CountRequests, registry=reg)
    app.add_middleware(_EncodedSlashes)

    @app.exception_handler(authz.Refused)
    async def refused(_: Request, exc: authz.Refused) -> Response:
        status, headers, body = authz.refusal_response(auth, exc.status, exc.code, exc.message)
        out = Response(body, status_code=status, media_type=CONFLUENT_CT)
        for k, v in headers:
            if k.lower() != "content-type":
                out.headers.append(k, v)
        return out

    @app.exception_handler(RegistryError)
    async def registry_error(_: Request, exc: RegistryError) -> JSONResponse:
        body: dict[str, Any] = {"error_code": exc.code, "message": exc.message}
        if exc.findings:
            body["findings"] = [f.to_dict() for f in exc.findings]
        return ConfluentJSON(body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return ConfluentJSON({"error_code": 42201, "message": f"Invalid request: {exc.errors()}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _http_error_body(request, exc)

    @app.exception_handler(Exception)
    async def store_error(_: Request, exc: Exception) -> JSONResponse:
        return ConfluentJSON({"error_code": 50001, "message": f"Error in the backend data store: {exc}"},
                             status_code=500)

    # ---- the deciding dependencies of the write routes (authz.decide): each receives the
    # value the handler will receive - FastAPI's path parameter, or the validated model - and
    # returns it, so the handler acts on exactly what was authorized.
    @authz.decides
    def subject_writer(request: Request, subject: str) -> str:
        authz.decide(request, subject=subject)
        return subject

    @authz.decides
    def register_writer(request: Request, body: PrismRegisterBody) -> PrismRegisterBody:
        moves = (body.namespace is not None and not body.dry_run
                 and body.namespace != reg.namespace_for(body.topic))
        authz.decide(request, subject=body.topic, admin=body.policy_change() is not None or moves)
        return body

    @authz.decides
    def association_writer(request: Request, body: assoc.AssociationRequestBody) -> assoc.AssociationRequestBody:
        for subject in body.subjects_to_write():  # each subject bound, and the topic's own default subject
            authz.decide(request, subject=subject)
        return body

    @authz.decides
    def approval_writer(request: Request, body: ApprovalBody) -> ApprovalBody:
        authz.decide(request, subject=body.subject)
        return body

    def fmt_of(body_type: str | None, operation: str) -> SchemaFormat:
        try:
            return SchemaFormat.parse(body_type)
        except ValueError as e:
            reg.metrics.validation_failure(operation, "unknown_format")
            raise InvalidSchema(str(e)) from e

    # ------------------------------------------------------------------ Confluent subset --
    @app.get("/", response_class=ConfluentJSON, tags=["confluent"])
    def root() -> dict[str, Any]:
        return {}

    @app.get("/schemas/types", response_class=ConfluentJSON, tags=["confluent"])
    def schema_types() -> list[str]:
        return ["JSON", "PROTOBUF", "AVRO"]

    @app.get("/subjects", response_class=ConfluentJSON, tags=["confluent"])
    def list_subjects(deleted: bool = False, deletedOnly: bool = False) -> list[str]:
        if deletedOnly:  # Confluent: subjects whose versions are all soft-deleted
            return sorted(set(reg.subjects(include_deleted=True)) - set(reg.subjects()))
        return reg.subjects(include_deleted=deleted)

    @app.get("/subjects/{subject}/versions", response_class=ConfluentJSON, tags=["confluent"])
    def list_versions(subject: str, deleted: bool = False, deletedOnly: bool = False) -> list[int]:
        if deletedOnly:
            return [v.version for v in reg.versions(subject, include_deleted=True) if v.deleted]
        return [v.version for v in reg.versions(subject, include_deleted=deleted)]

    @app.post("/subjects/{subject}/versions", response_class=ConfluentJSON, tags=["confluent"])
    def register(request: Request, body: SchemaBody, subject: str = Depends(subject_writer),
                 normalize: bool = False) -> dict[str, Any]:
        res = reg.register(subject, _text(reg, body), fmt_of(body.schemaType, "register"), actor=_actor(request),
                           references=body.references, schema_id=body.id, version=body.version)
        out = {"id": res.version.id, "version": res.version.version, "subject": subject, "schema": body.schema_}
        if res.version.format is not SchemaFormat.AVRO:
            out["schemaType"] = res.version.format.value
        if res.version.references:
            out["references"] = [r.to_dict() for r in res.version.references]
        return out

    @app.post("/subjects/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def lookup(subject: str, body: SchemaBody, normalize: bool = False, deleted: bool = False) -> dict[str, Any]:
        return _version_json(reg.lookup(subject, _text(reg, body), fmt_of(body.schemaType, "lookup"),
                                        body.references, include_deleted=deleted))

    @app.get("/subjects/{subject}/versions/{version}", response_class=ConfluentJSON, tags=["confluent"])
    async def get_version(subject: str, version: str, deleted: bool = False,
                          format: str | None = None) -> dict[str, Any]:
        """Async on purpose: immutable versions are served from memory after the first read."""
        rv = reg.get(subject, _ver(version), include_deleted=deleted)
        return _formatted(reg, _version_json(rv), format, rv.references)

    @app.get("/subjects/{subject}/versions/{version}/schema", tags=["confluent"])
    def get_version_schema(subject: str, version: str, deleted: bool = False) -> PlainTextResponse:
        return PlainTextResponse(reg.get(subject, _ver(version), include_deleted=deleted).schema,
                                 media_type=CONFLUENT_CT)

    @app.get("/subjects/{subject}/versions/{version}/referencedby", response_class=ConfluentJSON,
             tags=["confluent"])
    def referenced_by(subject: str, version: str, offset: int = 0, limit: int = -1) -> list[int]:
        """Ids of live schemas whose references name this version (Confluent, with its paging)."""
        ids = reg.referenced_by(subject, _ver(version))[max(offset, 0):]
        return ids if limit < 0 else ids[:limit]

    @app.delete("/subjects/{subject}/versions/{version}", response_class=ConfluentJSON, tags=["confluent"])
    def delete_version(subject: str, version: str, request: Request, permanent: bool = False,
                       force: bool = False) -> int:
        return reg.delete_version(subject, _ver(version), actor=_actor(request), permanent=permanent, force=force)

    @app.delete("/subjects/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def delete_subject(subject: str, request: Request, permanent: bool = False, force: bool = False) -> list[int]:
        return reg.delete_subject(subject, actor=_actor(request), permanent=permanent, force=force)

    @app.get("/schemas/ids/{schema_id}", response_class=ConfluentJSON, tags=["confluent"])
    async def get_by_id(schema_id: int, subject: str | None = None, format: str | None = None) -> dict[str, Any]:
        """Async on purpose: schema texts (and references) by id never change, so they are cached forever."""
        return _formatted(reg, _schema_json(reg, schema_id), format, reg.references_of(schema_id))

    @app.get("/schemas/ids/{schema_id}/versions", response_class=ConfluentJSON, tags=["confluent"])
    def versions_of_id(schema_id: int, deleted: bool = False) -> list[dict[str, Any]]:
        reg.schema_by_id(schema_id)
        return [{"subject": v.subject, "version": v.version}
                for v in reg.store.versions_of_schema(schema_id, include_deleted=deleted)]

    @app.get("/config", response_class=ConfluentJSON, tags=["confluent"])
    def get_global_config() -> dict[str, Any]:
        return {"compatibilityLevel": reg.policy().compatibility.value}

    @app.put("/config", response_class=ConfluentJSON, tags=["confluent"])
    def put_global_config(body: ConfigBody, request: Request) -> dict[str, Any]:
        level = body.compatibility or body.compatibilityLevel
        reg.set_policy(actor=_actor(request), compatibility=level)
        return {"compatibility": reg.policy().compatibility.value}

    @app.get("/config/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def get_subject_config(subject: str, defaultToGlobal: bool = False) -> dict[str, Any]:
        level = reg.subject_config(subject)
        if level is None:
            if not defaultToGlobal:
                raise SubjectConfigNotFound(
                    f"Subject '{subject}' does not have subject-level compatibility configured")
            level = reg.policy(subject).compatibility.value
        return {"compatibilityLevel": level}

    @app.put("/config/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def put_subject_config(subject: str, body: ConfigBody, request: Request) -> dict[str, Any]:
        level = body.compatibility or body.compatibilityLevel
        reg.set_policy(actor=_actor(request), subject=subject, compatibility=level)
        return {"compatibility": reg.subject_config(subject)}

    @app.delete("/config/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def delete_subject_config(subject: str, request: Request) -> dict[str, Any]:
        return {"compatibility": reg.delete_subject_config(subject, _actor(request))}

    # Confluent /mode: READWRITE, READONLY, READONLY_OVERRIDE, IMPORT (see Registry.set_mode).
    @app.get("/mode", response_class=ConfluentJSON, tags=["confluent"])
    def get_global_mode() -> dict[str, Any]:
        return {"mode": reg.mode()}

    @app.put("/mode", response_class=ConfluentJSON, tags=["confluent"])
    def put_global_mode(body: ModeBody, request: Request, force: bool = False) -> dict[str, Any]:
        return {"mode": reg.set_mode(body.mode, actor=_actor(request), force=force)}

    @app.delete("/mode", response_class=ConfluentJSON, tags=["confluent"])
    def delete_global_mode(request: Request) -> dict[str, Any]:
        return {"mode": reg.delete_mode(None, actor=_actor(request))}

    @app.get("/mode/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def get_subject_mode(subject: str, defaultToGlobal: bool = False) -> dict[str, Any]:
        mode = reg.subject_mode(subject)
        if mode is None:
            if not defaultToGlobal:
                raise SubjectModeNotFound(f"Subject '{subject}' does not have subject-level mode configured")
            mode = reg.mode(subject)
        return {"mode": mode}

    @app.put("/mode/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def put_subject_mode(subject: str, body: ModeBody, request: Request, force: bool = False) -> dict[str, Any]:
        return {"mode": reg.set_mode(body.mode, actor=_actor(request), subject=subject, force=force)}

    @app.delete("/mode/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def delete_subject_mode(subject: str, request: Request) -> dict[str, Any]:
        return {"mode": reg.delete_mode(subject, actor=_actor(request))}

    def _compat_body(res: Any, verbose: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"is_compatible": res.is_compatible}
        if verbose:
            out["messages"] = [f"{f.path}: {f.reason} [{f.rule}]" for f in res.breaking]
        return out

    @app.post("/compatibility/subjects/{subject}/versions/{version}", response_class=ConfluentJSON,
              tags=["confluent"])
    def compat_version(subject: str, version: str, body: SchemaBody, verbose: bool = False,
                       normalize: bool = False) -> dict[str, Any]:
        res = reg.check(subject, _text(reg, body), fmt_of(body.schemaType, "check"), version=_ver(version),
                        references=body.references)
        return _compat_body(res, verbose)

    @app.post("/compatibility/subjects/{subject}/versions", response_class=ConfluentJSON, tags=["confluent"])
    def compat_all(subject: str, body: SchemaBody, verbose: bool = False, normalize: bool = False) -> dict[str, Any]:
        return _compat_body(reg.check(subject, _text(reg, body), fmt_of(body.schemaType, "check"),
                                      references=body.references), verbose)

    # ---- associations (Confluent): confluent-kafka's serializers and deserializers ask for the
    # topic's associated subject before their first message (app/schema/associations.py).
    @app.get("/associations/subjects/{subject}", response_class=ConfluentJSON, tags=["confluent"])
    def associations_by_subject(subject: str, resourceType: str | None = None,
                                associationType: list[str] | None = Query(None), lifecycle: str | None = None,
                                offset: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        return assoc.by_subject(reg, subject, resource_type=resourceType, association_types=associationType,
                                lifecycle=lifecycle, offset=offset, limit=limit)

    @app.get("/associations/resources/{resource_namespace}/{resource_name}", response_class=ConfluentJSON,
             tags=["confluent"])
    def associations_by_resource_name(resource_namespace: str, resource_name: str, resourceType: str | None = None,
                                      associationType: list[str] | None = Query(None),
                                      lifecycle: str | None = None, offset: int = 0,
                                      limit: int = -1) -> list[dict[str, Any]]:
        return assoc.by_resource_name(reg, resource_namespace, resource_name, resource_type=resourceType,
                                      association_types=associationType, lifecycle=lifecycle, offset=offset,
                                      limit=limit)

    @app.get("/associations/resources/{resource_id}", response_class=ConfluentJSON, tags=["confluent"])
    def associations_by_resource_id(resource_id: str, resourceType: str | None = None,
                                    associationType: list[str] | None = Query(None), lifecycle: str | None = None,
                                    offset: int = 0, limit: int = -1) -> list[dict[str, Any]]:
        return assoc.by_resource_id(reg, resource_id, resource_type=resourceType, association_types=associationType,
                                    lifecycle=lifecycle, offset=offset, limit=limit)

    @app.post("/associations", response_class=ConfluentJSON, tags=["confluent"])
    def create_association(request: Request, body: assoc.AssociationRequestBody = Depends(association_writer),
                           dryRun: bool = False) -> dict[str, Any]:
        return assoc.create(reg, body, actor=_actor(request), dry_run=dryRun)

    @app.delete("/associations/resources/{resource_id}", status_code=204, tags=["confluent"])
    def delete_associations(resource_id: str, request: Request, resourceType: str | None = None,
                            associationType: list[str] | None = Query(None), cascadeLifecycle: bool = False,
                            dryRun: bool = False, force: bool = False) -> Response:
        assoc.delete(reg, resource_id, actor=_actor(request), resource_type=resourceType,
                     association_types=associationType, cascade_lifecycle=cascadeLifecycle, dry_run=dryRun,
                     force=force)
        return Response(status_code=204)

    # ----------------------------------------------------------------------- Prism /v1 --
    @app.post("/v1/schemas", tags=["prism"])
    def v1_register(request: Request, body: PrismRegisterBody = Depends(register_writer)) -> dict[str, Any]:
        text = _maybe_b64(body.schema_)
        meta = dict(body.metadata)
        if (mode := body.policy_change()) is not None:  # the same call register_writer authorized
            reg.set_policy(actor=_actor(request), subject=body.topic, compatibility=mode)
        res = reg.register(body.topic, text, fmt_of(body.format, "register"), actor=_actor(request), namespace=body.namespace,
                           label=body.version, metadata=meta, dry_run=body.dry_run)
        rv = res.version
        base = str(request.base_url).rstrip("/")
        return {
            "schema_id": f"schema-{rv.id}", "id": rv.id, "subject": rv.subject, "version": rv.version,
            "label": rv.label, "hash": rv.hash, "created": res.created,
            "schema_url": f"{base}/v1/subjects/{rv.subject}/versions/{rv.version}",
            "validation": {
                "is_compatible": res.compat.is_compatible,
                "mode": res.compat.mode.value,
                "breaking_changes": [f.to_dict() for f in res.compat.breaking],
                "warnings": [f.to_dict() for f in [*res.compat.warnings, *res.pii_findings]],
            },
            "pii_fields": rv.metadata.get("pii_fields", []),
        }

    @app.get("/v1/subjects", tags=["prism"])
    def v1_subjects(namespace: str | None = None) -> list[dict[str, Any]]:
        out = []
        for s in reg.subjects():
            latest = reg.get(s, "latest")
            if namespace and latest.namespace != namespace:
                continue
            out.append({"subject": s, "namespace": latest.namespace, "latest_version": latest.version,
                        "format": latest.format.value})
        return out

    @app.get("/v1/subjects/{subject}/versions", tags=["prism"])
    def v1_versions(subject: str) -> list[dict[str, Any]]:
        consumers: dict[int, int] = {}
        for _, v, _ in reg.active_consumers(subject):
            consumers[v] = consumers.get(v, 0) + 1
        vs = reg.versions(subject)
        return [{**{k: val for k, val in v.to_dict().items() if k != "schema"},
                 "active_consumers": consumers.get(v.version, 0),
                 "status": "current" if v is vs[-1] else "previous"} for v in vs]

    @app.get("/v1/subjects/{subject}/versions/{version}", tags=["prism"])
    def v1_version(subject: str, version: str) -> dict[str, Any]:
        return reg.get(subject, _ver(version)).to_dict()

    @app.get("/v1/schemas/{schema_id}", tags=["prism"])
    def v1_schema(schema_id: int) -> dict[str, Any]:
        row = reg.schema_by_id(schema_id)
        return {"id": row.id, "hash": row.hash, "format": row.format, "schema": row.schema}

    @app.post("/v1/subjects/{subject}/check", tags=["prism"])
    def v1_check(subject: str, body: PrismCheckBody) -> dict[str, Any]:
        res = reg.check(subject, _maybe_b64(body.schema_), fmt_of(body.format, "check"),
                        version=_ver(body.version) if body.version else None, mode=body.mode)
        return res.to_dict()

    @app.get("/v1/subjects/{subject}/diff", tags=["prism"])
    def v1_diff(subject: str, from_version: str = Query(alias="from"),
                to_version: str = Query("latest", alias="to"), mode: str | None = None) -> dict[str, Any]:
        """The verdict of one version pair under the subject's configured compatibility (the
        mode a registration would apply; ``mode`` asks another), and a line diff of the two
        schemas' pretty forms (:mod:`app.schema.pretty`)."""
        a, b = reg.get(subject, _ver(from_version)), reg.get(subject, _ver(to_version))
        from app.schema.compat import check as compat_check
        from app.schema.model import CompatibilityMode
        from app.schema.pretty import schema_diff
        from app.schema.registry import InvalidCompatibilityLevel

        try:
            eff = CompatibilityMode.parse(mode) if mode else reg.policy(subject).compatibility
        except ValueError as e:
            raise InvalidCompatibilityLevel(str(e)) from e
        # Compared with their references resolved, like a registration would.
        res = compat_check(b.format, reg.effective(b.format, b.schema, b.references).comparable,
                           [(f"v{a.version}", reg.effective(a.format, a.schema, a.references).comparable)], eff)
        text = "\n".join(schema_diff(b.format, a.schema, b.schema, f"v{a.version}", f"v{b.version}"))
        return {"from": a.version, "to": b.version, "text_diff": text, **res.to_dict()}

    @app.delete("/v1/subjects/{subject}/versions/{version}", tags=["prism"])
    def v1_delete(subject: str, version: str, request: Request, force: bool = False,
                  permanent: bool = False) -> dict[str, Any]:
        n = reg.delete_version(subject, _ver(version), actor=_actor(request), force=force, permanent=permanent)
        return {"deleted": n}

    @app.get("/v1/policies", tags=["prism"])
    def v1_policies() -> list[dict[str, Any]]:
        """Every stored setting, by the scope key ``GET|PUT /v1/policies/{scope}`` take."""
        return [{"scope": c.scope, "kind": reg.policy_target(c.scope, check=False).kind, "compatibility": c.compatibility,
                 "pii_policy": c.pii_policy, "approval_required": c.approval_required,
                 "require_schema": c.require_schema, "require_pii_tags": c.require_pii_tags}
                for c in reg.store.configs()]

    @app.get("/v1/policies/{namespace}", tags=["prism"])
    def v1_get_policy(namespace: str) -> dict[str, Any]:
        """The effective policy of a scope (``__global__``, ``ns:<namespace>``, or a name: the
        subject of that name if the registry knows one, else the namespace) - resolved the way
        a registration resolves it, so it shows what the writes made it."""
        target = reg.policy_target(namespace)
        return {**reg.policy(target.subject, target.namespace).to_dict(), "scope": target.scope, "kind": target.kind}

    @app.put("/v1/policies/{namespace}", tags=["prism"])
    def v1_put_policy(namespace: str, body: PolicyBody, request: Request) -> dict[str, Any]:
        """Writes the scope the GET of the same name reads (:meth:`Registry.policy_target`)."""
        target = reg.policy_target(namespace)
        pol = reg.set_policy(actor=_actor(request), subject=target.subject, namespace=target.namespace,
                             compatibility=body.compatibility, pii_policy=body.pii_policy,
                             approval_required=body.approval_required, require_schema=body.require_schema,
                             require_pii_tags=body.require_pii_tags)
        return {**pol.to_dict(), "scope": target.scope, "kind": target.kind}

    @app.get("/v1/audit", tags=["prism"])
    def v1_audit(subject: str | None = None, limit: int = Query(100, ge=1, le=10_000)) -> list[dict[str, Any]]:
        # bounded: the store puts it in SQL, where 2**64 was a 500 and -1 meant "no limit"
        return reg.audit_log(subject, limit)

    @app.get("/v1/pii/audit", tags=["prism"])
    def v1_pii_audit() -> list[dict[str, Any]]:
        return [{"schema": e.label, "ok": e.ok, "untagged": list(e.untagged), "pii_fields": list(e.pii_fields)}
                for e in reg.pii_audit()]

    @app.post("/v1/approvals", tags=["prism"])
    def v1_request_approval(request: Request, body: ApprovalBody = Depends(approval_writer)) -> dict[str, Any]:
        row = reg.request_approval(body.subject, _maybe_b64(body.schema_), fmt_of(body.format, "approval"),
                                   actor=_actor(request), reason=body.reason)
        return _approval_json(row)

    @app.get("/v1/approvals", tags=["prism"])
    def v1_approvals(subject: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        return [_approval_json(a) for a in reg.store.approvals(subject, status)]

    @app.post("/v1/approvals/{approval_id}/{decision}", tags=["prism"])
    def v1_decide(approval_id: int, decision: str, request: Request) -> dict[str, Any]:
        if decision not in ("approve", "reject"):
            raise InvalidVersion("decision must be 'approve' or 'reject'")
        return _approval_json(reg.decide(approval_id, actor=_actor(request), approve=decision == "approve"))

    @app.post("/v1/consumers", tags=["prism"])
    def v1_report_consumer(body: ConsumerReport = Body(...)) -> dict[str, Any]:
        reg.report_consumer(body.subject, body.version, body.consumer_id)
        return {"ok": True}

    @app.get("/v1/subjects/{subject}/consumers", tags=["prism"])
    def v1_consumers(subject: str) -> list[dict[str, Any]]:
        return [{"consumer_id": c, "version": v, "last_seen": t} for c, v, t in reg.active_consumers(subject)]

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"description": "Prometheus text exposition format",
                              "content": {METRICS_CONTENT_TYPE: {"schema": {"type": "string"}}}}})
    async def metrics() -> Response:
        """Prometheus scrape endpoint: requests by route template and status, latency histogram,
        cache lookups (hit/miss, hit ratio), compatibility verdicts, validation failures by
        reason, PII-policy rejections. Published in OpenAPI like every other operations route."""
        return Response(reg.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, Any]:
        """Liveness: the process serves HTTP. Open (probes carry no credentials), no data."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"])
    def readyz() -> JSONResponse:
        """Readiness: the store answers (reads the global policy). Open, like ``/healthz``; 503
        with the exception's type name only when the store does not answer."""
        try:
            reg.policy()
        except Exception as exc:
            return JSONResponse({"status": "fail", "store": type(exc).__name__}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/ui", response_class=HTMLResponse, tags=["ui"], include_in_schema=False)
    def ui() -> str:
        from app.schema.ui import PAGE

        return PAGE

    missing = [f"{sorted(r.methods)} {r.path}" for r in app.routes if isinstance(r, APIRoute)
               for m in r.methods if (rule := authz.explicit_rule(m, r.path)) is not None
               and rule.need == authz.WRITE and not authz.has_decision(r.dependant)]
    if missing:  # a write route would be open to every writer: refuse to build the app
        raise RuntimeError(f"write routes without an authz.decides dependency: {missing}")
    _document_errors(app)
    app.state.started_at = time.time()
    return app


#: The error body of every refusal (Confluent's), as the OpenAPI document describes it.
_ERROR_BODY = {"type": "object", "required": ["error_code", "message"],
               "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"},
                              "findings": {"type": "array", "items": {"type": "object"}}}}
_ERRORS = {
    401: "no credentials, or wrong ones (40101)",
    403: "the credentials' roles do not allow this (40301)",
    404: "the subject, version, schema, association or configuration named does not exist (404xx)",
    408: "the request, or the body a route was reading, did not arrive in time (HTTP limits)",
    409: "conflicts with the stored state: an incompatible schema, an association (409xx)",
    413: "the request body is over the limit (41301)",
    429: "too many failed log-ins from this address",
    431: "the request headers are over the size or count limit (HTTP limits)",
    503: "too many open connections (HTTP limits), or the store is unreachable",
}


def _document_errors(app: FastAPI) -> None:
    """Declare in the OpenAPI document the refusals each route can give, so a client (and the
    schema-driven fuzzing of tests/security/test_api_fuzz.py) knows every status to expect:
    authentication, authorization and the HTTP limits on every route; 404 on a route that
    names something (a path parameter or a body); 409 on the writes."""
    for route in app.routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        names_something = bool(route.dependant.path_params) or route.body_field is not None
        for status, why in _ERRORS.items():
            if (status == 404 and not names_something) or (status == 409 and route.methods <= {"GET", "HEAD"}):
                continue
            route.responses.setdefault(status, {"description": why,
                                                "content": {CONFLUENT_CT: {"schema": _ERROR_BODY}}})


_SLASH = "\x00"  # stands for an encoded '/' inside one path segment while routing
_ENCODED_SLASH_KEY = "prism.encoded_slash"


class _EncodedSlashes:
    """Subjects may contain '/': Confluent's protobuf serializers register each import under
    its file name (``common/money.proto``), and clients send it percent-encoded
    (``/subjects/common%2Fmoney.proto/versions``). ASGI servers decode ``%2F`` into the path,
    where it would split the segment and miss every route. When the raw path has an encoded
    slash, this rebuilds the routing path with a placeholder in its place; :class:`_SlashRoute`
    turns the placeholder back into '/' in the path parameters. Other requests are untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and b"%2f" in raw.lower() and _SLASH not in scope["path"]:
            from urllib.parse import unquote

            segments = raw.decode("latin-1").split("/")
            scope = {**scope, _ENCODED_SLASH_KEY: True,
                     "path": "/".join(unquote(seg).replace("/", _SLASH) for seg in segments)}
        await self.app(scope, receive, send)


class _SlashRoute(APIRoute):
    """Every registry route: restores the '/' :class:`_EncodedSlashes` hid in a path
    parameter, refuses a request the middleware authorized under another route's rule
    (:func:`app.schema.authz.check_routed`), and parses JSON bodies with :class:`_JsonRequest`."""

    def matches(self, scope: Any) -> Any:
        match, child = super().matches(scope)
        if scope.get(_ENCODED_SLASH_KEY) and "path_params" in child:
            child["path_params"] = {k: v.replace(_SLASH, "/") if isinstance(v, str) else v
                                    for k, v in child["path_params"].items()}
        return match, child

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()
        template = self.path

        async def checked(request: Request) -> Response:
            authz.check_routed(request.scope, template)
            response: Response = await handler(_JsonRequest(request.scope, request.receive))
            return response

        return checked


class _JsonRequest(Request):
    """The request a route's body is parsed from: strict JSON, by the bounded decoder
    (``app.untrusted_json``). A duplicated key (Python keeps the last one, other parsers the
    first), ``NaN``/``Infinity`` (not JSON) and nesting past the depth limit are refused; each
    refusal is raised as a ``JSONDecodeError``, which FastAPI answers with a 422 ``json_invalid``.
    The size was already bounded by the body limit, before anything was read."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = loads_untrusted(body, what="request body", max_bytes=len(body),
                                             reject_duplicate_keys=True)
            except JsonInputError as exc:
                raise json.JSONDecodeError(exc.message, "", 0) from None
        return self._json


def _confluent_refusal(status: int, message: str) -> tuple[bytes, bytes]:
    """The HTTP layer's refusals (app.security.http_limits) in Confluent's error shape."""
    code = ERROR_BODY_TOO_LARGE if status == 413 else status * 100 + 1
    return json.dumps({"error_code": code, "message": message}).encode(), CONFLUENT_CT.encode()


class _CountRequests:
    """Pure-ASGI request metrics: count and latency by route template, method and status.
    (Starlette's BaseHTTPMiddleware costs ~0.3 ms per request and halves GET throughput; this
    costs one clock read and two cached-child updates.) The route is the matched route's path
    template, so ``/schemas/ids/1`` and ``/schemas/ids/2`` are one series."""

    def __init__(self, app: Any, registry: Registry) -> None:
        self.app, self.metrics = app, registry.metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or UNMATCHED_ROUTE
            self.metrics.request(template, scope["method"], status[0], time.perf_counter() - t0)


_BY_ID = re.compile(r"/schemas/ids/([0-9]{1,10})")
_BY_VERSION = re.compile(r"/subjects/([^/]+)/versions/(latest|-1|[0-9]{1,10})")


class _FastReads:
    """Serve the hot Confluent reads - ``GET /schemas/ids/{id}`` and
    ``GET /subjects/{s}/versions/{n|latest}`` without query parameters - from pre-serialized
    bodies, skipping routing, validation and JSON encoding (RFC-030: < 10 ms p99 fetch).

    Correctness: schema texts by id never change; a subject version only disappears on
    delete and "latest" moves on register/delete, and every such write clears
    ``Registry.response_cache`` (generation-checked, see ``Registry.cache_response``). The
    body is built from the same ``_version_json`` the route uses, so both answers are
    byte-identical. Unknown ids, subjects or versions get the Confluent error the route's
    exception handler would give; errors are never cached.
    """

    _HEADERS = [(b"content-type", CONFLUENT_CT.encode())]

    def __init__(self, app: Any, registry: Registry) -> None:
        self.app, self.registry, self.metrics = app, registry, registry.metrics
        self._routes: dict[str, Any] = {}

    def _route(self, scope: Any, template: str) -> Any:
        """The FastAPI route object of ``template``, so request metrics use the same label."""
        route = self._routes.get(template)
        if route is None:
            route = next((r for r in scope["app"].routes if getattr(r, "path", None) == template), None)
            self._routes[template] = route
        return route

    def _build(self, path: str) -> tuple[str, bytes] | None:
        reg = self.registry
        m = _BY_ID.fullmatch(path)
        if m is not None:
            return "/schemas/ids/{schema_id}", _json_bytes(_schema_json(reg, int(m.group(1))))
        m = _BY_VERSION.fullmatch(path)
        if m is not None:
            return "/subjects/{subject}/versions/{version}", _json_bytes(
                _version_json(reg.get(m.group(1), _ver(m.group(2)))))
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope["method"] != "GET" or scope["query_string"]
                or scope.get(_ENCODED_SLASH_KEY)):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        self.registry.sync()  # another worker process may have written since the last request
        hit = self.registry.response_cache.get(path)
        if hit is None:
            if not path.startswith(("/schemas/ids/", "/subjects/")):
                await self.app(scope, receive, send)
                return
            if not (_BY_ID.fullmatch(path) or _BY_VERSION.fullmatch(path)):
                await self.app(scope, receive, send)
                return
            self.metrics.cache("response", False)
            gen = self.registry.cache_generation
            try:
                built = self._build(path)
            except RegistryError as exc:  # the same body and status the route's handler gives
                scope["route"] = self._route(scope, "/schemas/ids/{schema_id}" if path.startswith("/schemas/")
                                             else "/subjects/{subject}/versions/{version}")
                await ConfluentJSON({"error_code": exc.code, "message": exc.message},
                                    status_code=exc.status)(scope, receive, send)
                return
            assert built is not None
            template, body = built
            self.registry.cache_response(path, gen, body)
            scope["route"] = self._route(scope, template)
        else:
            self.metrics.cache("response", True)
            body = hit
            scope["route"] = self._route(scope, "/schemas/ids/{schema_id}" if path.startswith("/schemas/")
                                         else "/subjects/{subject}/versions/{version}")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*self._HEADERS, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _http_error_body(request: Request, exc: StarletteHTTPException) -> Response:
    """Routing errors in Confluent's shape: an unknown path is ``{"error_code": 404}`` and a
    known path with the wrong method ``{"error_code": 405}`` (Confluent's Jetty answers both
    with the HTTP status as the error code), so every non-2xx answer a client sees has
    ``error_code`` and ``message``. The message names the method and path, so a typo is easy
    to spot; ``Allow`` is kept on 405 (RFC 9110)."""
    reason = {404: "HTTP 404 Not Found", 405: "HTTP 405 Method Not Allowed"}.get(exc.status_code, str(exc.detail))
    body = {"error_code": exc.status_code,
            "message": f"{reason}: {request.method} {request.url.path}"}
    return ConfluentJSON(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def _json_bytes(obj: Any) -> bytes:
    """What Starlette's JSONResponse renders, so fast and slow paths send the same bytes."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def _ver(v: str) -> int | str:
    if v == "latest" or v == "-1":
        return "latest"
    n = decimal(v.removeprefix("-"))
    return v if n is None else (-n if v.startswith("-") else n)


def _approval_json(a: Any) -> dict[str, Any]:
    return {"id": a.id, "subject": a.subject, "hash": a.hash, "format": a.format, "requested_by": a.requested_by,
            "reason": a.reason, "status": a.status, "decided_by": a.decided_by, "created_at": a.created_at,
            "decided_at": a.decided_at}


def __getattr__(name: str) -> Any:
    """``uvicorn app.schema.service:app`` builds the app lazily (no store opened on import)."""
    if name == "app":
        return create_app()
    raise AttributeError(name)
