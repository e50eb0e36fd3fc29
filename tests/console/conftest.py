"""Fixtures of the console tests: headless Chromium and the dev keys of the worker they run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from app.security.devkeys import DevKeys, ensure_dev_keys

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def dev_keys(tmp_path_factory: pytest.TempPathFactory) -> DevKeys:
    return ensure_dev_keys(tmp_path_factory.mktemp("dev-keys"))


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium (scripts/ensure-test-deps.sh installs it); a failure under CI=true."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium / chromedriver required under CI=true (Debian: chromium chromium-driver)")
        pytest.skip("chromium not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1440,1000"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()
