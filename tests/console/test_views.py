"""The console's pages with FastAPI's TestClient, against a real registry (uvicorn, SQLite):
every route needs a log-in, roles decide who may replay and read the audit log, replays need
the session's CSRF token from this origin, every value is rendered as text, and the verdict of
a version pair is the one the subject's configured compatibility gives (BACKWARD vs FULL).

The DLQ back end is replaced here by in-memory records (the browser test,
tests/console/test_console_browser.py, reads and replays real ones on the embedded broker)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from app.cli.dlq import Outcome, ReplayReport
from app.console import create_app
from app.console.backends import Kafka, Workers
from app.console.web import OPEN_PATHS
from tests.console.support import (
    BACKWARD_SUBJECT,
    FULL_SUBJECT,
    XSS,
    console_settings,
    patch_dlq,
    registry_server,
)
from tests.support import ADMIN_CLEARED, USERS, write_users_file

HTML = {"accept": "text/html"}
SRC = "orders.created.x"
INFO = {"name": "orders-x", "namespace": "order-events", "sources": [{"topic": SRC, "partitions": 2}],
        "outputs": [f"{SRC}.v2", f"{SRC}.v3"], "dlq": [f"{SRC}.dlq"], "stages": ["normalize"]}


@dataclass
class FakeRecord:
    topic: str
    partition: int
    offset: int
    value: bytes
    timestamp: int = 1_760_000_000_000
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def dlq_record(offset: int, reason: str, message: str, value: bytes) -> FakeRecord:
    return FakeRecord(f"{SRC}.dlq", 1, offset, value, headers=[
        ("prism.errors.topic", SRC.encode()), ("prism.errors.partition", b"1"),
        ("prism.errors.offset", str(100 + offset).encode()), ("prism.errors.stage", b"policy"),
        ("prism.errors.reason", reason.encode()), ("prism.errors.exception.message", message.encode()),
        ("Authorization", b"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl")])


RECORDS = [dlq_record(0, "policy_violation", f"confidential data must be encrypted {XSS}",
                      b'{"order_id": "o-1", "note": "' + XSS.encode() + b'"}'),
           dlq_record(1, "auth_failed", "token expired", b"raw bytes")]


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("console-users") / "users.yaml", clearances=ADMIN_CLEARED)


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The DLQ back end in memory; the replays asked for are recorded."""
    calls: list[dict[str, Any]] = []

    async def info(self: Workers, name: str) -> dict[str, Any]:
        return INFO

    async def ledger(self: Kafka, topology: Any, warnings: list[str] | None = None) -> dict[str, dict[str, Any]]:
        return {}

    async def replay(self: Kafka, topology: Any, source: str, ref: str, *, force: bool, by: str) -> ReplayReport:
        calls.append({"source": source, "ref": ref, "force": force, "by": by,
                      "sources": [(s.topic, s.partitions) for s in topology.sources]})
        return ReplayReport(False, force, [Outcome(f"{SRC}.dlq", 1, 0, "policy_violation", "replayed",
                                                   target_topic=SRC, target_partition=1, target_offset=7)])

    monkeypatch.setattr(Workers, "info", info)
    import tests.console.test_views as me

    patch_dlq(monkeypatch, lambda: list(me.RECORDS))
    monkeypatch.setattr(Kafka, "ledger", ledger)
    monkeypatch.setattr(Kafka, "replay", replay)
    return calls


@pytest.fixture
def client(tmp_path: Path, users_file: Path, replays: list[dict[str, Any]]) -> Iterator[TestClient]:
    with registry_server(tmp_path, users_file) as (url, _):
        app = create_app(console_settings(users_file, registry_url=url, worker_urls=("http://127.0.0.1:9",),
                                          bootstrap="127.0.0.1:9"))
        with TestClient(app, base_url="http://console.test") as c:
            yield c


