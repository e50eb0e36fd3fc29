"""`prism status` against a live worker's management API, and `prism dlq list|show` reading a
real DLQ topic on the embedded broker."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app.cli.dlq import BadSelector
from app.cli.ops import _locked_until, dlq_row, record_time, register
from app.envelope import encode, new_envelope
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from tests.support import USERS, write_users_file
from tests.worker.conftest import dev_keys, make_topology  # noqa: F401 - fixtures (broker: tests/conftest.py)
from tests.worker.test_observability_e2e import ObservedPipeline


def _cli() -> typer.Typer:
    app = typer.Typer()
    dlq = typer.Typer()
    app.add_typer(dlq, name="dlq")
    register(app, dlq)
    return app


def test_a_dlq_record_stamped_outside_the_calendar_is_a_row_without_a_time() -> None:
    """The source topic's producer sets a record's timestamp and the DLQ copy keeps it: 2**62
    made dlq_row raise ValueError ('year 146140482 is out of range'), so `prism dlq list` died
    with a traceback and the console's DLQ page of the pipeline answered 500."""
    from types import SimpleNamespace

    for ms in (2**62, 2**63 - 1, 253_402_300_800_000, -1, 0):
        rec = SimpleNamespace(topic="t.dlq", partition=0, offset=7, timestamp=ms, key=None, value=b"x",
                              headers=[("prism.errors.reason", b"bad_envelope")])
        row = dlq_row(rec)
        assert row["timestamp"] is None and row["reason"] == "bad_envelope" and row["dlq_offset"] == 7, ms
    assert record_time(1_760_000_000_000) == "2025-10-09T08:53:20+00:00"


def test_a_retry_after_that_is_no_number_is_shown_as_it_is() -> None:
    assert _locked_until("42").startswith("locked out for 42 s, until ")
    assert _locked_until("²") == "locked out; Retry-After '²'"  # isdigit() took it, int() refused it
    assert _locked_until("9" * 5000).startswith("locked out; Retry-After '999")


def test_a_bad_since_is_reported_before_any_broker_is_looked_for(tmp_path: Path, monkeypatch) -> None:
    """The user's own words first: with nothing listening at the broker address, `--since 5q`
    is still the one error, not a refused connection followed by it on the next try."""
    monkeypatch.setenv("PRISM_BROKER_URL", "127.0.0.1:1")
    res = CliRunner().invoke(_cli(), ["dlq", "list", "--since", "5q", "-t", str(tmp_path / "none.yaml")])
    assert res.exit_code == 2, res.output
    line = " ".join(res.output.split())
    assert line.startswith("error [bad_config] --since '5q' is neither a duration nor an ISO 8601 time (at --since)")
    assert "fix: e.g. --since 24h" in line and "Kafka" not in line, line


def test_a_worker_url_that_cannot_be_a_url_is_one_line() -> None:
    """`prism status --url 'http://no such'` (http.client.InvalidURL) and `--url http://[::1`
    (ValueError from urllib) were tracebacks; now the one `bad_config` line naming --url."""
    for url in ("http://no such", "http://[::1"):
        res = CliRunner().invoke(_cli(), ["status", "--url", url])
        line = " ".join(res.output.split())
        assert res.exit_code == 2 and line.startswith("error [bad_config] the worker URL"), res.output
        assert "(at --url)" in line and "fix: pass --url http://HOST:PORT" in line, line


