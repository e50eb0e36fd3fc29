"""Every stage's success and failure paths, end to end on the real embedded broker: the
demo's load generator produces every kind of input (good and deliberately bad), the
worker processes it, and every input offset is reconciled with where it ended up."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from app.demo.runner import print_report, run_demo
from tests.brokers import BrokerUnderTest
from tests.worker.conftest import make_topology


async def test_every_kind_of_input_ends_where_it_should(any_broker: BrokerUnderTest, tmp_path: Path, dev_keys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the embedded broker the demo starts its own (as `make demo` does); on Apache Kafka it
    is pointed at the cluster through PRISM_BROKER_URL, as a user would run it."""
    if any_broker.embedded:
        monkeypatch.delenv("PRISM_BROKER_URL", raising=False)
    else:
        monkeypatch.setenv("PRISM_BROKER_URL", any_broker.bootstrap)
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
