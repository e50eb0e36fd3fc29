"""Confluent's associations API: a Kafka topic's key or value bound to a subject.

Why this exists: confluent-kafka 2.16's serializers and deserializers default to the
*associated* subject name strategy - before the first (de)serialization of a topic they ask
``GET /associations/resources/{namespace}/{topic}?resourceType=topic&associationType=value``
(namespace ``-``, the wildcard, unless ``subject.name.strategy.kafka.cluster.id`` is set) and
use the subject returned, falling back to ``<topic>-value`` when the answer is empty (or a
404). Without these routes the request fell to the registry's "no rule: admin" default, so
every producer and consumer that was not an admin failed with 403.

Semantics follow Confluent's ``AssociationsResource``: reads return a list (empty when
nothing is associated; never 404), one subject per (resource id, key|value), a second
subject for the same slot is a conflict (40903), a subject needs a live version (40907),
a frozen association cannot be changed or deleted (40908) - except by an admin's
``DELETE ...?force=true`` (a Prism extension: a writer's ``frozen`` must not bind the admin
forever) - a missing one is 40410 and an invalid request 42212. When a subject is permanently
deleted its associations go with it (:func:`forget_subject`), and lookups never return one
whose subject is gone, so clients fall back to ``<topic>-value`` instead of a missing subject. Who may call what is in :mod:`app.schema.authz` (reads: ``read``;
create: write on every subject *and* on the topic's own default subject; delete: ``admin``)
and explained in docs/schema-registry.md ("Associations").

Not supported (refused with 42212 rather than half-done): a ``schema`` inside a create
request (register it first, then associate), resource types other than ``topic``, and
``cascadeLifecycle=true`` on delete (Prism deletes subjects only through the subject routes,
which keep their own safety checks).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.schema.registry import Registry, RegistryError, SubjectNotFound
from app.schema.store import AssociationRow

RESOURCE_TYPES = ("topic",)
ASSOCIATION_TYPES = ("key", "value")
LIFECYCLES = ("STRONG", "WEAK")


class AssociationNotFound(RegistryError):
    status, code = 404, 40410


class AssociationExists(RegistryError):
    status, code = 409, 40903


class NoActiveSubjectVersion(RegistryError):
    status, code = 409, 40907


class AssociationFrozen(RegistryError):
    status, code = 409, 40908


class InvalidAssociation(RegistryError):
    status, code = 422, 42212


class AssociationInfoBody(BaseModel):
    """One association of a create request (Confluent's ``AssociationCreateOrUpdateInfo``)."""

    subject: str | None = None
    associationType: str | None = None
    lifecycle: str | None = None
    frozen: bool | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    normalize: bool | None = None

    # As the other Confluent models: unknown fields accepted (newer clients send more), known ones strictly typed.
    model_config = ConfigDict(strict=True, populate_by_name=False, extra="allow")


class AssociationRequestBody(BaseModel):
    """``POST /associations`` (Confluent's ``AssociationCreateOrUpdateRequest``)."""

    resourceName: str | None = None
    resourceNamespace: str | None = None
    resourceId: str | None = None
    resourceType: str | None = None
    associations: list[AssociationInfoBody] = Field(default_factory=list)

    model_config = ConfigDict(strict=True, populate_by_name=False, extra="allow")

    def association_type(self, info: AssociationInfoBody) -> str:
        """The one reading of an association's type (default ``value``, as Confluent)."""
        return (info.associationType or "value").lower()

    def subjects_to_write(self) -> list[str]:
        """Every subject the request binds a topic to, plus the topic's own default subject
        per association type (``<topic>-value``) - the authorization check and the handler
        both read the request through this. Why the topic too: an association redirects
        every default-configured producer and consumer of the topic to another subject, so
        binding ``payments.created`` to ``orders.x-value`` is a change to the payments
        team's topic, not only to the orders team's subject."""
        topic = self.resourceName or ""
        out = [info.subject or "" for info in self.associations]
        out += [f"{topic}-{self.association_type(info)}" for info in self.associations]
        return out or [f"{topic}-value"]  # an empty request (refused later, 42212) is still decided


def to_json(a: AssociationRow) -> dict[str, Any]:
    """Confluent's ``Association`` JSON."""
    return {"subject": a.subject, "guid": a.guid, "resourceName": a.resource_name,
            "resourceNamespace": a.resource_namespace, "resourceId": a.resource_id,
            "resourceType": a.resource_type, "associationType": a.association_type,
            "lifecycle": a.lifecycle, "frozen": a.frozen}


def _resource_type(value: str | None) -> str:
    rt = (value or "topic").lower()
    if rt not in RESOURCE_TYPES:
        raise InvalidAssociation(f"Invalid association: resourceType {value!r} is not supported (only 'topic')")
    return rt


def _types(values: Sequence[str] | None) -> set[str] | None:
    if not values:
        return None
    out = {v.lower() for v in values}
    bad = sorted(out - set(ASSOCIATION_TYPES))
    if bad:
        raise InvalidAssociation(f"Invalid association: associationType {bad[0]!r} is not 'key' or 'value'")
    return out


def _filtered(reg: Registry, rows: list[AssociationRow], types: Sequence[str] | None, lifecycle: str | None,
              offset: int, limit: int) -> list[dict[str, Any]]:
    """The rows asked for - never one whose subject is gone for good (no version at all, not
    even a soft-deleted one): a database written before :func:`forget_subject` existed, or a
    crash between the purge and the clean-up, must not send clients to a missing subject."""
    wanted = _types(types)
    life = lifecycle.upper() if lifecycle else None
    keep = [r for r in rows if (wanted is None or r.association_type in wanted) and (life is None or r.lifecycle == life)]
    exists: dict[str, bool] = {}
    keep = [r for r in keep if exists.setdefault(r.subject, bool(reg.store.versions(r.subject, include_deleted=True)))]
    keep = keep[max(offset, 0):]
    if limit > 0:
        keep = keep[:limit]
    return [to_json(r) for r in keep]


def by_resource_name(reg: Registry, namespace: str, name: str, *, resource_type: str | None = None,
                     association_types: Sequence[str] | None = None, lifecycle: str | None = None,
                     offset: int = 0, limit: int = -1) -> list[dict[str, Any]]:
    """``GET /associations/resources/{namespace}/{name}``; namespace ``-`` matches any."""
    rows = reg.store.associations(resource_type=_resource_type(resource_type), resource_name=name,
                                  resource_namespace=None if namespace == "-" else namespace)
    return _filtered(reg, rows, association_types, lifecycle, offset, limit)


def by_resource_id(reg: Registry, resource_id: str, *, resource_type: str | None = None,
                   association_types: Sequence[str] | None = None, lifecycle: str | None = None,
                   offset: int = 0, limit: int = -1) -> list[dict[str, Any]]:
    """``GET /associations/resources/{resourceId}``."""
    rows = reg.store.associations(resource_type=_resource_type(resource_type), resource_id=resource_id)
    return _filtered(reg, rows, association_types, lifecycle, offset, limit)


def by_subject(reg: Registry, subject: str, *, resource_type: str | None = None,
               association_types: Sequence[str] | None = None, lifecycle: str | None = None,
               offset: int = 0, limit: int = -1) -> list[dict[str, Any]]:
    """``GET /associations/subjects/{subject}``; a subject gone for good (no version, not even a
    soft-deleted one) that still has associations stored is answered 404 40401, as every other
    read of a missing subject is."""
    rows = reg.store.associations(resource_type=_resource_type(resource_type), subject=subject)
    if rows and not reg.store.versions(subject, include_deleted=True):
        raise SubjectNotFound(f"Subject '{subject}' not found.")
    return _filtered(reg, rows, association_types, lifecycle, offset, limit)


def create(reg: Registry, body: AssociationRequestBody, *, actor: str, dry_run: bool = False) -> dict[str, Any]:
    """``POST /associations``: validate the whole request, then store every association of
    it in one transaction (or none, on ``dry_run``). Re-sending an existing association is
    idempotent (lifecycle and frozen may change unless it is frozen)."""
    for field in ("resourceName", "resourceNamespace", "resourceId"):
        if not getattr(body, field):
            raise InvalidAssociation(f"Invalid association: {field} is required")
    if body.resourceNamespace == "-":
        raise InvalidAssociation("Invalid association: resourceNamespace '-' is the lookup wildcard, not a namespace")
    rtype = _resource_type(body.resourceType)
    if not body.associations:
        raise InvalidAssociation("Invalid association: associations must not be empty")
    name, namespace, rid = str(body.resourceName), str(body.resourceNamespace), str(body.resourceId)
    existing = {r.association_type: r for r in reg.store.associations(resource_type=rtype, resource_id=rid)}
    for r in existing.values():
        if (r.resource_name, r.resource_namespace) != (name, namespace):
            raise InvalidAssociation(f"Invalid association: resourceId {rid!r} is {r.resource_namespace}/"
                                     f"{r.resource_name}, not {namespace}/{name}")
    rows: list[AssociationRow] = []
    seen: set[str] = set()
    for info in body.associations:
        atype = body.association_type(info)
        _types([atype])
        if atype in seen:
            raise InvalidAssociation(f"Invalid association: associationType {atype!r} appears twice")
        seen.add(atype)
        if not info.subject:
            raise InvalidAssociation("Invalid association: subject is required")
        if info.schema_ is not None:
            raise InvalidAssociation("Invalid association: a schema inside an association request is not "
                                     "supported by this registry; register it under the subject first")
        lifecycle = (info.lifecycle or "WEAK").upper()
        if lifecycle not in LIFECYCLES:
            raise InvalidAssociation(f"Invalid association: lifecycle {info.lifecycle!r} is not STRONG or WEAK")
        reg._check_writable(info.subject, "creating an association")
        if not reg.store.versions(info.subject):
            raise NoActiveSubjectVersion(f"No active (non-deleted) version exists for subject '{info.subject}'")
        old = existing.get(atype)
        if old is not None and old.subject != info.subject:
            raise AssociationExists(f"An association of type '{atype}' already exists for resource '{name}' "
                                    f"(subject '{old.subject}'); delete it first (admin)")
        frozen = bool(info.frozen) if info.frozen is not None else (old.frozen if old else False)
        if old is not None and old.frozen and (old.lifecycle, old.frozen) != (lifecycle, frozen):
            raise AssociationFrozen(f"The association of type '{atype}' is frozen for subject '{old.subject}'")
        rows.append(AssociationRow(old.guid if old else str(uuid.uuid4()), info.subject, name, namespace, rid, rtype,
                                   atype, lifecycle, frozen))
    if not dry_run:
        reg.store.put_associations(rows)
        for a in rows:
            reg.store.append_audit(actor, "association.create", a.subject, None,
                                   {"resource": f"{a.resource_namespace}/{a.resource_name}", "resource_id": a.resource_id,
                                    "association_type": a.association_type, "lifecycle": a.lifecycle,
                                    "frozen": a.frozen})
    return {"resourceName": name, "resourceNamespace": namespace, "resourceId": rid, "resourceType": rtype,
            "associations": [{"subject": a.subject, "associationType": a.association_type,
                              "lifecycle": a.lifecycle, "frozen": a.frozen} for a in rows]}


def delete(reg: Registry, resource_id: str, *, actor: str, resource_type: str | None = None,
           association_types: Sequence[str] | None = None, cascade_lifecycle: bool = False,
           dry_run: bool = False, force: bool = False) -> None:
    """``DELETE /associations/resources/{resourceId}``: the resource's associations (of the
    given types; all by default). The subjects stay.

    ``force`` (Prism's ``?force=true``; the route is admin-only): frozen associations are
    deleted too. Why: ``frozen`` is set by whoever creates the association - a writer - and
    without this nobody could ever undo it, not even an admin. To unfreeze, delete with force
    and create it again with ``frozen: false``. The audit entry says it was forced."""
    if cascade_lifecycle:
        raise InvalidAssociation("Invalid association: cascadeLifecycle=true is not supported by this registry; "
                                 "delete the associations, then the subject with DELETE /subjects/{subject}")
    wanted = _types(association_types)
    rows = [r for r in reg.store.associations(resource_type=_resource_type(resource_type), resource_id=resource_id)
            if wanted is None or r.association_type in wanted]
    if not rows:
        raise AssociationNotFound(f"Association for '{resource_id}' not found.")
    for r in rows:
        if r.frozen and not force:
            raise AssociationFrozen(f"The association of type '{r.association_type}' is frozen for subject "
                                    f"'{r.subject}'; an admin may delete it with force=true")
    if dry_run:
        return
    reg.store.delete_associations([r.guid for r in rows])
    for r in rows:
        reg.store.append_audit(actor, "association.delete", r.subject, None,
                               {"resource": f"{r.resource_namespace}/{r.resource_name}", "resource_id": r.resource_id,
                                "association_type": r.association_type,
                                **({"forced_frozen": True} if r.frozen else {})})


def forget_subject(reg: Registry, subject: str, *, actor: str) -> list[AssociationRow]:
    """Remove every association of ``subject`` once it is permanently deleted (its last version
    purged), frozen ones included, each with an audit entry. Why: a confluent-kafka client
    that asks for a topic's associated subject would otherwise be sent to a subject that no
    longer exists and fail on every message, instead of falling back to ``<topic>-value``."""
    if reg.store.versions(subject, include_deleted=True):
        return []
    rows = [r for rt in RESOURCE_TYPES for r in reg.store.associations(resource_type=rt, subject=subject)]
    if rows:
        reg.store.delete_associations([r.guid for r in rows])
    for r in rows:
        reg.store.append_audit(actor, "association.delete", r.subject, None,
                               {"resource": f"{r.resource_namespace}/{r.resource_name}", "resource_id": r.resource_id,
                                "association_type": r.association_type, "reason": "subject permanently deleted",
                                **({"forced_frozen": True} if r.frozen else {})})
    return rows


__all__ = ["AssociationExists", "AssociationFrozen", "AssociationInfoBody", "AssociationNotFound",
           "AssociationRequestBody", "InvalidAssociation", "NoActiveSubjectVersion", "by_resource_id",
           "by_resource_name", "by_subject", "create", "delete", "forget_subject", "to_json"]
