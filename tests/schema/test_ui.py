"""The registry's web UI, driven in headless Chromium (Selenium + Debian's chromium-driver)."""

from __future__ import annotations

import httpx
import pytest

from tests.support import auth_headers, headless_chromium


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
    yield from headless_chromium()


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
