"""`prism audit` (app/cli/audit.py): a misspelt audit topic is an error, not an empty audit.

What this guards: `prism audit --audit-topic typo` printed "0 audited deliveries, 0 refused
reads" and exited 0 - a clean bill of health for a topic nobody writes to. The check is in
the one place that opens the audit source (`app.sdk.audit._sample`), for every backend."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from pathlib import Path

from app.sdk.backends import backend_for_url
from tests.cli.test_cli_broker_errors import one_error_line
from tests.cli.test_dlq_cli import prism


def _keyring(tmp_path: Path) -> Path:
    ring = tmp_path / "readers.yaml"
    ring.write_text("keys:\n  - id: k1\n    algorithm: hmac-sha256\n    secret_b64: "
                    f"{base64.b64encode(os.urandom(32)).decode()}\n    publisher_id: svc-a\n")
    return ring


async def test_a_missing_audit_topic_is_one_error_line(broker, tmp_path: Path) -> None:
    topic = f"audit-typo-{uuid.uuid4().hex[:8]}"
    res = await asyncio.to_thread(prism, "audit", "--keyring", str(_keyring(tmp_path)), "--url",
                                  f"kafka://{broker.bootstrap}", "--audit-topic", topic)
    line = one_error_line(res, "topic_not_found")
    assert f"the audit topic {topic!r} does not exist" in line and "--audit-topic" in line


async def test_an_existing_audit_topic_without_deliveries_is_an_empty_audit(broker, tmp_path: Path) -> None:
    """The topic exists (here with one message that is no audit record): reading it is no error."""
    topic = f"audit-{uuid.uuid4().hex[:8]}"
    backend = backend_for_url(f"kafka://{broker.bootstrap}")
    await backend.connect()
    try:
        await backend.publish_bytes(topic, b"not an audit record")
    finally:
        await backend.close()
    res = await asyncio.to_thread(prism, "audit", "--keyring", str(_keyring(tmp_path)), "--url",
                                  f"kafka://{broker.bootstrap}", "--audit-topic", topic)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 audited deliveries, 0 refused reads (1 other messages" in res.stdout, res.stdout


def test_a_kafka_url_with_a_space_in_its_host_is_one_error_line(tmp_path: Path) -> None:
    """`--url 'kafka://no such:1'` reached aiokafka as the host `no such`; the URL's hosts now go
    through the one bootstrap parser, refused before any connection."""
    res = prism("audit", "--keyring", str(_keyring(tmp_path)), "--url", "kafka://no such:1")
    assert "'no such:1' contains whitespace" in one_error_line(res, "bad_config")
