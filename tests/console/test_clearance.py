"""Classification clearance on the console's DLQ pages (app/console/clearance.py), over real
DLQ, output and audit topics on the embedded broker: a `restricted` envelope in the DLQ is shown
to a reader of the default clearance (`internal`) as metadata only - in the list, the record page,
the trace page and the search, whose matches would otherwise be an oracle for the withheld error
text - while an admin cleared for `restricted` sees it and may replay it, and an admin of the
default clearance may not. Each withheld view writes one signed `classified_refused` record that
`prism audit --keyring` verifies; reloading a page N times writes N records, not one per record.

The worker's connector info is replaced in memory (the DLQ and outputs are real); the replay
itself is recorded rather than run (tests/console/test_console_browser.py runs real ones)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker
from app.cli.dlq import Outcome, ReplayReport
from app.console import create_app
from app.console.backends import Kafka, Workers
from app.console.clearance import RefusalAudit, Withheld, label
from app.console.settings import audit_key
from app.envelope.codec import Layout, encode
from app.envelope.model import new_envelope
from app.errors import ConfigError
from app.sdk.audit import RANK, REFUSALS_PER_RECORD
from app.security.http_auth import hash_password, load_users
from app.security.signing import SigningKey
from tests.console.support import console_settings, patch_dlq
from tests.support import FAST_ARGON2, USERS

pytestmark = pytest.mark.integration

SECRET = "4111-1111-SECRET"
ERROR_SECRET = "field card=7777-ERRSECRET"
HTML = {"accept": "text/html"}
CONSOLE_KEY = SigningKey.hmac_sha256("console-audit-1", b"k" * 32)
#: reader: no clearance (the default, internal); bob: an admin of the default clearance;
#: alice: an admin cleared for restricted data
CLEARANCES = {"reader": None, "bob": None, "alice": "restricted", "admin": "confidential"}


def users_yaml(path: Path) -> Path:
    entries = []
    for user, level in CLEARANCES.items():
        pw, roles = USERS[user]
        entry: dict[str, Any] = {"user": user, "hash": hash_password(pw, **FAST_ARGON2), "roles": roles}
        if level:
            entry["clearance"] = level
        entries.append(entry)
    path.write_text(yaml.safe_dump({"users": entries}), encoding="utf-8")
    return path


def keyring_yaml(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"keys": [{"id": CONSOLE_KEY.key_id, "algorithm": "hmac-sha256",
                                              "secret_b64": base64.b64encode(CONSOLE_KEY.secret).decode(),
                                              "publisher_id": "prism-console"}]}))
    return path


def dlq_headers(src: str, offset: int, message: str) -> list[tuple[str, bytes]]:
    return [("prism.errors.topic", src.encode()), ("prism.errors.partition", b"1"),
            ("prism.errors.offset", str(offset).encode()), ("prism.errors.stage", b"policy"),
            ("prism.errors.reason", b"policy_violation"), ("prism.errors.exception.message", message.encode()),
            ("x-customer-card", SECRET.encode())]


async def seed(bootstrap: str, src: str, restricted_id: str) -> None:
    """DLQ partition 1: offset 0 a restricted envelope, offset 1 internal JSON, offset 2 a cut
    copy of something; `.v3`: the restricted envelope as replayed (its `prism-source`)."""
    await ensure_topics(bootstrap, {src: 2, f"{src}.dlq": 2, f"{src}.v3": 2})
    env = new_envelope(src, {"card": SECRET}, namespace="order-events", data_classification="restricted",
                       message_id=restricted_id)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(f"{src}.dlq", encode(env, Layout.REVIEWED), partition=1,
                                     headers=dlq_headers(src, 10, f"policy refused {ERROR_SECRET}"))
        await producer.send_and_wait(f"{src}.dlq", b'{"note": "internal ok"}', partition=1,
                                     headers=dlq_headers(src, 11, "schema mismatch")[:-1])
        await producer.send_and_wait(f"{src}.dlq", b'{"card": "' + SECRET.encode(), partition=1,
                                     headers=[*dlq_headers(src, 12, "too large")[:-1],
                                              ("prism.errors.value.truncated", b"true")])
        await producer.send_and_wait(f"{src}.v3", encode(env, Layout.REVIEWED), partition=0,
                                     headers=[("prism-source", f"{src}/1/42".encode())])
    finally:
        await producer.stop()


@pytest.fixture
def setup(broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    src = f"orders.cl.{uuid.uuid4().hex[:8]}"
    audit_topic = f"audit.console.{uuid.uuid4().hex[:8]}"
    restricted_id = f"msg-{uuid.uuid4().hex[:8]}"
    asyncio.run(seed(broker.bootstrap, src, restricted_id))
    info = {"name": "orders-cl", "namespace": "order-events", "sources": [{"topic": src, "partitions": 2}],
            "outputs": [f"{src}.v2", f"{src}.v3"], "dlq": [f"{src}.dlq"], "stages": ["normalize"]}
    replays: list[str] = []

    async def fake_info(self: Workers, name: str) -> dict[str, Any]:
        return info

    async def fake_replay(self: Kafka, topology: Any, source: str, ref: str, *, force: bool, by: str) -> ReplayReport:
        replays.append(f"{ref} by {by}")
        return ReplayReport(False, force, [Outcome(f"{src}.dlq", 1, 0, "policy_violation", "replayed",
                                                   target_topic=src, target_partition=1, target_offset=42)])

    monkeypatch.setattr(Workers, "info", fake_info)
    monkeypatch.setattr(Kafka, "replay", fake_replay)
    users = users_yaml(tmp_path / "users.yaml")
    keyring = keyring_yaml(tmp_path / "keyring.yaml")
    key, principal = audit_key(str(keyring), CONSOLE_KEY.key_id)
    settings = console_settings(users, registry_url=None, worker_urls=("http://127.0.0.1:9",),
                                bootstrap=broker.bootstrap)
    settings = dataclasses.replace(settings, audit_signing_key=key, audit_principal=principal, audit_topic=audit_topic)
    app = create_app(settings)
    with TestClient(app, base_url="http://console.test") as c:
        yield {"c": c, "src": src, "audit_topic": audit_topic, "keyring": keyring, "bootstrap": broker.bootstrap,
               "replays": replays, "id": restricted_id, "app": app, "settings": settings, "users": users}


def basic(user: str) -> dict[str, str]:
    from app.security.http_auth import basic_header

    return {"Authorization": basic_header(user, USERS[user][0]), **HTML}


def audit_records(s: dict[str, Any]) -> list[dict[str, Any]]:
    from app.cli.main import build_app

    result = CliRunner().invoke(build_app(), ["audit", "--url", f"kafka://{s['bootstrap']}", "--audit-topic",
                                              s["audit_topic"], "--keyring", str(s["keyring"]), "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.strip()]


def raw_records(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The audit records as written (a record of several refusals is one), oldest first."""
    from app.sdk.audit import read_audit

    records, _ = asyncio.run(read_audit(f"kafka://{s['bootstrap']}", audit_topic=s["audit_topic"]))
    return records


