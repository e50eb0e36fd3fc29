"""Every kind of DLQ record, opened and replayed in headless Chromium through the console.

What this guards: the record page of a Prism envelope or an LNMP message answered 500 (its
template asked for a field only the other kinds have), so the failures of SDK producers - most
DLQ records - had no page and no Replay button; the earlier tests used only JSON and raw values.
Here a real worker runs the topology (its management API tells the console the pipeline), the
DLQ holds one record of each kind built by the worker's own DLQ code (tests/console/record_kinds.py),
and an admin opens each record's page - its kind and reason shown, secrets redacted, nothing
from the data run as script - and presses Replay. Every kind is replayed to its source partition
but the copy cut without a whole copy (never replayable: the page says why). Then, independently
of the console, the source topic is read: it holds exactly the replayed values, the
``too_large`` one whole (read back from its reference), not the cut copy. Two forged ledger
records (a deeply nested value, a mistyped count) break neither the list nor a replay: the
list says once that they were skipped."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.broker.admin import ensure_topics
from app.broker.embedded import EmbeddedBroker, find_free_port
from app.cli.dlq import ledger_topic
from app.console import create_app
from app.demo.runner import read_all
from app.observability.metrics import PipelineMetrics
from app.security.devkeys import DevKeys
from app.worker.dlq_overflow import build_overflow
from app.worker.management import ManagementSettings
from app.worker.observe import Observer
from tests.cli.test_dlq_cli import _seed
from tests.cli.test_dlq_ledger import _write_ledger
from tests.console.record_kinds import BEARER, Kind, every_kind
from tests.console.support import console_settings, serve
from tests.console.test_console_browser import Flow
from tests.support import ADMIN_CLEARED, write_users_file
from tests.worker.conftest import make_topology
from tests.worker.harness import RunningPipeline


def _open_and_replay(flow: Flow, name: str, src: str, kinds: list[Kind], refs: list[str]) -> dict[str, str]:
    """Each record's page, then its Replay; returns ref -> the replay outcome line."""
    outcomes: dict[str, str] = {}
    flow.login("admin")
    for kind, ref in zip(kinds, refs, strict=True):
        flow.drv.get(f"{flow.url}/pipelines/{name}/dlq/{src}/{ref}")
        shown = flow.text("#record-kind")
        assert shown == kind.shows, (kind.name, shown)
        assert flow.text("#record-reason") == kind.record.reason, kind.name
        assert BEARER.split(".")[1] not in flow.text("#record-value") + flow.text("#record-headers"), kind.name
        flow.text("#record-value")
        flow.no_alert()
        flow.shot(f"kind-{kind.name}")
        flow.click("#replay")
        outcomes[ref] = flow.text("#replay-outcome")
        flow.no_alert()
        if kind.replayable:  # the record page now shows the ledger entry, by this user
            flow.drv.get(f"{flow.url}/pipelines/{name}/dlq/{src}/{ref}")
            assert "by console:admin" in flow.text("#ledger"), kind.name
    flow.drv.get(f"{flow.url}/pipelines/{name}/dlq")  # the list, with every kind in it (and the worker's
    flow.text("#dlq-table")                           # new copies of the replays that failed again)
    listed = {r.get_attribute("data-ref") for r in flow.drv.find_elements("css selector", "tr.dlq-row")}
    assert set(refs) <= listed, listed
    # the forged ledger records: skipped, said once, and they broke neither the list nor a replay
    warning = flow.text(".ledger-warning")
    assert "2 record(s)" in warning and "not valid ledger entries" in warning, warning
    flow.shot("kind-list")
    return outcomes


@pytest.mark.timeout(300)
async def test_every_kind_of_dlq_record_opens_and_replays(broker: EmbeddedBroker, tmp_path: Path,
                                                          dev_keys: DevKeys, browser: Any) -> None:
    users_file = write_users_file(tmp_path / "users.yaml", clearances=ADMIN_CLEARED)
    topo = make_topology(tmp_path, dev_keys, partitions=1, dlq={"overflow": {"path": f"file://{tmp_path}/overflow"}})
    src = topo.sources[0].topic
    store = build_overflow(topo)
    assert store is not None
    kinds = every_kind(src, store)
    await ensure_topics(broker.bootstrap, topo.topics())
    where = await _seed(broker.bootstrap, [k.record for k in kinds], [0] * len(kinds))
    refs = [f"{p}@{o}" for p, o in where]
    # whoever can write the ledger: a deeply nested value and a mistyped count, for two records
    await _write_ledger(broker.bootstrap, ledger_topic(src + ".dlq"), [
        (refs[0].encode(), b"[" * 100_000 + b"]" * 100_000),
        (refs[1].encode(), json.dumps({"v": 1, "replays": "2", "dlq_partition": 0}).encode())])
    management = ManagementSettings.from_env({"PRISM_ADMIN_USERS_FILE": str(users_file),
                                              "PRISM_ADMIN_ALLOW_ANONYMOUS": "none"})
    port = find_free_port()
    async with RunningPipeline(topo, broker.bootstrap, tmp_path / "w", app_id=f"kinds-{uuid.uuid4().hex[:8]}",
                               web_port=port, observe=Observer(metrics=PipelineMetrics(), management=management)):
        settings = console_settings(users_file, registry_url=None, worker_urls=(f"http://127.0.0.1:{port}",),
                                    bootstrap=broker.bootstrap)
        with serve(create_app(settings)) as console_url:
            flow = Flow(browser, console_url, tmp_path)
            outcomes = await asyncio.to_thread(_open_and_replay, flow, topo.name, src, kinds, refs)
    for kind, ref in zip(kinds, refs, strict=True):
        line = outcomes[ref]
        if kind.replayable:
            assert line.startswith(f"Replayed {ref} ({kind.record.reason}) to {src} partition 0 offset"), line
        else:
            assert line.startswith("Not replayed: truncated"), line
    replayable = [k for k in kinds if k.replayable]
    back = (await read_all(broker.bootstrap, {src: 1}, expected_total=len(replayable), timeout=30))[src]
    by_ref = next(k for k in kinds if k.name == "too-large-by-ref")
    whole = store.get(dict(by_ref.record.headers)["prism.errors.value.ref"].decode())
    expected = [whole if k is by_ref else k.record.value for k in replayable]
    assert sorted(r.value for r in back) == sorted(expected)
    assert all(not any(h.startswith("prism.errors.") for h, _ in r.headers) for r in back)
    assert len(list(tmp_path.glob("console-kind-*.png"))) == len(kinds) + 1
