"""The console's DLQ pages on a real DLQ topic (the embedded broker) larger than one page's
window: the list reads only the newest records (``dlq_window_records``), says how far it looked,
and its "older" links walk back to the oldest record, each record once; a record outside the
window still has its page (read by its offset alone); cursors and refs that are not the page's
get the error page, not a 500.

Why: the list and record pages read the whole DLQ topic for every view - a producer flooding
the DLQ made each view cost memory and time proportional to the flood (app/cli/dlq.py
`read_window`, `read_record`)."""

from __future__ import annotations

import dataclasses
import html
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from fastapi.testclient import TestClient

from app.broker.admin import ensure_topics
from app.console import create_app
from app.console.backends import Workers
from tests.console.support import console_settings
from tests.support import ADMIN_CLEARED, auth_headers, write_users_file


def _headers(src: str, i: int) -> list[tuple[str, bytes]]:
    return [("prism.errors.topic", src.encode()), ("prism.errors.partition", b"0"),
            ("prism.errors.offset", str(i).encode()), ("prism.errors.stage", b"policy"),
            ("prism.errors.reason", b"auth_failed" if i % 5 == 0 else b"policy_violation"),
            ("prism.errors.exception.message", f"record number {i}".encode())]


@pytest.fixture
def dlq(broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A pipeline of one source whose DLQ (2 partitions) holds 130 records: 100 and 30."""
    import asyncio

    src = f"orders.win-{uuid.uuid4().hex[:8]}"
    info = {"name": "win", "namespace": "order-events", "sources": [{"topic": src, "partitions": 2}],
            "outputs": [f"{src}.v3"], "dlq": [f"{src}.dlq"], "stages": ["normalize"]}

    async def seed() -> None:
        await ensure_topics(broker.bootstrap, {src: 2, f"{src}.dlq": 2})
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for i in range(130):
                await producer.send_and_wait(f"{src}.dlq", b'{"n": %d}' % i, headers=_headers(src, i),
                                             partition=0 if i < 100 else 1, timestamp_ms=1_760_000_000_000 + i)
        finally:
            await producer.stop()

    asyncio.run(seed())

    async def fake_info(self: Workers, name: str) -> dict[str, Any]:
        return info

    monkeypatch.setattr(Workers, "info", fake_info)
    settings = console_settings(write_users_file(tmp_path / "users.yaml", clearances=ADMIN_CLEARED),
                                registry_url=None, worker_urls=("http://127.0.0.1:9",), bootstrap=broker.bootstrap)
    with TestClient(create_app(dataclasses.replace(settings, dlq_window_records=50)),
                    base_url="http://console.test") as c:
        c.headers.update(auth_headers("admin"))
        yield c, src


def _refs(page: str) -> list[str]:
    return re.findall(r'data-ref="([^"]+)"', page)


def test_the_list_reads_a_window_and_its_older_links_reach_the_oldest_record(dlq: Any) -> None:
    c, src = dlq
    first = c.get("/pipelines/win/dlq")
    assert first.status_code == 200, first.text[:500]
    said = " ".join(re.search(r'<p class="muted scanned"[^>]*>(.*?)</p>', first.text, re.S)[1].split())
    assert f"Scanned the newest 50 of 130 record(s) in {src}.dlq" in said, said
    assert "80 older" in said and "counts, filters and search cover these only" in said
    # the newest of each partition: 25 and 25 (equal shares)
    assert sorted(_refs(first.text)) == sorted([f"0@{o}" for o in range(75, 100)] + [f"1@{o}" for o in range(5, 30)])
    seen, page, pages = list(_refs(first.text)), first, 1
    while (older := re.search(r'<a class="older" href="([^"]+)"', page.text)) is not None:
        page = c.get("/pipelines/win/dlq" + html.unescape(older[1]))
        assert page.status_code == 200 and 'class="newest"' in page.text, page.text[:500]
        seen += _refs(page.text)
        pages += 1
        assert pages < 10
    assert "Nothing older." in page.text
    assert sorted(seen) == sorted([f"0@{o}" for o in range(100)] + [f"1@{o}" for o in range(30)])  # each once

    # filters apply within the window, and keep the cursor
    only = c.get("/pipelines/win/dlq", params={"reason": "auth_failed"})
    assert set(_refs(only.text)) and all(r in _refs(first.text) for r in _refs(only.text))
    assert "&amp;reason=auth_failed" in re.search(r'<a class="older" href="([^"]+)"', only.text)[1]


def test_a_record_outside_the_window_has_its_page_and_bad_refs_do_not(dlq: Any) -> None:
    c, src = dlq
    oldest = c.get(f"/pipelines/win/dlq/{src}/0@0")
    assert oldest.status_code == 200 and "record number 0" in oldest.text, oldest.text[:500]
    for ref in ("0@100", "1@30", f"0@{2**63 - 1}", "0@" + "9" * 25, "-1@0", "2@0", "0@-1", "0@0x1"):
        page = c.get(f"/pipelines/win/dlq/{src}/{ref}")
        assert page.status_code == 404 and "Not found" in page.text, (ref, page.status_code, page.text[:300])


def test_cursors_that_are_not_the_pages_get_a_400_page(dlq: Any) -> None:
    c, _ = dlq
    for before in ("abc", "0@1,0@2", "5@1", "0@1,1@1,0@1", "-1@3", "0@" + "9" * 30, "<script>@1"):
        page = c.get("/pipelines/win/dlq", params={"before": before})
        assert page.status_code == 400 and page.headers["content-type"].startswith("text/html"), (before, page.text)
        assert "Bad request" in page.text and "<script>@" not in page.text
    # a cursor past the end reads from the end, one before the beginning reads nothing
    assert len(_refs(c.get("/pipelines/win/dlq", params={"before": "0@999999,1@999999"}).text)) == 50
    assert _refs(c.get("/pipelines/win/dlq", params={"before": "0@0,1@0"}).text) == []


def test_a_record_the_client_cannot_decode_is_skipped_and_named(dlq: Any) -> None:
    """One DLQ record with a header name that is not UTF-8 made aiokafka raise on every read of
    its batch: the DLQ page of the pipeline answered 500 for every view."""
    import asyncio

    from tests.cli.test_dlq_window import poison

    c, src = dlq
    bootstrap = c.app.state.refusals.bootstrap  # the console's broker
    assert asyncio.run(poison(bootstrap, f"{src}.dlq", 4, {1})) == [100, 101, 102, 103]
    page = c.get("/pipelines/win/dlq")
    assert page.status_code == 200, page.text[:500]
    warning = " ".join(re.search(r'<p class="warn unreadable">(.*?)</p>', page.text, re.S)[1].split())
    assert warning.startswith(f"Skipped 0@101-103 of {src}.dlq: a record there cannot be decoded"), warning
    assert "0@100" in _refs(page.text) and "0@99" in _refs(page.text) and "0@102" not in _refs(page.text)
    bad = c.get(f"/pipelines/win/dlq/{src}/0@102")
    assert bad.status_code == 404 and "the Kafka client cannot decode" in bad.text, bad.text[:500]
    assert c.get(f"/pipelines/win/dlq/{src}/0@100").status_code == 200
