"""Confluent's associations API (app/schema/associations.py) through the app, as the roles a
deployment hands out: lookups are reads, creating needs write on the subject *and* on the
topic's default subject, deleting needs admin; Confluent's error codes; storage on SQLite and
PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.schema.registry import Registry
from app.schema.service import create_app
from app.security.http_auth import HttpAuth
from tests.support import auth_headers

AVRO = '{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}'


@pytest.fixture
def client(registry: Registry, auth: HttpAuth) -> TestClient:
    for subject in ("orders.created-value", "orders.contracts.v1", "pay.created-value"):
        registry.register(subject, AVRO, "AVRO", actor="seed")
    return TestClient(create_app(registry, auth=auth))


def req(topic: str = "orders.created", subject: str = "orders.contracts.v1", **extra: object) -> dict:
    info = {"subject": subject, "associationType": "value", **extra}
    return {"resourceName": topic, "resourceNamespace": "lkc-1", "resourceId": f"lkc-1:{topic}",
            "resourceType": "topic", "associations": [info]}


def as_(who: str) -> dict[str, str]:
    return auth_headers(who)


def test_lookup_is_a_read_and_empty_when_nothing_is_associated(client: TestClient) -> None:
    path = "/associations/resources/-/orders.created?resourceType=topic&associationType=value"
    for who in ("reader", "writer", "admin"):
        r = client.get(path, headers=as_(who))
        assert (r.status_code, r.json()) == (200, [])  # Confluent: a list, never 404
        assert r.headers["content-type"] == "application/vnd.schemaregistry.v1+json"
    r = client.get(path)
    assert (r.status_code, r.json()["error_code"]) == (401, 40101)


def test_create_lookup_and_delete(client: TestClient, registry: Registry) -> None:
    r = client.post("/associations", json=req(), headers=as_("writer"))
    assert r.status_code == 200, r.text
    assert r.json() == {"resourceName": "orders.created", "resourceNamespace": "lkc-1",
                        "resourceId": "lkc-1:orders.created", "resourceType": "topic",
                        "associations": [{"subject": "orders.contracts.v1", "associationType": "value",
                                          "lifecycle": "WEAK", "frozen": False}]}
    # idempotent: the same association again
    assert client.post("/associations", json=req(), headers=as_("writer")).status_code == 200
    for path in ("/associations/resources/-/orders.created", "/associations/resources/lkc-1/orders.created",
                 "/associations/resources/lkc-1:orders.created", "/associations/subjects/orders.contracts.v1",
                 "/associations/resources/-/orders.created?associationType=value&associationType=key"):
        got = client.get(path, headers=as_("reader")).json()
        assert [(a["subject"], a["resourceName"], a["associationType"]) for a in got] == [
            ("orders.contracts.v1", "orders.created", "value")], path
        assert got[0]["guid"] and got[0]["resourceNamespace"] == "lkc-1"
    for path in ("/associations/resources/other-cluster/orders.created",
                 "/associations/resources/-/orders.created?associationType=key",
                 "/associations/resources/-/orders.created?offset=1",
                 "/associations/resources/-/orders.created?lifecycle=STRONG"):
        assert client.get(path, headers=as_("reader")).json() == [], path
    assert client.get("/associations/resources/-/orders.created?limit=1", headers=as_("reader")).json() != []
    # a second subject for the same slot is a conflict
    r = client.post("/associations", json=req(subject="orders.created-value"), headers=as_("writer"))
    assert (r.status_code, r.json()["error_code"]) == (409, 40903)
    actions = [(a["actor"], a["action"]) for a in registry.audit_log("orders.contracts.v1")]
    assert ("writer", "association.create") in actions
    # deleting is admin only
    r = client.delete("/associations/resources/lkc-1:orders.created", headers=as_("writer"))
    assert (r.status_code, r.json()["error_code"]) == (403, 40301)
    assert client.delete("/associations/resources/lkc-1:orders.created", headers=as_("admin")).status_code == 204
    assert client.get("/associations/resources/-/orders.created", headers=as_("reader")).json() == []
    r = client.delete("/associations/resources/lkc-1:orders.created", headers=as_("admin"))
    assert (r.status_code, r.json()["error_code"]) == (404, 40410)
    assert registry.subjects() == ["orders.contracts.v1", "orders.created-value", "pay.created-value"]  # subjects stay


@pytest.mark.parametrize(("topic", "subject"), [
    ("pay.created", "orders.contracts.v1"),   # another team's topic redirected to my subject
    ("orders.created", "pay.created-value"),  # my topic bound to another team's subject
])
def test_a_writer_binds_only_its_own_topics_to_its_own_subjects(client: TestClient, topic: str, subject: str) -> None:
    r = client.post("/associations", json=req(topic, subject), headers=as_("writer"))
    assert (r.status_code, r.json()["error_code"]) == (403, 40301)
    assert client.get(f"/associations/resources/-/{topic}", headers=as_("admin")).json() == []
    r = client.post("/associations", json=req(topic, subject), headers=as_("reader"))
    assert (r.status_code, r.json()["error_code"]) == (403, 40301)
    assert client.post("/associations", json=req(topic, subject), headers=as_("admin")).status_code == 200


@pytest.mark.parametrize(("body", "code"), [
    (req(subject="orders.nothing-here"), 40907),
    (req(associationType="body"), 42212),
    (req(lifecycle="FOREVER"), 42212),
    (req(schema={"schema": AVRO}), 42212),
    ({**req(), "resourceType": "stream"}, 42212),
    ({**req(), "resourceId": None}, 42212),
    ({**req(), "resourceNamespace": "-"}, 42212),
    ({**req(), "associations": []}, 42212),
    ({**req(), "associations": [req()["associations"][0]] * 2}, 42212),
    ({**req(), "associations": [{"subject": "orders.contracts.v1", "frozen": "true"}]}, 42201),  # strict types
])
def test_invalid_requests(client: TestClient, body: dict, code: int) -> None:
    r = client.post("/associations", json=body, headers=as_("writer"))
    assert r.json()["error_code"] == code, r.text
    assert client.get("/associations/resources/-/orders.created", headers=as_("reader")).json() == []


def test_frozen_read_only_mode_dry_run_and_cascade(client: TestClient) -> None:
    r = client.post("/associations?dryRun=true", json=req(), headers=as_("writer"))
    assert r.status_code == 200 and client.get("/associations/resources/-/orders.created",
                                                headers=as_("reader")).json() == []
    assert client.post("/associations", json=req(frozen=True, lifecycle="STRONG"), headers=as_("writer")).status_code == 200
    r = client.post("/associations", json=req(frozen=False), headers=as_("writer"))
    assert (r.status_code, r.json()["error_code"]) == (409, 40908)
    r = client.delete("/associations/resources/lkc-1:orders.created", headers=as_("admin"))
    assert (r.status_code, r.json()["error_code"]) == (409, 40908)
    r = client.delete("/associations/resources/lkc-1:orders.created?cascadeLifecycle=true", headers=as_("admin"))
    assert (r.status_code, r.json()["error_code"]) == (422, 42212)
    assert client.put("/mode", json={"mode": "READONLY"}, headers=as_("admin")).status_code == 200
    r = client.post("/associations", json=req("orders.other"), headers=as_("writer"))
    assert (r.status_code, r.json()["error_code"]) == (422, 42205)


def test_an_admin_can_delete_a_writers_frozen_association_and_so_unfreeze_it(client: TestClient,
                                                                               registry: Registry) -> None:
    """Issue 28: `frozen` is set by the writer who creates the association; without force=true
    nobody could undo it. force is admin only (the route is), dryRun still touches nothing, and
    the audit log says it was forced."""
    assert client.post("/associations", json=req(frozen=True), headers=as_("writer")).status_code == 200
    path = "/associations/resources/lkc-1:orders.created"
    r = client.delete(path, headers=as_("admin"))
    assert (r.status_code, r.json()["error_code"]) == (409, 40908) and "force=true" in r.json()["message"]
    for who in ("writer", "reader"):  # force does not lower the role the route needs
        r = client.delete(path + "?force=true", headers=as_(who))
        assert (r.status_code, r.json()["error_code"]) == (403, 40301)
    r = client.delete(path + "?force=true")
    assert (r.status_code, r.json()["error_code"]) == (401, 40101)
    for bad in ("yes-please", "", "2", "true&force=false&force=maybe"):  # not a boolean: refused, not guessed
        r = client.delete(f"{path}?force={bad}", headers=as_("admin"))
        assert r.status_code in (409, 422), (bad, r.text)  # 422: not a bool; 409: the last valid value, false
    assert client.delete(path + "?force=true&dryRun=true", headers=as_("admin")).status_code == 204
    assert len(client.get("/associations/resources/-/orders.created", headers=as_("reader")).json()) == 1
    assert client.delete(path + "?force=true", headers=as_("admin")).status_code == 204
    assert client.get("/associations/resources/-/orders.created", headers=as_("reader")).json() == []
    entry = next(a for a in registry.audit_log("orders.contracts.v1") if a["action"] == "association.delete")
    assert entry["actor"] == "admin" and entry["detail"]["forced_frozen"] is True
    # unfrozen: the same association again without frozen
    r = client.post("/associations", json=req(frozen=False), headers=as_("writer"))
    assert r.status_code == 200 and r.json()["associations"][0]["frozen"] is False
    assert client.delete(path, headers=as_("admin")).status_code == 204  # no force needed any more


def test_a_permanently_deleted_subject_takes_its_associations_with_it(client: TestClient, registry: Registry) -> None:
    """Issue 28: after a permanent delete the association still sent confluent-kafka clients to the
    missing subject. A soft delete keeps it (the subject can come back); the permanent one removes
    it, frozen or not, with an audit entry; the topic's lookup is then empty, so clients fall back
    to <topic>-value."""
    assert client.post("/associations", json=req(frozen=True), headers=as_("writer")).status_code == 200
    assert client.post("/associations", json=req("orders.other", frozen=False), headers=as_("writer")).status_code == 200
    subject = "/subjects/orders.contracts.v1"
    assert client.delete(subject, headers=as_("admin")).status_code == 200  # soft
    got = client.get("/associations/resources/-/orders.created", headers=as_("reader")).json()
    assert [a["subject"] for a in got] == ["orders.contracts.v1"]
    assert client.delete(subject + "?permanent=true", headers=as_("admin")).status_code == 200
    for topic in ("orders.created", "orders.other"):
        assert client.get(f"/associations/resources/-/{topic}", headers=as_("reader")).json() == []
    assert client.get("/associations/subjects/orders.contracts.v1", headers=as_("reader")).json() == []
    reasons = [a["detail"].get("reason") for a in registry.audit_log("orders.contracts.v1")
               if a["action"] == "association.delete"]
    assert reasons == ["subject permanently deleted"] * 2
    # the subject registered again starts without the old bindings
    registry.register("orders.contracts.v1", AVRO, "AVRO", actor="seed")
    assert client.get("/associations/resources/-/orders.created", headers=as_("reader")).json() == []


def test_associations_left_behind_by_an_older_registry_are_answered_as_gone(client: TestClient,
                                                                           registry: Registry) -> None:
    """A database written before the clean-up existed (or a crash between purge and clean-up):
    the stored association names a subject with no version at all. Lookups by topic leave it out;
    the lookup by that subject is 404 40401, as every read of a missing subject."""
    assert client.post("/associations", json=req(), headers=as_("writer")).status_code == 200
    registry.store.mark_deleted("orders.contracts.v1", 1)
    registry.store.purge_version("orders.contracts.v1", 1)  # behind the registry's back: no clean-up
    assert client.get("/associations/resources/-/orders.created", headers=as_("reader")).json() == []
    assert client.get("/associations/resources/lkc-1:orders.created", headers=as_("reader")).json() == []
    r = client.get("/associations/subjects/orders.contracts.v1", headers=as_("reader"))
    assert (r.status_code, r.json()["error_code"]) == (404, 40401)
    # the admin can still remove the leftover
    assert client.delete("/associations/resources/lkc-1:orders.created", headers=as_("admin")).status_code == 204