def session(c: TestClient, user: str) -> str:
    r = c.post("/login", data={"user": user, "password": USERS[user][0], "next": "/"},
               headers={"origin": "http://console.test"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    import re

    page = c.get("/pipelines/orders-cl/dlq", headers=HTML)
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m, page.text
    return m.group(1)


def test_a_reader_sees_metadata_but_no_restricted_data_and_each_view_is_audited(setup: dict[str, Any]) -> None:
    c, src = setup["c"], setup["src"]
    listing = c.get("/pipelines/orders-cl/dlq", headers=basic("reader"))
    assert listing.status_code == 200
    assert SECRET not in listing.text and "ERRSECRET" not in listing.text
    assert "withheld: restricted is above your clearance (internal)" in listing.text
    assert "schema mismatch" in listing.text  # internal data: shown as before
    # the search does not look into withheld error text (it would tell the text apart)
    searched = c.get("/pipelines/orders-cl/dlq", params={"q": "ERRSECRET"}, headers=basic("reader"))
    assert "0 matching" in searched.text
    for ref in ("1@0", "1@2"):  # the restricted envelope, the cut copy (fail closed)
        page = c.get(f"/pipelines/orders-cl/dlq/{src}/{ref}", headers=basic("reader"))
        assert page.status_code == 200
        assert 'id="record-withheld"' in page.text and 'id="record-value"' not in page.text
        assert SECRET not in page.text and "ERRSECRET" not in page.text and "x-customer-card" not in page.text
        assert "policy_violation" in page.text and 'id="record-classification">restricted<' in page.text
        assert "sha256" not in page.text
    shown = c.get(f"/pipelines/orders-cl/dlq/{src}/1@1", headers=basic("reader"))
    assert "internal ok" in shown.text and 'id="record-withheld"' not in shown.text
    trace = c.get("/pipelines/orders-cl/trace", params={"topic": src, "partition": 1, "offset": 42},
                  headers=basic("reader"))
    assert trace.status_code == 200 and 'id="trace-withheld"' in trace.text and SECRET not in trace.text
    # no other route hands out a record: the only GET routes are these pages (a raw or download
    # route added later must get its own clearance check and a line here)
    gets = {r.path for r in setup["app"].routes if isinstance(r, APIRoute) and "GET" in r.methods}
    assert gets == {"/healthz", "/login", "/", "/pipelines/{name}/dlq", "/pipelines/{name}/dlq/{source}/{ref}",
                    "/pipelines/{name}/trace", "/subjects", "/subjects/{subject:path}", "/governance", "/audit"}
    assert SECRET not in c.get("/openapi.json", headers=basic("reader")).text

    lines = audit_records(setup)  # `prism audit --keyring`: one line per refused read, each verified
    assert all(r["verified"] and r["signed_by"] == CONSOLE_KEY.key_id for r in lines), lines
    assert {r["event"] for r in lines} == {"classified_refused"}
    assert {r["principal"] for r in lines} == {"prism-console"} and {r["user"] for r in lines} == {"reader"}
    assert {r["clearance"] for r in lines} == {"internal"}
    assert sorted(r["ref"] for r in lines) == sorted([f"{src}.dlq/1@0", f"{src}.dlq/1@2", f"{src}.dlq/1@0",
                                                      f"{src}.dlq/1@2", f"{src}.v3/0@0"])
    assert setup["id"] in {r["message_id"] for r in lines}
    assert all(SECRET not in json.dumps(r) for r in lines)
    # the records themselves: one per page view that withheld something - the list (naming both
    # records), the two record pages, the trace page; the search withheld nothing and wrote none
    records = raw_records(setup)
    assert [r.get("count", 1) for r in records] == [2, 1, 1, 1], records
    assert [r["view"] for r in records] == ["/pipelines/orders-cl/dlq", f"/pipelines/orders-cl/dlq/{src}/1@0",
                                            f"/pipelines/orders-cl/dlq/{src}/1@2", "/pipelines/orders-cl/trace"]

    # a refresh loop: one record per view, never one per record
    for _ in range(5):
        assert c.get("/pipelines/orders-cl/dlq", headers=basic("reader")).status_code == 200
    assert len(raw_records(setup)) == 9


def test_an_admin_replays_only_what_their_clearance_covers(setup: dict[str, Any]) -> None:
    c, src = setup["c"], setup["src"]
    csrf = session(c, "bob")  # admin, default clearance
    page = c.get(f"/pipelines/orders-cl/dlq/{src}/1@0", headers=HTML)
    assert SECRET not in page.text and 'id="replay"' not in page.text and "replay-needs-clearance" in page.text
    refused = c.post(f"/pipelines/orders-cl/dlq/{src}/1@0/replay", data={"csrf": csrf},
                     headers={"origin": "http://console.test", **HTML})
    assert refused.status_code == 403 and "clearance is internal" in refused.text and setup["replays"] == []
    c.post("/logout", data={"csrf": csrf}, headers={"origin": "http://console.test"})

    csrf = session(c, "alice")  # admin cleared for restricted
    page = c.get(f"/pipelines/orders-cl/dlq/{src}/1@0", headers=HTML)
    assert SECRET in page.text and "ERRSECRET" in page.text and 'id="replay"' in page.text
    assert 'id="record-withheld"' not in page.text
    listing = c.get("/pipelines/orders-cl/dlq", headers=HTML)
    assert "ERRSECRET" in listing.text and "withheld:" not in listing.text
    trace = c.get("/pipelines/orders-cl/trace", params={"topic": src, "partition": 1, "offset": 42}, headers=HTML)
    assert SECRET in trace.text
    done = c.post(f"/pipelines/orders-cl/dlq/{src}/1@0/replay", data={"csrf": csrf},
                  headers={"origin": "http://console.test", **HTML})
    assert done.status_code == 200 and setup["replays"] == ["1@0 by console:alice"]
    # only bob's views withheld something: the list page (session) and the record page
    assert [(r["user"], r["view"]) for r in raw_records(setup)] == [
        ("bob", "/pipelines/orders-cl/dlq"), ("bob", f"/pipelines/orders-cl/dlq/{src}/1@0")]
    assert all(r["verified"] for r in audit_records(setup))


def test_a_confidential_admin_is_not_shown_restricted_data(setup: dict[str, Any]) -> None:
    page = setup["c"].get(f"/pipelines/orders-cl/dlq/{setup['src']}/1@0", headers=basic("admin"))
    assert SECRET not in page.text and "your clearance is <b>confidential</b>" in page.text


def test_a_bearer_user_reads_at_the_clearance_its_token_names(setup: dict[str, Any], tmp_path: Path) -> None:
    """Scripts with a bearer JWT: the operator names the claim (`clearance_claim`, here mapped
    from IdP groups); a token without it - or naming a level without the map - reads at internal."""
    import time

    import jwt
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from jwt.algorithms import OKPAlgorithm

    from app.security.http_auth import auth_from_settings

    key = ed25519.Ed25519PrivateKey.generate()
    jwk = {**json.loads(OKPAlgorithm.to_jwk(key.public_key())), "kid": "idp-1", "use": "sig", "alg": "EdDSA"}
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    (tmp_path / "jwt.yaml").write_text(yaml.safe_dump({
        "jwks_file": "jwks.json", "issuers": ["https://idp.test"], "audience": "prism-console",
        "claims": {"publisher_id": "sub"}, "clearance_claim": "groups",
        "clearance_map": {"payments-oncall": "restricted"}}))
    auth = auth_from_settings(users_file=setup["users"], jwt_config=tmp_path / "jwt.yaml", allow_anonymous=None,
                              realm="prism-console", where="tests")

    def token(groups: list[str]) -> dict[str, str]:
        now = int(time.time())
        body = {"iss": "https://idp.test", "aud": "prism-console", "sub": "ops-bot", "iat": now, "exp": now + 300,
                "roles": ["read"], "groups": groups}
        return {"Authorization": "Bearer " + jwt.encode(body, key, algorithm="EdDSA", headers={"kid": "idp-1"}),
                **HTML}

    app = create_app(dataclasses.replace(setup["settings"], auth=auth))
    record = f"/pipelines/orders-cl/dlq/{setup['src']}/1@0"
    with TestClient(app, base_url="http://console.test") as c:
        cleared = c.get(record, headers=token(["payments-oncall"]))
        assert cleared.status_code == 200 and SECRET in cleared.text and 'id="record-withheld"' not in cleared.text
        for groups in ([], ["restricted"], ["staff"]):
            page = c.get(record, headers=token(groups))
            assert page.status_code == 200 and SECRET not in page.text, groups
            assert "your clearance is <b>internal</b>" in page.text
    refused = [r for r in raw_records(setup) if r.get("user") == "ops-bot"]
    assert len(refused) == 3 and all(r["clearance"] == "internal" for r in refused), refused


def test_clearance_in_the_users_file_is_validated(tmp_path: Path) -> None:
    bad = tmp_path / "users.yaml"
    bad.write_text(yaml.safe_dump({"users": [{"user": "x", "hash": hash_password("pw-123456789", **FAST_ARGON2),
                                              "roles": ["read"], "clearance": "top-secret"}]}))
    with pytest.raises(ConfigError, match="clearance must be one of"):
        load_users(bad)
    good = users_yaml(tmp_path / "good.yaml")
    assert load_users(good)["alice"].clearance == "restricted" and load_users(good)["reader"].clearance is None


def test_the_audit_key_must_be_bound_to_a_principal(tmp_path: Path) -> None:
    ring = tmp_path / "ring.yaml"
    ring.write_text(yaml.safe_dump({"keys": [{"id": "k1", "algorithm": "hmac-sha256",
                                              "secret_b64": base64.b64encode(b"s" * 32).decode()}]}))
    with pytest.raises(ConfigError, match="bound to no principal"):
        audit_key(str(ring), "k1")
    with pytest.raises(ConfigError, match="go together"):
        audit_key(str(ring), None)
    with pytest.raises(ConfigError, match="no signing key"):
        audit_key(str(ring), "k2")
    assert audit_key(None, None) == (None, "prism-console")


def test_a_page_of_many_withheld_records_is_split_into_bounded_records() -> None:
    from app.envelope.codec import decode

    audit = RefusalAudit(None, None)
    env = new_envelope("t", {"a": 1}, namespace="ns", data_classification="restricted")
    withheld = [Withheld(f"t.dlq/0@{i}", "restricted", decode(encode(env)), "t") for i in range(500)]
    records = audit.records("reader", "internal", withheld, "/pipelines/p/dlq")
    assert [r["count"] for r in records] == [REFUSALS_PER_RECORD, 500 - REFUSALS_PER_RECORD]
    assert all(len(json.dumps(r)) < 64 * 1024 for r in records)


def test_labels_come_from_the_envelope_and_fail_closed() -> None:
    class Rec:
        def __init__(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
            self.value, self.headers = value, headers

    env = new_envelope("t", {"a": 1}, namespace="ns", data_classification="public")
    # a forged header never lowers, nor raises, what the envelope says
    assert label(Rec(encode(env), [("prism-data-classification", b"restricted")])).classification == "public"
    assert label(Rec(b"not an envelope", [])).classification == "internal"
    # a value the worker never wrapped: the producer's header may raise it, never lower it
    assert label(Rec(b'{"a": 1}', [("data-classification", b"confidential")])).classification == "confidential"
    assert label(Rec(b'{"a": 1}', [("data-classification", b"public")])).classification == "internal"
    assert label(Rec(b'{"a": 1}', [("Data-Classification", b"cosmic")])).classification == "restricted"
    assert label(Rec(b"\x0a\xff", [("prism.errors.value.truncated", b"true")])).classification == "restricted"
    odd = new_envelope("t", {"a": 1}, namespace="ns", data_classification="restricted")
    odd.header.security.data_classification = "cosmic"
    assert label(Rec(encode(odd), [])).classification == "restricted"


def test_a_value_declaring_its_classification_in_its_body_is_labelled_by_it() -> None:
    """Input the worker never wrapped, whose producer declared the level inside the value: the
    console reads it as the normalize stage does; when that stage cannot read the value (why it
    sits in the DLQ) but it names a classification, it is withheld (restricted)."""
    class Rec:
        def __init__(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
            self.value, self.headers = value, headers

    ce_json = [("content-type", b"application/cloudevents+json")]
    event = {"specversion": "1.0", "id": "e-1", "source": "/shop", "type": "order.created",
             "dataclassification": "confidential", "datacontenttype": "application/json", "data": {"card": "4111"}}
    assert label(Rec(json.dumps(event).encode(), ce_json)).classification == "confidential"
    # a level below the default does not lower it for input the worker never wrapped
    assert label(Rec(json.dumps({**event, "dataclassification": "public"}).encode(), ce_json)).classification \
        == "internal"
    broken = {k: v for k, v in event.items() if k != "specversion"} | {"dataclassification": "restricted"}
    assert label(Rec(json.dumps(broken).encode(), ce_json)).classification == "restricted"
    redis = {"payload": {"card": "4111"}, "meta": {"data_classification": "confidential"}}
    assert label(Rec(json.dumps(redis).encode(), [])).classification == "confidential"
    refused = {"payload": {"card": "4111"}, "meta": {"data_classification": "confidential", "priority": 99}}
    assert label(Rec(json.dumps(refused).encode(), [])).classification == "restricted"
    # bytes the normalize stage takes as a raw payload are what the pipeline would publish as
    # `internal`: the console labels them the same
    assert label(Rec(b'{"payload": {"card": "4111"}, "meta": {"data_cl', [])).classification == "internal"
    # nothing declared: internal, as before
    assert label(Rec(b'{"payload": {"a": 1}}', [])).classification == "internal"
    assert label(Rec(b"\xff\x00 opaque", [])).classification == "internal"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=st.binary(max_size=512), headers=st.lists(st.tuples(
    st.sampled_from(["data-classification", "prism.errors.value.truncated", "x", "Classification"]),
    st.binary(max_size=24)), max_size=4))
def test_any_record_gets_a_label_and_never_an_error(value: bytes, headers: list[tuple[str, bytes]]) -> None:
    """`label` reads hostile bytes (a DLQ holds what did not decode): a level, never an exception,
    and never below `internal` unless a decoded envelope says so."""
    class Rec:
        def __init__(self) -> None:
            self.value, self.headers = value, headers

    got = label(Rec())
    assert got.classification in RANK
    if got.envelope is None:
        assert RANK[got.classification] >= RANK["internal"]


def test_no_withheld_view_without_its_audit_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit topic cannot be written (no broker answers): the page is the 502 error page -
    neither the payload nor a view that goes unrecorded."""
    src = "orders.unaudited"
    env = new_envelope(src, {"card": SECRET}, namespace="order-events", data_classification="restricted")

    class Rec:
        topic, partition, offset, timestamp, key = f"{src}.dlq", 0, 0, 1_760_000_000_000, None
        value, headers = encode(env), dlq_headers(src, 1, "refused")

    async def fake_info(self: Workers, name: str) -> dict[str, Any]:
        return {"name": "p", "namespace": "order-events", "sources": [{"topic": src, "partitions": 1}],
                "outputs": [f"{src}.v3"], "dlq": [f"{src}.dlq"], "stages": []}

    async def no_ledger(self: Kafka, topology: Any, warnings: list[str] | None = None) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(Workers, "info", fake_info)
    patch_dlq(monkeypatch, lambda: [Rec()])
    monkeypatch.setattr(Kafka, "ledger", no_ledger)
    settings = console_settings(users_yaml(tmp_path / "users.yaml"), registry_url=None,
                                worker_urls=("http://127.0.0.1:9",), bootstrap="127.0.0.1:9")
    with TestClient(create_app(settings), base_url="http://console.test") as c:
        for path in ("/pipelines/p/dlq", f"/pipelines/p/dlq/{src}/0@0"):
            page = c.get(path, headers=basic("reader"))
            assert page.status_code == 502 and "could not be written" in page.text, page.text[:500]
            assert SECRET not in page.text and "ERRSECRET" not in page.text
        # a user cleared for it needs no record: the page is there
        assert SECRET in c.get(f"/pipelines/p/dlq/{src}/0@0", headers=basic("alice")).text