async def test_status_and_dlq_commands(broker, tmp_path: Path, dev_keys, monkeypatch) -> None:  # noqa: F811
    topo = make_topology(tmp_path, dev_keys, partitions=2)
    src = topo.sources[0].topic
    expired = dev_keys.mint_token("late", ttl_s=-5, now=time.time() - 600)

    def bad(i: int) -> bytes:
        e = new_envelope(src, {"bad": i}, namespace="order-events")
        e.ensure_security().auth_token = expired
        return encode(e)

    records = [(encode(new_envelope(src, {"i": i}, namespace="order-events")), []) for i in range(10)]
    records += [(bad(i), []) for i in range(3)] + [(b"\x00\x01 not json", [])]
    runner = CliRunner()
    # reads closed to anonymous callers: `prism status` needs credentials (env or options)
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(write_users_file(tmp_path / "u.yaml")),
                                              "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"})
    async with ObservedPipeline(topo, broker.bootstrap, tmp_path / "w", Observer(management=management)) as p:
        await p.produce(records)
        await p.wait_read(len(records))
        res = await asyncio.to_thread(runner.invoke, _cli(), ["status", "--url", p.url, "--interval", "0.2"],
                                      env={"PRISM_ADMIN_USER": None, "PRISM_ADMIN_TOKEN": None})
        assert res.exit_code == 2 and "HTTP 401" in res.output and "PRISM_ADMIN_USER" in res.output, res.output
        res = await asyncio.to_thread(runner.invoke, _cli(), ["status", "--url", p.url, "--user", "reader",
                                                              "--password", "wrong", "--interval", "0.2"])
        assert res.exit_code == 2 and "HTTP 401" in res.output
        monkeypatch.setenv("PRISM_ADMIN_USER", "reader")
        monkeypatch.setenv("PRISM_ADMIN_PASSWORD", USERS["reader"][0])
        res = await asyncio.to_thread(runner.invoke, _cli(), ["status", "--url", p.url, "--json", "--interval", "0.2"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        (t,) = doc["topologies"]
        assert t["name"] == topo.name and t["status"]["connector"]["state"] == "RUNNING"
        dlq_total = p.pipeline.summary()["dlq"]
        assert t["dlq"]["total"] == dlq_total == doc["totals"]["dlq"]
        assert doc["totals"]["in"] == len(records)
        res = await asyncio.to_thread(runner.invoke, _cli(), ["status", "--url", p.url, "--interval", "0.2"])
        assert res.exit_code == 0 and "source partitions" in res.output and topo.name in res.output
        assert "[/" not in res.output and "[bold" not in res.output, res.output  # markup rendered, not printed
    res = runner.invoke(_cli(), ["status", "--url", p.url])
    assert res.exit_code == 2 and "cannot reach the worker" in res.output

    monkeypatch.setenv("PRISM_BROKER_URL", broker.bootstrap)
    topo_file = str(tmp_path / "topology.yaml")
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "list", "-t", topo_file, "--json", "--limit", "0"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == dlq_total
    auth = [r for r in rows if r["stage"] == "authenticate"]
    assert len(auth) == 3
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "list", "-t", topo_file, "--json", "--reason", auth[0]["reason"]])
    assert len(json.loads(res.output)) == 3
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "list", "-t", topo_file, "--json", "--since", "2h", "--limit", "2"])
    assert len(json.loads(res.output)) == 2
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "list", "-t", topo_file])
    assert res.exit_code == 0 and f"{dlq_total} DLQ record(s)" in res.output
    assert "[/" not in res.output and "[bold" not in res.output, res.output
    ref = f"{auth[0]['dlq_partition']}@{auth[0]['dlq_offset']}"
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "show", ref, "-t", topo_file, "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["reason"] == auth[0]["reason"] and expired not in res.output
    res = await asyncio.to_thread(runner.invoke, _cli(), ["dlq", "show", "1@999", "-t", topo_file])
    assert res.exit_code == 2 and "error [prism_error] no record at 1@999" in res.output, res.output


