"""Helpers shared by the integration tests (imported, not a conftest: conftests are not modules to import)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.broker.embedded import BrokerBinaryNotFound, resolve_broker_binary


def require(ok: bool, reason: str) -> None:
    """Skip locally, but FAIL under CI=true: CI must never silently skip an integration test."""
    if ok:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"required for this integration test under CI=true: {reason}")
    pytest.skip(reason)


def require_broker_binary() -> Path:
    try:
        return resolve_broker_binary()
    except BrokerBinaryNotFound as exc:
        require(False, str(exc))
        raise  # unreachable: require() skipped or failed
