"""The operator console: one authenticated browser UI over the schema registry, the workers'
management APIs and the DLQ topics (issue 22, item 9).

Why a separate process (``prism console``) and not pages inside the registry: operators
compare it with Redpanda Console, AKHQ and Confluent Control Center, which sit beside the
services they show. The console needs three back ends the registry has no business knowing -
the workers' management APIs, the Kafka cluster (DLQ records, replays, ``.v3``) and the
registry itself - and it reaches each **server-side with its own configured credentials**
(``PRISM_REGISTRY_*``, ``PRISM_ADMIN_*``, ``PRISM_BROKER_URL`` and ``PRISM_SASL_*``), which never
reach the browser. The browser authenticates to the console alone (:mod:`app.console.sessions`).

Layout: :mod:`~app.console.settings` (what it connects to), :mod:`~app.console.sessions` (log-in
sessions and CSRF), :mod:`~app.console.backends` (registry, workers, DLQ - reusing the CLI's
DLQ reader, envelope view and replay with its ledger), :mod:`~app.console.web` (the FastAPI app
and its server-rendered, autoescaped Jinja2 pages) and :mod:`~app.console.cli` (``prism console``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.console.settings import ConsoleSettings
    from app.console.web import create_app

__all__ = ["ConsoleSettings", "create_app"]


def __getattr__(name: str) -> Any:
    """Both names load on first use: every `prism` command imports :mod:`app.console.cli` to mount
    `prism console`, and importing the FastAPI app here made each of them (`prism envelope`,
    `prism dlq`, ...) start ~0.5 s slower for a server it never runs."""
    if name == "create_app":
        from app.console.web import create_app

        return create_app
    if name == "ConsoleSettings":
        from app.console.settings import ConsoleSettings

        return ConsoleSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