def test_status_prints_a_supervisor_and_escapes_child_errors() -> None:
    """`prism status` against `prism run --processes N --web-port P`: the children's table, then
    each child; a child's error text (it can hold anything) is printed literally, not as markup."""
    from rich.console import Console

    from app.cli.ops import print_status

    child = {"index": 0, "pid": 11, "state": "ready", "restarts": 2, "last_exit": -9, "event_loop": "uvloop",
             "web_url": "http://127.0.0.1:7001", "writer_id": "h-1-p0"}
    doc = {"url": "http://127.0.0.1:7000",
           "supervisor": {"pid": 10, "topology": "orders", "processes": 2, "ready": False, "restarts": 2,
                          "children": [child, {**child, "index": 1, "pid": None, "state": "restarting",
                                               "web_url": "http://127.0.0.1:7002", "writer_id": "h-1-p1"}]},
           "workers": [{"index": 0, "url": child["web_url"], "error": "boom [bold red]x[/] \x1b[31m"},
                       {"index": 1, "url": "http://127.0.0.1:7002"}]}
    con = Console(record=True, width=200)
    print_status(doc, con)
    text = con.export_text()
    assert "supervisor pid 10" in text and "not ready" in text and "restarting" in text and "-9" in text
    assert "h-1-p0" in text and "h-1-p1" in text and "uvloop" in text
    assert "[bold red]x[/]" in text  # shown as typed, not interpreted


def test_secret_headers_and_tokens_in_the_error_are_not_shown() -> None:
    """`prism dlq show` and the console's record page redact headers by the names the log
    redaction knows (x-api-key, password, *-token were shown in clear), and the error text on
    the list is masked like the headers (a bearer JWT in it was shown on the console's list and
    record page while the same text in the header table was masked)."""
    from types import SimpleNamespace

    from app.cli.ops import dlq_show_doc

    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    rec = SimpleNamespace(topic="t.dlq", partition=0, offset=3, timestamp=1_760_000_000_000, key=None,
                          value=b'{"a": 1}', headers=[
                              ("prism.errors.exception.message", f"token Bearer {jwt} expired".encode()),
                              ("x-api-key", b"sk_live_SECRET123"), ("password", b"hunter2"),
                              ("X-Secret-Token", b"TOPSECRET"), ("traceparent", b"00-abc-def-01"),
                              ("content-type", b"application/json")])
    row = dlq_row(rec)
    assert jwt not in row["error"] and row["error"].startswith("token Bearer ***") and "expired" in row["error"]
    doc = dlq_show_doc(rec)
    text = json.dumps(doc)
    for secret in ("sk_live_SECRET123", "hunter2", "TOPSECRET", jwt):
        assert secret not in text, secret
    assert doc["headers"]["x-api-key"] == doc["headers"]["password"] == doc["headers"]["X-Secret-Token"] == "<redacted>"
    assert doc["headers"]["traceparent"] == "00-abc-def-01" and doc["headers"]["content-type"] == "application/json"


def test_a_huge_header_fills_a_few_lines_of_dlq_list_not_thousands() -> None:
    """Headers are data whoever writes to the DLQ topic chooses: a 200 KB `prism.errors.reason`
    was 7,700 lines of `prism dlq list`. Each cell shows its start and how to see the rest."""
    import io

    from rich.console import Console

    from app.cli.ops import dlq_table

    row = {"dlq_partition": 0, "dlq_offset": 4, "timestamp": "2026-12-01T04:21:19+00:00",
           "source": "orders.created/0@5", "reason": "r" * 200_000, "stage": "verify", "attested_identity": "",
           "error": "e" * 100_000}
    table = dlq_table([row])
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(table)
    assert len(out.getvalue().splitlines()) < 300, len(out.getvalue().splitlines())
    left, error = (str(c.plain) for c in (table.columns[1]._cells[0], table.columns[2]._cells[0]))
    assert left == f"orders.created 0@5\n{'r' * 200}… (199800 more characters: prism dlq show 0@4)\n(verify)"
    assert error == f"{'e' * 4000}… (96000 more characters: prism dlq show 0@4)"


