"""`prism dlq replay`: put dead-lettered records back on their source topic.

The record is re-produced exactly as it was received (key, value with secrets masked,
headers, timestamp), minus the `prism.errors.*` context headers, so the fixed pipeline
sees it as new input; dedup by message id keeps a replay from emitting a message twice
if it had in fact been emitted before.

The `prism-dlq-attestation` header stays: the masked token cannot authenticate the record
again, the worker-signed attestation of the identity verified before the failure does
(app/security/attestation.py). Records are re-produced byte for byte, because the
attestation is bound to the record's value, key and remaining headers.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer
from rich.console import Console
from rich.progress import Progress

from app.agents.dlq import error_context, strip_error_headers
from app.demo.runner import read_all
from app.topology import Topology


async def replay(topology: Topology, bootstrap: str, *, settings: Any = None, reason: str | None = None,
                 limit: int = 0, dry_run: bool = False, console: Console | None = None) -> int:
    extra = settings.aiokafka_kwargs() if settings is not None else {}
    count = 0
    producer = None if dry_run else AIOKafkaProducer(bootstrap_servers=bootstrap, **extra)
    if producer is not None:
        await producer.start()
    try:
        for source in topology.sources:
            dlq = source.topic + topology.dlq.topic_suffix
            records = (await read_all(bootstrap, {dlq: source.partitions}, expected_total=0, timeout=30,
                                      settings=settings))[dlq]
            selected = [r for r in records if reason is None or error_context(r.headers or []).get("reason") == reason]
            if limit:
                selected = selected[:limit]
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task(f"replaying {dlq} -> {source.topic}", total=len(selected))
                for rec in selected:
                    if producer is not None:
                        await producer.send_and_wait(source.topic, rec.value, key=rec.key,
                                                     headers=strip_error_headers(list(rec.headers or [])),
                                                     timestamp_ms=rec.timestamp)
                    count += 1
                    progress.advance(task)
    finally:
        if producer is not None:
            await producer.stop()
    return count
