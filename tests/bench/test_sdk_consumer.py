"""The SDK consumer benchmark measures what it says (bench/bench_sdk_consumer.py): every
contender reads every record, the verifying baseline really verifies, the SDK loop acks without
a commit per record. No timing here - the benchmark itself measures."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from bench import bench_sdk_consumer as b
from tests.support import require_broker_binary


def test_top_functions_counts_only_the_read_loop() -> None:
    collapsed = "\n".join([
        "main;run_sdk;receive;_check 6",
        "main;run_sdk;receive;fetch 2",
        "main;load_topic;sign 100",  # the topic load: not the read loop
    ])
    rows = b.top_functions(collapsed, k=10)
    assert rows[-1] == "(8 samples)"
    check = next(r for r in rows if r.endswith("  _check"))
    assert check.startswith(" 75.0% incl  75.0% self")
    assert not any(r.endswith("  sign") for r in rows)


@pytest.mark.integration
def test_every_contender_reads_every_record_and_the_sdk_batches_its_commits(tmp_path) -> None:
    require_broker_binary()
    args = argparse.Namespace(broker="embedded", n=1500, rounds=1, sync_n=40, contenders=",".join(b.CONTENDERS))
    result = asyncio.run(b.main_async(args))
    res = result["rounds"][0]["results"]
    assert set(res) == set(b.CONTENDERS)
    for name, r in res.items():
        assert r["records"] == (40 if name == "sdk-sync-commit" else 1500), name
        assert r["msgs_per_s"] > 0 and r["cpu_us_per_msg"] > 0, name
    assert res["sdk-sync-commit"]["commit_requests"] == 40  # the old ack: a round trip per record
    assert res["sdk"]["commit_requests"] < 100  # the background commit: a handful for 1500 acks
    # verifying costs CPU: the baseline that verifies is not the one that only counts
    assert res["raw+verify"]["cpu_us_per_msg"] > res["raw"]["cpu_us_per_msg"]
    assert set(result["summary"]["median_ratio"]) >= {"sdk/raw+verify", "sdk/raw"}

