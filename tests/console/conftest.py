"""Fixtures of the console tests: headless Chromium and the dev keys of the worker they run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.security.devkeys import DevKeys, ensure_dev_keys
from tests.support import headless_chromium


@pytest.fixture(scope="module")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium (scripts/ensure-test-deps.sh installs it); a failure under CI=true."""
    yield from headless_chromium("--window-size=1440,1000")
