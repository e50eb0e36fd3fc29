"""Every stage's success and failure paths, end to end on the real embedded broker: the
demo's load generator produces every kind of input (good and deliberately bad), the
worker processes it, and every input offset is reconciled with where it ended up."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from app.demo.runner import print_report, run_demo
from tests.support import require_broker_binary
from tests.worker.conftest import make_topology


async def test_every_kind_of_input_ends_where_it_should(tmp_path: Path, dev_keys) -> None:
    require_broker_binary()
    topo = make_topology(tmp_path, dev_keys)
    console = Console(record=True, width=140)
    report = await run_demo(topo, messages=1500, rate=0, data_dir=tmp_path / "demo", keys_dir=dev_keys.folder,
                            console=console, seed=11, timeout=120)
    print_report(report, topo, console)
    assert report.ok, report.mismatches[:10]
    w = report.worker
    assert report.published == 1500 == w["emitted"] + w["dlq"] + w["expired"] + w["duplicate"]
    assert {"bad_signature", "token_expired", "policy_violation", "invalid_envelope"} <= set(w["dlq_reasons"])
    assert w["expired"] > 0 and w["duplicate"] > 0
    # every kind of input was exercised
    assert all(n > 0 for n in report.by_kind.values()) and len(report.by_kind) >= 17
