"""`prism audit`: who received which classified messages (app/sdk/audit.py writes the records).

Wired into the top-level app by `app.cli.main` through `register(app)`; this module does not
import `app.cli.main`. The audit topic is read without a consumer group and without consuming
anything (`Backend.sample`), so an operator's query never moves a subscriber's position and
never takes a PostgreSQL row away from anyone.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from app.cli.output import friendly

console = Console()


def _default_url() -> str:
    """The SDK URL of the broker `prism run` uses: PRISM_BROKER_URL as a kafka:// URL."""
    broker = os.environ.get("PRISM_BROKER_URL", "")
    return f"kafka://{broker}" if broker and "://" not in broker else broker


def register(app: typer.Typer) -> None:
    """Add `prism audit` to `app`."""

    @app.command("audit")
    @friendly
    def audit_cmd(
        url: Annotated[str | None, typer.Option(
            help="backend URL the subscribers use (kafka://h:p, redis://, nats://, postgresql://); default: "
                 "kafka://$PRISM_BROKER_URL")] = None,
        audit_topic: Annotated[str, typer.Option(help="the audit topic the subscribers write to")] = "prism.audit",
        topic: Annotated[str | None, typer.Option("--topic", "-t", help="only deliveries from this topic")] = None,
        principal: Annotated[str | None, typer.Option("--principal", "-p", help="only this reader")] = None,
        namespace: Annotated[str | None, typer.Option(help="only this namespace")] = None,
        classification: Annotated[str | None, typer.Option(help="only confidential or restricted")] = None,
        since: Annotated[str | None, typer.Option(help="only records newer than this: 24h, 7d or an ISO time")] = None,
        limit: Annotated[int, typer.Option(min=1, help="read at most this many records of the topic")] = 100_000,
        json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    ) -> None:
        """List the deliveries of confidential and restricted messages to SDK subscribers:
        principal, group, message id, namespace, topic, classification and time (never payloads)."""
        from app.errors import ConfigError
        from app.sdk.audit import AUDITED, AuditFilter, parse_since, read_audit

        problems = []
        target = url or _default_url()
        if not target:
            problems.append("no backend: pass --url (e.g. kafka://127.0.0.1:9092) or set PRISM_BROKER_URL")
        if classification is not None and classification not in AUDITED:
            problems.append(f"--classification {classification!r}: only {sorted(AUDITED)} deliveries are audited")
        when = None
        if since is not None:
            try:
                when = parse_since(since)
            except ConfigError as exc:
                problems.append(exc.message)
        if problems:
            raise ConfigError("prism audit: " + "; ".join(problems), path="prism audit",
                              hint="e.g. prism audit --url kafka://127.0.0.1:9092 --principal svc-billing --since 24h")
        where = AuditFilter(topic=topic, principal=principal, namespace=namespace, classification=classification,
                            since=when)
        records, skipped = asyncio.run(read_audit(target, audit_topic=audit_topic, where=where, limit=limit))
        if json_out:
            for rec in records:
                typer.echo(json.dumps(rec, sort_keys=True))
            return
        for r in records:
            console.print(escape(f"{r.get('time', '?')}  {r.get('principal', '?')}  {r.get('classification', '?'):<12} "
                                 f"{r.get('namespace', '?')}/{r.get('topic', '?')}  {r.get('message_id', '?')}  "
                                 f"group={r.get('group', '?')} at {r.get('backend', '?')}:{r.get('ref', '?')}"),
                          soft_wrap=True, highlight=False)
        tail = f" ({skipped} other messages on {audit_topic} ignored)" if skipped else ""
        console.print(escape(f"{len(records)} audited deliveries{tail}"), highlight=False)
