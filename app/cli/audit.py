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
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from app.cli.output import friendly

console = Console(emoji=False)


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
        classification: Annotated[str | None, typer.Option(
            help="only this classification (deliveries: confidential or restricted; refusals: any above public)")] = None,
        since: Annotated[str | None, typer.Option(help="only records newer than this: 24h, 7d or an ISO time")] = None,
        limit: Annotated[int, typer.Option(min=1, help="read at most this many records of the topic")] = 100_000,
        json_out: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
        keyring: Annotated[Path | None, typer.Option(
            envvar="PRISM_AUDIT_KEYRING",
            help="signing keyring (YAML) with the subscribers' keys, each bound to its principal by publisher_id: "
                 "every record is verified with it")] = None,
    ) -> None:
        """List the deliveries of confidential and restricted messages to SDK subscribers, and
        every refused read (a message of any classification withheld from a subscriber below it;
        several refused from one fetch share one record, listed one line each): principal, group, message id, namespace, topic, classification and
        time (never payloads). Each record's signature is verified with --keyring and must be
        by a key bound to its principal; records that fail are shown marked FAILED, with why,
        and the command exits 1."""
        from app.errors import BrokerError, ConfigError, PrismError
        from app.sdk.audit import LEVELS, AuditFilter, parse_since, read_audit_entries, refused_reads

        problems = []
        target = url or _default_url()
        if not target:
            problems.append("no backend: pass --url (e.g. kafka://127.0.0.1:9092) or set PRISM_BROKER_URL")
        ring = None
        if keyring is None:
            problems.append("no --keyring: audit records are signed by the subscribers' keys and are only listed "
                            "once verified - pass the signing keyring that binds each key to its principal")
        else:
            from app.security.signing import load_signing_keyring

            try:
                ring = load_signing_keyring(keyring)
            except ConfigError as exc:
                problems.append(f"--keyring: {exc.message}")
        if classification is not None and classification not in LEVELS[1:]:
            problems.append(f"--classification {classification!r} is not one of {list(LEVELS[1:])} (public data is "
                            "neither audited nor ever refused)")
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
        try:
            entries, skipped = asyncio.run(read_audit_entries(target, ring, audit_topic=audit_topic, where=where,
                                                              limit=limit))
        except PrismError as exc:
            if exc.code not in ("publish_failed", "subscribe_failed"):
                raise
            # the SDK backend's connect error names publishing; this command only reads
            raise BrokerError(f"cannot read the audit topic {audit_topic!r}: {exc.message}", path=exc.path,
                              hint=exc.hint) from None
        failed = [e for e in entries if not e.verified]
        # one line per delivery and per refused read: a record of several refusals stands for each
        lines = [(e, r) for e in entries for r in (refused_reads(e.record) or [e.record]) if where.matches(r)]
        if json_out:
            for e, r in lines:
                typer.echo(json.dumps({**r, "verified": e.verified, "signed_by": e.signed_by,
                                       **({"problem": e.problem} if e.problem else {})}, sort_keys=True, default=str))
        else:
            for e, r in lines:
                what = "REFUSED " if r.get("event") == "classified_refused" else ""
                mark = f"ok {e.signed_by}" if e.verified else f"FAILED: {e.problem}"
                console.print(Text(f"{r.get('time', '?')}  {what}{r.get('principal') or '(no principal)'}  "
                                   f"{r.get('classification', '?'):<12} {r.get('namespace', '?')}/{r.get('topic', '?')}"
                                   f"  {r.get('message_id', '?')}  group={r.get('group', '?')} at "
                                   f"{r.get('backend', '?')}:{r.get('ref', '?')}  [{mark}]"), soft_wrap=True)
            refused = sum(1 for _, r in lines if r.get("event") == "classified_refused")
            tail = f" ({skipped} other messages on {audit_topic} ignored)" if skipped else ""
            console.print(Text(f"{len(lines) - refused} audited deliveries, {refused} refused reads{tail}"))
            if failed:
                console.print(Text(f"{len(failed)} record(s) FAILED verification: not written by the principal they "
                                   "name - do not trust them; find who can write {audit_topic}".replace(
                                       "{audit_topic}", audit_topic)))
        if failed:
            raise typer.Exit(1)