def login(c: TestClient, user: str) -> str:
    """Logs ``user`` in through the form; returns a CSRF token of the session (from a page)."""
    r = c.post("/login", data={"user": user, "password": USERS[user][0], "next": "/subjects"},
               headers={"origin": "http://console.test"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/subjects", r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    page = c.get("/governance")
    m = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert m, page.text
    return m.group(1)


def test_every_route_needs_a_login(client: TestClient) -> None:
    paths = sorted({r.path for r in client.app.routes if isinstance(r, APIRoute)})  # type: ignore[attr-defined]
    assert {"/", "/subjects", "/subjects/{subject:path}", "/governance", "/audit", "/pipelines/{name}/dlq",
            "/pipelines/{name}/dlq/{source}/{ref}", "/pipelines/{name}/dlq/{source}/{ref}/replay",
            "/pipelines/{name}/trace", "/logout"} <= set(paths)
    for template in paths:
        path = re.sub(r"\{[^}]+\}", "x", template)
        if path in OPEN_PATHS:
            continue
        for method in ("GET", "POST"):
            bare = client.request(method, path, follow_redirects=False)
            assert bare.status_code in (401, 405), (method, path, bare.status_code)
            if bare.status_code == 401:
                assert bare.headers["www-authenticate"].startswith("Basic realm=")
        browser = client.get(path, headers=HTML, follow_redirects=False)
        if browser.status_code != 405:
            assert browser.status_code == 303 and browser.headers["location"].startswith("/login?next="), path
    # a wrong password is a 401 like none; the page never says which part was wrong
    wrong = client.get("/", headers={"authorization": "Basic cmVhZGVyOm5vcGU="})
    assert wrong.status_code == 401
    assert client.get("/login").status_code == 200 and client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/static/console.css").status_code == 200


def test_login_logout_and_no_open_redirect(client: TestClient) -> None:
    bad = client.post("/login", data={"user": "reader", "password": "nope", "next": "/"})
    assert bad.status_code == 401 and "Invalid user name or password." in bad.text
    evil = client.post("/login", data={"user": "reader", "password": USERS["reader"][0], "next": "//evil.example"},
                       follow_redirects=False)
    assert evil.status_code == 303 and evil.headers["location"] == "/"
    cross = client.post("/login", data={"user": "reader", "password": USERS["reader"][0]},
                        headers={"origin": "https://evil.example"}, follow_redirects=False)
    assert cross.status_code == 403
    csrf = login(client, "reader")
    assert client.get("/subjects").status_code == 200
    assert client.post("/logout", data={"csrf": "wrong"}).status_code == 403  # log-out is CSRF-checked too
    out = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    client.cookies.clear()
    assert client.get("/subjects", follow_redirects=False).status_code == 401


def test_basic_credentials_work_for_scripts_but_cannot_replay(client: TestClient,
                                                               replays: list[dict[str, Any]]) -> None:
    from tests.support import auth_headers

    assert client.get("/subjects", headers=auth_headers("admin")).status_code == 200
    # a browser caches basic credentials and sends them cross-site: no session, no state change
    r = client.post(f"/pipelines/orders-x/dlq/{SRC}/1@0/replay", headers=auth_headers("admin"), data={"csrf": "x"})
    assert r.status_code == 403 and "log-in session" in r.text and replays == []


def test_roles_reader_views_admin_replays_with_csrf(client: TestClient, replays: list[dict[str, Any]]) -> None:
    csrf = login(client, "reader")
    page = client.get(f"/pipelines/orders-x/dlq/{SRC}/1@0")
    assert page.status_code == 200 and 'id="replay"' not in page.text and "Replaying needs the admin role" in page.text
    assert client.post(f"/pipelines/orders-x/dlq/{SRC}/1@0/replay", data={"csrf": csrf}).status_code == 403
    assert client.get("/audit").status_code == 403
    assert replays == []

    client.cookies.clear()
    csrf = login(client, "admin")
    page = client.get(f"/pipelines/orders-x/dlq/{SRC}/1@0")
    assert 'id="replay"' in page.text
    url = f"/pipelines/orders-x/dlq/{SRC}/1@0/replay"
    assert client.post(url, data={}).status_code == 403  # no token
    assert client.post(url, data={"csrf": "not-it"}).status_code == 403  # another token
    assert client.post(url, data={"csrf": csrf}, headers={"origin": "https://evil.example"}).status_code == 403
    assert client.post(url, data={"csrf": csrf}, headers={"referer": "https://evil.example/x"}).status_code == 403
    assert replays == []
    done = client.post(url, data={"csrf": csrf}, headers={"origin": "http://console.test"})
    assert done.status_code == 200 and "Replayed 1@0 (policy_violation) to orders.created.x partition 1 offset 7" \
        in done.text
    assert 'href="/pipelines/orders-x/trace?topic=orders.created.x&amp;partition=1&amp;offset=7"' in done.text
    # the replay is the CLI's, on the worker's topology, recorded in the ledger as the console user
    assert replays == [{"source": SRC, "ref": "1@0", "force": False, "by": "console:admin",
                        "sources": [(SRC, 2)]}]
    assert client.get("/audit").status_code == 200


def test_dlq_pages_decode_redact_and_escape(client: TestClient) -> None:
    login(client, "reader")
    listing = client.get("/pipelines/orders-x/dlq")
    assert listing.status_code == 200
    assert XSS not in listing.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in listing.text
    assert re.search(r'data-reason="policy_violation" href="[^"]*">policy_violation 1</a>', listing.text)  # by reason
    chip = re.search(r'data-reason="auth_failed" href="([^"]+)"', listing.text)[1]  # as a browser follows it
    assert 'data-ref="1@1"' in client.get("/pipelines/orders-x/dlq" + chip.replace("&amp;", "&")).text
    only = client.get("/pipelines/orders-x/dlq", params={"reason": "auth_failed"})
    assert 'data-ref="1@1"' in only.text and 'data-ref="1@0"' not in only.text
    found = client.get("/pipelines/orders-x/dlq", params={"q": "encrypted"})
    assert 'data-ref="1@0"' in found.text and 'data-ref="1@1"' not in found.text
    record = client.get(f"/pipelines/orders-x/dlq/{SRC}/1@0")
    assert XSS not in record.text and "&lt;script&gt;" in record.text
    assert "&#34;note&#34;" in record.text  # the JSON value, pretty-printed, as text
    assert "eyJhbGciOiJIUzI1NiJ9" not in record.text  # the token in the headers is redacted
    assert record.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
    missing = client.get(f"/pipelines/orders-x/dlq/{SRC}/9@0")  # not a partition: said, not a 500 (nor a 502)
    assert missing.status_code == 404 and "Not found" in missing.text


def test_record_times_no_calendar_holds_do_not_take_the_pages_down(client: TestClient,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A record's timestamp is its producer's (CreateTime, kept on the DLQ copy and on the
    output): one stamped 2**62 made the DLQ page of the pipeline a 500 for every record, and so
    did its record page and a trace that found such an output record."""
    import tests.console.test_views as me

    far = [FakeRecord(f"{SRC}.dlq", 1, 5, b'{"a": 1}', timestamp=2**62, headers=RECORDS[1].headers),
           FakeRecord(f"{SRC}.dlq", 1, 6, b'{"a": 2}', timestamp=253_402_300_800_000, headers=RECORDS[1].headers)]
    monkeypatch.setattr(me, "RECORDS", [*RECORDS, *far])

    async def find_output(self: Kafka, topic: str, partitions: int, marker: bytes) -> Any:
        return FakeRecord(f"{SRC}.v3", 0, 3, b"{}", timestamp=2**62)

    monkeypatch.setattr(Kafka, "find_output", find_output)
    login(client, "reader")
    listing = client.get("/pipelines/orders-x/dlq")
    assert listing.status_code == 200, listing.text
    assert 'data-ref="1@5"' in listing.text and 'data-ref="1@6"' in listing.text and 'data-ref="1@0"' in listing.text
    for ref in ("1@5", "1@6"):
        record = client.get(f"/pipelines/orders-x/dlq/{SRC}/{ref}")
        assert record.status_code == 200 and f"<title>{ref} · DLQ of orders-x" in record.text, record.text
    trace = client.get("/pipelines/orders-x/trace", params={"topic": SRC, "partition": 1, "offset": 105})
    assert trace.status_code == 200 and f"{2**62} (not a date)" in trace.text, trace.text


def test_subjects_configured_compatibility_and_real_verdicts(client: TestClient) -> None:
    login(client, "reader")
    listing = client.get("/subjects", params={"q": "orders."})
    assert listing.status_code == 200
    rows = dict(re.findall(r'data-subject="([^"]+)">.*?<span class="mode">(\w+)</span>', listing.text, re.S))
    assert rows == {BACKWARD_SUBJECT: "BACKWARD", FULL_SUBJECT: "FULL"}
    assert client.get("/subjects", params={"q": "nothing-like-it"}).text.count('class="subject-row"') == 0
    by_id = client.get("/subjects", params={"q": "2"})  # a schema id: the subjects and versions using it
    assert 'id="by-id"' in by_id.text and f"{BACKWARD_SUBJECT} v2" in by_id.text
    for odd in ("²", "9" * 5000):  # passed isdigit(), failed int(): a 500 page
        page = client.get("/subjects", params={"q": odd})
        assert page.status_code == 200 and 'id="by-id"' not in page.text, odd

    backward = client.get(f"/subjects/{BACKWARD_SUBJECT}")
    full = client.get(f"/subjects/{FULL_SUBJECT}")
    assert re.search(r'id="verdict" class="ok">compatible \(BACKWARD\)', backward.text), backward.text
    assert re.search(r'id="verdict" class="breaking">breaking \(FULL\)', full.text), full.text
    assert 'id="compat-mode">FULL<' in full.text
    assert "Order.coupon" in full.text or "coupon" in re.search(r'<ul id="findings">(.*?)</ul>', full.text, re.S)[1]
    # pretty-printed (one field per line), escaped, and a diff of the pretty forms
    schema = re.search(r'<pre id="schema">(.*?)</pre>', backward.text, re.S)[1]
    assert '\n  &#34;name&#34;: &#34;Order&#34;,\n' in schema and "&lt;script&gt;" in schema and XSS not in schema
    diff = re.search(r'<pre class="diff" id="diff">(.*?)</pre>', backward.text, re.S)[1]
    assert '<span class="del">-    {</span>' in diff and "&#34;coupon&#34;" in diff
    assert diff.count('<span class=') > 5  # one element per line of the diff
    # another pair, asked for: v2 against v1 of the FULL subject is the same pair
    again = client.get(f"/subjects/{FULL_SUBJECT}", params={"from": 1, "to": 2})
    assert "breaking (FULL)" in again.text
    # `from` is read by hand (a Python keyword): digits int() refuses were a 500 page
    for odd in ("²", "١", "9" * 5000, "-1", " 1", ""):
        page = client.get(f"/subjects/{FULL_SUBJECT}", params={"from": odd, "to": 2})
        assert page.status_code == 200 and "breaking (FULL)" in page.text, (odd, page.status_code)


def test_governance_pii_approvals_policies_and_audit(client: TestClient) -> None:
    login(client, "reader")
    page = client.get("/governance")
    assert page.status_code == 200
    assert f"<td>{BACKWARD_SUBJECT}</td>" in page.text and 'id="pii-audit"' not in page.text  # admin only
    assert '<td>FULL</td>' in page.text and '<td>BACKWARD</td>' in page.text
    client.cookies.clear()
    login(client, "admin")
    assert 'id="pii-audit"' in client.get("/governance").text
    audit = client.get("/audit")
    assert audit.text.count('class="audit-row"') >= 4  # the registrations and the policy changes


def test_registry_diff_uses_the_configured_mode_and_pretty_forms(tmp_path: Path, users_file: Path) -> None:
    """The registry's own /v1 diff (behind the old /ui page and the console): the mode is the
    subject's, and the text diff is of indented schemas."""
    import httpx

    from tests.support import creds

    with registry_server(tmp_path, users_file) as (url, _):
        b = httpx.get(f"{url}/v1/subjects/{BACKWARD_SUBJECT}/diff", params={"from": 1, "to": 2},
                      auth=creds("reader")).json()
        f = httpx.get(f"{url}/v1/subjects/{FULL_SUBJECT}/diff", params={"from": 1, "to": 2},
                      auth=creds("reader")).json()
        asked = httpx.get(f"{url}/v1/subjects/{FULL_SUBJECT}/diff", params={"from": 1, "to": 2, "mode": "backward"},
                          auth=creds("reader")).json()
        bad = httpx.get(f"{url}/v1/subjects/{FULL_SUBJECT}/diff", params={"from": 1, "to": 2, "mode": "SIDEWAYS"},
                        auth=creds("reader"))
    assert (b["mode"], b["is_compatible"]) == ("BACKWARD", True)
    assert (f["mode"], f["is_compatible"]) == ("FULL", False)
    assert (asked["mode"], asked["is_compatible"]) == ("BACKWARD", True)
    assert bad.status_code == 422
    assert '-      "name": "coupon",' in b["text_diff"]


def test_every_kind_of_dlq_record_has_a_page_with_a_replay_button(client: TestClient, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The record page of an envelope (either layout) or an LNMP value answered 500 (its template
    asked for a field only the other kinds have). Every kind of tests/console/record_kinds.py
    renders, for an admin with the Replay button (the browser test replays them all)."""
    from app.worker.dlq_overflow import OverflowStore
    from tests.console.record_kinds import every_kind

    kinds = every_kind(SRC, OverflowStore(f"file://{tmp_path}/overflow"))
    recs = [FakeRecord(f"{SRC}.dlq", 0, i, k.record.value, key=k.record.key, headers=list(k.record.headers))
            for i, k in enumerate(kinds)]

    patch_dlq(monkeypatch, lambda: recs)
    login(client, "admin")
    for i, kind in enumerate(kinds):
        page = client.get(f"/pipelines/orders-x/dlq/{SRC}/0@{i}")
        assert page.status_code == 200, (kind.name, page.text[:500])
        assert f'<span id="record-kind">{kind.shows}</span>' in page.text and 'id="replay"' in page.text, kind.name
        assert "c2lnbmF0dXJl" not in page.text, kind.name  # the bearer token's signature: redacted


def test_an_unreachable_broker_is_a_502_page_not_a_500(tmp_path: Path, users_file: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    async def info(self: Workers, name: str) -> dict[str, Any]:
        return INFO

    monkeypatch.setattr(Workers, "info", info)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(console_settings(users_file, registry_url=None, worker_urls=("http://127.0.0.1:9",),
                                      bootstrap=f"127.0.0.1:{port}"))
    with TestClient(app, base_url="http://console.test") as c:
        r = c.post("/login", data={"user": "reader", "password": USERS["reader"][0], "next": "/"},
                   headers={"origin": "http://console.test"}, follow_redirects=False)
        assert r.status_code == 303
        for path in ("/pipelines/orders-x/dlq", f"/pipelines/orders-x/dlq/{SRC}/1@0"):
            page = c.get(path)
            assert page.status_code == 502 and "A back end did not answer" in page.text, (path, page.text[:300])
            assert f"127.0.0.1:{port}" in page.text


def test_query_values_of_the_wrong_type_get_the_html_error_page(client: TestClient) -> None:
    """FastAPI answered ``?limit=abc`` with its JSON 422, which a person in a browser cannot act
    on: the console's error page (400) names the parameter, what was sent and how to write it."""
    login(client, "admin")
    for path, params, name in (("/audit", {"limit": "abc"}, "limit"),
                               ("/pipelines/orders-x/trace", {"topic": SRC, "partition": "x", "offset": 1}, "partition"),
                               ("/pipelines/orders-x/trace", {"topic": SRC, "partition": 1, "offset": "1.5"}, "offset"),
                               (f"/subjects/{FULL_SUBJECT}", {"to": "<script>"}, "to")):
        page = client.get(path, params=params, headers=HTML)
        assert page.status_code == 400 and page.headers["content-type"].startswith("text/html"), (path, page.text)
        error = re.search(r'<p class="error" id="error">(.*?)</p>', page.text, re.S)
        assert error and f"{name}=" in error[1], page.text
        assert f"write {name} as a whole number, e.g. {name}=100" in page.text, page.text
        assert "<script>" not in page.text.split("</header>")[-1]  # what was sent is shown as text


#: user:password pairs a DLQ record may carry in every field the pages show
LEAKS = ("s3cret-value-pw", "key-pw-9", "hdr-pw-7", "err-pw-5", "bin-pw-3", "basic-dXNlcjpwYXNzd29yZA")


def test_basic_credentials_in_dlq_records_are_redacted(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A URL's ``user:password@`` and ``Basic`` credentials in a DLQ record's value, key, headers
    and error text were shown on the record page and the list: now masked by the log
    redaction's rules (app/observability/redaction.py `redact_patterns`)."""
    import tests.console.test_views as me

    headers = [*RECORDS[1].headers[:-2], ("prism.errors.exception.message", b"GET https://svc:err-pw-5@api.example/x"),
               ("x-callback", b"https://carol:hdr-pw-7@cb.example/"),
               ("x-forwarded", b"Authorization: Basic basic-dXNlcjpwYXNzd29yZA")]
    value = (b'{"callback": "https://alice:s3cret-value-pw@hooks.example/x", '
             b'"auth": "Basic basic-dXNlcjpwYXNzd29yZA"}')
    leaky = [FakeRecord(f"{SRC}.dlq", 1, 7, value, key=b"https://bob:key-pw-9@h.example", headers=headers),
             FakeRecord(f"{SRC}.dlq", 1, 8, b"\xff\xfe https://eve:bin-pw-3@h.example \x00", headers=headers)]
    monkeypatch.setattr(me, "RECORDS", [*RECORDS, *leaky])
    login(client, "admin")
    pages = [client.get("/pipelines/orders-x/dlq"), client.get(f"/pipelines/orders-x/dlq/{SRC}/1@7"),
             client.get(f"/pipelines/orders-x/dlq/{SRC}/1@8")]
    for page in pages:
        assert page.status_code == 200, page.text[:300]
        for leak in LEAKS:
            assert leak not in page.text and leak.encode().hex() not in page.text, (leak, page.url)
    assert "https://alice:[REDACTED]@hooks.example/x" in pages[1].text and "Basic [REDACTED]" in pages[1].text
    assert "https://bob:[REDACTED]@h.example" in pages[1].text
    assert "https://svc:[REDACTED]@api.example/x" in pages[0].text
    assert b"https://eve:[REDACTED]@".hex() in pages[2].text  # the hex preview of bytes that are not text


def test_back_end_credentials_are_masked_on_error_pages(tmp_path: Path, users_file: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A back end's URL with ``user:password@`` (a registry URL given to the settings, a broker's
    or worker's error quoting one) was shown on the console's error pages as it was."""
    from aiokafka.errors import KafkaConnectionError

    from app.console import ConsoleSettings
    from app.console.backends import BackendError

    async def info(self: Workers, name: str) -> dict[str, Any]:
        if name == "down":
            raise BackendError("no worker runs it (http://admin:worker-pw-1@worker.example:6066 said 503)",
                               hint="check http://admin:worker-pw-1@worker.example:6066")
        return INFO

    async def window(self: Kafka, topology: Any, source: str | None = None, before: Any = None) -> list[Any]:
        raise KafkaConnectionError("Unable to bootstrap from kafka://svc:kafka-pw-2@kafka.example:9092 "
                                   "(Authorization: Basic c3ZjOmthZmthLXB3LTI=)")

    monkeypatch.setattr(Workers, "info", info)
    monkeypatch.setattr(Kafka, "dlq_window", window)
    settings = console_settings(users_file, registry_url="http://console:registry-pw-3@127.0.0.1:9",
                                worker_urls=("http://127.0.0.1:9",), bootstrap="127.0.0.1:9")
    assert isinstance(settings, ConsoleSettings)
    with TestClient(create_app(settings), base_url="http://console.test") as c:
        login_r = c.post("/login", data={"user": "reader", "password": USERS["reader"][0], "next": "/"},
                         headers={"origin": "http://console.test"}, follow_redirects=False)
        assert login_r.status_code == 303
        for path in ("/subjects", "/pipelines/orders-x/dlq", "/pipelines/down/dlq"):
            page = c.get(path)
            assert page.status_code == 502 and "A back end did not answer" in page.text, (path, page.text[:300])
            for leak in ("registry-pw-3", "kafka-pw-2", "worker-pw-1", "c3ZjOmthZmthLXB3LTI="):
                assert leak not in page.text, (path, leak)
            assert "[REDACTED]" in page.text, page.text


def test_huge_fields_are_cut_on_the_dlq_pages(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of a DLQ record is its writer's to choose: 20 records with a 1 MB error header
    made one list page 19.5 MB of HTML, a 1 MB key a 4 MB record page, 100,000 one-byte headers a
    3.4 MB one. Each field is cut as `prism dlq list|show` cut theirs, saying how many characters
    follow and how to read them whole, and a record page shows its first 200 headers."""
    import tests.console.test_views as me

    base = [(k, v) for k, v in RECORDS[1].headers if k not in ("prism.errors.exception.message", "prism.errors.reason")]
    big = [*base, ("prism.errors.exception.message", b"E" * 1_000_000), ("prism.errors.reason", b"R" * 300_000),
           ("prism.errors.stage", b"<script>S" + b"S" * 100_000)]
    huge = [FakeRecord(f"{SRC}.dlq", 0, i, b"v", key=b"K" * 1_000_000, headers=big) for i in range(20)]
    many = FakeRecord(f"{SRC}.dlq", 1, 9, b"\xff\x00<script>", headers=[*base, *((f"h{i}<b>", b"v") for i in range(20_000))])
    monkeypatch.setattr(me, "RECORDS", [*huge, many])
    login(client, "admin")
    listing = client.get("/pipelines/orders-x/dlq")
    assert listing.status_code == 200 and len(listing.text) < 1_000_000, len(listing.text)
    assert "… (996000 more characters: prism dlq show 0@3 --json)" in listing.text
    record = client.get(f"/pipelines/orders-x/dlq/{SRC}/0@3")
    assert record.status_code == 200 and len(record.text) < 50_000, len(record.text)
    assert "… (999000 more characters: prism dlq show 0@3 --json)" in record.text  # the key
    assert "<script>" not in record.text
    headers = client.get(f"/pipelines/orders-x/dlq/{SRC}/1@9")
    assert headers.status_code == 200 and len(headers.text) < 50_000, len(headers.text)
    assert re.search(r'id="more-headers">\d+ more header\(s\) not shown', headers.text)
    assert "<b>" not in headers.text and "<script>" not in headers.text


def test_reason_chips_are_the_most_frequent_codes(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reasons are header values anyone who writes the DLQ chooses: 2,000 distinct 3 kB reasons
    made 2,000 chips, each a link carrying its reason (~18 MB of HTML). Chips are the 50 most
    frequent reasons of at most 200 characters; the rest are counted, and search finds them."""
    import tests.console.test_views as me

    base = [(k, v) for k, v in RECORDS[1].headers if k != "prism.errors.reason"]
    recs = [FakeRecord(f"{SRC}.dlq", 0, i, b"v", headers=[*base, ("prism.errors.reason", b"%04d" % i + b"r" * 3000)])
            for i in range(2000)]
    recs += [FakeRecord(f"{SRC}.dlq", 1, i, b"v", headers=[*base, ("prism.errors.reason", b"code_%d" % (i % 60))])
             for i in range(120)]
    monkeypatch.setattr(me, "RECORDS", recs)
    login(client, "reader")
    page = client.get("/pipelines/orders-x/dlq")
    assert page.status_code == 200 and len(page.text) < 3_000_000, len(page.text)
    assert page.text.count('class="chip ') == 51  # "all" and 50 codes
    assert 'id="other-reasons">and 2010 other reason(s), 2020 record(s): search finds them' in page.text


def test_the_openapi_document_declares_the_400_page_not_a_json_422(client: TestClient) -> None:
    login(client, "reader")
    doc = client.get("/openapi.json").json()
    audit = doc["paths"]["/audit"]["get"]["responses"]
    assert "422" not in audit and "text/html" in audit["400"]["content"], audit.keys()
    assert not [p for p, ops in doc["paths"].items() for op in ops.values() if "422" in op["responses"]]
    assert "HTTPValidationError" not in doc.get("components", {}).get("schemas", {})
