"""The registry's old read-only ``/ui`` page, its three bugs fixed (app/schema/ui.py), in
headless Chromium: opened with the credentials in the URL its fetch calls work, the verdict
names the subject's configured mode (not a hard-coded FULL), and Avro is indented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.console.support import BACKWARD_SUBJECT, FULL_SUBJECT, XSS, registry_server
from tests.support import USERS, write_users_file


@pytest.mark.parametrize(("subject", "verdict"), [(BACKWARD_SUBJECT, "compatible (BACKWARD)"),
                                                  (FULL_SUBJECT, "breaking (FULL)")])
def test_old_ui_with_url_credentials_real_mode_and_pretty_avro(tmp_path: Path, browser: Any, subject: str,
                                                                verdict: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    with registry_server(tmp_path, write_users_file(tmp_path / "users.yaml")) as (url, _):
        browser.get(url.replace("http://", f"http://reader:{USERS['reader'][0]}@") + "/ui")
        wait = WebDriverWait(browser, 15)
        wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f'.subject[data-subject="{subject}"]'))).click()
        wait.until(ec.presence_of_element_located((By.ID, "verdict")))
        assert browser.find_element(By.ID, "verdict").text == verdict
        schema = browser.find_element(By.ID, "schema").text
        assert '\n  "name": "Order",\n' in schema and XSS in schema  # indented, and shown as text
        assert '-      "name": "coupon",' in browser.find_element(By.ID, "textdiff").text
        browser.save_screenshot(str(tmp_path / "registry-ui.png"))