def test_a_huge_header_fills_a_few_lines_of_dlq_show_and_json_keeps_it_whole() -> None:
    """`prism dlq show` printed every header whole: a 200 KB header was thousands of lines. Each
    header-derived field is capped as `dlq list` caps its cells, saying how to get all of it
    (`--json`, which keeps every value whole)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from app.cli.ops import dlq_show_doc, print_dlq_record

    rec = SimpleNamespace(topic="t.dlq", partition=0, offset=4, timestamp=1_760_000_000_000, key=b"k" * 50_000,
                          value=b'{"a": 1}', headers=[("prism.errors.reason", b"r" * 200_000),
                                                      ("x-trace", b"h" * 200_000), ("n" * 5_000, b"v")])
    doc = dlq_show_doc(rec)
    assert doc["headers"]["x-trace"] == "h" * 200_000  # --json: whole
    out = io.StringIO()
    print_dlq_record(doc, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert len(text) < 20_000 and len(text.splitlines()) < 300, len(text)
    assert f"  x-trace: {'h' * 1000}… (199000 more characters: prism dlq show 0@4 --json)" in text
    assert f"failed     {'r' * 200}… (199800 more characters: prism dlq show 0@4 --json) at stage" in text
    assert f"key        {'k' * 1000}… (49000 more characters: prism dlq show 0@4 --json)" in text
    assert f"  {'n' * 200}… (4800 more characters: prism dlq show 0@4 --json): v" in text


async def test_dlq_list_holds_only_the_records_it_prints(broker) -> None:
    """`prism dlq list` (50 by default) held the whole DLQ to print its oldest 50 (200k records: ~580
    MiB, as the console's DLQ page did). It now filters as it reads and keeps the `limit` oldest matches - the same records,
    in the same order, as filtering and sorting all of them."""
    import random
    import tracemalloc
    import uuid
    from types import SimpleNamespace

    from aiokafka import AIOKafkaProducer

    from app.broker.admin import ensure_topics
    from app.cli.dlq import read_to_end
    from app.cli.ops import read_dlq

    src = f"orders.list-{uuid.uuid4().hex[:8]}"
    topo = SimpleNamespace(sources=[SimpleNamespace(topic=src, partitions=2)], dlq=SimpleNamespace(topic_suffix=".dlq"))
    await ensure_topics(broker.bootstrap, {src: 2, f"{src}.dlq": 2})
    rnd = random.Random(7)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20, max_request_size=4 << 20)
    await producer.start()
    try:
        sent = [await producer.send(f"{src}.dlq", b"x" * 50_000, partition=i % 2, timestamp_ms=10_000 + rnd.randrange(50),
                                    headers=[("prism.errors.reason", b"a" if i % 3 else b"b")]) for i in range(1200)]
        for s in sent:
            await s
    finally:
        await producer.stop()

    every = await read_to_end(broker.bootstrap, f"{src}.dlq", 2)

    def order(r: object) -> tuple[int, int, int]:
        return (r.timestamp, r.partition, r.offset)  # type: ignore[attr-defined]
    for reason, limit in ((None, 7), ("b", 5), ("a", 0)):
        want = sorted((r for r in every if reason is None or dict(r.headers)["prism.errors.reason"].decode() == reason),
                      key=order)
        got = await read_dlq(topo, broker.bootstrap, reason=reason, limit=limit)
        assert [order(r) for r in got] == [order(r) for r in (want[:limit] if limit else want)], (reason, limit)
    # a reason no record has is a typo to report, with the reasons there are, not an empty list
    with pytest.raises(BadSelector, match=r"no DLQ record has reason 'nothing'; the reasons in .* are 'a' \(800\), "
                                          r"'b' \(400\)"):
        await read_dlq(topo, broker.bootstrap, reason="nothing", limit=3)
    del every
    tracemalloc.start()
    try:
        await read_dlq(topo, broker.bootstrap, limit=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 45_000_000, peak  # the DLQ holds 60 MB of values: holding them all peaked at 69 MB
