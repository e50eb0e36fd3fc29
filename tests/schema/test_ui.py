"""The registry's web UI, driven in headless Chromium (Selenium + Debian's chromium-driver)."""

from __future__ import annotations

import os
import shutil

import httpx
import pytest

from tests.support import auth_headers

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

@pytest.fixture
def store(tmp_path):  # type: ignore[no-untyped-def]
    """The UI does not depend on the storage backend: one (SQLite) is enough here, overriding
    the conftest's SQLite/PostgreSQL parametrization instead of skipping half of it."""
    from app.schema.store import SqliteStore

    s = SqliteStore(str(tmp_path / "registry.db"))
    yield s
    s.close()


V1 = 'syntax = "proto3";\nimport "prism/annotations.proto";\nmessage UserProfileUpdated {\n  string user_id = 1;\n' \
     '  string email = 2 [(prism.pii) = "email"];\n}\n'
V2 = V1.replace('[(prism.pii) = "email"];', '[(prism.pii) = "email"];\n  optional string avatar_url = 3;')


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium / chromedriver required under CI=true (Debian: chromium chromium-driver)")
        pytest.skip("chromium not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


def test_ui_browse_subject_versions_diff_and_pii(live_server, browser) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    live_server.registry.register("users.profile", V1, "PROTOBUF", namespace="users", label="v1")
    live_server.registry.register("users.profile", V2, "PROTOBUF", namespace="users", label="v2")
    # Without credentials the page is refused with a Basic challenge (a browser prompts for them).
    bare = httpx.get(live_server.url + "/ui")
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Basic realm=")
    # A read-only user, as the browser sends it after the prompt: on the page and on its /v1 calls.
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": auth_headers("reader")})
    browser.get(live_server.url + "/ui")
    wait = WebDriverWait(browser, 15)
    subject = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, '.subject[data-subject="users.profile"]')))
    assert browser.find_element(By.CSS_SELECTOR, '.ns[data-ns="users"]').text == "users"
    subject.click()
    wait.until(ec.presence_of_element_located((By.ID, "verdict")))
    rows = browser.find_elements(By.CSS_SELECTOR, "#vtable .vrow")
    assert [r.get_attribute("data-version") for r in rows] == ["1", "2"]
    assert "compatible" in browser.find_element(By.ID, "verdict").text
    assert "avatar_url" in browser.find_element(By.ID, "findings").text
    assert "+  optional string avatar_url = 3;" in browser.find_element(By.ID, "textdiff").text
    assert browser.find_element(By.ID, "piilist").text == "UserProfileUpdated.email"
